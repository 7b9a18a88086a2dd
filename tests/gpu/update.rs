//! `replay.record_update`: the optimizer step and the EMA update recorded as one CUDA graph
//! (docs/replay.md, "The update recorded"), against the native loop on the H200 — byte-equal
//! state hashes and per-step losses with the learning rate, the momentum and the EMA decay
//! changing every step (warm-up), accumulation, FP16's growing loss scale, MuSGD, the step scope
//! and one graph — and a negative control whose per-step values are written at recording only.

use super::replay::{config_for, differing, fit, model_tensors, trainer};
use super::step::recordings;
use burnpose::config::Config;
use burnpose::replay::Stage;
use burnpose::replay::recorder::Control;
use burnpose::train::Trainer;

fn recorded(task: &str, precision: &str) -> Config {
    let mut cfg = config_for(task, precision, true);
    cfg.replay.record_update = Some(true);
    cfg
}

fn update_replays(t: &Trainer) -> usize {
    match &t.stage {
        Stage::Replay(r) => r.update_replays(),
        Stage::Native(_) => 0,
    }
}

/// `task`'s two-epoch fit (batch 4, nbs 8: every other step an optimizer step) natively and
/// with the update recorded: the same bits, and the recorded update ran on every optimizer
/// step but the first.
fn assert_update_parity(task: &str, precision: &str) {
    let (native, native_losses, _) = fit(&config_for(task, precision, false), Control::None);
    let mut t = trainer(&recorded(task, precision), Control::None);
    super::replay::run_to_end(&mut t);
    let steps = t.step_losses.len();
    assert!(
        update_replays(&t) + 1 >= steps / 2,
        "{task} {precision}: {} recorded updates in {steps} steps",
        update_replays(&t)
    );
    assert_eq!(
        native_losses, t.step_losses,
        "{task} {precision}: per-step losses"
    );
    assert_eq!(native, t.state_hashes(), "{task} {precision}: state hashes");
    println!(
        "{task} {precision}: {} recorded updates, {} loss recordings, {native:?}",
        update_replays(&t),
        recordings(&t)
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn recorded_update_matches_native_fp32() {
    assert_update_parity("pose", "fp32");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn recorded_update_matches_native_at_the_step_scope_bf16() {
    assert_update_parity("pose-step", "bf16");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn recorded_update_matches_native_in_one_graph_bf16() {
    assert_update_parity("pose-one-graph", "bf16");
}

/// FP16: the loss-scale inverse is a buffer the host rewrites, the skip decided in the graph.
#[test]
#[ignore = "needs a CUDA GPU"]
fn recorded_update_matches_native_fp16() {
    assert_update_parity("pose-step", "fp16");
}

/// Detection (the network scope): its box branches' presence decided on the host, as the pose
/// stems'.
#[test]
#[ignore = "needs a CUDA GPU"]
fn recorded_update_matches_native_for_detection_bf16() {
    assert_update_parity("detect", "bf16");
}

/// MuSGD: Newton–Schulz batched by shape inside the graph.
#[test]
#[ignore = "needs a CUDA GPU"]
fn recorded_update_matches_native_with_musgd() {
    assert_update_parity("pose-musgd", "bf16");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn recorded_update_with_shared_parameters_matches_native() {
    let (native, native_losses, _) = fit(&config_for("pose-step", "bf16", false), Control::None);
    let mut cfg = recorded("pose-step", "bf16");
    cfg.replay.shared_parameters = true;
    let (replay, replay_losses, _) = fit(&cfg, Control::None);
    assert_eq!(native_losses, replay_losses, "per-step losses");
    assert_eq!(native, replay, "state hashes");
}

/// Negative control: the table (learning rates, bias corrections, presence), the momentum and
/// the EMA's decay written at recording only. During warm-up they change every step: the end
/// state must differ.
#[test]
#[ignore = "needs a CUDA GPU"]
fn frozen_update_scalars_break_parity() {
    let (native, _, _) = fit(&config_for("pose", "fp32", false), Control::None);
    let (broken, _, _) = fit(&recorded("pose", "fp32"), Control::FrozenUpdateScalars);
    assert_ne!(
        native.model, broken.model,
        "the model missed frozen scalars"
    );
    assert_ne!(native.ema, broken.ema, "the EMA missed a frozen decay");
}

/// The first epoch step by step, native and recorded side by side: after every step the model,
/// EMA and optimizer hashes must agree, and where they do not the failure names the step, the
/// parts that differ and the model's (or the EMA's) tensors that do.
fn assert_lockstep(task: &str, precision: &str) {
    let mut native = trainer(&config_for(task, precision, false), Control::None);
    let mut rec = trainer(&recorded(task, precision), Control::None);
    let order = native.epoch_order(0);
    for b in 0..native.batches_per_epoch() {
        let batch = native.batch(&order, b).unwrap();
        let (x, y) = (
            native.timed_step(&batch).unwrap(),
            rec.timed_step(&batch).unwrap(),
        );
        let (h, k) = (native.state_hashes(), rec.state_hashes());
        let parts: Vec<&str> = [
            ("model", h.model != k.model),
            ("ema", h.ema != k.ema),
            ("optimizer", h.optimizer != k.optimizer),
            ("scheduler", h.scheduler != k.scheduler),
            ("scaler", h.scaler != k.scaler),
            ("losses", x != y),
        ]
        .into_iter()
        .filter_map(|(n, d)| d.then_some(n))
        .collect();
        assert!(
            parts.is_empty(),
            "{task} {precision}: step {b} ({} recorded updates): {parts:?} differ; model: {}; EMA: {}",
            update_replays(&rec),
            differing(&model_tensors(&native.model), &model_tensors(&rec.model)),
            differing(
                &model_tensors(&native.ema.model),
                &model_tensors(&rec.ema.model)
            ),
        );
    }
    assert!(
        update_replays(&rec) > 0,
        "{task} {precision}: no recorded update ran"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn recorded_update_matches_native_step_by_step_fp32() {
    assert_lockstep("pose", "fp32");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn recorded_update_matches_native_step_by_step_at_the_step_scope_bf16() {
    assert_lockstep("pose-step", "bf16");
}
