//! `replay.upload_ahead` on the GPU: a recorded step makes the next batch's images while its
//! graph runs, and the next step takes them (docs/replay.md, "The next batch uploaded ahead").
//! The fit must give native's state hashes and per-step losses with most steps taking images
//! made ahead, the same bits as with the switch off, and the negative control (a step making
//! its own batch's images again in place of the next one's) must break parity.

use super::replay::{config_for, trainer};
use burnpose::replay::recorder::Control;
use burnpose::train::StateHashes;

/// A fit of `task` in `precision` to its end: state hashes, per-step losses and how many steps
/// took images made ahead; replayed with `replay.upload_ahead = ahead` (and `control`), else
/// native.
fn fit(
    task: &str,
    precision: &str,
    replayed: bool,
    ahead: bool,
    control: Control,
) -> (StateHashes, Vec<[f32; 6]>, usize) {
    let mut cfg = config_for(task, precision, replayed);
    cfg.replay.upload_ahead = Some(ahead);
    // Read at once: a step left queued makes no images ahead (its successor runs behind it).
    cfg.replay.defer_readback = Some(false);
    let mut t = trainer(&cfg, control);
    super::replay::run_to_end(&mut t);
    (t.state_hashes(), t.step_losses.clone(), t.uploaded_ahead)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn uploading_ahead_matches_native() {
    for (task, precision) in [
        ("pose-one-graph", "bf16"),
        ("pose-one-graph", "fp16"),
        ("pose-step", "fp32"),
        ("detect-step", "bf16"),
    ] {
        let (native, native_losses, none) = fit(task, precision, false, true, Control::None);
        let (ahead, ahead_losses, taken) = fit(task, precision, true, true, Control::None);
        let (own, own_losses, off) = fit(task, precision, true, false, Control::None);
        assert_eq!(
            (none, off),
            (0, 0),
            "{task} {precision}: images taken ahead"
        );
        // Every step but the first of each epoch takes the images made during the one before.
        let epochs = 2;
        assert_eq!(
            taken,
            native_losses.len() - epochs,
            "{task} {precision}: {taken} of {} steps took images made ahead",
            native_losses.len()
        );
        assert_eq!(ahead_losses, native_losses, "{task} {precision}: losses");
        assert_eq!(own_losses, native_losses, "{task} {precision}: losses, off");
        assert_eq!(ahead, native, "{task} {precision}: state hashes");
        assert_eq!(own, native, "{task} {precision}: state hashes, off");
        println!(
            "{task} {precision}: {taken} of {} steps took images made ahead, {native:?}",
            native_losses.len()
        );
    }
}

/// Negative control: each step makes its own batch's images again under the next batch's key,
/// so every step after an epoch's first trains on the batch before it: the parity check must
/// see it.
#[test]
#[ignore = "needs a CUDA GPU"]
fn uploading_this_batch_ahead_breaks_parity() {
    let (native, native_losses, _) = fit("pose-one-graph", "bf16", false, true, Control::None);
    let (broken, broken_losses, taken) = fit(
        "pose-one-graph",
        "bf16",
        true,
        true,
        Control::AheadOfThisBatch,
    );
    assert!(taken > 0, "no step took images made ahead");
    assert_ne!(
        broken_losses, native_losses,
        "the per-step losses missed it"
    );
    assert_ne!(broken.model, native.model, "the model hash missed it");
}
