//! `replay.scope = "step"` against the native loop on the H200: the network's graphs and the
//! recorded device loss (docs/replay.md, "Step recording") give byte-equal state hashes and
//! per-step losses, and negative controls that must fail.

use super::replay::{assert_empty_parity, assert_parity_of, config_for, fit};
use burnpose::replay::Stage;
use burnpose::replay::recorder::Control;
use burnpose::train::{StateHashes, Trainer};

pub(super) fn recordings(t: &Trainer) -> usize {
    match &t.stage {
        Stage::Replay(r) => r.loss_recordings(),
        Stage::Native(_) => 0,
    }
}

/// `t`'s fit to its end.
fn run(mut t: Trainer) -> Trainer {
    super::replay::run_to_end(&mut t);
    t
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn step_replay_matches_native_fp32() {
    assert_parity_of("pose-step", "fp32");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn step_replay_matches_native_bf16() {
    assert_parity_of("pose-step", "bf16");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn detection_step_replay_matches_native_fp32() {
    assert_parity_of("detect-step", "fp32");
}

/// The recorded loss's flow parameters each in a buffer of its own, refreshed by one copy per
/// tensor (`replay::loss::choose_flow_segments(false)`; segments of one buffer refreshed by one
/// copy are the default): the same state hashes and per-step losses as native.
#[test]
#[ignore = "needs a CUDA GPU"]
fn step_replay_with_flow_tensors_apart_matches_native_bf16() {
    burnpose::replay::loss::choose_flow_segments(false);
    let result = std::panic::catch_unwind(|| assert_parity_of("pose-step", "bf16"));
    burnpose::replay::loss::choose_flow_segments(true);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

/// FP16 with a loss scale that changes during the fit (it doubles after every two clean
/// optimizer steps here): the recorded loss reads the scale from its buffer, so every step
/// seeds the backward with the current one, as native multiplies by it.
#[test]
#[ignore = "needs a CUDA GPU"]
fn step_replay_matches_native_fp16() {
    assert_fp16_parity("pose-step");
}

/// [`step_replay_matches_native_fp16`] for `task`.
pub(super) fn assert_fp16_parity(task: &str) {
    let (native, native_losses, native_scale) = fit_fp16(task, false, Control::None);
    let (replay, replay_losses, replay_scale) = fit_fp16(task, true, Control::None);
    assert!(native_scale > 64.0, "the scale never grew: {native_scale}");
    assert_eq!(native_scale, replay_scale);
    assert_eq!(replay_losses, native_losses, "per-step losses differ");
    assert_eq!(replay, native, "state hashes differ");
    println!("fp16: scale 64 -> {native_scale}, {native:?}");
}

/// Negative control: FP16's loss scale written into the recorded loss at recording only (as a
/// scalar frozen into the graph would be). The gradients are unscaled by the current scale, so
/// once it has grown they come out too small: the steps before agree, the end state must not.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_frozen_loss_scale_breaks_step_parity() {
    assert_frozen_loss_scale_breaks_parity("pose-step");
}

/// [`a_frozen_loss_scale_breaks_step_parity`] for `task`.
pub(super) fn assert_frozen_loss_scale_breaks_parity(task: &str) {
    let (native, native_losses, native_scale) = fit_fp16(task, false, Control::None);
    let (broken, broken_losses, _) = fit_fp16(task, true, Control::FrozenLossScale);
    assert!(native_scale > 64.0, "the scale never grew: {native_scale}");
    assert_eq!(
        native_losses[..2],
        broken_losses[..2],
        "the first steps run with the recorded scale"
    );
    assert_ne!(native.model, broken.model);
}

/// A two-epoch FP16 fit of `task`'s config from loss scale 64, the scale growing after every
/// two clean optimizer steps: its state hashes, per-step losses and final scale.
fn fit_fp16(task: &str, capture: bool, control: Control) -> (StateHashes, Vec<[f32; 6]>, f32) {
    let cfg = config_for(task, "fp16", capture);
    let mut t = super::replay::trainer(&cfg, control);
    t.scaler
        .as_mut()
        .expect("fp16 scales its loss")
        .growth_interval = 2;
    let t = run(t);
    let scale = t.scaler.as_ref().map_or(0.0, |s| s.scale);
    (t.state_hashes(), t.step_losses.clone(), scale)
}

/// Without positives the recorded loss still writes gradients (zeros) for the keypoint
/// outputs; the counts read back must leave the point stems absent, as natively.
#[test]
#[ignore = "needs a CUDA GPU"]
fn step_replay_matches_native_on_an_empty_batch() {
    assert_empty_parity("pose-step");
}

/// With slots for every batch the loss is recorded once; with `object_slots = 0` every batch
/// whose largest image holds another count records it again, and each recording still gives
/// native's bits.
#[test]
#[ignore = "needs a CUDA GPU"]
fn step_replay_records_the_loss_again_for_other_slot_counts() {
    assert_records_again_for_other_slot_counts("pose-step");
}

/// [`step_replay_records_the_loss_again_for_other_slot_counts`] for `task`.
pub(super) fn assert_records_again_for_other_slot_counts(task: &str) {
    let cfg = config_for(task, "fp32", true);
    let once = run(super::replay::trainer(&cfg, Control::None));
    assert_eq!(recordings(&once), 1, "16 slots hold every batch");
    let mut cfg = cfg;
    cfg.train.object_slots = 0;
    let mut native_cfg = cfg.clone();
    native_cfg.replay.enabled = false;
    let (native, native_losses, _) = fit(&native_cfg, Control::None);
    let t = run(super::replay::trainer(&cfg, Control::None));
    assert!(
        recordings(&t) > 1,
        "the batches' counts differ: recorded once"
    );
    assert_eq!(t.step_losses, native_losses, "per-step losses differ");
    assert_eq!(t.state_hashes(), native, "state hashes differ");
    println!("{} recordings, {native:?}", recordings(&t));
}

/// Negative control: keeping the recorded zero gradients of the outputs the loss did not reach
/// moves the point stems on the batch without positives. The parity check must see it.
#[test]
#[ignore = "needs a CUDA GPU"]
fn keeping_unreached_gradients_breaks_step_parity() {
    super::replay::assert_keeping_unreached_breaks_parity("pose-step");
}

/// Negative control: the ProgLoss weight written into the recorded loss only when it is
/// recorded (as a value frozen into the graph would be). It changes after the first epoch
/// (0.8 → 0.1 over two epochs): the first epoch's losses agree, the end state must not.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_frozen_loss_weight_breaks_step_parity() {
    assert_frozen_loss_weight_breaks_parity("pose-step");
}

/// [`a_frozen_loss_weight_breaks_step_parity`] for `task`.
pub(super) fn assert_frozen_loss_weight_breaks_parity(task: &str) {
    let (native, native_losses, _) = fit(&config_for(task, "fp32", false), Control::None);
    let (broken, broken_losses, _) =
        fit(&config_for(task, "fp32", true), Control::FrozenLossWeight);
    let first_epoch = 24 / 4;
    assert_eq!(
        native_losses[..first_epoch],
        broken_losses[..first_epoch],
        "the first epoch runs with the recorded weight"
    );
    assert_ne!(native.model, broken.model);
}

/// The recorded loss at batch 3 on real COCO images (416 px, device HSV, BF16, rectangular
/// validation on the train split), against native.
#[test]
#[ignore = "needs a CUDA GPU and ../shared/data/pose-real/pose_minicoco"]
fn step_replay_matches_native_at_batch_3_on_coco() {
    let replay = super::repeat::coco_b3_parity(
        "scope = \"step\"\none_graph = false\n",
        "loss_on = \"device\"\nobject_slots = 24\n",
    );
    println!("{} loss recordings", recordings(&replay));
}
