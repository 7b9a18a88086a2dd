//! Weight gradients written where the recorder gathers them (CUDA). Every weight gradient's
//! last sum is our kernel (`kernels/leading_sum.rs`), in native and replay alike, so both give
//! the same bits; while [`into`] runs (the one-graph step window), the sum of a registered
//! parameter's gradient is written straight into its segment of the flat gradient buffer, and
//! the gather then finds it in place (`optim::layout::Layout::gather_into`). BatchNorm's γ and
//! β gradients (the fused kernels' `grad_final`, same bits wherever they are written) go into
//! theirs too. On by default: on the H100 it took the seed step's graph from 5,902 to 5,579
//! kernels and 28.31 to 27.68 ms of GPU time, with the same hashes (docs/perf_log.md AY1);
//! `bench-step --grads-in-place false` turns it off ([`choose`]).

use super::cuda::{Registered, storage, take_registered, with_registered};
use super::leading_sum::leading_sum;
use burn::prelude::*;
use burn_cubecl::tensor::CubeTensor;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};

static CHOSEN: AtomicBool = AtomicBool::new(true);

/// Sums every later weight gradient of this process with our kernel (`true`, the default) or
/// Burn's `sum_dim` with a copy into the flat buffer after (`false`); the two may add in
/// different orders, hence differ in the last bits.
pub fn choose(ours: bool) {
    CHOSEN.store(ours, Ordering::Relaxed);
}

/// Whether the weight gradients are summed by our kernel ([`choose`]).
pub fn chosen() -> bool {
    CHOSEN.load(Ordering::Relaxed)
}

thread_local! {
    /// `(storage of a parameter, where its gradient goes)` while [`into`] runs.
    static INTO: Registered = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with the gradient of each parameter `pairs[i].0` (a contiguous FP32 view of the
/// parameter's buffer) written into `pairs[i].1` (a contiguous FP32 buffer of its size) by
/// [`sum`]; parameters whose gradient takes another path are left to the gather. Nothing is
/// registered unless [`chosen`].
pub fn into<R>(pairs: &[(Tensor<1>, Tensor<1>)], f: impl FnOnce() -> R) -> R {
    if !chosen() {
        return f();
    }
    let entries = pairs
        .iter()
        .filter_map(|(param, dst)| Some((storage(param)?, super::cuda_f32(dst)?)))
        .collect();
    with_registered(&INTO, entries, f)
}

/// The sum over the first axis of `prod`, the chunks' products of `weight`'s gradient: by
/// Burn's `sum_dim` unless [`chosen`]; else by our kernel, into the registered buffer of
/// `weight` the first time [`into`] sees it.
pub fn sum(prod: CubeTensor, weight: &CubeTensor) -> CubeTensor {
    if !chosen() {
        return <burn_cubecl::CubeBackend as burn::backend::ops::FloatTensorOps<_>>::float_sum_dim(
            prod, 0,
        );
    }
    leading_sum(prod, take(weight))
}

/// The buffer registered for `param`'s gradient while [`into`] runs (one of `param`'s size),
/// taken: a parameter used twice gets its second gradient in a buffer of its own, which
/// autodiff adds to the first (in the registered buffer) as natively, and the gather copies.
pub(crate) fn take(param: &CubeTensor) -> Option<CubeTensor> {
    take_registered(&INTO, param)
}
