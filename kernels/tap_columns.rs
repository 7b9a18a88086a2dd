//! A convolution's input as one matrix per kernel tap, for the forward split by taps
//! (`model::ops::conv_taps`): for tap `(i, j)` and output pixel `(n, oy, ox)`, the input's
//! channels at `(oy·sh + i·dh − top, ox·sw + j·dw − left)`, zero outside the image. The values
//! are copies, in the input's dtype.

// `#[cube]` expands to `cubecl::…` paths.
use burn::backend::ops::ConvOptions;
use burn::cubecl;
use burn::tensor::Shape;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;
use cubecl::{CubeDim, calculate_cube_count_elemwise};

/// One unit per value of `out` (`[T, N·Ho·Wo, C]`, contiguous): channel fastest, so that
/// neighbouring units read neighbouring channels of a channels-last input and write
/// neighbouring addresses.
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
fn tap_columns_kernel<F: Float>(
    x: &Tensor<F>,
    out: &mut Tensor<F>,
    kernel_w: u32,
    out_h: u32,
    out_w: u32,
    stride_h: u32,
    stride_w: u32,
    dilation_h: u32,
    dilation_w: u32,
    top: u32,
    left: u32,
    #[define(F)] _dtype: ElemType,
) {
    let channels = out.shape(2);
    let rows = out.shape(1);
    if ABSOLUTE_POS >= out.shape(0) * rows * channels {
        terminate!();
    }
    let c = ABSOLUTE_POS % channels;
    let rest = ABSOLUTE_POS / channels;
    let r = rest % rows;
    let t = rest / rows;
    let ho = out_h as usize;
    let wo = out_w as usize;
    let kw = kernel_w as usize;
    let ox = r % wo;
    let oy = (r / wo) % ho;
    let n = r / (wo * ho);
    let row = oy * (stride_h as usize) + (t / kw) * (dilation_h as usize);
    let col = ox * (stride_w as usize) + (t % kw) * (dilation_w as usize);
    let top = top as usize;
    let left = left as usize;
    let mut v = F::new(0.0);
    if row >= top && col >= left {
        let y = row - top;
        let z = col - left;
        if y < x.shape(2) && z < x.shape(3) {
            v = x[n * x.stride(0) + c * x.stride(1) + y * x.stride(2) + z * x.stride(3)];
        }
    }
    out[ABSOLUTE_POS] = v;
}

/// `[N, C, H, W]` `x` (any float dtype, any strides) → `[kh·kw, N·Ho·Wo, C]` in `x`'s dtype,
/// contiguous: tap `t = i·kw + j` is the matrix of the input channels that tap multiplies at
/// every output pixel (rows in `(n, oy, ox)` order).
pub fn tap_columns(
    x: CubeTensor,
    kernel: [usize; 2],
    out: [usize; 2],
    options: &ConvOptions<2>,
) -> CubeTensor {
    let s = x.meta.shape();
    let (n, c) = (s[0], s[1]);
    let taps = kernel[0] * kernel[1];
    let rows = n * out[0] * out[1];
    // Contiguous, not pitched rows (docs/kernels.md, "Output buffers").
    let cols = empty_device_contiguous_dtype(
        x.client.clone(),
        x.device.clone(),
        Shape::new([taps, rows, c]),
        x.dtype,
    );
    let total = taps * rows * c;
    let dim = CubeDim::new(&x.client, total);
    let count = calculate_cube_count_elemwise(&x.client, total, dim);
    let client = x.client.clone();
    let dtype = burn::backend::cubecl::dtype_to_storage_type(x.dtype);
    let u = |v: usize| v as u32;
    // SAFETY: every read is bounds-checked against `x`'s shape and addressed by its strides;
    // `cols` is contiguous of `total` values, one unit each.
    unsafe {
        tap_columns_kernel::launch_unchecked(
            &client,
            count,
            dim,
            x.into_tensor_arg(),
            cols.clone().into_tensor_arg(),
            u(kernel[1]),
            u(out[0]),
            u(out[1]),
            u(options.stride[0]),
            u(options.stride[1]),
            u(options.dilation[0]),
            u(options.dilation[1]),
            u(options.padding[0].0),
            u(options.padding[1].0),
            dtype,
        );
    }
    cols
}

#[cfg(test)]
mod tests {
    use super::super::compile_check::{compiles, device, tensor};
    use super::*;
    use cubecl::ir::FloatKind;

    /// The kernel compiles for CUDA without a device, in BF16 and FP32.
    #[test]
    fn tap_columns_compile_for_cuda_without_a_device() {
        let (props, target) = device();
        for kind in [FloatKind::BF16, FloatKind::F32] {
            let k = tap_columns_kernel::create_dummy_kernel(
                props.clone(),
                target.clone(),
                CubeCount::Static(4, 1, 1),
                CubeDim::new_1d(256),
                tensor(&[2, 16, 9, 9]),
                tensor(&[9, 2 * 81, 16]),
                3u32,
                9u32,
                9u32,
                1u32,
                1u32,
                1u32,
                1u32,
                1u32,
                1u32,
                ElemType::Float(kind),
            );
            compiles(k.define());
        }
    }
}
