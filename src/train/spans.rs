//! The host's wall time in the parts of a training step, summed over the steps run while
//! counting (`bench-step --spans`, with `--unsynced`): where a step's host time goes when
//! nothing syncs the device but the step itself (the wait for a recorded step's loss is in the
//! `read` span). Off, a span costs one relaxed load (a [`since`] span also its caller's
//! `Instant::now`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// A part of [`crate::train::Trainer`]'s step, in the order a step runs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Span {
    /// The batch's images on the device: uploaded and augmented, or taken as made ahead.
    Images,
    /// The stage's forward (for the recorded step scope: the images handed to the recorder).
    Stage,
    /// The recorded loss queued: its inputs written, its graph (with one graph, the step's)
    /// launched.
    Loss,
    /// Within `Loss`, one graph: the recorder's copies of the parameters and statistics
    /// brought up to date.
    LossSources,
    /// Within `LossSources`: the trainer's model walked for its tensors (`FloatIndex`).
    SourcesWalk,
    /// Within `LossSources`: the parameters' segments compared and copied where they moved.
    SourcesSegments,
    /// Within `LossSources`: every other buffer compared and copied where it moved.
    SourcesRest,
    /// Within `Loss`, one graph: the images copied into the graph's input.
    LossImages,
    /// Within `Loss`, one graph: the labels (object slots), the ProgLoss weight, the loss
    /// scale and the flow's parameters written into the graph's inputs.
    LossLabels,
    /// Within `Loss`, one graph: the graph launched.
    LossLaunch,
    /// Within `Loss`, one graph: the new running statistics handed to the trainer's model.
    LossStatistics,
    /// Within `LossStatistics`: the model rebuilt with them.
    StatisticsReplace,
    /// The next batch's images made (`replay.upload_ahead`).
    Ahead,
    /// The model walked once, right after the launch of a step that ends in an optimizer step,
    /// for the update's and the next step's sources (`replay::update::early`).
    Walk,
    /// The loss's results read back (the wait for the graph) and the gradients sorted.
    Read,
    /// The micro-batch's gradients added to the pending ones.
    Accumulate,
    /// The recorded update's per-step inputs computed on the host (presence, learning rates,
    /// bias corrections, the EMA's sources).
    UpdateInputs,
    /// Those inputs written to the update graph's buffers, the gradients gathered.
    UpdateWrite,
    /// The update graph launched.
    UpdateLaunch,
    /// The optimizer step's outcome settled and the logged items read.
    Settle,
}

const SPANS: [Span; 20] = [
    Span::Images,
    Span::Stage,
    Span::Loss,
    Span::LossSources,
    Span::SourcesWalk,
    Span::SourcesSegments,
    Span::SourcesRest,
    Span::LossImages,
    Span::LossLabels,
    Span::LossLaunch,
    Span::LossStatistics,
    Span::StatisticsReplace,
    Span::Ahead,
    Span::Walk,
    Span::Read,
    Span::Accumulate,
    Span::UpdateInputs,
    Span::UpdateWrite,
    Span::UpdateLaunch,
    Span::Settle,
];

impl Span {
    /// Whether the span is a part of another (`Loss`), whose time holds it already.
    pub fn nested(self) -> bool {
        matches!(
            self,
            Span::LossSources
                | Span::SourcesWalk
                | Span::SourcesSegments
                | Span::SourcesRest
                | Span::StatisticsReplace
                | Span::LossImages
                | Span::LossLabels
                | Span::LossLaunch
                | Span::LossStatistics
        )
    }

    /// The span's name in `bench-step`'s table.
    pub fn name(self) -> &'static str {
        match self {
            Span::Images => "images",
            Span::Stage => "stage",
            Span::Loss => "loss",
            Span::LossSources => "loss: sources",
            Span::SourcesWalk => "sources: walk",
            Span::SourcesSegments => "sources: segments",
            Span::SourcesRest => "sources: rest",
            Span::LossImages => "loss: images",
            Span::LossLabels => "loss: labels",
            Span::LossLaunch => "loss: launch",
            Span::LossStatistics => "loss: statistics",
            Span::StatisticsReplace => "statistics: replace",
            Span::Ahead => "ahead",
            Span::Walk => "walk",
            Span::Read => "read",
            Span::Accumulate => "accumulate",
            Span::UpdateInputs => "update inputs",
            Span::UpdateWrite => "update write",
            Span::UpdateLaunch => "update launch",
            Span::Settle => "settle",
        }
    }
}

static ON: AtomicBool = AtomicBool::new(false);
static NANOS: [AtomicU64; SPANS.len()] = [const { AtomicU64::new(0) }; SPANS.len()];
static RUNS: [AtomicU64; SPANS.len()] = [const { AtomicU64::new(0) }; SPANS.len()];

/// Starts counting from zero.
pub fn start() {
    for (n, r) in NANOS.iter().zip(&RUNS) {
        n.store(0, Ordering::Relaxed);
        r.store(0, Ordering::Relaxed);
    }
    ON.store(true, Ordering::Relaxed);
}

/// Stops counting: per span, in the order of a step, its total ms and how many times it ran.
pub fn stop() -> Vec<(Span, f64, u64)> {
    ON.store(false, Ordering::Relaxed);
    SPANS
        .iter()
        .zip(NANOS.iter().zip(&RUNS))
        .map(|(&s, (n, r))| {
            let ms = n.load(Ordering::Relaxed) as f64 / 1e6;
            (s, ms, r.load(Ordering::Relaxed))
        })
        .collect()
}

/// The wall time since `start` added to `span`'s while counting (for a span that is not one
/// call).
pub fn since(span: Span, start: Instant) {
    if ON.load(Ordering::Relaxed) {
        let i = span as usize;
        NANOS[i].fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        RUNS[i].fetch_add(1, Ordering::Relaxed);
    }
}

/// `f()`, its wall time added to `span`'s while counting.
pub fn time<T>(span: Span, f: impl FnOnce() -> T) -> T {
    if !ON.load(Ordering::Relaxed) {
        return f();
    }
    let start = Instant::now();
    let out = f();
    since(span, start);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counted per span between `start` and `stop` (other tests' steps may add to the counts
    /// meanwhile: the process's spans are one set).
    #[test]
    fn spans_count_while_on() {
        start();
        time(Span::Read, || {
            std::thread::sleep(std::time::Duration::from_millis(2))
        });
        let v = time(Span::Images, || 7);
        let counted = stop();
        assert_eq!(v, 7);
        let names: Vec<&str> = counted.iter().map(|c| c.0.name()).collect();
        assert_eq!(names.first(), Some(&"images"));
        assert_eq!(names.len(), 20);
        // `since` indexes the counters by the enum's discriminant: the list must follow it.
        for (i, s) in SPANS.iter().enumerate() {
            assert_eq!(*s as usize, i, "{}", s.name());
        }
        let read = counted.iter().find(|c| c.0 == Span::Read).unwrap();
        assert!(read.2 >= 1 && read.1 >= 2.0, "{read:?}");
        let images = counted.iter().find(|c| c.0 == Span::Images).unwrap();
        assert!(images.2 >= 1, "{images:?}");
    }
}
