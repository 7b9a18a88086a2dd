//! Benchmark timing of training steps: whole steps between device syncs, the phases of a step
//! (each mark names the phase it ends), the optimizer/accumulation split, the memory pool.

use crate::data::batch::Upload;
use burn::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Per-step wall times (device synchronised at both ends) and the memory pool's use after each
/// step.
#[derive(Clone, Debug, Default)]
pub struct StepTiming {
    pub step_ms: Vec<f64>,
    /// Also time each phase ([`PHASES`]) between device syncs. The syncs remove the overlap of
    /// host and device work, so phase sums exceed an unphased step: a breakdown, not a speed.
    pub phases: bool,
    /// Per step, ms of each of [`PHASES`] (when `phases`).
    pub phase_ms: Vec<[f64; PHASES.len()]>,
    /// Per step: whether it ended with an optimizer step, and the pool's bytes in use and
    /// reserved after it (the in-fit step drift, docs/perf_log.md, is read from these).
    pub optimizer_step: Vec<bool>,
    pub in_use: Vec<u64>,
    pub reserved: Vec<u64>,
    /// Also time each step with the device's own clock (`Device::profile`: CUDA events on the
    /// training stream; wall clock between syncs on the CPU) into `event_ms` (NaN for a step
    /// that records the feature graphs, which runs outside a profiling window).
    pub events: bool,
    pub event_ms: Vec<f64>,
    /// How batches reach the device (compared by `bench-step --upload`).
    pub upload: Upload,
    /// Time each step by the host's clock alone, with no device sync around it (not with
    /// `phases`, `events` or `in_step_memory`, which sync): a step's time is how long its call
    /// took, the device's queue overlapping the host's work as in a fit without timing, so over
    /// many steps their mean is the fit's pace. Steps may then be read late
    /// (`replay.defer_readback`).
    pub unsynced: bool,
    /// Also read the pool's bytes in use inside every step, at the ends of [`IN_STEP_SAMPLES`],
    /// into `in_step` (each read waits for the device thread to reach it: a small cost per step).
    pub in_step_memory: bool,
    /// Per step (with `in_step_memory`), the bytes in use read at the end of each of
    /// [`IN_STEP_SAMPLES`] (0 where a phase read nothing).
    pub in_step: Vec<[u64; IN_STEP_SAMPLES.len()]>,
    /// The same reads' padding: bytes inside the slices in use that no tensor asked for.
    pub in_step_padding: Vec<[u64; IN_STEP_SAMPLES.len()]>,
}

/// The phases at whose end [`StepTiming::in_step_memory`] reads the pool: the batch on the
/// device, the stage's outputs and saved tensors, then the head's, the assignment's and the
/// loss's (all alive: usually the peak), then the backward's gradients, then the optimizer's.
pub const IN_STEP_SAMPLES: [Phase; 8] = [
    Phase::Augment,
    Phase::Features,
    Phase::Head,
    Phase::Assign,
    Phase::Loss,
    Phase::HeadBackward,
    Phase::FeatureBackward,
    Phase::Optimizer,
];

impl StepTiming {
    /// The memory pool's largest bytes in use / reserved seen after a step (0 without a pool).
    pub fn peak_in_use(&self) -> u64 {
        self.in_use.iter().copied().max().unwrap_or(0)
    }

    pub fn peak_reserved(&self) -> u64 {
        self.reserved.iter().copied().max().unwrap_or(0)
    }

    /// The largest bytes in use read inside a step ([`StepTiming::in_step_memory`]), or `None`
    /// when not read.
    pub fn peak_in_step(&self) -> Option<u64> {
        self.in_step.iter().flatten().copied().max()
    }

    /// Per sample of [`IN_STEP_SAMPLES`], the largest bytes in use read over the steps: where in
    /// the step the peak falls.
    pub fn peak_in_step_by_sample(&self) -> Option<[u64; IN_STEP_SAMPLES.len()]> {
        largest_by_sample(&self.in_step)
    }

    /// Per sample of [`IN_STEP_SAMPLES`], the largest padding read over the steps.
    pub fn padding_in_step_by_sample(&self) -> Option<[u64; IN_STEP_SAMPLES.len()]> {
        largest_by_sample(&self.in_step_padding)
    }

    /// "N with an optimizer step: median X ms; M accumulating only: median Y ms" over the steps
    /// from `from` on. A step median alone hides the optimizer step when gradients accumulate
    /// (at nbs 64, batch 4 only one step in 16 runs it; docs/perf_log.md).
    pub fn optimizer_split(&self, from: usize) -> String {
        let pick = |want: bool| -> Vec<f64> {
            self.step_ms[from..]
                .iter()
                .zip(&self.optimizer_step[from..])
                .filter(|(_, s)| **s == want)
                .map(|(ms, _)| *ms)
                .collect()
        };
        let (with, without) = (pick(true), pick(false));
        format!(
            "{} with an optimizer step: median {:.1} ms; {} accumulating only: median {:.1} ms",
            with.len(),
            median(&with),
            without.len(),
            median(&without)
        )
    }

    /// One more step: its ms, and the pool's bytes in use and reserved after it where the
    /// device has a pool (`usage`, read after the step).
    pub(super) fn push_step(&mut self, ms: f64, usage: Option<(u64, u64)>) {
        self.step_ms.push(ms);
        if let Some((in_use, reserved)) = usage {
            self.in_use.push(in_use);
            self.reserved.push(reserved);
        }
    }

    /// The mean ms of the steps from `from` on (NaN when there are none): with
    /// [`StepTiming::unsynced`], the pace.
    pub fn mean_from(&self, from: usize) -> f64 {
        mean(self.step_ms.get(from..).unwrap_or_default())
    }

    /// The median ms of each of [`PHASES`] over the steps from `from` on.
    pub fn phase_medians(&self, from: usize) -> [f64; PHASES.len()] {
        std::array::from_fn(|i| {
            let v: Vec<f64> = self.phase_ms[from..].iter().map(|p| p[i]).collect();
            median(&v)
        })
    }

    /// "phase ms, …": [`StepTiming::phase_medians`] with the phases' names.
    pub fn phase_line(&self, from: usize) -> String {
        PHASES
            .iter()
            .zip(self.phase_medians(from))
            .map(|(name, ms)| format!("{name} {ms:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Forgets the last `n` steps (every per-step record), e.g. steps run for another purpose.
    pub fn drop_last(&mut self, n: usize) {
        let keep = |len: usize| len.saturating_sub(n);
        self.step_ms.truncate(keep(self.step_ms.len()));
        self.optimizer_step
            .truncate(keep(self.optimizer_step.len()));
        self.in_use.truncate(keep(self.in_use.len()));
        self.reserved.truncate(keep(self.reserved.len()));
        self.event_ms.truncate(keep(self.event_ms.len()));
        self.phase_ms.truncate(keep(self.phase_ms.len()));
        self.in_step.truncate(keep(self.in_step.len()));
        self.in_step_padding
            .truncate(keep(self.in_step_padding.len()));
    }
}

/// `bytes` in MiB, as every memory figure is reported.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1048576.0
}

/// The median (nearest rank: index `round((n − 1) / 2)`) of `v`, in any order; NaN when empty.
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * 0.5).round() as usize]
}

/// The arithmetic mean of `v`; NaN when empty.
pub fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// Per column, the largest value over `rows` (`None` without rows).
fn largest_by_sample<const N: usize>(rows: &[[u64; N]]) -> Option<[u64; N]> {
    (!rows.is_empty())
        .then(|| std::array::from_fn(|i| rows.iter().map(|s| s[i]).max().unwrap_or(0)))
}

/// The phases of [`Trainer::train_step`](super::Trainer::train_step) that [`StepTiming::phases`] times.
/// `upload`: the batch's bytes to device floats; `augment`: device HSV and scaling; `features`
/// and `feature backward`: the recorded-or-native stage (backbone + neck, or the whole detection
/// network, whose `head` is then only the leaves' reshape); `optimizer` is the gradient
/// accumulation and, on steps that end with one, unscaling, clipping and the update; `ema` the
/// EMA update of those steps.
pub const PHASES: [&str; 11] = [
    "upload",
    "augment",
    "features",
    "head",
    "assign",
    "loss",
    "head backward",
    "feature backward",
    "optimizer",
    "ema",
    "readback",
];

/// One phase of [`Trainer::train_step`](super::Trainer::train_step), in step order; its index
/// is its column in [`StepTiming::phase_ms`] and [`PHASES`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Upload,
    Augment,
    Features,
    Head,
    Assign,
    Loss,
    HeadBackward,
    FeatureBackward,
    Optimizer,
    Ema,
    Readback,
}

/// Row index of a census' driver calls and GPU work outside a step's phases (`train::census`).
pub const BETWEEN: usize = PHASES.len();

/// The phase the training thread is in ([`PHASES`] index, or [`BETWEEN`]): what the census
/// attributes a driver call to, whichever thread makes it.
static CURRENT: AtomicUsize = AtomicUsize::new(BETWEEN);

/// Called by the phase clock after the sync that ends the previous phase.
fn enter(phase: usize) {
    CURRENT.store(phase.min(BETWEEN), Ordering::Relaxed);
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(super) fn current_phase() -> usize {
    CURRENT.load(Ordering::Relaxed)
}

/// Marks phase ends, each mark naming the phase it ends: with a device sync and a time when
/// phases are timed, with a read of the memory pool at [`IN_STEP_SAMPLES`] when memory is; does
/// nothing otherwise.
pub(super) struct PhaseClock {
    pub(super) device: Option<Device>,
    last: std::time::Instant,
    pub(super) ms: [f64; PHASES.len()],
    memory: Option<Device>,
    /// The bytes in use read so far in this step, per [`IN_STEP_SAMPLES`] (`None`: no pool to
    /// read).
    pub(super) in_use: Option<[u64; IN_STEP_SAMPLES.len()]>,
    pub(super) padding: [u64; IN_STEP_SAMPLES.len()],
}

impl PhaseClock {
    pub(super) fn new(timing: Option<&StepTiming>, device: &Device) -> Self {
        let clock = timing.filter(|t| t.phases).map(|_| device.clone());
        if let Some(d) = &clock {
            let _ = d.sync();
            enter(0);
        }
        Self {
            device: clock,
            last: std::time::Instant::now(),
            ms: [0.0; PHASES.len()],
            memory: timing.filter(|t| t.in_step_memory).map(|_| device.clone()),
            in_use: None,
            padding: [0; IN_STEP_SAMPLES.len()],
        }
    }

    /// Ends `phase`: its time is the time since the previous mark (or the clock's start).
    pub(super) fn mark(&mut self, phase: Phase) {
        if let Some(d) = &self.device {
            let _ = d.sync();
            let now = std::time::Instant::now();
            self.ms[phase as usize] = (now - self.last).as_secs_f64() * 1e3;
            self.last = now;
            enter(phase as usize + 1);
        }
        if let Some(d) = &self.memory
            && let Some(i) = IN_STEP_SAMPLES.iter().position(|p| *p == phase)
            && let Some(u) = d.memory_pool_usage()
        {
            self.in_use.get_or_insert_default()[i] = u.bytes_in_use;
            self.padding[i] = u.bytes_padding;
        }
    }
}
