//! The element-wise kernels of the fused BatchNorm + SiLU (`batch_norm.rs`) for a channels-last
//! input and an NCHW output: normalise + affine + SiLU forward, the input gradient backward.
//! `batch_norm.rs`'s kernels give each unit one value in NCHW order, so for a channels-last `x`
//! every load of a warp is `C` floats apart, and each unit spends three divisions finding its
//! value. Here a cube transposes a tile of 32 pixels × 32 channels through shared memory: it
//! reads the tile along the channels (one line per pixel), writes it along the pixels (one line
//! per channel), and finds its values with one division per unit. Every value is computed by
//! the same expression as in `batch_norm.rs` (its helpers), so the results are the same bits.
//!
//! Backward, the input gradient may go channels-last ([`choose_channels_last_grad`], off by
//! default): it is the convolution's output gradient, and the convolution's weight gradient reads
//! it in chunks of pixels per channel (`model::ops::wgrad`). From NCHW memory that view has a
//! chunk stride below its row stride, which cubek's matmul copies into a contiguous operand
//! first (one copy of the whole gradient per weight gradient); from channels-last memory it is a
//! transposed matrix the matmul reads as it lies. Each unit then writes its own values where it
//! computed them, with no transpose through shared memory. `batch_norm.rs` picks the layout.

// `#[cube]` expands to `cubecl::…` paths.
use burn::cubecl;
use burn::tensor::{DType, Shape};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::ops::permute_nhwc_to_nchw;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;
use cubecl::{CubeCount, CubeDim};
use std::sync::atomic::{AtomicBool, Ordering};

use super::fused_bn::{channel, grad_z, inv_std, sigmoid};
use super::fused_bn_nhwc::dense_channels_last;

/// Pixels and channels of a tile; a cube is `TILE × ROWS` units, each unit taking
/// `TILE / ROWS` values of the tile each way (also `channels.rs`'s transposing casts).
pub(super) const TILE: usize = 32;
pub(super) const ROWS: usize = 8;
/// A tile row in shared memory: one more than `TILE`, so the units of a warp reading a column
/// hit 32 different banks.
pub(super) const PITCH: usize = TILE + 1;

static CHANNELS_LAST_GRAD: AtomicBool = AtomicBool::new(true);

/// Whether the fused BatchNorm writes the input gradients of convolutions that take an operand
/// with a multiple of 4 channels channels-last (`true`, the default: on an H100 the weight
/// gradients' matmuls then read it without copies, docs/perf_log.md BI2) or NCHW (`false`;
/// `bench-step --bn-grad-channels-last false`). The same values either way.
pub fn choose_channels_last_grad(on: bool) {
    CHANNELS_LAST_GRAD.store(on, Ordering::Relaxed);
}

/// Whether the input gradient goes channels-last ([`choose_channels_last_grad`]).
pub fn channels_last_grad() -> bool {
    CHANNELS_LAST_GRAD.load(Ordering::Relaxed)
}

/// Whether the tile kernels take `x` (and, backward, `grad`) as inputs: each
/// [`dense_channels_last`].
pub fn takes_inputs(x: &CubeTensor, others: &[&CubeTensor]) -> bool {
    dense_channels_last(x) && others.iter().all(|t| dense_channels_last(t))
}

/// Whether the tile kernels take `x` (and, backward, `grad`) with output `out`: the inputs as
/// [`takes_inputs`], `out` `[N, C, H, W]` with contiguous rows of `H·W` pixels.
pub fn takes(x: &CubeTensor, others: &[&CubeTensor], out: &CubeTensor) -> bool {
    let s = out.meta.strides();
    let w = out.meta.shape()[3];
    takes_inputs(x, others) && s[3] == 1 && s[2] == w
}

/// An uninitialised `[N, C, H, W]` FP32 tensor like `x`, dense channels-last.
pub fn empty_channels_last(x: &CubeTensor) -> CubeTensor {
    let s = x.meta.shape();
    permute_nhwc_to_nchw(empty_device_contiguous_dtype(
        x.client.clone(),
        x.device.clone(),
        Shape::new([s[0], s[2], s[3], s[1]]),
        DType::F32,
    ))
}

/// Writes tile `(pixel p0 + lane, channel c0 + row + r·ROWS)` from shared memory to `out` at
/// `n·stride(0) + c·stride(1) + q` (`q` the pixel within its image).
#[cube]
fn store(tile: &Shared<[f32]>, out: &mut Tensor<f32>, p0: usize, c0: usize, m: usize) {
    let lane = UNIT_POS_X as usize;
    let row = UNIT_POS_Y as usize;
    let hw = out.shape(2) * out.shape(3);
    let c_n = out.shape(1);
    let j = p0 + lane;
    if j < m {
        let n = j / hw;
        let q = j % hw;
        #[unroll]
        for r in 0..TILE / ROWS {
            let cl = row + r * ROWS;
            let c = c0 + cl;
            if c < c_n {
                let at = n * out.stride(0) + c * out.stride(1) + q;
                out[at] = tile[cl * PITCH + lane];
            }
        }
    }
}

/// Fills `tile` (lanes along the channels, rows along the pixels) with `z = (x − mean) ·
/// inv_std · γ + β`, then SiLU when `act`, of pixels `p0..p0 + TILE`, channels `c0..c0 + TILE`;
/// each unit writes only its own lane.
#[cube]
#[allow(clippy::too_many_arguments)]
fn apply_into_tile(
    x: &Tensor<f32>,
    mean: &Tensor<f32>,
    var: &Tensor<f32>,
    gamma: &Tensor<f32>,
    beta: &Tensor<f32>,
    tile: &mut Shared<[f32]>,
    p0: usize,
    c0: usize,
    m: usize,
    epsilon: f32,
    #[comptime] act: bool,
) {
    let lane = UNIT_POS_X as usize;
    let row = UNIT_POS_Y as usize;
    let pixel = x.stride(3);
    // Read: lanes along the channels, rows along the pixels.
    let c = c0 + lane;
    if c < x.shape(1) {
        let mu = channel(mean, c);
        let is = inv_std(var, c, epsilon);
        let ga = channel(gamma, c);
        let be = channel(beta, c);
        #[unroll]
        for r in 0..TILE / ROWS {
            let pl = row + r * ROWS;
            let j = p0 + pl;
            if j < m {
                let xv = x[j * pixel + c];
                let xhat = (xv - mu) * is;
                let z = xhat * ga + be;
                let mut y = z;
                if act {
                    y = z * sigmoid(z);
                }
                tile[lane * PITCH + pl] = y;
            }
        }
    }
}

/// Writes the unit's own lane of `tile` (channel `c0 + lane`, pixels `p0..p0 + TILE`), cast to
/// `O`, to `operand`: `[N, C', H, W]` dense channels-last (`C' ≥ C` within the last channel
/// tile), zero in channels `C..C'`; the values `kernels/channels.rs`'s `channels_last` would
/// make from the tile's FP32 values.
#[cube]
fn lane_into_operand<O: Float>(
    tile: &Shared<[f32]>,
    operand: &mut Tensor<O>,
    channels: usize,
    p0: usize,
    c0: usize,
    m: usize,
) {
    let lane = UNIT_POS_X as usize;
    let row = UNIT_POS_Y as usize;
    let c = c0 + lane;
    if c < operand.shape(1) {
        let real = c < channels;
        #[unroll]
        for r in 0..TILE / ROWS {
            let pl = row + r * ROWS;
            let j = p0 + pl;
            if j < m {
                let at = j * operand.stride(3) + c;
                if real {
                    operand[at] = O::cast_from(tile[lane * PITCH + pl]);
                } else {
                    operand[at] = O::from_int(0);
                }
            }
        }
    }
}

/// Cube `(pixel tile, channel tile)`: [`apply_into_tile`] into `out`.
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
fn apply_tile_kernel(
    x: &Tensor<f32>,
    mean: &Tensor<f32>,
    var: &Tensor<f32>,
    gamma: &Tensor<f32>,
    beta: &Tensor<f32>,
    out: &mut Tensor<f32>,
    epsilon: f32,
    #[comptime] act: bool,
) {
    let p0 = CUBE_POS_X as usize * TILE;
    let c0 = CUBE_POS_Y as usize * TILE;
    let m = x.shape(0) * x.shape(2) * x.shape(3);
    let mut tile = Shared::<[f32]>::new_slice(TILE * PITCH);
    apply_into_tile(
        x, mean, var, gamma, beta, &mut tile, p0, c0, m, epsilon, act,
    );
    sync_cube();
    store(&tile, out, p0, c0, m);
}

/// [`apply_tile_kernel`], each value also going, cast to `O`, to `xp`, the next convolution's
/// input operand ([`lane_into_operand`]).
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
fn apply_operand_kernel<O: Float>(
    x: &Tensor<f32>,
    mean: &Tensor<f32>,
    var: &Tensor<f32>,
    gamma: &Tensor<f32>,
    beta: &Tensor<f32>,
    out: &mut Tensor<f32>,
    xp: &mut Tensor<O>,
    epsilon: f32,
    #[comptime] act: bool,
    #[define(O)] _dtype: ElemType,
) {
    let p0 = CUBE_POS_X as usize * TILE;
    let c0 = CUBE_POS_Y as usize * TILE;
    let m = x.shape(0) * x.shape(2) * x.shape(3);
    let mut tile = Shared::<[f32]>::new_slice(TILE * PITCH);
    apply_into_tile(
        x, mean, var, gamma, beta, &mut tile, p0, c0, m, epsilon, act,
    );
    lane_into_operand::<O>(&tile, xp, x.shape(1), p0, c0, m);
    sync_cube();
    store(&tile, out, p0, c0, m);
}

/// Fills `tile` (lanes along the channels, rows along the pixels) with the input gradient
/// `dx = γ · inv_std · (g_z − dβ / M − x̂ · dγ / M)` of pixels `p0..p0 + TILE`, channels
/// `c0..c0 + TILE`; each unit writes only its own lane.
#[cube]
#[allow(clippy::too_many_arguments)]
fn grad_x_into_tile(
    x: &Tensor<f32>,
    grad: &Tensor<f32>,
    mean: &Tensor<f32>,
    var: &Tensor<f32>,
    gamma: &Tensor<f32>,
    beta: &Tensor<f32>,
    d_gamma: &Tensor<f32>,
    d_beta: &Tensor<f32>,
    tile: &mut Shared<[f32]>,
    p0: usize,
    c0: usize,
    m: usize,
    epsilon: f32,
    #[comptime] act: bool,
) {
    let lane = UNIT_POS_X as usize;
    let row = UNIT_POS_Y as usize;
    let pixel = x.stride(3);
    let g_pixel = grad.stride(3);
    let count = f32::cast_from(m);
    let c = c0 + lane;
    if c < x.shape(1) {
        let is = inv_std(var, c, epsilon);
        let ga = channel(gamma, c);
        let mu = channel(mean, c);
        let be = channel(beta, c);
        let mean_g = channel(d_beta, c) / count;
        let mean_gx = channel(d_gamma, c) / count;
        #[unroll]
        for r in 0..TILE / ROWS {
            let pl = row + r * ROWS;
            let j = p0 + pl;
            if j < m {
                let xv = x[j * pixel + c];
                let gv = grad[j * g_pixel + c];
                let xhat = (xv - mu) * is;
                let gz = grad_z(gv, xhat * ga + be, act);
                tile[lane * PITCH + pl] = (ga * is) * ((gz - mean_g) - xhat * mean_gx);
            }
        }
    }
}

/// Cube `(pixel tile, channel tile)`: the input gradient ([`grad_x_into_tile`]) into `dx`.
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
fn grad_x_tile_kernel(
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
    #[comptime] dx_channels_last: bool,
) {
    let p0 = CUBE_POS_X as usize * TILE;
    let c0 = CUBE_POS_Y as usize * TILE;
    let m = x.shape(0) * x.shape(2) * x.shape(3);
    let mut tile = Shared::<[f32]>::new_slice(TILE * PITCH);
    grad_x_into_tile(
        x, grad, mean, var, gamma, beta, d_gamma, d_beta, &mut tile, p0, c0, m, epsilon, act,
    );
    write_grad(&tile, dx, p0, c0, m, dx_channels_last);
}

/// `dx` from `tile`: each unit its own lane where `dx` is dense channels-last, else through
/// the tile to NCHW rows ([`store`]).
#[cube]
fn write_grad(
    tile: &Shared<[f32]>,
    dx: &mut Tensor<f32>,
    p0: usize,
    c0: usize,
    m: usize,
    #[comptime] dx_channels_last: bool,
) {
    if dx_channels_last {
        let channels = dx.shape(1);
        lane_into_operand::<f32>(tile, dx, channels, p0, c0, m);
    } else {
        sync_cube();
        store(tile, dx, p0, c0, m);
    }
}

/// [`grad_x_tile_kernel`], each value also going, cast to `O`, to `dxp`: `[N, C', H, W]`
/// (`C' ≥ C`, within the last channel tile), dense channels-last, zero in channels `C..C'`, as
/// `kernels/channels.rs`'s `channels_last` would make it from `dx` (the same cast of the same
/// FP32 value, read back from the unit's own lane of the tile).
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
fn grad_x_operand_kernel<O: Float>(
    x: &Tensor<f32>,
    grad: &Tensor<f32>,
    mean: &Tensor<f32>,
    var: &Tensor<f32>,
    gamma: &Tensor<f32>,
    beta: &Tensor<f32>,
    d_gamma: &Tensor<f32>,
    d_beta: &Tensor<f32>,
    dx: &mut Tensor<f32>,
    dxp: &mut Tensor<O>,
    epsilon: f32,
    #[comptime] act: bool,
    #[comptime] dx_channels_last: bool,
    #[define(O)] _dtype: ElemType,
) {
    let p0 = CUBE_POS_X as usize * TILE;
    let c0 = CUBE_POS_Y as usize * TILE;
    let m = x.shape(0) * x.shape(2) * x.shape(3);
    let mut tile = Shared::<[f32]>::new_slice(TILE * PITCH);
    grad_x_into_tile(
        x, grad, mean, var, gamma, beta, d_gamma, d_beta, &mut tile, p0, c0, m, epsilon, act,
    );
    lane_into_operand::<O>(&tile, dxp, x.shape(1), p0, c0, m);
    write_grad(&tile, dx, p0, c0, m, dx_channels_last);
}

fn cubes(x: &CubeTensor) -> (CubeCount, CubeDim) {
    let s = x.meta.shape();
    let m = s[0] * s[2] * s[3];
    (
        CubeCount::Static(m.div_ceil(TILE) as u32, s[1].div_ceil(TILE) as u32, 1),
        CubeDim::new_2d(TILE as u32, ROWS as u32),
    )
}

/// `out = (x − mean) · inv_std · γ + β`, then SiLU when `act`, for `x` and `out` as [`takes`];
/// with `operand`, also into it (see [`operand_for`]).
#[allow(clippy::too_many_arguments)]
pub fn normalise(
    x: CubeTensor,
    mean: CubeTensor,
    var: CubeTensor,
    gamma: CubeTensor,
    beta: CubeTensor,
    out: &CubeTensor,
    operand: Option<&CubeTensor>,
    epsilon: f32,
    act: bool,
) {
    let (count, dim) = cubes(&x);
    let client = x.client.clone();
    // SAFETY: every read and write is bounded by the shapes (pixels below M, channels below C)
    // and follows the strides [`takes`] checked; `operand` is [`operand_for`]'s, dense
    // channels-last with at most a tile's reach of channels, written only below its shape.
    unsafe {
        match operand {
            None => apply_tile_kernel::launch_unchecked(
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
            ),
            Some(xp) => apply_operand_kernel::launch_unchecked(
                &client,
                count,
                dim,
                x.into_tensor_arg(),
                mean.into_tensor_arg(),
                var.into_tensor_arg(),
                gamma.into_tensor_arg(),
                beta.into_tensor_arg(),
                out.clone().into_tensor_arg(),
                xp.clone().into_tensor_arg(),
                epsilon,
                act,
                burn::backend::cubecl::dtype_to_storage_type(xp.dtype),
            ),
        }
    }
}

/// The input gradient of the fused BatchNorm + SiLU into `dx`, for `x`, `grad` and `dx` as
/// [`takes`]; with `operand`, also into it (see [`operand_for`]).
#[allow(clippy::too_many_arguments)]
pub fn grad_x(
    x: CubeTensor,
    grad: CubeTensor,
    mean: CubeTensor,
    var: CubeTensor,
    gamma: CubeTensor,
    beta: CubeTensor,
    d_gamma: CubeTensor,
    d_beta: CubeTensor,
    dx: &CubeTensor,
    operand: Option<&CubeTensor>,
    epsilon: f32,
    act: bool,
) {
    let (count, dim) = cubes(&x);
    let client = x.client.clone();
    let dx_channels_last = dense_channels_last(dx);
    // SAFETY: as in `normalise`; `operand` is [`operand_for`]'s, dense channels-last with at
    // most a tile's reach of channels, written only below its shape; a channels-last `dx` is
    // written as `operand` is.
    unsafe {
        match operand {
            None => grad_x_tile_kernel::launch_unchecked(
                &client,
                count,
                dim,
                x.into_tensor_arg(),
                grad.into_tensor_arg(),
                mean.into_tensor_arg(),
                var.into_tensor_arg(),
                gamma.into_tensor_arg(),
                beta.into_tensor_arg(),
                d_gamma.into_tensor_arg(),
                d_beta.into_tensor_arg(),
                dx.clone().into_tensor_arg(),
                epsilon,
                act,
                dx_channels_last,
            ),
            Some(dxp) => grad_x_operand_kernel::launch_unchecked(
                &client,
                count,
                dim,
                x.into_tensor_arg(),
                grad.into_tensor_arg(),
                mean.into_tensor_arg(),
                var.into_tensor_arg(),
                gamma.into_tensor_arg(),
                beta.into_tensor_arg(),
                d_gamma.into_tensor_arg(),
                d_beta.into_tensor_arg(),
                dx.clone().into_tensor_arg(),
                dxp.clone().into_tensor_arg(),
                epsilon,
                act,
                dx_channels_last,
                burn::backend::cubecl::dtype_to_storage_type(dxp.dtype),
            ),
        }
    }
}

/// The buffer [`normalise`] writes `out` into as the next convolution's GEMM takes its input,
/// or [`grad_x`] writes `dx` into as the data gradient's GEMM takes it: `[N, channels, H, W]`
/// of `dtype`, channels-last, where `channels` (the padded count) lies within the last channel
/// tile; `None` where it does not.
pub fn operand_for(x: &CubeTensor, channels: usize, dtype: DType) -> Option<CubeTensor> {
    let s = x.meta.shape();
    let c = s[1];
    if channels < c || channels > c.div_ceil(TILE) * TILE {
        return None;
    }
    Some(permute_nhwc_to_nchw(empty_device_contiguous_dtype(
        x.client.clone(),
        x.device.clone(),
        Shape::new([s[0], s[2], s[3], channels]),
        dtype,
    )))
}

#[cfg(test)]
mod tests {
    use super::super::compile_check::{compiles, device, tensor};
    use super::*;
    use cubecl::ir::{ElemType, FloatKind};

    /// The tile kernels, with and without an operand, compile for CUDA on a machine without a
    /// GPU.
    #[test]
    fn tile_kernels_compile_for_cuda_without_a_device() {
        let (props, target) = device();
        let cubes = || {
            (
                CubeCount::Static(4, 2, 1),
                CubeDim::new_2d(TILE as u32, ROWS as u32),
            )
        };
        let x = || tensor(&[2, 51, 8, 8]);
        let c = || tensor(&[51]);
        for (act, dx_channels_last) in [(true, true), (true, false), (false, true), (false, false)]
        {
            let (count, dim) = cubes();
            let k = grad_x_tile_kernel::create_dummy_kernel(
                props.clone(),
                target.clone(),
                count,
                dim,
                x(),
                x(),
                c(),
                c(),
                c(),
                c(),
                c(),
                c(),
                x(),
                1e-3f32,
                act,
                dx_channels_last,
            );
            compiles(k.define());
            let (count, dim) = cubes();
            let k = apply_tile_kernel::create_dummy_kernel(
                props.clone(),
                target.clone(),
                count,
                dim,
                x(),
                c(),
                c(),
                c(),
                c(),
                x(),
                1e-3f32,
                act,
            );
            compiles(k.define());
            for kind in [FloatKind::BF16, FloatKind::F16] {
                let (count, dim) = cubes();
                let k = apply_operand_kernel::create_dummy_kernel(
                    props.clone(),
                    target.clone(),
                    count,
                    dim,
                    x(),
                    c(),
                    c(),
                    c(),
                    c(),
                    x(),
                    tensor(&[2, 56, 8, 8]),
                    1e-3f32,
                    act,
                    ElemType::Float(kind),
                );
                compiles(k.define());
                let (count, dim) = cubes();
                let k = grad_x_operand_kernel::create_dummy_kernel(
                    props.clone(),
                    target.clone(),
                    count,
                    dim,
                    x(),
                    x(),
                    c(),
                    c(),
                    c(),
                    c(),
                    c(),
                    c(),
                    x(),
                    tensor(&[2, 56, 8, 8]),
                    1e-3f32,
                    act,
                    dx_channels_last,
                    ElemType::Float(kind),
                );
                compiles(k.define());
            }
        }
    }
}
