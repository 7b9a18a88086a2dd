//! Task-aligned assignment on the host (yolo_spec §3.3–3.4): which anchors learn which object.
//! Runs on detached predictions read back from the device, so it is exact, deterministic
//! (ties break towards the lower anchor index) and testable by hand.

use super::geometry::{ciou, oks};
use crate::model::STRIDES;

/// Anchor centres of all levels for an `h × w` input, P3 cells first (as the head orders them).
#[derive(Clone, Debug, PartialEq)]
pub struct Anchors {
    /// Cell centres in grid units of their own level.
    pub points: Vec<[f32; 2]>,
    pub strides: Vec<f32>,
}

impl Anchors {
    pub fn new(h: usize, w: usize) -> Self {
        let mut points = Vec::new();
        let mut strides = Vec::new();
        for s in STRIDES {
            for i in 0..h / s {
                for j in 0..w / s {
                    points.push([j as f32 + 0.5, i as f32 + 0.5]);
                    strides.push(s as f32);
                }
            }
        }
        Self { points, strides }
    }

    pub fn len(&self) -> usize {
        self.points.len()
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// Centre of anchor `a` in pixels.
    pub fn pixel(&self, a: usize) -> [f32; 2] {
        let s = self.strides[a];
        [self.points[a][0] * s, self.points[a][1] * s]
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct AssignerConfig {
    /// Candidates per object by alignment.
    pub topk: usize,
    /// Anchors kept per object at the end (`topk` = no second cut; one-to-one uses 1).
    pub topk2: usize,
    pub alpha: f32,
    pub beta: f32,
    /// STAL: object sides below this (pixels) are widened to it for the in-box gate.
    pub stal_min_side: f32,
    /// Pose assigner: OKS overlap and the pyramid-level gate.
    pub pose: bool,
}

impl AssignerConfig {
    /// One-to-many branch (topk 10).
    pub fn one2many(pose: bool) -> Self {
        Self {
            topk: 10,
            topk2: 10,
            alpha: 0.5,
            beta: 6.0,
            stal_min_side: STRIDES[1] as f32,
            pose,
        }
    }

    /// One-to-one branch (topk 7, then 1 per object).
    pub fn one2one(pose: bool) -> Self {
        Self {
            topk: 7,
            topk2: 1,
            ..Self::one2many(pose)
        }
    }
}

/// One ground-truth object in pixels of the network input.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    pub class: usize,
    pub bbox: [f32; 4],
    pub keypoints: Option<&'a [[f32; 3]]>,
}

/// Detached predictions of one image, decoded to pixels.
#[derive(Clone, Copy, Debug)]
pub struct Predicted<'a> {
    /// `[A · nc]` class probabilities.
    pub scores: &'a [f32],
    /// `[A]` boxes `[x1, y1, x2, y2]`.
    pub boxes: &'a [[f32; 4]],
    /// `[A · K]` keypoint `(x, y)` (pose).
    pub keypoints: Option<&'a [[f32; 2]]>,
    pub nc: usize,
}

/// Per-anchor result of one image.
#[derive(Clone, Debug, PartialEq)]
pub struct Assignment {
    pub fg: Vec<bool>,
    /// Object index per anchor (0 where not foreground).
    pub gt_index: Vec<usize>,
    /// `[A · nc]` soft class targets (normalised alignment on the object's class).
    pub target_scores: Vec<f32>,
}

impl Assignment {
    pub fn num_fg(&self) -> usize {
        self.fg.iter().filter(|&&f| f).count()
    }
}

const EPS: f32 = 1e-9;

pub fn assign(
    cfg: &AssignerConfig,
    anchors: &Anchors,
    pred: &Predicted,
    targets: &[Target],
    sigmas: &[f32],
) -> Assignment {
    let a_len = anchors.len();
    let nc = pred.nc;
    let mut out = Assignment {
        fg: vec![false; a_len],
        gt_index: vec![0; a_len],
        target_scores: vec![0.0; a_len * nc],
    };
    if targets.is_empty() {
        return out;
    }
    let n = targets.len();
    let centres: Vec<[f32; 2]> = (0..a_len).map(|a| anchors.pixel(a)).collect();
    let mut overlaps = vec![vec![0.0f32; a_len]; n];
    let mut align = vec![vec![0.0f32; a_len]; n];
    let mut pos = vec![vec![false; a_len]; n];
    for (g, t) in targets.iter().enumerate() {
        let cand = candidates(cfg, anchors, &centres, t);
        for a in (0..a_len).filter(|&a| cand[a]) {
            let ov = overlap(cfg, pred, a, t, sigmas).max(0.0);
            overlaps[g][a] = ov;
            align[g][a] = pred.scores[a * nc + t.class].powf(cfg.alpha) * ov.powf(cfg.beta);
        }
        for a in top_indices(&align[g], cfg.topk) {
            pos[g][a] = cand[a];
        }
    }
    // An anchor claimed by several objects goes to the one it overlaps most.
    for a in 0..a_len {
        if (0..n).filter(|&g| pos[g][a]).count() > 1 {
            let best = argmax((0..n).map(|g| overlaps[g][a]));
            for (g, p) in pos.iter_mut().enumerate() {
                p[a] = g == best;
            }
        }
    }
    if cfg.topk2 != cfg.topk {
        for g in 0..n {
            let masked: Vec<f32> = (0..a_len)
                .map(|a| if pos[g][a] { align[g][a] } else { 0.0 })
                .collect();
            let keep = top_indices(&masked, cfg.topk2);
            for (a, p) in pos[g].iter_mut().enumerate() {
                *p &= keep.contains(&a);
            }
        }
    }
    let mut norm = vec![0.0f32; a_len];
    for g in 0..n {
        let (mut max_align, mut max_ov) = (0.0f32, 0.0f32);
        for a in (0..a_len).filter(|&a| pos[g][a]) {
            max_align = max_align.max(align[g][a]);
            max_ov = max_ov.max(overlaps[g][a]);
        }
        for a in (0..a_len).filter(|&a| pos[g][a]) {
            out.fg[a] = true;
            out.gt_index[a] = g;
            norm[a] = norm[a].max(align[g][a] * max_ov / (max_align + EPS));
        }
    }
    for a in (0..a_len).filter(|&a| out.fg[a]) {
        out.target_scores[a * nc + targets[out.gt_index[a]].class] = norm[a];
    }
    out
}

/// In-box gate (with STAL widening) and, for pose, the pyramid-level gate.
fn candidates(
    cfg: &AssignerConfig,
    anchors: &Anchors,
    centres: &[[f32; 2]],
    t: &Target,
) -> Vec<bool> {
    let [x1, y1, x2, y2] = t.bbox;
    let widen = |lo: f32, hi: f32| {
        if hi - lo < cfg.stal_min_side {
            let c = (lo + hi) / 2.0;
            (c - cfg.stal_min_side / 2.0, c + cfg.stal_min_side / 2.0)
        } else {
            (lo, hi)
        }
    };
    let ((gx1, gx2), (gy1, gy2)) = (widen(x1, x2), widen(y1, y2));
    let in_box: Vec<bool> = centres
        .iter()
        .map(|&[x, y]| (x - gx1).min(y - gy1).min(gx2 - x).min(gy2 - y) > 1e-9)
        .collect();
    if !cfg.pose {
        return in_box;
    }
    let side = ((x2 - x1) * (y2 - y1)).max(0.0).sqrt();
    let (finest, coarsest) = (STRIDES[0] as f32, STRIDES[2] as f32);
    let gated: Vec<bool> = (0..centres.len())
        .map(|a| {
            let s = anchors.strides[a];
            let lower = s == finest || side >= 2.0 * s;
            let upper = s == coarsest || side <= 12.0 * s;
            in_box[a] && lower && upper
        })
        .collect();
    if gated.iter().any(|&c| c) {
        gated
    } else {
        in_box
    }
}

/// CIoU for boxes; OKS (area = box area · 0.53) for pose objects with a labelled keypoint.
fn overlap(cfg: &AssignerConfig, pred: &Predicted, a: usize, t: &Target, sigmas: &[f32]) -> f32 {
    if cfg.pose
        && let (Some(gt), Some(pk)) = (t.keypoints, pred.keypoints)
        && gt.iter().any(|k| k[2] != 0.0)
    {
        let k = gt.len();
        let [x1, y1, x2, y2] = t.bbox;
        let area = (x2 - x1) * (y2 - y1) * 0.53;
        return oks(&pk[a * k..(a + 1) * k], gt, area, sigmas);
    }
    ciou(t.bbox, pred.boxes[a])
}

/// Indices of the `k` largest values (as a set), ties to the lower index.
fn top_indices(values: &[f32], k: usize) -> Vec<usize> {
    let k = k.min(values.len());
    if k == 0 {
        return Vec::new();
    }
    let mut idx: Vec<usize> = (0..values.len()).collect();
    idx.select_nth_unstable_by(k - 1, |&i, &j| {
        values[j].total_cmp(&values[i]).then(i.cmp(&j))
    });
    idx.truncate(k);
    idx
}

/// Index of the first maximum.
fn argmax(values: impl Iterator<Item = f32>) -> usize {
    let mut best = (0, f32::NEG_INFINITY);
    for (i, v) in values.enumerate() {
        if v > best.1 {
            best = (i, v);
        }
    }
    best.0
}

#[cfg(test)]
mod tests;
