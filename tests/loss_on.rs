//! `train.loss_on = "device"`: the assignment and the loss terms as tensor operations on the
//! training device (the path a recorded step takes) train as the host path does.

mod common;

use burn::prelude::*;
use burnpose::config::{Config, LossOn};
use burnpose::train::Trainer;
use std::path::Path;

fn trainer(loss_on: &str, task: &str) -> Trainer {
    trainer_in(loss_on, task, None)
}

/// With the stage cut at `scope` (`replay.scope`; `None`: the task's default).
fn trainer_in(loss_on: &str, task: &str, scope: Option<&str>) -> Trainer {
    let scope = scope.map_or(String::new(), |s| format!("[replay]\nscope = \"{s}\"\n"));
    let text = format!(
        "[data]\nimgsz = 64\ntrain_images = 8\nval_images = 2\n[model]\ntask = \"{task}\"\n\
         [train]\nbatch = 2\nnbs = 2\nseed = 5\nepochs = 2\nloss_on = \"{loss_on}\"\n{scope}"
    );
    let cfg = Config::parse(&text, Path::new("test.toml")).unwrap();
    Trainer::new(cfg, Path::new("test.toml"), Device::flex()).unwrap()
}

/// The same weights and batch give the same logged loss on either path (the sums run in another
/// order: within 1e-4), and a whole fit on the device path keeps every loss finite.
#[test]
fn the_device_path_gives_the_host_loss_and_trains() {
    for task in ["pose", "detect"] {
        let (mut host, mut device) = (trainer("host", task), trainer("device", task));
        assert_eq!(device.cfg.train.loss_on, LossOn::Device);
        let order = host.epoch_order(0);
        let batch = host.batch(&order, 0).unwrap();
        let (a, b) = (host.train_step(&batch), device.train_step(&batch));
        common::assert_items_close(&b, &a, 1e-4, &format!("{task}, device vs host"));
        assert!(
            a.iter().sum::<f32>() > 0.0,
            "{task}: a zero loss compares nothing"
        );
        let mut device = trainer("device", task);
        while !device.finished() {
            device.run_epoch(&mut |_, _, _| {}).unwrap();
        }
        assert!(
            device.step_losses.iter().flatten().all(|v| v.is_finite()),
            "{task}: {:?}",
            device.step_losses
        );
    }
}

/// A batch without objects on the device path: as on the host path, the point stems (pose) and
/// the box branches (detection) get no gradient and stay where they are, while the class
/// branch trains — with the pose head after the cut (features) and in the stage (network),
/// where the stage's backward drops them (detection's stage is always its whole network; the
/// native step of `replay.scope = "step"` cuts there too).
#[test]
fn the_device_path_leaves_unreached_branches_alone() {
    use common::empty_batch::{box_branch_weight, point_stem_weight};
    type Weight = fn(&Trainer) -> TensorData;
    let cases: [(&str, Weight); 2] = [("pose", point_stem_weight), ("detect", box_branch_weight)];
    for (task, still) in cases {
        common::empty_batch::moves_only_classes(trainer("device", task), still, task);
    }
    for scope in ["network", "step"] {
        let pose = trainer_in("device", "pose", Some(scope));
        common::empty_batch::moves_only_classes(pose, point_stem_weight, scope);
    }
}

/// A config changed after parsing (as `fit --scope step` changes it) is checked again: the step
/// scope without the device loss is refused with the key and what to set.
#[test]
fn the_step_scope_without_the_device_loss_is_refused() {
    let mut cfg = Config::parse(
        "[data]\nimgsz = 64\ntrain_images = 8\n",
        Path::new("t.toml"),
    )
    .unwrap();
    cfg.replay.scope = Some(burnpose::config::Scope::Step);
    let err = common::refusal(cfg, "t.toml");
    assert!(
        err.contains("replay.scope") && err.contains("loss_on"),
        "{err}"
    );
}

/// FP16 on the device path, cut where a recorded step cuts (`replay.scope = "step"`'s native
/// twin): the first step's logged loss is the host path's (the loss runs in FP32 on the same
/// FP16 outputs: within 1e-4), and a fit scales, unscales and steps with every loss finite.
#[test]
fn the_device_path_trains_in_fp16_at_the_step_cut() {
    let fp16 = |loss_on: &str, scope: &str| {
        let text = format!(
            "[data]\nimgsz = 64\ntrain_images = 8\nval_images = 2\n[replay]\nscope = \"{scope}\"\n\
             [train]\nbatch = 2\nnbs = 2\nseed = 5\nepochs = 2\nprecision = \"fp16\"\n\
             loss_on = \"{loss_on}\"\n"
        );
        let cfg = Config::parse(&text, Path::new("fp16.toml")).unwrap();
        let mut t = Trainer::new(cfg, Path::new("fp16.toml"), Device::flex()).unwrap();
        // At initialisation this model's gradients overflow FP16 at the default 65536.
        t.scaler.as_mut().expect("fp16 scales its loss").scale = 64.0;
        t
    };
    let (mut host, mut device) = (fp16("host", "network"), fp16("device", "step"));
    let order = host.epoch_order(0);
    let batch = host.batch(&order, 0).unwrap();
    let (a, b) = (host.train_step(&batch), device.train_step(&batch));
    common::assert_items_close(&b, &a, 1e-4, "fp16, device vs host");
    let mut device = fp16("device", "step");
    while !device.finished() {
        device.run_epoch(&mut |_, _, _| {}).unwrap();
    }
    let s = device.scaler.as_ref().unwrap();
    assert!(
        device.step_losses.iter().flatten().all(|v| v.is_finite()),
        "{:?}",
        device.step_losses
    );
    assert!(s.growth_tracker + s.skipped > 0, "no optimizer step: {s:?}");
}

/// `replay.defer_readback` where nothing is recorded (the CPU's native stage): no step is read
/// late, and a fit through `run_epoch` (which queues its untimed steps) gives the same state and
/// per-step losses as without it.
#[test]
fn defer_readback_changes_nothing_without_a_recorded_loss() {
    let run = |defer: bool| {
        let mut t = trainer_in("device", "pose", Some("step"));
        t.cfg.replay.defer_readback = Some(defer);
        while !t.finished() {
            t.run_epoch(&mut |_, _, _| {}).unwrap();
        }
        assert_eq!(t.read_late, 0);
        (t.state_hashes(), t.step_losses.clone())
    };
    let (on, off) = (run(true), run(false));
    assert_eq!(on.1.len(), 8, "two epochs of four steps");
    assert_eq!(on, off);
}

/// The device loss's object slots only grow during a fit: each step takes the largest count any
/// batch so far needed, so a batch with fewer objects keeps it (a recorded step is recorded
/// again only on growth). The count is training state: a checkpoint carries it into a resume.
#[test]
fn the_object_slots_only_grow_and_a_checkpoint_keeps_them() {
    use burnpose::loss::assign::device::ObjectSlots;
    use burnpose::train::checkpoint;
    let mut t = trainer("device", "pose");
    assert_eq!(t.loss.object_slots, 0, "train.object_slots by default");
    let (mut reached, mut fewer) = (0, 0);
    for epoch in 0..2 {
        let order = t.epoch_order(epoch);
        for i in 0..t.batches_per_epoch() {
            let batch = t.batch(&order, i).unwrap();
            let labels: Vec<_> = batch.samples.iter().map(|s| s.instances.clone()).collect();
            let own = ObjectSlots::slots_for(&labels, 0);
            fewer += usize::from(own < reached);
            reached = reached.max(own);
            t.train_step(&batch);
            assert_eq!(t.loss.object_slots, reached, "epoch {epoch}, batch {i}");
        }
    }
    assert!(
        fewer > 0,
        "no batch needed fewer slots than one before it: nothing tested"
    );
    let dir = std::env::temp_dir().join(format!("burnpose-slots-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("last.safetensors");
    checkpoint::save(&t, &path).unwrap();
    let mut resumed = trainer("device", "pose");
    assert!(reached > 0 && resumed.loss.object_slots == 0);
    checkpoint::load_into(&mut resumed, &path).unwrap();
    assert_eq!(
        resumed.loss.object_slots, reached,
        "the count a resume starts from"
    );
    std::fs::remove_dir_all(&dir).ok();
}
