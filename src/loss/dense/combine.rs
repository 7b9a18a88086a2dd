//! The device loss's copies combined into its total, its logged items and its counts as a few
//! operations over every copy at once. Written term by term (a division, a gain, a sum per
//! term and copy) this was ~60 launches of one value each forward and more in the backward, a
//! visible share of a recorded step's kernels (docs/perf_log.md BP2's census); here the terms
//! of all copies are one `[C, 6]` tensor, normalised by one division and weighed by one
//! product. Its constants are uploaded once ([`Combine::new`]): a recorded loss may not upload.

use super::DenseTerms;
use crate::optim::reduce::sum_all;
use burn::prelude::*;

/// Columns of [`DenseTerms::sums`], and past them the RLE term's sum (see [`Combine::terms`]).
pub mod column {
    pub const BOX: usize = 0;
    pub const L1: usize = 1;
    pub const POSE: usize = 2;
    pub const KOBJ: usize = 3;
    pub const CLS: usize = 4;
    /// The target scores: the box, L1 and class terms' denominator. It and the next two are
    /// counts, read without a gradient.
    pub const SCORES: usize = 5;
    pub const POSITIVES: usize = 6;
    pub const LABELLED: usize = 7;
    pub const RLE: usize = 8;
}

/// Columns of [`DenseTerms::sums`].
pub const SUMS: usize = 8;

/// What combines the copies' sums, on one device.
#[derive(Clone, Debug)]
pub struct Combine {
    /// The gains the `gains` row was made from.
    pub gains_of: [f32; 6],
    /// `[6]`: each term's numerator among a copy's nine columns, in the gains' order (box,
    /// pose, kobj, cls, l1, rle).
    numerators: Tensor<1, Int>,
    /// `[6]`: each term's denominator among the three counts: target scores, positives · K,
    /// labelled keypoints.
    denominators: Tensor<1, Int>,
    /// `[1, 3]`: what multiplies the counts into the denominators (1, K, 1).
    per: Tensor<2>,
    /// `[1, 6]`: the gains.
    gains: Tensor<2>,
    /// `[2, 1]` each: the copies' weights are `w · slope + offset`, that is `w` and `1 − w`.
    slope: Tensor<2>,
    offset: Tensor<2>,
}

impl Combine {
    /// For `k` keypoints (zero without) and the terms' `gains`, on `device`.
    pub fn new(k: usize, gains: [f32; 6], device: &Device) -> Self {
        use column::*;
        let ints = |v: &[i64]| Tensor::<1, Int>::from_ints(v, device);
        let row = |v: &[f32]| Tensor::<1>::from_floats(v, device).reshape([1, v.len()]);
        let col = |v: &[f32]| Tensor::<1>::from_floats(v, device).reshape([v.len(), 1]);
        let (scores, cells, labelled) = (0, 1, 2);
        Self {
            gains_of: gains,
            numerators: ints(&[BOX, POSE, KOBJ, CLS, L1, RLE].map(|c| c as i64)),
            denominators: ints(&[scores, cells, cells, scores, scores, labelled]),
            per: row(&[1.0, k as f32, 1.0]),
            gains: row(&gains),
            slope: col(&[1.0, -1.0]),
            offset: col(&[0.0, 1.0]),
        }
    }

    /// `[C, 6]`: the terms of `C` copies, unweighted, in the gains' order: box, L1 and class
    /// over the target scores, OKS and visibility over the positives' keypoints, RLE over the
    /// labelled ones (each denominator at least one). And `[2C]`: each copy's positives and
    /// labelled keypoints, the counts that say which outputs the loss reached.
    pub fn terms(&self, copies: &[DenseTerms]) -> (Tensor<2>, Tensor<1>) {
        use column::*;
        let c = copies.len();
        let x = Tensor::cat(
            copies
                .iter()
                .flat_map(|t| [t.sums.clone(), t.rle.clone()])
                .collect(),
            0,
        )
        .reshape([c, SUMS + 1]);
        let counts = x.clone().narrow(1, SCORES, 3).detach();
        let den = (counts.clone() * self.per.clone())
            .clamp_min(1.0)
            .select(1, self.denominators.clone());
        let terms = x.select(1, self.numerators.clone()) / den;
        (terms, counts.narrow(1, 1, 2).reshape([2 * c]))
    }

    /// `terms` (`[C, 6]`) times the gains.
    pub fn weighed(&self, terms: Tensor<2>) -> Tensor<2> {
        terms * self.gains.clone()
    }

    /// The loss of two copies' `weighed` terms (`[2, 6]`) for the one-to-many weight `w`
    /// (`[1]`, a device value: one passed to a kernel would be frozen into a recording) and a
    /// batch of `batch` images: `(Σ one-to-many · w + Σ one-to-one · (1 − w)) · batch`.
    pub fn total(&self, weighed: Tensor<2>, w: Tensor<1>, batch: usize) -> Tensor<1> {
        let copies = w.reshape([1, 1]) * self.slope.clone() + self.offset.clone();
        sum_all(weighed * copies) * batch as f32
    }
}
