//! The loss terms of one branch copy over every anchor, from the device assignment
//! ([`super::assign::device`]): the six terms [`super::terms`] computes from the foreground rows,
//! here as masked tensor operations of fixed shapes with no readback — what a recorded step
//! needs (docs/replay.md, "Step recording"). Equal in value to the row-wise terms up to the order
//! of the sums (the foreground's terms are summed among every anchor's zeros); the gradients are
//! autodiff's. The RLE flow runs on a fixed number of rows per image (the assignment's bound on
//! its positives) holding the foreground anchors' keypoints; a mask keeps the labelled ones.
//! For a pose copy the per-anchor box, L1, OKS and visibility terms and the RLE rows are, by
//! default, single operations ([`anchor_terms`]); the tensor operations here stay as the
//! reference they are tested against and as the path `--anchor-terms false` takes. Each copy's
//! terms leave here as sums over its anchors, one `[8]` vector ([`DenseTerms`]); [`Combine`]
//! normalises and weighs every copy's at once.

use super::anchor_terms;
use super::assign::device::{AnchorTensors, BatchAssignment, ObjectSlots, ciou, prefix_sum_last};
use super::terms::{bce_with_logits, rle_weights};
use crate::model::BranchOutput;
use crate::model::flow::RealNvp;
use crate::optim::reduce::{sum_all, sum_each_row};
use burn::prelude::*;
use burn::tensor::IndexingUpdateOp;
use burn::tensor::activation::sigmoid;

mod combine;
pub use combine::{Combine, SUMS, column};

/// One copy's terms as sums over its anchors, before [`Combine`] normalises and weighs them.
#[derive(Clone, Debug)]
pub struct DenseTerms {
    /// `[8]` ([`column`]): box, L1, OKS, visibility BCE (zero unless kd is 3) and class BCE
    /// summed over the anchors, unnormalised; then the target scores, the positives and the
    /// labelled keypoints among them (zero without keypoints) as counts in floats.
    pub sums: Tensor<1>,
    /// `[1]`: the RLE term summed over the labelled keypoints of the positives, at least zero;
    /// zero without a flow or keypoints.
    pub rle: Tensor<1>,
}

/// The keypoint terms' constant rows, uploaded once ([`KeypointRows::new`]) and passed in, so
/// that the terms themselves upload nothing: a recorded loss may not (docs/replay.md).
#[derive(Clone, Debug)]
pub struct KeypointRows {
    /// `[1, K, 1]`: the OKS denominator's `8σ²` per keypoint.
    pub sig2: Tensor<3>,
    /// `[1, K, 1]`: the RLE weights per keypoint.
    pub rle: Tensor<3>,
    /// The flow's coupling masks ([`RealNvp::masks`]).
    pub flow_masks: Tensor<2>,
}

impl KeypointRows {
    /// The rows of keypoints with OKS sigmas `sigmas` on `device`.
    pub fn new(sigmas: &[f32], device: &Device) -> Self {
        let k = sigmas.len();
        let row = |v: Vec<f32>| Tensor::<1>::from_floats(v.as_slice(), device).reshape([1, k, 1]);
        Self {
            sig2: row(sigmas.iter().map(|s| 8.0 * s * s).collect()),
            rle: row(rle_weights(k)),
            flow_masks: RealNvp::masks(device),
        }
    }
}

/// `t` (`[B, A, C]`) channel `i` as `[B, 1, A]`.
fn channel(t: &Tensor<3>, i: usize) -> Tensor<3> {
    let [b, a, _] = t.dims();
    t.clone().narrow(2, i, 1).reshape([b, 1, a])
}

/// The terms of each copy's outputs `copies[i].0` given the batch's assignment `copies[i].1` of
/// `objects`; the keypoint terms with the keypoints' constant `rows`, `rle` with the keypoint
/// flow `flow`. Every copy's RLE points go through the flow in one pass (side by side in each
/// image's and keypoint's group), as the host loss does: each pass is 36 linear layers, 24 SiLUs
/// and their gradients, a large share of the recorded loss's kernels.
pub fn dense_terms(
    copies: &[(&BranchOutput, &BatchAssignment)],
    objects: &ObjectSlots,
    anchors: &AnchorTensors,
    imgsz: [usize; 2],
    rows: Option<&KeypointRows>,
    flow: Option<&RealNvp>,
) -> Vec<DenseTerms> {
    let fused = Fused {
        terms: anchor_terms::chosen(),
        rle: anchor_terms::rle_chosen(),
    };
    terms_of(copies, objects, anchors, imgsz, rows, flow, fused)
}

/// Which parts of a copy's terms are single operations ([`anchor_terms`]).
#[derive(Clone, Copy, Debug)]
struct Fused {
    /// The per-anchor box, L1, OKS and visibility terms.
    terms: bool,
    /// The RLE rows (with `terms` only).
    rle: bool,
}

/// [`dense_terms`] with the parts `fused` says as single operations.
fn terms_of(
    copies: &[(&BranchOutput, &BatchAssignment)],
    objects: &ObjectSlots,
    anchors: &AnchorTensors,
    imgsz: [usize; 2],
    rows: Option<&KeypointRows>,
    flow: Option<&RealNvp>,
    fused: Fused,
) -> Vec<DenseTerms> {
    let with_flow = flow.is_some();
    let parts: Vec<(Tensor<1>, Option<RleRows>)> = copies
        .iter()
        .map(|(out, asg)| copy_terms(out, asg, objects, anchors, imgsz, rows, with_flow, fused))
        .collect();
    let groups: Vec<Tensor<3>> = parts
        .iter()
        .filter_map(|(_, r)| r.as_ref().map(|r| r.points.clone()))
        .collect();
    // Rows exist only with a flow and keypoint rows.
    let log_phi = match (flow, rows, groups.is_empty()) {
        (Some(flow), Some(rows), false) => {
            Some(flow.log_prob_grouped(Tensor::cat(groups, 1), &rows.flow_masks))
        }
        _ => None,
    };
    let mut at = 0;
    parts
        .into_iter()
        .map(|(sums, r)| {
            let rle = match (r, &log_phi, rows) {
                (Some(r), Some(log_phi), Some(rows)) => {
                    let [b, k, n] = r.per.dims();
                    let phi = log_phi.clone().narrow(1, at, n).reshape([b, k, n]);
                    at += n;
                    r.finish(phi, &rows.rle)
                }
                _ => Tensor::zeros([1], &sums.device()),
            };
            DenseTerms { sums, rle }
        })
        .collect()
}

/// One copy's RLE rows before the flow: the points it evaluates and what the term adds to
/// their log-density.
struct RleRows {
    /// `[B·K, R, 2]`: ε per point, grouped per image and keypoint.
    points: Tensor<3>,
    /// `[B, K, R]`: `log σ + log 2σ + |ε|` over both coordinates.
    per: Tensor<3>,
    /// `[B, K, R]`: the rows that count (in use, labelled).
    counted: Tensor<3, Bool>,
}

impl RleRows {
    /// The term's sum over the counted rows, at least zero, given the flow's log-density
    /// `log_phi` (`[B, K, R]`) of the points and the RLE weights per keypoint `weights`
    /// (`[1, K, 1]`). Clamping the sum rather than its mean over the labelled keypoints (a
    /// positive count) gives the same value and gradient.
    fn finish(self, log_phi: Tensor<3>, weights: &Tensor<3>) -> Tensor<1> {
        let l = (self.per - log_phi * 2.0) * weights.clone();
        let zeros = Tensor::<3>::zeros(l.dims(), &l.device());
        sum_all(zeros.mask_where(self.counted, l)).clamp_min(0.0)
    }
}

/// One copy's sums ([`DenseTerms::sums`]), and its rows for the flow where `with_flow` and the
/// outputs have keypoint sigmas. With keypoints, the box, L1, OKS and visibility terms are one
/// operation ([`anchor_terms`]) as `fused` says.
#[allow(clippy::too_many_arguments)]
fn copy_terms(
    out: &BranchOutput,
    asg: &BatchAssignment,
    objects: &ObjectSlots,
    anchors: &AnchorTensors,
    imgsz: [usize; 2],
    rows: Option<&KeypointRows>,
    with_flow: bool,
    fused: Fused,
) -> (Tensor<1>, Option<RleRows>) {
    let [b, _, a] = out.scores.dims();
    let device = out.scores.device();
    // Per anchor `[1, B, A]`: the class term, the alignment weight (the target scores over the
    // classes) and the foreground.
    let row = |t: Tensor<3>| t.reshape([1, b, a]);
    let cls = row(over_classes(bce_with_logits(
        out.scores.clone(),
        asg.target_scores.clone(),
    )));
    let weight = over_classes(asg.target_scores.clone());
    let counts = [
        cls,
        row(weight.clone()),
        asg.fg.clone().float().reshape([1, b, a]),
    ];
    let (Some(kpts), Some(gk), Some(rows)) = (&out.kpts, &objects.keypoints, rows) else {
        let ([box_loss, l1], _) = box_terms(out, asg, objects, anchors, imgsz, weight);
        let zero = Tensor::<3>::zeros([1, b, a], &device);
        let [c, s, p] = counts;
        let sums = sums_of(vec![
            row(box_loss),
            row(l1),
            zero.clone(),
            zero.clone(),
            c,
            s,
            p,
            zero,
        ]);
        return (sums, None);
    };
    let k = rows.sig2.dims()[1];
    let sigma = match (with_flow, &out.kpts_sigma) {
        (true, Some(sigma)) => Some(sigma),
        _ => None,
    };
    if fused.terms {
        // The slot each anchor learns, as the single operations read it.
        let slot = asg.gt_index.clone().float();
        let fixed = anchor_terms::Fixed {
            objects: objects.packed.clone(),
            slot: slot.clone(),
            fg: asg.fg.clone().float(),
            weight: weight.reshape([b, a]),
            ax: anchors.x.clone(),
            ay: anchors.y.clone(),
            st: anchors.stride.clone(),
            sig: rows.sig2.clone().reshape([k]),
        };
        // Box, L1, OKS, visibility, labelled.
        let terms = anchor_terms::per_anchor(out.boxes.clone(), kpts.clone(), fixed, imgsz);
        let [c, s, p] = counts;
        let sums = sums_of(vec![
            terms.clone().narrow(0, 0, 4),
            c,
            s,
            p,
            terms.narrow(0, 4, 1),
        ]);
        let rle = sigma.map(|sigma| {
            if fused.rle {
                fused_rle_rows(kpts, sigma, asg, slot, objects, anchors, k)
            } else {
                let g = KeypointGeometry::new(kpts, gk, asg, anchors, k);
                rle_rows(&g, sigma, asg, anchors)
            }
        });
        return (sums, rle);
    }
    let ([box_loss, l1], gt) = box_terms(out, asg, objects, anchors, imgsz, weight);
    let g = KeypointGeometry::new(kpts, gk, asg, anchors, k);
    let fg = asg.fg.clone().reshape([b, 1, a]);
    let [pose, kobj, labelled] = keypoint_terms(&g, &fg, &gt, anchors, rows);
    let rle = sigma.map(|sigma| rle_rows(&g, sigma, asg, anchors));
    let [c, s, p] = counts;
    let sums = sums_of(vec![
        row(box_loss),
        row(l1),
        row(pose),
        row(kobj),
        c,
        s,
        p,
        row(labelled),
    ]);
    (sums, rle)
}

/// `t` (`[B, C, A]`) summed over its classes, `[B, 1, A]` (itself for one class).
fn over_classes(t: Tensor<3>) -> Tensor<3> {
    if t.dims()[1] == 1 { t } else { t.sum_dim(1) }
}

/// The per-anchor rows `rows` (`[r, B, A]` each, [`SUMS`] rows in all, in [`column`]'s
/// order) summed over the anchors: `[SUMS]`, each row in [`sum_all`]'s order.
fn sums_of(rows: Vec<Tensor<3>>) -> Tensor<1> {
    let all = Tensor::cat(rows, 0);
    let [r, b, a] = all.dims();
    debug_assert_eq!(r, SUMS);
    sum_each_row(all.reshape([r, b * a]))
}

/// The box (`(1 − CIoU) · w`) and L1 terms over the foreground per anchor (`[B, 1, A]`, zero
/// off it), unnormalised, as tensor operations (`weight` `[B, 1, A]`), and each anchor's
/// object's box in grid units (`[B, 1, A]` a side).
fn box_terms(
    out: &BranchOutput,
    asg: &BatchAssignment,
    objects: &ObjectSlots,
    anchors: &AnchorTensors,
    imgsz: [usize; 2],
    weight: Tensor<3>,
) -> ([Tensor<3>; 2], [Tensor<3>; 4]) {
    let [b, _, a] = out.scores.dims();
    let fg = asg.fg.clone().reshape([b, 1, a]);
    let zeros = Tensor::<3>::zeros([b, 1, a], &out.scores.device());
    // Each anchor's object's box in grid units (background: the first slot's, masked out below).
    let slot = asg.gt_index.clone().reshape([b, a, 1]);
    let gt = objects.boxes.clone().gather(1, slot.expand([b, a, 4]))
        / anchors.stride.clone().reshape([1, a, 1]);
    // Each side once: a strided side's reshape is a copy, and a narrow's backward a padding.
    let gt_sides = [0, 1, 2, 3].map(|i| channel(&gt, i));
    let g = |i: usize| gt_sides[i].clone();
    let (ax, ay) = (anchors.x.clone(), anchors.y.clone());
    let sides = [0, 1, 2, 3].map(|i| out.boxes.clone().narrow(1, i, 1));
    let l = |i: usize| sides[i].clone();
    let pred = [
        ax.clone() - l(0),
        ay.clone() - l(1),
        ax.clone() + l(2),
        ay.clone() + l(3),
    ];
    let iou = ciou(pred, [g(0), g(1), g(2), g(3)]);
    let masked = |t: Tensor<3>| zeros.clone().mask_where(fg.clone(), t);
    let box_loss = masked((iou.neg() + 1.0) * weight.clone());
    let (w, h) = (imgsz[1] as f32, imgsz[0] as f32);
    let st = anchors.stride.clone();
    let target = [
        ax.clone() - g(0),
        ay.clone() - g(1),
        g(2) - ax.clone(),
        g(3) - ay.clone(),
    ];
    let scale = [st.clone() / w, st.clone() / h, st.clone() / w, st / h];
    let row = target
        .into_iter()
        .zip(scale)
        .enumerate()
        .map(|(i, (t, s))| ((l(i) - t) * s).abs())
        .reduce(|x, y| x + y)
        .expect("four sides");
    let l1 = masked(row / 4.0 * weight);
    ([box_loss, l1], gt_sides)
}

/// Each anchor's object's keypoints against the raw outputs (`[B, K, A]` each): what the OKS,
/// visibility and RLE terms read.
struct KeypointGeometry {
    /// The raw outputs `[B, K·kd, A]` viewed as `[B, K, kd, A]`, and its first two channels.
    raw: Tensor<4>,
    rx: Tensor<3>,
    ry: Tensor<3>,
    /// The truth's offsets from the anchor, which the RLE term compares the raw outputs with.
    ox: Tensor<3>,
    oy: Tensor<3>,
    /// The truth in grid units.
    gx: Tensor<3>,
    gy: Tensor<3>,
    seen: Tensor<3, Bool>,
    vis: Tensor<3>,
}

impl KeypointGeometry {
    fn new(
        kpts: &Tensor<3>,
        gk: &Tensor<4>,
        asg: &BatchAssignment,
        anchors: &AnchorTensors,
        k: usize,
    ) -> Self {
        let [b, kk, a] = kpts.dims();
        let raw = kpts.clone().reshape([b, k, kk / k, a]);
        let slot = asg.gt_index.clone().reshape([b, a, 1, 1]);
        let gt_k = gk
            .clone()
            .gather(1, slot.expand([b, a, k, 3]))
            .permute([0, 2, 3, 1]); // [B, K, 3, A]
        let s = anchors.stride.clone();
        let (gx, gy) = (coord(&gt_k, 0) / s.clone(), coord(&gt_k, 1) / s);
        let seen = coord(&gt_k, 2).not_equal_elem(0.0);
        let vis = seen.clone().float();
        let (ox, oy) = (
            gx.clone() - anchors.x.clone(),
            gy.clone() - anchors.y.clone(),
        );
        let (rx, ry) = (coord(&raw, 0), coord(&raw, 1));
        Self {
            raw,
            rx,
            ry,
            ox,
            oy,
            gx,
            gy,
            seen,
            vis,
        }
    }
}

/// Channel `i` of the keypoint axis of `t` (`[B, K, kd, A]`) as `[B, K, A]`.
fn coord(t: &Tensor<4>, i: usize) -> Tensor<3> {
    let [b, k, _, a] = t.dims();
    t.clone().narrow(2, i, 1).reshape([b, k, a])
}

/// The OKS term (each anchor's keypoints weighted by K over its object's labelled ones, the
/// object's box `gt` in grid units for the area), the visibility BCE (zero unless kd is 3) and
/// the labelled keypoints, per foreground anchor summed over its keypoints (`[B, 1, A]`, zero
/// off the foreground), unnormalised, as tensor operations.
fn keypoint_terms(
    g: &KeypointGeometry,
    fg: &Tensor<3, Bool>,
    gt: &[Tensor<3>; 4],
    anchors: &AnchorTensors,
    rows: &KeypointRows,
) -> [Tensor<3>; 3] {
    let [b, k, kd, a] = g.raw.dims();
    let dx = g.rx.clone() + anchors.x.clone() - g.gx.clone();
    let dy = g.ry.clone() + anchors.y.clone() - g.gy.clone();
    let area = (gt[2].clone() - gt[0].clone()) * (gt[3].clone() - gt[1].clone());
    let e = (dx.clone() * dx + dy.clone() * dy) / (rows.sig2.clone() * (area + 1e-9));
    // K over each anchor's object's labelled keypoints.
    let factor = (g.vis.clone().sum_dim(1) + 1e-9).recip() * k as f32;
    let fg_k = fg.clone().expand([b, k, a]);
    let labelled = fg_k.clone().bool_and(g.seen.clone()).float().sum_dim(1);
    let zeros_k = Tensor::<3>::zeros([b, k, a], &g.vis.device());
    let pose = zeros_k
        .clone()
        .mask_where(
            fg_k.clone(),
            factor * (e.neg().exp().neg() + 1.0) * g.vis.clone(),
        )
        .sum_dim(1);
    let kobj = if kd == 3 {
        let logit = coord(&g.raw, 2);
        zeros_k
            .mask_where(fg_k, bce_with_logits(logit, g.vis.clone()))
            .sum_dim(1)
    } else {
        Tensor::zeros([b, 1, a], &g.vis.device())
    };
    [pose, kobj, labelled]
}

/// Where the RLE rows of each image come from: its foreground anchors in anchor order, as many
/// rows `R` as the assignment's bound on its positives.
struct Placement {
    /// `[B, R]`: row `j`'s anchor (0 past the image's positives).
    picked: Tensor<2, Int>,
    /// `[B, A]`: each anchor's row (`A + R` and above off the foreground).
    place: Tensor<2, Int>,
    /// `[B, 1]`: the image's positives.
    count: Tensor<2, Int>,
}

impl Placement {
    /// By a prefix sum over the foreground mask and a scatter of the anchor indices.
    fn new(asg: &BatchAssignment, anchors: &AnchorTensors, r: usize) -> Self {
        let [b, a] = asg.fg.dims();
        let iota = anchors.index.clone().reshape([1, a]).expand([b, a]);
        let prefix = prefix_sum_last(asg.fg.clone().int());
        // The last running count is the image's number of positives.
        let count = prefix.clone().narrow(1, a - 1, 1);
        let place = (prefix - 1).mask_where(asg.fg.clone().bool_not(), iota.clone() + r as i64);
        let picked = Tensor::<2, Int>::zeros([b, r + a], &asg.fg.device())
            .scatter(1, place.clone(), iota, IndexingUpdateOp::Add)
            .narrow(1, 0, r);
        Self {
            picked,
            place,
            count,
        }
    }
}

/// [`rle_rows`] by one operation ([`anchor_terms::rle_rows`]): the raw keypoints `kpts` and
/// sigmas `sigma_raw` of the foreground anchors' rows, with `k` keypoints; `slot` is the
/// assignment's slot per anchor as a float.
#[allow(clippy::too_many_arguments)]
fn fused_rle_rows(
    kpts: &Tensor<3>,
    sigma_raw: &Tensor<3>,
    asg: &BatchAssignment,
    slot: Tensor<2>,
    objects: &ObjectSlots,
    anchors: &AnchorTensors,
    k: usize,
) -> RleRows {
    let [b, _, a] = kpts.dims();
    let r = asg.max_positives.clamp(1, a);
    let p = Placement::new(asg, anchors, r);
    let fixed = anchor_terms::RleFixed {
        objects: objects.packed.clone(),
        slot,
        place: p.place.float(),
        picked: p.picked.float(),
        count: p.count.float().reshape([b]),
        ax: anchors.x.clone(),
        ay: anchors.y.clone(),
        st: anchors.stride.clone(),
    };
    let rows = anchor_terms::rle_rows(kpts.clone(), sigma_raw.clone(), fixed);
    RleRows {
        points: rows.clone().narrow(2, 0, 2),
        per: rows.clone().narrow(2, 2, 1).reshape([b, k, r]),
        counted: rows.narrow(2, 3, 1).reshape([b, k, r]).greater_elem(0.5),
    }
}

/// RLE: ε = (μ − g) / σ per coordinate and the flow's log-density of ε over the foreground's
/// labelled keypoints ([`Combine`] averages the sum). The flow runs on a fixed number
/// of rows per image, the assignment's bound on its positives: the foreground anchors in anchor
/// order, placed by a prefix sum over the mask (the rows past an image's positives are masked).
fn rle_rows(
    g: &KeypointGeometry,
    sigma_raw: &Tensor<3>,
    asg: &BatchAssignment,
    anchors: &AnchorTensors,
) -> RleRows {
    let [b, k, _, a] = g.raw.dims();
    let r = asg.max_positives.clamp(1, a);
    let Placement {
        picked,
        place: _,
        count,
    } = Placement::new(asg, anchors, r);
    let picked = picked.reshape([b, 1, r]).expand([b, k, r]);
    let in_use = anchors
        .index
        .clone()
        .narrow(0, 0, r)
        .reshape([1, 1, r])
        .expand([b, k, r])
        .lower(count.reshape([b, 1, 1]).expand([b, k, r]));
    let take = |t: Tensor<3>| t.gather(2, picked.clone());
    let sigma = sigmoid(sigma_raw.clone().reshape([b, k, 2, a])).clamp_min(f32::MIN_POSITIVE);
    let (sx, sy) = (take(coord(&sigma, 0)), take(coord(&sigma, 1)));
    let eps = |x: Tensor<3>, o: Tensor<3>, s: Tensor<3>| {
        ((take(x) - take(o)) / (s + 1e-9)).clamp(-100.0, 100.0)
    };
    let ex = eps(g.rx.clone(), g.ox.clone(), sx.clone());
    let ey = eps(g.ry.clone(), g.oy.clone(), sy.clone());
    // Grouped per image and keypoint, so the flow's backward reduces along `r` points per group
    // rather than all of them at once.
    let points = Tensor::cat(
        vec![
            ex.clone().reshape([b * k, r, 1]),
            ey.clone().reshape([b * k, r, 1]),
        ],
        2,
    );
    let per = |s: Tensor<3>, e: Tensor<3>| s.clone().log() + (s * 2.0).log() + e.abs();
    // The rows in use hold foreground anchors: their labelled keypoints are counted.
    let counted = take(g.vis.clone()).greater_elem(0.5).bool_and(in_use);
    RleRows {
        points,
        per: per(sx, ex) + per(sy, ey),
        counted,
    }
}

#[cfg(test)]
mod tests;
