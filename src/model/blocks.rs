//! CSP blocks of YOLO26: Bottleneck, C3k, C3k2 and SPPF (`ultralytics/nn/modules/block.py`).

use super::attention::{PsaBlock, PsaBlockConfig};
use super::conv::{ConvBn, ConvBnConfig};
use burn::nn::PaddingConfig2d;
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::prelude::*;

/// Two 3×3 Conv-BN-SiLU with an optional residual (only when `c_in == c_out`).
#[derive(Config, Debug)]
pub struct BottleneckConfig {
    pub c_in: usize,
    pub c_out: usize,
    /// Hidden width = int(c_out · expansion).
    #[config(default = 0.5)]
    pub expansion: f64,
    #[config(default = true)]
    pub shortcut: bool,
}

impl BottleneckConfig {
    pub fn init(&self, device: &Device) -> Bottleneck {
        let hidden = (self.c_out as f64 * self.expansion) as usize;
        Bottleneck {
            cv1: ConvBnConfig::new(self.c_in, hidden)
                .with_kernel(3)
                .init(device),
            cv2: ConvBnConfig::new(hidden, self.c_out)
                .with_kernel(3)
                .init(device),
            add: self.shortcut && self.c_in == self.c_out,
        }
    }
}

#[derive(Module, Debug)]
pub struct Bottleneck {
    pub cv1: ConvBn,
    pub cv2: ConvBn,
    pub add: bool,
}

impl Bottleneck {
    pub fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        let y = self.cv2.forward(self.cv1.forward(x.clone()));
        if self.add { x + y } else { y }
    }

    pub fn macs(&self, h: usize, w: usize) -> u64 {
        self.cv1.macs(h, w).0 + self.cv2.macs(h, w).0
    }
}

/// C3 variant with 3×3 bottlenecks: `cv3(cat(m(cv1(x)), cv2(x)))`.
#[derive(Config, Debug)]
pub struct C3kConfig {
    pub c_in: usize,
    pub c_out: usize,
    /// Number of inner bottlenecks.
    #[config(default = 2)]
    pub n: usize,
    #[config(default = 0.5)]
    pub expansion: f64,
}

impl C3kConfig {
    pub fn init(&self, device: &Device) -> C3k {
        let hidden = (self.c_out as f64 * self.expansion) as usize;
        C3k {
            cv1: ConvBnConfig::new(self.c_in, hidden).init(device),
            cv2: ConvBnConfig::new(self.c_in, hidden).init(device),
            cv3: ConvBnConfig::new(2 * hidden, self.c_out).init(device),
            m: (0..self.n)
                .map(|_| {
                    BottleneckConfig::new(hidden, hidden)
                        .with_expansion(1.0)
                        .init(device)
                })
                .collect(),
        }
    }
}

#[derive(Module, Debug)]
pub struct C3k {
    pub cv1: ConvBn,
    pub cv2: ConvBn,
    pub cv3: ConvBn,
    pub m: Vec<Bottleneck>,
}

impl C3k {
    pub fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        let a = self
            .m
            .iter()
            .fold(self.cv1.forward(x.clone()), |y, b| b.forward(y));
        let b = self.cv2.forward(x);
        self.cv3.forward(Tensor::cat(vec![a, b], 1))
    }

    pub fn macs(&self, h: usize, w: usize) -> u64 {
        self.cv1.macs(h, w).0
            + self.cv2.macs(h, w).0
            + self.cv3.macs(h, w).0
            + self.m.iter().map(|b| b.macs(h, w)).sum::<u64>()
    }
}

/// What each inner block of a C3k2 is.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum C3k2Inner {
    /// Plain bottleneck (hidden c/2).
    Bottleneck,
    /// C3k with two bottlenecks.
    C3k,
    /// Bottleneck followed by a PSA block (YOLO26's last neck layer).
    Attention,
}

/// C2f-style CSP block: split `cv1(x)` in two, chain `n` inner blocks on the second half, concat all.
#[derive(Config, Debug)]
pub struct C3k2Config {
    pub c_in: usize,
    pub c_out: usize,
    #[config(default = 1)]
    pub n: usize,
    pub inner: C3k2Inner,
    #[config(default = 0.5)]
    pub expansion: f64,
}

impl C3k2Config {
    pub fn init(&self, device: &Device) -> C3k2 {
        let c = (self.c_out as f64 * self.expansion) as usize;
        let blocks = (0..self.n)
            .map(|_| match self.inner {
                C3k2Inner::Bottleneck => C3k2Block {
                    bottleneck: Some(BottleneckConfig::new(c, c).init(device)),
                    c3k: None,
                    psa: None,
                },
                C3k2Inner::C3k => C3k2Block {
                    bottleneck: None,
                    c3k: Some(C3kConfig::new(c, c).init(device)),
                    psa: None,
                },
                C3k2Inner::Attention => C3k2Block {
                    bottleneck: Some(BottleneckConfig::new(c, c).init(device)),
                    c3k: None,
                    psa: Some(PsaBlockConfig::new(c, (c / 64).max(1)).init(device)),
                },
            })
            .collect();
        C3k2 {
            cv1: ConvBnConfig::new(self.c_in, 2 * c).init(device),
            cv2: ConvBnConfig::new((2 + self.n) * c, self.c_out).init(device),
            blocks,
        }
    }
}

/// One inner block of a C3k2; exactly the fields its [`C3k2Inner`] kind needs are present.
#[derive(Module, Debug)]
pub struct C3k2Block {
    pub bottleneck: Option<Bottleneck>,
    pub c3k: Option<C3k>,
    pub psa: Option<PsaBlock>,
}

impl C3k2Block {
    pub fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        let mut y = x;
        if let Some(b) = &self.bottleneck {
            y = b.forward(y);
        }
        if let Some(c) = &self.c3k {
            y = c.forward(y);
        }
        if let Some(p) = &self.psa {
            y = p.forward(y);
        }
        y
    }

    pub fn macs(&self, h: usize, w: usize) -> u64 {
        self.bottleneck.as_ref().map_or(0, |b| b.macs(h, w))
            + self.c3k.as_ref().map_or(0, |c| c.macs(h, w))
            + self.psa.as_ref().map_or(0, |p| p.macs(h, w))
    }
}

#[derive(Module, Debug)]
pub struct C3k2 {
    pub cv1: ConvBn,
    pub cv2: ConvBn,
    pub blocks: Vec<C3k2Block>,
}

impl C3k2 {
    /// `cv2(cat[y₀, y₁, m₁(y₁), m₂(m₁(y₁)), …])` for `cv1(x)`'s halves `y₀, y₁`, computed as
    /// `cat[y, m₁, …]`: the same values, while the backward takes one slice of `y` instead of
    /// two (each a zero-filled full-size gradient, and their sum).
    pub fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        let y = self.cv1.forward(x);
        let half = y.dims()[1] / 2;
        let mut last = y.clone().narrow(1, half, half);
        let mut ys = vec![y];
        for block in &self.blocks {
            last = block.forward(last);
            ys.push(last.clone());
        }
        self.cv2.forward(Tensor::cat(ys, 1))
    }

    pub fn macs(&self, h: usize, w: usize) -> u64 {
        self.cv1.macs(h, w).0
            + self.cv2.macs(h, w).0
            + self.blocks.iter().map(|b| b.macs(h, w)).sum::<u64>()
    }
}

/// Spatial pyramid pooling, fast: cv1, three chained 5×5 max-pools, concat, cv2 (+ residual).
#[derive(Config, Debug)]
pub struct SppfConfig {
    pub c_in: usize,
    pub c_out: usize,
    #[config(default = 5)]
    pub pool: usize,
    #[config(default = 3)]
    pub pools: usize,
    /// YOLO26: cv1 without SiLU and a residual around the block (when `c_in == c_out`).
    #[config(default = true)]
    pub yolo26: bool,
}

impl SppfConfig {
    pub fn init(&self, device: &Device) -> Sppf {
        let hidden = self.c_in / 2;
        let pad = self.pool / 2;
        Sppf {
            cv1: ConvBnConfig::new(self.c_in, hidden)
                .with_act(!self.yolo26)
                .init(device),
            cv2: ConvBnConfig::new(hidden * (self.pools + 1), self.c_out).init(device),
            pool: MaxPool2dConfig::new([self.pool, self.pool])
                .with_strides([1, 1])
                .with_padding(PaddingConfig2d::Explicit(pad, pad, pad, pad))
                .init(),
            pools: self.pools,
            add: self.yolo26 && self.c_in == self.c_out,
        }
    }
}

#[derive(Module, Debug)]
pub struct Sppf {
    pub cv1: ConvBn,
    pub cv2: ConvBn,
    pub pool: MaxPool2d,
    pub pools: usize,
    pub add: bool,
}

impl Sppf {
    pub fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        let mut ys = vec![self.cv1.forward(x.clone())];
        for _ in 0..self.pools {
            let last = ys.last().expect("starts with cv1").clone();
            ys.push(self.pool.forward(last));
        }
        let y = self.cv2.forward(Tensor::cat(ys, 1));
        if self.add { x + y } else { y }
    }

    pub fn macs(&self, h: usize, w: usize) -> u64 {
        self.cv1.macs(h, w).0 + self.cv2.macs(h, w).0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ParamCount;

    // Per-layer parameter counts from yolo_spec §1.2.
    #[test]
    fn c3k2_layer_counts_match_reference() {
        let d = Device::flex();
        let l2 = C3k2Config::new(32, 64, C3k2Inner::Bottleneck)
            .with_expansion(0.25)
            .init(&d);
        assert_eq!(l2.param_count(), 6_640);
        let l6 = C3k2Config::new(128, 128, C3k2Inner::C3k).init(&d);
        assert_eq!(l6.param_count(), 87_040);
        let l22 = C3k2Config::new(384, 256, C3k2Inner::Attention).init(&d);
        assert_eq!(l22.param_count(), 463_104);
    }

    #[test]
    fn sppf_count_and_shape() {
        let d = Device::flex();
        let sppf = SppfConfig::new(256, 256).init(&d);
        assert_eq!(sppf.param_count(), 164_608);
        let y = sppf.forward(Tensor::zeros([1, 256, 4, 4], &d));
        assert_eq!(y.dims(), [1, 256, 4, 4]);
    }

    #[test]
    fn c3k2_keeps_spatial_size() {
        let d = Device::flex();
        let block = C3k2Config::new(16, 32, C3k2Inner::C3k).init(&d);
        let y = block.forward(Tensor::ones([2, 16, 8, 8], &d));
        assert_eq!(y.dims(), [2, 32, 8, 8]);
    }

    /// The forward `cat[y, m₁, …]` gives what `cat[y₀, y₁, m₁, …]` of `cv1(x)`'s two chunks gives:
    /// the same output bits, and the input's and every parameter's gradient up to rounding; for
    /// each kind of inner block, two blocks, odd sizes and an odd batch.
    #[test]
    fn c3k2_concatenating_the_whole_cv1_output_equals_its_two_halves() {
        let d = Device::flex().autodiff();
        d.seed(7);
        let chunked = |m: &C3k2, x: Tensor<4>| {
            let mut ys = m.cv1.forward(x).chunk(2, 1);
            for block in &m.blocks {
                let last = ys.last().expect("two halves").clone();
                ys.push(block.forward(last));
            }
            m.cv2.forward(Tensor::cat(ys, 1))
        };
        for (inner, n) in [
            (C3k2Inner::Bottleneck, 2),
            (C3k2Inner::C3k, 1),
            (C3k2Inner::Attention, 1),
        ] {
            let m = C3k2Config::new(16, 24, inner).with_n(n).init(&d).train();
            let shape = [3, 16, 7, 9];
            // Fixed values (the device's generator is shared with tests running beside this one).
            let fill = |dims: [usize; 4], k: f32| {
                let n: usize = dims.iter().product();
                let v: Vec<f32> = (0..n).map(|i| (i as f32 * k).sin()).collect();
                Tensor::<1>::from_floats(v.as_slice(), &d).reshape(dims)
            };
            let x = fill(shape, 0.37);
            let probe = fill([3, 24, 7, 9], 0.61);
            let run = |f: &dyn Fn(Tensor<4>) -> Tensor<4>| {
                let x = x.clone().require_grad();
                let y = f(x.clone());
                let grads = (y.clone() * probe.clone()).sum().backward();
                let mut g = vec![
                    y.inner().into_data(),
                    x.grad(&grads).expect("x").into_data(),
                ];
                let by_id = burn::optim::GradientsParams::from_grads(grads, &m);
                let mut params = Vec::new();
                struct Grads<'a>(&'a burn::optim::GradientsParams, &'a mut Vec<TensorData>);
                impl burn::module::ModuleVisitor for Grads<'_> {
                    fn visit_float<const D: usize>(&mut self, p: &burn::module::Param<Tensor<D>>) {
                        if let Some(g) = self.0.get::<D>(p.id) {
                            self.1.push(g.into_data());
                        }
                    }
                }
                m.visit(&mut Grads(&by_id, &mut params));
                assert!(params.len() > 10, "{} parameter gradients", params.len());
                g.extend(params);
                g
            };
            let ours = run(&|x| m.forward(x));
            let theirs = run(&|x| chunked(&m, x));
            assert_eq!(ours.len(), theirs.len());
            // The output is the same bits. The gradient of `cv1`'s output gathers the same
            // terms in another association (a block's input gradient is summed before it
            // meets the concatenation's), so it and what follows from it may differ by rounding.
            // Rounding is measured against each tensor's largest value: BatchNorm's backward
            // subtracts means, so a small element may carry a larger relative error.
            ours[0].assert_eq(&theirs[0], true);
            for (i, (a, b)) in ours.iter().zip(&theirs).enumerate().skip(1) {
                let (a, b) = (
                    a.try_to_vec::<f32>().unwrap(),
                    b.try_to_vec::<f32>().unwrap(),
                );
                let err = crate::test_util::rel(&a, &b);
                assert!(
                    err <= 1e-4,
                    "{inner:?}: gradient {i} differs by {err:e} of its largest value"
                );
            }
        }
    }
}
