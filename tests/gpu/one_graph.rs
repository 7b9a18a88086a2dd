//! `replay.one_graph`: the step scope's forward, device loss and backward recorded as one CUDA
//! graph (docs/replay.md, "One window"), against the native loop on the H200 — byte-equal state
//! hashes and per-step losses in every precision, on an empty batch, with the loss recorded
//! again for other slot counts, on real COCO images, with shared parameters — and the step
//! scope's negative controls, which must fail here too.

use super::replay::{
    assert_empty_parity, assert_keeping_unreached_breaks_parity, assert_parity_of,
    assert_runs_natively, assert_stale_parameters_break_parity, config_for, fit,
};
use super::step::{
    assert_fp16_parity, assert_frozen_loss_scale_breaks_parity,
    assert_frozen_loss_weight_breaks_parity, assert_records_again_for_other_slot_counts,
    recordings,
};
use burnpose::replay::recorder::Control;

const TASK: &str = "pose-one-graph";

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_graph_matches_native_fp32() {
    assert_parity_of(TASK, "fp32");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_graph_matches_native_bf16() {
    assert_parity_of(TASK, "bf16");
}

/// The forward runs under the step's autocast dtype inside the window, the loss in FP32, and
/// the loss scale is read from its buffer at every replay.
#[test]
#[ignore = "needs a CUDA GPU"]
fn one_graph_matches_native_fp16() {
    assert_fp16_parity(TASK);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_graph_matches_native_on_an_empty_batch() {
    assert_empty_parity(TASK);
}

/// Another slot count records the whole step again, on that step's own images.
#[test]
#[ignore = "needs a CUDA GPU"]
fn one_graph_records_the_step_again_for_other_slot_counts() {
    assert_records_again_for_other_slot_counts(TASK);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_graph_with_shared_parameters_matches_native_bf16() {
    let mut cfg = config_for(TASK, "bf16", true);
    cfg.replay.shared_parameters = true;
    let (native, native_losses, _) = fit(&config_for(TASK, "bf16", false), Control::None);
    let (replay, replay_losses, _) = fit(&cfg, Control::None);
    assert_eq!(native_losses, replay_losses, "per-step losses");
    assert_eq!(native, replay, "state hashes");
}

#[test]
#[ignore = "needs a CUDA GPU and ../shared/data/pose-real/pose_minicoco"]
fn one_graph_matches_native_at_batch_3_on_coco() {
    let replay = super::repeat::coco_b3_parity(
        "scope = \"step\"\none_graph = true\n",
        "loss_on = \"device\"\nobject_slots = 24\n",
    );
    say_recordings(&replay);
}

/// The fit `benches/gpu/fresh.sh` checks, `configs/check_coco_odd.toml` as written (COCO at
/// 416 px, batch 3, device HSV and rotation, one graph, the object slots grown from zero): the
/// step is recorded again as the images' objects outnumber the slots, at least three times,
/// and every recording ends in a graph, made again after one more warm-up where its window
/// found no room (on 2026-12-07 the third ran out and the fit panicked, docs/perf_log.md BJ3);
/// the end state equals native's.
#[test]
#[ignore = "needs a CUDA GPU and ../shared/data/pose-real/pose_minicoco"]
fn one_graph_records_again_as_the_slots_grow_on_coco() {
    assert_records_again_as_the_slots_grow_on_coco();
}

/// [`one_graph_records_again_as_the_slots_grow_on_coco`] with one more warm-up that runs what
/// the window records (`recorder::choose_warm_up_as_captured`): no window should run short
/// then (docs/perf_log.md BM1).
#[test]
#[ignore = "needs a CUDA GPU and ../shared/data/pose-real/pose_minicoco"]
fn one_graph_records_again_on_coco_with_the_window_warmed_up() {
    burnpose::replay::recorder::choose_warm_up_as_captured(true);
    let outcome = std::panic::catch_unwind(assert_records_again_as_the_slots_grow_on_coco);
    burnpose::replay::recorder::choose_warm_up_as_captured(false);
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

fn assert_records_again_as_the_slots_grow_on_coco() {
    use burnpose::config::Config;
    use burnpose::train::Trainer;
    use std::path::Path;
    let path = Path::new("configs/check_coco_odd.toml");
    let run = |capture: bool| {
        let mut cfg = Config::load(path).unwrap();
        cfg.replay.enabled = capture;
        let mut t = Trainer::new(cfg, path, super::cuda()).unwrap();
        assert_eq!(t.stage.is_replay(), capture, "{:?}", t.replay_off);
        super::replay::run_to_end(&mut t);
        t
    };
    // Replay first: on pools a native fit has not grown, as in a fresh process, where the
    // third recording ran short of room (docs/perf_log.md BJ3, BL1).
    let replay = run(true);
    let native = run(false);
    say_recordings(&replay);
    assert!(recordings(&replay) >= 3, "the slots grew fewer than twice");
    assert_eq!(native.step_losses, replay.step_losses, "per-step losses");
    assert_eq!(native.state_hashes(), replay.state_hashes(), "state hashes");
}

/// A step that cannot be recorded (the injected `RefuseRecordingAgain`: every recording after
/// the first refused) runs natively, and so does the rest of the fit: replay off with the
/// reason kept, the same per-step losses and state hashes as native. BF16: the step's forward
/// runs again under the fit's autocast.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_step_that_cannot_be_recorded_runs_natively() {
    let mut cfg = config_for(TASK, "bf16", true);
    // No spare slots: a batch with more objects than the first records the step again.
    cfg.train.object_slots = 0;
    let mut native = cfg.clone();
    native.replay.enabled = false;
    // The control refuses only a recording after a first one that succeeded: replay stays on
    // until then.
    assert_runs_natively(&cfg, &native, Control::RefuseRecordingAgain, "one graph");
}

/// Negative control: the recorded zero gradients of unreached outputs kept.
#[test]
#[ignore = "needs a CUDA GPU"]
fn keeping_unreached_gradients_breaks_one_graph_parity() {
    assert_keeping_unreached_breaks_parity(TASK);
}

/// Negative control: the ProgLoss weight written at recording only.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_frozen_loss_weight_breaks_one_graph_parity() {
    assert_frozen_loss_weight_breaks_parity(TASK);
}

/// Negative control: FP16's loss scale written at recording only.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_frozen_loss_scale_breaks_one_graph_parity() {
    assert_frozen_loss_scale_breaks_parity(TASK);
}

/// Negative control: the parameters copied in once and never again.
#[test]
#[ignore = "needs a CUDA GPU"]
fn stale_parameters_break_one_graph_parity() {
    assert_stale_parameters_break_parity(TASK);
}

/// How many times `t`'s fit recorded the step, and how many of those were made again for room.
fn say_recordings(t: &burnpose::train::Trainer) {
    let retries = match &t.stage {
        burnpose::replay::Stage::Replay(r) => r.room_retries(),
        burnpose::replay::Stage::Native(_) => 0,
    };
    println!(
        "{} step recordings, {retries} made again for room",
        recordings(t)
    );
}

/// Burn's composed softmax for the attention (`model::ops::softmax::choose(false)`; the fused
/// one is the default every other parity test takes) in both loops: byte-equal state hashes
/// and per-step losses (BF16).
#[test]
#[ignore = "needs a CUDA GPU"]
fn one_graph_with_burns_softmax_matches_native_bf16() {
    let _off = super::Choice::set(burnpose::model::ops::softmax::choose, false, true);
    assert_parity_of(TASK, "bf16");
}

/// One walk of the model while a step that ends in an optimizer step runs, for its update's EMA
/// sources and the next step's (`replay::update::choose_early`, off by default): byte-equal to
/// the native loop, state hashes and per-step losses (BF16), with the next step's sources taken
/// from the walk at least once, and on a batch without objects. Its negative control keeps the
/// walk across the first optimizer step, which is eager (the optimizer's buffers are not the
/// parameters' yet) and gives the model new tensors: parity must fail. That needs a first
/// update that moves parameters: "auto" (AdamW here) warms every group up from a learning rate
/// of 0, so its first update changes no value and a stale walk still reads the right ones. The
/// fits here name AdamW with a bias warm-up rate of 0.01, which moves the biases at once.
#[test]
#[ignore = "needs a CUDA GPU"]
fn one_graph_with_an_early_walk_matches_native_bf16() {
    use super::replay::{run_to_end, trainer};
    use burnpose::config::{Config, OptimizerKind};
    use burnpose::replay::Stage;
    let _on = super::Choice::set(burnpose::replay::update::choose_early, true, false);
    let config = |capture: bool| -> Config {
        let mut cfg = config_for(TASK, "bf16", capture);
        cfg.optim.optimizer = OptimizerKind::Adamw;
        cfg.optim.lr0 = 0.002;
        cfg.optim.warmup_bias_lr = 0.01;
        cfg
    };
    let (native, native_losses, _) = fit(&config(false), Control::None);
    let walks = |t: &burnpose::train::Trainer| match &t.stage {
        Stage::Replay(r) => r.walks_taken(),
        Stage::Native(_) => 0,
    };
    let mut t = trainer(&config(true), Control::None);
    run_to_end(&mut t);
    assert!(walks(&t) > 0, "no step took its sources from a walk");
    assert_eq!(native_losses, t.step_losses, "per-step losses");
    assert_eq!(native, t.state_hashes(), "state hashes");
    println!(
        "{} steps equal, {} walks taken, {} recordings",
        native_losses.len(),
        walks(&t),
        recordings(&t)
    );
    let mut kept = trainer(&config(true), Control::KeepWalk);
    run_to_end(&mut kept);
    println!(
        "control: {} walks taken, {} recordings",
        walks(&kept),
        recordings(&kept)
    );
    assert!(
        walks(&kept) > 0,
        "control: no step took its sources from a walk"
    );
    assert_ne!(
        (native_losses, native),
        (kept.step_losses.clone(), kept.state_hashes()),
        "a walk kept across an eager update left parity intact"
    );
    assert_empty_parity(TASK);
}
