//! The device-operation loss terms as they were before the host-side terms (`terms.rs`): the
//! reference the tests hold the host values and gradients to.

use super::targets::BranchTargets;
use super::terms::{bce_with_logits, rle_weights};
use crate::model::BranchOutput;
use crate::model::flow::RealNvp;
use crate::optim::reduce::sum_all;
use burn::prelude::*;
use burn::tensor::activation::sigmoid;

/// The six terms. With no foreground row, every term but `cls` is a constant zero that is not
/// connected to the keypoint or box outputs, so parameters only they feed get no gradient.
pub fn branch_terms(
    out: &BranchOutput,
    t: &BranchTargets,
    flow: Option<&RealNvp>,
    imgsz: [usize; 2],
    sigmas: &[f32],
) -> [Tensor<1>; 6] {
    let device = out.scores.device();
    let f32s = |v: Vec<f32>, shape: Vec<usize>| {
        Tensor::<1>::from_data(
            TensorData::new(v, [shape.iter().product::<usize>()]),
            &device,
        )
    };
    let scores = Tensor::<3>::from_data(
        TensorData::new(t.target_scores.clone(), [t.batch, t.nc, t.anchors]),
        &device,
    );
    let cls = sum_all(bce_with_logits(out.scores.clone(), scores)) / t.score_sum;
    let zero = || Tensor::<1>::zeros([1], &device);
    let n = t.num_fg();
    if n == 0 {
        return [zero(), zero(), zero(), cls, zero(), zero()];
    }
    let idx = Tensor::<1, Int>::from_data(TensorData::new(t.fg_rows.clone(), [n]), &device);
    let rows = |x: &Tensor<3>| {
        let [b, c, a] = x.dims();
        x.clone()
            .swap_dims(1, 2)
            .reshape([b * a, c])
            .select(0, idx.clone())
    };
    let col = |v: Vec<f32>| f32s(v, vec![n]).reshape([n, 1]);
    let ax = col(t.fg_anchor.iter().map(|p| p[0]).collect());
    let ay = col(t.fg_anchor.iter().map(|p| p[1]).collect());
    let weight = f32s(t.fg_weight.clone(), vec![n]);
    let gt_box = f32s(t.fg_box.iter().flatten().copied().collect(), vec![n * 4]).reshape([n, 4]);

    // Boxes: CIoU on decoded xyxy, L1 on ltrb scaled by stride / image size.
    let ltrb = rows(&out.boxes);
    let part = |x: &Tensor<2>, i: usize| x.clone().narrow(1, i, 1);
    let pred_box = Tensor::cat(
        vec![
            ax.clone() - part(&ltrb, 0),
            ay.clone() - part(&ltrb, 1),
            ax.clone() + part(&ltrb, 2),
            ay.clone() + part(&ltrb, 3),
        ],
        1,
    );
    let iou = ciou(pred_box, gt_box.clone());
    let box_loss = sum_all((iou.neg() + 1.0) * weight.clone()) / t.score_sum;
    let target_ltrb = Tensor::cat(
        vec![
            ax.clone() - part(&gt_box, 0),
            ay.clone() - part(&gt_box, 1),
            part(&gt_box, 2) - ax.clone(),
            part(&gt_box, 3) - ay.clone(),
        ],
        1,
    );
    let (w, h) = (imgsz[1] as f32, imgsz[0] as f32);
    let scale = Tensor::cat(
        t.fg_stride
            .iter()
            .map(|&s| f32s(vec![s / w, s / h, s / w, s / h], vec![4]).reshape([1, 4]))
            .collect(),
        0,
    );
    let l1 = ((ltrb - target_ltrb) * scale)
        .abs()
        .mean_dim(1)
        .reshape([n]);
    let l1 = sum_all(l1 * weight) / t.score_sum;

    let (Some(kpts), Some(sigma_raw)) = (&out.kpts, &out.kpts_sigma) else {
        return [box_loss, zero(), zero(), cls, l1, zero()];
    };
    let k = t.nk;
    let kd = kpts.dims()[1] / k;
    let raw = rows(kpts).reshape([n, k, kd]);
    let gt = f32s(
        t.fg_kpts.iter().flatten().copied().collect(),
        vec![n * k * 3],
    )
    .reshape([n, k, 3]);
    let gx = gt.clone().narrow(2, 0, 1).reshape([n, k]);
    let gy = gt.clone().narrow(2, 1, 1).reshape([n, k]);
    let vis_host: Vec<f32> = t
        .fg_kpts
        .iter()
        .map(|p| if p[2] != 0.0 { 1.0 } else { 0.0 })
        .collect();
    let vis = f32s(vis_host.clone(), vec![n * k]).reshape([n, k]);
    let px = raw.clone().narrow(2, 0, 1).reshape([n, k]) + ax.clone();
    let py = raw.clone().narrow(2, 1, 1).reshape([n, k]) + ay.clone();

    // OKS loss with the box area in grid units (no 0.53 factor here).
    let area = (part(&gt_box, 2) - part(&gt_box, 0)) * (part(&gt_box, 3) - part(&gt_box, 1));
    let sig2 = f32s(sigmas.iter().map(|s| 8.0 * s * s).collect(), vec![k]).reshape([1, k]);
    let d = (px.clone() - gx.clone()).powi_scalar(2) + (py.clone() - gy.clone()).powi_scalar(2);
    let e = d / (sig2 * (area + 1e-9));
    let n_vis: Vec<f32> = vis_host
        .chunks(k)
        .map(|c| k as f32 / (c.iter().sum::<f32>() + 1e-9))
        .collect();
    let factor = col(n_vis);
    let pose = (factor * (e.neg().exp().neg() + 1.0) * vis.clone()).mean();
    let kobj = if kd == 3 {
        bce_with_logits(raw.narrow(2, 2, 1).reshape([n, k]), vis).mean()
    } else {
        zero()
    };

    // RLE over labelled keypoints.
    let visible: Vec<i64> = (0..n * k)
        .filter(|&i| vis_host[i] > 0.0)
        .map(|i| i as i64)
        .collect();
    let rle = match (flow, visible.len()) {
        (Some(flow), m) if m > 0 => {
            let sel = Tensor::<1, Int>::from_data(TensorData::new(visible.clone(), [m]), &device);
            let pick = |x: Tensor<2>| x.reshape([n * k]).select(0, sel.clone()).reshape([m, 1]);
            let mu = Tensor::cat(vec![pick(px), pick(py)], 1);
            let g = Tensor::cat(vec![pick(gx), pick(gy)], 1);
            let sigma = sigmoid(rows(sigma_raw).reshape([n * k, 2]).select(0, sel.clone()))
                .clamp_min(f32::MIN_POSITIVE);
            let eps = ((mu - g) / (sigma.clone() + 1e-9)).clamp(-100.0, 100.0);
            let log_phi = flow.log_prob(eps.clone()).reshape([m, 1]);
            let per_coord = sigma.clone().log() + (sigma * 2.0).log() + eps.abs();
            let weights = rle_weights(k);
            let wj = f32s(
                visible.iter().map(|&i| weights[i as usize % k]).collect(),
                vec![m],
            )
            .reshape([m, 1]);
            let l = (per_coord.sum_dim(1) - log_phi * 2.0) * wj;
            (sum_all(l) / m as f32).clamp_min(0.0)
        }
        _ => zero(),
    };
    [box_loss, pose, kobj, cls, l1, rle]
}

/// CIoU of rows `[N, 4]` (xyxy) against constant targets; the aspect weight α carries no
/// gradient, as in Ultralytics.
pub fn ciou(pred: Tensor<2>, target: Tensor<2>) -> Tensor<1> {
    const EPS: f32 = 1e-7;
    let [n, _] = pred.dims();
    let c = |x: &Tensor<2>, i: usize| x.clone().narrow(1, i, 1).reshape([n]);
    let (px1, py1, px2, py2) = (c(&pred, 0), c(&pred, 1), c(&pred, 2), c(&pred, 3));
    let (tx1, ty1, tx2, ty2) = (c(&target, 0), c(&target, 1), c(&target, 2), c(&target, 3));
    let (w1, h1) = (px2.clone() - px1.clone(), py2.clone() - py1.clone() + EPS);
    let (w2, h2) = (tx2.clone() - tx1.clone(), ty2.clone() - ty1.clone() + EPS);
    let iw = (px2.clone().min_pair(tx2.clone()) - px1.clone().max_pair(tx1.clone())).clamp_min(0.0);
    let ih = (py2.clone().min_pair(ty2.clone()) - py1.clone().max_pair(ty1.clone())).clamp_min(0.0);
    let inter = iw * ih;
    let union = w1.clone() * h1.clone() + w2.clone() * h2.clone() - inter.clone() + EPS;
    let iou = inter / union;
    let cw = px2.clone().max_pair(tx2.clone()) - px1.clone().min_pair(tx1.clone());
    let ch = py2.clone().max_pair(ty2.clone()) - py1.clone().min_pair(ty1.clone());
    let c2 = cw.powi_scalar(2) + ch.powi_scalar(2) + EPS;
    let rho2 =
        ((tx1 + tx2 - px1 - px2).powi_scalar(2) + (ty1 + ty2 - py1 - py2).powi_scalar(2)) / 4.0;
    let v = ((w2 / h2).atan() - (w1 / h1).atan()).powi_scalar(2)
        * (4.0 / (std::f32::consts::PI * std::f32::consts::PI));
    let alpha = (v.clone() / (v.clone() - iou.clone() + (1.0 + EPS))).detach();
    iou - (rho2 / c2 + v * alpha)
}
