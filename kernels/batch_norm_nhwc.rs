//! The per-channel sums of the fused BatchNorm + SiLU (`batch_norm.rs`) for a channels-last input,
//! the layout every convolution here hands BatchNorm (`channels.rs` crops the GEMM's result into
//! `[N, H, W, C]` memory). `batch_norm.rs`'s sums give each channel its own cube, whose units
//! walk the channel's values `C` floats apart: every load of a warp touches 32 sectors for 32
//! values. Here a cube's units are `(lane, row)`: a lane per channel of a tile of up to 32
//! channels, rows over the pixels, so a warp reads neighbouring channels of one pixel (one
//! coalesced line), and each unit issues four loads before it uses them. The element-wise
//! kernels of `batch_norm.rs` stay as they are, and so do the layouts of their outputs (NCHW):
//! with BatchNorm's output and input gradient channels-last, the weight gradients' columns and
//! matmul operands downstream read them across the grain and the step's GPU time rose (H200,
//! 2026-12-04, docs/perf_log.md AL2).
//!
//! Same formulas as `batch_norm.rs` (Welford statistics, `Σ g_z` and `Σ g_z · x̂`) and the same
//! determinism: the split of each channel's `M = N·H·W` values into chunks and rows depends on
//! the shape only, every merge is a fixed tree or a fixed order, no atomics. The order differs
//! from `batch_norm.rs`'s, so the low bits of the statistics differ from those of an NCHW input.
//! Then one cube per 8 channels merges each channel's chunk partials: 32 units each take every
//! 32nd chunk in order, and a fixed tree merges the 32 (a single unit walking up to 256 partials
//! would wait on one load after another).

// The kernels' arithmetic stays in the forms CubeCL's frontend expands (`(m + parts - 1) /
// parts`, `a[i] = a[i] + x` on shared memory), not clippy's rewrites.
#![allow(clippy::manual_div_ceil, clippy::assign_op_pattern)]

// `#[cube]` expands to `cubecl::…` paths.
use burn::cubecl;
use burn::tensor::Shape;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;
use cubecl::{CubeCount, CubeDim};

use super::fused_bn::{channel, grad_z, inv_std};
use super::fused_bn_single::{add_into, grad_run, stats_run, write_statistics};
use super::fused_bn_sums::offset;
use super::tree::UNITS;
use crate::model::ops::empty_f32;

/// Values one unit takes at least, and the most chunks per channel.
const PER_UNIT: usize = 32;
const MAX_PARTS: usize = 256;
/// Units merging one channel's chunks, and channels per merging cube.
pub(super) const MERGE_UNITS: usize = 32;
const MERGE_CHANNELS: usize = UNITS / MERGE_UNITS;

/// Whether `x` `[N, C, H, W]` lies channels-last with its pixels evenly spaced: value `(n, c, h,
/// w)` at `j · stride(3) + c` for the pixel index `j = (n·H + h)·W + w`. What the kernels here
/// read it by; other layouts take `batch_norm.rs`'s own sums.
pub fn dense_channels_last(x: &CubeTensor) -> bool {
    let shape = x.meta.shape();
    let s = x.meta.strides();
    if shape.num_dims() != 4 {
        return false;
    }
    let (c, h, w) = (shape[1], shape[2], shape[3]);
    s[1] == 1 && s[3] >= c && s[2] == w * s[3] && s[0] == h * s[2]
}

/// The split of a channel's `m` values: `(lanes, rows, tiles, parts)` for `c` channels, a
/// function of the shape only.
fn split(m: usize, c: usize) -> (usize, usize, usize, usize) {
    let lanes = c.next_power_of_two().min(32);
    let rows = UNITS / lanes;
    let tiles = c.div_ceil(lanes);
    let parts = m.div_ceil(rows * PER_UNIT).clamp(1, MAX_PARTS);
    (lanes, rows, tiles, parts)
}

/// `(count, mean, M2)` of two Welford records merged (the second's count may be zero).
#[cube]
pub(super) fn merge_into(s: &mut Shared<[f32]>, a: usize, b: usize, #[comptime] stride: usize) {
    // `s` holds the three fields `stride` apart: count at `i`, mean at `i + stride`, M2 at
    // `i + 2·stride`.
    let na = s[a];
    let nb = s[b];
    if nb > 0.0f32 {
        let n = na + nb;
        let delta = s[b + stride] - s[a + stride];
        s[a + stride] = s[a + stride] + delta * (nb / n);
        s[a + 2 * stride] = s[a + 2 * stride] + s[b + 2 * stride] + delta * delta * (na * nb / n);
        s[a] = n;
    }
}

/// Cube `(p, t)`, units `(lane, row)`: the Welford record of channel `t·lanes + lane` over the
/// pixels `start + row + k·rows` of chunk `p`, the rows merged by a fixed tree, into
/// `partial[(c·P + p)·3 ..]`.
#[cube(launch_unchecked, create_dummy_kernel)]
fn stats_partial_kernel(x: &Tensor<f32>, partial: &mut Tensor<f32>, #[comptime] units: usize) {
    let mut s = Shared::<[f32]>::new_slice(3 * units);
    stats_record(x, partial, &mut s, units);
}

/// [`stats_partial_kernel`]'s work, its shared memory `s` (`3·units`) given: after it, row 0's
/// units hold their channel's record of the chunk in `s` (count, mean, M2 `units` apart), and
/// `partial` holds it.
#[cube]
pub(super) fn stats_record(
    x: &Tensor<f32>,
    partial: &mut Tensor<f32>,
    s: &mut Shared<[f32]>,
    #[comptime] units: usize,
) {
    let lanes = CUBE_DIM_X as usize;
    let rows = CUBE_DIM_Y as usize;
    let lane = UNIT_POS_X as usize;
    let row = UNIT_POS_Y as usize;
    let p = CUBE_POS_X as usize;
    let parts = CUBE_COUNT_X as usize;
    let c = CUBE_POS_Y as usize * lanes + lane;
    let c_n = x.shape(1);
    let m = x.shape(0) * x.shape(2) * x.shape(3);
    let pixel = x.stride(3);
    let chunk = (m + parts - 1) / parts;
    let start = p * chunk;
    let mut end = start + chunk;
    if end > m {
        end = m;
    }
    let mut count = 0.0f32;
    let mut mean = 0.0f32;
    let mut m2 = 0.0f32;
    if c < c_n {
        let mut j = start + row;
        while j < end {
            let j1 = j + rows;
            let j2 = j1 + rows;
            let j3 = j2 + rows;
            let v0 = x[j * pixel + c];
            let mut v1 = 0.0f32;
            let mut v2 = 0.0f32;
            let mut v3 = 0.0f32;
            if j1 < end {
                v1 = x[j1 * pixel + c];
            }
            if j2 < end {
                v2 = x[j2 * pixel + c];
            }
            if j3 < end {
                v3 = x[j3 * pixel + c];
            }
            count += 1.0f32;
            let d0 = v0 - mean;
            mean += d0 / count;
            m2 += d0 * (v0 - mean);
            if j1 < end {
                count += 1.0f32;
                let d1 = v1 - mean;
                mean += d1 / count;
                m2 += d1 * (v1 - mean);
            }
            if j2 < end {
                count += 1.0f32;
                let d2 = v2 - mean;
                mean += d2 / count;
                m2 += d2 * (v2 - mean);
            }
            if j3 < end {
                count += 1.0f32;
                let d3 = v3 - mean;
                mean += d3 / count;
                m2 += d3 * (v3 - mean);
            }
            j += 4 * rows;
        }
    }
    // Count, mean and M2 of unit `u`: `s[u]`, `s[u + units]`, `s[u + 2·units]`.
    let u = row * lanes + lane;
    s[u] = count;
    s[u + units] = mean;
    s[u + 2 * units] = m2;
    sync_cube();
    // A runtime bound: a comptime one would make the loop condition a constant.
    let mut half = rows / 2;
    while half > 0 {
        if row < half {
            merge_into(s, u, u + half * lanes, units);
        }
        sync_cube();
        half /= 2;
    }
    if row == 0 && c < c_n {
        let base = (c * parts + p) * 3;
        partial[base] = s[u];
        partial[base + 1] = s[u + units];
        partial[base + 2] = s[u + 2 * units];
    }
}

/// Cube of `MERGE_CHANNELS` channels, units `(k, ch)`: unit `k` merges chunks `k, k + 32, …` of
/// its channel in order, a fixed tree merges the 32; then the mean and biased variance, and the
/// running statistics `old · (1 − momentum) + stat · momentum`.
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
fn stats_final_kernel(
    partial: &mut Tensor<f32>,
    running_mean: &Tensor<f32>,
    running_var: &Tensor<f32>,
    mean: &mut Tensor<f32>,
    var: &mut Tensor<f32>,
    new_mean: &mut Tensor<f32>,
    new_var: &mut Tensor<f32>,
    parts: u32,
    momentum: f32,
    #[comptime] units: usize,
) {
    let k = UNIT_POS_X as usize;
    let width = CUBE_DIM_X as usize;
    let c = CUBE_POS_X as usize * CUBE_DIM_Y as usize + UNIT_POS_Y as usize;
    let c_n = mean.shape(0);
    let mut s = Shared::<[f32]>::new_slice(3 * units);
    let u = UNIT_POS_Y as usize * width + k;
    stats_run(partial, c, c_n, k, parts as usize, width, &mut s, u, units);
    sync_cube();
    let mut half = width / 2;
    while half > 0 {
        if k < half {
            merge_into(&mut s, u, u + half, units);
        }
        sync_cube();
        half /= 2;
    }
    if k == 0 && c < c_n {
        write_statistics(
            &s,
            u,
            units,
            c,
            momentum,
            running_mean,
            running_var,
            mean,
            var,
            new_mean,
            new_var,
        );
    }
}

/// Pixel `j`'s channel `c` of `t`: at `j · pixel + c` when `dense` ([`dense_channels_last`]),
/// else by its four strides.
#[cube]
fn load(t: &Tensor<f32>, c: usize, j: usize, pixel: usize, #[comptime] dense: bool) -> f32 {
    let mut at = j * pixel + c;
    if !dense {
        at = offset(t, c, j);
    }
    t[at]
}

/// Cube `(p, t)`, units `(lane, row)`: `Σ g_z` and `Σ g_z · x̂` of channel `t·lanes + lane` over
/// chunk `p`'s pixels (as [`stats_partial_kernel`]), into `partial[(c·P + p)·2 ..]`. `x` is read
/// as [`dense_channels_last`]; `grad` the same way when `grad_dense`, else by its four strides.
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
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
    #[comptime] grad_dense: bool,
) {
    let mut s = Shared::<[f32]>::new_slice(2 * units);
    grad_record(
        x, grad, mean, var, gamma, beta, partial, &mut s, epsilon, units, act, grad_dense,
    );
}

/// [`grad_partial_kernel`]'s work, its shared memory `s` (`2·units`) given: after it, row 0's
/// units hold their channel's `Σ g_z` and `Σ g_z · x̂` of the chunk in `s` (`units` apart), and
/// `partial` holds them.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn grad_record(
    x: &Tensor<f32>,
    grad: &Tensor<f32>,
    mean: &Tensor<f32>,
    var: &Tensor<f32>,
    gamma: &Tensor<f32>,
    beta: &Tensor<f32>,
    partial: &mut Tensor<f32>,
    s: &mut Shared<[f32]>,
    epsilon: f32,
    #[comptime] units: usize,
    #[comptime] act: bool,
    #[comptime] grad_dense: bool,
) {
    let lanes = CUBE_DIM_X as usize;
    let rows = CUBE_DIM_Y as usize;
    let lane = UNIT_POS_X as usize;
    let row = UNIT_POS_Y as usize;
    let p = CUBE_POS_X as usize;
    let parts = CUBE_COUNT_X as usize;
    let c = CUBE_POS_Y as usize * lanes + lane;
    let c_n = x.shape(1);
    let m = x.shape(0) * x.shape(2) * x.shape(3);
    let pixel = x.stride(3);
    let g_pixel = grad.stride(3);
    let chunk = (m + parts - 1) / parts;
    let start = p * chunk;
    let mut end = start + chunk;
    if end > m {
        end = m;
    }
    let mut sum_g = 0.0f32;
    let mut sum_gx = 0.0f32;
    if c < c_n {
        let mu = channel(mean, c);
        let is = inv_std(var, c, epsilon);
        let ga = channel(gamma, c);
        let be = channel(beta, c);
        let mut j = start + row;
        while j < end {
            let j1 = j + rows;
            let j2 = j1 + rows;
            let j3 = j2 + rows;
            let x0 = x[j * pixel + c];
            let g0 = load(grad, c, j, g_pixel, grad_dense);
            let mut x1 = 0.0f32;
            let mut g1 = 0.0f32;
            let mut x2 = 0.0f32;
            let mut g2 = 0.0f32;
            let mut x3 = 0.0f32;
            let mut g3 = 0.0f32;
            if j1 < end {
                x1 = x[j1 * pixel + c];
                g1 = load(grad, c, j1, g_pixel, grad_dense);
            }
            if j2 < end {
                x2 = x[j2 * pixel + c];
                g2 = load(grad, c, j2, g_pixel, grad_dense);
            }
            if j3 < end {
                x3 = x[j3 * pixel + c];
                g3 = load(grad, c, j3, g_pixel, grad_dense);
            }
            let h0 = (x0 - mu) * is;
            let z0 = grad_z(g0, h0 * ga + be, act);
            sum_g += z0;
            sum_gx += z0 * h0;
            if j1 < end {
                let h1 = (x1 - mu) * is;
                let z1 = grad_z(g1, h1 * ga + be, act);
                sum_g += z1;
                sum_gx += z1 * h1;
            }
            if j2 < end {
                let h2 = (x2 - mu) * is;
                let z2 = grad_z(g2, h2 * ga + be, act);
                sum_g += z2;
                sum_gx += z2 * h2;
            }
            if j3 < end {
                let h3 = (x3 - mu) * is;
                let z3 = grad_z(g3, h3 * ga + be, act);
                sum_g += z3;
                sum_gx += z3 * h3;
            }
            j += 4 * rows;
        }
    }
    let u = row * lanes + lane;
    s[u] = sum_g;
    s[u + units] = sum_gx;
    sync_cube();
    let mut half = rows / 2;
    while half > 0 {
        if row < half {
            s[u] = s[u] + s[u + half * lanes];
            s[u + units] = s[u + units] + s[u + half * lanes + units];
        }
        sync_cube();
        half /= 2;
    }
    if row == 0 && c < c_n {
        let base = (c * parts + p) * 2;
        partial[base] = s[u];
        partial[base + 1] = s[u + units];
    }
}

/// Cube of `MERGE_CHANNELS` channels: `dβ = Σ g_z`, `dγ = Σ g_z · x̂` over the chunk partials
/// (unit `k` sums chunks `k, k + 32, …` in order, then a fixed tree).
#[cube(launch_unchecked, create_dummy_kernel)]
fn grad_final_kernel(
    partial: &mut Tensor<f32>,
    d_gamma: &mut Tensor<f32>,
    d_beta: &mut Tensor<f32>,
    parts: u32,
    #[comptime] units: usize,
) {
    let k = UNIT_POS_X as usize;
    let width = CUBE_DIM_X as usize;
    let c = CUBE_POS_X as usize * CUBE_DIM_Y as usize + UNIT_POS_Y as usize;
    let c_n = d_gamma.shape(0);
    let mut s = Shared::<[f32]>::new_slice(2 * units);
    let u = UNIT_POS_Y as usize * width + k;
    grad_run(partial, c, c_n, k, parts as usize, width, &mut s, u, units);
    sync_cube();
    let mut half = width / 2;
    while half > 0 {
        if k < half {
            add_into(&mut s, u, u + half, units);
        }
        sync_cube();
        half /= 2;
    }
    if k == 0 && c < c_n {
        let at_beta = c * d_beta.stride(0);
        let at_gamma = c * d_gamma.stride(0);
        d_beta[at_beta] = s[u];
        d_gamma[at_gamma] = s[u + units];
    }
}

fn merge_cubes(c: usize) -> (CubeCount, CubeDim) {
    (
        CubeCount::Static(c.div_ceil(MERGE_CHANNELS) as u32, 1, 1),
        CubeDim::new_2d(MERGE_UNITS as u32, MERGE_CHANNELS as u32),
    )
}

/// `(mean, var, running_mean', running_var')` of a [`dense_channels_last`] `x`, each `[C]`.
pub fn statistics(
    x: &CubeTensor,
    running_mean: CubeTensor,
    running_var: CubeTensor,
    momentum: f32,
) -> [CubeTensor; 4] {
    let s = x.meta.shape();
    let (n, c, h, w) = (s[0], s[1], s[2], s[3]);
    let grid = split(n * h * w, c);
    let (lanes, rows, tiles, parts) = grid;
    let partial = empty_f32(x, Shape::new([c * parts * 3]));
    let [mean, var] = [(); 2].map(|_| empty_f32(x, Shape::new([c])));
    // Where a recording registered them, over the old values (`model::ops::stats_into`).
    let new = |old: &CubeTensor| {
        super::stats_into::take(old).unwrap_or_else(|| empty_f32(x, Shape::new([c])))
    };
    let (new_mean, new_var) = (new(&running_mean), new(&running_var));
    if super::fused_bn_single::chosen() {
        let out = [mean, var, new_mean, new_var];
        let running = [running_mean, running_var];
        return super::fused_bn_single::statistics(x, partial, grid, running, out, momentum);
    }
    let (count, dim) = merge_cubes(c);
    let client = x.client.clone();
    // SAFETY: units with a channel beyond C only take part in the trees; every read is bounded
    // by `x`'s shape and follows its strides (dense channels-last, checked by the caller); the
    // partial buffer holds exactly C·P records. A new running statistic may be the old one's
    // buffer: the one unit that writes a channel's new value has read its old one first.
    unsafe {
        stats_partial_kernel::launch_unchecked(
            &client,
            CubeCount::Static(parts as u32, tiles as u32, 1),
            CubeDim::new_2d(lanes as u32, rows as u32),
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
            parts as u32,
            momentum,
            UNITS,
        );
    }
    [mean, var, new_mean, new_var]
}

/// `(dγ, dβ)` of the fused BatchNorm + SiLU for a [`dense_channels_last`] `x` and the incoming
/// gradient `grad` (any strides; dense channels-last is read fastest).
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
    let s = x.meta.shape();
    let (n, c, h, w) = (s[0], s[1], s[2], s[3]);
    let grid = split(n * h * w, c);
    let (lanes, rows, tiles, parts) = grid;
    let partial = empty_f32(x, Shape::new([c * parts * 2]));
    // Where a recorded step registered them, straight into the flat gradient buffer.
    let into = |param: &CubeTensor| {
        super::grads_into::take(param).unwrap_or_else(|| empty_f32(x, Shape::new([c])))
    };
    let (d_gamma, d_beta) = (into(gamma), into(beta));
    let (count, dim) = merge_cubes(c);
    let grad_dense = dense_channels_last(grad);
    if super::fused_bn_single::chosen() {
        return super::fused_bn_single::grad_sums(
            [x, grad],
            partial,
            grid,
            [mean, var, gamma, beta],
            [d_gamma, d_beta],
            epsilon,
            (act, grad_dense),
        );
    }
    let client = x.client.clone();
    // SAFETY: as in `statistics`; `grad` has `x`'s shape (checked by the caller) and is read by
    // its strides.
    unsafe {
        grad_partial_kernel::launch_unchecked(
            &client,
            CubeCount::Static(parts as u32, tiles as u32, 1),
            CubeDim::new_2d(lanes as u32, rows as u32),
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
            grad_dense,
        );
        grad_final_kernel::launch_unchecked(
            &client,
            count,
            dim,
            partial.into_tensor_arg(),
            d_gamma.clone().into_tensor_arg(),
            d_beta.clone().into_tensor_arg(),
            parts as u32,
            UNITS,
        );
    }
    [d_gamma, d_beta]
}

#[cfg(test)]
mod tests {
    use super::super::compile_check::{compiles, device, tensor};
    use super::*;

    /// The channels-last sums' kernels (whose merge helpers the one-launch kernels share)
    /// compile for CUDA without a device.
    #[test]
    fn channels_last_sums_compile_for_cuda_without_a_device() {
        let (props, target) = device();
        let (count, dim) = (CubeCount::Static(4, 2, 1), CubeDim::new_2d(32, 8));
        let merge = CubeDim::new_2d(MERGE_UNITS as u32, MERGE_CHANNELS as u32);
        let x = || tensor(&[2, 40, 8, 8]);
        let c = || tensor(&[40]);
        let k = stats_partial_kernel::create_dummy_kernel(
            props.clone(),
            target.clone(),
            count.clone(),
            dim,
            x(),
            tensor(&[40 * 4 * 3]),
            UNITS,
        );
        compiles(k.define());
        let k = stats_final_kernel::create_dummy_kernel(
            props.clone(),
            target.clone(),
            count.clone(),
            merge,
            tensor(&[40 * 4 * 3]),
            c(),
            c(),
            c(),
            c(),
            c(),
            c(),
            4u32,
            0.03f32,
            UNITS,
        );
        compiles(k.define());
        for (act, grad_dense) in [(true, true), (false, false)] {
            let k = grad_partial_kernel::create_dummy_kernel(
                props.clone(),
                target.clone(),
                count.clone(),
                dim,
                x(),
                x(),
                c(),
                c(),
                c(),
                c(),
                tensor(&[40 * 4 * 2]),
                1e-3f32,
                UNITS,
                act,
                grad_dense,
            );
            compiles(k.define());
        }
        let k = grad_final_kernel::create_dummy_kernel(
            props,
            target,
            count,
            merge,
            tensor(&[40 * 4 * 2]),
            c(),
            c(),
            4u32,
            UNITS,
        );
        compiles(k.define());
    }
}
