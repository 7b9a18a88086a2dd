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
    /// BatchNorm running statistics into `model`.
    pub fn forward(&mut self, model: &mut Yolo, images: Tensor<4>) -> StageOutputs {
        match self {
            Stage::Native(scope) => {
                let taped = scope.run(model, images);
                StageOutputs {
                    scope: scope.cut(),
                    leaves: taped.iter().map(leaf).collect(),
                    taped: Some(taped),
                }
            }
            #[cfg(feature = "cuda")]
            Stage::Replay(r) => StageOutputs {
                scope: r.scope().cut(),
                leaves: r.forward(model, images),
                taped: None,
            },
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
    /// statistics.
    #[cfg(feature = "cuda")]
    pub fn recorded_loss(
        &mut self,
        model: &mut Yolo,
        features: StageOutputs,
        loss: &crate::loss::E2eLoss,
        labels: &[Vec<crate::data::Instance>],
        scale: Option<f32>,
    ) -> super::loss::PendingLoss {
        let Stage::Replay(r) = self else {
            panic!("the recorded loss needs a replayed stage");
        };
        drop(features);
        r.loss(model, loss, labels, scale)
    }

    /// The network's backward from the seeds [`Stage::recorded_loss`] wrote, then the loss's
    /// items and reach read back (the backward already queued behind the loss on the GPU): the
    /// network's parameter gradients (those feeding only outputs the loss did not reach
    /// dropped, as [`Stage::backward`] drops them), the buffer they are views of, and the
    /// loss.
    #[cfg(feature = "cuda")]
    pub fn recorded_backward(
        &mut self,
        model: &Yolo,
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
        let mut flat = Some(r.backward_in_place());
        let recorded = pending.read();
        let mut out = GradientsParams::new();
        if let Some(f) = &flat {
            f.put_views(&mut out);
        }
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
mod tests {
    use super::*;
    use crate::model::{Scale, Task, YoloConfig};
    use crate::optim::grads::get_flat;

    type Loss = fn(HeadOutput) -> Tensor<1>;

    /// Gradients of one uncut backward and of the stage's cut backward (merged), for `task`.
    fn both(task: Task, scope: Scope, loss: Loss) -> (Yolo, GradientsParams, GradientsParams) {
        let device = Device::flex().autodiff();
        device.seed(3);
        let mut model = YoloConfig::new(Scale::N, task).init(&device);
        let x = Tensor::<4>::random(
            [2, 3, 64, 64],
            burn::tensor::Distribution::Uniform(0.0, 1.0),
            &device,
        );
        let whole = GradientsParams::from_grads(loss(model.forward(x.clone())).backward(), &model);
        let mut stage = Stage::Native(scope);
        let f = stage.forward(&mut model, x);
        let rest = loss(f.head(&model.head)).backward();
        let (below, _) = stage.backward(&model, f, &rest, None);
        let mut cut = GradientsParams::from_grads(rest, &model);
        merge(&mut cut, below, &param_table(&model));
        (model, whole, cut)
    }

    fn every_output(out: HeadOutput) -> Tensor<1> {
        let b = out.one2many;
        let kpts = b
            .kpts
            .map_or(Tensor::zeros([1], &b.scores.device()), |k| k.tanh().sum());
        (b.boxes.powi_scalar(2).sum() + b.scores.sum() + kpts).sum()
    }

    /// The cut changes only summation order: gradients of every parameter equal those of one
    /// uncut backward to float rounding, and the same parameters have one.
    fn assert_cut_matches(task: Task, scope: Scope, loss: Loss, at_least: usize) {
        let (model, whole, cut) = both(task, scope, loss);
        // Per tensor relative to its own size, with a floor at the largest gradient's rounding
        // level for tensors whose gradient nearly cancels (e.g. a beta before another BN).
        let table = param_table(&model);
        let pairs: Vec<_> = table
            .iter()
            .map(|p| (p, get_flat(&whole, p), get_flat(&cut, p)))
            .collect();
        let max = |t: &Tensor<1>| t.clone().abs().max().into_scalar::<f32>();
        let global = pairs
            .iter()
            .filter_map(|(_, a, _)| a.as_ref().map(max))
            .fold(0f32, f32::max);
        let mut compared = 0;
        for (p, a, b) in pairs {
            assert_eq!(a.is_some(), b.is_some(), "{:?} {}", task, p.path);
            let (Some(a), Some(b)) = (a, b) else { continue };
            let scale = max(&a);
            let diff = max(&(a - b));
            assert!(
                diff <= 1e-4 * scale + 1e-6 * global,
                "{}: diff {diff} of {scale} (largest gradient {global})",
                p.path
            );
            compared += 1;
        }
        assert!(compared >= at_least, "only {compared} gradients compared");
    }

    #[test]
    fn cut_at_the_features_equals_one_backward() {
        assert_cut_matches(Task::Pose, Scope::Features, every_output, 200);
    }

    #[test]
    fn cut_at_the_pose_head_outputs_equals_one_backward() {
        assert_cut_matches(Task::Pose, Scope::Network, every_output, 200);
    }

    #[test]
    fn cut_at_the_head_outputs_equals_one_backward() {
        assert_cut_matches(Task::Detect, Scope::Network, every_output, 200);
    }

    /// A loss that never reads the box outputs (a batch without positives) leaves the box
    /// branches without gradient after the cut too, not with zeros.
    #[test]
    fn unreached_head_outputs_leave_their_branches_absent() {
        let scores_only: Loss = |out| out.one2many.scores.sum() + out.one2one.scores.sum();
        assert_cut_matches(Task::Detect, Scope::Network, scores_only, 150);
        let (model, _, cut) = both(Task::Detect, Scope::Network, scores_only);
        let table = param_table(&model);
        let boxes: Vec<_> = table
            .iter()
            .filter(|p| p.path.starts_with("head.one2many.boxes."))
            .collect();
        assert!(!boxes.is_empty());
        assert!(boxes.iter().all(|p| get_flat(&cut, p).is_none()));
    }

    /// A pose loss without keypoint terms (a batch without positives) leaves the point stems and
    /// the keypoint and sigma predictors without gradient when the head is inside the stage; one
    /// read output of the two keeps the stems.
    #[test]
    fn unreached_keypoint_outputs_leave_the_point_stems_absent() {
        let no_kpts: Loss = |out| {
            let b = out.one2many;
            b.boxes.sum() + b.scores.sum() + out.one2one.scores.sum()
        };
        assert_cut_matches(Task::Pose, Scope::Network, no_kpts, 150);
        let (model, _, cut) = both(Task::Pose, Scope::Network, no_kpts);
        let table = param_table(&model);
        let under = |prefix: &str| -> Vec<_> {
            table
                .iter()
                .filter(|p| p.path.starts_with(prefix))
                .collect()
        };
        for prefix in [
            "head.one2many.pose.point_stems.",
            "head.one2many.pose.kpts.",
            "head.one2many.pose.sigma.",
            "head.one2one.",
        ] {
            let dropped = under(prefix);
            assert!(!dropped.is_empty(), "{prefix}");
            let kept = dropped.iter().filter(|p| get_flat(&cut, p).is_some());
            // The one-to-one scores feed its class branches only.
            let want = if prefix == "head.one2one." {
                under("head.one2one.classes.").len()
            } else {
                0
            };
            assert_eq!(kept.count(), want, "{prefix}");
        }
        let sigma_only: Loss = |out| out.one2many.kpts_sigma.unwrap().sum();
        let (model, _, cut) = both(Task::Pose, Scope::Network, sigma_only);
        let table = param_table(&model);
        let stems = |p: &&crate::optim::groups::ParamInfo| {
            p.path.starts_with("head.one2many.pose.point_stems.")
        };
        assert!(
            table
                .iter()
                .filter(stems)
                .all(|p| get_flat(&cut, p).is_some())
        );
    }

    #[test]
    fn head_outputs_survive_the_round_trip() {
        let d = Device::flex();
        let model = YoloConfig::new(Scale::N, Task::Pose).init(&d);
        let x = Tensor::<4>::random([1, 3, 64, 64], burn::tensor::Distribution::Default, &d);
        let out = model.forward(x);
        let back = outputs_of(&flatten_outputs(out.clone()));
        let bits = |t: &Tensor<3>| t.clone().into_data().try_to_vec::<f32>().unwrap();
        for (a, b) in [
            (&out.one2many, &back.one2many),
            (&out.one2one, &back.one2one),
        ] {
            assert_eq!(bits(&a.boxes), bits(&b.boxes));
            assert_eq!(bits(&a.scores), bits(&b.scores));
            assert_eq!(
                bits(a.kpts.as_ref().unwrap()),
                bits(b.kpts.as_ref().unwrap())
            );
            assert_eq!(
                bits(a.kpts_sigma.as_ref().unwrap()),
                bits(b.kpts_sigma.as_ref().unwrap())
            );
        }
        assert_eq!(
            unreached_prefixes(&[false, false, true, false]),
            ["head.one2one.boxes."]
        );
        assert_eq!(
            unreached_prefixes(&[false, false, true, true, false, false, false, false]),
            [
                "head.one2many.pose.kpts.",
                "head.one2many.pose.sigma.",
                "head.one2many.pose.point_stems."
            ]
        );
    }
}
