//! Assignment and losses of YOLO26 pose/detect (yolo_spec §3): both head copies, each with its
//! own assigner, combined with the ProgLoss weights.

pub mod anchor_terms;
pub mod assign;
pub mod dense;
pub mod dual;
pub mod geometry;
pub mod targets;
pub mod terms;

use crate::data::Instance;
use crate::model::flow::RealNvp;
use crate::model::{BranchOutput, HeadOutput, Task};
use assign::device::{AnchorTensors, ObjectSlots, assign_batch};
use assign::{Anchors, AssignerConfig};
use burn::prelude::*;
use dense::{KeypointRows, dense_terms};
use std::sync::OnceLock;
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
    /// The device loss's object slots per image, at least (`train.object_slots`).
    pub object_slots: usize,
    anchors: Anchors,
    /// [`E2eLoss::constants`] on the first device asked for, kept so that they are uploaded
    /// once (every eager device-loss step and every recording of the loss read them).
    kept: OnceLock<LossConstants>,
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
    /// Which outputs the loss reaches, where that is decided from values rather than by the
    /// tape ([`E2eLoss::compute_on_device`]: every term is on the tape, and an unreached output
    /// gets zeros where the host path gives it no gradient). `None`: the tape decides.
    pub reached: Option<Reached>,
    /// `items`' values when they were already read back ([`E2eLoss::compute_on_device`] reads
    /// them with its counts, so the step needs no second read). `None`: not read yet.
    pub items_read: Option<[f32; 6]>,
}

/// The constant tensors of the device loss ([`E2eLoss::constants`]): uploaded once, where a
/// recorded loss reads them from fixed buffers.
#[derive(Clone, Debug)]
pub struct LossConstants {
    pub anchors: AnchorTensors,
    /// Pose only.
    pub keypoints: Option<KeypointRows>,
    /// What combines the copies' terms (with the loss's gains).
    pub combine: dense::Combine,
}

/// Which head outputs a loss reached, in [`Reached::of_counts`]' rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reached {
    /// Per copy (one-to-many, then one-to-one): boxes, scores, keypoints, keypoint sigmas.
    pub outputs: [[bool; 4]; 2],
    /// The RLE flow (shared by both copies).
    pub flow: bool,
}

impl Reached {
    /// From each copy's positives and labelled keypoints among them (`[p_o2m, l_o2m, p_o2o,
    /// l_o2o]`), as the host path's tape has it: a copy without positives reaches only its
    /// scores (the class term); without labelled keypoints among them, not its sigmas (the RLE
    /// term is the only reader); the flow is reached when some copy's RLE term is.
    pub fn of_counts(counts: [f32; 4]) -> Self {
        let copy = |i: usize| {
            let (any, labelled) = (counts[2 * i] > 0.0, counts[2 * i + 1] > 0.0);
            [any, true, any, any && labelled]
        };
        let outputs = [copy(0), copy(1)];
        Self {
            outputs,
            flow: outputs[0][3] || outputs[1][3],
        }
    }

    /// The outputs in the order of `replay::stage::flatten_outputs` (pose: four per copy;
    /// detection: two).
    pub fn flat(&self, per_copy: usize) -> Vec<bool> {
        self.outputs
            .iter()
            .flat_map(|o| o[..per_copy].iter().copied())
            .collect()
    }
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
            object_slots: 0,
            anchors: Anchors::new(imgsz[0], imgsz[1]),
            kept: OnceLock::new(),
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

    /// The loss with the assignment and every term on the outputs' device, as tensor operations
    /// of fixed shapes (`train.loss_on = "device"`, the path a recorded step takes:
    /// docs/replay.md): the value of [`E2eLoss::targets`] + [`E2eLoss::compute`] up to the order
    /// of the sums, with autodiff's gradients. Every term is on the tape whatever the batch
    /// holds, so the same operations run on every batch; which outputs the host path's tape
    /// would reach is returned in [`LossOutput::reached`] (one readback of four counts, with the
    /// items: [`LossOutput::items_read`]), and the
    /// caller drops the gradients of the parameters that feed only unreached ones, which are
    /// zeros here (`Trainer::train_step`).
    pub fn compute_on_device(
        &self,
        out: &HeadOutput,
        labels: &[Vec<Instance>],
        flow: Option<&RealNvp>,
    ) -> LossOutput {
        let device = out.one2many.scores.device();
        let objects = ObjectSlots::new(labels, self.object_slots, self.sigmas.len(), &device);
        let weight = Tensor::<1>::from_floats([self.one2many_weight], &device);
        let constants = self.constants(&device);
        let (mut out, counts) = self.dense_loss(out, &objects, &constants, weight, flow);
        // The items with the counts: one read, one sync.
        let v: Vec<f32> = Tensor::cat(vec![out.items.clone(), counts], 0)
            .into_data()
            .convert::<f32>()
            .try_into_vec()
            .expect("f32 items and counts");
        out.items_read = Some([v[0], v[1], v[2], v[3], v[4], v[5]]);
        out.reached = Some(Reached::of_counts([v[6], v[7], v[8], v[9]]));
        out
    }

    /// The constant tensors [`E2eLoss::dense_loss`] reads, on `device`: uploaded on the first
    /// call, then the same tensors (on another device, or for gains changed since, uploaded
    /// anew).
    pub fn constants(&self, device: &Device) -> LossConstants {
        let kept = self.kept.get_or_init(|| self.upload_constants(device));
        if kept.anchors.x.device() == *device && kept.combine.gains_of == self.gains {
            kept.clone()
        } else {
            self.upload_constants(device)
        }
    }

    fn upload_constants(&self, device: &Device) -> LossConstants {
        LossConstants {
            anchors: AnchorTensors::new(&self.anchors, device),
            keypoints: (!self.sigmas.is_empty()).then(|| KeypointRows::new(&self.sigmas, device)),
            combine: dense::Combine::new(self.sigmas.len(), self.gains, device),
        }
    }

    /// [`E2eLoss::compute_on_device`]'s loss, and the four counts of [`Reached::of_counts`] as a
    /// `[4]` tensor, from inputs that may all live in fixed
    /// buffers: the objects, the constants and the one-to-many weight `w` (`[1]`; a value
    /// passed to a kernel would be frozen into a recording). Nothing in it reads from or
    /// uploads to the host.
    pub fn dense_loss(
        &self,
        out: &HeadOutput,
        objects: &ObjectSlots,
        constants: &LossConstants,
        w: Tensor<1>,
        flow: Option<&RealNvp>,
    ) -> (LossOutput, Tensor<1>) {
        let anchors = &constants.anchors;
        let rows = constants.keypoints.as_ref();
        let assign = |cfg: &AssignerConfig, o: &BranchOutput| {
            assign_batch(cfg, anchors, o, objects, &self.sigmas)
        };
        let (asg_o2m, asg_o2o) = (
            assign(&self.one2many, &out.one2many),
            assign(&self.one2one, &out.one2one),
        );
        let copies = dense_terms(
            &[(&out.one2many, &asg_o2m), (&out.one2one, &asg_o2o)],
            objects,
            anchors,
            self.imgsz,
            rows,
            flow,
        );
        let (terms, counts) = constants.combine.terms(&copies);
        let weighed = constants.combine.weighed(terms);
        let batch = out.one2many.scores.dims()[0];
        let out = LossOutput {
            total: constants.combine.total(weighed.clone(), w, batch),
            items: weighed.narrow(0, 1, 1).reshape([6]).detach(),
            reached: None,
            items_read: None,
        };
        (out, counts)
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
            reached: None,
            items_read: None,
        }
    }
}

#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;
