//! Convolution without bias: Burn's kernels (CPU), or on CUDA CubeCL's implicit GEMM for the
//! forward and data gradient and our im2col matmul (`wgrad`) for the weight gradient; both
//! gradients of a depthwise convolution are our own kernels (`kernels/depthwise.rs` on CUDA,
//! `cpu_depthwise.rs` on the CPU).

use burn::backend::Shape;
use burn::backend::ops::ConvOptions;
use burn::nn::PaddingConfig2d;
use burn::nn::conv::Conv2d;

/// The [`ConvOptions`] of a Burn `Conv2d` (explicit or no padding).
pub fn options(conv: &Conv2d) -> ConvOptions<2> {
    let ((top, bottom), (left, right)) = match conv.padding {
        PaddingConfig2d::Valid => ((0, 0), (0, 0)),
        PaddingConfig2d::Explicit(top, left, bottom, right) => ((top, bottom), (left, right)),
        // Burn computes "same" padding privately; no layer of ours uses it.
        PaddingConfig2d::Same => panic!("conv2d: `Same` padding is not supported"),
    };
    ConvOptions::new_with_padding(
        conv.stride,
        [(top, bottom), (left, right)],
        conv.dilation,
        conv.groups,
    )
}

/// Whether `weight` (`[C_out, C_in/groups, kh, kw]`) with `options` is a depthwise convolution
/// of `channels` input channels.
pub fn is_depthwise(channels: usize, weight: &Shape, options: &ConvOptions<2>) -> bool {
    options.groups == channels && weight[0] == channels && weight[1] == 1
}

/// Output length along one axis of a convolution over `input` with a `kernel` wide filter,
/// `(before, after)` padding, `stride` and `dilation`.
pub fn output_len(
    input: usize,
    kernel: usize,
    padding: (usize, usize),
    stride: usize,
    dilation: usize,
) -> usize {
    checked_output_len(input, kernel, padding, stride, dilation)
        .expect("convolution: the dilated kernel is wider than the padded input")
}

/// Output size `[Ho, Wo]` of a convolution over an `input` `[H, W]` image with a `kernel`
/// `[kh, kw]` filter ([`output_len`] along each axis).
pub fn output_size(input: [usize; 2], kernel: [usize; 2], options: &ConvOptions<2>) -> [usize; 2] {
    [0, 1].map(|i| {
        output_len(
            input[i],
            kernel[i],
            options.padding[i],
            options.stride[i],
            options.dilation[i],
        )
    })
}

/// [`output_len`], `None` where the dilated kernel is wider than the padded input.
pub fn checked_output_len(
    input: usize,
    kernel: usize,
    (before, after): (usize, usize),
    stride: usize,
    dilation: usize,
) -> Option<usize> {
    let span = dilation * kernel.checked_sub(1)? + 1;
    Some((input + before + after).checked_sub(span)? / stride + 1)
}

/// CubeCL's implicit-GEMM convolutions (tensor cores); shapes it declines run Burn's direct ones.
#[cfg(feature = "cuda")]
pub mod gemm {
    use super::super::channels::{self, channels_last};
    use super::super::depthwise;
    use super::routine;
    use burn::backend::ops::ConvOptions;
    use burn::backend::{DType, FloatDType, Shape, TensorMetadata};
    use burn_cubecl::kernel::conv::{self, ConvStrategy};
    use burn_cubecl::tensor::CubeTensor;

    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The multiple [`padded`] rounds counts of at least that many channels up to (8, the
    /// default, 16 or 32).
    static PADDING: AtomicUsize = AtomicUsize::new(8);

    /// Rounds every later GEMM operand's channel count that is not a multiple of 8, and is at
    /// least `multiple`, up to a multiple of `multiple` (8, 16 or 32) instead of 8: fewer, wider
    /// tiles for the GEMM's channel loop, more zero products (`bench-conv --conv-padding`).
    pub fn choose_padding(multiple: usize) -> Result<(), String> {
        if ![8, 16, 32].contains(&multiple) {
            return Err(format!("channel padding {multiple}: expected 8, 16 or 32"));
        }
        PADDING.store(multiple, Ordering::Relaxed);
        Ok(())
    }

    /// Channels as the GEMM's operands carry them: a multiple of 8, so that BF16 and FP16 load
    /// 16 bytes at a time (docs/kernels.md, `kernels/channels.rs`); counts of at least the
    /// chosen padding ([`choose_padding`]) a multiple of that.
    pub fn padded(channels: usize) -> usize {
        let multiple = PADDING.load(Ordering::Relaxed);
        if channels.is_multiple_of(8) || channels < multiple {
            channels.next_multiple_of(8)
        } else {
            channels.next_multiple_of(multiple)
        }
    }

    /// Whether `operand` is [`channels_last`]`(t, n, channels, d)`'s form for `t`: `d`, `t`'s
    /// batch and image size with `channels` channels, dense channels-last.
    fn is_operand_of(operand: &CubeTensor, t: &CubeTensor, channels: usize, d: DType) -> bool {
        let s = t.shape();
        let (n, h, w) = (s[0], s[2], s[3]);
        let strides = operand.meta.strides();
        operand.dtype == d
            && operand.shape() == Shape::new([n, channels, h, w])
            && (0..4).all(|i| strides[i] == [h * w * channels, 1, w * channels, channels][i])
    }

    /// The dtype the GEMM writes a result with `channels` real channels in: FP32 itself where
    /// they need no padding, else the operands' `d` (then [`in_f32`] crops and casts it).
    fn written_as(channels: usize, d: DType) -> DType {
        if channels == padded(channels) {
            DType::F32
        } else {
            d
        }
    }

    /// A GEMM result `y` (channels-last) as the FP32 `[n, channels, H, W]` tensor: `y` itself
    /// when it is that already, else cropped and cast in one launch.
    fn in_f32(y: CubeTensor, n: usize, channels: usize) -> CubeTensor {
        if y.dtype == DType::F32 && y.meta.shape()[1] == channels {
            y
        } else {
            channels_last(y, n, channels, DType::F32)
        }
    }

    /// [`super::super::FastOps::conv_in`]: FP32 `x` and `weight` convolved in `dtype`, the
    /// result in FP32. Without groups, both operands go channels-last, cast and zero-padded to
    /// [`padded`] channels in one launch each; the GEMM accumulates in FP32 and, where the output
    /// channels need no padding, writes FP32 itself (no cast launch, no BF16 rounding of the
    /// result); otherwise its padded result is cropped and cast back in one launch. Depthwise
    /// convolutions run our kernel (`kernels/depthwise.rs`: operands rounded to `dtype`, FP32
    /// sums, FP32 result, one launch); other grouped ones Burn's direct kernel on cast operands.
    pub fn forward_in(
        x: CubeTensor,
        weight: CubeTensor,
        options: ConvOptions<2>,
        dtype: FloatDType,
    ) -> CubeTensor {
        forward_with(x, weight, [None, None], options, dtype)
    }

    /// The GEMM's weight operand of [`forward_in`] and [`x_backward_in`] for convolutions
    /// without groups: `weight` channels-last, cast to `dtype` and padded to [`padded`]
    /// channels; `weight` itself otherwise (they take no such operand). With `data_grad` (the
    /// input wants a gradient), BF16 and our kernel chosen, also the data gradient's operand,
    /// the same values with the channel axes swapped, written by the same launch (each data
    /// gradient copied the operand so, one launch a convolution).
    pub fn weight_operand(
        weight: CubeTensor,
        options: &ConvOptions<2>,
        dtype: FloatDType,
        data_grad: bool,
    ) -> (CubeTensor, Option<CubeTensor>) {
        if options.groups != 1 {
            return (weight, None);
        }
        let (co, ci) = (weight.shape()[0], weight.shape()[1]);
        if data_grad && dtype == FloatDType::BF16 && routine::own_chosen() {
            let (operand, swapped) =
                channels::weight_operands(weight, padded(co), padded(ci), dtype.into());
            return (operand, Some(swapped));
        }
        (
            channels_last(weight, padded(co), padded(ci), dtype.into()),
            None,
        )
    }

    /// `operand` when it is [`weight_operand`]'s for `weight` in `d`, else that made now.
    fn operand_of(weight: &CubeTensor, operand: Option<CubeTensor>, d: DType) -> CubeTensor {
        match operand {
            Some(w) if is_weight_operand(weight, &w, d) => w,
            _ => {
                let s = weight.shape();
                channels_last(weight.clone(), padded(s[0]), padded(s[1]), d)
            }
        }
    }

    /// Whether `operand` has the form of [`weight_operand`]'s for `weight` in `d`.
    fn is_weight_operand(weight: &CubeTensor, operand: &CubeTensor, d: DType) -> bool {
        let s = weight.shape();
        let want = [padded(s[0]), padded(s[1]), s[2], s[3]];
        operand.dtype == d && operand.shape() == Shape::new(want)
    }

    /// [`forward_in`] with the weight's GEMM operand made already ([`weight_operand`]) and the
    /// input's (`x` channels-last, cast to `dtype` and padded to [`padded`], as the BatchNorm
    /// before the convolution writes it beside its output); either is made here where not
    /// given or not of that form.
    pub fn forward_with(
        x: CubeTensor,
        weight: CubeTensor,
        [operand, x_operand]: [Option<CubeTensor>; 2],
        options: ConvOptions<2>,
        dtype: FloatDType,
    ) -> CubeTensor {
        let d: DType = dtype.into();
        let cast = |t: CubeTensor, d: DType| burn_cubecl::kernel::cast(t, d);
        if depthwise::is_depthwise(x.shape()[1], &weight.shape(), &options) {
            return depthwise::forward(x, weight, &options, dtype);
        }
        if options.groups == 1 {
            let (n, ci, co) = (x.shape()[0], x.shape()[1], weight.shape()[0]);
            let xp = x_operand
                .filter(|xp| is_operand_of(xp, &x, padded(ci), d))
                .unwrap_or_else(|| channels_last(x.clone(), n, padded(ci), d));
            let wp = operand_of(&weight, operand, d);
            if let Ok(y) = routine::forward(xp, wp, &options, written_as(co, d)) {
                return in_f32(y, n, co);
            }
        }
        cast(forward(cast(x, d), cast(weight, d), options), DType::F32)
    }

    /// A convolution in `x`'s and `weight`'s dtype: depthwise ones in FP32 by our kernel
    /// (when both are FP32), others by CubeCL's implicit GEMM or, where it declines, Burn's
    /// direct kernel.
    pub fn forward(x: CubeTensor, weight: CubeTensor, options: ConvOptions<2>) -> CubeTensor {
        let f32s = x.dtype == DType::F32 && weight.dtype == DType::F32;
        if f32s && depthwise::is_depthwise(x.shape()[1], &weight.shape(), &options) {
            return depthwise::forward(x, weight, &options, FloatDType::F32);
        }
        conv::conv_forward::<2>(
            x.clone(),
            weight.clone(),
            None,
            options.clone(),
            ConvStrategy::ImplicitGemm,
        )
        .or_else(|_| conv::conv_forward::<2>(x, weight, None, options, ConvStrategy::Direct))
        .expect("direct convolution")
    }

    pub fn x_backward(
        x: CubeTensor,
        weight: CubeTensor,
        grad: CubeTensor,
        options: ConvOptions<2>,
    ) -> CubeTensor {
        let shape = x.shape();
        let dtype = x.dtype;
        if depthwise::is_depthwise(shape[1], &weight.shape(), &options) {
            let dx = depthwise::data_grad(grad, weight, shape, &options);
            return burn_cubecl::kernel::cast(dx, dtype);
        }
        // CubeCL's implicit GEMM takes stride-1 convolutions without groups; it hands the rest to
        // the direct kernel itself.
        if options.groups == 1
            && options.stride.iter().all(|&s| s == 1)
            && let Ok(dx) = conv::conv_data_backward(
                grad.clone(),
                weight.clone(),
                shape.clone(),
                options.clone(),
                ConvStrategy::ImplicitGemm,
            )
        {
            return dx;
        }
        // Strided and grouped data gradients run Burn's direct kernel, which accumulates in the
        // element type: in FP32, then back (5 % error in BF16 otherwise, docs/kernels.md).
        let f32 = |t: CubeTensor| burn_cubecl::kernel::cast(t, DType::F32);
        let dx =
            conv::conv_data_backward(f32(grad), f32(weight), shape, options, ConvStrategy::Direct)
                .expect("direct convolution data gradient");
        if dtype == DType::F32 {
            dx
        } else {
            burn_cubecl::kernel::cast(dx, dtype)
        }
    }

    /// The data gradient of [`super::super::FastOps::conv_in`] in FP32, from FP32 `weight` and
    /// `grad`: implicit GEMM in `dtype` where it takes the convolution, otherwise Burn's direct
    /// kernel straight in FP32 (no casts down and back up).
    pub fn x_backward_in(
        x: CubeTensor,
        weight: CubeTensor,
        grad: CubeTensor,
        options: ConvOptions<2>,
        dtype: FloatDType,
    ) -> CubeTensor {
        x_backward_with(x, weight, [None, None, None], grad, options, dtype)
    }

    /// [`x_backward_in`] with the weight's GEMM operands made already ([`weight_operand`]:
    /// the forward's and, where made, its swapped form) and, for a stride-1 convolution, the
    /// output gradient's (`grad` channels-last, cast to `dtype` and padded to [`padded`], as
    /// the BatchNorm after the convolution writes it beside its input gradient); each is made
    /// here where not given or not of that form.
    pub fn x_backward_with(
        x: CubeTensor,
        weight: CubeTensor,
        [operand, swapped, grad_operand]: [Option<CubeTensor>; 3],
        grad: CubeTensor,
        options: ConvOptions<2>,
        dtype: FloatDType,
    ) -> CubeTensor {
        let shape = x.shape();
        if depthwise::is_depthwise(shape[1], &weight.shape(), &options) {
            return depthwise::data_grad(grad, weight, shape, &options);
        }
        let strided = options.stride.iter().any(|&s| s != 1);
        let by_gemm = !strided || (routine::strided_by_gemm() && dtype == FloatDType::BF16);
        if options.groups == 1 && by_gemm {
            // As in `forward_in`: operands channels-last, cast and padded; the result in FP32
            // straight from the GEMM or cropped and cast back. A strided convolution's output
            // gradient, zero-dilated, is the output gradient of the stride-1 convolution it
            // subsamples, whose data gradient is the same.
            let d: DType = dtype.into();
            let (n, ci, co) = (shape[0], shape[1], weight.shape()[0]);
            let (gp, unit) = if strided {
                let k = weight.shape();
                let size = |i: usize| {
                    super::output_len(
                        shape[2 + i],
                        k[2 + i],
                        options.padding[i],
                        1,
                        options.dilation[i],
                    )
                };
                let unit =
                    ConvOptions::new_with_padding([1, 1], options.padding, options.dilation, 1);
                let dilated = channels::dilated_channels_last(
                    grad.clone(),
                    n,
                    padded(co),
                    d,
                    options.stride,
                    [size(0), size(1)],
                );
                (dilated, unit)
            } else {
                let gp = grad_operand
                    .filter(|g| is_operand_of(g, &grad, padded(co), d))
                    .unwrap_or_else(|| channels_last(grad.clone(), n, padded(co), d));
                (gp, options.clone())
            };
            // The swapped form goes with the forward's operand only, where that is taken.
            let taken = operand
                .as_ref()
                .is_some_and(|w| is_weight_operand(&weight, w, d));
            let swapped = swapped.filter(|_| taken);
            let wp = operand_of(&weight, operand, d);
            let shape_p = Shape::new([n, padded(ci), shape[2], shape[3]]);
            let out = written_as(ci, d);
            if let Ok(dx) = routine::data_grad(gp, wp, swapped, shape_p, &unit, out) {
                return in_f32(dx, n, ci);
            }
        }
        conv::conv_data_backward(grad, weight, shape, options, ConvStrategy::Direct)
            .expect("direct convolution data gradient")
    }

    pub fn weight_backward(
        x: CubeTensor,
        weight: CubeTensor,
        grad: CubeTensor,
        options: ConvOptions<2>,
    ) -> CubeTensor {
        weight_backward_by(x, weight, grad, options, false)
    }

    /// The weight gradient of [`super::super::FastOps::conv_in`]: with reduced operands chosen
    /// (`wgrad::choose_reduced`) and `dtype` BF16, the columns and the output gradient in BF16
    /// and the products accumulated in FP32; otherwise [`weight_backward`]'s FP32 operands.
    pub fn weight_backward_in(
        x: CubeTensor,
        weight: CubeTensor,
        grad: CubeTensor,
        options: ConvOptions<2>,
        dtype: FloatDType,
    ) -> CubeTensor {
        let reduced = super::super::wgrad::reduced() && dtype == FloatDType::BF16;
        weight_backward_by(x, weight, grad, options, reduced)
    }

    /// A weight gradient: depthwise by our kernel; otherwise our im2col matmul, from BF16
    /// operands where `reduced` (FP32 ones else), its chunks summed by `grads_into::sum` (with
    /// `own-tf32-implicit` the columns read from the input by our kernel, not written first);
    /// Burn's direct kernel for the grouped convolutions that takes neither.
    fn weight_backward_by(
        x: CubeTensor,
        weight: CubeTensor,
        grad: CubeTensor,
        options: ConvOptions<2>,
        reduced: bool,
    ) -> CubeTensor {
        use super::super::{grads_into, im2col, matmul, wgrad};
        let k = weight.shape();
        if depthwise::is_depthwise(x.shape()[1], &k, &options) {
            let dw = depthwise::weight_grad(x, grad, [k[2], k[3]], &options);
            return burn_cubecl::kernel::cast(dw, weight.dtype);
        }
        let how: wgrad::How<burn_cubecl::CubeBackend> = if reduced {
            (im2col::columns_bf16, matmul::matmul_f32, FloatDType::BF16)
        } else {
            (im2col::columns, matmul::matmul, FloatDType::F32)
        };
        let w = weight.clone();
        let grad_channels_last = super::super::fused_bn_nhwc::dense_channels_last(&grad)
            && grad.meta.strides()[3] == grad.shape()[1];
        if !reduced && matmul::implicit() {
            let product: wgrad::Implicit<burn_cubecl::CubeBackend> = |g, x, k, out, options| {
                super::super::tf32_gemm::weight_grad_implicit(&g, &x, k, out, options)
            };
            if let Some(dw) = wgrad::implicit_weight_backward::<burn_cubecl::CubeBackend>(
                x.clone(),
                weight.clone(),
                grad.clone(),
                &options,
                product,
                grad_channels_last,
                |prod| grads_into::sum(prod, &w),
            ) {
                return dw;
            }
        }
        if let Some(dw) = wgrad::weight_backward_in::<burn_cubecl::CubeBackend>(
            x.clone(),
            weight.clone(),
            grad.clone(),
            &options,
            how,
            grad_channels_last,
            |prod| grads_into::sum(prod, &w),
        ) {
            return dw;
        }
        conv::conv_weight_backward::<2>(x, grad, weight.shape(), options, ConvStrategy::Direct)
            .expect("direct convolution weight gradient")
    }
}

#[cfg(feature = "cuda")]
pub mod routine;
