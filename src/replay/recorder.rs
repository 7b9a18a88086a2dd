//! `Recorder`: the stage below the cut — backbone + neck of the pose model, the whole detection
//! network ([`Scope`]) — recorded into two CUDA graphs on the first training step and replayed on
//! every later one (docs/replay.md; how it records: `record`). With `replay.scope = "step"` the
//! device loss is recorded too, as a third graph between them (`loss`) or, with
//! `replay.one_graph`, with the forward and backward in one; with `replay.record_update` the
//! optimizer step and the EMA update are one more graph (`update`).
//!
//! The graphs run on a private copy of the stage whose tensors are static buffers.
//! Before each forward replay the trainer's current parameters and BatchNorm running statistics
//! are copied into them, so the graph always sees the new weights, and warm-up or recording runs
//! never touch the trainer's state (`sources`: after a flat optimizer step the parameters go in
//! one copy); after it the updated running statistics are copied back.
//! A tensor the trainer still holds from the previous replay is not copied again: between
//! optimizer steps the parameters do not change, and the forward graph itself writes the new
//! running statistics into the buffers it reads next. The forward graph gathers the new running
//! statistics, and the backward graph the stage's gradients, into one flat buffer each. The
//! statistics are copied out with one launch and handed back as views; the gradients are handed
//! back as views of the recorder's own buffer, which a holder past the next backward copies
//! ([`FlatGrads::copy`]). The features stage's seeds share that buffer: the recorded backward
//! reads them first and gathers the gradients last.

pub use super::control::Control;
use super::copy::{bytes_of, copy_of, cube, write};
use super::loss::{LossGraph, LossInputs, PendingLoss};
pub use super::record::choose_warm_up_as_captured;
use super::record::{is_recorded, record};
use super::sources::{Pinned, Sources};
use super::stage::Growth;
use super::tape::leaf;
use crate::config::Scope;
use crate::data::Instance;
use crate::loss::E2eLoss;
use crate::loss::assign::device::ObjectSlots;
use crate::model::Yolo;
use crate::model::precision::compute_dtype;
use crate::optim::grads::FlatGrads;
use crate::optim::groups::ParamInfo;
use crate::optim::layout::Layout;
use crate::optim::tensors::{float_tensors, replace_float_tensors};
use crate::train::spans::{self, Span};
use burn::backend::{Backend, Dispatch};
use burn::prelude::*;
use burn::tensor::FloatDType;
use std::collections::HashMap;

mod one_graph;

pub(super) type Graph = burn::backend::BackendGraph<Dispatch>;

/// Why recording failed. A stage (split graphs) or a one-graph step that cannot be recorded
/// runs natively ([`Unrecorded`]), a one-graph window refused for room
/// ([`RecordError::wants_room`]) first being recorded again; the loss graph of split graphs,
/// recorded once the forward graph has run, panics naming it.
#[derive(Debug, thiserror::Error)]
#[error("feature replay: {0}")]
pub struct RecordError(pub String);

impl RecordError {
    /// Whether the recording was refused for room: an allocation inside the capture window
    /// found no room in the pages held, where no page may be added. CubeCL reports it as text
    /// only (its `IoError::PageUpdateForbidden`, formatted into Burn's `ExecutionError`).
    pub fn wants_room(&self) -> bool {
        self.0.contains("no page may be added")
    }

    /// A recording the `RefuseRecording*` controls refuse.
    fn refused_by_control() -> Self {
        RecordError("a recording refused by the control".into())
    }
}

/// A stage or one-graph step the recorder could not record, and its images, which nothing has
/// read yet:
/// the trainer runs this step and the rest of the fit natively (byte-identical by parity), with
/// `error` as the logged reason.
#[derive(Debug)]
pub struct Unrecorded {
    pub error: RecordError,
    pub images: Box<Tensor<4>>,
}

pub struct Recorder {
    device: Device,
    scope: Scope,
    state: Option<Recorded>,
    control: Control,
    loss_recordings: usize,
    /// One graph: recordings refused for room and made again ([`Recorder::room_retries`]).
    room_retries: usize,
    /// The optimizer's values for the recording to read in place
    /// ([`Recorder::share_parameters`]).
    pinned: Option<Pinned>,
    /// `replay.one_graph`: the forward, the loss and the backward recorded as one graph, by
    /// [`Recorder::loss`], which has the labels.
    one_graph: bool,
    /// One graph: this step's images, written into the input by [`Recorder::loss`], and the
    /// autocast dtype the trainer's forward runs under.
    images: Option<Tensor<4>>,
    dtype: Option<FloatDType>,
    /// `replay.record_update`: the optimizer step and the EMA update as one more graph, and
    /// how many updates went through it.
    update: Option<super::update::UpdateGraph>,
    /// Where the EMA's tensors fall among the model's ([`super::update::update`]).
    ema_index: crate::optim::tensors::FloatIndex,
    update_replays: usize,
    /// One-graph steps whose sources came from an earlier walk ([`Recorder::walks_taken`]).
    walks_taken: usize,
}

/// The recorded graphs.
pub(super) enum Graphs {
    /// The stage's forward and backward apart, and (`replay.scope = "step"`) the loss between
    /// them, recorded on the first [`Recorder::loss`].
    Split {
        forward: Graph,
        backward: Graph,
        /// The stage's outputs ([`Scope::run`], then the point stems' outputs under
        /// `RecordStems`) where the forward graph writes them.
        outputs: Vec<Tensor<4>>,
        /// The backward's seed buffers. `None`: the outputs' buffers take the seeds
        /// ([`Scope::Network`]: the head's outputs, which nothing in the recorded backward reads
        /// back, and which the head's backward is done with when the seeds are written). The
        /// features stage keeps its own, views of `pool`: its outputs are also inputs of later
        /// neck layers, whose weight gradients read them.
        seeds: Option<Vec<Tensor<4>>>,
        loss: Option<Box<LossGraph>>,
    },
    /// `replay.one_graph`: forward, device loss and backward in one graph; the outputs and
    /// seeds are its temporaries.
    One { step: Graph, loss: Box<LossInputs> },
}

/// Everything the graphs read or write, kept alive for as long as they exist.
pub(super) struct Recorded {
    pub(super) graphs: Graphs,
    /// How many outputs each head copy has among the stage's (both copies' come in order).
    pub(super) per_copy: usize,
    /// The private copy of the network, kept only for the `SkipRollback` control, which reads
    /// its statistics after recording. Otherwise dropped: the graphs' buffers are all held
    /// below, and the copy's unrecorded part (the head) shares the trainer's tensors of the
    /// recording step, which would stay allocated after the optimizer replaced them.
    pub(super) net: Option<Yolo>,
    pub(super) input: Tensor<4>,
    /// The static buffers of every parameter and running statistic the recorded forward reads.
    pub(super) sources: Sources,
    /// `(index in sources, buffer)` of the running statistics the recorded forward writes.
    pub(super) updated: Vec<(usize, Tensor<1>)>,
    /// Where each of `updated` sits in `stats_flat`, the buffer the recorded forward gathers
    /// them in.
    pub(super) stats_layout: Layout,
    pub(super) stats_flat: Tensor<1>,
    /// Whether `stats_flat` is the statistics' static buffers themselves
    /// (`model::ops::stats_into`), which the forward updates in place.
    pub(super) stats_laid_out: bool,
    /// `(copies, statistics or runs)` by the recorded forward into the statistics' static
    /// buffers: one per statistic when gathered and copied, none when updated in place.
    pub(super) stats_copied: (usize, usize),
    /// The buffer behind `grad_flat` and (features stage) the seeds: the recorded backward
    /// reads every seed before its first gradient and gathers the gradients at its end, so one
    /// buffer serves both.
    pub(super) pool: Tensor<1>,
    /// The pool's use before recording and after each of its stages ([`Recorder::recording`]).
    pub(super) growth: Vec<(&'static str, PoolUse)>,
    /// The stage's parameters with a gradient, in the order of `grad_layout`.
    pub(super) grad_params: Vec<ParamInfo>,
    /// Where each gradient sits in `grad_flat`, the buffer the recorded backward gathers them in.
    pub(super) grad_layout: Layout,
    /// A view of `pool`'s first `grad_layout.len` values.
    pub(super) grad_flat: Tensor<1>,
    /// `(runs copied, runs in all)` by the recorded backward's gather into `grad_flat`: the runs
    /// not copied were written in place (`model::ops::grads_into`).
    pub(super) gathered: (usize, usize),
}

/// What the memory pool holds in use (bytes, and the slices they are in) and has reserved.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct PoolUse {
    bytes: u64,
    slices: u64,
    reserved: u64,
}

/// The memory pool's use on `device` (zeros where it has no pool).
pub(super) fn pool_use(device: &Device) -> PoolUse {
    device
        .memory_pool_usage()
        .map_or(PoolUse::default(), |u| PoolUse {
            bytes: u.bytes_in_use,
            slices: u.number_allocs,
            reserved: u.bytes_reserved,
        })
}

pub(super) fn is_running_stat(path: &str) -> bool {
    path.ends_with("running_mean") || path.ends_with("running_var")
}

impl Recorder {
    /// A recorder of `scope` for `device` (the autodiff CUDA device); it records on the first
    /// forward.
    pub fn new(device: &Device, scope: Scope) -> Self {
        Self::build(device, scope, Control::None)
    }

    /// A recorder with a negative control switched on (feature `controls`: tests only).
    #[cfg(feature = "controls")]
    pub fn with_control(device: &Device, scope: Scope, control: Control) -> Self {
        Self::build(device, scope, control)
    }

    fn build(device: &Device, scope: Scope, control: Control) -> Self {
        Self {
            device: device.clone(),
            scope,
            state: None,
            control,
            loss_recordings: 0,
            room_retries: 0,
            pinned: None,
            one_graph: false,
            images: None,
            dtype: None,
            update: None,
            ema_index: Default::default(),
            update_replays: 0,
            walks_taken: 0,
        }
    }

    /// `replay.one_graph`: the forward, the loss and the backward as one graph, recorded by the
    /// first [`Recorder::loss`] (`replay.scope = "step"` only, which the config checks).
    pub fn with_one_graph(mut self, one_graph: bool) -> Self {
        assert!(
            !one_graph || self.scope == Scope::Step,
            "one graph records the step scope"
        );
        self.one_graph = one_graph;
        self
    }

    /// The trainer's parameters where the flat optimizer keeps them (`Optimizer::pin`): the
    /// recording reads the stage's parameters there instead of from private copies
    /// (`replay.shared_parameters`). Only before the first forward; the `StaleSources`
    /// control keeps its copies, which it tests.
    pub(crate) fn share_parameters(&mut self, pinned: Pinned) {
        if self.state.is_none() && !self.control.stale_sources() {
            self.pinned = Some(pinned);
        }
    }

    pub fn is_recorded(&self) -> bool {
        self.state.is_some()
    }

    pub fn scope(&self) -> Scope {
        self.scope
    }

    pub fn control(&self) -> Control {
        self.control
    }

    /// Whether the forward, the loss and the backward are one graph (`replay.one_graph`).
    pub fn one_graph(&self) -> bool {
        self.one_graph
    }

    /// Bytes of the buffers the recorded graphs read and write beside the stage's activations,
    /// by kind (nothing before the first recording).
    pub fn buffer_bytes(&self) -> Vec<(&'static str, u64)> {
        let Some(r) = &self.state else {
            return Vec::new();
        };
        let sum = |ts: &[Tensor<4>]| ts.iter().map(bytes_of).sum();
        let mut out = vec![
            ("parameters and statistics", r.sources.bytes()),
            ("input", bytes_of(&r.input)),
        ];
        match &r.graphs {
            Graphs::Split { outputs, seeds, .. } => {
                out.push(("outputs", sum(outputs)));
                let pool = match seeds {
                    Some(_) => "seeds and gradients (one buffer)",
                    None => "gradients",
                };
                out.push((pool, bytes_of(&r.pool)));
            }
            Graphs::One { .. } => out.push(("gradients", bytes_of(&r.pool))),
        }
        // Laid out, the statistics' buffer is their static buffers, counted above.
        if !r.stats_laid_out {
            out.push(("statistics out", bytes_of(&r.stats_flat)));
        }
        out
    }

    /// Bytes and slices in use before recording, then what each stage of recording added, by
    /// stage, the loss graph's last where one is recorded apart; nothing before the first
    /// recording. The slices tell a few tensors from many small buffers (e.g. launch metadata
    /// a graph pins); the reservation after each stage tells where the pool grew.
    pub fn recording(&self) -> Vec<Growth> {
        let Some(r) = &self.state else {
            return Vec::new();
        };
        let delta = |what, last: &PoolUse, now: &PoolUse| Growth {
            what,
            bytes: now.bytes as i64 - last.bytes as i64,
            slices: now.slices as i64 - last.slices as i64,
            reserved: now.reserved,
        };
        let mut last = PoolUse::default();
        let mut out: Vec<Growth> = r
            .growth
            .iter()
            .map(|(what, now)| {
                let step = delta(*what, &last, now);
                last = *now;
                step
            })
            .collect();
        if let Graphs::Split { loss: Some(l), .. } = &r.graphs {
            out.push(delta("loss graph", &l.growth[0], &l.growth[1]));
        }
        out
    }

    /// Replays the forward graph on `images` (recording it first on the first call) and returns
    /// the stage's outputs as leaves; the trainer's BatchNorm running statistics are updated in
    /// `model`. With one graph it only keeps `images` (and the autocast dtype in effect) for
    /// [`Recorder::loss`], which runs the whole step, and returns no leaves.
    /// A stage that cannot be recorded comes back with its images ([`Unrecorded`]): the
    /// recording ran on a private copy, so nothing of the step has run and the trainer's model
    /// is as it was; the recorder is left without a graph.
    pub fn forward(
        &mut self,
        model: &mut Yolo,
        images: Tensor<4>,
    ) -> Result<Vec<Tensor<4>>, Unrecorded> {
        if self.one_graph {
            self.images = Some(images);
            self.dtype = compute_dtype();
            return Ok(Vec::new());
        }
        if self.state.is_none() {
            let recorded = if self.control.refuses_recording() {
                Err(RecordError::refused_by_control())
            } else {
                record(
                    model,
                    images.clone(),
                    self.pinned.take().as_ref(),
                    &self.device,
                    self.scope,
                    self.control,
                )
            };
            match recorded {
                Ok(r) => self.state = Some(r),
                Err(error) => return Err(self.unrecorded(error, images)),
            }
            self.skip_rollback(model);
        }
        let r = self.state.as_mut().expect("recorded");
        r.sources.refresh(model, self.control.stale_sources(), None);
        write(images, &r.input);
        let Graphs::Split {
            forward, outputs, ..
        } = &r.graphs
        else {
            unreachable!("split graphs")
        };
        replay(&self.device, forward);
        let leaves = outputs.iter().map(leaf).collect();
        r.statistics_into(model);
        Ok(leaves)
    }

    /// A recording that failed, with the images of the step it was for. A refused window's
    /// launch metadata stays cached though its uploads never ran (CubeCL 0.11.3's
    /// `capture_discard`): a later eager launch with the same metadata would read garbage, so
    /// the cleanup drops every cached buffer no live graph pins before anything runs eagerly
    /// (docs/replay.md, "One window").
    fn unrecorded(&self, error: RecordError, images: Tensor<4>) -> Unrecorded {
        self.forget_refused_windows();
        let images = Box::new(images);
        Unrecorded { error, images }
    }

    /// See [`Recorder::unrecorded`]: what refused windows left cached, dropped.
    fn forget_refused_windows(&self) {
        self.device.memory_cleanup();
    }

    /// The `SkipRollback` control, right after recording: the private copy's BatchNorm
    /// statistics, as the warm-ups and the recording left them, handed to the trainer.
    fn skip_rollback(&self, model: &mut Yolo) {
        if !self.control.skips_rollback() {
            return;
        }
        let r = self.state.as_ref().expect("recorded");
        let net = r.net.as_ref().expect("kept for this control");
        let mut advanced: HashMap<String, Tensor<1>> = float_tensors(&net.valid())
            .into_iter()
            .filter(|(p, _)| is_running_stat(p) && is_recorded(p, self.scope, self.control))
            .map(|(p, t)| (p, copy_of(t)))
            .collect();
        *model = replace_float_tensors(model.clone(), &mut advanced).0;
    }

    /// Replays the backward graph with the gradients at the stage's outputs (`seeds`) and returns
    /// the stage's parameter gradients: views of the recorder's buffer, valid until the next
    /// backward ([`FlatGrads::copy`]).
    pub fn backward(&mut self, seeds: Vec<Tensor<4>>) -> FlatGrads {
        let r = self.state.as_ref().expect("forward before backward");
        let Graphs::Split {
            outputs,
            seeds: own,
            ..
        } = &r.graphs
        else {
            panic!("one graph takes no seeds: its loss writes them")
        };
        let buffers = own.as_ref().unwrap_or(outputs);
        assert_eq!(seeds.len(), buffers.len(), "one seed per recorded output");
        for (s, buffer) in seeds.into_iter().zip(buffers) {
            write(s, buffer);
        }
        self.backward_in_place()
    }

    /// How many outputs each head copy has among the stage's (both copies' come in order).
    pub fn outputs_per_copy(&self) -> usize {
        self.state.as_ref().map_or(0, |r| r.per_copy)
    }

    /// [`Recorder::backward`] with the seeds already in their buffers (the recorded loss wrote
    /// them); with one graph, the gradients its last replay wrote.
    pub fn backward_in_place(&mut self) -> FlatGrads {
        let r = self.state.as_ref().expect("forward before backward");
        if let Graphs::Split { backward, .. } = &r.graphs {
            replay(&self.device, backward);
        }
        FlatGrads {
            params: r.grad_params.clone(),
            layout: r.grad_layout.clone(),
            buf: r.grad_flat.clone(),
            copy: Some(copy_of::<1>),
        }
    }

    /// `replay.scope = "step"`: the recorded loss of `labels` with the trainer's flow (in
    /// `model`) and (FP16) loss scale `scale`. Split graphs: on the outputs the last forward
    /// replay wrote, leaving the outputs' gradients in their buffers for
    /// [`Recorder::backward_in_place`]. One graph: the whole step on the images of the last
    /// [`Recorder::forward`], the trainer's BatchNorm running statistics updated in `model`.
    /// Recorded on the first call, and again (said on stderr) when a batch needs other shapes
    /// (another count of object slots). `Err` only with one graph, when the step could not be
    /// recorded (nothing of it has run then); split graphs panic on a failed recording.
    /// `walked`: a walk of `model` whose tensors are still the model's, taken by one graph for
    /// its sources unless this call records (a recording's control may replace the model's
    /// tensors).
    pub fn loss(
        &mut self,
        model: &mut Yolo,
        loss: &E2eLoss,
        labels: &[Vec<Instance>],
        scale: Option<f32>,
        walked: Option<Vec<Tensor<1>>>,
    ) -> Result<PendingLoss, Unrecorded> {
        if self.one_graph {
            return self.step(model, loss, labels, scale, walked);
        }
        // Split graphs brought their sources up to date in the forward.
        drop(walked);
        let flow = model.head.flow.as_ref();
        let (weight, replay_scale) = self.loss_values(loss, scale);
        let r = self.state.as_mut().expect("forward before the loss");
        let Graphs::Split {
            outputs, loss: g, ..
        } = &mut r.graphs
        else {
            unreachable!("split graphs")
        };
        if !g
            .as_ref()
            .is_some_and(|g| g.fits(labels, loss.object_slots))
        {
            if g.take().is_some() {
                say_recording_again(labels, loss.object_slots);
            }
            let recorded = LossGraph::record(loss, outputs, labels, flow, scale, &self.device)
                .unwrap_or_else(|e| panic!("{e}"));
            self.loss_recordings += 1;
            *g = Some(Box::new(recorded));
        }
        let g = g.as_mut().expect("recorded");
        Ok(g.replay(labels, weight, replay_scale, flow, &self.device))
    }

    /// The ProgLoss weight and the loss scale to write before a replay of the loss (`None`:
    /// leave the recorded one; only the `FrozenLossWeight` and `FrozenLossScale` controls).
    fn loss_values(&self, loss: &E2eLoss, scale: Option<f32>) -> (Option<f32>, Option<f32>) {
        let weight = (!self.control.freezes_loss_weight()).then_some(loss.one2many_weight);
        (weight, scale.filter(|_| !self.control.freezes_loss_scale()))
    }

    /// `replay.record_update`: the optimizer step and the EMA update through their recorded
    /// graph ([`super::update::update`]), or `Err` with the gradients when they do not write in
    /// place yet (the caller runs them eagerly).
    pub fn update(
        &mut self,
        optimizer: &mut crate::optim::Optimizer,
        ema: &mut crate::optim::Ema<Yolo>,
        inputs: super::update::UpdateInputs,
    ) -> Result<crate::optim::optimizer::Stepped, burn::optim::GradientsParams> {
        let stepped = super::update::update(
            &mut self.update,
            &mut self.ema_index,
            self.control,
            optimizer,
            ema,
            inputs,
        )?;
        self.update_replays += 1;
        Ok(stepped)
    }

    /// How many optimizer steps went through the recorded update ([`Recorder::update`]).
    pub fn update_replays(&self) -> usize {
        self.update_replays
    }

    /// How many one-graph steps took their sources from a walk made during the step before
    /// (`replay::update::early`) instead of walking the model.
    pub fn walks_taken(&self) -> usize {
        self.walks_taken
    }

    /// `(runs copied, runs in all)` by the recorded gather of the parameters' gradients;
    /// `None` before recording.
    pub fn gradient_copies(&self) -> Option<(usize, usize)> {
        self.state.as_ref().map(|r| r.gathered)
    }

    /// `(copies, statistics or runs)` by the recorded forward into the buffers the next replay
    /// reads the running statistics from; `None` before recording.
    pub fn statistics_copies(&self) -> Option<(usize, usize)> {
        self.state.as_ref().map(|r| r.stats_copied)
    }

    /// How many times the loss was recorded ([`Recorder::loss`]; with one graph, the step).
    pub fn loss_recordings(&self) -> usize {
        self.loss_recordings
    }

    /// How many of those recordings (one graph) were refused for room inside the window and
    /// made again after one more warm-up (docs/replay.md, "One window").
    pub fn room_retries(&self) -> usize {
        self.room_retries
    }
}

impl Recorded {
    /// After a replay of the forward: the running statistics it wrote, copied out with one
    /// launch and handed to `model` as views of the copy.
    fn statistics_into(&mut self, model: &mut Yolo) {
        let flat = copy_of(self.stats_flat.clone());
        let mut stats: HashMap<String, Tensor<1>> = HashMap::new();
        for (k, (i, _)) in self.updated.iter().enumerate() {
            let view = self.stats_layout.view(&flat, k);
            // The graph has written the same values into the source buffer.
            self.sources.written[*i] = Some(cube(view.clone()));
            stats.insert(self.sources.buffers[*i].0.clone(), Tensor::from_inner(view));
        }
        let (updated, missing) = spans::time(Span::StatisticsReplace, || {
            replace_float_tensors(model.clone(), &mut stats)
        });
        assert!(
            missing.is_empty(),
            "running statistics not in the model: {missing:?}"
        );
        *model = updated;
    }
}

/// Says on stderr that a batch needs another count of object slots than the recording's.
fn say_recording_again(labels: &[Vec<Instance>], min_slots: usize) {
    let slots = ObjectSlots::slots_for(labels, min_slots);
    eprintln!(
        "step replay: recording the loss again for {slots} object slots per image \
         (train.object_slots = {slots} or more records it once)",
    );
}

pub(super) fn replay(device: &Device, graph: &Graph) {
    let inner = device.clone().inner();
    // Safety: every buffer the graphs touch is owned by `Recorded` and lives as long as the
    // graphs; refreshes and reads are issued from this (the capturing) thread.
    unsafe { Dispatch::graph_replay(inner.as_dispatch(), graph) }
        .unwrap_or_else(|e| panic!("feature replay: graph replay failed: {e:?}"));
}
