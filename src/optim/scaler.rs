//! Dynamic loss scaling for FP16 training (`torch.amp.GradScaler` with its defaults): the loss is
//! multiplied by `scale` before backward so small FP16 gradients do not flush to zero; before the
//! optimizer step the gradients are unscaled and, if any is inf/NaN, the step is skipped and the
//! scale halved; after `growth_interval` clean steps in a row it doubles.

use super::grads::{put_flat, take_flat};
use super::groups::ParamInfo;
use super::hash::StateHasher;
use super::layout::Layout;
use crate::optim::reduce::sum_all;
use burn::optim::GradientsParams;
use burn::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LossScaler {
    /// Kept as f32, as PyTorch keeps it, so the unscale factor is the same number.
    pub scale: f32,
    pub growth_factor: f32,
    pub backoff_factor: f32,
    pub growth_interval: u64,
    /// Clean steps since the last change of scale.
    pub growth_tracker: u64,
    /// Optimizer steps skipped for inf/NaN gradients (reported, not part of PyTorch's state).
    pub skipped: u64,
}

impl Default for LossScaler {
    fn default() -> Self {
        Self {
            scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            growth_tracker: 0,
            skipped: 0,
        }
    }
}

impl LossScaler {
    /// The loss to call `backward` on.
    pub fn scale_loss(&self, loss: Tensor<1>) -> Tensor<1> {
        loss * self.scale
    }

    /// Divides every gradient by the scale in place; `true` when all of them are finite
    /// ([`unscale`]).
    pub fn unscale(&self, grads: &mut GradientsParams, table: &[ParamInfo]) -> bool {
        unscale(grads, table, self.scale)
    }

    /// Records the outcome of a step: back off after inf/NaN, grow after a clean streak.
    pub fn update(&mut self, finite: bool) {
        if finite {
            self.growth_tracker += 1;
            if self.growth_tracker == self.growth_interval {
                self.scale *= self.growth_factor;
                self.growth_tracker = 0;
            }
        } else {
            self.scale *= self.backoff_factor;
            self.growth_tracker = 0;
            self.skipped += 1;
        }
    }

    pub fn state_hash(&self) -> String {
        let mut h = StateHasher::new();
        h.f64("scale", self.scale as f64);
        h.u64("growth_tracker", self.growth_tracker);
        h.u64("skipped", self.skipped);
        h.finish()
    }
}

/// Divides every gradient by `scale` in place. Returns `true` when all of them are finite (the
/// step may proceed), each value checked as PyTorch's `_amp_foreach_non_finite_check_and_unscale_`
/// checks it. The gradients are unscaled as one flat buffer (handed back as views of it), so the
/// check is a few kernels for the whole model and one host read, where a pass per tensor was ~4
/// launches per parameter. The flat optimizer unscales inside its step instead
/// (`flat::step`), where the device decides.
pub fn unscale(grads: &mut GradientsParams, table: &[ParamInfo], scale: f32) -> bool {
    let inv = inverse(scale);
    let parts: Vec<Option<Tensor<1>>> = table.iter().map(|p| take_flat(grads, p)).collect();
    let Some(device) = parts.iter().flatten().next().map(|t| t.device()) else {
        return true;
    };
    let layout = Layout::new(table.iter().map(ParamInfo::numel).collect());
    let present: Vec<bool> = parts.iter().map(Option::is_some).collect();
    let flat = layout.gather(parts, &device) * inv;
    // 0·x is 0 for every finite x and NaN for ±inf and NaN: the sum is finite exactly when
    // every value is (padding and absent gradients are zeros).
    let total: f32 = sum_all(flat.clone().mul_scalar(0.0)).into_scalar::<f32>();
    for (i, p) in table.iter().enumerate() {
        if present[i] {
            put_flat(grads, p, layout.view(&flat, i));
        }
    }
    total.is_finite()
}

/// The factor gradients are unscaled by: the scale's inverse, computed in f64 and rounded to f32
/// (every unscale multiplies by this one number, so the flat step and [`unscale`] agree).
pub fn inverse(scale: f32) -> f32 {
    (1.0f64 / scale as f64) as f32
}
