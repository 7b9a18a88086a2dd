//! Assignment and losses of YOLO26 pose/detect (yolo_spec §3): both head copies, each with its
//! own assigner, combined with the ProgLoss weights.

pub mod assign;
pub mod dense;
pub mod dual;
pub mod geometry;
pub mod targets;
pub mod terms;

use crate::data::Instance;
use crate::model::flow::RealNvp;
use crate::model::{HeadOutput, Task};
use assign::{Anchors, AssignerConfig};
use burn::prelude::*;
use targets::{BranchTargets, build_targets};
use terms::branch_parts;

/// Names of the loss terms, in the order of every loss vector.
pub const TERMS: [&str; 6] = ["box", "pose", "kobj", "cls", "l1", "rle"];

/// Gains of `[box, pose, kobj, cls, l1, rle]` (Ultralytics defaults; l1 uses the `dfl` gain).
pub const DEFAULT_GAINS: [f32; 6] = [7.5, 12.0, 1.0, 0.5, 1.5, 1.0];

/// The end-to-end loss of the dual head.
#[derive(Clone, Debug)]
pub struct E2eLoss {
    pub one2many: AssignerConfig,
    pub one2one: AssignerConfig,
    pub gains: [f32; 6],
    /// Weight of the one-to-many loss; the one-to-one loss gets `1 − w`.
    pub one2many_weight: f32,
    pub sigmas: Vec<f32>,
    /// Network input `[H, W]`.
    pub imgsz: [usize; 2],
    anchors: Anchors,
}

/// Targets of both copies for one batch.
#[derive(Clone, Debug, PartialEq)]
pub struct LossTargets {
    pub one2many: BranchTargets,
    pub one2one: BranchTargets,
}

/// A loss value to back-propagate and the logged items.
#[derive(Clone, Debug)]
pub struct LossOutput {
    /// `[1]`: w·L_o2m + (1 − w)·L_o2o, each the gain-weighted sum × batch size.
    pub total: Tensor<1>,
    /// `[6]`: the one-to-one terms × gains (what Ultralytics logs), detached.
    pub items: Tensor<1>,
}

impl E2eLoss {
    pub fn new(task: Task, num_keypoints: usize, imgsz: [usize; 2]) -> Self {
        let pose = task == Task::Pose;
        Self {
            one2many: AssignerConfig::one2many(pose),
            one2one: AssignerConfig::one2one(pose),
            gains: DEFAULT_GAINS,
            one2many_weight: 0.8,
            sigmas: if pose {
                geometry::sigmas(num_keypoints)
            } else {
                Vec::new()
            },
            imgsz,
            anchors: Anchors::new(imgsz[0], imgsz[1]),
        }
    }

    /// ProgLoss: after `epochs_done` of `epochs`, w_o2m = max(1 − u/max(E − 1, 1), 0)·0.7 + 0.1.
    pub fn update(&mut self, epochs_done: usize, epochs: usize) {
        let frac = 1.0 - epochs_done as f32 / (epochs.saturating_sub(1)).max(1) as f32;
        self.one2many_weight = frac.max(0.0) * (0.8 - 0.1) + 0.1;
    }

    /// Assignment of both copies (reads the detached predictions back to the host).
    pub fn targets(&self, out: &HeadOutput, labels: &[Vec<Instance>]) -> LossTargets {
        LossTargets {
            one2many: build_targets(
                &self.one2many,
                &self.anchors,
                &out.one2many,
                labels,
                &self.sigmas,
            ),
            one2one: build_targets(
                &self.one2one,
                &self.anchors,
                &out.one2one,
                labels,
                &self.sigmas,
            ),
        }
    }

    /// The loss for given targets. Both copies' RLE points go through the flow in one pass.
    pub fn compute(
        &self,
        out: &HeadOutput,
        targets: &LossTargets,
        flow: Option<&RealNvp>,
    ) -> LossOutput {
        let parts = |o, t| branch_parts(o, t, flow.is_some(), self.imgsz, &self.sigmas, self.gains);
        let o2m = parts(&out.one2many, &targets.one2many);
        let o2o = parts(&out.one2one, &targets.one2one);
        let mut log_phi = [None, None];
        if let Some(flow) = flow {
            let eps: Vec<(usize, Tensor<2>)> = [&o2m, &o2o]
                .iter()
                .enumerate()
                .filter_map(|(i, p)| p.rle.as_ref().map(|r| (i, r.eps.clone())))
                .collect();
            if !eps.is_empty() {
                let all = flow.log_prob(Tensor::cat(eps.iter().map(|e| e.1.clone()).collect(), 0));
                let mut at = 0;
                for (i, e) in eps {
                    let m = e.dims()[0];
                    log_phi[i] = Some(all.clone().narrow(0, at, m));
                    at += m;
                }
            }
        }
        let [phi_o2m, phi_o2o] = log_phi;
        let (o2m, o2o) = (o2m.finish(phi_o2m), o2o.finish(phi_o2o));
        let b = targets.one2many.batch as f32;
        let w = self.one2many_weight;
        LossOutput {
            total: (o2m.sum * w + o2o.sum * (1.0 - w)) * b,
            items: o2o.items,
        }
    }
}

#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;
