//! Backbone (layers 0–10) and neck (layers 11–22) of YOLO26 (yolo_spec §1.2).
//!
//! The backbone+neck pair is the stage that feature replay records as one unit: image in,
//! [`Features`] (P3/P4/P5) out. Nothing here knows about the head.

use super::attention::{C2psa, C2psaConfig};
use super::blocks::{C3k2, C3k2Config, C3k2Inner, Sppf, SppfConfig};
use super::conv::{ConvBn, ConvBnConfig};
use super::scale::Scale;
use burn::prelude::*;
use burn::tensor::module::interpolate;
use burn::tensor::ops::{InterpolateMode, InterpolateOptions};

/// Multi-scale features handed from the neck to the head.
#[derive(Clone, Debug)]
pub struct Features {
    /// Stride 8, `[B, c3, H/8, W/8]`.
    pub p3: Tensor<4>,
    /// Stride 16, `[B, c4, H/16, W/16]`.
    pub p4: Tensor<4>,
    /// Stride 32, `[B, c5, H/32, W/32]`.
    pub p5: Tensor<4>,
}

impl Features {
    pub fn levels(&self) -> [&Tensor<4>; 3] {
        [&self.p3, &self.p4, &self.p5]
    }

    pub fn into_levels(self) -> [Tensor<4>; 3] {
        [self.p3, self.p4, self.p5]
    }
}

/// Backbone outputs the neck reads: layers 4, 6 and 10.
#[derive(Clone, Debug)]
pub struct BackboneOut {
    pub c3: Tensor<4>,
    pub c4: Tensor<4>,
    pub c5: Tensor<4>,
}

#[derive(Config, Debug)]
pub struct BackboneConfig {
    pub scale: Scale,
}

impl BackboneConfig {
    pub fn init(&self, device: &Device) -> Backbone {
        let s = self.scale;
        let ch = |c| s.channels(c);
        let conv = |ci, co| {
            ConvBnConfig::new(ci, co)
                .with_kernel(3)
                .with_stride(2)
                .init(device)
        };
        let c3k2 = |ci, co, inner, e| {
            C3k2Config::new(ci, co, inner)
                .with_n(s.repeats(2))
                .with_expansion(e)
                .init(device)
        };
        Backbone {
            l0: conv(3, ch(64)),
            l1: conv(ch(64), ch(128)),
            l2: c3k2(ch(128), ch(256), C3k2Inner::Bottleneck, 0.25),
            l3: conv(ch(256), ch(256)),
            l4: c3k2(ch(256), ch(512), C3k2Inner::Bottleneck, 0.25),
            l5: conv(ch(512), ch(512)),
            l6: c3k2(ch(512), ch(512), C3k2Inner::C3k, 0.5),
            l7: conv(ch(512), ch(1024)),
            l8: c3k2(ch(1024), ch(1024), C3k2Inner::C3k, 0.5),
            l9: SppfConfig::new(ch(1024), ch(1024)).init(device),
            l10: C2psaConfig::new(ch(1024)).with_n(s.repeats(2)).init(device),
        }
    }
}

/// Layers 0–10: stem convs, C3k2 stages, SPPF, C2PSA.
#[derive(Module, Debug)]
pub struct Backbone {
    pub l0: ConvBn,
    pub l1: ConvBn,
    pub l2: C3k2,
    pub l3: ConvBn,
    pub l4: C3k2,
    pub l5: ConvBn,
    pub l6: C3k2,
    pub l7: ConvBn,
    pub l8: C3k2,
    pub l9: Sppf,
    pub l10: C2psa,
}

impl Backbone {
    /// `[B, 3, H, W]` (H, W multiples of 32) → layers 4 / 6 / 10.
    pub fn forward(&self, x: Tensor<4>) -> BackboneOut {
        let x = self.l1.forward(self.l0.forward(x));
        let x = self.l3.forward(self.l2.forward(x));
        let c3 = self.l4.forward(x);
        let c4 = self.l6.forward(self.l5.forward(c3.clone()));
        let x = self.l8.forward(self.l7.forward(c4.clone()));
        let c5 = self.l10.forward(self.l9.forward(x));
        BackboneOut { c3, c4, c5 }
    }
}

#[derive(Config, Debug)]
pub struct NeckConfig {
    pub scale: Scale,
}

impl NeckConfig {
    pub fn init(&self, device: &Device) -> Neck {
        let s = self.scale;
        let ch = |c| s.channels(c);
        let c3k2 = |ci, co, inner| {
            C3k2Config::new(ci, co, inner)
                .with_n(s.repeats(2))
                .init(device)
        };
        let down = |c| {
            ConvBnConfig::new(c, c)
                .with_kernel(3)
                .with_stride(2)
                .init(device)
        };
        Neck {
            l13: c3k2(ch(1024) + ch(512), ch(512), C3k2Inner::C3k),
            l16: c3k2(ch(512) + ch(512), ch(256), C3k2Inner::C3k),
            l17: down(ch(256)),
            l19: c3k2(ch(256) + ch(512), ch(512), C3k2Inner::C3k),
            l20: down(ch(512)),
            l22: C3k2Config::new(ch(512) + ch(1024), ch(1024), C3k2Inner::Attention)
                .with_n(s.repeats(1))
                .init(device),
        }
    }
}

/// Layers 11–22: top-down (upsample + concat) then bottom-up (stride-2 conv + concat) paths.
/// Upsample (11, 14) and Concat (12, 15, 18, 21) carry no parameters.
#[derive(Module, Debug)]
pub struct Neck {
    pub l13: C3k2,
    pub l16: C3k2,
    pub l17: ConvBn,
    pub l19: C3k2,
    pub l20: ConvBn,
    pub l22: C3k2,
}

impl Neck {
    pub fn forward(&self, b: BackboneOut) -> Features {
        let x13 = self
            .l13
            .forward(Tensor::cat(vec![upsample2(b.c5.clone()), b.c4], 1));
        let p3 = self
            .l16
            .forward(Tensor::cat(vec![upsample2(x13.clone()), b.c3], 1));
        let p4 = self
            .l19
            .forward(Tensor::cat(vec![self.l17.forward(p3.clone()), x13], 1));
        let p5 = self
            .l22
            .forward(Tensor::cat(vec![self.l20.forward(p4.clone()), b.c5], 1));
        Features { p3, p4, p5 }
    }
}

/// Nearest-neighbour ×2 upsampling (layers 11 and 14).
pub fn upsample2(x: Tensor<4>) -> Tensor<4> {
    let [_, _, h, w] = x.dims();
    let mut options = InterpolateOptions::new(InterpolateMode::Nearest);
    options.align_corners = false;
    options.output_size = Some([2 * h, 2 * w]);
    interpolate(x, options)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upsample_repeats_pixels() {
        let d = Device::flex();
        let x = Tensor::<1>::from_floats([1.0, 2.0, 3.0, 4.0], &d).reshape([1, 1, 2, 2]);
        let y = upsample2(x)
            .reshape([16])
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        assert_eq!(
            y,
            vec![
                1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0, 3.0, 3.0, 4.0, 4.0
            ]
        );
    }
}
