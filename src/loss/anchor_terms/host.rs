//! [`super::LossOps::anchor_terms`] on the CPU: one loop over the anchors, forward and backward.
//! The formulas, operation by operation, are `kernels/anchor_terms.rs`' (the CUDA kernels'),
//! written once more here in Rust: the GPU test compares the two, and [`ciou_grad`] is checked
//! against forward-mode derivatives ([`crate::loss::dual`]) in CI.

use crate::loss::assign::device::PACKED;
use crate::loss::geometry::ciou;
use crate::loss::terms::{bce, sign};
use crate::model::ops::host::{tensor, values};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Flex, TensorMetadata};

/// CIoU's epsilon; the OKS area's and the label count's (the kernels' too).
pub(super) const E: f32 = 1e-7;
pub(super) const AREA_E: f32 = 1e-9;

/// CIoU's aspect-term constant `4 / π²` in f32, as the tensor operations' scalar (the kernels
/// take it as an argument).
pub(super) fn v_scale() -> f32 {
    4.0 / (std::f32::consts::PI * std::f32::consts::PI)
}

/// `∂ CIoU(a, b) / ∂a` (`a` the prediction) in reverse mode through [`ciou`]'s operations, α
/// held fixed; ties of `min`/`max` give the derivative to `a`, `max(·, 0)` passes at zero (as
/// autodiff through the tensor operations takes them).
pub fn ciou_grad(a: [f32; 4], b: [f32; 4]) -> [f32; 4] {
    let (w1, h1) = (a[2] - a[0], a[3] - a[1] + E);
    let (w2, h2) = (b[2] - b[0], b[3] - b[1] + E);
    let iw = a[2].min(b[2]) - a[0].max(b[0]);
    let ih = a[3].min(b[3]) - a[1].max(b[1]);
    let (iwc, ihc) = (iw.max(0.0), ih.max(0.0));
    let inter = iwc * ihc;
    let union = w1 * h1 + w2 * h2 - inter + E;
    let iou = inter / union;
    let cw = a[2].max(b[2]) - a[0].min(b[0]);
    let ch = a[3].max(b[3]) - a[1].min(b[1]);
    let c2 = cw * cw + ch * ch + E;
    let (dxs, dys) = (b[0] + b[2] - a[0] - a[2], b[1] + b[3] - a[1] - a[3]);
    let rho2 = (dxs * dxs + dys * dys) / 4.0;
    let r1 = w1 / h1;
    let t = (w2 / h2).atan() - r1.atan();
    let v = t * t * v_scale();
    let alpha = v / (v - iou + (1.0 + E));

    let d_rho2 = -1.0 / c2;
    let d_c2 = rho2 / (c2 * c2);
    let d_t = -alpha * 2.0 * t * v_scale();
    let d_r1 = -d_t / (1.0 + r1 * r1);
    let d_union = -inter / (union * union);
    let d_inter = 1.0 / union - d_union;
    let d_w1 = d_r1 / h1 + d_union * h1;
    let d_h1 = -d_r1 * w1 / (h1 * h1) + d_union * w1;
    let d_iw = if iw >= 0.0 { d_inter * ihc } else { 0.0 };
    let d_ih = if ih >= 0.0 { d_inter * iwc } else { 0.0 };
    let (d_cw, d_ch) = (d_c2 * 2.0 * cw, d_c2 * 2.0 * ch);
    let (d_dxs, d_dys) = (d_rho2 * 2.0 * dxs / 4.0, d_rho2 * 2.0 * dys / 4.0);
    let mut g = [-d_w1 - d_dxs, -d_h1 - d_dys, d_w1 - d_dxs, d_h1 - d_dys];
    let on = |c: bool, x: f32| if c { x } else { 0.0 };
    g[2] += on(a[2] <= b[2], d_iw) + on(a[2] >= b[2], d_cw);
    g[0] -= on(a[0] >= b[0], d_iw) + on(a[0] <= b[0], d_cw);
    g[3] += on(a[3] <= b[3], d_ih) + on(a[3] >= b[3], d_ch);
    g[1] -= on(a[1] >= b[1], d_ih) + on(a[1] <= b[1], d_ch);
    g
}

/// [`bce`]'s derivative in `x` as autodiff takes it (`clamp_min` passes at zero, `|x|`' slope is zero
/// there).
fn bce_grad(x: f32, t: f32) -> f32 {
    let e = (-x.abs()).exp();
    let step = if x >= 0.0 { 1.0 } else { 0.0 };
    step - t - sign(x) * e / (1.0 + e)
}

/// One foreground anchor's inputs: box distances `l`, raw keypoints `kp` (`K·kd`), centre `c`
/// and stride `s`, its object's slot `obj` (`6 + 3K` packed values, pixels), the alignment
/// weight `w`, `8σ²` per keypoint `sig`, the image `[h, w]`.
pub struct Anchor<'a> {
    pub l: [f32; 4],
    pub kp: &'a [f32],
    pub c: [f32; 2],
    pub s: f32,
    pub obj: &'a [f32],
    pub w: f32,
    pub sig: &'a [f32],
    pub size: [usize; 2],
}

impl Anchor<'_> {
    fn k(&self) -> usize {
        self.sig.len()
    }
    fn kd(&self) -> usize {
        self.kp.len() / self.k()
    }
    /// The object's box in grid units.
    fn gt(&self) -> [f32; 4] {
        std::array::from_fn(|i| self.obj[2 + i] / self.s)
    }
    fn pred(&self) -> [f32; 4] {
        let ([cx, cy], l) = (self.c, self.l);
        [cx - l[0], cy - l[1], cx + l[2], cy + l[3]]
    }
    /// The L1 term's scaled errors per side and their scales.
    fn l1_errors(&self) -> ([f32; 4], [f32; 4]) {
        let (g, [cx, cy], s) = (self.gt(), self.c, self.s);
        let (sx, sy) = (s / self.size[1] as f32, s / self.size[0] as f32);
        let target = [cx - g[0], cy - g[1], g[2] - cx, g[3] - cy];
        let scale = [sx, sy, sx, sy];
        (
            std::array::from_fn(|i| (self.l[i] - target[i]) * scale[i]),
            scale,
        )
    }
    fn visible(&self, k: usize) -> bool {
        self.obj[PACKED + 3 * k + 2] != 0.0
    }
    /// `K / (labelled + 1e-9)` and the labelled count.
    fn factor(&self) -> (f32, f32) {
        let seen = (0..self.k()).filter(|&k| self.visible(k)).count() as f32;
        (1.0 / (seen + AREA_E) * self.k() as f32, seen)
    }
    /// Keypoint `k`'s offsets from its target and the OKS denominator.
    fn offsets(&self, k: usize, area: f32) -> (f32, f32, f32) {
        let (kd, [cx, cy], s) = (self.kd(), self.c, self.s);
        let dx = self.kp[k * kd] + cx - self.obj[PACKED + 3 * k] / s;
        let dy = self.kp[k * kd + 1] + cy - self.obj[PACKED + 3 * k + 1] / s;
        (dx, dy, self.sig[k] * (area + AREA_E))
    }

    /// The five values: box, L1, OKS, visibility BCE, labelled.
    pub fn values(&self) -> [f32; 5] {
        let (g, w) = (self.gt(), self.w);
        let box_term = (-ciou(self.pred(), g) + 1.0) * w;
        let (e, _) = self.l1_errors();
        let l1 = (e[0].abs() + e[1].abs() + e[2].abs() + e[3].abs()) / 4.0 * w;
        let area = (g[2] - g[0]) * (g[3] - g[1]);
        let (factor, seen) = self.factor();
        let (mut pose, mut kobj) = (0.0, 0.0);
        for k in 0..self.k() {
            let (dx, dy, den) = self.offsets(k, area);
            let e = (dx * dx + dy * dy) / den;
            if self.visible(k) {
                pose += factor * (-(-e).exp() + 1.0);
            }
            if self.kd() == 3 {
                kobj += bce(self.kp[k * 3 + 2], if self.visible(k) { 1.0 } else { 0.0 });
            }
        }
        [box_term, l1, pose, kobj, seen]
    }

    /// The gradients of `l` (into `dl`) and of `kp` (into `dk`, `K·kd`) for the incoming
    /// gradients `grad` of the first four values.
    pub fn grads(&self, grad: [f32; 4], dl: &mut [f32; 4], dk: &mut [f32]) {
        let [g_box, g_l1, g_pose, g_kobj] = grad;
        let (g, w) = (self.gt(), self.w);
        let da = ciou_grad(self.pred(), g);
        let gw = g_box * w;
        let (e, scale) = self.l1_errors();
        let q = g_l1 * w / 4.0;
        let dir = [gw * da[0], gw * da[1], -gw * da[2], -gw * da[3]];
        for i in 0..4 {
            dl[i] = dir[i] + q * sign(e[i]) * scale[i];
        }
        let area = (g[2] - g[0]) * (g[3] - g[1]);
        let (factor, _) = self.factor();
        let kd = self.kd();
        for k in 0..self.k() {
            let (dx, dy, den) = self.offsets(k, area);
            let e = (dx * dx + dy * dy) / den;
            let (mut gx, mut gy) = (0.0, 0.0);
            if self.visible(k) {
                let de = g_pose * factor * (-e).exp() / den;
                (gx, gy) = (de * 2.0 * dx, de * 2.0 * dy);
            }
            dk[k * kd] = gx;
            dk[k * kd + 1] = gy;
            if kd == 3 {
                let t = if self.visible(k) { 1.0 } else { 0.0 };
                dk[k * kd + 2] = g_kobj * bce_grad(self.kp[k * kd + 2], t);
            }
        }
    }
}

/// The values the loops read: every tensor contiguous, with `B, A, K, kd` and the slot width.
struct Inputs {
    boxes: Vec<f32>,
    kpts: Vec<f32>,
    fixed: [Vec<f32>; 8],
    b: usize,
    a: usize,
    kk: usize,
    width: usize,
}

impl Inputs {
    fn new(
        boxes: &FloatTensor<Flex>,
        kpts: &FloatTensor<Flex>,
        fixed: &[FloatTensor<Flex>; 8],
    ) -> Self {
        let (bs, ks, os) = (boxes.shape(), kpts.shape(), fixed[0].shape());
        Self {
            boxes: values(boxes).into_owned(),
            kpts: values(kpts).into_owned(),
            fixed: std::array::from_fn(|i| values(&fixed[i]).into_owned()),
            b: bs[0],
            a: bs[2],
            kk: ks[1],
            width: os[2],
        }
    }

    /// Anchor `a` of image `b`, or `None` off the foreground. `kp` receives its keypoints.
    fn anchor<'a>(
        &'a self,
        b: usize,
        a: usize,
        kp: &'a mut Vec<f32>,
        size: [usize; 2],
    ) -> Option<Anchor<'a>> {
        let [objects, slot, fg, weight, ax, ay, st, sig] = &self.fixed;
        let at = b * self.a + a;
        if fg[at] == 0.0 {
            return None;
        }
        let n = slot[at] as usize;
        let slots = objects.len() / (self.b * self.width);
        let o = (b * slots + n) * self.width;
        kp.clear();
        kp.extend((0..self.kk).map(|c| self.kpts[(b * self.kk + c) * self.a + a]));
        Some(Anchor {
            l: std::array::from_fn(|c| self.boxes[(b * 4 + c) * self.a + a]),
            kp,
            c: [ax[a], ay[a]],
            s: st[a],
            obj: &objects[o..o + self.width],
            w: weight[at],
            sig,
            size,
        })
    }
}

/// The forward on the CPU: `[5, B, A]`.
pub fn forward(
    boxes: &FloatTensor<Flex>,
    kpts: &FloatTensor<Flex>,
    fixed: &[FloatTensor<Flex>; 8],
    size: [usize; 2],
) -> FloatTensor<Flex> {
    let x = Inputs::new(boxes, kpts, fixed);
    let total = x.b * x.a;
    let mut out = vec![0.0f32; super::ROWS * total];
    let mut kp = Vec::new();
    for b in 0..x.b {
        for a in 0..x.a {
            if let Some(anchor) = x.anchor(b, a, &mut kp, size) {
                for (r, v) in anchor.values().into_iter().enumerate() {
                    out[r * total + b * x.a + a] = v;
                }
            }
        }
    }
    tensor(out, [super::ROWS, x.b, x.a])
}

/// The backward on the CPU: `(d_boxes [B, 4, A], d_kpts [B, K·kd, A])`.
pub fn backward(
    boxes: &FloatTensor<Flex>,
    kpts: &FloatTensor<Flex>,
    fixed: &[FloatTensor<Flex>; 8],
    grad: &FloatTensor<Flex>,
    size: [usize; 2],
) -> (FloatTensor<Flex>, FloatTensor<Flex>) {
    let x = Inputs::new(boxes, kpts, fixed);
    let grad = values(grad);
    let total = x.b * x.a;
    let mut d_boxes = vec![0.0f32; x.b * 4 * x.a];
    let mut d_kpts = vec![0.0f32; x.b * x.kk * x.a];
    let (mut kp, mut dk) = (Vec::new(), vec![0.0f32; x.kk]);
    for b in 0..x.b {
        for a in 0..x.a {
            let Some(anchor) = x.anchor(b, a, &mut kp, size) else {
                continue;
            };
            let at = b * x.a + a;
            let g = std::array::from_fn(|r| grad[r * total + at]);
            let mut dl = [0.0f32; 4];
            anchor.grads(g, &mut dl, &mut dk);
            for c in 0..4 {
                d_boxes[(b * 4 + c) * x.a + a] = dl[c];
            }
            for c in 0..x.kk {
                d_kpts[(b * x.kk + c) * x.a + a] = dk[c];
            }
        }
    }
    (
        tensor(d_boxes, [x.b, 4, x.a]),
        tensor(d_kpts, [x.b, x.kk, x.a]),
    )
}
