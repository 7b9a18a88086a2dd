//! Our operations on the CPU (burn-flex): BatchNorm training + SiLU as a few passes over each
//! channel's values instead of ~25 tensor operations, BatchNorm inference + SiLU as one pass,
//! SiLU with one exponential per value, a
//! convolution's forward split by batch halves over two threads, and its weight gradient as one
//! matmul over the batch's pixels ([`wgrad::host_weight_backward`]).
//!
//! The loops are compiled twice, for AVX2 + FMA (8 lanes, fused multiply-adds) and for the
//! baseline, and the machine's CPU picks one at run time. The arithmetic
//! is the same either way (every multiply-add is written as `mul_add`, every sum keeps [`LANES`]
//! partial sums combined in a fixed order), so the values do not depend on the machine's SIMD.
//! The exponential is a polynomial rather than libm's `expf`, which was a fifth of a CPU
//! training step's time (docs/perf_log.md).

use super::host::{dispatched, tensor, values};
use super::{ConvBnOps, FastOps, batch_norm, conv_bn_ops, cpu_depthwise, silu_backward_ops, wgrad};
use burn::backend::ops::{ActivationOps, ConvOptions, FloatTensorOps};
use burn::backend::tensor::FloatTensor;
use burn::backend::{
    BackendTensor, DispatchTensor, DispatchTensorKind, Flex, Shape, TensorMetadata,
};
use burn::prelude::*;
use burn::tensor::DType;

/// Multiply-adds (about) from which a convolution's forward is split over two threads: below,
/// starting a thread costs more than it saves.
const TWO_THREAD_WORK: usize = 1 << 21;

/// Partial sums per reduction: wide enough for 16-lane vectors, summed pairwise at the end.
/// BatchNorm's sums are accumulated in `f64`, as PyTorch's CPU BatchNorm does: in `f32`, a
/// training forward of YOLO26n (160 px, batch 2) ended 2.7e-4 (relative) from the exact values
/// against PyTorch's 7.9e-5, and with `f64` 7e-5 (docs/weights.md, "Parity").
const LANES: usize = 16;

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
fn silu_value(z: f32) -> f32 {
    z * sigmoid(z)
}

/// The gradient through SiLU at `z` for the incoming `g`: `g · σ(z) · (1 + z · (1 − σ(z)))`.
#[inline(always)]
fn silu_grad(g: f32, z: f32) -> f32 {
    let s = sigmoid(z);
    g * (s * z.mul_add(1.0 - s, 1.0))
}

/// The lanes summed pairwise in a fixed tree.
#[inline(always)]
fn total(mut acc: [f64; LANES]) -> f64 {
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            acc[i] += acc[i + width];
        }
    }
    acc[0]
}

/// `Σ f(v)` over a run, value `i` into lane `i mod LANES`.
#[inline(always)]
fn lane_sum(acc: &mut [f64; LANES], v: &[f32], f: impl Fn(f32) -> f64) {
    let (blocks, rest) = v.as_chunks::<LANES>();
    for block in blocks {
        for l in 0..LANES {
            acc[l] += f(block[l]);
        }
    }
    for (l, &x) in rest.iter().enumerate() {
        acc[l] += f(x);
    }
}

/// `[N, C, H, W]` as `(N, C, H·W)`.
fn planes(x: &FloatTensor<Flex>) -> (usize, usize, usize) {
    let s = x.shape();
    assert_eq!(s.num_dims(), 4, "BatchNorm expects [N, C, H, W], got {s:?}");
    (s[0], s[1], s[2] * s[3])
}

/// Channel `channel`'s value runs in `[N, C, H·W]`: one of `hw` values per image.
#[inline(always)]
fn runs(
    (n, c, hw): (usize, usize, usize),
    channel: usize,
) -> impl Iterator<Item = std::ops::Range<usize>> {
    (0..n).map(move |i| (i * c + channel) * hw..(i * c + channel + 1) * hw)
}

/// `1 / √(var + ε)`, as the CUDA kernels compute it.
#[inline(always)]
fn inv_std(var: f32, epsilon: f32) -> f32 {
    1.0 / (var + epsilon).sqrt()
}

/// Channel `ch` of `x` normalised, `out = (x − mean) · inv_std · γ + β` with
/// `[mean, inv_std, γ, β]`, SiLU'd when `act`: the last pass of the training and the inference
/// loops.
#[inline(always)]
fn normalise(
    x: &[f32],
    dims: (usize, usize, usize),
    ch: usize,
    [mean, is, g, b]: [f32; 4],
    act: bool,
    out: &mut [f32],
) {
    for r in runs(dims, ch) {
        for (o, &v) in out[r.clone()].iter_mut().zip(&x[r]) {
            let z = ((v - mean) * is).mul_add(g, b);
            *o = if act { silu_value(z) } else { z };
        }
    }
}

dispatched! {
    /// Per channel: the batch mean and biased variance (two passes), then
    /// `out = (x − mean) · inv_std · γ + β`, SiLU'd when `act`.
    fn bn_forward_loops(
        x: &[f32],
        dims: (usize, usize, usize),
        gamma: &[f32],
        beta: &[f32],
        epsilon: f32,
        act: bool,
        out: &mut [f32],
        means: &mut [f32],
        vars: &mut [f32],
    ) {
        let (n, c, hw) = dims;
        let count = (n * hw) as f64;
        for ch in 0..c {
            let mut acc = [0.0; LANES];
            for r in runs(dims, ch) {
                lane_sum(&mut acc, &x[r], f64::from);
            }
            let mean64 = total(acc) / count;
            let mut acc = [0.0; LANES];
            for r in runs(dims, ch) {
                lane_sum(&mut acc, &x[r], |v| (f64::from(v) - mean64).powi(2));
            }
            let (mean, var) = (mean64 as f32, (total(acc) / count) as f32);
            let (is, g, b) = (inv_std(var, epsilon), gamma[ch], beta[ch]);
            normalise(x, dims, ch, [mean, is, g, b], act, out);
            means[ch] = mean;
            vars[ch] = var;
        }
    }
}

dispatched! {
    /// Per channel with the running statistics: `out = (x − mean) · inv_std · γ + β`, SiLU'd when
    /// `act` (the CUDA inference kernel's formula), one pass.
    fn bn_inference_loops(
        x: &[f32],
        dims: (usize, usize, usize),
        stats: [&[f32]; 4],
        epsilon: f32,
        act: bool,
        out: &mut [f32],
    ) {
        let [gamma, beta, mean, var] = stats;
        for ch in 0..dims.1 {
            let (m, is) = (mean[ch], inv_std(var[ch], epsilon));
            normalise(x, dims, ch, [m, is, gamma[ch], beta[ch]], act, out);
        }
    }
}

/// BatchNorm in inference (the running statistics), SiLU when `act`, as one pass over the values
/// instead of Burn's five tensor operations and its `silu` (libm's `expf` was a quarter of a CPU
/// `predict`'s time); the batch split over two threads when large. `None` off the CPU or under
/// autodiff.
pub fn bn_act_inference(bn: &burn::nn::BatchNorm, x: &Tensor<4>, act: bool) -> Option<Tensor<4>> {
    fn flex<const D: usize>(t: Tensor<D>) -> Option<FloatTensor<Flex>> {
        match t.into_dispatch().kind {
            DispatchTensorKind::Flex(BackendTensor::Float(f)) if f.dtype() == DType::F32 => Some(f),
            _ => None,
        }
    }
    if x.device().is_autodiff() {
        return None;
    }
    let xf = flex(x.clone())?;
    let stats = [
        bn.gamma.val(),
        bn.beta.val(),
        bn.running_mean.value(),
        bn.running_var.value(),
    ]
    .map(flex);
    let [Some(g), Some(b), Some(m), Some(v)] = stats else {
        return None;
    };
    let dims @ (n, c, hw) = planes(&xf);
    let shape = xf.shape();
    let xv = values(&xf);
    let (gv, bv, mv, vv) = (values(&g), values(&b), values(&m), values(&v));
    let stats = [&gv[..], &bv[..], &mv[..], &vv[..]];
    let eps = bn.epsilon as f32;
    let mut out = vec![0.0f32; xv.len()];
    if n < 2 || xv.len() < TWO_THREAD_WORK {
        bn_inference_loops(&xv, dims, stats, eps, act, &mut out);
    } else {
        // Each value on its own: the halves give the same values as one pass.
        let at = n / 2 * c * hw;
        let (xa, xb) = xv.split_at(at);
        let (oa, ob) = out.split_at_mut(at);
        std::thread::scope(|s| {
            s.spawn(|| bn_inference_loops(xa, (n / 2, c, hw), stats, eps, act, oa));
            bn_inference_loops(xb, (n - n / 2, c, hw), stats, eps, act, ob);
        });
    }
    Some(Tensor::from_dispatch(DispatchTensor {
        kind: DispatchTensorKind::Flex(BackendTensor::Float(tensor(out, shape))),
        autodiff: Default::default(),
    }))
}

dispatched! {
    /// Per channel: `g_z` (the gradient through SiLU when `act`) into `dx` with `dβ = Σ g_z` and
    /// `dγ = Σ g_z · x̂`, then `dx = γ · inv_std · (g_z − dβ / M − x̂ · dγ / M)` in place.
    fn bn_backward_loops(
        x: &[f32],
        grad: &[f32],
        dims: (usize, usize, usize),
        stats: [&[f32]; 4],
        epsilon: f32,
        act: bool,
        dx: &mut [f32],
        d_gamma: &mut [f32],
        d_beta: &mut [f32],
    ) {
        let (n, c, hw) = dims;
        let [mean, var, gamma, beta] = stats;
        let count = (n * hw) as f64;
        for ch in 0..c {
            let (mu, is, g, b) = (mean[ch], inv_std(var[ch], epsilon), gamma[ch], beta[ch]);
            let (mut acc_g, mut acc_gx) = ([0.0; LANES], [0.0; LANES]);
            for r in runs(dims, ch) {
                let (v, gr, d) = (&x[r.clone()], &grad[r.clone()], &mut dx[r]);
                let (vb, vr) = v.as_chunks::<LANES>();
                let (gb, gr_rest) = gr.as_chunks::<LANES>();
                let (db, dr) = d.as_chunks_mut::<LANES>();
                let mut one = |v: f32, gr: f32, d: &mut f32, l: usize| {
                    let xhat = (v - mu) * is;
                    let gz = if act { silu_grad(gr, xhat.mul_add(g, b)) } else { gr };
                    *d = gz;
                    acc_g[l] += f64::from(gz);
                    acc_gx[l] += f64::from(gz) * f64::from(xhat);
                };
                for ((vb, gb), db) in vb.iter().zip(gb).zip(db) {
                    for l in 0..LANES {
                        one(vb[l], gb[l], &mut db[l], l);
                    }
                }
                for (l, ((&v, &gr), d)) in vr.iter().zip(gr_rest).zip(dr).enumerate() {
                    one(v, gr, d, l);
                }
            }
            let (sum_g, sum_gx) = (total(acc_g), total(acc_gx));
            let (mean_g, mean_gx) = ((sum_g / count) as f32, (sum_gx / count) as f32);
            let (sum_g, sum_gx, scale) = (sum_g as f32, sum_gx as f32, g * is);
            for r in runs(dims, ch) {
                for (d, &v) in dx[r.clone()].iter_mut().zip(&x[r]) {
                    let xhat = (v - mu) * is;
                    *d = scale * ((*d - mean_g) - xhat * mean_gx);
                }
            }
            d_gamma[ch] = sum_gx;
            d_beta[ch] = sum_g;
        }
    }
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

/// BatchNorm with the batch's statistics, SiLU when `act`, and the running statistics
/// `old · (1 − momentum) + stat · momentum`.
#[allow(clippy::too_many_arguments)]
fn bn_act_forward(
    x: FloatTensor<Flex>,
    gamma: FloatTensor<Flex>,
    beta: FloatTensor<Flex>,
    running_mean: FloatTensor<Flex>,
    running_var: FloatTensor<Flex>,
    epsilon: f32,
    momentum: f32,
    act: bool,
) -> [FloatTensor<Flex>; 5] {
    let dims @ (_, c, _) = planes(&x);
    let shape = x.shape();
    let xv = values(&x);
    let mut out = vec![0.0f32; xv.len()];
    let mut means = vec![0.0f32; c];
    let mut vars = vec![0.0f32; c];
    let (gv, bv) = (values(&gamma), values(&beta));
    bn_forward_loops(
        &xv, dims, &gv, &bv, epsilon, act, &mut out, &mut means, &mut vars,
    );
    let keep = 1.0 - momentum;
    let running = |old: &[f32], stat: &[f32]| -> Vec<f32> {
        old.iter()
            .zip(stat)
            .map(|(&o, &s)| o * keep + s * momentum)
            .collect()
    };
    let new_mean = running(&values(&running_mean), &means);
    let new_var = running(&values(&running_var), &vars);
    [
        tensor(out, shape),
        tensor(means, Shape::new([c])),
        tensor(vars, Shape::new([c])),
        tensor(new_mean, Shape::new([c])),
        tensor(new_var, Shape::new([c])),
    ]
}

/// `(x, γ, β)` gradients of [`bn_act_forward`]'s output.
#[allow(clippy::too_many_arguments)]
fn bn_act_backward(
    x: FloatTensor<Flex>,
    gamma: FloatTensor<Flex>,
    beta: FloatTensor<Flex>,
    mean: FloatTensor<Flex>,
    variance: FloatTensor<Flex>,
    epsilon: f32,
    act: bool,
    grad: FloatTensor<Flex>,
) -> [FloatTensor<Flex>; 3] {
    let dims @ (_, c, _) = planes(&x);
    let shape = x.shape();
    let (xv, grad_v) = (values(&x), values(&grad));
    let stats = [
        values(&mean),
        values(&variance),
        values(&gamma),
        values(&beta),
    ];
    let mut dx = vec![0.0f32; xv.len()];
    let mut d_gamma = vec![0.0f32; c];
    let mut d_beta = vec![0.0f32; c];
    bn_backward_loops(
        &xv,
        &grad_v,
        dims,
        [&stats[0], &stats[1], &stats[2], &stats[3]],
        epsilon,
        act,
        &mut dx,
        &mut d_gamma,
        &mut d_beta,
    );
    [
        tensor(dx, shape),
        tensor(d_gamma, Shape::new([c])),
        tensor(d_beta, Shape::new([c])),
    ]
}

/// The CPU: the loops above for BatchNorm + SiLU (tensor operations under
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
        let [dx, d_gamma, d_beta] =
            bn_act_backward(x, gamma, beta, mean, variance, epsilon as f32, act, grad);
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
        if n < 2 || work < TWO_THREAD_WORK {
            return Self::conv2d(x, weight, None, options);
        }
        // Images are independent: each half of the batch on its own core.
        let half = n / 2;
        let first = Self::float_slice(x.clone(), &[burn::tensor::Slice::from(0..half)]);
        let second = Self::float_slice(x, &[burn::tensor::Slice::from(half..n)]);
        let (a, b) = std::thread::scope(|s| {
            let (w, o) = (weight.clone(), options.clone());
            let b = s.spawn(move || Self::conv2d(second, w, None, o));
            let a = Self::conv2d(first, weight, None, options);
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
