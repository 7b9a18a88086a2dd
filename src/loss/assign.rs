//! Task-aligned assignment on the host (yolo_spec §3.3–3.4): which anchors learn which object.
//! Runs on detached predictions read back from the device, so it is exact, deterministic
//! (ties break towards the lower anchor index) and testable by hand.

pub mod device;

use super::geometry::{ciou, oks};
use crate::model::STRIDES;

/// Anchor centres of all levels for an `h × w` input, P3 cells first (as the head orders them).
#[derive(Clone, Debug, PartialEq)]
pub struct Anchors {
    /// Cell centres in grid units of their own level.
    pub points: Vec<[f32; 2]>,
    pub strides: Vec<f32>,
    /// Each level's first anchor, grid rows, grid columns and stride: anchor
    /// `start + i · cols + j` is cell `(i, j)`.
    levels: Vec<[usize; 4]>,
}

impl Anchors {
    pub fn new(h: usize, w: usize) -> Self {
        let mut points = Vec::new();
        let mut strides = Vec::new();
        let mut levels = Vec::new();
        for s in STRIDES {
            levels.push([points.len(), h / s, w / s, s]);
            for i in 0..h / s {
                for j in 0..w / s {
                    points.push([j as f32 + 0.5, i as f32 + 0.5]);
                    strides.push(s as f32);
                }
            }
        }
        Self {
            points,
            strides,
            levels,
        }
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

impl<'a> Target<'a> {
    /// A labelled object; its keypoints count only for pose.
    pub fn of(instance: &'a crate::data::Instance, pose: bool) -> Self {
        Self {
            class: instance.class,
            bbox: instance.bbox,
            keypoints: pose.then_some(instance.keypoints.as_slice()),
        }
    }
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
    let candidates = candidate_lists(cfg, anchors, targets);
    assign_among(cfg, anchors, pred, targets, &candidates, sigmas)
}

/// [`assign`] given each object's candidate anchors ([`candidate_lists`]).
pub fn assign_among(
    cfg: &AssignerConfig,
    anchors: &Anchors,
    pred: &Predicted,
    targets: &[Target],
    candidates: &[Vec<usize>],
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
    // Each object's candidate anchors, ascending, with (overlap, alignment). Every other anchor
    // has overlap and alignment 0 for it: the work is proportional to the candidates, not to
    // objects × anchors.
    let scored: Vec<Vec<(usize, f32, f32)>> = targets
        .iter()
        .zip(candidates)
        .map(|(t, cand)| {
            cand.iter()
                .map(|&a| {
                    let ov = overlap(cfg, pred, a, t, sigmas).max(0.0);
                    let align = pred.scores[a * nc + t.class].powf(cfg.alpha) * ov.powf(cfg.beta);
                    (a, ov, align)
                })
                .collect()
        })
        .collect();
    let lookup = |g: usize, a: usize| -> Option<(f32, f32)> {
        let c = &scored[g];
        c.binary_search_by_key(&a, |e| e.0)
            .ok()
            .map(|i| (c[i].1, c[i].2))
    };
    let overlap_of = |g: usize, a: usize| lookup(g, a).map_or(0.0, |e| e.0);
    let align_of = |g: usize, a: usize| lookup(g, a).map_or(0.0, |e| e.1);
    // Positives: the top-k alignments over all anchors that are candidates.
    let mut pos: Vec<Vec<usize>> = scored
        .iter()
        .map(|c| {
            let values: Vec<(usize, f32)> = c.iter().map(|e| (e.0, e.2)).collect();
            let mut p: Vec<usize> = top_set(&values, a_len, cfg.topk)
                .into_iter()
                .filter(|a| c.binary_search_by_key(a, |e| e.0).is_ok())
                .collect();
            p.sort_unstable();
            p
        })
        .collect();
    // An anchor claimed by several objects goes to the one it overlaps most (of all objects).
    let mut claims = vec![0u32; a_len];
    for p in &pos {
        for &a in p {
            claims[a] += 1;
        }
    }
    let mut contested: Vec<usize> = pos
        .iter()
        .flatten()
        .copied()
        .filter(|&a| claims[a] > 1)
        .collect();
    contested.sort_unstable();
    contested.dedup();
    for a in contested {
        let best = argmax((0..n).map(|g| overlap_of(g, a)));
        for (g, p) in pos.iter_mut().enumerate() {
            match (p.binary_search(&a), g == best) {
                (Ok(i), false) => {
                    p.remove(i);
                }
                (Err(i), true) => p.insert(i, a),
                _ => {}
            }
        }
    }
    if cfg.topk2 != cfg.topk {
        for (g, p) in pos.iter_mut().enumerate() {
            let values: Vec<(usize, f32)> = p.iter().map(|&a| (a, align_of(g, a))).collect();
            let keep = top_set(&values, a_len, cfg.topk2);
            p.retain(|a| keep.contains(a));
        }
    }
    let mut norm = vec![0.0f32; a_len];
    for (g, p) in pos.iter().enumerate() {
        let (mut max_align, mut max_ov) = (0.0f32, 0.0f32);
        for &a in p {
            max_align = max_align.max(align_of(g, a));
            max_ov = max_ov.max(overlap_of(g, a));
        }
        for &a in p {
            out.fg[a] = true;
            out.gt_index[a] = g;
            norm[a] = norm[a].max(align_of(g, a) * max_ov / (max_align + EPS));
        }
    }
    for a in (0..a_len).filter(|&a| out.fg[a]) {
        out.target_scores[a * nc + targets[out.gt_index[a]].class] = norm[a];
    }
    out
}

/// Each object's candidate anchors, ascending: the only anchors whose predictions [`assign`]
/// reads for it.
pub fn candidate_lists(
    cfg: &AssignerConfig,
    anchors: &Anchors,
    targets: &[Target],
) -> Vec<Vec<usize>> {
    targets
        .iter()
        .map(|t| candidates(cfg, anchors, t))
        .collect()
}

/// In-box gate (with STAL widening) and, for pose, the pyramid-level gate: the candidate
/// anchors of `t`, ascending. Only the cells near the (widened) box are tested, each with the
/// exact in-box test.
fn candidates(cfg: &AssignerConfig, anchors: &Anchors, t: &Target) -> Vec<usize> {
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
    let side = ((x2 - x1) * (y2 - y1)).max(0.0).sqrt();
    let (finest, coarsest) = (STRIDES[0], STRIDES[2]);
    let mut in_box = Vec::new();
    let mut gated = Vec::new();
    for &[start, rows, cols, s] in &anchors.levels {
        // Cells whose centre (k + 0.5)·s may lie in [lo, hi], one cell of margin each side.
        let span = |lo: f32, hi: f32, len: usize| {
            let first = (lo / s as f32 - 1.5).floor().max(0.0) as usize;
            let last = ((hi / s as f32 + 0.5).ceil().max(0.0) as usize).min(len);
            first.min(len)..last
        };
        let level_open = !cfg.pose || {
            let sf = s as f32;
            (s == finest || side >= 2.0 * sf) && (s == coarsest || side <= 12.0 * sf)
        };
        for i in span(gy1, gy2, rows) {
            for j in span(gx1, gx2, cols) {
                let a = start + i * cols + j;
                let [x, y] = anchors.pixel(a);
                if (x - gx1).min(y - gy1).min(gx2 - x).min(gy2 - y) > 1e-9 {
                    in_box.push(a);
                    if level_open {
                        gated.push(a);
                    }
                }
            }
        }
    }
    if gated.is_empty() { in_box } else { gated }
}

/// CIoU for boxes; OKS (area = box area · 0.53) for pose objects with a labelled keypoint.
fn overlap(cfg: &AssignerConfig, pred: &Predicted, a: usize, t: &Target, sigmas: &[f32]) -> f32 {
    if cfg.pose
        && let (Some(gt), Some(pk)) = (t.keypoints, pred.keypoints)
        && gt.iter().any(|k| k[2] != 0.0)
    {
        let k = gt.len();
        let [x1, y1, x2, y2] = t.bbox;
        let area = (x2 - x1) * (y2 - y1) * crate::data::source::AREA_OF_BOX as f32;
        return oks(&pk[a * k..(a + 1) * k], gt, area, sigmas);
    }
    ciou(t.bbox, pred.boxes[a])
}

/// The `k` anchors (as a set) with the largest values among `a_len` anchors whose values are
/// `values` (`(anchor, value)`, ascending anchors) and +0 elsewhere; ties go to the lower anchor,
/// values ordered as `f32::total_cmp` orders them (so NaN first, as a sort over all anchors
/// would have it).
fn top_set(values: &[(usize, f32)], a_len: usize, k: usize) -> Vec<usize> {
    use std::cmp::Ordering::{Equal, Greater, Less};
    let k = k.min(a_len);
    let by_value = |x: &(usize, f32), y: &(usize, f32)| y.1.total_cmp(&x.1).then(x.0.cmp(&y.0));
    let mut above: Vec<(usize, f32)> = values
        .iter()
        .copied()
        .filter(|e| e.1.total_cmp(&0.0) == Greater)
        .collect();
    above.sort_unstable_by(by_value);
    let mut top: Vec<usize> = above.iter().take(k).map(|e| e.0).collect();
    // Then every anchor whose value is exactly +0 — all those not listed — by index.
    let mut listed = values.iter().peekable();
    let mut a = 0;
    while top.len() < k && a < a_len {
        while listed.peek().is_some_and(|e| e.0 < a) {
            listed.next();
        }
        let zero = match listed.peek() {
            Some(e) if e.0 == a => e.1.total_cmp(&0.0) == Equal,
            _ => true,
        };
        if zero {
            top.push(a);
        }
        a += 1;
    }
    if top.len() < k {
        let mut below: Vec<(usize, f32)> = values
            .iter()
            .copied()
            .filter(|e| e.1.total_cmp(&0.0) == Less)
            .collect();
        below.sort_unstable_by(by_value);
        top.extend(below.iter().take(k - top.len()).map(|e| e.0));
    }
    top
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
