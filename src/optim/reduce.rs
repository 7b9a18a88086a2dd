//! A full sum that is the same number every run. Burn's `Tensor::sum` on CUDA is a one-shot kernel
//! with atomic adds (cubek-reduce `shared_sum`), so its last bits depend on thread timing; that
//! made loss values and — through the clipping norm — model states differ between identical GPU
//! runs at 640 px (docs/PERF.md section J). `sum_dim` uses the deterministic reduce routines.

use burn::prelude::*;

/// The sum of every element, `[1]`, reduced in a fixed order.
pub fn sum_all<const D: usize>(t: Tensor<D>) -> Tensor<1> {
    let n = t.shape().num_elements();
    t.reshape([n]).sum_dim(0)
}
