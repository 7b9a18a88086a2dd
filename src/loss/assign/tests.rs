use super::*;
use crate::loss::geometry::COCO_SIGMAS;

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
