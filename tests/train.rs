//! The native loop on the CPU: learning, determinism, resume and the "empty" layout.

mod common;

use burn::prelude::*;
use burnpose::config::{Config, Scope};
use burnpose::train::{Trainer, checkpoint};
use std::path::Path;

fn config(extra: &str) -> Config {
    let text = format!(
        "[data]\nimgsz = 64\ntrain_images = 8\nval_images = 2\n[train]\nbatch = 2\nseed = 5\n{extra}"
    );
    Config::parse(&text, Path::new("test.toml")).unwrap()
}

fn trainer(cfg: &Config) -> Trainer {
    Trainer::new(cfg.clone(), Path::new("test.toml"), Device::flex()).unwrap()
}

fn no_log() -> impl FnMut(usize, usize, &[f32; 6]) {
    |_, _, _| {}
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("burnpose-train-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn loss_falls_on_a_tiny_set() {
    // Fixed images (no augmentation): this checks that the optimizer fits them.
    let cfg = config(
        "epochs = 8\nnbs = 2\n[optim]\nwarmup_epochs = 1.0\n[augment]\nmosaic = 0.0\ntranslate = 0.0\nscale = 0.0\nfliplr = 0.0\nhsv_h = 0.0\nhsv_s = 0.0\nhsv_v = 0.0\n",
    );
    let mut t = trainer(&cfg);
    let mut totals = Vec::new();
    while !t.finished() {
        let r = t.run_epoch(&mut no_log()).unwrap();
        totals.push(r.train_loss.iter().sum::<f64>());
    }
    let (first, last) = (totals[0], *totals.last().unwrap());
    assert!(last < 0.6 * first, "loss did not fall: {totals:?}");
}

/// Two runs, one preparing batches on the training thread and one on two loader threads (the
/// CPU fit's only thread count that varies): the same state.
#[test]
fn same_seed_same_state_at_any_loader_thread_count() {
    let cfg = config("epochs = 2\nnbs = 4\n");
    let run = |workers: usize| {
        let mut cfg = cfg.clone();
        cfg.data.workers = workers;
        let mut t = trainer(&cfg);
        while !t.finished() {
            t.run_epoch(&mut no_log()).unwrap();
        }
        t.state_hashes()
    };
    let (a, b) = (run(0), run(2));
    assert_eq!(a, b);
    let other = config("epochs = 2\nnbs = 4\n").train.seed + 1;
    let mut cfg2 = cfg.clone();
    cfg2.train.seed = other;
    let mut t = trainer(&cfg2);
    t.run_epoch(&mut no_log()).unwrap();
    t.run_epoch(&mut no_log()).unwrap();
    assert_ne!(t.state_hashes().model, a.model);
}

/// Batch 3 at 96 px (not a multiple of 64), with every augmentation on, rotation and device HSV
/// included, prefetch threads and a wrapped last batch: two trainers give the same state.
#[test]
fn odd_batch_with_augmentation_repeats() {
    let cfg = Config::parse(
        "[data]\nimgsz = 96\ntrain_images = 10\nval_images = 2\nworkers = 2\nlast_batch = \"wrap\"\n[augment]\ndegrees = 5.0\nhsv_device = true\n[train]\nbatch = 3\nnbs = 6\nepochs = 2\nclose_mosaic = 1\nseed = 9\n",
        Path::new("odd.toml"),
    )
    .unwrap();
    let run = || {
        let mut t = trainer(&cfg);
        while !t.finished() {
            t.run_epoch(&mut no_log()).unwrap();
        }
        (t.state_hashes(), t.step_losses.len())
    };
    let (a, steps) = run();
    assert_eq!(
        steps, 8,
        "4 full batches of 3 per epoch (the last one wrapped)"
    );
    assert_eq!(run().0, a);
}

#[test]
fn flat_update_trains_the_same_bits_as_per_tensor() {
    // With a clip limit that never bites (the two sum the norm in different orders), the flat
    // optimizer and EMA give a whole fit — accumulation, AdamW, EMA, checkpoints' state — the
    // per-tensor bits.
    let run = |flat: bool| {
        let mut t = trainer(&config(&format!(
            "epochs = 2\nnbs = 4\n[optim]\nclip_norm = 1e30\nflat_update = {flat}\n"
        )));
        assert_eq!(t.optimizer.flat_active(), flat);
        while !t.finished() {
            t.run_epoch(&mut no_log()).unwrap();
        }
        t.state_hashes()
    };
    assert_eq!(run(true), run(false));
}

#[test]
fn resume_continues_exactly() {
    // batch 2, nbs 6: three micro-batches per optimizer step, so gradients are pending at the
    // epoch boundary (4 micro-batches per epoch) and must survive the checkpoint.
    let cfg = config("epochs = 2\nnbs = 6\n[optim]\nwarmup_epochs = 0.0\noptimizer = \"musgd\"\n");
    let mut straight = trainer(&cfg);
    straight.run_epoch(&mut no_log()).unwrap();
    straight.run_epoch(&mut no_log()).unwrap();

    let mut first = trainer(&cfg);
    first.run_epoch(&mut no_log()).unwrap();
    assert!(
        first.pending.is_some(),
        "the test needs pending gradients at the boundary"
    );
    let path = scratch("resume").join("last.safetensors");
    checkpoint::save(&first, &path).unwrap();
    drop(first);
    let stored = checkpoint::read_config(&path).unwrap();
    assert_eq!(stored, cfg);
    let mut resumed = trainer(&stored);
    checkpoint::load_into(&mut resumed, &path).unwrap();
    resumed.run_epoch(&mut no_log()).unwrap();

    let (a, b) = (straight.state_hashes(), resumed.state_hashes());
    assert_eq!(a.model, b.model);
    assert_eq!(a.ema, b.ema);
    assert_eq!(a.optimizer, b.optimizer);
    assert_eq!(a.scheduler, b.scheduler);
    assert_eq!(straight.step_losses[4..], resumed.step_losses[..]);
    let strip = |h: &[burnpose::train::EpochRecord]| {
        h.iter()
            .map(|r| (r.epoch, r.train_loss, r.lr, r.box_map, r.pose_map))
            .collect::<Vec<_>>()
    };
    assert_eq!(strip(&straight.history), strip(&resumed.history));
}

#[test]
fn bad_checkpoint_is_named() {
    let dir = scratch("bad");
    let path = dir.join("junk.safetensors");
    std::fs::write(&path, b"not a checkpoint").unwrap();
    let e = checkpoint::read_config(&path).unwrap_err().to_string();
    assert!(e.contains("junk.safetensors"), "{e}");
    let e = checkpoint::read_config(&dir.join("missing.safetensors"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing.safetensors"), "{e}");
}

#[test]
fn batch_larger_than_the_data_is_refused() {
    let cfg = Config::parse(
        "[data]\nimgsz = 64\ntrain_images = 3\nval_images = 1\n[train]\nbatch = 4\n",
        Path::new("big_batch.toml"),
    )
    .unwrap();
    let e = common::refusal(cfg, "big_batch.toml");
    assert!(
        e.contains("big_batch.toml") && e.contains("3 training images but train.batch = 4"),
        "{e}"
    );
}

/// A model gone NaN: the next epoch stops at its first step with an error naming epoch and
/// iteration, and a checkpoint of it is refused, leaving the file as it was.
#[test]
fn non_finite_state_is_never_saved() {
    use burnpose::optim::tensors::{float_tensors, replace_float_tensors};
    let mut t = trainer(&config("epochs = 2\nnbs = 2\n"));
    t.run_epoch(&mut no_log()).unwrap();
    let path = scratch("nan").join("last.safetensors");
    checkpoint::save(&t, &path).unwrap();
    let good = std::fs::read(&path).unwrap();
    let mut values: std::collections::HashMap<String, Tensor<1>> = float_tensors(&t.model)
        .into_iter()
        .map(|(p, x)| (p, x.detach().mul_scalar(f32::NAN)))
        .collect();
    t.model = replace_float_tensors(t.model.clone(), &mut values).0;
    let e = t.run_epoch(&mut no_log()).unwrap_err().to_string();
    assert!(
        e.contains("the loss became NaN at epoch 2, iteration 1 of 4"),
        "{e}"
    );
    let e = checkpoint::save(&t, &path).unwrap_err().to_string();
    assert!(
        e.contains("last.safetensors") && e.contains("NaN or infinite"),
        "{e}"
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        good,
        "the good checkpoint was replaced"
    );
}

/// A write that fails (here: the temporary file cannot be created, as on a full disk) is an
/// error naming the checkpoint, and the earlier file is kept.
#[test]
fn failed_checkpoint_write_keeps_the_earlier_file() {
    let mut t = trainer(&config("epochs = 1\nnbs = 2\n"));
    t.run_epoch(&mut no_log()).unwrap();
    let dir = scratch("full");
    let path = dir.join("last.safetensors");
    std::fs::write(&path, b"earlier").unwrap();
    std::fs::create_dir_all(path.with_extension(format!("tmp.{}", std::process::id()))).unwrap();
    let e = checkpoint::save(&t, &path).unwrap_err().to_string();
    assert!(
        e.contains("cannot write checkpoint") && e.contains("last.safetensors"),
        "{e}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), b"earlier");
}

/// A batch without any object: the keypoint point stems get no gradient, so the optimizer must
/// leave them and their state untouched, while other parameters still train (class loss).
#[test]
fn empty_batch_skips_point_stems() {
    let cfg = config("epochs = 1\nnbs = 2\n[optim]\noptimizer = \"sgd\"\nwarmup_epochs = 0.0\n");
    let mut t = trainer(&cfg);
    // One ordinary step first, so every parameter has optimizer state to disturb.
    let order = t.epoch_order(0);
    let normal = t.batch(&order, 0).unwrap();
    t.train_step(&normal);
    let empty = common::empty_batch::without_objects(&t, &order, 1);
    let stem = |t: &Trainer| {
        t.model.head.one2many.pose.as_ref().unwrap().point_stems[0]
            .cv1
            .conv
            .weight
            .val()
    };
    let cls = |t: &Trainer| t.model.head.one2many.classes[0].out.weight.val();
    let idx = |t: &Trainer, path: &str| {
        t.optimizer
            .table
            .iter()
            .position(|p| p.path == path)
            .unwrap()
    };
    let stem_path = "head.one2many.pose.point_stems.0.cv1.conv.weight";
    let (stem_before, cls_before) = (stem(&t).into_data(), cls(&t).into_data());
    let steps_before = t.optimizer.state[idx(&t, stem_path)].steps;
    let buf_before = t.optimizer.state[idx(&t, stem_path)]
        .buf
        .clone()
        .unwrap()
        .into_data();
    t.train_step(&empty);
    assert_eq!(
        stem(&t).into_data(),
        stem_before,
        "point stem moved without positives"
    );
    assert_eq!(t.optimizer.state[idx(&t, stem_path)].steps, steps_before);
    assert_eq!(
        t.optimizer.state[idx(&t, stem_path)]
            .buf
            .clone()
            .unwrap()
            .into_data(),
        buf_before
    );
    assert_ne!(
        cls(&t).into_data(),
        cls_before,
        "class branch should still train"
    );
    let items = t.step_losses.last().unwrap();
    assert_eq!([items[0], items[1], items[2], items[4], items[5]], [0.0; 5]);
}

/// Detection cuts its tape at the head outputs (the whole network is the stage): a batch without
/// positives must still leave the box branches without gradient, and untouched.
/// A batch without objects after an ordinary step, on a trainer built from `cfg`: the weight
/// of the branch `still` picks must not move, the class branch must.
fn empty_batch_moves_only_classes(cfg: &Config, still: fn(&Trainer) -> TensorData) {
    common::empty_batch::moves_only_classes(trainer(cfg), still, "host path");
}

fn empty_batch_config() -> Config {
    config("epochs = 1\nnbs = 2\n[optim]\noptimizer = \"sgd\"\nwarmup_epochs = 0.0\n")
}

#[test]
fn empty_batch_skips_box_branches_in_detection() {
    let mut cfg = empty_batch_config();
    cfg.model.task = burnpose::model::Task::Detect;
    empty_batch_moves_only_classes(&cfg, common::empty_batch::box_branch_weight);
}

/// With the whole network as the stage (`replay.scope = "network"`), the tape is cut at the
/// head's outputs: the keypoint outputs the loss did not read must leave the point stems
/// without gradient, as when the head runs in autodiff.
#[test]
fn empty_batch_skips_point_stems_with_the_head_in_the_stage() {
    for scope in [Scope::Features, Scope::Network] {
        let mut cfg = empty_batch_config();
        cfg.replay.scope = Some(scope);
        empty_batch_moves_only_classes(&cfg, common::empty_batch::point_stem_weight);
    }
}

/// The NMS path, and both heads under Ultralytics' metric (`eval::ultralytics` checks the metric
/// itself against Ultralytics' own code).
#[test]
fn nms_validation_path_and_ultralytics_metric_run() {
    for extra in [
        "val_nms = true\n",
        "val_metric = \"ultralytics\"\n",
        "val_nms = true\nval_metric = \"ultralytics\"\n",
    ] {
        let cfg = config(&format!("epochs = 1\nnbs = 2\n{extra}"));
        let mut t = trainer(&cfg);
        let r = t.run_epoch(&mut no_log()).unwrap();
        assert!(
            (0.0..=1.0).contains(&r.box_map) && (0.0..=1.0).contains(&r.pose_map),
            "{extra}: {r:?}"
        );
    }
}

/// A YOLO-txt dataset (the real coco8-pose images) trains end to end with augmentation on.
#[test]
fn yolo_dataset_trains_with_augmentation() {
    let Some(yaml) = common::shared_data("pose-real/coco8-pose/coco8-pose.yaml") else {
        return;
    };
    let text = format!(
        "[data]\nsource = \"yolo\"\npath = \"{}\"\nimgsz = 64\nworkers = 2\n[train]\nbatch = 2\nepochs = 1\nnbs = 2\n",
        yaml.display()
    );
    let cfg = Config::parse(&text, Path::new("yolo.toml")).unwrap();
    let mut t = trainer(&cfg);
    assert_eq!(t.batches_per_epoch(), 2);
    let r = t.run_epoch(&mut no_log()).unwrap();
    assert!(r.train_loss.iter().all(|v| v.is_finite()), "{r:?}");
    assert!(r.data_wait >= 0.0 && r.pose_map.is_finite());
    assert_eq!(t.step_losses.len(), 2);
}

/// Deferring HSV to the device changes nothing on the CPU, where the device path is the same
/// reference the loader uses: equal state hashes and losses.
#[test]
fn device_hsv_equals_loader_hsv_on_cpu() {
    let run = |device_hsv: bool| {
        let cfg = config(&format!(
            "epochs = 1\nnbs = 2\n[augment]\nhsv_device = {device_hsv}\n"
        ));
        let mut t = trainer(&cfg);
        let order = t.epoch_order(0);
        assert_eq!(t.batch(&order, 0).unwrap().hsv_gains.is_some(), device_hsv);
        t.run_epoch(&mut no_log()).unwrap();
        t.state_hashes()
    };
    assert_eq!(run(false), run(true));
}

#[test]
fn phase_timing_breaks_a_step_down_without_changing_it() {
    use burnpose::train::trainer::{PHASES, StepTiming};
    let cfg = config("epochs = 1\nnbs = 2\n");
    let run = |phases: bool| {
        let mut t = trainer(&cfg);
        t.timing = Some(StepTiming {
            phases,
            ..Default::default()
        });
        let order = t.epoch_order(0);
        for b in 0..2 {
            let batch = t.batch(&order, b).unwrap();
            t.timed_step(&batch).unwrap();
        }
        (t.timing.take().unwrap(), t.state_hashes())
    };
    let (timed, with) = run(true);
    let (plain, without) = run(false);
    assert_eq!(timed.phase_ms.len(), 2, "one breakdown per step");
    assert!(plain.phase_ms.is_empty());
    for (phases, step) in timed.phase_ms.iter().zip(&timed.step_ms) {
        assert!(phases.iter().all(|&ms| ms >= 0.0), "{PHASES:?}: {phases:?}");
        assert!(phases[0] > 0.0, "the forward takes time");
        let sum: f64 = phases.iter().sum();
        assert!(
            sum <= step + 1e-6,
            "phases {sum} ms within the step {step} ms"
        );
    }
    // Syncs only: the same training.
    assert_eq!(with, without);
}

/// A YOLO yaml's `kpt_oks_sigmas` replace the default sigmas in the loss (and with them the
/// assigner and validation, which read the loss's); without them 17 keypoints get COCO's.
#[test]
fn dataset_sigmas_reach_the_loss() {
    use burnpose::data::{BuiltinDataset, export::write_yolo};
    let dir = scratch("sigmas");
    let yaml = write_yolo(
        &BuiltinDataset::new(2, 64, 1),
        &BuiltinDataset::new(1, 64, 2),
        &dir,
    )
    .unwrap();
    let cfg_for = |yaml: &Path| {
        Config::parse(
            &format!(
                "[data]\nsource = \"yolo\"\npath = {:?}\nimgsz = 64\n[train]\nbatch = 2\n",
                yaml.to_str().unwrap()
            ),
            Path::new("sigmas.toml"),
        )
        .unwrap()
    };
    let t = trainer(&cfg_for(&yaml));
    assert_eq!(
        t.loss.sigmas,
        burnpose::loss::geometry::COCO_SIGMAS.to_vec()
    );
    let sigmas: Vec<f32> = (1..=17).map(|i| i as f32 / 100.0).collect();
    let text = std::fs::read_to_string(&yaml).unwrap();
    std::fs::write(&yaml, format!("{text}kpt_oks_sigmas: {sigmas:?}\n")).unwrap();
    let t = trainer(&cfg_for(&yaml));
    assert_eq!(t.loss.sigmas, sigmas);
}

/// What a fit reported, in order.
#[derive(Default)]
struct Events(Vec<String>);

impl burnpose::train::FitEvents for Events {
    fn epoch_start(&mut self, epoch: usize, batches: usize) {
        self.0.push(format!("start {epoch} of {batches}"));
    }
    fn step(&mut self, batch: usize, batches: usize, items: &[f32; 6]) {
        assert!(
            items.iter().all(|v| v.is_finite()),
            "step {batch}: {items:?}"
        );
        self.0.push(format!("step {batch}/{batches}"));
    }
    fn epoch_end(&mut self, trainer: &Trainer, record: &burnpose::train::EpochRecord, _: usize) {
        assert_eq!(trainer.history.last().map(|r| r.epoch), Some(record.epoch));
        self.0.push(format!("end {}", record.epoch));
    }
}

/// `train::fit`, the library's entry for a complete fit: every epoch and step reported in order,
/// the run folder written, and the same state as the epochs run by hand.
#[test]
fn fit_runs_every_epoch_and_writes_the_run_folder() {
    let cfg = config("epochs = 2\nnbs = 2\n");
    let dir = scratch("fit-entry");
    let mut t = trainer(&cfg);
    let mut events = Events::default();
    let summary = burnpose::train::fit(&mut t, &dir, &mut events).unwrap();
    assert_eq!(summary.epochs, 2);
    assert!(!summary.stopped_early);
    let batches = t.batches_per_epoch();
    let mut expected = Vec::new();
    for e in 0..2 {
        expected.push(format!("start {e} of {batches}"));
        expected.extend((0..batches).map(|b| format!("step {b}/{batches}")));
        expected.push(format!("end {e}"));
    }
    assert_eq!(events.0, expected);
    for f in [
        "config.toml",
        "last.safetensors",
        "best.safetensors",
        "results.csv",
        "results.png",
    ] {
        assert!(dir.join(f).is_file(), "{f} missing");
    }
    // `best` is the checkpoint of its epoch: the last one's bytes only when that epoch was best.
    let (best, last) = (
        std::fs::read(dir.join("best.safetensors")).unwrap(),
        std::fs::read(dir.join("last.safetensors")).unwrap(),
    );
    assert!(summary.best_epoch >= 1);
    assert_eq!(
        best == last,
        summary.best_epoch == 2,
        "best epoch {}",
        summary.best_epoch
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("results.csv"))
            .unwrap()
            .lines()
            .count(),
        3,
        "a header and one row per epoch"
    );
    let mut by_hand = trainer(&cfg);
    while !by_hand.finished() {
        by_hand.run_epoch(&mut no_log()).unwrap();
    }
    assert_eq!(t.state_hashes(), by_hand.state_hashes());
    std::fs::remove_dir_all(&dir).ok();
}

/// Every float tensor (parameters and BatchNorm statistics) under `prefix`, as values.
fn tensors_under(t: &Trainer, prefix: &str) -> Vec<(String, Vec<f32>)> {
    burnpose::optim::tensors::float_tensors(&t.model.valid())
        .into_iter()
        .filter(|(p, _)| p.starts_with(prefix))
        .map(|(p, v)| {
            (
                p,
                v.into_data()
                    .convert::<f32>()
                    .try_into_vec::<f32>()
                    .unwrap(),
            )
        })
        .collect()
}

/// `train.freeze = 3`: layers 0–2 keep their parameters and BatchNorm statistics while layer 3
/// trains and its statistics move; without it layer 2 moves too (the check can fail).
#[test]
fn freeze_keeps_the_frozen_layers_and_their_statistics() {
    let mut t = trainer(&config("epochs = 1\nnbs = 2\nfreeze = 3\n"));
    let frozen: Vec<_> = ["backbone.l0.", "backbone.l2."]
        .iter()
        .map(|p| tensors_under(&t, p))
        .collect();
    let free = tensors_under(&t, "backbone.l3.");
    assert!(frozen.iter().all(|f| f.len() >= 5) && free.len() == 5);
    t.run_epoch(&mut no_log()).unwrap();
    for (prefix, before) in ["backbone.l0.", "backbone.l2."].iter().zip(&frozen) {
        assert_eq!(
            &tensors_under(&t, prefix),
            before,
            "{prefix} moved while frozen"
        );
    }
    for ((path, after), (_, before)) in tensors_under(&t, "backbone.l3.").iter().zip(&free) {
        assert_ne!(after, before, "{path} did not train");
    }
    let mut unfrozen = trainer(&config("epochs = 1\nnbs = 2\n"));
    let before = tensors_under(&unfrozen, "backbone.l2.");
    unfrozen.run_epoch(&mut no_log()).unwrap();
    assert_ne!(tensors_under(&unfrozen, "backbone.l2."), before);
}

/// Frozen layers inside the recorded stage turn replay off with the reason named; a frozen head
/// outside the features stage does not (there the CPU device is what refuses).
#[test]
fn frozen_feature_layers_turn_replay_off_with_their_names() {
    let why = |extra: &str| {
        let cfg = config(&format!("{extra}\n[replay]\nenabled = true\n"));
        trainer(&cfg).replay_off.expect("replay refused on the CPU")
    };
    let e = why("freeze = 2");
    assert!(
        e.contains("frozen feature layers (train.freeze): backbone.l0, backbone.l1 (")
            && !e.contains("weight"),
        "named by layer, not by tensor: {e}"
    );
    let e = why("freeze = [23]");
    assert!(!e.contains("frozen") && e.contains("CUDA"), "{e}");
}

/// A layer index past the model names the key and the range; `24` (every layer) is accepted.
#[test]
fn freeze_past_the_last_layer_is_refused() {
    for value in ["25", "[1, 30]"] {
        let text = format!("[train]\nfreeze = {value}\n");
        let e = Config::parse(&text, Path::new("f.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("f.toml") && e.contains("train.freeze") && e.contains("0–23"),
            "{e}"
        );
    }
    for value in ["\"abc\"", "[-1]"] {
        let text = format!("[train]\nfreeze = {value}\n");
        let e = Config::parse(&text, Path::new("f.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("f.toml") && e.contains("`train.freeze` expects a number of layers"),
            "{e}"
        );
    }
    let ok = Config::parse("[train]\nfreeze = [0, 23, 5]\n", Path::new("f.toml")).unwrap();
    assert_eq!(ok.train.freeze.layers(), vec![0, 5, 23]);
    let all = Config::parse("[train]\nfreeze = 24\n", Path::new("f.toml")).unwrap();
    assert_eq!(all.train.freeze.layers(), (0..24).collect::<Vec<_>>());
}
