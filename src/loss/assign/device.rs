//! Task-aligned assignment as tensor operations on the predictions' device: the same rules as
//! the host [`assign`](super::assign) (yolo_spec §3.3–3.4), over a whole batch at once, with
//! no readback and no shape that depends on the values. That is what a recorded step needs
//! (docs/replay.md, "Step recording"): the host assigner reads the predictions back mid-step.
//!
//! Every object slot of every image is scored against every anchor (`[B, N, A]`); padded slots
//! take part in nothing. Each rule is written so that its result is the host's exactly where the
//! arithmetic is the same: the formulas evaluate in the host's order, the top-k and the
//! "largest overlap" choices pick the lowest index among equal values (a maximum, then the
//! minimum index holding it — two order-free reductions, so deterministic on any device), and
//! the sums over keypoints run in keypoint order. On the CPU backend this equals the host
//! assigner bit for bit (the tests); on CUDA `exp`, `atan` and `powf` are the device's own and
//! may differ from the host's in the last bit.

use super::{Anchors, AssignerConfig, EPS};
use crate::data::Instance;
use crate::model::{BranchOutput, STRIDES};
use burn::prelude::*;
use burn::tensor::kind::Basic;
use burn::tensor::{Bool, Int};
use std::f32::consts::PI;

#[cfg(feature = "cuda")]
use crate::model::ops::cuda_f32;
#[cfg(feature = "cuda")]
#[path = "../../../kernels/assign.rs"]
pub mod kernel_assign;
#[cfg(feature = "cuda")]
#[path = "../../../kernels/oks.rs"]
pub mod kernel_oks;
#[cfg(feature = "cuda")]
#[path = "../../../kernels/top_k.rs"]
pub mod top_k;

/// The anchors of one input size as `[1, 1, A]` tensors: cell centres in grid units and strides,
/// and the anchors' indices.
#[derive(Clone, Debug)]
pub struct AnchorTensors {
    pub x: Tensor<3>,
    pub y: Tensor<3>,
    pub stride: Tensor<3>,
    /// `[A]`: `0, 1, …, A − 1`, uploaded with the rest (made once, where [`iota`] makes its
    /// indices with a `cumsum` that on CUDA sums every earlier value for each output).
    pub index: Tensor<1, Int>,
}

impl AnchorTensors {
    pub fn new(anchors: &Anchors, device: &Device) -> Self {
        let a = anchors.len();
        let row = |v: Vec<f32>| Tensor::<1>::from_floats(v.as_slice(), device).reshape([1, 1, a]);
        Self {
            x: row(anchors.points.iter().map(|p| p[0]).collect()),
            y: row(anchors.points.iter().map(|p| p[1]).collect()),
            stride: row(anchors.strides.clone()),
            index: Tensor::<1, Int>::arange(0..a as i64, device),
        }
    }

    fn len(&self) -> usize {
        self.x.dims()[2]
    }
}

/// Columns of [`ObjectSlots::pack`]'s block before the keypoints: class, in use, box (the
/// kernels that read the block take it from here).
pub(crate) const PACKED: usize = 6;

/// The labelled objects of a batch in `N` slots per image (pixels of the network input); slots
/// past an image's objects are padding.
#[derive(Clone, Debug)]
pub struct ObjectSlots {
    /// `[B, N]`.
    pub class: Tensor<2, Int>,
    /// `[B, N, 4]` boxes `[x1, y1, x2, y2]`.
    pub boxes: Tensor<3>,
    /// `[B, N, K, 3]` keypoints `(x, y, v)` (pose).
    pub keypoints: Option<Tensor<4>>,
    /// `[B, N]`: the slot holds an object.
    pub valid: Tensor<2, Bool>,
    /// [`ObjectSlots::pack`]'s block these are views of, `[B, N, 6 + 3·nk]`.
    pub packed: Tensor<3>,
}

impl ObjectSlots {
    /// `labels` in `slots` slots per image (at least the largest image's count, and 1), with
    /// `nk` keypoints per object (0: none).
    pub fn new(labels: &[Vec<Instance>], slots: usize, nk: usize, device: &Device) -> Self {
        let n = Self::slots_for(labels, slots);
        Self::from_packed(Self::upload(labels, n, nk, device), nk)
    }

    /// [`ObjectSlots::pack`]'s block of `labels` in `n` slots, uploaded to `device` as
    /// `[B, n, 6 + 3·nk]`.
    pub fn upload(labels: &[Vec<Instance>], n: usize, nk: usize, device: &Device) -> Tensor<3> {
        let packed = Self::pack(labels, n, nk);
        Tensor::<1>::from_floats(packed.as_slice(), device).reshape([
            labels.len(),
            n,
            PACKED + 3 * nk,
        ])
    }

    /// The slots per image [`ObjectSlots::new`] uses: `slots`, the largest image's count or 1,
    /// whichever is largest.
    pub fn slots_for(labels: &[Vec<Instance>], slots: usize) -> usize {
        slots
            .max(1)
            .max(labels.iter().map(Vec::len).max().unwrap_or(0))
    }

    /// The objects as one `[B, n, 6 + 3·nk]` block of floats, per slot: class, whether it holds
    /// an object (1 or 0), the box, the keypoints. One upload, and what a recorded loss's fixed
    /// buffer holds. `n` must hold the largest image's objects.
    pub fn pack(labels: &[Vec<Instance>], n: usize, nk: usize) -> Vec<f32> {
        let width = PACKED + 3 * nk;
        let mut out = vec![0f32; labels.len() * n * width];
        for (i, image) in labels.iter().enumerate() {
            assert!(image.len() <= n, "{} objects in {n} slots", image.len());
            for (j, inst) in image.iter().enumerate() {
                let row = &mut out[(i * n + j) * width..][..width];
                row[0] = inst.class as f32;
                row[1] = 1.0;
                row[2..6].copy_from_slice(&inst.bbox);
                for (k, p) in inst.keypoints.iter().take(nk).enumerate() {
                    row[PACKED + 3 * k..][..3].copy_from_slice(p);
                }
            }
        }
        out
    }

    /// The objects from [`ObjectSlots::pack`]'s block on the device (casts and views only:
    /// nothing read back or uploaded).
    pub fn from_packed(packed: Tensor<3>, nk: usize) -> Self {
        let [b, n, _] = packed.dims();
        let column = |at: usize, width: usize| packed.clone().narrow(2, at, width);
        Self {
            class: column(0, 1).reshape([b, n]).int(),
            boxes: column(2, 4),
            keypoints: (nk > 0).then(|| column(PACKED, 3 * nk).reshape([b, n, nk, 3])),
            valid: column(1, 1).reshape([b, n]).greater_elem(0.5),
            packed,
        }
    }

    fn slots(&self) -> usize {
        self.class.dims()[1]
    }
}

/// The assignment of a batch: what [`super::Assignment`] holds per image, for all images.
#[derive(Clone, Debug)]
pub struct BatchAssignment {
    /// `[B, A]`.
    pub fg: Tensor<2, Bool>,
    /// `[B, A]` the object slot each anchor learns (0 where not foreground).
    pub gt_index: Tensor<2, Int>,
    /// `[B, nc, A]` soft class targets, laid out like the head's scores.
    pub target_scores: Tensor<3>,
    /// At most this many positives per image: every object slot keeps at most
    /// `min(topk, topk2)` of its top-k candidates (`N · min(topk, topk2)`, at most `A`).
    pub max_positives: usize,
}

/// `[0, 1, …, n − 1]` made on the device (Burn's `arange` uploads from the host, which a
/// recorded loss may not).
pub(crate) fn iota(n: usize, device: &Device) -> Tensor<1, Int> {
    Tensor::<1, Int>::ones([n], device).cumsum(0) - 1
}

/// One `[B, N, 1]` or `[B, 1, A]` coordinate of four.
fn part(t: &Tensor<3>, i: usize, dim: usize) -> Tensor<3> {
    t.clone().narrow(dim, i, 1)
}

/// [`super::super::geometry::ciou_of`] of boxes `a` and `b` given as broadcastable parts (every
/// object `[B, N, 1]` against every prediction `[B, 1, A]`, or anchor by anchor), in the host's
/// order of operations; the aspect weight α carries no gradient, as in Ultralytics' loss.
pub(crate) fn ciou(a: [Tensor<3>; 4], b: [Tensor<3>; 4]) -> Tensor<3> {
    const E: f32 = 1e-7;
    let [a0, a1, a2, a3] = a;
    let [b0, b1, b2, b3] = b;
    let sq = |x: Tensor<3>| x.clone() * x;
    let w1 = a2.clone() - a0.clone();
    let h1 = a3.clone() - a1.clone() + E;
    let w2 = b2.clone() - b0.clone();
    let h2 = b3.clone() - b1.clone() + E;
    let inter = (a2.clone().min_pair(b2.clone()) - a0.clone().max_pair(b0.clone())).clamp_min(0.0)
        * (a3.clone().min_pair(b3.clone()) - a1.clone().max_pair(b1.clone())).clamp_min(0.0);
    let union = w1.clone() * h1.clone() + w2.clone() * h2.clone() - inter.clone() + E;
    let iou = inter / union;
    let cw = a2.clone().max_pair(b2.clone()) - a0.clone().min_pair(b0.clone());
    let ch = a3.clone().max_pair(b3.clone()) - a1.clone().min_pair(b1.clone());
    let c2 = cw.clone() * cw + ch.clone() * ch + E;
    let rho2 = (sq(b0 + b2 - a0 - a2) + sq(b1 + b3 - a1 - a3)) / 4.0;
    let v = sq((w2 / h2).atan() - (w1 / h1).atan()) * (4.0 / (PI * PI));
    let alpha = (v.clone() / (v.clone() - iou.clone() + (1.0 + E))).detach();
    iou - (rho2 / c2 + v * alpha)
}

/// [`super::super::geometry::oks`] of every predicted pose (`px`, `py`: `[B, K, A]`) against
/// every object's keypoints (`[B, N, K, 3]`) with area `area` (`[B, N, 1]`), keypoint by
/// keypoint in order as the host sums.
/// On CUDA one launch of ours (`kernels/oks.rs`, the same formula).
fn oks(px: Tensor<3>, py: Tensor<3>, gt: Tensor<4>, area: Tensor<3>, sigmas: &[f32]) -> Tensor<3> {
    #[cfg(feature = "cuda")]
    if let Some(o) = oks_on_cuda(&px, &py, &gt, &area, sigmas) {
        return o;
    }
    let [b, n, _, _] = gt.dims();
    let a = px.dims()[2];
    let mut sum = Tensor::<3>::zeros([b, n, a], &px.device());
    let mut visible = Tensor::<3>::zeros([b, n, 1], &px.device());
    for (k, &s) in sigmas.iter().enumerate() {
        let g = gt.clone().narrow(2, k, 1).reshape([b, n, 3]);
        let seen = part(&g, 2, 2).not_equal_elem(0.0);
        let dx = px.clone().narrow(1, k, 1) - part(&g, 0, 2);
        let dy = py.clone().narrow(1, k, 1) - part(&g, 1, 2);
        let d = dx.clone() * dx + dy.clone() * dy;
        let term = (d.neg() / ((area.clone() + 1e-7) * (8.0 * s * s))).exp();
        let seen_a = seen.clone().expand([b, n, a]);
        sum = sum.clone().mask_where(seen_a, sum + term);
        visible = visible.clone().mask_where(seen, visible + 1.0);
    }
    sum / (visible + 1e-7)
}

/// [`oks`] by `kernels/oks.rs`, or `None` off CUDA or for inputs not in FP32. The inputs carry no
/// gradient (the assignment's); the result comes back on the inputs' device kind.
#[cfg(feature = "cuda")]
fn oks_on_cuda(
    px: &Tensor<3>,
    py: &Tensor<3>,
    gt: &Tensor<4>,
    area: &Tensor<3>,
    sigmas: &[f32],
) -> Option<Tensor<3>> {
    let c = oks_constants(sigmas, &px.device());
    let out = kernel_oks::oks(
        cuda_f32(px)?,
        cuda_f32(py)?,
        cuda_f32(gt)?,
        cuda_f32(area)?,
        cuda_f32(&c)?,
    );
    Some(on_kind_of(out, px))
}

/// The OKS kernels' per-keypoint constants `8·σ²` (`[K]`) on `device`, rounded as the tensor
/// operations' scalar is: f32, `(8·σ)·σ`.
#[cfg(feature = "cuda")]
fn oks_constants(sigmas: &[f32], device: &Device) -> Tensor<1> {
    let c: Vec<f32> = sigmas.iter().map(|&s| 8.0 * s * s).collect();
    Tensor::<1>::from_floats(c.as_slice(), device)
}

/// A kernel's result `c` as a tensor on `like`'s device kind (autodiff or not), as the tensor
/// operations it replaces would return it (and as `hsv_jitter` hands its result back).
#[cfg(feature = "cuda")]
fn on_kind_of<const D: usize, const E: usize>(
    c: burn_cubecl::tensor::CubeTensor,
    like: &Tensor<E>,
) -> Tensor<D> {
    let t = crate::model::ops::from_cube::<D>(c);
    if like.is_autodiff() {
        Tensor::from_inner(t)
    } else {
        t
    }
}

/// Where along `dim` each row of `values` (no NaN) first holds its maximum, as a mask of the
/// same shape: the maximum, then the lowest index (`iota`, the indices along `dim` broadcast to
/// `values`' shape) holding it. Two order-free reductions, so the same on any device.
fn first_max(values: Tensor<3>, dim: usize, iota: Tensor<3, Int>) -> Tensor<3, Bool> {
    let dims = values.dims();
    let top = match dim {
        2 => max_last(values.clone()),
        _ => values.clone().max_dim(dim),
    };
    let at = iota
        .clone()
        .mask_fill(values.not_equal(top.expand(dims)), dims[dim] as i64);
    let at = match dim {
        2 => min_last(at),
        _ => at.min_dim(dim),
    };
    iota.equal(at.expand(dims))
}

/// The divisor of `a` nearest its square root: the rows of the first stage of
/// [`last_in_stages`] and [`prefix_sum_last`].
fn stage_len(a: usize) -> usize {
    let root = (a as f64).sqrt();
    (1..=a)
        .filter(|d| a.is_multiple_of(*d))
        .min_by(|x, y| {
            (*x as f64 - root)
                .abs()
                .total_cmp(&(*y as f64 - root).abs())
        })
        .unwrap_or(1)
}

/// A reduction along the last dimension (`[B, N, A]` → `[B, N, 1]`) in two stages of about
/// `√A` values each: one reduction of a long row runs on one GPU thread, so the rows are cut
/// first. For reductions exact in any order (maximum, minimum, any): the same values as one
/// `reduce` of the whole row. `reduce` reduces dimension 2 of a rank-3 tensor.
fn last_in_stages<K: Basic>(
    t: Tensor<3, K>,
    reduce: impl Fn(Tensor<3, K>) -> Tensor<3, K>,
) -> Tensor<3, K> {
    let [b, n, a] = t.dims();
    let inner = stage_len(a);
    let first = reduce(t.reshape([b * n, a / inner, inner]));
    reduce(first.reshape([b, n, a / inner]))
}

/// The maximum along the last dimension, as `max_dim(2)` ([`last_in_stages`]).
fn max_last(t: Tensor<3>) -> Tensor<3> {
    last_in_stages(t, |x| x.max_dim(2))
}

/// [`max_last`]'s minimum, of indices.
fn min_last(t: Tensor<3, Int>) -> Tensor<3, Int> {
    last_in_stages(t, |x| x.min_dim(2))
}

/// Whether any along the last dimension, as `any_dim(2)` ([`last_in_stages`]).
fn any_last(t: Tensor<3, Bool>) -> Tensor<3, Bool> {
    last_in_stages(t, |x| x.any_dim(2))
}

/// The inclusive prefix sum along the last dimension of `[B, A]`, in two stages of about `√A`
/// values: Burn's `cumsum` on CUDA has each output sum every earlier value (O(A²) per row, ~0.1
/// ms for 8,400 anchors), here each sums at most one stage. Integer sums are exact in any
/// order: the same values as `cumsum(1)`.
pub(crate) fn prefix_sum_last(t: Tensor<2, Int>) -> Tensor<2, Int> {
    let [b, a] = t.dims();
    let inner = stage_len(a);
    let blocks = t.reshape([b, a / inner, inner]);
    let totals = blocks.clone().sum_dim(2);
    let before = totals.clone().cumsum(1) - totals;
    (blocks.cumsum(2) + before).reshape([b, a])
}

/// The `k` anchors of every `[B, N]` row of `values` (`[B, N, A]`, no NaN) with the largest
/// values, ties to the lower anchor: `k` rounds of [`first_max`], each taking its anchor out.
/// On CUDA the same rounds are one launch of ours (`kernels/top_k.rs`, the same mask).
fn top_mask(values: Tensor<3>, k: usize, iota: &Tensor<3, Int>) -> Tensor<3, Bool> {
    #[cfg(feature = "cuda")]
    if let Some(mask) = top_mask_on_cuda(&values, k) {
        return mask;
    }
    let [b, n, a] = values.dims();
    let iota = iota.clone().expand([b, n, a]);
    let mut values = values;
    let mut chosen = iota.clone().lower_elem(0);
    for _ in 0..k.min(a) {
        let hit = first_max(values.clone(), 2, iota.clone());
        chosen = chosen.bool_or(hit.clone());
        values = values.mask_fill(hit, f32::NEG_INFINITY);
    }
    chosen
}

/// [`top_mask`] by `kernels/top_k.rs`, or `None` off CUDA or for values not in FP32 (detached:
/// the assignment takes no gradient).
#[cfg(feature = "cuda")]
fn top_mask_on_cuda(values: &Tensor<3>, k: usize) -> Option<Tensor<3, Bool>> {
    let mask = top_k::top_k_mask(cuda_f32(values)?, k);
    Some(on_kind_of::<3, 3>(mask, values).equal_elem(1.0))
}

/// The assignment of every image of a batch from one branch copy's raw outputs (detached here),
/// as [`super::assign`] makes it image by image from the decoded predictions.
pub fn assign_batch(
    cfg: &AssignerConfig,
    anchors: &AnchorTensors,
    out: &BranchOutput,
    objects: &ObjectSlots,
    sigmas: &[f32],
) -> BatchAssignment {
    let [b, nc, a] = out.scores.dims();
    assert_eq!(
        a,
        anchors.len(),
        "anchor count of head output and input size disagree"
    );
    #[cfg(feature = "cuda")]
    if let Some(asg) = assign_on_cuda(cfg, anchors, out, objects, sigmas) {
        return asg;
    }
    let n = objects.slots();
    let device = out.scores.device();
    let (ax, ay, st) = (anchors.x.clone(), anchors.y.clone(), anchors.stride.clone());
    // Decoded as `targets::build_targets` decodes for the host: pixels, probabilities.
    let ltrb = out.boxes.clone().detach();
    let d = |i: usize| part(&ltrb, i, 1);
    let pred = [
        (ax.clone() - d(0)) * st.clone(),
        (ay.clone() - d(1)) * st.clone(),
        (ax.clone() + d(2)) * st.clone(),
        (ay.clone() + d(3)) * st.clone(),
    ];
    let probs = (out.scores.clone().detach().neg().exp() + 1.0).recip();
    let gt = objects.boxes.clone();
    let g = |i: usize| part(&gt, i, 2);
    let [x1, y1, x2, y2] = [g(0), g(1), g(2), g(3)];

    // Candidates: centre strictly inside the box, widened to `stal_min_side` (STAL); for pose
    // also on a pyramid level that suits the object's size, unless no anchor is.
    let widen = |lo: Tensor<3>, hi: Tensor<3>| {
        let narrow = (hi.clone() - lo.clone()).lower_elem(cfg.stal_min_side);
        let c = (lo.clone() + hi.clone()) / 2.0;
        let half = cfg.stal_min_side / 2.0;
        (
            lo.mask_where(narrow.clone(), c.clone() - half),
            hi.mask_where(narrow, c + half),
        )
    };
    let ((gx1, gx2), (gy1, gy2)) = (widen(x1.clone(), x2.clone()), widen(y1.clone(), y2.clone()));
    let (px, py) = (ax.clone() * st.clone(), ay.clone() * st.clone());
    let inside = |t: Tensor<3>| t.greater_elem(1e-9);
    let in_box = inside(px.clone() - gx1)
        .bool_and(inside(py.clone() - gy1))
        .bool_and(inside(gx2 - px))
        .bool_and(inside(gy2 - py))
        .bool_and(
            objects
                .valid
                .clone()
                .unsqueeze_dim::<3>(2)
                .expand([b, n, a]),
        );
    let candidate = if cfg.pose {
        let side = ((x2.clone() - x1.clone()) * (y2.clone() - y1.clone()))
            .clamp_min(0.0)
            .sqrt();
        let (finest, coarsest) = (STRIDES[0] as f32, STRIDES[2] as f32);
        let low = st
            .clone()
            .equal_elem(finest)
            .expand([b, n, a])
            .bool_or(side.clone().greater_equal(st.clone() * 2.0));
        let high = st
            .clone()
            .equal_elem(coarsest)
            .expand([b, n, a])
            .bool_or(side.lower_equal(st.clone() * 12.0));
        let gated = in_box.clone().bool_and(low).bool_and(high);
        let any = any_last(gated.clone()).expand([b, n, a]);
        in_box.mask_where(any, gated)
    } else {
        in_box
    };

    // Overlap: OKS (area = box area · 0.53) for pose objects with a labelled keypoint, else CIoU.
    let box_overlap = ciou([x1.clone(), y1.clone(), x2.clone(), y2.clone()], pred);
    let overlap = match (&objects.keypoints, &out.kpts, cfg.pose) {
        (Some(gk), Some(raw), true) => {
            let nk = sigmas.len();
            let kd = raw.dims()[1] / nk;
            let raw = raw.clone().detach().reshape([b, nk, kd, a]);
            let coord = |c: usize, at: &Tensor<3>| {
                (raw.clone().narrow(2, c, 1).reshape([b, nk, a]) + at.clone()) * st.clone()
            };
            let area = (x2.clone() - x1.clone())
                * (y2.clone() - y1.clone())
                * crate::data::source::AREA_OF_BOX as f32;
            let labelled = gk
                .clone()
                .narrow(3, 2, 1)
                .not_equal_elem(0.0)
                .reshape([b, n, nk])
                .any_dim(2)
                .expand([b, n, a]);
            let pose = oks(coord(0, &ax), coord(1, &ay), gk.clone(), area, sigmas);
            box_overlap.mask_where(labelled, pose)
        }
        _ => box_overlap,
    };
    let zeros = Tensor::<3>::zeros([b, n, a], &device);
    let overlap = zeros
        .clone()
        .mask_where(candidate.clone(), overlap.clamp_min(0.0));
    let class = objects
        .class
        .clone()
        .unsqueeze_dim::<3>(2)
        .expand([b, n, a]);
    let score = probs.clone().gather(1, class.clone());
    let align = zeros.clone().mask_where(
        candidate.clone(),
        score.powf_scalar(cfg.alpha) * overlap.clone().powf_scalar(cfg.beta),
    );

    // Positives: each object's top-k alignments over all anchors, kept where a candidate.
    let iota_a = anchors.index.clone().reshape([1, 1, a]);
    let mut pos = top_mask(align.clone(), cfg.topk, &iota_a).bool_and(candidate);
    // An anchor claimed by several objects goes to the one it overlaps most (of all objects).
    let iota_n = iota(n, &device).reshape([1, n, 1]);
    let contested = pos
        .clone()
        .int()
        .sum_dim(1)
        .greater_elem(1)
        .expand([b, n, a]);
    let is_best = first_max(overlap.clone(), 1, iota_n.clone().expand([b, n, a]));
    pos = pos.mask_where(contested, is_best);
    if cfg.topk2 != cfg.topk {
        let kept = zeros.clone().mask_where(pos.clone(), align.clone());
        pos = pos.bool_and(top_mask(kept, cfg.topk2, &iota_a));
    }

    // Soft targets: alignment × (the object's best overlap / its best alignment), positives only.
    let max_of =
        |t: Tensor<3>| max_last(zeros.clone().mask_where(pos.clone(), t)).expand([b, n, a]);
    let (max_align, max_ov) = (max_of(align.clone()), max_of(overlap));
    let norm = zeros
        .mask_where(pos.clone(), align * max_ov / (max_align + EPS))
        .max_dim(1)
        .reshape([b, a]);
    let fg = pos.clone().any_dim(1).reshape([b, a]);
    let gt_index = iota_n
        .expand([b, n, a])
        .mask_fill(pos.bool_not(), 0)
        .max_dim(1)
        .reshape([b, a]);
    let assigned_class = objects
        .class
        .clone()
        .gather(1, gt_index.clone())
        .reshape([b, 1, a]);
    let iota_c = iota(nc, &device).reshape([1, nc, 1]);
    let on = iota_c
        .expand([b, nc, a])
        .equal(assigned_class.expand([b, nc, a]))
        .bool_and(fg.clone().reshape([b, 1, a]).expand([b, nc, a]));
    let target_scores = Tensor::<3>::zeros([b, nc, a], &device)
        .mask_where(on, norm.reshape([b, 1, a]).expand([b, nc, a]));
    BatchAssignment {
        fg,
        gt_index,
        target_scores,
        max_positives: (n * cfg.topk.min(cfg.topk2)).min(a),
    }
}

/// [`assign_batch`] by `kernels/assign.rs` when chosen ([`kernel_assign::choose`]), or `None`
/// off CUDA or for outputs not in FP32. The same rules, in a few launches.
#[cfg(feature = "cuda")]
fn assign_on_cuda(
    cfg: &AssignerConfig,
    anchors: &AnchorTensors,
    out: &BranchOutput,
    objects: &ObjectSlots,
    sigmas: &[f32],
) -> Option<BatchAssignment> {
    if !kernel_assign::chosen() || out.scores.dims()[0] == 0 {
        return None;
    }
    let poses = match (&objects.keypoints, &out.kpts, cfg.pose) {
        (Some(_), Some(raw), true) if !sigmas.is_empty() => {
            let sig = oks_constants(sigmas, &raw.device());
            Some(kernel_assign::Poses {
                raw: cuda_f32(raw)?,
                kd: raw.dims()[1] / sigmas.len(),
                sig: cuda_f32(&sig)?,
            })
        }
        _ => None,
    };
    let rules = kernel_assign::Rules {
        alpha: cfg.alpha,
        beta: cfg.beta,
        stal_min_side: cfg.stal_min_side,
        pose: cfg.pose,
        strides: [STRIDES[0] as f32, STRIDES[2] as f32],
        area_of_box: crate::data::source::AREA_OF_BOX as f32,
        eps: EPS,
        topk: cfg.topk,
        topk2: cfg.topk2,
    };
    let r = kernel_assign::assign(
        cuda_f32(&out.boxes)?,
        cuda_f32(&out.scores)?,
        poses,
        [
            cuda_f32(&anchors.x)?,
            cuda_f32(&anchors.y)?,
            cuda_f32(&anchors.stride)?,
        ],
        cuda_f32(&objects.packed)?,
        &rules,
    );
    let like = &out.scores;
    let a = like.dims()[2];
    Some(BatchAssignment {
        fg: on_kind_of::<2, 3>(r.fg, like).equal_elem(1.0),
        gt_index: on_kind_of::<2, 3>(r.gt, like).int(),
        target_scores: on_kind_of::<3, 3>(r.target, like),
        max_positives: (objects.slots() * cfg.topk.min(cfg.topk2)).min(a),
    })
}

#[cfg(test)]
#[path = "device_tests.rs"]
pub(crate) mod tests;
