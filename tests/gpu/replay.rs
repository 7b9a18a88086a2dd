//! Feature replay against the native loop on the H200: byte-equal state hashes and per-step
//! losses, ordinary and empty batches, FP32/BF16/FP16, and negative controls that must fail.

use super::common::empty_batch::{box_branch_weight, point_stem_weight};
use super::cuda;
use burn::module::Module;
use burnpose::config::Config;
use burnpose::model::Yolo;
use burnpose::optim::tensors::float_tensors;
use burnpose::replay::Stage;
use burnpose::replay::recorder::{Control, Recorder};
use burnpose::train::{StateHashes, Trainer};
use std::path::Path;

/// `task` is "pose", "detect", "pose-network" (a pose model with `replay.scope = "network"`),
/// "pose-per-tensor" (`optim.flat_update = false`: the per-tensor update), "pose-musgd" (MuSGD
/// through the flat update, Newton–Schulz batched by shape), "pose-step" /
/// "detect-step" (`replay.scope = "step"`, the device loss in 16 object slots per image), or
/// "pose-one-graph" ("pose-step" with `replay.one_graph`: its native twin is "pose-step"'s).
pub(super) fn config_for(task: &str, precision: &str, capture: bool) -> Config {
    // The step scope's three graphs; "pose-one-graph" is its default of one.
    let step = "[replay]\nscope = \"step\"\none_graph = false\n";
    if task == "pose-one-graph" {
        let mut cfg = config_for("pose-step", precision, capture);
        cfg.replay.one_graph = Some(true);
        cfg.validate(Path::new("replay.toml")).unwrap();
        return cfg;
    }
    let (task, scope) = match task {
        "pose-network" => ("pose", "[replay]\nscope = \"network\"\n"),
        "pose-per-tensor" => ("pose", "[optim]\nflat_update = false\n"),
        "pose-musgd" => ("pose", "[optim]\noptimizer = \"musgd\"\n"),
        "pose-step" => ("pose", step),
        "detect-step" => ("detect", step),
        other => (other, ""),
    };
    let device_loss = match scope {
        s if s == step => "loss_on = \"device\"\nobject_slots = 16\n",
        _ => "",
    };
    let text = format!(
        "{scope}[model]\ntask = \"{task}\"\n[data]\nimgsz = 256\ntrain_images = 24\nval_images = 4\n[train]\nbatch = 4\nnbs = 8\nepochs = 2\nclose_mosaic = 1\nseed = 11\nprecision = \"{precision}\"\n{device_loss}"
    );
    let mut cfg = Config::parse(&text, Path::new("replay.toml")).unwrap();
    cfg.replay.enabled = capture;
    cfg
}

pub(super) fn trainer(cfg: &Config, control: Control) -> Trainer {
    let mut t = Trainer::new(cfg.clone(), Path::new("replay.toml"), cuda()).unwrap();
    if cfg.replay.enabled {
        assert!(t.stage.is_replay(), "replay refused: {:?}", t.replay_off);
        if control != Control::None {
            let scope = cfg.replay_scope();
            let recorder =
                Recorder::with_control(&t.device, scope, control).with_one_graph(cfg.one_graph());
            t.stage = Stage::Replay(Box::new(recorder));
        }
    } else {
        assert!(!t.stage.is_replay());
    }
    if let Some(s) = &mut t.scaler {
        s.scale = 64.0;
    }
    t
}

/// The model's float tensors (parameters and running statistics) by path, as bytes.
type Tensors = Vec<(String, Vec<u8>)>;

pub(super) fn model_tensors(model: &Yolo) -> Tensors {
    float_tensors(&model.valid())
        .into_iter()
        .map(|(p, x)| (p, x.into_data().as_bytes().to_vec()))
        .collect()
}

/// The paths whose bytes differ, and the first one's leading values, for a failure message.
pub(super) fn differing(a: &Tensors, b: &Tensors) -> String {
    let pairs: Vec<_> = a.iter().zip(b).filter(|(x, y)| x != y).collect();
    let shown: Vec<&str> = pairs.iter().take(16).map(|(x, _)| x.0.as_str()).collect();
    let lead = |bytes: &[u8]| -> Vec<f32> {
        bytes
            .chunks_exact(4)
            .take(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    let first = pairs.first().map(|(x, y)| {
        format!(
            "; {}: first values {:?} vs {:?}",
            x.0,
            lead(&x.1),
            lead(&y.1)
        )
    });
    format!(
        "{} of {} model tensors differ: {shown:?}{}",
        pairs.len(),
        a.len(),
        first.unwrap_or_default()
    )
}

/// `t`'s fit to its end. A fit that starts replayed must end replayed: a step that cannot be
/// recorded runs natively with the rest of the fit, byte-identical, so the parity checks alone
/// would pass a replay that broke.
pub(super) fn run_to_end(t: &mut Trainer) {
    let replayed = t.stage.is_replay();
    while !t.finished() {
        t.run_epoch(&mut |_, _, _| {}).unwrap();
    }
    assert!(
        !replayed || t.stage.is_replay(),
        "replay turned off mid-fit: {:?}",
        t.replay_off
    );
}

/// A replayed fit of `cfg` whose recordings `control` refuses, to its end: replay turned off
/// with the control's reason kept, and the per-step losses and state hashes of `native`'s fit
/// (the same config, native). `what` names the case in a failure.
pub(super) fn assert_runs_natively(cfg: &Config, native: &Config, control: Control, what: &str) {
    let (hashes, losses, _) = fit(native, Control::None);
    let mut t = trainer(cfg, control);
    while !t.finished() {
        t.run_epoch(&mut |_, _, _| {}).unwrap();
    }
    assert!(!t.stage.is_replay(), "{what}: still replayed");
    let why = t.replay_off.as_deref().unwrap_or_default();
    assert!(
        why.contains("refused by the control"),
        "{what}: reason kept: {why:?}"
    );
    assert_eq!(t.step_losses, losses, "{what}: per-step losses");
    assert_eq!(t.state_hashes(), hashes, "{what}: state hashes");
}

pub(super) fn fit(cfg: &Config, control: Control) -> (StateHashes, Vec<[f32; 6]>, Tensors) {
    let mut t = trainer(cfg, control);
    run_to_end(&mut t);
    (
        t.state_hashes(),
        t.step_losses.clone(),
        model_tensors(&t.model),
    )
}

fn assert_parity(precision: &str) {
    assert_parity_of("pose", precision);
}

pub(super) fn assert_parity_of(task: &str, precision: &str) {
    let (native, native_losses, nt) = fit(&config_for(task, precision, false), Control::None);
    let (replay, replay_losses, rt) = fit(&config_for(task, precision, true), Control::None);
    let first_diff = native_losses
        .iter()
        .zip(&replay_losses)
        .position(|(a, b)| a != b);
    assert_eq!(first_diff, None, "{precision}: per-step losses differ");
    assert_eq!(
        native,
        replay,
        "{precision}: state hashes differ; {}",
        differing(&nt, &rt)
    );
    println!(
        "{precision}: {} steps equal, {native:?}",
        native_losses.len()
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn replay_matches_native_fp32() {
    assert_parity("fp32");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn replay_matches_native_bf16() {
    assert_parity("bf16");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn replay_matches_native_fp16() {
    assert_parity("fp16");
}

/// One step of detection, native vs replayed whole network (FP32): every model tensor equal,
/// BatchNorm running statistics included.
#[test]
#[ignore = "needs a CUDA GPU"]
fn detection_one_step_matches_native() {
    let one = |capture: bool| {
        let mut t = trainer(&config_for("detect", "fp32", capture), Control::None);
        let order = t.epoch_order(0);
        t.train_step(&t.batch(&order, 0).unwrap());
        model_tensors(&t.model)
    };
    let (native, replay) = (one(false), one(true));
    assert!(native == replay, "{}", differing(&native, &replay));
}

/// After one step each arm's BatchNorm running statistics are those of one training forward of
/// the initial model on the step's images, backbone and head alike.
#[test]
#[ignore = "needs a CUDA GPU"]
fn detection_statistics_move_once_per_step() {
    let cfg = config_for("detect", "fp32", false);
    let fresh = trainer(&cfg, Control::None);
    let order = fresh.epoch_order(0);
    let batch = fresh.batch(&order, 0).unwrap();
    let _ = fresh.model.forward(batch.images_f32(&fresh.device));
    let stats = |m: &Yolo| -> Tensors {
        model_tensors(m)
            .into_iter()
            .filter(|(p, _)| p.contains("running_"))
            .collect()
    };
    let want = stats(&fresh.model);
    for capture in [false, true] {
        let mut t = trainer(&config_for("detect", "fp32", capture), Control::None);
        t.train_step(&batch);
        let got = stats(&t.model);
        assert!(got == want, "capture {capture}: {}", differing(&got, &want));
    }
}

/// One ordinary step, then a batch without any object: the point stems get no gradient on either
/// path, so they and their optimizer state stay put, and the two paths stay equal.
fn empty_layout(capture: bool, control: Control) -> (StateHashes, Vec<[f32; 6]>, bool) {
    empty_layout_of("pose", capture, control)
}

fn empty_layout_of(
    task: &str,
    capture: bool,
    control: Control,
) -> (StateHashes, Vec<[f32; 6]>, bool) {
    let mut cfg = config_for(task, "fp32", capture);
    cfg.train.nbs = 4;
    let mut t = trainer(&cfg, control);
    let order = t.epoch_order(0);
    t.train_step(&t.batch(&order, 0).unwrap());
    let empty = super::common::empty_batch::without_objects(&t, &order, 1);
    // The point stems (pose) or the box branch (detection): no positives, no gradient.
    let stem = |t: &Trainer| match &t.model.head.one2many.pose {
        Some(_) => point_stem_weight(t),
        None => box_branch_weight(t),
    };
    let before = stem(&t);
    t.train_step(&empty);
    let still = stem(&t) == before;
    t.train_step(&t.batch(&order, 2).unwrap());
    (t.state_hashes(), t.step_losses.clone(), still)
}

/// The empty-batch layout, native vs replay: what must not move stays put on both paths, and the
/// two are byte-equal.
pub(super) fn assert_empty_parity(task: &str) {
    let (native, nl, native_still) = empty_layout_of(task, false, Control::None);
    let (replay, rl, replay_still) = empty_layout_of(task, true, Control::None);
    assert!(
        native_still && replay_still,
        "{task}: a branch without gradient moved without positives"
    );
    assert_eq!(nl, rl);
    assert_eq!(native, replay);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn replay_matches_native_on_an_empty_batch() {
    assert_empty_parity("pose");
}

/// Negative control: the warm-up and recording runs' BatchNorm statistics reach the trainer (no
/// rollback). The parity check must see it.
#[test]
#[ignore = "needs a CUDA GPU"]
fn skipping_the_rollback_breaks_parity() {
    let (native, _, _) = empty_layout(false, Control::None);
    let (broken, _, _) = empty_layout(true, Control::SkipRollback);
    assert_ne!(
        native.model, broken.model,
        "the parity check missed a skipped rollback"
    );
}

/// Negative control: recording the one-to-many point stems too gives them a zero gradient on the
/// batch without positives, so the optimizer moves them (momentum, weight decay) where the
/// native loop skips them. The parity check must see it.
#[test]
#[ignore = "needs a CUDA GPU"]
fn recording_the_point_stems_breaks_parity() {
    let (native, _, native_still) = empty_layout(false, Control::None);
    let (broken, _, broken_still) = empty_layout(true, Control::RecordStems);
    assert!(
        native_still,
        "a point stem moved without positives natively"
    );
    assert!(
        !broken_still,
        "recorded point stems stayed put: the control did not record them"
    );
    assert_ne!(
        native.model, broken.model,
        "the parity check missed recorded point stems"
    );
    assert_ne!(native.optimizer, broken.optimizer);
}

/// Detection records the whole network (docs/replay.md): byte parity over two epochs.
#[test]
#[ignore = "needs a CUDA GPU"]
fn detection_replay_matches_native_fp32() {
    assert_parity_of("detect", "fp32");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn detection_replay_matches_native_bf16() {
    assert_parity_of("detect", "bf16");
}

/// Without positives the box branches get no gradient natively; the recorded whole network must
/// leave them absent too (the stage drops gradients of unreached head outputs).
#[test]
#[ignore = "needs a CUDA GPU"]
fn detection_replay_matches_native_on_an_empty_batch() {
    assert_empty_parity("detect");
}

/// A pose model whose stage is the whole network (`replay.scope = "network"`: the head
/// recorded too, only assignment and losses in autodiff): byte parity over two epochs.
#[test]
#[ignore = "needs a CUDA GPU"]
fn pose_network_replay_matches_native_bf16() {
    assert_parity_of("pose-network", "bf16");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn pose_network_replay_matches_native_fp16() {
    assert_parity_of("pose-network", "fp16");
}

/// Without positives the point stems and keypoint predictors get no gradient natively; with
/// the head recorded they must stay absent too.
#[test]
#[ignore = "needs a CUDA GPU"]
fn pose_network_replay_matches_native_on_an_empty_batch() {
    assert_empty_parity("pose-network");
}

/// Negative control: keeping the recorded zero gradients of the branches the loss did not read
/// moves the point stems on the batch without positives. The parity check must see it.
#[test]
#[ignore = "needs a CUDA GPU"]
fn keeping_unreached_gradients_breaks_parity() {
    assert_keeping_unreached_breaks_parity("pose-network");
}

/// The empty-batch layout of `task` natively and with `Control::KeepUnreached`: the stems stay
/// put natively, move under the control, and the state hashes differ.
pub(super) fn assert_keeping_unreached_breaks_parity(task: &str) {
    let (native, _, native_still) = empty_layout_of(task, false, Control::None);
    let (broken, _, broken_still) = empty_layout_of(task, true, Control::KeepUnreached);
    assert!(
        native_still,
        "{task}: a point stem moved without positives natively"
    );
    assert!(
        !broken_still,
        "{task}: the point stems stayed put: the control kept nothing"
    );
    assert_ne!(native.model, broken.model);
    assert_ne!(native.optimizer, broken.optimizer);
}

/// The per-tensor update (`optim.flat_update = false`): the recorder copies its new parameter
/// tensors in after every optimizer step, as it does the flat update's views.
#[test]
#[ignore = "needs a CUDA GPU"]
fn replay_matches_native_with_the_per_tensor_update() {
    assert_parity_of("pose-per-tensor", "bf16");
}

/// MuSGD through the flat update (its Newton–Schulz batched by matrix shape), written in place:
/// the recorder sees its new values as it sees AdamW's.
#[test]
#[ignore = "needs a CUDA GPU"]
fn replay_matches_native_with_musgd() {
    assert_parity_of("pose-musgd", "bf16");
}

/// Negative control: replay copies a parameter in only when the trainer holds a new tensor for
/// it. Copying once and never again (as if nothing changed) leaves the graph on the first step's
/// weights after the first optimizer step; the parity check must see it.
#[test]
#[ignore = "needs a CUDA GPU"]
fn stale_parameters_break_parity() {
    assert_stale_parameters_break_parity("pose");
}

/// [`stale_parameters_break_parity`] for `task`.
pub(super) fn assert_stale_parameters_break_parity(task: &str) {
    let cfg = config_for(task, "fp32", true);
    let (native, native_losses, _) = fit(&config_for(task, "fp32", false), Control::None);
    let (broken, broken_losses, _) = fit(&cfg, Control::StaleSources);
    assert_eq!(
        native_losses[0], broken_losses[0],
        "the first step ran on the same weights"
    );
    assert_ne!(
        native_losses, broken_losses,
        "the per-step losses missed stale parameters"
    );
    assert_ne!(
        native.model, broken.model,
        "the parity check missed stale parameters"
    );
}

/// A stage whose recording fails (the injected `RefuseRecording`: split graphs, the features
/// scope and the step scope's three graphs) runs natively from that step on: replay off with
/// the reason kept, the same per-step losses and state hashes as native. The recording ran on
/// a private copy, so the trainer's model is as it was when the step runs natively.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_stage_that_cannot_be_recorded_runs_natively() {
    for (task, precision) in [("pose", "bf16"), ("pose-step", "fp32")] {
        assert_runs_natively(
            &config_for(task, precision, true),
            &config_for(task, precision, false),
            Control::RefuseRecording,
            task,
        );
    }
}
