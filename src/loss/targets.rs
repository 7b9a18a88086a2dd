//! From detached head outputs and labels to per-anchor targets of one branch copy (host side).

use super::assign::{Anchors, AssignerConfig, Predicted, Target, assign_among, candidate_lists};
use crate::data::Instance;
use crate::model::BranchOutput;
use burn::prelude::*;

/// Targets of one branch copy for a whole batch. Foreground rows are listed in (image, anchor)
/// order; geometry is in grid units of the row's own stride.
#[derive(Clone, Debug, PartialEq)]
pub struct BranchTargets {
    pub batch: usize,
    pub anchors: usize,
    pub nc: usize,
    /// `[B, nc, A]` soft class targets, laid out like the head's scores.
    pub target_scores: Vec<f32>,
    /// max(Σ target_scores, 1).
    pub score_sum: f32,
    /// Foreground row `b · A + a` into `[B · A]`.
    pub fg_rows: Vec<i64>,
    /// Σ over classes of the row's target scores.
    pub fg_weight: Vec<f32>,
    pub fg_anchor: Vec<[f32; 2]>,
    pub fg_stride: Vec<f32>,
    /// Assigned object box `[x1, y1, x2, y2]`.
    pub fg_box: Vec<[f32; 4]>,
    /// Assigned object keypoints `(x, y, v)`, `nk` per row (pose).
    pub fg_kpts: Vec<[f32; 3]>,
    pub nk: usize,
    /// The row's predicted ltrb distances, as read back for the assignment.
    pub fg_ltrb: Vec<[f32; 4]>,
    /// The row's raw keypoint outputs, `nk · kpt_dim` per row (pose), as read back.
    pub fg_raw_kpts: Vec<f32>,
    /// Values per keypoint in the head's output (2 or 3; 0 without keypoints).
    pub kpt_dim: usize,
}

impl BranchTargets {
    pub fn num_fg(&self) -> usize {
        self.fg_rows.len()
    }
}

/// Reads a tensor back as `f32` values.
pub fn host(t: Tensor<3>) -> Vec<f32> {
    t.detach()
        .into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .expect("f32 data after convert")
}

/// Decodes the branch's predictions, assigns every image and gathers the targets.
pub fn build_targets(
    cfg: &AssignerConfig,
    anchors: &Anchors,
    out: &BranchOutput,
    labels: &[Vec<Instance>],
    sigmas: &[f32],
) -> BranchTargets {
    let [b_len, nc, a_len] = out.scores.dims();
    assert_eq!(
        a_len,
        anchors.len(),
        "anchor count of head output and input size disagree"
    );
    assert_eq!(labels.len(), b_len, "one label list per image");
    let boxes = host(out.boxes.clone());
    let scores = host(out.scores.clone());
    let kpts = out.kpts.clone().map(host);
    let kpt_ch = out.kpts.as_ref().map_or(0, |k| k.dims()[1]);
    let nk = if kpts.is_some() { sigmas.len() } else { 0 };
    let kd = kpt_ch.checked_div(nk).unwrap_or(0);
    let mut t = BranchTargets {
        batch: b_len,
        anchors: a_len,
        nc,
        target_scores: vec![0.0; b_len * nc * a_len],
        score_sum: 0.0,
        fg_rows: Vec::new(),
        fg_weight: Vec::new(),
        fg_anchor: Vec::new(),
        fg_stride: Vec::new(),
        fg_box: Vec::new(),
        fg_kpts: Vec::new(),
        nk,
        fg_ltrb: Vec::new(),
        fg_raw_kpts: Vec::new(),
        kpt_dim: kd,
    };
    let mut total = 0.0f32;
    for (b, image_labels) in labels.iter().enumerate() {
        let at = |ch: usize, c: usize, a: usize| b * ch * a_len + c * a_len + a;
        let targets: Vec<Target> = image_labels
            .iter()
            .map(|inst| Target::of(inst, nk > 0))
            .collect();
        // The assigner reads predictions at candidate anchors only: decode just those (the
        // rest stay zero and unread).
        let candidates = candidate_lists(cfg, anchors, &targets);
        let mut needed: Vec<usize> = candidates.iter().flatten().copied().collect();
        needed.sort_unstable();
        needed.dedup();
        let mut pred_boxes = vec![[0.0f32; 4]; a_len];
        let mut probs = vec![0.0f32; a_len * nc];
        let mut pred_kpts = kpts.as_ref().map(|_| vec![[0.0f32; 2]; a_len * nk]);
        for &a in &needed {
            let [ax, ay] = anchors.points[a];
            let s = anchors.strides[a];
            let d = |c| boxes[at(4, c, a)];
            pred_boxes[a] = [
                (ax - d(0)) * s,
                (ay - d(1)) * s,
                (ax + d(2)) * s,
                (ay + d(3)) * s,
            ];
            for c in 0..nc {
                probs[a * nc + c] = sigmoid(scores[at(nc, c, a)]);
            }
            if let (Some(k), Some(pk)) = (&kpts, &mut pred_kpts) {
                for j in 0..nk {
                    pk[a * nk + j] = [
                        (k[at(kpt_ch, j * kd, a)] + ax) * s,
                        (k[at(kpt_ch, j * kd + 1, a)] + ay) * s,
                    ];
                }
            }
        }
        let pred = Predicted {
            scores: &probs,
            boxes: &pred_boxes,
            keypoints: pred_kpts.as_deref(),
            nc,
        };
        let asg = assign_among(cfg, anchors, &pred, &targets, &candidates, sigmas);
        for a in 0..a_len {
            for c in 0..nc {
                let v = asg.target_scores[a * nc + c];
                t.target_scores[at(nc, c, a)] = v;
                total += v;
            }
            if !asg.fg[a] {
                continue;
            }
            let inst = &image_labels[asg.gt_index[a]];
            let s = anchors.strides[a];
            t.fg_rows.push((b * a_len + a) as i64);
            t.fg_weight
                .push(asg.target_scores[a * nc..(a + 1) * nc].iter().sum());
            t.fg_anchor.push(anchors.points[a]);
            t.fg_stride.push(s);
            t.fg_box.push(inst.bbox.map(|v| v / s));
            t.fg_ltrb.push(std::array::from_fn(|c| boxes[at(4, c, a)]));
            if let (Some(k), true) = (&kpts, nk > 0) {
                t.fg_kpts
                    .extend(inst.keypoints.iter().map(|k| [k[0] / s, k[1] / s, k[2]]));
                t.fg_raw_kpts
                    .extend((0..kpt_ch).map(|c| k[at(kpt_ch, c, a)]));
            }
        }
    }
    t.score_sum = total.max(1.0);
    t
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}
