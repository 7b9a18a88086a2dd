//! The columns of a convolution's weight gradient (`model::ops::wgrad`) in one launch: for each
//! kernel tap, the input value it multiplies at every output position, zero in the padding, in
//! FP32 (or BF16 for reduced operands, `model::ops::wgrad::choose_reduced`). The
//! tensor-operation version (a zero-padded copy, one strided slice per tap, a concatenation,
//! casts) took ~20 launches per 3×3 convolution; the values are copies, so both give the same
//! bits.

// `#[cube]` expands to `cubecl::…` paths.
use burn::backend::ops::ConvOptions;
use burn::cubecl;
use burn::tensor::{DType, Shape};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;
use cubecl::{CubeDim, calculate_cube_count_elemwise};

/// One unit per input channel and output position, writing all `kh·kw` taps of
/// `[n, p / L, c·kh·kw + tap, p % L]` (`L` = `chunk`, the positions of one chunk):
/// `x[n, c, oh·sh + i·dh − top, ow·sw + j·dw − left]` for tap `(i, j)` and `p = (oh, ow)`, or zero
/// outside the input. One unit per tap spent most of its time on the integer divisions that
/// locate it; here they are paid once per `kh·kw` values. Neighbouring units take neighbouring
/// positions, so for every tap they write neighbouring addresses. (Neighbouring channels, with
/// the memory `[n, p, c, tap]` that makes the weight gradient's matmul operand contiguous, were
/// slower: H200, 2026-12-04, docs/perf_log.md AJ1.)
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn columns_kernel<O: Float>(
    x: &Tensor<f32>,
    out: &mut Tensor<O>,
    kernel_h: u32,
    kernel_w: u32,
    out_w: u32,
    chunk: u32,
    stride_h: u32,
    stride_w: u32,
    dilation_h: u32,
    dilation_w: u32,
    top: u32,
    left: u32,
    #[define(O)] _dtype: ElemType,
) {
    let chunk = chunk as usize;
    let positions = out.shape(1) * chunk;
    let taps = (kernel_h * kernel_w) as usize;
    let channels = out.shape(2) / taps;
    if ABSOLUTE_POS >= out.shape(0) * channels * positions {
        terminate!();
    }
    let p = ABSOLUTE_POS % positions;
    let rest = ABSOLUTE_POS / positions;
    let c = rest % channels;
    let n = rest / channels;
    let ow_n = out_w as usize;
    let row0 = (p / ow_n) * (stride_h as usize);
    let col0 = (p % ow_n) * (stride_w as usize);
    let top = top as usize;
    let left = left as usize;
    let base = n * x.stride(0) + c * x.stride(1);
    let mut dst = n * out.stride(0)
        + (p / chunk) * out.stride(1)
        + c * taps * out.stride(2)
        + (p % chunk) * out.stride(3);
    for i in 0..kernel_h as usize {
        let row = row0 + i * (dilation_h as usize);
        for j in 0..kernel_w as usize {
            let col = col0 + j * (dilation_w as usize);
            let mut v = 0.0f32;
            if row >= top && col >= left {
                let y = row - top;
                let z = col - left;
                if y < x.shape(2) && z < x.shape(3) {
                    v = x[base + y * x.stride(2) + z * x.stride(3)];
                }
            }
            out[dst] = O::cast_from(v);
            dst += out.stride(2);
        }
    }
}

/// `[N, C, H, W]` (any float dtype, any strides) → `[N, S, C·kh·kw, Ho·Wo / S]` in FP32,
/// contiguous, for `S = chunks` (which divides `Ho·Wo`): the columns of each run of `Ho·Wo / S`
/// consecutive output positions together, as the weight gradient's matmul reads them.
pub fn columns(
    x: CubeTensor,
    kernel: [usize; 2],
    out: [usize; 2],
    chunks: usize,
    options: &ConvOptions<2>,
) -> CubeTensor {
    columns_in(x, kernel, out, chunks, options, DType::F32)
}

/// [`columns`] in BF16 (each value rounded once, from FP32).
pub fn columns_bf16(
    x: CubeTensor,
    kernel: [usize; 2],
    out: [usize; 2],
    chunks: usize,
    options: &ConvOptions<2>,
) -> CubeTensor {
    columns_in(x, kernel, out, chunks, options, DType::BF16)
}

fn columns_in(
    x: CubeTensor,
    kernel: [usize; 2],
    out: [usize; 2],
    chunks: usize,
    options: &ConvOptions<2>,
    dtype: DType,
) -> CubeTensor {
    let x = if x.dtype == DType::F32 {
        x
    } else {
        burn_cubecl::kernel::cast(x, DType::F32)
    };
    let s = x.meta.shape();
    let (n, c) = (s[0], s[1]);
    let (taps, positions) = (kernel[0] * kernel[1], out[0] * out[1]);
    // Contiguous, not pitched rows (docs/kernels.md, "Output buffers").
    let cols = empty_device_contiguous_dtype(
        x.client.clone(),
        x.device.clone(),
        Shape::new([n, chunks, c * taps, positions / chunks]),
        dtype,
    );
    let total = n * c * positions;
    let dim = CubeDim::new(&x.client, total);
    let count = calculate_cube_count_elemwise(&x.client, total, dim);
    let client = x.client.clone();
    let u = |v: usize| v as u32;
    // SAFETY: every index is bounds-checked against the shapes above, and both tensors are
    // addressed through their own strides.
    unsafe {
        columns_kernel::launch_unchecked(
            &client,
            count,
            dim,
            x.into_tensor_arg(),
            cols.clone().into_tensor_arg(),
            u(kernel[0]),
            u(kernel[1]),
            u(out[1]),
            u(positions / chunks),
            u(options.stride[0]),
            u(options.stride[1]),
            u(options.dilation[0]),
            u(options.dilation[1]),
            u(options.padding[0].0),
            u(options.padding[1].0),
            burn::backend::cubecl::dtype_to_storage_type(dtype),
        );
    }
    cols
}
