//! A full sum that is the same number every run. Burn's `Tensor::sum` on CUDA is a one-shot kernel
//! with atomic adds (cubek-reduce `shared_sum`), so its last bits depend on thread timing; that
//! made loss values and — through the clipping norm — model states differ between identical GPU
//! runs at 640 px (docs/perf_log.md, 2026-11-29). `sum_dim` uses the deterministic reduce routines.
//!
//! A sum to one value is one row, and one row is one cube's work on CUDA
//! ([`row_sums`]; Burn's own `sum_dim` without autotune even gives a row to one unit: a
//! 1.6M-value sum took 11 ms on the H200, docs/perf_log.md, launch census of 2026-12-01). Large
//! sums therefore go in stages of many short rows, each stage spread over the GPU; the split
//! depends on the size only, so the order of the additions, and the result, are the same every
//! run.

use crate::model::ops::row_sums;
use burn::prelude::*;

/// Values one stage sums per row at most; sums of at most this many are one row.
const ROW: usize = 1024;

/// The sum of every element, `[1]`, reduced in a fixed order.
pub fn sum_all<const D: usize>(t: Tensor<D>) -> Tensor<1> {
    let n = t.shape().num_elements();
    let t = t.reshape([n]);
    match row_length(n) {
        Some(row) => sum_all(row_sums(t.reshape([n / row, row]))),
        // An empty sum: Burn's zero (a `[1, 0]` view is not a valid reshape).
        None if n == 0 => t.sum_dim(0),
        None => row_sums(t.reshape([1, n])).reshape([1]),
    }
}

/// [`sum_all`] of each row of `t` (`[k, n]` → `[k]`): every row summed in the stages, and so
/// the order, that [`sum_all`] would sum it in alone.
pub fn sum_each_row(t: Tensor<2>) -> Tensor<1> {
    let [k, n] = t.dims();
    match row_length(n) {
        Some(row) => sum_each_row(row_sums(t.reshape([k * (n / row), row])).reshape([k, n / row])),
        None if n == 0 => Tensor::zeros([k], &t.device()),
        None => row_sums(t).reshape([k]),
    }
}

/// The row length of the next stage of a sum of `n` values: the largest divisor of `n` in
/// `64..=ROW` when `n > ROW`, so each stage shrinks the sum at least 64-fold; `None` when one row
/// will do (`n ≤ ROW`, or no such divisor: a prime-ish `n` stays one row).
fn row_length(n: usize) -> Option<usize> {
    if n <= ROW {
        return None;
    }
    (64..=ROW).rev().find(|&r| n.is_multiple_of(r))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_split_large_sums_into_short_rows() {
        assert_eq!(row_length(1000), None);
        assert_eq!(row_length(1_638_400), Some(1024));
        assert_eq!(row_length(33_600), Some(960));
        // 1,000,003 is prime: one row.
        assert_eq!(row_length(1_000_003), None);
    }

    #[test]
    fn a_staged_sum_passes_its_gradient_to_every_value() {
        let d = Device::flex().autodiff();
        // 3,214 = 2 · 1,607: no row length in 64..=1024, one row; 65,536: two stages.
        for n in [3_214usize, 65_536] {
            let x = Tensor::<1>::ones([n], &d).require_grad();
            let grads = (sum_all(x.clone()) * 2.5).backward();
            let g: Vec<f32> = x.grad(&grads).unwrap().into_data().try_to_vec().unwrap();
            assert_eq!(g.len(), n);
            assert!(g.iter().all(|&v| v == 2.5), "n = {n}");
        }
    }

    /// Each row's sum is the bits of that row summed alone (the batched Newton–Schulz norms
    /// rely on it), at sizes of one row and of two and three stages.
    #[test]
    fn each_row_sums_as_alone() {
        let d = Device::flex();
        for n in [5usize, 1024, 1025, 33_600, 262_144] {
            let v: Vec<f32> = (0..3 * n)
                .map(|i| ((i as f32) * 0.37).sin() * 1e3)
                .collect();
            let rows = Tensor::<1>::from_floats(v.as_slice(), &d).reshape([3, n]);
            let each: Vec<f32> = sum_each_row(rows).into_data().try_to_vec().unwrap();
            for (r, s) in each.iter().enumerate() {
                let alone = Tensor::<1>::from_floats(&v[r * n..(r + 1) * n], &d);
                assert_eq!(*s, sum_all(alone).into_scalar::<f32>(), "n = {n}, row {r}");
            }
        }
    }

    #[test]
    fn staged_sums_equal_the_exact_sum() {
        let d = Device::flex();
        for n in [0usize, 1, 7, 1024, 1025, 33_600, 262_144, 100_003] {
            // Integers: every partial sum is exact in f32, so any order must give the same.
            let v: Vec<f32> = (0..n).map(|i| ((i * 7919) % 13) as f32 - 6.0).collect();
            let exact: f64 = v.iter().map(|&x| x as f64).sum();
            let t = Tensor::<1>::from_floats(v.as_slice(), &d);
            let s = sum_all(t).into_scalar::<f32>() as f64;
            assert_eq!(s, exact, "n = {n}");
        }
        let t = Tensor::<1>::from_floats([1.5f32; 4096].as_slice(), &d).reshape([4, 16, 64]);
        assert_eq!(sum_all(t).dims(), [1]);
    }
}
