use super::*;
use crate::loss::geometry::COCO_SIGMAS;
use rand::{Rng, SeedableRng, rngs::StdRng};

/// 32×32 input: 16 P3 anchors, 4 P4, 1 P5.
fn small() -> Anchors {
    Anchors::new(32, 32)
}

fn run(cfg: &AssignerConfig, boxes: &[[f32; 4]], scores: &[f32], targets: &[Target]) -> Assignment {
    let pred = Predicted {
        scores,
        boxes,
        keypoints: None,
        nc: 1,
    };
    assign(cfg, &small(), &pred, targets, &COCO_SIGMAS)
}

fn fg_indices(a: &Assignment) -> Vec<usize> {
    (0..a.fg.len()).filter(|&i| a.fg[i]).collect()
}

const GT: [f32; 4] = [0.0, 0.0, 16.0, 16.0];

fn target(bbox: [f32; 4]) -> Target<'static> {
    Target {
        class: 0,
        bbox,
        keypoints: None,
    }
}

#[test]
fn anchors_are_level_ordered_cell_centres() {
    let a = small();
    assert_eq!(a.len(), 21);
    assert_eq!(a.pixel(0), [4.0, 4.0]);
    assert_eq!(a.pixel(5), [12.0, 12.0]);
    assert_eq!(a.pixel(16), [8.0, 8.0]);
    assert_eq!(a.pixel(20), [16.0, 16.0]);
}

#[test]
fn in_box_anchors_become_positive_with_full_targets() {
    // Every prediction equals the object: CIoU 1, align = 0.5^0.5 for every candidate.
    let boxes = vec![GT; 21];
    let scores = vec![0.5; 21];
    let a = run(
        &AssignerConfig::one2many(false),
        &boxes,
        &scores,
        &[target(GT)],
    );
    // Centres strictly inside [0, 16]²: P3 (4,4) (12,4) (4,12) (12,12) and P4 (8,8); the P5
    // centre (16,16) lies on the border.
    assert_eq!(fg_indices(&a), vec![0, 1, 4, 5, 16]);
    for i in fg_indices(&a) {
        assert!((a.target_scores[i] - 1.0).abs() < 1e-6);
    }
    assert_eq!(a.num_fg(), 5);
}

#[test]
fn one_to_one_keeps_the_best_aligned_anchor() {
    let boxes = vec![GT; 21];
    let mut scores = vec![0.5; 21];
    scores[5] = 0.9;
    let a = run(
        &AssignerConfig::one2one(false),
        &boxes,
        &scores,
        &[target(GT)],
    );
    assert_eq!(fg_indices(&a), vec![5]);
    // With equal alignment the lower index wins.
    let a = run(
        &AssignerConfig::one2one(false),
        &boxes,
        &[0.5; 21],
        &[target(GT)],
    );
    assert_eq!(fg_indices(&a), vec![0]);
}

#[test]
fn soft_targets_are_normalised_alignment() {
    let mut boxes = vec![GT; 21];
    boxes[1] = [2.0, 1.0, 17.0, 15.0];
    let c = ciou(GT, boxes[1]);
    let a = run(
        &AssignerConfig::one2many(false),
        &boxes,
        &[0.5; 21],
        &[target(GT)],
    );
    assert!((a.target_scores[0] - 1.0).abs() < 1e-6);
    // align_1 · max_overlap / max_align = c⁶ (the score factor cancels).
    assert!(
        (a.target_scores[1] - c.powi(6)).abs() < 1e-6,
        "{} vs {}",
        a.target_scores[1],
        c.powi(6)
    );
}

#[test]
fn topk_limits_candidates() {
    let boxes = vec![GT; 21];
    let mut scores = vec![0.5; 21];
    scores[4] = 0.8;
    scores[16] = 0.7;
    let cfg = AssignerConfig {
        topk: 2,
        topk2: 2,
        ..AssignerConfig::one2many(false)
    };
    let a = run(&cfg, &boxes, &scores, &[target(GT)]);
    assert_eq!(fg_indices(&a), vec![4, 16]);
}

#[test]
fn stal_widens_tiny_objects_for_the_gate() {
    let tiny = [9.0, 9.0, 11.0, 11.0];
    let boxes = vec![tiny; 21];
    let with = run(
        &AssignerConfig::one2many(false),
        &boxes,
        &[0.5; 21],
        &[target(tiny)],
    );
    // Widened to [2, 18]²: the four inner P3 centres, the P4 centre (8,8) and the P5 centre (16,16).
    assert_eq!(fg_indices(&with), vec![0, 1, 4, 5, 16, 20]);
    let cfg = AssignerConfig {
        stal_min_side: 0.0,
        ..AssignerConfig::one2many(false)
    };
    let without = run(&cfg, &boxes, &[0.5; 21], &[target(tiny)]);
    assert_eq!(without.num_fg(), 0);
}

#[test]
fn shared_anchor_goes_to_the_larger_overlap() {
    let other = [8.0, 8.0, 24.0, 24.0];
    // Anchor 5 (12,12) is inside both; its prediction matches `other` better.
    let mut boxes = vec![GT; 21];
    boxes[5] = [9.0, 9.0, 24.0, 24.0];
    let a = run(
        &AssignerConfig::one2many(false),
        &boxes,
        &[0.5; 21],
        &[target(GT), target(other)],
    );
    assert!(a.fg[5]);
    assert_eq!(a.gt_index[5], 1);
}

#[test]
fn no_objects_means_no_positives() {
    let a = run(&AssignerConfig::one2many(true), &[GT; 21], &[0.5; 21], &[]);
    assert_eq!(a.num_fg(), 0);
    assert!(a.target_scores.iter().all(|&t| t == 0.0));
}

#[test]
fn pose_gate_uses_pyramid_levels_and_oks() {
    let anchors = Anchors::new(256, 256);
    let bbox = [20.0, 20.0, 120.0, 120.0]; // side 100: not on P3 (≤ 96), P4 and P5 open
    let kpts: Vec<[f32; 3]> = (0..17)
        .map(|j| [40.0 + 4.0 * j as f32, 60.0, 2.0])
        .collect();
    let n = anchors.len();
    let boxes = vec![bbox; n];
    let scores = vec![0.5; n];
    // Predicted keypoints exact for anchor-independent OKS = 1.
    let pk: Vec<[f32; 2]> = (0..n)
        .flat_map(|_| kpts.iter().map(|k| [k[0], k[1]]))
        .collect();
    let pred = Predicted {
        scores: &scores,
        boxes: &boxes,
        keypoints: Some(&pk),
        nc: 1,
    };
    let t = Target {
        class: 0,
        bbox,
        keypoints: Some(&kpts),
    };
    let a = assign(
        &AssignerConfig::one2many(true),
        &anchors,
        &pred,
        &[t],
        &COCO_SIGMAS,
    );
    let fg: Vec<usize> = (0..n).filter(|&i| a.fg[i]).collect();
    assert!(!fg.is_empty());
    assert!(fg.iter().all(|&i| anchors.strides[i] >= 16.0), "{fg:?}");
    // The same object in box mode may use P3 anchors (ties break to the lowest index).
    let b = assign(
        &AssignerConfig::one2many(false),
        &anchors,
        &pred,
        &[t],
        &COCO_SIGMAS,
    );
    assert!((0..n).any(|i| b.fg[i] && anchors.strides[i] == 8.0));
}

/// Random images, objects and predictions, tie-heavy on purpose (quantised scores, repeated and
/// tiny boxes, all-equal predictions, zero scores): the candidate-only assigner equals the dense
/// reference in every field, bit for bit.
/// A random object box in a `wf × hf` image: a repeat of `last` (every anchor of both is
/// contested), a tiny one (widened by STAL), one partly outside the image, or any other.
pub(super) fn random_box(rng: &mut StdRng, last: Option<[f32; 4]>, wf: f32, hf: f32) -> [f32; 4] {
    match (rng.random_range(0..5), last) {
        (0, Some(b)) => b,
        (1, _) => {
            let (x, y) = (rng.random_range(0.0..wf), rng.random_range(0.0..hf));
            [x, y, x + 1.5, y + 2.0]
        }
        (2, _) => [-10.0, -5.0, rng.random_range(5.0..wf + 20.0), hf + 3.0],
        _ => {
            let (x1, y1) = (rng.random_range(0.0..wf), rng.random_range(0.0..hf));
            [
                x1,
                y1,
                x1 + rng.random_range(1.0..wf),
                y1 + rng.random_range(1.0..hf),
            ]
        }
    }
}

/// `nk` random keypoints inside `b`, a fifth of the objects with none labelled.
pub(super) fn random_keypoints(rng: &mut StdRng, b: [f32; 4], nk: usize) -> Vec<[f32; 3]> {
    let hidden = rng.random_bool(0.2);
    (0..nk)
        .map(|_| {
            let v = if hidden || rng.random_bool(0.3) {
                0.0
            } else {
                2.0
            };
            [
                rng.random_range(b[0]..b[2].max(b[0] + 1.0)),
                rng.random_range(b[1]..b[3].max(b[1] + 1.0)),
                v,
            ]
        })
        .collect()
}

/// Case `case`'s assigner settings: both copies, and three other top-k pairs.
pub(super) fn config_for(case: usize, pose: bool) -> AssignerConfig {
    match case % 5 {
        0 => AssignerConfig::one2many(pose),
        1 => AssignerConfig::one2one(pose),
        2 => AssignerConfig {
            topk: 3,
            topk2: 2,
            ..AssignerConfig::one2many(pose)
        },
        3 => AssignerConfig {
            topk: 40,
            topk2: 5,
            ..AssignerConfig::one2one(pose)
        },
        _ => AssignerConfig {
            topk: 1,
            topk2: 1,
            ..AssignerConfig::one2many(pose)
        },
    }
}

#[test]
fn candidate_only_assignment_equals_the_dense_reference() {
    let mut rng = StdRng::seed_from_u64(27);
    let sizes = [(32, 32), (64, 96), (100, 72), (128, 128)];
    let (mut compared, mut contested, mut zero_fill) = (0, 0, 0);
    for case in 0..1500 {
        let (h, w) = sizes[case % sizes.len()];
        let anchors = Anchors::new(h, w);
        let a_len = anchors.len();
        let nc = 1 + case % 3;
        let pose = case % 2 == 0;
        let cfg = config_for(case, pose);
        let (wf, hf) = (w as f32, h as f32);
        let mut boxes_gt: Vec<[f32; 4]> = Vec::new();
        for _ in 0..rng.random_range(0..7) {
            let b = random_box(&mut rng, boxes_gt.last().copied(), wf, hf);
            boxes_gt.push(b);
        }
        let kpts: Vec<Vec<[f32; 3]>> = boxes_gt
            .iter()
            .map(|b| random_keypoints(&mut rng, *b, 17))
            .collect();
        let targets: Vec<Target> = boxes_gt
            .iter()
            .zip(&kpts)
            .map(|(&bbox, k)| Target {
                class: rng.random_range(0..nc),
                bbox,
                keypoints: Some(k.as_slice()),
            })
            .collect();
        let flat = case % 7 == 0;
        let scores: Vec<f32> = (0..a_len * nc)
            .map(|_| match () {
                _ if flat => 0.5,
                _ if rng.random_bool(0.1) => 0.0,
                // Quantised: many exact ties.
                _ => (rng.random_range(0..8) as f32) / 8.0,
            })
            .collect();
        let boxes: Vec<[f32; 4]> = (0..a_len)
            .map(|a| {
                if flat {
                    return [0.0, 0.0, wf / 2.0, hf / 2.0];
                }
                let [x, y] = anchors.pixel(a);
                let d = |r: &mut StdRng| (r.random_range(0..6) as f32) * 4.0;
                [
                    x - d(&mut rng),
                    y - d(&mut rng),
                    x + d(&mut rng),
                    y + d(&mut rng),
                ]
            })
            .collect();
        let pk: Vec<[f32; 2]> = (0..a_len * 17)
            .map(|_| [rng.random_range(0.0..wf), rng.random_range(0.0..hf)])
            .collect();
        let pred = Predicted {
            scores: &scores,
            boxes: &boxes,
            keypoints: Some(&pk),
            nc,
        };
        let fast = assign(&cfg, &anchors, &pred, &targets, &COCO_SIGMAS);
        let slow = reference::assign(&cfg, &anchors, &pred, &targets, &COCO_SIGMAS);
        assert_eq!(fast, slow, "case {case}: {h}x{w}, {cfg:?}, {boxes_gt:?}");
        compared += 1;
        if boxes_gt.len() > 1 && boxes_gt.windows(2).any(|p| p[0] == p[1]) {
            contested += 1;
        }
        if (0..a_len).any(|a| {
            fast.fg[a]
                && fast.target_scores[a * nc..(a + 1) * nc]
                    .iter()
                    .all(|&v| v == 0.0)
        }) {
            zero_fill += 1;
        }
    }
    // The cases exercised what they were made for.
    assert_eq!(compared, 1500);
    assert!(
        contested > 20 && zero_fill > 20,
        "{contested} contested, {zero_fill} zero-alignment"
    );
}

/// The assigner as it was written first, dense over objects × anchors: the reference the
/// candidate-only [`assign`] must equal exactly.
mod reference {
    use super::super::{
        Anchors, AssignerConfig, Assignment, EPS, Predicted, Target, argmax, overlap,
    };
    use crate::model::STRIDES;

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
}
