//! A convolution's forward split by kernel taps (CUDA, off by default: [`choose`]). CubeCL's
//! implicit GEMM gives each cube a tile of output pixels × output channels and walks the whole
//! `C·kh·kw` reduction in it: on a 20×20 map at batch 4 that is ~13 tiles for 132
//! multiprocessors with a reduction of up to 2,304 (docs/perf_log.md BE5: 4.7 TFLOP/s). Here
//! each tap is its own matmul of the batch, `[N·Ho·Wo, C] · [C, C_out]`, all taps in one
//! batched launch (kh·kw times the cubes, each with a reduction of `C`), and the taps' FP32
//! products are summed in tap order: the input as one matrix per tap
//! (`kernels/tap_columns.rs`), the weight as one matrix per tap, the matmul, the sum. No
//! atomics: the same bits every run; other bits than the implicit GEMM's (another order of
//! the additions).

use super::leading_sum::leading_sum;
use super::matmul::matmul_f32;
use super::tap_columns::tap_columns;
use burn::backend::Shape;
use burn::backend::ops::{ConvOptions, FloatTensorOps};
use burn_cubecl::CubeBackend as Cube;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::{permute_nchw_to_nhwc, permute_nhwc_to_nchw};
use burn_cubecl::tensor::CubeTensor;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Output rows (`N·Ho·Wo`) up to which [`takes`] splits a convolution; 0: none.
static MAX_ROWS: AtomicUsize = AtomicUsize::new(0);

/// Splits every later reduced-precision convolution forward without groups, with more than one
/// tap and at most `max_rows` output pixels in the batch, by taps, and so the data gradients of
/// those whose input has at most `max_rows` pixels in the batch ([`data_grad`];
/// `bench-step --tap-split`, `bench-conv --tap-split`); 0 (the default) splits none.
pub fn choose(max_rows: usize) {
    MAX_ROWS.store(max_rows, Ordering::Relaxed);
}

/// The largest batch of output pixels split by taps ([`choose`]; 0: none).
pub fn max_rows() -> usize {
    MAX_ROWS.load(Ordering::Relaxed)
}

/// Whether the forward of a convolution without groups, kernel `[kh, kw]`, with `rows` output
/// pixels in the batch, runs by taps.
pub fn takes(kernel: [usize; 2], rows: usize, options: &ConvOptions<2>) -> bool {
    options.groups == 1 && kernel[0] * kernel[1] > 1 && rows <= max_rows()
}

/// The convolution of `x` by `weight` (both `[_, C, _, _]` in one dtype, any strides; the GEMM
/// operands of `conv::gemm` are channels-last), no bias, no groups, accumulated in FP32: FP32
/// `[N, C_out, Ho, Wo]` with channels-last strides.
pub fn forward(x: CubeTensor, weight: CubeTensor, options: &ConvOptions<2>) -> CubeTensor {
    let xs = x.meta.shape().to_vec();
    let ws = weight.meta.shape().to_vec();
    let (n, c, co, kh, kw) = (xs[0], xs[1], ws[0], ws[2], ws[3]);
    assert_eq!(
        ws[1], c,
        "conv by taps: the weight's input channels must be the input's"
    );
    let [ho, wo] = super::conv::output_size([xs[2], xs[3]], [kh, kw], options);
    let taps = kh * kw;
    let cols = tap_columns(x, [kh, kw], [ho, wo], options); // [T, N·Ho·Wo, C]
    // The weight as [T, C_out, C] (one small copy), read transposed as [T, C, C_out].
    let w = permute_nchw_to_nhwc(weight); // [C_out, kh, kw, C]
    let w = into_contiguous(Cube::float_permute(w, &[1, 2, 0, 3]));
    let w = Cube::float_reshape(w, Shape::new([taps, co, c]));
    let prod = matmul_f32(cols, Cube::float_swap_dims(w, 1, 2)); // [T, N·Ho·Wo, C_out]
    let y = leading_sum(prod, None);
    permute_nhwc_to_nchw(Cube::float_reshape(y, Shape::new([n, ho, wo, co])))
}

/// The data gradient of a stride-1 convolution without groups by taps, when [`takes`] its
/// `rows` input pixels in the batch: the forward by taps of `grad` (`[N, C_out, Ho, Wo]`) by
/// the weight (`[C_out, C, kh, kw]`) flipped in both spatial axes with its channel axes
/// swapped, each side padded by `(k − 1)·dilation` less the convolution's own padding (the
/// full correlation): FP32 `[N, C, H, W]`, channels-last strides. `None` where that padding
/// would be negative or the split does not take the convolution.
pub fn data_grad(
    grad: CubeTensor,
    weight: CubeTensor,
    rows: usize,
    options: &ConvOptions<2>,
) -> Option<CubeTensor> {
    let ws = weight.meta.shape().to_vec();
    let kernel = [ws[2], ws[3]];
    if options.stride != [1, 1] || !takes(kernel, rows, options) {
        return None;
    }
    let side = |i: usize, pad: usize| ((kernel[i] - 1) * options.dilation[i]).checked_sub(pad);
    let [(top, bottom), (left, right)] = options.padding;
    let padding = [
        (side(0, top)?, side(0, bottom)?),
        (side(1, left)?, side(1, right)?),
    ];
    let full = ConvOptions::new_with_padding([1, 1], padding, options.dilation, 1);
    let flipped = Cube::float_swap_dims(Cube::float_flip(weight, &[2, 3]), 0, 1);
    Some(forward(grad, flipped, &full))
}
