//! The stage of a training step: the part of the network below the cut (`replay.scope`:
//! backbone + neck, or the whole network, the default for detection) — run natively in Burn
//! autodiff or replayed from CUDA graphs. Both paths cut the autodiff tape at the same tensors,
//! so every gradient is summed in the same order and the two are byte-identical: the rest of the
//! step runs on leaf copies of the stage's outputs, and the stage's backward is a second, seeded
//! backward of `Σ_i sum(o_i ⊙ s_i)` whose seeds `s_i` are the leaves' gradients.

use crate::loss::Reached;
use crate::model::Yolo;
use crate::model::backbone::Features;
use crate::model::head::{BranchOutput, Head, HeadOutput};
use crate::optim::grads::{FlatGrads, take_flat};
use crate::optim::groups::{ParamInfo, param_table};
use crate::optim::layout::Layout;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::Gradients;

use super::tape::{leaf, seeded_root};

#[cfg(feature = "cuda")]
use super::recorder::Recorder;

/// A replayed stage that could not be recorded, with its images ([`Stage::forward`]).
#[cfg(feature = "cuda")]
pub use super::recorder::Unrecorded;

/// Without CUDA nothing is recorded, so no recording fails.
#[cfg(not(feature = "cuda"))]
#[derive(Debug)]
pub enum Unrecorded {}

/// One stage of recording: what it added in use (negative: freed), in how many slices, and
/// the pool's reservation after it.
#[derive(Clone, Copy, Debug)]
pub struct Growth {
    pub what: &'static str,
    pub bytes: i64,
    pub slices: i64,
    pub reserved: u64,
}

/// What the stage computes before the tape is cut (`replay.scope`).
pub use crate::config::Scope;

impl Scope {
    /// Whether the stage computes with the tensor at `path` (the head's flow belongs to the loss).
    pub fn covers(self, path: &str) -> bool {
        path.starts_with("backbone.")
            || path.starts_with("neck.")
            || (self.cut() == Scope::Network
                && (path.starts_with("head.one2many.") || path.starts_with("head.one2one.")))
    }

    /// The stage's outputs on `images`, all 4-D (head outputs `[B, C, A]` as `[B, C, A, 1]`).
    pub fn run(self, model: &Yolo, images: Tensor<4>) -> Vec<Tensor<4>> {
        match self.cut() {
            Scope::Features => model.features(images).into_levels().into(),
            _ => flatten_outputs(model.forward(images)),
        }
    }
}

/// Where the stage of a step runs.
pub enum Stage {
    Native(Scope),
    #[cfg(feature = "cuda")]
    Replay(Box<Recorder>),
}

/// The stage's outputs for one step: leaves for the rest of the step, and what the stage's
/// backward needs.
pub struct StageOutputs {
    /// Where the tape was cut ([`Scope::cut`]).
    scope: Scope,
    /// Leaves sharing the outputs' buffers: P3/P4/P5 (then the one-to-many point stems' outputs
    /// under the `RecordStems` negative control), or the head's outputs.
    pub leaves: Vec<Tensor<4>>,
    /// The stage's own autodiff outputs (native path only; the replay path keeps them inside its
    /// recorded graphs).
    taped: Option<Vec<Tensor<4>>>,
}

impl Stage {
    /// Whether the next forward records (replay not yet recorded): a step that must not run
    /// inside a profiling window.
    pub fn records_next(&self) -> bool {
        match self {
            Stage::Native(_) => false,
            #[cfg(feature = "cuda")]
            Stage::Replay(r) => !r.is_recorded(),
        }
    }

    /// [`Recorder::buffer_bytes`] of a replayed stage; empty for a native one.
    pub fn buffer_bytes(&self) -> Vec<(&'static str, u64)> {
        match self {
            Stage::Native(_) => Vec::new(),
            #[cfg(feature = "cuda")]
            Stage::Replay(r) => r.buffer_bytes(),
        }
    }

    /// [`Recorder::recording`] of a replayed stage; empty for a native one.
    pub fn recording(&self) -> Vec<Growth> {
        match self {
            Stage::Native(_) => Vec::new(),
            #[cfg(feature = "cuda")]
            Stage::Replay(r) => r.recording(),
        }
    }

    /// How many optimizer steps went through the recorded update (`replay.record_update`);
    /// 0 for a native stage.
    pub fn update_replays(&self) -> usize {
        match self {
            Stage::Native(_) => 0,
            #[cfg(feature = "cuda")]
            Stage::Replay(r) => r.update_replays(),
        }
    }

    /// [`Recorder::gradient_copies`] of a replayed stage; `None` for a native one.
    pub fn gradient_copies(&self) -> Option<(usize, usize)> {
        match self {
            Stage::Native(_) => None,
            #[cfg(feature = "cuda")]
            Stage::Replay(r) => r.gradient_copies(),
        }
    }

    /// [`Recorder::statistics_copies`] of a replayed stage; `None` for a native one.
    pub fn statistics_copies(&self) -> Option<(usize, usize)> {
        match self {
            Stage::Native(_) => None,
            #[cfg(feature = "cuda")]
            Stage::Replay(r) => r.statistics_copies(),
        }
    }

    /// The trainer's parameters as the flat optimizer keeps them (`Optimizer::pinned`: its
    /// table, layout and values): a replayed stage not yet recorded reads the stage's
    /// parameters there (`replay.shared_parameters`); nothing for a native one.
    pub fn share_parameters(&mut self, table: &[ParamInfo], layout: &Layout, values: &Tensor<1>) {
        match self {
            Stage::Native(_) => {}
            #[cfg(feature = "cuda")]
            Stage::Replay(r) => r.share_parameters(super::sources::Pinned {
                table: table.to_vec(),
                layout: layout.clone(),
                values: values.clone(),
            }),
        }
        #[cfg(not(feature = "cuda"))]
        let _ = (table, layout, values);
    }

    pub fn is_replay(&self) -> bool {
        !matches!(self, Stage::Native(_))
    }

    /// The stage on `images` (autodiff device). The replay path also writes the updated
    /// BatchNorm running statistics into `model`; where it cannot record the stage it gives
    /// the images back ([`Unrecorded`]) and nothing of the step has run.
    pub fn forward(
        &mut self,
        model: &mut Yolo,
        images: Tensor<4>,
    ) -> Result<StageOutputs, Unrecorded> {
        match self {
            Stage::Native(scope) => {
                let taped = scope.run(model, images);
                Ok(StageOutputs {
                    scope: scope.cut(),
                    leaves: taped.iter().map(leaf).collect(),
                    taped: Some(taped),
                })
            }
            #[cfg(feature = "cuda")]
            Stage::Replay(r) => Ok(StageOutputs {
                scope: r.scope().cut(),
                leaves: r.forward(model, images)?,
                taped: None,
            }),
        }
    }

    /// The stage's parameter gradients, given the backward of the rest of the step (`grads`),
    /// and, from replay, the flat buffer they are views of.
    /// A head output the loss did not reach leaves the parameters that only feed it without a
    /// gradient, as one uncut backward would.
    /// `reached` (from a loss whose tape reaches every output, `train.loss_on = "device"`) marks
    /// more outputs unreached than the tape does.
    pub fn backward(
        &mut self,
        model: &Yolo,
        features: StageOutputs,
        grads: &Gradients,
        reached: Option<&Reached>,
    ) -> (GradientsParams, Option<FlatGrads>) {
        let found: Vec<Option<Tensor<4>>> = features.leaves.iter().map(|l| l.grad(grads)).collect();
        let mut unreached: Vec<bool> = found.iter().map(Option::is_none).collect();
        if let (Scope::Network, Some(r)) = (features.scope, reached) {
            let per = unreached.len() / 2;
            for (u, r) in unreached.iter_mut().zip(r.flat(per)) {
                *u |= !r;
            }
        }
        let seeds = seeds(&features.leaves, found);
        #[cfg(feature = "cuda")]
        let keep_unreached = matches!(self, Stage::Replay(r) if r.control().keeps_unreached());
        #[cfg(not(feature = "cuda"))]
        let keep_unreached = false;
        let (mut out, mut flat): (GradientsParams, Option<FlatGrads>) = match (self, features.taped)
        {
            (Stage::Native(_), Some(taped)) => {
                let root = seeded_root(&taped, &seeds);
                (GradientsParams::from_grads(root.backward(), model), None)
            }
            #[cfg(feature = "cuda")]
            (Stage::Replay(r), None) => {
                let flat = r.backward(seeds);
                let mut out = GradientsParams::new();
                flat.put_views(&mut out);
                (out, Some(flat))
            }
            _ => unreachable!("features come from the stage's own forward"),
        };
        if features.scope == Scope::Network && !keep_unreached {
            drop_branches(&mut out, &mut flat, model, &unreached);
        }
        (out, flat)
    }

    /// `replay.record_update`, replayed: the optimizer step and the EMA update through their
    /// recorded graph; `Err` with the gradients untouched for a native stage or while they do
    /// not write in place yet (the caller runs them eagerly).
    #[cfg(feature = "cuda")]
    pub fn recorded_update(
        &mut self,
        optimizer: &mut crate::optim::Optimizer,
        ema: &mut crate::optim::Ema<Yolo>,
        inputs: super::update::UpdateInputs,
    ) -> Result<crate::optim::optimizer::Stepped, GradientsParams> {
        match self {
            Stage::Native(_) => Err(inputs.grads),
            Stage::Replay(r) => r.update(optimizer, ema, inputs),
        }
    }

    /// Whether the loss is recorded too: replay with `replay.scope = "step"`.
    pub fn records_loss(&self) -> bool {
        match self {
            Stage::Native(_) => false,
            #[cfg(feature = "cuda")]
            Stage::Replay(r) => r.scope() == Scope::Step,
        }
    }

    /// `replay.scope = "step"`, replayed: the recorded loss of `labels` on this step's outputs
    /// (`features`, released first: the loss graph writes its seeds into their buffers), scaled
    /// by `scale` before its backward (FP16's loss scale). Its items and reach stay on the
    /// device until [`Stage::recorded_backward`], which follows, has replayed the backward;
    /// the flow's gradients come with them ([`super::loss::RecordedLoss::flow`]). With
    /// `replay.one_graph` this replays the whole step and updates `model`'s running
    /// statistics, or gives the step back unrun when it cannot be recorded. `walked`: a walk of
    /// `model` whose tensors are still the model's (`replay::update::early`), which one graph
    /// takes its sources from instead of walking the model again.
    #[cfg(feature = "cuda")]
    pub fn recorded_loss(
        &mut self,
        model: &mut Yolo,
        features: StageOutputs,
        loss: &crate::loss::E2eLoss,
        labels: &[Vec<crate::data::Instance>],
        scale: Option<f32>,
        walked: Option<Vec<Tensor<1>>>,
    ) -> Result<super::loss::PendingLoss, super::recorder::Unrecorded> {
        let Stage::Replay(r) = self else {
            panic!("the recorded loss needs a replayed stage");
        };
        drop(features);
        r.loss(model, loss, labels, scale, walked)
    }

    /// The recorder's control (`Control::None` for a native stage).
    #[cfg(feature = "cuda")]
    pub fn control(&self) -> super::control::Control {
        match self {
            Stage::Replay(r) => r.control(),
            Stage::Native(_) => super::control::Control::None,
        }
    }

    /// The network's backward from the seeds [`Stage::recorded_loss`] wrote (a replay of its
    /// own with three graphs, already inside the step's with one): the buffer its parameter
    /// gradients are in.
    #[cfg(feature = "cuda")]
    pub fn recorded_grads(&mut self) -> FlatGrads {
        let Stage::Replay(r) = self else {
            panic!("the recorded loss needs a replayed stage");
        };
        r.backward_in_place()
    }

    /// The loss's items and reach read back (the backward already queued behind the loss on
    /// the GPU), and with them the network's parameter gradients in `flat` (from
    /// [`Stage::recorded_grads`]; those feeding only outputs the loss did not reach dropped, as
    /// [`Stage::backward`] drops them), the buffer they are views of, and the loss.
    #[cfg(feature = "cuda")]
    pub fn recorded_backward(
        &mut self,
        model: &Yolo,
        flat: FlatGrads,
        pending: super::loss::PendingLoss,
    ) -> (
        GradientsParams,
        Option<FlatGrads>,
        super::loss::RecordedLoss,
    ) {
        let Stage::Replay(r) = self else {
            panic!("the recorded loss needs a replayed stage");
        };
        let per = r.outputs_per_copy();
        // The views are made before the wait for the read, while the GPU still runs the step.
        let mut out = GradientsParams::new();
        flat.put_views(&mut out);
        let mut flat = Some(flat);
        let recorded = pending.read();
        let unreached: Vec<bool> = recorded.reached.flat(per).into_iter().map(|r| !r).collect();
        if !r.control().keeps_unreached() {
            drop_branches(&mut out, &mut flat, model, &unreached);
        }
        (out, flat, recorded)
    }
}

/// Drops from the network stage's gradients `out` the head parameters that feed only the
/// `unreached` outputs ([`flatten_outputs`] order), so they stay absent as in one uncut
/// backward; `flat` (the buffer they are views of) is then copied and taken.
fn drop_branches(
    out: &mut GradientsParams,
    flat: &mut Option<FlatGrads>,
    model: &Yolo,
    unreached: &[bool],
) {
    if !unreached.contains(&true) {
        return;
    }
    // Without the flat buffer, nothing tells a later holder that these are views of the
    // recorder's buffer: copy it now (batches without positives only).
    if let Some(f) = flat.take() {
        f.owned(out);
    }
    take_under(out, model, &unreached_prefixes(unreached));
    // `flat` stays taken: its buffer still holds the removed ones.
}

impl StageOutputs {
    /// The head's output on these leaves: the complete head on P3/P4/P5 (and on the given
    /// point-stem outputs, if any), or the recorded head outputs themselves.
    pub fn head(&self, head: &Head) -> HeadOutput {
        match self.scope {
            Scope::Features => {
                let l = &self.leaves;
                let features = Features {
                    p3: l[0].clone(),
                    p4: l[1].clone(),
                    p5: l[2].clone(),
                };
                // The stems' outputs come along only under the `RecordStems` control.
                #[cfg(feature = "controls")]
                if l.len() == 6 {
                    let stems = [l[3].clone(), l[4].clone(), l[5].clone()];
                    return head.forward_with_stems(&features, Some(stems));
                }
                head.forward(&features)
            }
            _ => outputs_of(&self.leaves),
        }
    }
}

/// The fields of a branch copy in output order; `kpts`/`sigma` only for a pose head.
const FIELDS: [&str; 4] = ["boxes.", "classes.", "pose.kpts.", "pose.sigma."];

/// Per copy (one-to-many, then one-to-one): boxes, scores, then keypoints and sigmas if any.
pub fn flatten_outputs(out: HeadOutput) -> Vec<Tensor<4>> {
    let mut v = Vec::new();
    for b in [out.one2many, out.one2one] {
        let fields = [Some(b.boxes), Some(b.scores), b.kpts, b.kpts_sigma];
        v.extend(fields.into_iter().flatten().map(|t| t.unsqueeze_dim(3)));
    }
    v
}

/// The inverse of [`flatten_outputs`].
pub fn outputs_of(leaves: &[Tensor<4>]) -> HeadOutput {
    let flat = |t: &Tensor<4>| {
        let [b, c, a, _] = t.dims();
        t.clone().reshape([b, c, a])
    };
    let per = leaves.len() / 2;
    let copy = |l: &[Tensor<4>]| BranchOutput {
        boxes: flat(&l[0]),
        scores: flat(&l[1]),
        kpts: (per == 4).then(|| flat(&l[2])),
        kpts_sigma: (per == 4).then(|| flat(&l[3])),
    };
    HeadOutput {
        one2many: copy(&leaves[..per]),
        one2one: copy(&leaves[per..]),
    }
}

/// Removes from `grads` the head parameters that feed only outputs the loss did not reach, and
/// the flow's where its term was not reached (`reached`, from a loss whose tape reaches every
/// output: `train.loss_on = "device"`). Their gradients are zeros there; the host path's tape
/// gives them none, so the optimizer leaves them as they are.
pub fn drop_unreached(grads: &mut GradientsParams, model: &Yolo, reached: &Reached) {
    let per = if model.head.flow.is_some() { 4 } else { 2 };
    let unreached: Vec<bool> = reached.flat(per).into_iter().map(|r| !r).collect();
    let mut prefixes = unreached_prefixes(&unreached);
    if !reached.flow {
        prefixes.push("head.flow.".into());
    }
    take_under(grads, model, &prefixes);
}

/// Removes from `grads` every parameter of `model` whose path starts with one of `prefixes`
/// (none: nothing to look up, the common case of a batch with positives).
fn take_under(grads: &mut GradientsParams, model: &Yolo, prefixes: &[String]) {
    if prefixes.is_empty() {
        return;
    }
    for p in param_table(model) {
        if prefixes.iter().any(|x| p.path.starts_with(x.as_str())) {
            take_flat(grads, &p);
        }
    }
}

/// Path prefixes of the head parameters that feed only unreached outputs (`unreached` in
/// [`flatten_outputs`] order); the point stems feed both keypoints and sigmas.
fn unreached_prefixes(unreached: &[bool]) -> Vec<String> {
    let per = unreached.len() / 2;
    let mut out = Vec::new();
    for (c, copy) in ["one2many", "one2one"].iter().enumerate() {
        let u = &unreached[c * per..(c + 1) * per];
        for (i, field) in FIELDS.iter().take(per).enumerate() {
            if u[i] {
                out.push(format!("head.{copy}.{field}"));
            }
        }
        if per == 4 && u[2] && u[3] {
            out.push(format!("head.{copy}.pose.point_stems."));
        }
    }
    out
}

/// The gradient `found` at each leaf, zeros where the loss did not reach, on the inner device.
fn seeds(leaves: &[Tensor<4>], found: Vec<Option<Tensor<4>>>) -> Vec<Tensor<4>> {
    leaves
        .iter()
        .zip(found)
        .map(|(l, g)| g.unwrap_or_else(|| Tensor::zeros(l.dims(), &l.device().inner())))
        .collect()
}

/// Moves every gradient of `from` into `into` (the two cover different parameters).
pub fn merge(
    into: &mut GradientsParams,
    mut from: GradientsParams,
    table: &[crate::optim::groups::ParamInfo],
) {
    use crate::optim::grads::{put_flat, take_flat};
    for p in table {
        if let Some(g) = take_flat(&mut from, p) {
            put_flat(into, p, g);
        }
    }
}

#[cfg(test)]
#[path = "stage_tests.rs"]
mod tests;
