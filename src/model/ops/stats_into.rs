//! BatchNorm's new running statistics written over the old ones, in the buffers a recording
//! reads them from (CUDA). A recorded forward otherwise writes each layer's new mean and
//! variance into buffers of their own, then gathers them into one flat buffer and copies each
//! into the static buffer the next replay reads: ~450 launches a step for the nano pose model
//! (docs/perf_log.md AY3). With [`choose`] on, the recorder lays the static buffers out as
//! segments of that flat buffer, and while [`into`] runs, the fused BatchNorm kernels write a
//! registered layer's new statistics straight into the buffers they read the old ones from
//! (each channel's old value is read by the unit that writes its new one). The values are the
//! same as natively; only where they are written changes. On by default (measured in
//! docs/perf_log.md AZ1: the same hashes, ~500 launches fewer); `bench-step --stats-in-place
//! false` turns it off for comparisons.

use super::cuda::{Registered, storage, take_registered, with_registered};
use burn::prelude::*;
use burn_cubecl::tensor::CubeTensor;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};

static CHOSEN: AtomicBool = AtomicBool::new(true);

/// Lays every later recording's running statistics out in one buffer and updates them there in
/// place (`true`, the default), or gathers and copies them after each recorded forward
/// (`false`).
pub fn choose(in_place: bool) {
    CHOSEN.store(in_place, Ordering::Relaxed);
}

/// Whether the running statistics are updated in place ([`choose`]).
pub fn chosen() -> bool {
    CHOSEN.load(Ordering::Relaxed)
}

thread_local! {
    /// Each running-statistic buffer registered while [`into`] runs, by its own storage.
    static INTO: Registered = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with each of `buffers` (contiguous FP32 running statistics) updated in place by the
/// BatchNorm that reads it ([`take`]); other layers write new buffers as natively.
pub fn into<R>(buffers: &[Tensor<1>], f: impl FnOnce() -> R) -> R {
    let entries = buffers
        .iter()
        .filter_map(|b| Some((storage(b)?, super::cuda_f32(b)?)))
        .collect();
    with_registered(&INTO, entries, f)
}

/// Where a BatchNorm writes the new value of the running statistic `running` (`[C]`): `running`
/// its own buffer when [`into`] registered it (taken: one write per step), else `None` (a new
/// buffer).
pub(crate) fn take(running: &CubeTensor) -> Option<CubeTensor> {
    if running.meta.strides()[0] != 1 {
        return None;
    }
    take_registered(&INTO, running)
}
