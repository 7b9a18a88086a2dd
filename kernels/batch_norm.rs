//! BatchNorm training with the batch's statistics, fused with the SiLU that follows it in every
//! Conv-BN-SiLU (docs/kernels.md): three launches forward (partial statistics, per-channel
//! statistics and running statistics, normalise + affine + SiLU) and three backward (partial
//! sums, per-channel sums, input gradient), where Burn's formulas in tensor operations take ~25
//! and ~30. Same formulas as `model::ops::batch_norm` (the CPU path):
//! - forward: mean and biased variance per channel (Welford, merged in a fixed order),
//!   `z = (x − mean) · inv_std · γ + β`, `y = z · σ(z)` when `act`;
//! - backward: `g_z = g · σ(z) · (1 + z · (1 − σ(z)))` (or `g`), `dβ = Σ g_z`,
//!   `dγ = Σ g_z · x̂`, `dx = γ · inv_std · (g_z − dβ / M − x̂ · dγ / M)`.
//!
//! Every sum is a fixed tree over a fixed split of the `M = N·H·W` values of a channel (the split
//! depends on the shape only), so results are the same bits every run: no atomics. Every tensor
//! is read and written by its own strides (conv outputs arrive NHWC-strided, and CubeCL pads the
//! rows of the buffers it allocates). This file holds the entries ([`forward`], [`inference`],
//! [`backward`]), the shared expressions and the one-unit-per-value kernels; the per-channel sums
//! are in `batch_norm_sums.rs` (any layout) and `batch_norm_nhwc.rs` (channels-last), the
//! element-wise kernels for channels-last inputs in `batch_norm_tiles.rs`.

// The kernels' arithmetic stays in the forms CubeCL's frontend expanded and the H200 ran
// (`(m + parts - 1) / parts`, `a[i] = a[i] + x` on shared memory), not clippy's rewrites.
#![allow(clippy::manual_div_ceil, clippy::assign_op_pattern)]

// `#[cube]` expands to `cubecl::…` paths.
use crate::model::ops::empty_f32;
use burn::cubecl;
use burn::tensor::{DType, Shape};
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;
use cubecl::{CubeCount, CubeDim, calculate_cube_count_elemwise};

use super::fused_bn_nhwc as nhwc;
use super::fused_bn_sums as sums;
use super::fused_bn_tiles as tiles;

/// Channel `c` of a `[C]` tensor, by its stride.
#[cube]
pub(super) fn channel(t: &Tensor<f32>, c: usize) -> f32 {
    let at = c * t.stride(0);
    t[at]
}

/// `1 / √(var[c] + ε)`: the one expression every kernel uses, so all see the same bits.
#[cube]
pub(super) fn inv_std(var: &Tensor<f32>, c: usize, epsilon: f32) -> f32 {
    1.0f32 / f32::sqrt(channel(var, c) + epsilon)
}

#[cube]
pub(super) fn sigmoid(z: f32) -> f32 {
    1.0f32 / (1.0f32 + f32::exp(-z))
}

/// One unit per value: `z = (x − mean) · inv_std · γ + β`, then SiLU when `act`.
#[cube(launch_unchecked)]
fn apply_kernel(
    x: &Tensor<f32>,
    mean: &Tensor<f32>,
    var: &Tensor<f32>,
    gamma: &Tensor<f32>,
    beta: &Tensor<f32>,
    out: &mut Tensor<f32>,
    epsilon: f32,
    #[comptime] act: bool,
) {
    let w = x.shape(3);
    let h = x.shape(2);
    let c_n = x.shape(1);
    if ABSOLUTE_POS >= x.shape(0) * c_n * h * w {
        terminate!();
    }
    let mut rest = ABSOLUTE_POS;
    let xw = rest % w;
    rest /= w;
    let xh = rest % h;
    rest /= h;
    let c = rest % c_n;
    let n = rest / c_n;
    let src = n * x.stride(0) + c * x.stride(1) + xh * x.stride(2) + xw * x.stride(3);
    let dst = n * out.stride(0) + c * out.stride(1) + xh * out.stride(2) + xw * out.stride(3);
    let xv = x[src];
    let xhat = (xv - channel(mean, c)) * inv_std(var, c, epsilon);
    let z = xhat * channel(gamma, c) + channel(beta, c);
    if act {
        out[dst] = z * sigmoid(z);
    } else {
        out[dst] = z;
    }
}

/// `g_z` of one value: the incoming gradient through SiLU (when `act`) at `z`.
#[cube]
pub(super) fn grad_z(g: f32, z: f32, #[comptime] act: bool) -> f32 {
    if act {
        let s = sigmoid(z);
        g * (s * (1.0f32 + z * (1.0f32 - s)))
    } else {
        g
    }
}

/// One unit per value: `dx = γ · inv_std · (g_z − dβ / M − x̂ · dγ / M)`.
#[cube(launch_unchecked)]
fn grad_x_kernel(
    x: &Tensor<f32>,
    grad: &Tensor<f32>,
    mean: &Tensor<f32>,
    var: &Tensor<f32>,
    gamma: &Tensor<f32>,
    beta: &Tensor<f32>,
    d_gamma: &Tensor<f32>,
    d_beta: &Tensor<f32>,
    dx: &mut Tensor<f32>,
    epsilon: f32,
    #[comptime] act: bool,
) {
    let w = x.shape(3);
    let h = x.shape(2);
    let c_n = x.shape(1);
    if ABSOLUTE_POS >= x.shape(0) * c_n * h * w {
        terminate!();
    }
    let mut rest = ABSOLUTE_POS;
    let xw = rest % w;
    rest /= w;
    let xh = rest % h;
    rest /= h;
    let c = rest % c_n;
    let n = rest / c_n;
    let count = f32::cast_from(x.shape(0) * h * w);
    let at_x = n * x.stride(0) + c * x.stride(1) + xh * x.stride(2) + xw * x.stride(3);
    let at_g = n * grad.stride(0) + c * grad.stride(1) + xh * grad.stride(2) + xw * grad.stride(3);
    let at_dx = n * dx.stride(0) + c * dx.stride(1) + xh * dx.stride(2) + xw * dx.stride(3);
    let is = inv_std(var, c, epsilon);
    let ga = channel(gamma, c);
    let xv = x[at_x];
    let gv = grad[at_g];
    let xhat = (xv - channel(mean, c)) * is;
    let gz = grad_z(gv, xhat * ga + channel(beta, c), act);
    let mean_g = channel(d_beta, c) / count;
    let mean_gx = channel(d_gamma, c) / count;
    dx[at_dx] = (ga * is) * ((gz - mean_g) - xhat * mean_gx);
}

fn check_f32(what: &str, ts: &[&CubeTensor]) {
    for t in ts {
        assert!(
            t.dtype == DType::F32,
            "{what}: f32 tensors only, got {:?}",
            t.dtype
        );
    }
}

pub(super) fn nchw(x: &CubeTensor) -> [usize; 4] {
    let s = x.meta.shape();
    assert_eq!(s.num_dims(), 4, "BatchNorm expects [N, C, H, W], got {s:?}");
    [s[0], s[1], s[2], s[3]]
}

/// Launches `kernel` over `n` values, one unit each.
pub(super) fn elementwise(x: &CubeTensor, n: usize) -> (CubeCount, CubeDim) {
    let dim = CubeDim::new(&x.client, n);
    (calculate_cube_count_elemwise(&x.client, n, dim), dim)
}

/// `(y, mean, var, running_mean', running_var')` of BatchNorm training (+ SiLU when `act`) of
/// `x` `[N, C, H, W]`; the last four are `[C]`. With `operand` `(channels, dtype)`, also `y` as
/// the next convolution's GEMM takes its input (`channels_last(y, n, channels, dtype)`'s
/// values), written by the same kernel where the tile kernel runs; `None` otherwise (the
/// convolution casts then).
#[allow(clippy::too_many_arguments)]
pub fn forward(
    x: CubeTensor,
    gamma: CubeTensor,
    beta: CubeTensor,
    running_mean: CubeTensor,
    running_var: CubeTensor,
    epsilon: f32,
    momentum: f32,
    act: bool,
    operand: Option<(usize, DType)>,
) -> ([CubeTensor; 5], Option<CubeTensor>) {
    check_f32(
        "bn_act forward",
        &[&x, &gamma, &beta, &running_mean, &running_var],
    );
    let [n, c, h, w] = nchw(&x);
    let [mean, var, new_mean, new_var] = if nhwc::dense_channels_last(&x) {
        nhwc::statistics(&x, running_mean, running_var, momentum)
    } else {
        sums::statistics(&x, running_mean, running_var, momentum)
    };
    let out = empty_f32(&x, Shape::new([n, c, h, w]));
    let xp = normalise(
        x,
        mean.clone(),
        var.clone(),
        gamma,
        beta,
        &out,
        operand,
        epsilon,
        act,
    );
    ([out, mean, var, new_mean, new_var], xp)
}

/// BatchNorm inference (+ SiLU when `act`) of `x` `[N, C, H, W]` with the running statistics,
/// in one launch of the training forward's normalising kernel, where Burn's inference and SiLU
/// take eight.
pub fn inference(
    x: CubeTensor,
    gamma: CubeTensor,
    beta: CubeTensor,
    running_mean: CubeTensor,
    running_var: CubeTensor,
    epsilon: f32,
    act: bool,
) -> CubeTensor {
    check_f32(
        "bn_act inference",
        &[&x, &gamma, &beta, &running_mean, &running_var],
    );
    let [n, c, h, w] = nchw(&x);
    let out = empty_f32(&x, Shape::new([n, c, h, w]));
    normalise(
        x,
        running_mean,
        running_var,
        gamma,
        beta,
        &out,
        None,
        epsilon,
        act,
    );
    out
}

/// `out = (x − mean) · inv_std · γ + β`, then SiLU when `act` ([`apply_kernel`]): the last
/// launch of [`forward`] with the batch's statistics, and [`inference`] with the running ones.
/// With `operand` `(channels, dtype)`, where the tile kernel runs it also writes the values
/// as the next convolution's input operand, returned (`tiles::operand_for`); `None` otherwise.
#[allow(clippy::too_many_arguments)]
fn normalise(
    x: CubeTensor,
    mean: CubeTensor,
    var: CubeTensor,
    gamma: CubeTensor,
    beta: CubeTensor,
    out: &CubeTensor,
    operand: Option<(usize, DType)>,
    epsilon: f32,
    act: bool,
) -> Option<CubeTensor> {
    if tiles::takes(&x, &[], out) {
        let xp = operand.and_then(|(channels, d)| tiles::operand_for(&x, channels, d));
        tiles::normalise(x, mean, var, gamma, beta, out, xp.as_ref(), epsilon, act);
        return xp;
    }
    let [n, c, h, w] = nchw(&x);
    let (count, dim) = elementwise(&x, n * c * h * w);
    let client = x.client.clone();
    // SAFETY: the kernel bounds its units by `x`'s shape and indexes every tensor by its strides.
    unsafe {
        apply_kernel::launch_unchecked(
            &client,
            count,
            dim,
            x.into_tensor_arg(),
            mean.into_tensor_arg(),
            var.into_tensor_arg(),
            gamma.into_tensor_arg(),
            beta.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            epsilon,
            act,
        );
    }
    None
}

/// `(dx, dγ, dβ)` of [`forward`] for the incoming gradient `grad` of its output. With
/// `operand` `(channels, dtype)`, also `dx` as the data gradient's GEMM of the convolution
/// before takes its output gradient (`channels_last(dx, n, channels, dtype)`'s values), written
/// by the same kernel where the tile kernel runs; `None` otherwise (the caller casts then).
#[allow(clippy::too_many_arguments)]
pub fn backward(
    x: CubeTensor,
    gamma: CubeTensor,
    beta: CubeTensor,
    mean: CubeTensor,
    var: CubeTensor,
    grad: CubeTensor,
    epsilon: f32,
    act: bool,
    operand: Option<(usize, DType)>,
) -> ([CubeTensor; 3], Option<CubeTensor>) {
    check_f32("bn_act backward", &[&x, &gamma, &beta, &mean, &var, &grad]);
    let [n, c, h, w] = nchw(&x);
    assert_eq!(nchw(&grad), [n, c, h, w], "bn_act backward: gradient shape");
    let [d_gamma, d_beta] = if nhwc::dense_channels_last(&x) {
        nhwc::grad_sums(&x, &grad, &mean, &var, &gamma, &beta, epsilon, act)
    } else {
        sums::grad_sums(&x, &grad, &mean, &var, &gamma, &beta, epsilon, act)
    };
    // Channels-last where chosen and the tile kernel runs for a convolution that takes an
    // operand (stride 1, no groups: a depthwise convolution's kernels read NCHW along the grain)
    // with a multiple of 4 channels (the weight gradient's matmul then reads it vectorised),
    // else NCHW (`batch_norm_tiles.rs`).
    let tiled = tiles::takes_inputs(&x, &[&grad]);
    let wanted = operand.is_some() && c % 4 == 0 && tiles::channels_last_grad();
    let dx = if tiled && wanted {
        tiles::empty_channels_last(&x)
    } else {
        // Contiguous NCHW rows, as the tile kernel's NCHW store takes them.
        empty_f32(&x, Shape::new([n, c, h, w]))
    };
    if tiled {
        let dxp = operand.and_then(|(channels, d)| tiles::operand_for(&x, channels, d));
        tiles::grad_x(
            x,
            grad,
            mean,
            var,
            gamma,
            beta,
            d_gamma.clone(),
            d_beta.clone(),
            &dx,
            dxp.as_ref(),
            epsilon,
            act,
        );
        return ([dx, d_gamma, d_beta], dxp);
    }
    let (count_all, dim_all) = elementwise(&x, n * c * h * w);
    let client = x.client.clone();
    // SAFETY: the kernel bounds its units by `x`'s shape and indexes every tensor by its strides.
    unsafe {
        grad_x_kernel::launch_unchecked(
            &client,
            count_all,
            dim_all,
            x.into_tensor_arg(),
            grad.into_tensor_arg(),
            mean.into_tensor_arg(),
            var.into_tensor_arg(),
            gamma.into_tensor_arg(),
            beta.into_tensor_arg(),
            d_gamma.clone().into_tensor_arg(),
            d_beta.clone().into_tensor_arg(),
            dx.clone().into_tensor_arg(),
            epsilon,
            act,
        );
    }
    ([dx, d_gamma, d_beta], None)
}
