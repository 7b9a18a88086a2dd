//! Autocast: the operations that run in reduced precision when training in FP16 or BF16
//! (docs/precision.md). Parameters stay FP32 (master weights); inside an [`autocast`] region every
//! Conv-BN-SiLU convolution and the attention matmuls cast their inputs and weights to the compute
//! dtype and their result back to FP32, so BatchNorm, activations, the head's final 1×1
//! predictors (boxes, classes, keypoints, sigmas), decoding and every loss run in FP32. Autodiff's cast is its own inverse, so gradients reach the FP32 parameters as FP32.

use super::ops;
use burn::nn::conv::Conv2d;
use burn::prelude::*;
use burn::tensor::FloatDType;
use burn::tensor::module::conv2d as conv2d_op;
use std::cell::Cell;

thread_local! {
    static COMPUTE: Cell<Option<FloatDType>> = const { Cell::new(None) };
}

/// Restores the previous compute dtype of this thread when dropped.
#[must_use = "autocast ends when the guard is dropped"]
pub struct Autocast(Option<FloatDType>);

impl Drop for Autocast {
    fn drop(&mut self) {
        COMPUTE.with(|c| c.set(self.0));
    }
}

/// Runs this thread's convolutions and attention matmuls in `dtype` (`None`: FP32) until the
/// returned guard is dropped.
pub fn autocast(dtype: Option<FloatDType>) -> Autocast {
    Autocast(COMPUTE.with(|c| c.replace(dtype)))
}

/// The compute dtype in effect on this thread (`None`: FP32).
pub fn compute_dtype() -> Option<FloatDType> {
    COMPUTE.with(Cell::get)
}

/// `conv.forward(x)` (through [`super::ops`]), in the autocast dtype when one is set.
pub fn conv2d(conv: &Conv2d, x: Tensor<4>) -> Tensor<4> {
    let Some(dtype) = compute_dtype() else {
        return ops::conv_forward(conv, x);
    };
    let options = ops::conv_options(conv);
    if ops::takes(conv) {
        let y = ops::conv2d_in(x, conv.weight.val(), options, dtype);
        return ops::add_bias(y, conv.bias.as_ref().map(|b| b.val()));
    }
    let (x, weight) = (x.cast(dtype), conv.weight.val().cast(dtype));
    let bias = conv.bias.as_ref().map(|b| b.val().cast(dtype));
    conv2d_op(x, weight, bias, options).cast(FloatDType::F32)
}

/// `a.matmul(b)`, in the autocast dtype when one is set.
pub fn matmul<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> Tensor<D> {
    match compute_dtype() {
        None => a.matmul(b),
        Some(dtype) => a.cast(dtype).matmul(b.cast(dtype)).cast(FloatDType::F32),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::conv::ConvBnConfig;

    fn max_abs_diff(a: Tensor<4>, b: Tensor<4>) -> f32 {
        (a - b).abs().max().into_scalar::<f32>()
    }

    #[test]
    fn reduced_precision_conv_is_close_but_not_equal_and_grads_stay_f32() {
        let device = Device::flex().autodiff();
        device.seed(7);
        let layer = ConvBnConfig::new(8, 16).with_kernel(3).init(&device);
        let x = Tensor::<4>::random([2, 8, 12, 12], burn::tensor::Distribution::Default, &device);
        let full = layer.forward(x.clone());
        for dtype in [FloatDType::BF16, FloatDType::F16] {
            let half = {
                let _on = autocast(Some(dtype));
                layer.forward(x.clone())
            };
            assert_eq!(half.dtype(), burn::tensor::DType::F32);
            let d = max_abs_diff(full.clone(), half.clone());
            // BN normalises to unit variance; bf16 keeps ~3 significant digits.
            assert!(
                d > 0.0,
                "{dtype:?}: no precision change, autocast did nothing"
            );
            assert!(d < 0.05, "{dtype:?}: diff {d}");
            let grads = half.sum().backward();
            let g = layer.conv.weight.grad(&grads).expect("weight grad");
            assert_eq!(g.dtype(), burn::tensor::DType::F32);
        }
        assert!(compute_dtype().is_none(), "guard restores FP32");
    }
}
