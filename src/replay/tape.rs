//! Where the tape is cut, for both arms of the stage: the rest of the step runs on fresh leaves
//! sharing the stage's outputs, and the stage's backward is seeded with those leaves' gradients.

use crate::optim::reduce::sum_all;
use burn::prelude::*;

/// A fresh leaf sharing `t`'s buffer, so a backward from above stops at it.
pub(super) fn leaf(t: &Tensor<4>) -> Tensor<4> {
    Tensor::from_inner(t.clone().inner()).require_grad()
}

/// `Σ_i sum(f_i ⊙ s_i)`: its backward sends exactly `s_i` into `f_i` (the product's gradient is
/// `1 · s_i`), then on through the backbone and neck.
pub fn seeded_root(outputs: &[Tensor<4>], seeds: &[Tensor<4>]) -> Tensor<1> {
    assert_eq!(outputs.len(), seeds.len(), "one seed per output");
    let terms: Vec<Tensor<1>> = outputs
        .iter()
        .zip(seeds)
        .map(|(f, s)| sum_all(f.clone() * Tensor::from_inner(s.clone())))
        .collect();
    sum_all(Tensor::cat(terms, 0))
}
