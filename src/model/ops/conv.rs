//! Convolution without bias: Burn's kernels (CPU), or on CUDA CubeCL's implicit GEMM for the
//! forward and data gradient and our im2col matmul (`wgrad`) for the weight gradient; both
//! gradients of a depthwise convolution are our own kernels (`kernels/depthwise.rs`).

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

/// CubeCL's implicit-GEMM convolutions (tensor cores); shapes it declines run Burn's direct ones.
#[cfg(feature = "cuda")]
pub mod gemm {
    use super::super::channels::channels_last;
    use super::super::depthwise;
    use burn::backend::ops::ConvOptions;
    use burn::backend::{DType, FloatDType, Shape, TensorMetadata};
    use burn_cubecl::kernel::conv::{self, ConvStrategy};
    use burn_cubecl::tensor::CubeTensor;

    /// Channels as the GEMM's operands carry them: a multiple of 8, so that BF16 and FP16 load
    /// 16 bytes at a time (docs/kernels.md, `kernels/channels.rs`).
    fn padded(channels: usize) -> usize {
        channels.next_multiple_of(8)
    }

    /// [`super::super::FastOps::conv_in`]: FP32 `x` and `weight` convolved in `dtype`, the
    /// result in FP32. Without groups, both operands go channels-last, cast and zero-padded to
    /// [`padded`] channels in one launch each, and the result is cropped and cast back in one;
    /// grouped convolutions run Burn's direct kernel on cast operands.
    pub fn forward_in(
        x: CubeTensor,
        weight: CubeTensor,
        options: ConvOptions<2>,
        dtype: FloatDType,
    ) -> CubeTensor {
        let d: DType = dtype.into();
        let cast = |t: CubeTensor, d: DType| burn_cubecl::kernel::cast(t, d);
        if options.groups == 1 {
            let (n, ci, co) = (x.shape()[0], x.shape()[1], weight.shape()[0]);
            let xp = channels_last(x.clone(), n, padded(ci), d);
            let wp = channels_last(weight.clone(), padded(co), padded(ci), d);
            let y =
                conv::conv_forward::<2>(xp, wp, None, options.clone(), ConvStrategy::ImplicitGemm);
            if let Ok(y) = y {
                return channels_last(y, n, co, DType::F32);
            }
        }
        cast(forward(cast(x, d), cast(weight, d), options), DType::F32)
    }

    pub fn forward(x: CubeTensor, weight: CubeTensor, options: ConvOptions<2>) -> CubeTensor {
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
        let shape = x.shape();
        if depthwise::is_depthwise(shape[1], &weight.shape(), &options) {
            return depthwise::data_grad(grad, weight, shape, &options);
        }
        if options.groups == 1 && options.stride.iter().all(|&s| s == 1) {
            // As in `forward_in`: operands channels-last, cast and padded; result cropped.
            let d: DType = dtype.into();
            let (n, ci, co) = (shape[0], shape[1], weight.shape()[0]);
            let gp = channels_last(grad.clone(), n, padded(co), d);
            let wp = channels_last(weight.clone(), padded(co), padded(ci), d);
            let shape_p = Shape::new([n, padded(ci), shape[2], shape[3]]);
            let dx = conv::conv_data_backward(
                gp,
                wp,
                shape_p,
                options.clone(),
                ConvStrategy::ImplicitGemm,
            );
            if let Ok(dx) = dx {
                return channels_last(dx, n, ci, DType::F32);
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
        let k = weight.shape();
        if depthwise::is_depthwise(x.shape()[1], &k, &options) {
            let dw = depthwise::weight_grad(x, grad, [k[2], k[3]], &options);
            return burn_cubecl::kernel::cast(dw, weight.dtype);
        }
        if let Some(dw) = super::super::wgrad::weight_backward::<burn_cubecl::CubeBackend>(
            x.clone(),
            weight.clone(),
            grad.clone(),
            &options,
            super::super::im2col::columns,
        ) {
            return dw;
        }
        conv::conv_weight_backward::<2>(x, grad, weight.shape(), options, ConvStrategy::Direct)
            .expect("direct convolution weight gradient")
    }
}
