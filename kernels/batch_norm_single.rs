//! The channels-last BatchNorm sums (`batch_norm_nhwc.rs`) in one launch each instead of two:
//! every cube computes its chunk's partial records as there, publishes them, and counts itself
//! in on its channel tile's counter; the last cube of a tile to arrive merges the tile's
//! partials as the separate merge kernel does and writes the results. 126 BatchNorms take 252
//! launches fewer a step. The merge is that kernel's code (the helpers below, which both call)
//! in its order (per channel, 32 in-order runs over the chunks `k, k + 32, …`, then a fixed
//! tree over the 32), whichever cube arrives last, so the results have the two-launch bits.
//! Publishing is CubeCL's `sync_storage` (a release and an acquire at device scope) around an
//! atomic add, the pattern of CubeCL's own `test_sync_storage_across_cubes`; CUDA promises that
//! scope. The last cube adds its counter back round to zero, so the next launch (and a graph's
//! next replay) finds the counters zeroed without a launch of their own.
//! Off by default ([`choose`]; `bench-step --bn-single-pass true`): on an H100 it gave the
//! two-launch bits but took 1.65 ms more GPU time a seed step (docs/perf_log.md BB1), the last
//! cube's merge of a whole tile costing more than the launch it saves.

// The kernels' arithmetic stays in the forms CubeCL's frontend expands (`a[i] = a[i] + x` on
// shared memory), not clippy's rewrites.
#![allow(clippy::assign_op_pattern)]

// `#[cube]` expands to `cubecl::…` paths.
use burn::cubecl;
use burn::tensor::{DType, Shape};
use burn_cubecl::ops::numeric::zeros_client;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;
use cubecl::{CubeCount, CubeDim};
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};

use super::fused_bn::channel;
use super::fused_bn_nhwc::{MERGE_UNITS, grad_record, merge_into, stats_record};
use super::tree::UNITS;

static CHOSEN: AtomicBool = AtomicBool::new(false);

/// Runs every later channels-last BatchNorm sum of this process in one launch (`true`) or two
/// (`false`, the default); both give the same bits.
pub fn choose(single: bool) {
    CHOSEN.store(single, Ordering::Relaxed);
}

/// Whether the sums run in one launch ([`choose`]).
pub fn chosen() -> bool {
    CHOSEN.load(Ordering::Relaxed)
}

/// Channel tiles one launch may have (at most 32 channels a tile: 32,768 channels).
const COUNTERS: usize = 1024;
/// The merge's runs per channel and its shared memory per field (32 channels of a tile × 32).
const WIDTH: usize = MERGE_UNITS;
const FIELD: usize = 32 * WIDTH;

thread_local! {
    /// Per device, `COUNTERS` arrival counters, zero between launches.
    static ARRIVALS: RefCell<Vec<CubeTensor>> = const { RefCell::new(Vec::new()) };
}

/// The arrival counters of `x`'s device, made (zeroed) at its first use: a recording's
/// warm-ups run the same kernels before its window opens.
fn arrivals(x: &CubeTensor) -> CubeTensor {
    ARRIVALS.with(|all| {
        let mut all = all.borrow_mut();
        if let Some(c) = all.iter().find(|c| c.device == x.device) {
            return c.clone();
        }
        let c = zeros_client(
            x.client.clone(),
            x.device.clone(),
            Shape::new([COUNTERS]),
            DType::U32,
        );
        all.push(c.clone());
        c
    })
}

/// What the last cube adds to its tile's counter, `parts` then, to wrap it back to zero (an
/// atomic add, as the arrivals are).
fn rewind(parts: usize) -> u32 {
    0u32.wrapping_sub(parts as u32)
}

// The merges of the partials, shared with `batch_norm_nhwc.rs`'s two-launch merge kernels: the
// same code, hence the same bits, in both.

/// Run `k` of channel `c`'s merge: chunks `k, k + width, …` of its `parts` records in
/// `partial` (only read; mutable as the one-launch kernels hold it) merged in order into
/// `s[v]` (count, mean and M2 `stride` apart); zeros for a channel beyond `c_n`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn stats_run(
    partial: &mut Tensor<f32>,
    c: usize,
    c_n: usize,
    k: usize,
    parts: usize,
    width: usize,
    s: &mut Shared<[f32]>,
    v: usize,
    #[comptime] stride: usize,
) {
    let mut count = 0.0f32;
    let mut mu = 0.0f32;
    let mut m2 = 0.0f32;
    if c < c_n {
        let mut p = k;
        while p < parts {
            let base = (c * parts + p) * 3;
            let nb = partial[base];
            if nb > 0.0f32 {
                let n = count + nb;
                let delta = partial[base + 1] - mu;
                mu += delta * (nb / n);
                m2 += partial[base + 2] + delta * delta * (count * nb / n);
                count = n;
            }
            p += width;
        }
    }
    s[v] = count;
    s[v + stride] = mu;
    s[v + 2 * stride] = m2;
}

/// Channel `c`'s mean and biased variance from its merged record `s[v]` (fields `stride`
/// apart), and its running statistics `old · (1 − momentum) + stat · momentum`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn write_statistics(
    s: &Shared<[f32]>,
    v: usize,
    #[comptime] stride: usize,
    c: usize,
    momentum: f32,
    running_mean: &Tensor<f32>,
    running_var: &Tensor<f32>,
    mean: &mut Tensor<f32>,
    var: &mut Tensor<f32>,
    new_mean: &mut Tensor<f32>,
    new_var: &mut Tensor<f32>,
) {
    let mu = s[v + stride];
    let var_c = s[v + 2 * stride] / s[v];
    let at_mean = c * mean.stride(0);
    let at_var = c * var.stride(0);
    mean[at_mean] = mu;
    var[at_var] = var_c;
    let keep = 1.0f32 - momentum;
    let old_mean = channel(running_mean, c);
    let old_var = channel(running_var, c);
    let at_new_mean = c * new_mean.stride(0);
    let at_new_var = c * new_var.stride(0);
    new_mean[at_new_mean] = old_mean * keep + mu * momentum;
    new_var[at_new_var] = old_var * keep + var_c * momentum;
}

/// Run `k` of channel `c`'s sums: chunks `k, k + width, …` of its `parts` pairs in `partial`
/// (only read) summed in order into `s[v]` (`Σ g_z`, and `Σ g_z · x̂` `stride` after); zeros
/// for a channel beyond `c_n`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn grad_run(
    partial: &mut Tensor<f32>,
    c: usize,
    c_n: usize,
    k: usize,
    parts: usize,
    width: usize,
    s: &mut Shared<[f32]>,
    v: usize,
    #[comptime] stride: usize,
) {
    let mut sg = 0.0f32;
    let mut sx = 0.0f32;
    if c < c_n {
        let mut p = k;
        while p < parts {
            let base = (c * parts + p) * 2;
            sg += partial[base];
            sx += partial[base + 1];
            p += width;
        }
    }
    s[v] = sg;
    s[v + stride] = sx;
}

/// The pair at `s[b]` added into the pair at `s[a]` (fields `stride` apart).
#[cube]
pub(super) fn add_into(s: &mut Shared<[f32]>, a: usize, b: usize, #[comptime] stride: usize) {
    s[a] = s[a] + s[b];
    s[a + stride] = s[a + stride] + s[b + stride];
}

/// In the last cube of a channel tile: channel `c`'s (the unit's lane's) partials merged as the
/// two-launch merge kernels merge them, into `f[lane·width]` (fields `FIELD` apart). Run `k` of
/// the channel (chunks `k, k + width, …` in order) goes to `f[lane·width + k]`, the cube's rows
/// taking the `width` (= [`WIDTH`]) runs in turn; then the fixed tree over the runs. `stats`:
/// Welford records (`stats_run`, `merge_into`); else `Σ g_z`, `Σ g_z · x̂` pairs (`grad_run`,
/// `add_into`). `width` comes as a launch argument, as the two-launch kernels' does: with the
/// tree's counter started from the constant `WIDTH / 2` and halved in the loop, CubeCL 0.11.3's
/// CUDA compiler rejected the kernels ("Expected operand type cube.ptr, but found cube.index",
/// docs/perf_log.md AZ1; the compile check below fails the same way).
#[cube]
#[allow(clippy::too_many_arguments)]
fn merge_tile(
    partial: &mut Tensor<f32>,
    f: &mut Shared<[f32]>,
    c: usize,
    c_n: usize,
    parts: usize,
    width: usize,
    #[comptime] stats: bool,
) {
    let rows = CUBE_DIM_Y as usize;
    let lane = UNIT_POS_X as usize;
    let row = UNIT_POS_Y as usize;
    let mut k = row;
    while k < width {
        if stats {
            stats_run(partial, c, c_n, k, parts, width, f, lane * width + k, FIELD);
        } else {
            grad_run(partial, c, c_n, k, parts, width, f, lane * width + k, FIELD);
        }
        k += rows;
    }
    sync_cube();
    let mut half = width / 2;
    while half > 0 {
        let mut k = row;
        while k < half {
            let a = lane * width + k;
            if stats {
                merge_into(f, a, a + half, FIELD);
            } else {
                add_into(f, a, a + half, FIELD);
            }
            k += rows;
        }
        sync_cube();
        half /= 2;
    }
}

/// Counts the cube in on tile `t`'s counter after publishing its writes: whether it is the last
/// of the tile's `parts` cubes (the same answer in every unit), with every other cube's writes
/// then visible to it. The pattern of CubeCL's `test_sync_storage_across_cubes`.
#[cube]
fn last_to_arrive(counter: &mut Tensor<Atomic<u32>>, t: usize, parts: usize) -> bool {
    let mut arrived = Shared::<u32>::new();
    sync_storage();
    if UNIT_POS == 0 {
        *arrived = counter[t].fetch_add(1u32);
    }
    sync_storage();
    *arrived as usize == parts - 1
}

/// `batch_norm_nhwc.rs`'s `stats_partial_kernel`, then, in the last cube of each channel tile,
/// its `stats_final_kernel`: mean, biased variance and running statistics.
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
fn stats_single_kernel(
    x: &Tensor<f32>,
    partial: &mut Tensor<f32>,
    counter: &mut Tensor<Atomic<u32>>,
    running_mean: &Tensor<f32>,
    running_var: &Tensor<f32>,
    mean: &mut Tensor<f32>,
    var: &mut Tensor<f32>,
    new_mean: &mut Tensor<f32>,
    new_var: &mut Tensor<f32>,
    momentum: f32,
    rewind: u32,
    width: u32,
    #[comptime] units: usize,
) {
    let mut s = Shared::<[f32]>::new_slice(3 * units);
    let mut f = Shared::<[f32]>::new_slice(3 * FIELD);
    stats_record(x, partial, &mut s, units);
    let lanes = CUBE_DIM_X as usize;
    let lane = UNIT_POS_X as usize;
    let row = UNIT_POS_Y as usize;
    let parts = CUBE_COUNT_X as usize;
    let t = CUBE_POS_Y as usize;
    let c = t * lanes + lane;
    let c_n = x.shape(1);
    let width = width as usize;
    if last_to_arrive(counter, t, parts) {
        merge_tile(partial, &mut f, c, c_n, parts, width, true);
        if row == 0 && c < c_n {
            write_statistics(
                &f,
                lane * width,
                FIELD,
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
        if UNIT_POS == 0 {
            counter[t].fetch_add(rewind);
        }
    }
}

/// `batch_norm_nhwc.rs`'s `grad_partial_kernel`, then, in the last cube of each channel tile,
/// its `grad_final_kernel`: `dβ = Σ g_z`, `dγ = Σ g_z · x̂`.
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
fn grad_single_kernel(
    x: &Tensor<f32>,
    grad: &Tensor<f32>,
    mean: &Tensor<f32>,
    var: &Tensor<f32>,
    gamma: &Tensor<f32>,
    beta: &Tensor<f32>,
    partial: &mut Tensor<f32>,
    counter: &mut Tensor<Atomic<u32>>,
    d_gamma: &mut Tensor<f32>,
    d_beta: &mut Tensor<f32>,
    epsilon: f32,
    rewind: u32,
    width: u32,
    #[comptime] units: usize,
    #[comptime] act: bool,
    #[comptime] grad_dense: bool,
) {
    let mut s = Shared::<[f32]>::new_slice(2 * units);
    let mut f = Shared::<[f32]>::new_slice(2 * FIELD);
    grad_record(
        x, grad, mean, var, gamma, beta, partial, &mut s, epsilon, units, act, grad_dense,
    );
    let lanes = CUBE_DIM_X as usize;
    let lane = UNIT_POS_X as usize;
    let row = UNIT_POS_Y as usize;
    let parts = CUBE_COUNT_X as usize;
    let t = CUBE_POS_Y as usize;
    let c = t * lanes + lane;
    let c_n = x.shape(1);
    let width = width as usize;
    if last_to_arrive(counter, t, parts) {
        merge_tile(partial, &mut f, c, c_n, parts, width, false);
        if row == 0 && c < c_n {
            let v = lane * width;
            let at_beta = c * d_beta.stride(0);
            let at_gamma = c * d_gamma.stride(0);
            d_beta[at_beta] = f[v];
            d_gamma[at_gamma] = f[v + FIELD];
        }
        if UNIT_POS == 0 {
            counter[t].fetch_add(rewind);
        }
    }
}

/// `batch_norm_nhwc::statistics` in one launch, with its partial buffer and its split
/// `(lanes, rows, tiles, parts)`: the same outputs and bits.
pub fn statistics(
    x: &CubeTensor,
    partial: CubeTensor,
    (lanes, rows, tiles, parts): (usize, usize, usize, usize),
    [running_mean, running_var]: [CubeTensor; 2],
    [mean, var, new_mean, new_var]: [CubeTensor; 4],
    momentum: f32,
) -> [CubeTensor; 4] {
    assert!(
        tiles <= COUNTERS,
        "batch norm: {tiles} channel tiles exceed the counters"
    );
    let client = x.client.clone();
    // SAFETY: as in `batch_norm_nhwc::statistics`; the counters hold `COUNTERS ≥ tiles` values,
    // zero at every launch's start (the last cube of each tile adds its own back round to
    // zero), and the last cube reads the partials only after every cube of its tile published
    // them.
    unsafe {
        stats_single_kernel::launch_unchecked(
            &client,
            CubeCount::Static(parts as u32, tiles as u32, 1),
            CubeDim::new_2d(lanes as u32, rows as u32),
            x.clone().into_tensor_arg(),
            partial.into_tensor_arg(),
            arrivals(x).into_tensor_arg(),
            running_mean.into_tensor_arg(),
            running_var.into_tensor_arg(),
            mean.clone().into_tensor_arg(),
            var.clone().into_tensor_arg(),
            new_mean.clone().into_tensor_arg(),
            new_var.clone().into_tensor_arg(),
            momentum,
            rewind(parts),
            WIDTH as u32,
            UNITS,
        );
    }
    [mean, var, new_mean, new_var]
}

/// `batch_norm_nhwc::grad_sums` in one launch, with its partial buffer and split, into
/// `d_gamma` and `d_beta`; the last argument is `(act, grad_dense)`.
pub fn grad_sums(
    [x, grad]: [&CubeTensor; 2],
    partial: CubeTensor,
    (lanes, rows, tiles, parts): (usize, usize, usize, usize),
    [mean, var, gamma, beta]: [&CubeTensor; 4],
    [d_gamma, d_beta]: [CubeTensor; 2],
    epsilon: f32,
    (act, grad_dense): (bool, bool),
) -> [CubeTensor; 2] {
    assert!(
        tiles <= COUNTERS,
        "batch norm: {tiles} channel tiles exceed the counters"
    );
    let client = x.client.clone();
    // SAFETY: as in `statistics` above and `batch_norm_nhwc::grad_sums`.
    unsafe {
        grad_single_kernel::launch_unchecked(
            &client,
            CubeCount::Static(parts as u32, tiles as u32, 1),
            CubeDim::new_2d(lanes as u32, rows as u32),
            x.clone().into_tensor_arg(),
            grad.clone().into_tensor_arg(),
            mean.clone().into_tensor_arg(),
            var.clone().into_tensor_arg(),
            gamma.clone().into_tensor_arg(),
            beta.clone().into_tensor_arg(),
            partial.into_tensor_arg(),
            arrivals(x).into_tensor_arg(),
            d_gamma.clone().into_tensor_arg(),
            d_beta.clone().into_tensor_arg(),
            epsilon,
            rewind(parts),
            WIDTH as u32,
            UNITS,
            act,
            grad_dense,
        );
    }
    [d_gamma, d_beta]
}

#[cfg(test)]
mod tests {
    use super::super::compile_check::{compiles, device, tensor};
    use super::*;

    /// Both kernels compile for CUDA (CubeCL's IR verification included) on a machine without
    /// a GPU: the GPU rejected them while the merge's tree counter started from a constant
    /// (docs/perf_log.md AZ1), and this test fails the same way with it.
    #[test]
    fn one_launch_kernels_compile_for_cuda_without_a_device() {
        let (props, target) = device();
        let (count, dim) = (CubeCount::Static(4, 2, 1), CubeDim::new_2d(32, 8));
        let stats = stats_single_kernel::create_dummy_kernel(
            props.clone(),
            target.clone(),
            count.clone(),
            dim,
            tensor(&[2, 40, 8, 8]),
            tensor(&[40 * 4 * 3]),
            tensor(&[COUNTERS]),
            tensor(&[40]),
            tensor(&[40]),
            tensor(&[40]),
            tensor(&[40]),
            tensor(&[40]),
            tensor(&[40]),
            0.03f32,
            0u32,
            WIDTH as u32,
            UNITS,
        );
        compiles(stats.define());
        for (act, grad_dense) in [(true, true), (false, false)] {
            let grad = grad_single_kernel::create_dummy_kernel(
                props.clone(),
                target.clone(),
                count.clone(),
                dim,
                tensor(&[2, 40, 8, 8]),
                tensor(&[2, 40, 8, 8]),
                tensor(&[40]),
                tensor(&[40]),
                tensor(&[40]),
                tensor(&[40]),
                tensor(&[40 * 4 * 2]),
                tensor(&[COUNTERS]),
                tensor(&[40]),
                tensor(&[40]),
                1e-3f32,
                0u32,
                WIDTH as u32,
                UNITS,
                act,
                grad_dense,
            );
            compiles(grad.define());
        }
    }
}
