//! Global gradient-norm clipping (`torch.nn.utils.clip_grad_norm_`): one norm over all
//! gradients, every gradient scaled by min(1, max_norm / (norm + 1e-6)). Burn's built-in
//! clipping works per tensor, which is a different rule.

use super::grads::{get_flat, put_flat, take_flat};
use super::groups::ParamInfo;
use crate::optim::reduce::sum_all;
use burn::optim::GradientsParams;
use burn::prelude::*;

/// Clips in place and returns the pre-clip total norm (`[1]`, on device; no host sync).
pub fn clip_global_norm(
    grads: &mut GradientsParams,
    table: &[ParamInfo],
    max_norm: f64,
) -> Option<Tensor<1>> {
    let squares: Vec<Tensor<1>> = table
        .iter()
        .filter_map(|p| get_flat(grads, p).map(|g| sum_all(g.powi_scalar(2))))
        .collect();
    if squares.is_empty() {
        return None;
    }
    let norm = sum_all(Tensor::cat(squares, 0)).sqrt();
    let coef = (norm.clone().add_scalar(1e-6).recip() * max_norm).clamp_max(1.0);
    for p in table {
        if let Some(g) = take_flat(grads, p) {
            put_flat(grads, p, g * coef.clone());
        }
    }
    Some(norm)
}
