//! Global gradient-norm clipping (`torch.nn.utils.clip_grad_norm_`): one norm over all
//! gradients, every gradient scaled by min(1, max_norm / (norm + 1e-6)). Burn's built-in
//! clipping works per tensor, which is a different rule.

use super::groups::ParamInfo;
use burn::optim::GradientsParams;
use burn::prelude::*;

/// Clips in place and returns the pre-clip total norm (`[1]`, on device; no host sync).
pub fn clip_global_norm(
    grads: &mut GradientsParams,
    table: &[ParamInfo],
    max_norm: f64,
) -> Option<Tensor<1>> {
    let mut squares: Vec<Tensor<1>> = Vec::new();
    for p in table {
        let sq = match p.dims.len() {
            1 => grads.get::<1>(p.id).map(|g| g.powi_scalar(2).sum()),
            2 => grads.get::<2>(p.id).map(|g| g.powi_scalar(2).sum()),
            3 => grads.get::<3>(p.id).map(|g| g.powi_scalar(2).sum()),
            4 => grads.get::<4>(p.id).map(|g| g.powi_scalar(2).sum()),
            r => panic!("parameter {} has unsupported rank {r}", p.path),
        };
        squares.extend(sq);
    }
    if squares.is_empty() {
        return None;
    }
    let norm = Tensor::cat(squares, 0).sum().sqrt();
    let coef = (norm.clone().add_scalar(1e-6).recip() * max_norm).clamp_max(1.0);
    for p in table {
        macro_rules! scale {
            ($d:literal) => {
                if let Some(g) = grads.remove::<$d>(p.id) {
                    let c = coef.clone().reshape([1; $d]);
                    grads.register::<$d>(p.id, g * c);
                }
            };
        }
        match p.dims.len() {
            1 => scale!(1),
            2 => scale!(2),
            3 => scale!(3),
            _ => scale!(4),
        }
    }
    Some(norm)
}
