//! From raw head outputs to detections (yolo_spec §2.3–2.4): one-to-one top-k (NMS-free).

use crate::loss::assign::Anchors;
use crate::loss::targets::host;
use crate::model::{BranchOutput, Yolo};
use burn::prelude::*;

/// How detections are chosen from a model's outputs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Select {
    /// Keypoints per object (0 for detection).
    pub nk: usize,
    /// The one-to-many head with NMS instead of the one-to-one (NMS-free) head.
    pub nms: bool,
    pub max_det: usize,
    pub conf: f32,
    /// NMS IoU threshold (only with `nms`).
    pub iou: f32,
}

/// `model`'s detections per image of `images` (`[B, 3, H, W]` in [0, 1]), in network-input
/// pixels: what validation scores and `predict` draws.
pub fn detect(model: &Yolo, images: Tensor<4>, s: &Select) -> Vec<Vec<Detection>> {
    let [_, _, h, w] = images.dims();
    let anchors = Anchors::new(h, w);
    let out = head_outputs(model, images, s.nms);
    if s.nms {
        one2many_nms(&out, &anchors, s.nk, s.max_det, s.conf, s.iou)
    } else {
        one2one(&out, &anchors, s.nk, s.max_det, s.conf)
    }
}

/// The raw outputs [`detect`] chooses from: the one-to-many head's with `nms`, else the
/// one-to-one head's.
pub fn head_outputs(model: &Yolo, images: Tensor<4>, nms: bool) -> BranchOutput {
    let features = model.features(images);
    match nms {
        true => model.head.one2many.forward(features.into_levels()),
        false => model.head.forward_one2one(&features),
    }
}

/// A detection in network-input pixels.
#[derive(Clone, Debug, PartialEq)]
pub struct Detection {
    pub bbox: [f32; 4],
    pub score: f32,
    pub class: usize,
    /// `(x, y, visibility)`.
    pub keypoints: Vec<[f32; 3]>,
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// One-to-one post-processing per image: the `max_det` anchors with the largest class score,
/// then the top `max_det` (anchor, class) pairs, keeping scores above `conf`.
pub fn one2one(
    out: &BranchOutput,
    anchors: &Anchors,
    nk: usize,
    max_det: usize,
    conf: f32,
) -> Vec<Vec<Detection>> {
    let [b_len, nc, a_len] = out.scores.dims();
    let boxes = host(out.boxes.clone());
    let scores = host(out.scores.clone());
    let kpts = out.kpts.clone().map(host);
    let kch = out.kpts.as_ref().map_or(0, |k| k.dims()[1]);
    let kd = kch.checked_div(nk).unwrap_or(0);
    let k = max_det.min(a_len);
    (0..b_len)
        .map(|b| {
            let score = |a: usize, c: usize| sigmoid(scores[(b * nc + c) * a_len + a]);
            let best = |a: usize| (0..nc).map(|c| score(a, c)).fold(f32::MIN, f32::max);
            let mut cand: Vec<usize> = (0..a_len).collect();
            cand.sort_by(|&i, &j| best(j).total_cmp(&best(i)).then(i.cmp(&j)));
            cand.truncate(k);
            let mut pairs: Vec<(usize, usize)> = cand
                .iter()
                .flat_map(|&a| (0..nc).map(move |c| (a, c)))
                .collect();
            pairs.sort_by(|&(a1, c1), &(a2, c2)| score(a2, c2).total_cmp(&score(a1, c1)));
            pairs.truncate(k);
            pairs
                .into_iter()
                .filter(|&(a, c)| score(a, c) > conf)
                .map(|(a, c)| {
                    let [ax, ay] = anchors.points[a];
                    let s = anchors.strides[a];
                    let d = |i: usize| boxes[(b * 4 + i) * a_len + a];
                    let keypoints = kpts
                        .as_ref()
                        .map(|kp| {
                            let at = |ch: usize| kp[(b * kch + ch) * a_len + a];
                            (0..nk)
                                .map(|j| {
                                    let v = if kd == 3 {
                                        sigmoid(at(j * kd + 2))
                                    } else {
                                        1.0
                                    };
                                    [(at(j * kd) + ax) * s, (at(j * kd + 1) + ay) * s, v]
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    Detection {
                        bbox: [
                            (ax - d(0)) * s,
                            (ay - d(1)) * s,
                            (ax + d(2)) * s,
                            (ay + d(3)) * s,
                        ],
                        score: score(a, c),
                        class: c,
                        keypoints,
                    }
                })
                .collect()
        })
        .collect()
}

/// IoU of two `[x1, y1, x2, y2]` boxes.
fn iou(a: &[f32; 4], b: &[f32; 4]) -> f32 {
    let iw = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let ih = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    let inter = iw * ih;
    let union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter;
    if union > 0.0 { inter / union } else { 0.0 }
}

/// One-to-many post-processing with NMS (Ultralytics' `nms=True` path): candidates whose best
/// class score exceeds `conf` (at most 30,000, by score), greedy per-class NMS at `iou_thr`,
/// at most `max_det` kept.
pub fn one2many_nms(
    out: &BranchOutput,
    anchors: &Anchors,
    nk: usize,
    max_det: usize,
    conf: f32,
    iou_thr: f32,
) -> Vec<Vec<Detection>> {
    let a_len = out.scores.dims()[2];
    // Every anchor decoded, then filtered: reuse the one-to-one decoder with no cut.
    let all = one2one(out, anchors, nk, a_len, conf);
    all.into_iter()
        .map(|mut dets| {
            dets.truncate(30_000);
            let mut keep: Vec<Detection> = Vec::new();
            for d in dets {
                if keep.len() == max_det {
                    break;
                }
                if keep
                    .iter()
                    .all(|k| k.class != d.class || iou(&k.bbox, &d.bbox) <= iou_thr)
                {
                    keep.push(d);
                }
            }
            keep
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 32×32 input (21 anchors), one class: anchors 0 and 1 predict overlapping boxes.
    fn output(d: &Device) -> BranchOutput {
        let mut boxes = vec![0.5f32; 4 * 21];
        let mut scores = vec![-10.0f32; 21];
        scores[0] = 2.0; // box [0,0,8,8] at stride 8 around (4,4)
        scores[1] = 1.0; // around (12,4)
        scores[16] = 0.0; // P4 anchor (8,8), ltrb 0.5 → [0,0,16,16]
        // Anchor 1 (centre 1.5 cells): l = 1.5, r = 0 → [0, 0, 12, 8], IoU 64/96 with anchor 0.
        boxes[1] = 1.5;
        boxes[2 * 21 + 1] = 0.0;
        BranchOutput {
            boxes: Tensor::<1>::from_floats(boxes.as_slice(), d).reshape([1, 4, 21]),
            scores: Tensor::<1>::from_floats(scores.as_slice(), d).reshape([1, 1, 21]),
            kpts: None,
            kpts_sigma: None,
        }
    }

    #[test]
    fn one2one_ranks_and_decodes() {
        let d = Device::flex();
        let dets = one2one(&output(&d), &Anchors::new(32, 32), 0, 2, 0.001);
        assert_eq!(dets[0].len(), 2);
        assert_eq!(dets[0][0].bbox, [0.0, 0.0, 8.0, 8.0]);
        assert!((dets[0][0].score - 1.0 / (1.0 + (-2.0f32).exp())).abs() < 1e-6);
        assert_eq!(dets[0][1].bbox, [0.0, 0.0, 12.0, 8.0]);
    }

    #[test]
    fn nms_drops_the_overlapping_lower_score() {
        let d = Device::flex();
        let dets = one2many_nms(&output(&d), &Anchors::new(32, 32), 0, 300, 0.01, 0.5);
        // Anchor 1's [0,0,12,8] overlaps anchor 0's [0,0,8,8] with IoU 64/96 > 0.5: dropped.
        // The P4 box [0,0,16,16] overlaps anchor 0 with IoU 0.25 and anchor 1 with 0.375: kept.
        let boxes: Vec<[f32; 4]> = dets[0].iter().map(|d| d.bbox).collect();
        assert_eq!(boxes, vec![[0.0, 0.0, 8.0, 8.0], [0.0, 0.0, 16.0, 16.0]]);
    }
}
