//! The six loss terms of one branch copy (yolo_spec §3.5–3.6): `[box (CIoU), pose (OKS), kobj,
//! cls, l1, rle]`, and their gain-weighted sum.
//!
//! Box, pose, kobj and l1 depend only on the foreground rows' predictions, which the host already
//! holds (they were read back for the assignment). Their values and gradients are computed there
//! ([`host_terms`], the CIoU's gradient through forward-mode [`Dual`] numbers) and enter autodiff
//! through a zero-valued surrogate `s − detach(s)` with `s = Σ x·G`: its gradient with respect to
//! the rows `x` is exactly `G`. That replaces ~300 small device operations per copy and step (and
//! their backward) with a handful (docs/training.md). cls (dense over every anchor) and rle (it
//! trains the flow's parameters) stay device operations.

use super::dual::Dual;
use super::geometry::ciou_of;
use super::targets::BranchTargets;
use crate::model::BranchOutput;
use crate::model::flow::RealNvp;
use crate::optim::reduce::sum_all;
use burn::prelude::*;
use burn::tensor::activation::sigmoid;

/// Per-keypoint RLE weights of the COCO order (`RLE_WEIGHT`).
pub fn rle_weights(k: usize) -> Vec<f32> {
    if k != 17 {
        return vec![1.0; k];
    }
    (0..17)
        .map(|j| match j {
            7 | 8 | 13 | 14 => 1.2,
            9 | 10 | 15 | 16 => 1.5,
            _ => 1.0,
        })
        .collect()
}

/// Numerically stable BCE with logits, elementwise.
pub fn bce_with_logits<const D: usize>(x: Tensor<D>, target: Tensor<D>) -> Tensor<D> {
    x.clone().clamp_min(0.0) - x.clone() * target + x.abs().neg().exp().log1p()
}

/// [`bce_with_logits`] of one value.
pub(crate) fn bce(x: f32, target: f32) -> f32 {
    x.max(0.0) - x * target + (-x.abs()).exp().ln_1p()
}

/// The four row-wise terms of one copy, unweighted, with their gradients with respect to the
/// foreground rows' predictions ([`BranchTargets::fg_ltrb`] and
/// [`BranchTargets::fg_raw_kpts`]). All zero without foreground rows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostTerms {
    pub box_loss: f32,
    pub pose: f32,
    pub kobj: f32,
    pub l1: f32,
    /// ∂box/∂ltrb and ∂l1/∂ltrb, 4 per row.
    pub d_box: Vec<f32>,
    pub d_l1: Vec<f32>,
    /// ∂pose/∂raw and ∂kobj/∂raw, `nk · kpt_dim` per row.
    pub d_pose: Vec<f32>,
    pub d_kobj: Vec<f32>,
}

/// Box (CIoU on decoded xyxy), l1 (ltrb scaled by stride / image size), pose (OKS with the box
/// area in grid units) and kobj (BCE of the visibility logits), as Ultralytics' `PoseLoss26`.
pub fn host_terms(t: &BranchTargets, imgsz: [usize; 2], sigmas: &[f32]) -> HostTerms {
    let n = t.num_fg();
    let mut h = HostTerms {
        d_box: vec![0.0; n * 4],
        d_l1: vec![0.0; n * 4],
        ..HostTerms::default()
    };
    if n == 0 {
        return h;
    }
    let s = t.score_sum;
    let (w, hgt) = (imgsz[1] as f32, imgsz[0] as f32);
    for i in 0..n {
        let [ax, ay] = t.fg_anchor[i];
        let (weight, g, l) = (t.fg_weight[i], t.fg_box[i], t.fg_ltrb[i]);
        let x = |c: usize| Dual::<4>::input(l[c], c);
        let (ax_d, ay_d) = (Dual::from(ax), Dual::from(ay));
        let pred = [ax_d - x(0), ay_d - x(1), ax_d + x(2), ay_d + x(3)];
        let iou = ciou_of(pred, g.map(Dual::from));
        h.box_loss += (1.0 - iou.v) * weight;
        let st = t.fg_stride[i];
        let scale = [st / w, st / hgt, st / w, st / hgt];
        let target = [ax - g[0], ay - g[1], g[2] - ax, g[3] - ay];
        let mut row = 0.0;
        for c in 0..4 {
            let e = (l[c] - target[c]) * scale[c];
            row += e.abs();
            h.d_box[i * 4 + c] = -iou.d[c] * weight / s;
            h.d_l1[i * 4 + c] = sign(e) * scale[c] * weight / (4.0 * s);
        }
        h.l1 += row / 4.0 * weight;
    }
    h.box_loss /= s;
    h.l1 /= s;
    let (k, kd) = (t.nk, t.kpt_dim);
    if k == 0 || kd < 2 {
        return h;
    }
    h.d_pose = vec![0.0; n * k * kd];
    h.d_kobj = vec![0.0; n * k * kd];
    let cells = (n * k) as f32;
    for i in 0..n {
        let [ax, ay] = t.fg_anchor[i];
        let g = t.fg_box[i];
        let area = (g[2] - g[0]) * (g[3] - g[1]);
        let gt = &t.fg_kpts[i * k..(i + 1) * k];
        let labelled = gt.iter().filter(|p| p[2] != 0.0).count() as f32;
        let factor = k as f32 / (labelled + 1e-9);
        for (j, p) in gt.iter().enumerate() {
            let at = (i * k + j) * kd;
            let vis = if p[2] != 0.0 { 1.0 } else { 0.0 };
            let (dx, dy) = (
                t.fg_raw_kpts[at] + ax - p[0],
                t.fg_raw_kpts[at + 1] + ay - p[1],
            );
            let denom = 8.0 * sigmas[j] * sigmas[j] * (area + 1e-9);
            let near = (-(dx * dx + dy * dy) / denom).exp();
            h.pose += factor * (1.0 - near) * vis;
            let slope = factor * vis * near * 2.0 / denom / cells;
            h.d_pose[at] = slope * dx;
            h.d_pose[at + 1] = slope * dy;
            if kd == 3 {
                let logit = t.fg_raw_kpts[at + 2];
                h.kobj += bce(logit, vis);
                h.d_kobj[at + 2] = (1.0 / (1.0 + (-logit).exp()) - vis) / cells;
            }
        }
    }
    h.pose /= cells;
    h.kobj /= cells;
    h
}

/// `sign(x)`, 0 at 0 (the derivative autodiff gives `|x|`).
pub(crate) fn sign(x: f32) -> f32 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else {
        0.0
    }
}

/// What the RLE term needs from one copy before the flow runs: per labelled keypoint,
/// `ε = (μ − g) / σ` and σ, `[m, 2]`, and its keypoint weight `[m, 1]`.
pub struct RleInputs {
    pub eps: Tensor<2>,
    sigma: Tensor<2>,
    weight: Tensor<2>,
}

/// One copy's loss before the RLE term: see [`BranchParts::finish`].
pub struct BranchParts {
    /// Gain-weighted sum of every term but rle (its value exact, its gradient that of the terms).
    sum: Tensor<1>,
    /// `[6]` gain-weighted terms, rle still zero; detached.
    items: Tensor<1>,
    /// `None` when no keypoint is labelled (rle is then a constant zero).
    pub rle: Option<RleInputs>,
    rle_gain: f32,
}

/// One copy's loss: `sum` to back-propagate (the gain-weighted terms) and the `[6]` weighted
/// terms, detached, to log.
pub struct BranchLoss {
    pub sum: Tensor<1>,
    pub items: Tensor<1>,
}

/// One copy's loss with its own flow pass; [`BranchParts`] lets both copies share one.
pub fn branch_loss(
    out: &BranchOutput,
    t: &BranchTargets,
    flow: Option<&RealNvp>,
    imgsz: [usize; 2],
    sigmas: &[f32],
    gains: [f32; 6],
) -> BranchLoss {
    let parts = branch_parts(out, t, flow.is_some(), imgsz, sigmas, gains);
    let log_phi = match (&parts.rle, flow) {
        (Some(r), Some(flow)) => Some(flow.log_prob(r.eps.clone())),
        _ => None,
    };
    parts.finish(log_phi)
}

/// Every term but rle's flow pass. With no foreground row every term but cls is a constant zero
/// not connected to the box or keypoint outputs, so parameters only they feed get no gradient.
pub fn branch_parts(
    out: &BranchOutput,
    t: &BranchTargets,
    with_flow: bool,
    imgsz: [usize; 2],
    sigmas: &[f32],
    gains: [f32; 6],
) -> BranchParts {
    let device = out.scores.device();
    let [g_box, g_pose, g_kobj, g_cls, g_l1, g_rle] = gains;
    let upload = |v: Vec<f32>| {
        let len = v.len();
        Tensor::<1>::from_data(TensorData::new(v, [len]), &device)
    };
    let scores = Tensor::<3>::from_data(
        TensorData::new(t.target_scores.clone(), [t.batch, t.nc, t.anchors]),
        &device,
    );
    let cls = sum_all(bce_with_logits(out.scores.clone(), scores)) / t.score_sum * g_cls;
    let h = host_terms(t, imgsz, sigmas);
    let host_sum = g_box * h.box_loss + g_pose * h.pose + g_kobj * h.kobj + g_l1 * h.l1;
    let items = upload(vec![
        g_box * h.box_loss,
        g_pose * h.pose,
        g_kobj * h.kobj,
        0.0,
        g_l1 * h.l1,
        0.0,
    ])
    .slice_assign(3..4, cls.clone().detach());
    let mut sum = cls + host_sum;
    let mut rle = None;
    let n = t.num_fg();
    if n > 0 {
        // Row `b·A + a`, channel `k` of `[B, C, A]` sits at `(b·C + k)·A + a`: select the rows'
        // values there rather than from a transposed copy of every anchor (whose backward was a
        // second whole-tensor copy besides the scatter).
        let rows = |x: &Tensor<3>| {
            let [_, c, a] = x.dims();
            let at: Vec<i64> = t
                .fg_rows
                .iter()
                .flat_map(|&r| {
                    let (b, anchor) = (r / a as i64, r % a as i64);
                    (0..c as i64).map(move |k| (b * c as i64 + k) * a as i64 + anchor)
                })
                .collect();
            let idx = Tensor::<1, Int>::from_data(TensorData::new(at, [n * c]), &device);
            x.clone()
                .reshape([x.shape().num_elements()])
                .select(0, idx)
                .reshape([n, c])
        };
        let combine = |ga: f32, a: &[f32], gb: f32, b: &[f32]| {
            a.iter().zip(b).map(|(x, y)| ga * x + gb * y).collect()
        };
        let g = combine(g_box, &h.d_box, g_l1, &h.d_l1);
        sum = sum + surrogate(rows(&out.boxes), upload(g).reshape([n, 4]));
        if let (Some(kpts), Some(sigma), true) = (&out.kpts, &out.kpts_sigma, !h.d_pose.is_empty())
        {
            let raw = rows(kpts);
            let g = combine(g_pose, &h.d_pose, g_kobj, &h.d_kobj);
            sum = sum + surrogate(raw.clone(), upload(g).reshape(raw.dims()));
            if with_flow {
                rle = rle_inputs(raw, rows(sigma), t, &upload);
            }
        }
    }
    BranchParts {
        sum,
        items,
        rle,
        rle_gain: g_rle,
    }
}

/// `s − detach(s)` with `s = Σ x·g`: zero, with gradient `g` with respect to `x`. `s` is
/// subtracted from itself, so Burn's atomic `sum` on CUDA cannot make the value vary.
fn surrogate(x: Tensor<2>, g: Tensor<2>) -> Tensor<1> {
    let s = (x * g).sum();
    s.clone() - s.detach()
}

/// ε, σ and the keypoint weights of the labelled keypoints (`None` if there is none).
fn rle_inputs(
    raw: Tensor<2>,
    sigma_rows: Tensor<2>,
    t: &BranchTargets,
    upload: &dyn Fn(Vec<f32>) -> Tensor<1>,
) -> Option<RleInputs> {
    let device = raw.device();
    let (n, k, kd) = (t.num_fg(), t.nk, t.kpt_dim);
    let labelled: Vec<usize> = (0..n * k).filter(|&i| t.fg_kpts[i][2] != 0.0).collect();
    let m = labelled.len();
    if m == 0 {
        return None;
    }
    let sel = Tensor::<1, Int>::from_data(
        TensorData::new(labelled.iter().map(|&i| i as i64).collect(), [m]),
        &device,
    );
    // μ − g = raw + anchor − g: the anchor and the keypoint are constants, one upload.
    let offset = labelled
        .iter()
        .flat_map(|&i| {
            let [ax, ay] = t.fg_anchor[i / k];
            let p = t.fg_kpts[i];
            [p[0] - ax, p[1] - ay]
        })
        .collect();
    let offset = upload(offset).reshape([m, 2]);
    let xy = raw
        .reshape([n * k, kd])
        .select(0, sel.clone())
        .narrow(1, 0, 2);
    let sigma = sigmoid(sigma_rows.reshape([n * k, 2]).select(0, sel)).clamp_min(f32::MIN_POSITIVE);
    let eps = ((xy - offset) / (sigma.clone() + 1e-9)).clamp(-100.0, 100.0);
    let weights = rle_weights(k);
    let weight = upload(labelled.iter().map(|&i| weights[i % k]).collect()).reshape([m, 1]);
    Some(RleInputs { eps, sigma, weight })
}

impl BranchParts {
    /// The copy's loss given the flow's log-density of its ε (`None` when there is no rle).
    pub fn finish(self, log_phi: Option<Tensor<1>>) -> BranchLoss {
        let (Some(r), Some(log_phi)) = (self.rle, log_phi) else {
            return BranchLoss {
                sum: self.sum,
                items: self.items.detach(),
            };
        };
        let m = r.eps.dims()[0];
        let per_coord = r.sigma.clone().log() + (r.sigma * 2.0).log() + r.eps.abs();
        let l = (per_coord.sum_dim(1) - log_phi.reshape([m, 1]) * 2.0) * r.weight;
        let rle = (sum_all(l) / m as f32).clamp_min(0.0) * self.rle_gain;
        BranchLoss {
            sum: self.sum + rle.clone(),
            items: self.items.slice_assign(5..6, rle).detach(),
        }
    }
}

#[cfg(test)]
mod tests;
