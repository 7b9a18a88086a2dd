//! The columns of a convolution's weight gradient (`model::ops::wgrad`) in one launch: for each
//! kernel tap, the input value it multiplies at every output position, zero in the padding, in
//! FP32. The tensor-operation version (a zero-padded copy, one strided slice per tap, a
//! concatenation, casts) took ~20 launches per 3×3 convolution; the values are copies, so both
//! give the same bits.

// `#[cube]` expands to `cubecl::…` paths.
use burn::backend::ops::ConvOptions;
use burn::cubecl;
use burn::tensor::{DType, Shape};
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;
use cubecl::{CubeDim, calculate_cube_count_elemwise};

/// One unit per output value `[n, c, tap, p]`: `x[n, c, oh·sh + i·dh − top, ow·sw + j·dw − left]`
/// for tap `(i, j)` and output position `p = (oh, ow)`, or zero outside the input.
#[cube(launch_unchecked)]
fn columns_kernel(
    x: &Tensor<f32>,
    out: &mut Tensor<f32>,
    kernel_w: u32,
    out_w: u32,
    stride_h: u32,
    stride_w: u32,
    dilation_h: u32,
    dilation_w: u32,
    top: u32,
    left: u32,
) {
    let positions = out.shape(3);
    let taps = out.shape(2);
    let channels = out.shape(1);
    if ABSOLUTE_POS >= out.shape(0) * channels * taps * positions {
        terminate!();
    }
    let mut rest = ABSOLUTE_POS;
    let p = rest % positions;
    rest /= positions;
    let t = rest % taps;
    rest /= taps;
    let c = rest % channels;
    let n = rest / channels;
    let kw = kernel_w as usize;
    let ow_n = out_w as usize;
    let row = (p / ow_n) * (stride_h as usize) + (t / kw) * (dilation_h as usize);
    let col = (p % ow_n) * (stride_w as usize) + (t % kw) * (dilation_w as usize);
    let top = top as usize;
    let left = left as usize;
    let dst = n * out.stride(0) + c * out.stride(1) + t * out.stride(2) + p * out.stride(3);
    let mut v = 0.0f32;
    if row >= top && col >= left {
        let y = row - top;
        let z = col - left;
        if y < x.shape(2) && z < x.shape(3) {
            let at = n * x.stride(0) + c * x.stride(1) + y * x.stride(2) + z * x.stride(3);
            v = x[at];
        }
    }
    out[dst] = v;
}

/// `[N, C, H, W]` (any float dtype, any strides) → `[N, C, kh·kw, Ho·Wo]` in FP32.
pub fn columns(
    x: CubeTensor,
    kernel: [usize; 2],
    out: [usize; 2],
    options: &ConvOptions<2>,
) -> CubeTensor {
    let x = if x.dtype == DType::F32 {
        x
    } else {
        burn_cubecl::kernel::cast(x, DType::F32)
    };
    let s = x.meta.shape();
    let (n, c) = (s[0], s[1]);
    let (taps, positions) = (kernel[0] * kernel[1], out[0] * out[1]);
    let cols = empty_device_dtype(
        x.client.clone(),
        x.device.clone(),
        Shape::new([n, c, taps, positions]),
        DType::F32,
    );
    let total = n * c * taps * positions;
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
            u(kernel[1]),
            u(out[1]),
            u(options.stride[0]),
            u(options.stride[1]),
            u(options.dilation[0]),
            u(options.dilation[1]),
            u(options.padding[0].0),
            u(options.padding[1].0),
        );
    }
    cols
}
