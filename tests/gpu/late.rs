//! `replay.defer_readback` on the H200: a recorded step that ends without an optimizer step is
//! read back and accumulated after the next step's replay is queued (docs/replay.md, "Reading a
//! step late"); the fit must give native's state hashes and per-step losses, and the negative
//! control (the late read taking the recorder's own buffers) must not.

use super::replay::{config_for, trainer};
use burnpose::replay::recorder::Control;
use burnpose::train::StateHashes;

/// A fit of `task` in `precision` to its end: state hashes, per-step losses and how many steps
/// were read late; replayed with `defer_readback` (and `control`), else native.
fn fit(
    task: &str,
    precision: &str,
    replayed: bool,
    control: Control,
) -> (StateHashes, Vec<[f32; 6]>, usize) {
    let mut cfg = config_for(task, precision, replayed);
    cfg.replay.defer_readback = Some(true);
    let mut t = trainer(&cfg, control);
    super::replay::run_to_end(&mut t);
    (t.state_hashes(), t.step_losses.clone(), t.read_late)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn reading_the_loss_late_matches_native() {
    for (task, precision) in [
        ("pose-one-graph", "bf16"),
        ("pose-one-graph", "fp32"),
        ("pose-one-graph", "fp16"),
        ("pose-step", "bf16"),
        ("detect-step", "fp32"),
    ] {
        let (native, native_losses, none) = fit(task, precision, false, Control::None);
        let (late, late_losses, read_late) = fit(task, precision, true, Control::None);
        assert_eq!(none, 0, "{task} {precision}: a native step was read late");
        // Two micro-batches per optimizer step after warm-up: about every other step.
        assert!(
            read_late >= native_losses.len() / 4 && read_late < native_losses.len(),
            "{task} {precision}: {read_late} of {} steps read late",
            native_losses.len()
        );
        let first_diff = native_losses
            .iter()
            .zip(&late_losses)
            .position(|(a, b)| a != b);
        assert_eq!(
            first_diff, None,
            "{task} {precision}: per-step losses differ"
        );
        assert_eq!(late_losses.len(), native_losses.len());
        assert_eq!(late, native, "{task} {precision}: state hashes differ");
        println!(
            "{task} {precision}: {read_late} of {} steps read late, {native:?}",
            native_losses.len()
        );
    }
}

/// Negative control: the step left queued keeps the recorder's buffers, which the next replay
/// rewrites before the step is read: the parity check must see it.
#[test]
#[ignore = "needs a CUDA GPU"]
fn reading_late_from_the_recorders_buffers_breaks_parity() {
    let (native, native_losses, _) = fit("pose-one-graph", "bf16", false, Control::None);
    let (broken, broken_losses, read_late) =
        fit("pose-one-graph", "bf16", true, Control::ReadLateInPlace);
    assert!(read_late > 0, "no step was read late");
    assert_ne!(
        broken_losses, native_losses,
        "the per-step losses missed it"
    );
    assert_ne!(broken.model, native.model, "the model hash missed it");
}

/// Steps fed one by one through `queue_step`, two micro-batches per optimizer step from the
/// first (no warm-up): batch 0 (recorded, read at once), batch 1 (an optimizer step), batches
/// 2 and 3 without objects (2 read late by 3, an optimizer step without positives: the point
/// stems must get no gradient from either), batch 4 (read late, then finished). State hashes,
/// per-step losses, steps read late.
fn empty_late(replayed: bool, control: Control) -> (StateHashes, Vec<[f32; 6]>, usize) {
    let mut cfg = config_for("pose-one-graph", "fp32", replayed);
    cfg.train.nbs = 8;
    cfg.optim.warmup_epochs = 0.0;
    cfg.replay.defer_readback = Some(true);
    let mut t = trainer(&cfg, control);
    let order = t.epoch_order(0);
    let mut finished = 0;
    for b in 0..5 {
        let batch = match b {
            2 | 3 => super::common::empty_batch::without_objects(&t, &order, b),
            _ => t.batch(&order, b).unwrap(),
        };
        finished += t.queue_step(&batch, None).len();
    }
    finished += t.finish_queued().into_iter().count();
    assert_eq!(finished, 5, "every step finished once");
    (t.state_hashes(), t.step_losses.clone(), t.read_late)
}

/// A batch without positives read late: the point stems get no gradient from it (absent, not
/// zero), as natively, once the next step reads it; with the next batch empty too, the
/// optimizer step leaves them where they are.
#[test]
#[ignore = "needs a CUDA GPU"]
fn an_empty_batch_read_late_matches_native() {
    let (native, native_losses, _) = empty_late(false, Control::None);
    let (late, late_losses, read_late) = empty_late(true, Control::None);
    assert_eq!(read_late, 2, "the empty batch and batch 4 are read late");
    assert_eq!(late_losses, native_losses);
    assert_eq!(late, native);
}

/// Negative control: with the unreached gradients kept, the empty batches give the point stems
/// zeros instead of none, and the optimizer step moves them: the parity check must see it on
/// this path too.
#[test]
#[ignore = "needs a CUDA GPU"]
fn keeping_unreached_gradients_read_late_breaks_parity() {
    let (native, _, _) = empty_late(false, Control::None);
    let (broken, _, read_late) = empty_late(true, Control::KeepUnreached);
    assert_eq!(read_late, 2);
    assert_ne!(broken.model, native.model, "the kept zeros went unseen");
}
