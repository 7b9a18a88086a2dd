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
//! rows of the buffers it allocates).

// The kernels' arithmetic stays in the forms CubeCL's frontend expanded and the H200 ran
// (`(m + parts - 1) / parts`, `a[i] = a[i] + x` on shared memory), not clippy's rewrites.
#![allow(clippy::manual_div_ceil, clippy::assign_op_pattern)]

// `#[cube]` expands to `cubecl::…` paths.
use burn::cubecl;
use burn::tensor::{DType, Shape};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;
use cubecl::{CubeCount, CubeDim, calculate_cube_count_elemwise};

use super::fused_bn_nhwc as nhwc;
use super::fused_bn_tiles as tiles;
use super::tree::{UNITS, parts};

/// Offset of the `j`-th value of channel `c` (`j` over N, H, W in that order) in a `[N, C, H, W]`
/// tensor with the given strides.
#[cube]
fn offset(t: &Tensor<f32>, c: usize, j: usize) -> usize {
    let w = t.shape(3);
    let hw = t.shape(2) * w;
    let n = j / hw;
    let r = j % hw;
    n * t.stride(0) + c * t.stride(1) + (r / w) * t.stride(2) + (r % w) * t.stride(3)
}

/// Cube `(p, c)`: Welford count, mean and M2 of its share of channel `c` into
/// `partial[(c·P + p)·3 ..]`.
#[cube(launch_unchecked)]
fn stats_partial_kernel(x: &Tensor<f32>, partial: &mut Tensor<f32>, #[comptime] units: usize) {
    let p = CUBE_POS_X as usize;
    let c = CUBE_POS_Y as usize;
    let parts = CUBE_COUNT_X as usize;
    let m = x.shape(0) * x.shape(2) * x.shape(3);
    let chunk = (m + parts - 1) / parts;
    let start = p * chunk;
    let mut end = start + chunk;
    if end > m {
        end = m;
    }
    let mut count = 0.0f32;
    let mut mean = 0.0f32;
    let mut m2 = 0.0f32;
    let mut j = start + UNIT_POS_X as usize;
    while j < end {
        // Offsets first: CubeCL 0.11.3 rejected `x[offset(x, c, j)]` ("Expected operand type
        // cube.ptr, but found cube.index").
        let at = offset(x, c, j);
        let v = x[at];
        count += 1.0f32;
        let d = v - mean;
        mean += d / count;
        m2 += d * (v - mean);
        j += units;
    }
    let mut sc = Shared::<[f32]>::new_slice(units);
    let mut sm = Shared::<[f32]>::new_slice(units);
    let mut s2 = Shared::<[f32]>::new_slice(units);
    let u = UNIT_POS_X as usize;
    sc[u] = count;
    sm[u] = mean;
    s2[u] = m2;
    sync_cube();
    // A runtime bound: a comptime one would make the loop condition a constant.
    let mut half = CUBE_DIM_X as usize / 2;
    while half > 0 {
        if u < half {
            let na = sc[u];
            let nb = sc[u + half];
            let n = na + nb;
            if nb > 0.0f32 {
                let delta = sm[u + half] - sm[u];
                sm[u] = sm[u] + delta * (nb / n);
                s2[u] = s2[u] + s2[u + half] + delta * delta * (na * nb / n);
                sc[u] = n;
            }
        }
        sync_cube();
        half /= 2;
    }
    if u == 0 {
        let base = (c * parts + p) * 3;
        partial[base] = sc[0];
        partial[base + 1] = sm[0];
        partial[base + 2] = s2[0];
    }
}

/// One unit per channel: merges the channel's partials in order into the mean and biased
/// variance, and the running statistics `old · (1 − momentum) + stat · momentum`.
#[cube(launch_unchecked)]
fn stats_final_kernel(
    partial: &Tensor<f32>,
    running_mean: &Tensor<f32>,
    running_var: &Tensor<f32>,
    mean: &mut Tensor<f32>,
    var: &mut Tensor<f32>,
    new_mean: &mut Tensor<f32>,
    new_var: &mut Tensor<f32>,
    parts: u32,
    momentum: f32,
) {
    let c = ABSOLUTE_POS;
    if c >= mean.shape(0) {
        terminate!();
    }
    let parts = parts as usize;
    let mut count = 0.0f32;
    let mut mu = 0.0f32;
    let mut m2 = 0.0f32;
    for p in 0..parts {
        let base = (c * parts + p) * 3;
        let nb = partial[base];
        if nb > 0.0f32 {
            let n = count + nb;
            let delta = partial[base + 1] - mu;
            mu += delta * (nb / n);
            m2 += partial[base + 2] + delta * delta * (count * nb / n);
            count = n;
        }
    }
    let v = m2 / count;
    let at_mean = c * mean.stride(0);
    let at_var = c * var.stride(0);
    mean[at_mean] = mu;
    var[at_var] = v;
    let keep = 1.0f32 - momentum;
    let at_new_mean = c * new_mean.stride(0);
    let at_new_var = c * new_var.stride(0);
    new_mean[at_new_mean] = channel(running_mean, c) * keep + mu * momentum;
    new_var[at_new_var] = channel(running_var, c) * keep + v * momentum;
}

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

/// Cube `(p, c)`: `Σ g_z` and `Σ g_z · x̂` of its share of channel `c` into
/// `partial[(c·P + p)·2 ..]`.
#[cube(launch_unchecked)]
fn grad_partial_kernel(
    x: &Tensor<f32>,
    grad: &Tensor<f32>,
    mean: &Tensor<f32>,
    var: &Tensor<f32>,
    gamma: &Tensor<f32>,
    beta: &Tensor<f32>,
    partial: &mut Tensor<f32>,
    epsilon: f32,
    #[comptime] units: usize,
    #[comptime] act: bool,
) {
    let p = CUBE_POS_X as usize;
    let c = CUBE_POS_Y as usize;
    let parts = CUBE_COUNT_X as usize;
    let m = x.shape(0) * x.shape(2) * x.shape(3);
    let chunk = (m + parts - 1) / parts;
    let start = p * chunk;
    let mut end = start + chunk;
    if end > m {
        end = m;
    }
    let mu = channel(mean, c);
    let is = inv_std(var, c, epsilon);
    let ga = channel(gamma, c);
    let be = channel(beta, c);
    let mut sum_g = 0.0f32;
    let mut sum_gx = 0.0f32;
    let mut j = start + UNIT_POS_X as usize;
    while j < end {
        let at_x = offset(x, c, j);
        let at_g = offset(grad, c, j);
        let xv = x[at_x];
        let gv = grad[at_g];
        let xhat = (xv - mu) * is;
        let gz = grad_z(gv, xhat * ga + be, act);
        sum_g += gz;
        sum_gx += gz * xhat;
        j += units;
    }
    let mut sg = Shared::<[f32]>::new_slice(units);
    let mut sx = Shared::<[f32]>::new_slice(units);
    let u = UNIT_POS_X as usize;
    sg[u] = sum_g;
    sx[u] = sum_gx;
    sync_cube();
    // A runtime bound: a comptime one would make the loop condition a constant.
    let mut half = CUBE_DIM_X as usize / 2;
    while half > 0 {
        if u < half {
            sg[u] = sg[u] + sg[u + half];
            sx[u] = sx[u] + sx[u + half];
        }
        sync_cube();
        half /= 2;
    }
    if u == 0 {
        let base = (c * parts + p) * 2;
        partial[base] = sg[0];
        partial[base + 1] = sx[0];
    }
}

/// One unit per channel: `dβ = Σ g_z`, `dγ = Σ g_z · x̂` over the partials in order.
#[cube(launch_unchecked)]
fn grad_final_kernel(
    partial: &Tensor<f32>,
    d_gamma: &mut Tensor<f32>,
    d_beta: &mut Tensor<f32>,
    parts: u32,
) {
    let c = ABSOLUTE_POS;
    if c >= d_gamma.shape(0) {
        terminate!();
    }
    let parts = parts as usize;
    let mut sg = 0.0f32;
    let mut sx = 0.0f32;
    for p in 0..parts {
        let base = (c * parts + p) * 2;
        sg += partial[base];
        sx += partial[base + 1];
    }
    let at_beta = c * d_beta.stride(0);
    let at_gamma = c * d_gamma.stride(0);
    d_beta[at_beta] = sg;
    d_gamma[at_gamma] = sx;
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

fn empty(like: &CubeTensor, shape: Shape) -> CubeTensor {
    // Contiguous, not pitched rows (docs/kernels.md, "Output buffers").
    empty_device_contiguous_dtype(like.client.clone(), like.device.clone(), shape, DType::F32)
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

fn nchw(x: &CubeTensor) -> [usize; 4] {
    let s = x.meta.shape();
    assert_eq!(s.num_dims(), 4, "BatchNorm expects [N, C, H, W], got {s:?}");
    [s[0], s[1], s[2], s[3]]
}

/// Launches `kernel` over `n` values, one unit each.
fn elementwise(x: &CubeTensor, n: usize) -> (CubeCount, CubeDim) {
    let dim = CubeDim::new(&x.client, n);
    (calculate_cube_count_elemwise(&x.client, n, dim), dim)
}

/// `(y, mean, var, running_mean', running_var')` of BatchNorm training (+ SiLU when `act`) of
/// `x` `[N, C, H, W]`; the last four are `[C]`.
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
) -> [CubeTensor; 5] {
    check_f32(
        "bn_act forward",
        &[&x, &gamma, &beta, &running_mean, &running_var],
    );
    let [n, c, h, w] = nchw(&x);
    let [mean, var, new_mean, new_var] = if nhwc::dense_channels_last(&x) {
        nhwc::statistics(&x, running_mean, running_var, momentum)
    } else {
        statistics(&x, running_mean, running_var, momentum)
    };
    let out = empty(&x, Shape::new([n, c, h, w]));
    normalise(
        x,
        mean.clone(),
        var.clone(),
        gamma,
        beta,
        &out,
        epsilon,
        act,
    );
    [out, mean, var, new_mean, new_var]
}

/// `(mean, var, running_mean', running_var')` of `x` (any strides), each `[C]`: one cube per
/// (chunk, channel) walking the channel's values.
fn statistics(
    x: &CubeTensor,
    running_mean: CubeTensor,
    running_var: CubeTensor,
    momentum: f32,
) -> [CubeTensor; 4] {
    let [n, c, h, w] = nchw(x);
    let m = n * h * w;
    let p = parts(m);
    let partial = empty(x, Shape::new([c * p * 3]));
    let per_channel = || empty(x, Shape::new([c]));
    let (mean, var, new_mean, new_var) =
        (per_channel(), per_channel(), per_channel(), per_channel());
    let (count, dim) = elementwise(x, c);
    let client = x.client.clone();
    // SAFETY: every kernel bounds its units by the shapes it reads, and indexes every tensor by
    // its own strides; the partial buffer holds exactly C·P records.
    unsafe {
        stats_partial_kernel::launch_unchecked(
            &client,
            CubeCount::Static(p as u32, c as u32, 1),
            CubeDim::new_1d(UNITS as u32),
            x.clone().into_tensor_arg(),
            partial.clone().into_tensor_arg(),
            UNITS,
        );
        stats_final_kernel::launch_unchecked(
            &client,
            count,
            dim,
            partial.into_tensor_arg(),
            running_mean.into_tensor_arg(),
            running_var.into_tensor_arg(),
            mean.clone().into_tensor_arg(),
            var.clone().into_tensor_arg(),
            new_mean.clone().into_tensor_arg(),
            new_var.clone().into_tensor_arg(),
            p as u32,
            momentum,
        );
    }
    [mean, var, new_mean, new_var]
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
    let out = empty(&x, Shape::new([n, c, h, w]));
    normalise(
        x,
        running_mean,
        running_var,
        gamma,
        beta,
        &out,
        epsilon,
        act,
    );
    out
}

/// `out = (x − mean) · inv_std · γ + β`, then SiLU when `act` ([`apply_kernel`]): the last
/// launch of [`forward`] with the batch's statistics, and [`inference`] with the running ones.
#[allow(clippy::too_many_arguments)]
fn normalise(
    x: CubeTensor,
    mean: CubeTensor,
    var: CubeTensor,
    gamma: CubeTensor,
    beta: CubeTensor,
    out: &CubeTensor,
    epsilon: f32,
    act: bool,
) {
    if tiles::takes(&x, &[], out) {
        tiles::normalise(x, mean, var, gamma, beta, out, epsilon, act);
        return;
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
}

/// `(dx, dγ, dβ)` of [`forward`] for the incoming gradient `grad` of its output.
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
) -> [CubeTensor; 3] {
    check_f32("bn_act backward", &[&x, &gamma, &beta, &mean, &var, &grad]);
    let [n, c, h, w] = nchw(&x);
    assert_eq!(nchw(&grad), [n, c, h, w], "bn_act backward: gradient shape");
    let [d_gamma, d_beta] = if nhwc::dense_channels_last(&x) {
        nhwc::grad_sums(&x, &grad, &mean, &var, &gamma, &beta, epsilon, act)
    } else {
        grad_sums(&x, &grad, &mean, &var, &gamma, &beta, epsilon, act)
    };
    let dx = empty(&x, Shape::new([n, c, h, w]));
    if tiles::takes(&x, &[&grad], &dx) {
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
            epsilon,
            act,
        );
        return [dx, d_gamma, d_beta];
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
    [dx, d_gamma, d_beta]
}

/// `(dγ, dβ)` of [`forward`] for `x` and `grad` of any strides: one cube per (chunk, channel)
/// walking the channel's values, then one unit per channel.
#[allow(clippy::too_many_arguments)]
fn grad_sums(
    x: &CubeTensor,
    grad: &CubeTensor,
    mean: &CubeTensor,
    var: &CubeTensor,
    gamma: &CubeTensor,
    beta: &CubeTensor,
    epsilon: f32,
    act: bool,
) -> [CubeTensor; 2] {
    let [n, c, h, w] = nchw(x);
    let p = parts(n * h * w);
    let partial = empty(x, Shape::new([c * p * 2]));
    let (d_gamma, d_beta) = (empty(x, Shape::new([c])), empty(x, Shape::new([c])));
    let (count, dim) = elementwise(x, c);
    let client = x.client.clone();
    // SAFETY: every kernel bounds its units by the shapes it reads and indexes every tensor by
    // its strides; the partial buffer holds exactly C·P records.
    unsafe {
        grad_partial_kernel::launch_unchecked(
            &client,
            CubeCount::Static(p as u32, c as u32, 1),
            CubeDim::new_1d(UNITS as u32),
            x.clone().into_tensor_arg(),
            grad.clone().into_tensor_arg(),
            mean.clone().into_tensor_arg(),
            var.clone().into_tensor_arg(),
            gamma.clone().into_tensor_arg(),
            beta.clone().into_tensor_arg(),
            partial.clone().into_tensor_arg(),
            epsilon,
            UNITS,
            act,
        );
        grad_final_kernel::launch_unchecked(
            &client,
            count,
            dim,
            partial.into_tensor_arg(),
            d_gamma.clone().into_tensor_arg(),
            d_beta.clone().into_tensor_arg(),
            p as u32,
        );
    }
    [d_gamma, d_beta]
}
