//! The per-channel sums of the fused BatchNorm + SiLU (`batch_norm.rs`) for an input of any
//! strides: one cube per (chunk, channel) walking the channel's values in N, H, W order, each
//! chunk reduced by a fixed shared-memory tree, then one unit per channel merging its chunks in
//! order. Forward the Welford statistics with the running statistics' update; backward `Σ g_z`
//! and `Σ g_z · x̂`. A channels-last input takes `batch_norm_nhwc.rs`'s instead.

// The kernels' arithmetic stays in the forms CubeCL's frontend expanded and the H200 ran
// (`(m + parts - 1) / parts`, `a[i] = a[i] + x` on shared memory), not clippy's rewrites.
#![allow(clippy::manual_div_ceil, clippy::assign_op_pattern)]

// `#[cube]` expands to `cubecl::…` paths.
use burn::cubecl;
use burn::tensor::Shape;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;
use cubecl::{CubeCount, CubeDim};

use super::fused_bn::{channel, elementwise, grad_z, inv_std, nchw};
use super::tree::{UNITS, parts};
use crate::model::ops::empty_f32;

/// Offset of the `j`-th value of channel `c` (`j` over N, H, W in that order) in a `[N, C, H, W]`
/// tensor with the given strides.
#[cube]
pub(super) fn offset(t: &Tensor<f32>, c: usize, j: usize) -> usize {
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

/// `(mean, var, running_mean', running_var')` of `x` (any strides), each `[C]`: one cube per
/// (chunk, channel) walking the channel's values.
pub fn statistics(
    x: &CubeTensor,
    running_mean: CubeTensor,
    running_var: CubeTensor,
    momentum: f32,
) -> [CubeTensor; 4] {
    let [n, c, h, w] = nchw(x);
    let m = n * h * w;
    let p = parts(m);
    let partial = empty_f32(x, Shape::new([c * p * 3]));
    let per_channel = || empty_f32(x, Shape::new([c]));
    // Where a recording registered them, over the old values (`model::ops::stats_into`).
    let new = |old: &CubeTensor| super::stats_into::take(old).unwrap_or_else(per_channel);
    let (mean, var, new_mean, new_var) = (
        per_channel(),
        per_channel(),
        new(&running_mean),
        new(&running_var),
    );
    let (count, dim) = elementwise(x, c);
    let client = x.client.clone();
    // SAFETY: every kernel bounds its units by the shapes it reads, and indexes every tensor by
    // its own strides; the partial buffer holds exactly C·P records. A new running statistic may
    // be the old one's buffer: the one unit that writes a channel's new value has read its old
    // one first.
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

/// `(dγ, dβ)` of [`forward`] for `x` and `grad` of any strides: one cube per (chunk, channel)
/// walking the channel's values, then one unit per channel.
#[allow(clippy::too_many_arguments)]
pub fn grad_sums(
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
    let partial = empty_f32(x, Shape::new([c * p * 2]));
    // Where a recorded step registered them, straight into the flat gradient buffer.
    let into = |param: &CubeTensor| {
        super::grads_into::take(param).unwrap_or_else(|| empty_f32(x, Shape::new([c])))
    };
    let (d_gamma, d_beta) = (into(gamma), into(beta));
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
