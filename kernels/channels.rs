//! Channel-layout kernels of our convolutions (docs/kernels.md):
//! - [`channels_last`]: a tensor cast to the convolution's dtype, laid out channels-last and
//!   zero-padded (or cropped) to a channel count, in one launch. CubeCL's implicit GEMM reads its
//!   operands channels-last and picks its vector width from the channel count: with 85 channels
//!   (the pose head's keypoint branch) it ran unvectorised at ~7 TFLOP/s, 10 ms of a seed-shape
//!   step on the H200. Padding to a multiple of 8 adds only zero terms to every sum. The same
//!   launch replaces the cast and the channels-last copy the GEMM made of each operand. An
//!   NCHW input read one unit per output value loads 32 channels `H·W` apart per warp;
//!   [`choose_tiled`] transposes it through shared-memory tiles instead.
//!   [`dilated_channels_last`] also spreads the values out by a stride, with zeros between:
//!   a strided convolution's output gradient as its stride-1 twin's.
//! - [`channel_sums`]: `Σ` over N, H, W of every channel, the gradient of a per-channel bias, as a
//!   fixed split and tree (deterministic, no atomics) in two launches, where Burn's broadcast
//!   backward took three strided reductions.

// The kernels' arithmetic stays in the forms CubeCL's frontend expands (`(m + parts - 1) / parts`,
// `a % b == 0`), not clippy's rewrites.
#![allow(clippy::manual_div_ceil, clippy::manual_is_multiple_of)]

// `#[cube]` expands to `cubecl::…` paths.
use burn::cubecl;
use burn::tensor::{DType, Shape};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::ops::{permute, permute_nhwc_to_nchw};
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;
use cubecl::{CubeCount, CubeDim, calculate_cube_count_elemwise};

// The transposing casts' tiles are the BatchNorm tile kernels' (32 × 32 values, cubes of
// 32 × 8 units, rows one longer than a tile so that a warp reading a column hits 32 banks).
use super::fused_bn_tiles::{PITCH, ROWS, TILE};
use super::tree::{UNITS, parts, tree_sum};
use std::sync::atomic::{AtomicBool, Ordering};

static TILED: AtomicBool = AtomicBool::new(false);

/// Whether [`channels_last`] transposes an input whose pixels lie in rows (NCHW) through
/// shared-memory tiles ([`channels_last_tiled_kernel`]; `bench-step --tiled-casts true`) or
/// one unit per value (`false`, the default: the tiles measured slower on the seed step's
/// casts, docs/perf_log.md BO3). The same values either way.
pub fn choose_tiled(on: bool) {
    TILED.store(on, Ordering::Relaxed);
}

/// `x` `[N, C, H, W]` (any float dtype, any strides) as a `[n, channels, H, W]` tensor of
/// `dtype` whose memory is channels-last (`[n, H, W, channels]`, contiguous): values cast,
/// zero where `n` or `channels` exceeds `x`'s, cropped where smaller.
pub fn channels_last(x: CubeTensor, n: usize, channels: usize, dtype: DType) -> CubeTensor {
    let s = x.meta.shape();
    assert_eq!(
        s.num_dims(),
        4,
        "channels_last: expects [N, C, H, W], got {s:?}"
    );
    let size = [s[2], s[3]];
    dilated_channels_last(x, n, channels, dtype, [1, 1], size)
}

/// One unit per output value, in the output's memory order (`[N', H', W', C']`, channels
/// fastest): `x[n, c, h, w]` cast, or zero where `n` or `c` lies beyond `x`; when `dilated`,
/// `x[n, c, h / s_h, w / s_w]` where `h` and `w` are multiples of the strides and the source
/// lies inside `x`, else zero. The stride-1 cast (every convolution operand) compiles without
/// the dilated case's divisions by the strides, which cost it ~1 µs a run on the H200
/// (docs/perf_log.md AP3).
#[cube(launch_unchecked)]
fn channels_last_kernel<I: Float, O: Float>(
    x: &Tensor<I>,
    out: &mut Tensor<O>,
    stride_h: u32,
    stride_w: u32,
    #[comptime] dilated: bool,
    #[define(I, O)] _dtypes: [ElemType; 2],
) {
    let c_n = out.shape(1);
    let h = out.shape(2);
    let w = out.shape(3);
    if ABSOLUTE_POS >= out.shape(0) * c_n * h * w {
        terminate!();
    }
    let mut rest = ABSOLUTE_POS;
    let c = rest % c_n;
    rest /= c_n;
    let ow = rest % w;
    rest /= w;
    let oh = rest % h;
    let n = rest / h;
    let dst = n * out.stride(0) + c * out.stride(1) + oh * out.stride(2) + ow * out.stride(3);
    let mut v = O::from_int(0);
    if dilated {
        let (sh, sw) = (stride_h as usize, stride_w as usize);
        let (xh, xw) = (oh / sh, ow / sw);
        if n < x.shape(0)
            && c < x.shape(1)
            && oh % sh == 0
            && ow % sw == 0
            && xh < x.shape(2)
            && xw < x.shape(3)
        {
            let src = n * x.stride(0) + c * x.stride(1) + xh * x.stride(2) + xw * x.stride(3);
            v = O::cast_from(x[src]);
        }
    } else if n < x.shape(0) && c < x.shape(1) {
        let src = n * x.stride(0) + c * x.stride(1) + oh * x.stride(2) + ow * x.stride(3);
        v = O::cast_from(x[src]);
    }
    out[dst] = v;
}

/// [`channels_last_kernel`]'s stride-1 value for every unit of `out`, written twice: into
/// `out` and into `swapped`, a `[C', O', kh, kw]` tensor (a convolution weight's data-gradient
/// operand) at `(c, n, h, w)`.
#[cube(launch_unchecked, create_dummy_kernel)]
fn weight_operands_kernel<I: Float, O: Float>(
    x: &Tensor<I>,
    out: &mut Tensor<O>,
    swapped: &mut Tensor<O>,
    #[define(I, O)] _dtypes: [ElemType; 2],
) {
    let c_n = out.shape(1);
    let h = out.shape(2);
    let w = out.shape(3);
    if ABSOLUTE_POS >= out.shape(0) * c_n * h * w {
        terminate!();
    }
    let mut rest = ABSOLUTE_POS;
    let c = rest % c_n;
    rest /= c_n;
    let ow = rest % w;
    rest /= w;
    let oh = rest % h;
    let n = rest / h;
    let mut v = O::from_int(0);
    if n < x.shape(0) && c < x.shape(1) {
        let src = n * x.stride(0) + c * x.stride(1) + oh * x.stride(2) + ow * x.stride(3);
        v = O::cast_from(x[src]);
    }
    let dst = n * out.stride(0) + c * out.stride(1) + oh * out.stride(2) + ow * out.stride(3);
    out[dst] = v;
    let at = c * swapped.stride(0)
        + n * swapped.stride(1)
        + oh * swapped.stride(2)
        + ow * swapped.stride(3);
    swapped[at] = v;
}

/// A convolution weight `[O, C, kh, kw]` (any float dtype, any strides) as both operands of our
/// BF16 kernel, in one launch: [`channels_last`]`(weight, o, c, dtype)` (the forward's), and
/// the same values with the channel axes swapped, `[c, o, kh, kw]` whose memory is
/// `[c, kh, kw, o]` (the data gradient's: its contiguous axis is the output channels, the data
/// gradient's K).
pub fn weight_operands(
    weight: CubeTensor,
    o: usize,
    c: usize,
    dtype: DType,
) -> (CubeTensor, CubeTensor) {
    let s = weight.meta.shape();
    assert_eq!(
        s.num_dims(),
        4,
        "weight_operands: expects [O, C, kh, kw], got {s:?}"
    );
    let (kh, kw) = (s[2], s[3]);
    let (client, device) = (weight.client.clone(), weight.device.clone());
    let empty = |shape: [usize; 4]| {
        empty_device_contiguous_dtype(client.clone(), device.clone(), Shape::new(shape), dtype)
    };
    let out = permute_nhwc_to_nchw(empty([o, kh, kw, c]));
    let swapped = permute(empty([c, kh, kw, o]), &[0, 3, 1, 2]);
    let total = o * c * kh * kw;
    let dim = CubeDim::new(&client, total);
    let count = calculate_cube_count_elemwise(&client, total, dim);
    let types = [storage(weight.dtype), storage(dtype)];
    // SAFETY: each unit reads `weight` inside its shape by its strides and writes its own
    // element of `out` and of `swapped`, both of `out`'s element count, by their strides.
    unsafe {
        weight_operands_kernel::launch_unchecked(
            &client,
            count,
            dim,
            weight.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            swapped.clone().into_tensor_arg(),
            types,
        );
    }
    (out, swapped)
}

/// [`channels_last_kernel`]'s values (dilated or not) for an `x` whose pixels are contiguous
/// along its rows (`stride(3) = 1`: NCHW and its like), through shared memory. Cube `(p, t, n)`
/// reads `TILE` channels × `TILE` output pixels of image `n` along the pixels (a warp reads one
/// channel's neighbouring pixels) and writes them along the channels (a warp writes one pixel's
/// neighbouring channels), where one unit per output value read 32 channels `H·W` values apart
/// per warp. Each value is cast once, from `I` through FP32 (exact for the 16- and 32-bit
/// floats) to `O`, as [`channels_last_kernel`] casts it.
#[cube(launch_unchecked, create_dummy_kernel)]
fn channels_last_tiled_kernel<I: Float, O: Float>(
    x: &Tensor<I>,
    out: &mut Tensor<O>,
    stride_h: u32,
    stride_w: u32,
    #[comptime] dilated: bool,
    #[define(I, O)] _dtypes: [ElemType; 2],
) {
    let mut tile = Shared::<[f32]>::new_slice(TILE * PITCH);
    let lane = UNIT_POS_X as usize;
    let row = UNIT_POS_Y as usize;
    let p0 = CUBE_POS_X as usize * TILE;
    let c0 = CUBE_POS_Y as usize * TILE;
    let n = CUBE_POS_Z as usize;
    let w = out.shape(3);
    let hw = out.shape(2) * w;
    let p = p0 + lane;
    let (sh, sw) = (stride_h as usize, stride_w as usize);
    #[unroll]
    for r in 0..TILE / ROWS {
        let cl = row + r * ROWS;
        let c = c0 + cl;
        let mut v = 0.0f32;
        if p < hw && c < x.shape(1) && n < x.shape(0) {
            let (oh, ow) = (p / w, p % w);
            let base = n * x.stride(0) + c * x.stride(1);
            if dilated {
                let (xh, xw) = (oh / sh, ow / sw);
                if oh % sh == 0 && ow % sw == 0 && xh < x.shape(2) && xw < x.shape(3) {
                    v = f32::cast_from(x[base + xh * x.stride(2) + xw]);
                }
            } else if oh < x.shape(2) && ow < x.shape(3) {
                v = f32::cast_from(x[base + oh * x.stride(2) + ow]);
            }
        }
        tile[cl * PITCH + lane] = v;
    }
    sync_cube();
    let c = c0 + lane;
    #[unroll]
    for r in 0..TILE / ROWS {
        let pl = row + r * ROWS;
        let q = p0 + pl;
        if q < hw && c < out.shape(1) {
            let at = n * out.stride(0)
                + c * out.stride(1)
                + (q / w) * out.stride(2)
                + (q % w) * out.stride(3);
            out[at] = O::cast_from(tile[lane * PITCH + pl]);
        }
    }
}

/// [`channels_last`] of `x` zero-dilated by `stride`: a `[n, channels, size[0], size[1]]`
/// tensor of `dtype`, channels-last in memory, holding `x[.., i, j]` at `(i·s_h, j·s_w)` and
/// zeros elsewhere (also past `x`'s last row and column). The gradient of a strided
/// convolution's output, dilated so, is the output gradient of the stride-1 convolution it
/// subsamples: its data gradient is the strided one's.
pub fn dilated_channels_last(
    x: CubeTensor,
    n: usize,
    channels: usize,
    dtype: DType,
    stride: [usize; 2],
    size: [usize; 2],
) -> CubeTensor {
    let s = x.meta.shape();
    assert_eq!(s.num_dims(), 4, "dilated: expects [N, C, H, W], got {s:?}");
    assert!(
        (s[2] - 1) * stride[0] < size[0] && (s[3] - 1) * stride[1] < size[1],
        "dilated: {s:?} by {stride:?} does not fit {size:?}"
    );
    // Contiguous, not pitched rows (docs/kernels.md, "Output buffers").
    let out = permute_nhwc_to_nchw(empty_device_contiguous_dtype(
        x.client.clone(),
        x.device.clone(),
        Shape::new([n, size[0], size[1], channels]),
        dtype,
    ));
    let types = [storage(x.dtype), storage(dtype)];
    let client = x.client.clone();
    let xs = x.meta.strides();
    if TILED.load(Ordering::Relaxed) && xs[3] == 1 {
        let count = CubeCount::Static(
            (size[0] * size[1]).div_ceil(TILE) as u32,
            channels.div_ceil(TILE) as u32,
            n as u32,
        );
        // SAFETY: each unit reads `x` inside its shape (its pixels contiguous along a row,
        // checked above) and writes `out` inside its shape, both by their strides.
        unsafe {
            channels_last_tiled_kernel::launch_unchecked(
                &client,
                count,
                CubeDim::new_2d(TILE as u32, ROWS as u32),
                x.into_tensor_arg(),
                out.clone().into_tensor_arg(),
                stride[0] as u32,
                stride[1] as u32,
                stride != [1, 1],
                types,
            );
        }
        return out;
    }
    let total = n * channels * size[0] * size[1];
    let dim = CubeDim::new(&x.client, total);
    let count = calculate_cube_count_elemwise(&x.client, total, dim);
    // SAFETY: every write is bounded by the output's shape, every read by `x`'s, both through
    // their own strides.
    unsafe {
        channels_last_kernel::launch_unchecked(
            &client,
            count,
            dim,
            x.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            stride[0] as u32,
            stride[1] as u32,
            stride != [1, 1],
            types,
        );
    }
    out
}

fn storage(dtype: DType) -> ElemType {
    burn::backend::cubecl::dtype_to_storage_type(dtype)
}

/// Cube `(p, c)`: the sum of its share of channel `c` (values in N, H, W order) into
/// `partial[c·P + p]`.
#[cube(launch_unchecked)]
fn sum_partial_kernel(x: &Tensor<f32>, partial: &mut Tensor<f32>, #[comptime] units: usize) {
    let p = CUBE_POS_X as usize;
    let c = CUBE_POS_Y as usize;
    let parts = CUBE_COUNT_X as usize;
    let w = x.shape(3);
    let hw = x.shape(2) * w;
    let m = x.shape(0) * hw;
    let chunk = (m + parts - 1) / parts;
    let start = p * chunk;
    let mut end = start + chunk;
    if end > m {
        end = m;
    }
    let mut sum = 0.0f32;
    let mut j = start + UNIT_POS_X as usize;
    while j < end {
        let r = j % hw;
        let at = (j / hw) * x.stride(0)
            + c * x.stride(1)
            + (r / w) * x.stride(2)
            + (r % w) * x.stride(3);
        sum += x[at];
        j += units;
    }
    let total = tree_sum(sum, units);
    if UNIT_POS_X == 0 {
        partial[c * parts + p] = total;
    }
}

/// One unit per channel: its partials summed in order.
#[cube(launch_unchecked)]
fn sum_final_kernel(partial: &Tensor<f32>, out: &mut Tensor<f32>, parts: u32) {
    let c = ABSOLUTE_POS;
    if c >= out.shape(0) {
        terminate!();
    }
    let parts = parts as usize;
    let mut sum = 0.0f32;
    for p in 0..parts {
        sum += partial[c * parts + p];
    }
    out[c] = sum;
}

/// `Σ_{n,h,w} x[n, c, h, w]` of an FP32 `[N, C, H, W]` tensor (any strides), as `[C]`.
pub fn channel_sums(x: CubeTensor) -> CubeTensor {
    let s = x.meta.shape();
    assert_eq!(
        s.num_dims(),
        4,
        "channel_sums: expects [N, C, H, W], got {s:?}"
    );
    assert!(
        x.dtype == DType::F32,
        "channel_sums: f32 only, got {:?}",
        x.dtype
    );
    let (c, m) = (s[1], s[0] * s[2] * s[3]);
    let p = parts(m);
    let empty = |shape: Shape| {
        empty_device_contiguous_dtype(x.client.clone(), x.device.clone(), shape, DType::F32)
    };
    let partial = empty(Shape::new([c * p]));
    let out = empty(Shape::new([c]));
    let dim = CubeDim::new(&x.client, c);
    let count = calculate_cube_count_elemwise(&x.client, c, dim);
    let client = x.client.clone();
    // SAFETY: the partial buffer holds exactly C·P values; every read of `x` is bounded by its
    // shape and goes through its strides; the final kernel bounds its units by C.
    unsafe {
        sum_partial_kernel::launch_unchecked(
            &client,
            CubeCount::Static(p as u32, c as u32, 1),
            CubeDim::new_1d(UNITS as u32),
            x.into_tensor_arg(),
            partial.clone().into_tensor_arg(),
            UNITS,
        );
        sum_final_kernel::launch_unchecked(
            &client,
            count,
            dim,
            partial.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            p as u32,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::compile_check::{compiles, device, tensor};
    use super::*;
    use cubecl::ir::{ElemType, FloatKind};

    /// The tiled channels-last cast, dilated and not, compiles for CUDA on a machine without a
    /// GPU.
    #[test]
    fn tiled_cast_compiles_for_cuda_without_a_device() {
        let (props, target) = device();
        let kinds = [
            (FloatKind::F32, FloatKind::BF16, false),
            (FloatKind::F32, FloatKind::BF16, true),
            (FloatKind::BF16, FloatKind::F32, false),
        ];
        for (i, o, dilated) in kinds {
            let k = channels_last_tiled_kernel::create_dummy_kernel(
                props.clone(),
                target.clone(),
                CubeCount::Static(4, 3, 2),
                CubeDim::new_2d(TILE as u32, ROWS as u32),
                tensor(&[2, 85, 9, 13]),
                tensor(&[2, 88, 18, 26]),
                2,
                2,
                dilated,
                [ElemType::Float(i), ElemType::Float(o)],
            );
            compiles(k.define());
        }
    }

    /// The two-operand weight cast compiles for CUDA on a machine without a GPU (FP32 in,
    /// BF16 and F16 out).
    #[test]
    fn weight_operands_kernel_compiles_for_cuda_without_a_device() {
        let (props, target) = device();
        for kind in [FloatKind::BF16, FloatKind::F16] {
            let k = weight_operands_kernel::create_dummy_kernel(
                props.clone(),
                target.clone(),
                CubeCount::Static(4, 1, 1),
                CubeDim::new_1d(256),
                tensor(&[5, 3, 3, 3]),
                tensor(&[8, 8, 3, 3]),
                tensor(&[8, 8, 3, 3]),
                [ElemType::Float(FloatKind::F32), ElemType::Float(kind)],
            );
            compiles(k.define());
        }
    }
}
