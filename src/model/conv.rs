//! Conv-BN-SiLU, the unit every YOLO block is made of (`ultralytics/nn/modules/conv.py::Conv`).

use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{BatchNorm, BatchNormConfig, PaddingConfig2d};
use burn::prelude::*;

/// BatchNorm epsilon and momentum used by every YOLO BN layer (yolo_spec §1.4; PyTorch convention:
/// running ← (1 − m)·running + m·batch).
pub const BN_EPS: f64 = 1e-3;
pub const BN_MOMENTUM: f64 = 0.03;

/// Conv2d (no bias, padding k/2) → BatchNorm → SiLU (or identity when `act` is false).
#[derive(Config, Debug)]
pub struct ConvBnConfig {
    /// Input channels.
    pub c_in: usize,
    /// Output channels.
    pub c_out: usize,
    /// Square kernel size.
    #[config(default = 1)]
    pub kernel: usize,
    /// Stride in both directions.
    #[config(default = 1)]
    pub stride: usize,
    /// Convolution groups (`c_in` for a depthwise conv).
    #[config(default = 1)]
    pub groups: usize,
    /// SiLU after the BN; false gives Conv-BN only.
    #[config(default = true)]
    pub act: bool,
}

impl ConvBnConfig {
    /// A depthwise-style conv: groups = gcd(c_in, c_out), as Ultralytics' `DWConv`.
    pub fn depthwise(c_in: usize, c_out: usize, kernel: usize) -> Self {
        Self::new(c_in, c_out)
            .with_kernel(kernel)
            .with_groups(gcd(c_in, c_out))
    }

    pub fn init(&self, device: &Device) -> ConvBn {
        assert!(
            self.kernel % 2 == 1,
            "ConvBn kernel must be odd, got {}",
            self.kernel
        );
        let pad = self.kernel / 2;
        let conv = Conv2dConfig::new([self.c_in, self.c_out], [self.kernel, self.kernel])
            .with_stride([self.stride, self.stride])
            .with_groups(self.groups)
            .with_padding(PaddingConfig2d::Explicit(pad, pad, pad, pad))
            .with_bias(false)
            .init(device);
        let bn = BatchNormConfig::new(self.c_out)
            .with_epsilon(BN_EPS)
            .with_momentum(BN_MOMENTUM)
            .init(device);
        ConvBn {
            conv,
            bn,
            act: self.act,
        }
    }
}

/// Conv-BN-(SiLU). Weight `[c_out, c_in/groups, k, k]`.
#[derive(Module, Debug)]
pub struct ConvBn {
    pub conv: Conv2d,
    pub bn: BatchNorm,
    pub act: bool,
}

impl ConvBn {
    /// `[B, c_in, H, W]` → `[B, c_out, H/stride, W/stride]`.
    pub fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        super::ops::batch_norm_act(&self.bn, super::precision::conv2d(&self.conv, x), self.act)
    }

    /// Multiply-accumulate count for an `h × w` input, and the output size.
    pub fn macs(&self, h: usize, w: usize) -> (u64, usize, usize) {
        conv_macs(&self.conv, h, w)
    }
}

/// MACs of a plain conv for an `h × w` input (padding k/2), with the output size.
pub fn conv_macs(conv: &Conv2d, h: usize, w: usize) -> (u64, usize, usize) {
    let [c_out, c_in_g, kh, kw] = conv.weight.shape().dims::<4>();
    let s = conv.stride[0];
    let (ho, wo) = (
        (h + 2 * (kh / 2) - kh) / s + 1,
        (w + 2 * (kw / 2) - kw) / s + 1,
    );
    ((c_out * c_in_g * kh * kw * ho * wo) as u64, ho, wo)
}

/// A plain Conv2d with bias and padding k/2 (the head's final 1×1 predictors).
pub fn plain_conv(c_in: usize, c_out: usize, kernel: usize, device: &Device) -> Conv2d {
    let pad = kernel / 2;
    Conv2dConfig::new([c_in, c_out], [kernel, kernel])
        .with_padding(PaddingConfig2d::Explicit(pad, pad, pad, pad))
        .init(device)
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ParamCount;

    #[test]
    fn conv_bn_shapes_and_params() {
        let device = Device::flex();
        let layer = ConvBnConfig::new(3, 16)
            .with_kernel(3)
            .with_stride(2)
            .init(&device);
        // yolo_spec §1.2 layer 0: 3·16·9 + 2·16.
        assert_eq!(layer.param_count(), 464);
        let y = layer.forward(Tensor::zeros([1, 3, 32, 32], &device));
        assert_eq!(y.dims(), [1, 16, 16, 16]);
        assert_eq!(layer.bn.epsilon, 1e-3);
        assert_eq!(layer.bn.momentum, 0.03);
    }

    #[test]
    fn depthwise_uses_gcd_groups() {
        let device = Device::flex();
        let dw = ConvBnConfig::depthwise(64, 64, 3).init(&device);
        assert_eq!(dw.conv.groups, 64);
        assert_eq!(dw.param_count(), 64 * 9 + 128);
    }
}
