//! Our operations on the CPU (burn-flex): BatchNorm training + SiLU as a few passes over each
//! channel's values instead of ~25 tensor operations, BatchNorm inference + SiLU as one pass
//! (both in `cpu_batch_norm.rs`), SiLU with one exponential per value, a convolution's forward
//! split by batch halves over two threads, its weight gradient as one matmul over the batch's
//! pixels ([`wgrad::host_weight_backward`]), depthwise convolutions as loops of ours
//! ([`cpu_depthwise`]) and the forward of convolutions with few input channels with burn-flex's
//! bits but contiguous strided taps ([`cpu_few_channels`]).
//!
//! The loops are compiled twice, for AVX2 + FMA (8 lanes, fused multiply-adds) and for the
//! baseline, and the machine's CPU picks one at run time (`host::dispatched!`). The arithmetic
//! is the same either way (every multiply-add is written as `mul_add`, every sum keeps partial
//! sums combined in a fixed order), so the values do not depend on the machine's SIMD.
//! The exponential is a polynomial rather than libm's `expf`, which was a fifth of a CPU
//! training step's time (docs/perf_log.md).

use super::cpu_batch_norm::{TWO_THREAD_VALUES, bn_act_backward, bn_act_forward};
use super::host::{dispatched, tensor, values};
use super::{
    ConvBnOps, FastOps, batch_norm, conv_bn_ops, cpu_depthwise, cpu_few_channels,
    silu_backward_ops, wgrad,
};
use burn::backend::ops::{ActivationOps, ConvOptions, FloatTensorOps};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Flex, TensorMetadata};

/// Multiply-adds (about) from which a convolution's forward is split over two threads: below,
/// starting a thread costs more than it saves.
pub(super) const TWO_THREAD_WORK: usize = 1 << 21;

/// `eˣ` within 2 ulp for `x` in [−87.3, 88] (clamped outside: finite, never 0), NaN for NaN:
/// Cephes' `expf` (range reduction by `ln 2` split in two parts, degree-5 polynomial), rounding
/// by the 1.5 · 2²³ trick so that no libm call is left in the loop and it vectorises.
#[inline(always)]
fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.336_55, 88.0);
    let t = x.mul_add(LOG2E, ROUND);
    let n = t - ROUND;
    let r = n.mul_add(-LN2_HI, x);
    let r = n.mul_add(-LN2_LO, r);
    let p = 1.987_569_1e-4f32
        .mul_add(r, 1.398_199_9e-3)
        .mul_add(r, 8.333_452e-3)
        .mul_add(r, 4.166_579_6e-2)
        .mul_add(r, 1.666_666_5e-1)
        .mul_add(r, 0.5);
    let e = (p * r).mul_add(r, r) + 1.0;
    // 2ⁿ from the rounded value's low mantissa bits: n ∈ [−126, 127] after the clamp.
    let scale = f32::from_bits(((t.to_bits() as i32 - ROUND.to_bits() as i32 + 127) as u32) << 23);
    e * scale
}

#[inline(always)]
fn sigmoid(z: f32) -> f32 {
    1.0 / (1.0 + exp(-z))
}

/// `z · σ(z)`.
#[inline(always)]
pub(super) fn silu_value(z: f32) -> f32 {
    z * sigmoid(z)
}

/// The gradient through SiLU at `z` for the incoming `g`: `g · σ(z) · (1 + z · (1 − σ(z)))`.
#[inline(always)]
pub(super) fn silu_grad(g: f32, z: f32) -> f32 {
    let s = sigmoid(z);
    g * (s * z.mul_add(1.0 - s, 1.0))
}

dispatched! {
    /// `out = x · σ(x)`.
    fn silu_loop(x: &[f32], out: &mut [f32]) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = silu_value(v);
        }
    }
}

dispatched! {
    /// `out = g · σ(x) · (1 + x · (1 − σ(x)))`.
    fn silu_grad_loop(x: &[f32], grad: &[f32], out: &mut [f32]) {
        for ((o, &v), &g) in out.iter_mut().zip(x).zip(grad) {
            *o = silu_grad(g, v);
        }
    }
}

/// Whether a training BatchNorm of `x` runs its channels on two threads.
fn two_threads(x: &FloatTensor<Flex>) -> bool {
    x.shape().num_elements() >= TWO_THREAD_VALUES
}

/// The CPU: the loops of `cpu_batch_norm.rs` for BatchNorm + SiLU (tensor operations under
/// [`ConvBnOps::Staged`]), Burn's convolution on two threads, and the weight gradient as an
/// im2col matmul ([`wgrad`]). Burn's default weight gradient is a convolution whose kernel is the
/// output gradient (`[C_out, N, Ho, Wo]`, N input channels), which burn-flex's small-channel path
/// computes plane by plane: a quarter of a `pose_nano` step's CPU time (docs/perf_log.md).
impl FastOps for Flex {
    fn bn_act_train(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        running_mean: FloatTensor<Self>,
        running_var: FloatTensor<Self>,
        epsilon: f64,
        momentum: f64,
        act: bool,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    ) {
        let fused = conv_bn_ops() != ConvBnOps::Staged && x.dtype() == burn::tensor::DType::F32;
        let two = two_threads(&x);
        let [out, mean, var, new_mean, new_var] = if fused {
            bn_act_forward(
                x,
                gamma,
                beta,
                running_mean,
                running_var,
                epsilon as f32,
                momentum as f32,
                act,
                two,
            )
        } else {
            batch_norm::act_train::<Self>(
                x,
                gamma,
                beta,
                running_mean,
                running_var,
                epsilon,
                momentum,
                act,
            )
        };
        (out, mean, var, new_mean, new_var)
    }
    fn bn_act_train_backward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        variance: FloatTensor<Self>,
        epsilon: f64,
        act: bool,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let fused = conv_bn_ops() != ConvBnOps::Staged
            && x.dtype() == burn::tensor::DType::F32
            && grad.dtype() == burn::tensor::DType::F32;
        if !fused {
            return batch_norm::act_backward::<Self>(
                x, gamma, beta, mean, variance, epsilon, act, grad,
            );
        }
        let two = two_threads(&x);
        let [dx, d_gamma, d_beta] = bn_act_backward(
            x,
            gamma,
            beta,
            mean,
            variance,
            epsilon as f32,
            act,
            grad,
            two,
        );
        (dx, d_gamma, d_beta)
    }
    fn silu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        if x.dtype() != burn::tensor::DType::F32 {
            return Self::float_mul(x.clone(), Self::sigmoid(x));
        }
        let shape = x.shape();
        let xv = values(&x);
        let mut out = vec![0.0f32; xv.len()];
        silu_loop(&xv, &mut out);
        tensor(out, shape)
    }
    fn silu_backward(x: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        let f32s = x.dtype() == burn::tensor::DType::F32 && grad.dtype() == x.dtype();
        if !f32s || x.shape() != grad.shape() {
            return silu_backward_ops::<Self>(x, grad);
        }
        let shape = x.shape();
        let (xv, gv) = (values(&x), values(&grad));
        let mut out = vec![0.0f32; xv.len()];
        silu_grad_loop(&xv, &gv, &mut out);
        tensor(out, shape)
    }
    fn conv(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        use burn::backend::ops::ModuleOps;
        if let Some(y) = cpu_depthwise::forward(&x, &weight, &options) {
            return y;
        }
        let (xs, ws) = (x.shape(), weight.shape());
        let n = xs[0];
        let positions = (xs[2] / options.stride[0]) * (xs[3] / options.stride[1]);
        let work = n * positions * ws[0] * ws[1] * ws[2] * ws[3];
        let one = |x: FloatTensor<Self>, weight: FloatTensor<Self>, options: ConvOptions<2>| {
            cpu_few_channels::forward(&x, &weight, &options)
                .unwrap_or_else(|| Self::conv2d(x, weight, None, options))
        };
        if n < 2 || work < TWO_THREAD_WORK {
            return one(x, weight, options);
        }
        // Images are independent: each half of the batch on its own core.
        let half = n / 2;
        let first = Self::float_slice(x.clone(), &[burn::tensor::Slice::from(0..half)]);
        let second = Self::float_slice(x, &[burn::tensor::Slice::from(half..n)]);
        let (a, b) = std::thread::scope(|s| {
            let (w, o) = (weight.clone(), options.clone());
            let b = s.spawn(move || one(second, w, o));
            let a = one(first, weight, options);
            (a, b.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
        });
        Self::float_cat(vec![a, b], 0)
    }
    fn conv_x_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        cpu_depthwise::data_grad(&x.shape(), &weight, &grad, &options).unwrap_or_else(|| {
            <Self as burn::backend::ops::ModuleOps<Self>>::conv2d_x_backward(
                x, weight, grad, options,
            )
        })
    }
    fn conv_weight_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        cpu_depthwise::weight_grad(&x, &weight, &grad, &options)
            .or_else(|| wgrad::host_weight_backward(&x, &weight, &grad, &options))
            .or_else(|| {
                wgrad::weight_backward::<Self>(
                    x.clone(),
                    weight.clone(),
                    grad.clone(),
                    &options,
                    wgrad::columns::<Self>,
                    Self::float_matmul,
                )
            })
            .unwrap_or_else(|| {
                <Self as burn::backend::ops::ModuleOps<Self>>::conv2d_weight_backward(
                    x, weight, grad, options,
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against f64's `exp` over the whole f32 range, and NaN/±∞ handled.
    #[test]
    fn exp_is_within_two_ulp_of_f64s() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = (x as f64).exp();
            let got = exp(x) as f64;
            let ulp = (want as f32).next_up() as f64 - want as f32 as f64;
            worst = worst.max((got - want).abs() / ulp);
            x += 0.001_37;
        }
        assert!(worst <= 2.0, "worst error {worst} ulp");
        assert!(exp(f32::NAN).is_nan());
        assert!(exp(-1000.0) > 0.0 && exp(-1000.0) < 1.2e-38);
        assert!(exp(1000.0).is_finite() && exp(1000.0) > 1.6e38);
        assert_eq!(sigmoid(1000.0), 1.0);
        assert!(sigmoid(-1000.0) < 1e-37);
    }
}
