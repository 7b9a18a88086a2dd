//! YOLO26 dual head (yolo_spec §2): per level box / class branches, and for pose the keypoint
//! "point stems" with keypoint and sigma predictors, in a one-to-many and a one-to-one copy.
//! The one-to-one copy reads detached features, so its loss never reaches backbone or neck.

use super::backbone::Features;
use super::conv::{ConvBn, ConvBnConfig, conv_macs, plain_conv};
use super::flow::{RealNvp, RealNvpConfig};
use super::ops::conv_forward;
use burn::module::{ModuleMapper, Param};
use burn::nn::conv::Conv2d;
use burn::prelude::*;

/// Strides of P3/P4/P5.
pub const STRIDES: [usize; 3] = [8, 16, 32];

#[derive(Config, Debug)]
pub struct HeadConfig {
    /// Channels of P3/P4/P5.
    pub channels: [usize; 3],
    /// Number of classes.
    pub nc: usize,
    /// Keypoints and values per keypoint, `[17, 3]` for COCO; `None` for the detection head.
    pub kpt_shape: Option<[usize; 2]>,
    /// Image size the class-bias prior is computed for.
    #[config(default = 640)]
    pub prior_imgsz: usize,
}

impl HeadConfig {
    pub fn init(&self, device: &Device) -> Head {
        let one2many = self.init_branches(device);
        // The one-to-one branches start as exact copies with their own parameter ids and their
        // own BatchNorm running statistics: `clone()` shares a running state (one Arc), and a
        // mapper only replaces the value inside it, so the copies would both update one state;
        // `valid().train()` gives each running state a new Arc first.
        let one2one = one2many.valid().train().map(&mut FreshCopy {
            device: device.clone(),
        });
        Head {
            one2many,
            one2one,
            flow: self.kpt_shape.map(|_| RealNvpConfig::new().init(device)),
            nc: self.nc,
            nk: self.kpt_shape.map_or(0, |[k, _]| k),
            kpt_dim: self.kpt_shape.map_or(0, |[_, d]| d),
        }
    }

    fn init_branches(&self, device: &Device) -> Branches {
        let ch0 = self.channels[0];
        let c2 = 16.max(ch0 / 4).max(4);
        let c3 = ch0.max(self.nc.min(100));
        let levels = self.channels.iter().zip(STRIDES);
        let boxes = levels
            .clone()
            .map(|(&c, _)| {
                let mut out = plain_conv(c2, 4, 1, device);
                set_bias(&mut out, 2.0, device);
                BoxBranch {
                    cv1: ConvBnConfig::new(c, c2).with_kernel(3).init(device),
                    cv2: ConvBnConfig::new(c2, c2).with_kernel(3).init(device),
                    out,
                }
            })
            .collect();
        let classes = levels
            .map(|(&c, stride)| {
                let mut out = plain_conv(c3, self.nc, 1, device);
                let cells = (self.prior_imgsz as f64 / stride as f64).powi(2);
                set_bias(&mut out, (5.0 / self.nc as f64 / cells).ln(), device);
                ClassBranch {
                    dw1: ConvBnConfig::depthwise(c, c, 3).init(device),
                    pw1: ConvBnConfig::new(c, c3).init(device),
                    dw2: ConvBnConfig::depthwise(c3, c3, 3).init(device),
                    pw2: ConvBnConfig::new(c3, c3).init(device),
                    out,
                }
            })
            .collect();
        let pose = self.kpt_shape.map(|[nk, kd]| {
            let c4 = (ch0 / 4).max(nk * (kd + 2));
            PoseBranches {
                point_stems: self
                    .channels
                    .iter()
                    .map(|&c| PointStem {
                        cv1: ConvBnConfig::new(c, c4).with_kernel(3).init(device),
                        cv2: ConvBnConfig::new(c4, c4).with_kernel(3).init(device),
                    })
                    .collect(),
                kpts: (0..3).map(|_| plain_conv(c4, nk * kd, 1, device)).collect(),
                sigma: (0..3).map(|_| plain_conv(c4, nk * 2, 1, device)).collect(),
            }
        });
        Branches {
            boxes,
            classes,
            pose,
        }
    }
}

fn set_bias(conv: &mut Conv2d, value: f64, device: &Device) {
    let c_out = conv.weight.shape().dims::<4>()[0];
    conv.bias = Some(Param::from_tensor(Tensor::full([c_out], value, device)));
}

/// Deep copy with new parameter ids and buffers (PyTorch's `copy.deepcopy` of a branch).
struct FreshCopy {
    device: Device,
}

impl ModuleMapper for FreshCopy {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        Param::from_data(param.val().into_data(), &self.device)
    }
}

/// Conv3×3 → Conv3×3 → Conv1×1(4): l, t, r, b distances in grid units.
#[derive(Module, Debug)]
pub struct BoxBranch {
    pub cv1: ConvBn,
    pub cv2: ConvBn,
    pub out: Conv2d,
}

/// Depthwise-separable class branch: [DW3×3 → 1×1] × 2 → 1×1(nc) logits.
#[derive(Module, Debug)]
pub struct ClassBranch {
    pub dw1: ConvBn,
    pub pw1: ConvBn,
    pub dw2: ConvBn,
    pub pw2: ConvBn,
    pub out: Conv2d,
}

/// Keypoint "point stem": Conv3×3 → Conv3×3, shared by the keypoint and sigma predictors.
/// Only keypoint losses reach it, so a batch without positives leaves it without gradient.
#[derive(Module, Debug)]
pub struct PointStem {
    pub cv1: ConvBn,
    pub cv2: ConvBn,
}

impl PointStem {
    pub fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        self.cv2.forward(self.cv1.forward(x))
    }
}

#[derive(Module, Debug)]
pub struct PoseBranches {
    pub point_stems: Vec<PointStem>,
    /// 1×1 → nk·kpt_dim, keypoint-major `[x0, y0, v0, x1, …]`.
    pub kpts: Vec<Conv2d>,
    /// 1×1 → nk·2 raw sigmas `[σx0, σy0, …]` (training only).
    pub sigma: Vec<Conv2d>,
}

/// One copy (one-to-many or one-to-one) of every per-level branch.
#[derive(Module, Debug)]
pub struct Branches {
    pub boxes: Vec<BoxBranch>,
    pub classes: Vec<ClassBranch>,
    pub pose: Option<PoseBranches>,
}

/// Raw per-anchor predictions of one branch copy; anchors are P3 cells, then P4, then P5.
#[derive(Clone, Debug)]
pub struct BranchOutput {
    /// `[B, 4, A]` ltrb distances (grid units).
    pub boxes: Tensor<3>,
    /// `[B, nc, A]` class logits.
    pub scores: Tensor<3>,
    /// `[B, nk·kpt_dim, A]` raw keypoint offsets and visibility logits.
    pub kpts: Option<Tensor<3>>,
    /// `[B, nk·2, A]` raw sigmas.
    pub kpts_sigma: Option<Tensor<3>>,
}

#[derive(Clone, Debug)]
pub struct HeadOutput {
    pub one2many: BranchOutput,
    pub one2one: BranchOutput,
}

impl Branches {
    pub fn forward(&self, levels: [Tensor<4>; 3]) -> BranchOutput {
        self.forward_with_stems(levels, None)
    }

    /// [`Branches::forward`] with the point stems' outputs given instead of computed (by a
    /// recording that includes the stems: the feature-replay negative control).
    pub(crate) fn forward_with_stems(
        &self,
        levels: [Tensor<4>; 3],
        stems: Option<[Tensor<4>; 3]>,
    ) -> BranchOutput {
        let mut boxes = Vec::with_capacity(3);
        let mut scores = Vec::with_capacity(3);
        let mut kpts = Vec::with_capacity(3);
        let mut sigma = Vec::with_capacity(3);
        for (i, x) in levels.into_iter().enumerate() {
            let b = &self.boxes[i];
            boxes.push(flat(conv_forward(
                &b.out,
                b.cv2.forward(b.cv1.forward(x.clone())),
            )));
            let c = &self.classes[i];
            let y = c
                .pw2
                .forward(c.dw2.forward(c.pw1.forward(c.dw1.forward(x.clone()))));
            scores.push(flat(conv_forward(&c.out, y)));
            if let Some(p) = &self.pose {
                let s = match &stems {
                    Some(given) => given[i].clone(),
                    None => p.point_stems[i].forward(x),
                };
                kpts.push(flat(conv_forward(&p.kpts[i], s.clone())));
                sigma.push(flat(conv_forward(&p.sigma[i], s)));
            }
        }
        let pose = self.pose.is_some();
        BranchOutput {
            boxes: Tensor::cat(boxes, 2),
            scores: Tensor::cat(scores, 2),
            kpts: pose.then(|| Tensor::cat(kpts, 2)),
            kpts_sigma: pose.then(|| Tensor::cat(sigma, 2)),
        }
    }

    pub fn macs(&self, sizes: [(usize, usize); 3]) -> u64 {
        let mut total = 0;
        for (i, (h, w)) in sizes.into_iter().enumerate() {
            let b = &self.boxes[i];
            total += b.cv1.macs(h, w).0 + b.cv2.macs(h, w).0 + conv_macs(&b.out, h, w).0;
            let c = &self.classes[i];
            total += c.dw1.macs(h, w).0
                + c.pw1.macs(h, w).0
                + c.dw2.macs(h, w).0
                + c.pw2.macs(h, w).0
                + conv_macs(&c.out, h, w).0;
            if let Some(p) = &self.pose {
                let s = &p.point_stems[i];
                total += s.cv1.macs(h, w).0
                    + s.cv2.macs(h, w).0
                    + conv_macs(&p.kpts[i], h, w).0
                    + conv_macs(&p.sigma[i], h, w).0;
            }
        }
        total
    }
}

/// `[B, C, H, W]` → `[B, C, H·W]`.
fn flat(x: Tensor<4>) -> Tensor<3> {
    let [b, c, h, w] = x.dims();
    x.reshape([b, c, h * w])
}

/// Pose26 (with `flow`) or the YOLO26 detection head (without).
#[derive(Module, Debug)]
pub struct Head {
    pub one2many: Branches,
    pub one2one: Branches,
    /// RealNVP flow for the RLE loss, shared by both copies (pose only).
    pub flow: Option<RealNvp>,
    pub nc: usize,
    pub nk: usize,
    pub kpt_dim: usize,
}

impl Head {
    /// Training forward: both copies; the one-to-one copy sees detached features.
    pub fn forward(&self, features: &Features) -> HeadOutput {
        self.run(features, None)
    }

    /// [`Head::forward`] with the one-to-many point stems' outputs given
    /// ([`Branches::forward_with_stems`]; tests and the `controls` feature only).
    #[cfg(any(test, feature = "controls"))]
    pub fn forward_with_stems(
        &self,
        features: &Features,
        stems: Option<[Tensor<4>; 3]>,
    ) -> HeadOutput {
        self.run(features, stems)
    }

    fn run(&self, features: &Features, stems: Option<[Tensor<4>; 3]>) -> HeadOutput {
        let levels = features.clone().into_levels();
        let detached = levels.clone().map(|x| x.detach());
        HeadOutput {
            one2many: self.one2many.forward_with_stems(levels, stems),
            one2one: self.one2one.forward(detached),
        }
    }

    /// Inference forward: the one-to-one (NMS-free) copy only.
    pub fn forward_one2one(&self, features: &Features) -> BranchOutput {
        self.one2one.forward(features.clone().into_levels())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ParamCount;

    fn pose_head(d: &Device) -> Head {
        HeadConfig::new([64, 128, 256], 1)
            .with_kpt_shape(Some([17, 3]))
            .init(d)
    }

    #[test]
    fn pose_head_counts_match_reference() {
        let d = Device::flex();
        let head = pose_head(&d);
        // yolo_spec §2.1, per copy: box 71,820; cls 48,963; stems 538,815; kpt 13,158; sigma 8,772.
        let pose = head.one2many.pose.as_ref().unwrap();
        let boxes: usize = head.one2many.boxes.iter().map(|b| b.param_count()).sum();
        let classes: usize = head.one2many.classes.iter().map(|c| c.param_count()).sum();
        let stems: usize = pose.point_stems.iter().map(|s| s.param_count()).sum();
        let kpts: usize = pose.kpts.iter().map(|k| k.param_count()).sum();
        let sigma: usize = pose.sigma.iter().map(|k| k.param_count()).sum();
        assert_eq!(
            [boxes, classes, stems, kpts, sigma],
            [71_820, 48_963, 538_815, 13_158, 8_772]
        );
        assert_eq!(head.param_count(), 1_416_840);
    }

    #[test]
    fn bias_prior_and_deep_copy() {
        let d = Device::flex();
        let head = pose_head(&d);
        let bias = |c: &Conv2d| {
            c.bias
                .as_ref()
                .unwrap()
                .val()
                .into_data()
                .try_to_vec::<f32>()
                .unwrap()
        };
        let cls = bias(&head.one2many.classes[0].out)[0];
        assert!((cls - (-7.1546)).abs() < 1e-3, "P3 class prior {cls}");
        assert!((bias(&head.one2many.classes[2].out)[0] - (-4.3820)).abs() < 1e-3);
        assert_eq!(bias(&head.one2many.boxes[1].out), vec![2.0; 4]);
        // one2one starts equal to one2many but owns distinct parameters.
        let a = &head.one2many.point_stems_weight();
        let b = &head.one2one.point_stems_weight();
        assert_eq!(a.1, b.1);
        assert_ne!(a.0, b.0);
    }

    /// The copies' BatchNorm running statistics are separate states, as after PyTorch's
    /// `deepcopy`: updating one leaves the other as it was.
    #[test]
    fn copies_keep_their_own_running_statistics() {
        let d = Device::flex();
        let head = pose_head(&d);
        let bn = |b: &Branches| b.boxes[0].cv1.bn.running_mean.clone();
        let before = bn(&head.one2one).value_sync().into_data();
        let other = bn(&head.one2many).value_sync().ones_like();
        bn(&head.one2many).update(other);
        assert_eq!(bn(&head.one2one).value_sync().into_data(), before);
        assert_ne!(bn(&head.one2many).value_sync().into_data(), before);
    }

    /// Handing the head its own point stems' outputs changes nothing; handing it others changes
    /// only the keypoint outputs of the one-to-many copy.
    #[test]
    fn given_stems_replace_only_the_stems() {
        let d = Device::flex();
        let head = pose_head(&d).valid();
        let f = Features {
            p3: Tensor::random([1, 64, 8, 8], burn::tensor::Distribution::Default, &d),
            p4: Tensor::random([1, 128, 4, 4], burn::tensor::Distribution::Default, &d),
            p5: Tensor::random([1, 256, 2, 2], burn::tensor::Distribution::Default, &d),
        };
        let stems = |h: &Head| {
            let p = h.one2many.pose.as_ref().unwrap();
            let [a, b, c] = f.levels();
            [
                p.point_stems[0].forward(a.clone()),
                p.point_stems[1].forward(b.clone()),
                p.point_stems[2].forward(c.clone()),
            ]
        };
        let bits = |t: &Tensor<3>| t.clone().into_data().try_to_vec::<f32>().unwrap();
        let plain = head.forward(&f);
        let same = head.forward_with_stems(&f, Some(stems(&head)));
        let kpts = |o: &BranchOutput| bits(o.kpts.as_ref().unwrap());
        assert_eq!(kpts(&plain.one2many), kpts(&same.one2many));
        assert_eq!(bits(&plain.one2many.boxes), bits(&same.one2many.boxes));
        let other = head.forward_with_stems(&f, Some(stems(&head).map(|s| s * 2.0)));
        assert_ne!(kpts(&plain.one2many), kpts(&other.one2many));
        assert_eq!(bits(&plain.one2many.scores), bits(&other.one2many.scores));
        assert_eq!(kpts(&plain.one2one), kpts(&other.one2one));
    }

    impl Branches {
        fn point_stems_weight(&self) -> (burn::module::ParamId, Vec<f32>) {
            let w = &self.pose.as_ref().unwrap().point_stems[0].cv1.conv.weight;
            (w.id, w.val().into_data().try_to_vec::<f32>().unwrap())
        }
    }
}
