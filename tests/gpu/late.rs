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
    cfg.replay.defer_readback = true;
    let mut t = trainer(&cfg, control);
    while !t.finished() {
        t.run_epoch(&mut |_, _, _| {}).unwrap();
    }
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
