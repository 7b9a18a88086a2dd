//! From raw head outputs to detections (yolo_spec §2.3–2.4): one-to-one top-k (NMS-free).

use crate::loss::assign::Anchors;
use crate::loss::targets::host;
use crate::model::BranchOutput;

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
    let kd = if nk > 0 { kch / nk } else { 0 };
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
