//! Assignment and losses of YOLO26 pose/detect (yolo_spec §3): both head copies, each with its
//! own assigner, combined with the ProgLoss weights.

pub mod assign;
pub mod geometry;
pub mod targets;
pub mod terms;

use crate::data::Instance;
use crate::model::flow::RealNvp;
use crate::model::{HeadOutput, Task};
use crate::optim::reduce::sum_all;
use assign::{Anchors, AssignerConfig};
use burn::prelude::*;
use targets::{BranchTargets, build_targets};
use terms::branch_terms;

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

    /// The loss for given targets.
    pub fn compute(
        &self,
        out: &HeadOutput,
        targets: &LossTargets,
        flow: Option<&RealNvp>,
    ) -> LossOutput {
        let weighted = |terms: [Tensor<1>; 6], batch: usize| {
            let parts: Vec<Tensor<1>> = terms
                .into_iter()
                .zip(self.gains)
                .map(|(t, g)| t * g)
                .collect();
            let vector = Tensor::cat(parts, 0);
            (sum_all(vector.clone()) * batch as f32, vector)
        };
        let b = targets.one2many.batch;
        let (o2m, _) = weighted(
            branch_terms(
                &out.one2many,
                &targets.one2many,
                flow,
                self.imgsz,
                &self.sigmas,
            ),
            b,
        );
        let (o2o, items) = weighted(
            branch_terms(
                &out.one2one,
                &targets.one2one,
                flow,
                self.imgsz,
                &self.sigmas,
            ),
            b,
        );
        let w = self.one2many_weight;
        LossOutput {
            total: o2m * w + o2o * (1.0 - w),
            items: items.detach(),
        }
    }
}

#[cfg(test)]
mod tests;
