//! `Recorder`: the stage below the cut — backbone + neck of the pose model, the whole detection
//! network ([`Scope`]) — recorded into two CUDA graphs on the first training step and replayed on
//! every later one (docs/replay.md).
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
use super::copy::{copy_into, duplicate};
use super::loss::{LossGraph, PendingLoss};
use super::sources::{Pinned, Sources, private_copies};
use super::stage::Growth;
use super::tape::{leaf, seeded_root};
use crate::config::Scope;
use crate::data::Instance;
use crate::loss::E2eLoss;
use crate::loss::assign::device::ObjectSlots;
use crate::model::Yolo;
use crate::model::flow::RealNvp;
use crate::model::ops::{from_cube, segment};
use crate::optim::grads::{FlatGrads, get_flat};
use crate::optim::groups::{ParamInfo, param_table};
use crate::optim::layout::{Layout, f32_of};
use crate::optim::tensors::{float_tensors, replace_float_tensors};
use burn::backend::{Backend, BackendTensor, Dispatch, DispatchTensorKind};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use std::collections::HashMap;

pub(super) type Graph = burn::backend::BackendGraph<Dispatch>;

/// Eager forward + seeded backward runs before each recording: they settle every allocation the
/// recorded launches will reuse (docs/replay.md, "Recording").
const WARMUPS: usize = 3;

/// Why recording failed; the trainer then stays native and says so.
#[derive(Debug, thiserror::Error)]
#[error("feature replay: {0}")]
pub struct RecordError(pub String);

pub struct Recorder {
    device: Device,
    scope: Scope,
    state: Option<Recorded>,
    control: Control,
    loss_recordings: usize,
    /// The optimizer's values for the recording to read in place
    /// ([`Recorder::share_parameters`]).
    pinned: Option<Pinned>,
}

/// Everything the two graphs read or write, kept alive for as long as they exist.
struct Recorded {
    forward: Graph,
    backward: Graph,
    /// The private copy of the network, kept only for the `SkipRollback` control, which reads
    /// its statistics after recording. Otherwise dropped: the graphs' buffers are all held
    /// below, and the copy's unrecorded part (the head) shares the trainer's tensors of the
    /// recording step, which would stay allocated after the optimizer replaced them.
    net: Option<Yolo>,
    input: Tensor<4>,
    /// The static buffers of every parameter and running statistic the recorded forward reads.
    sources: Sources,
    /// `(index in sources, buffer)` of the running statistics the recorded forward writes.
    updated: Vec<(usize, Tensor<1>)>,
    /// Where each of `updated` sits in `stats_flat`, the buffer the recorded forward gathers
    /// them in.
    stats_layout: Layout,
    stats_flat: Tensor<1>,
    /// The stage's outputs ([`Scope::run`], then the point stems' outputs under `RecordStems`)
    /// and the backward's seed buffers. `None`: the outputs' buffers take the seeds
    /// ([`Scope::Network`]: the head's outputs, which nothing in the recorded backward reads
    /// back, and which the head's backward is done with when the seeds are written). The
    /// features stage keeps its own, views of `pool`: its outputs are also inputs of later neck
    /// layers, whose weight gradients read them.
    outputs: Vec<Tensor<4>>,
    seeds: Option<Vec<Tensor<4>>>,
    /// The buffer behind the seeds (features stage) and `grad_flat`: the recorded backward
    /// reads every seed before its first gradient and gathers the gradients at its end, so one
    /// buffer serves both.
    pool: Tensor<1>,
    /// The pool's use before recording and after each of its stages ([`Recorder::recording`]).
    growth: Vec<(&'static str, PoolUse)>,
    /// The stage's parameters with a gradient, in the order of `grad_layout`.
    grad_params: Vec<ParamInfo>,
    /// Where each gradient sits in `grad_flat`, the buffer the recorded backward gathers them in.
    grad_layout: Layout,
    /// A view of `pool`'s first `grad_layout.len` values.
    grad_flat: Tensor<1>,
    /// The recorded loss (`replay.scope = "step"`), recorded on the first [`Recorder::loss`].
    loss: Option<LossGraph>,
}

/// The CUDA float tensor inside `t` (panics on any other device: callers hold CUDA tensors).
pub(crate) fn cube<const D: usize>(t: Tensor<D>) -> CubeTensor {
    match t.inner().into_dispatch().kind {
        DispatchTensorKind::Cube(BackendTensor::Float(c)) => c,
        _ => panic!("expected a CUDA float tensor"),
    }
}

pub(super) fn write<const D: usize>(src: Tensor<D>, dst: &Tensor<D>) {
    copy_into(cube(src), &cube(dst.clone()));
}

pub(super) fn copy_of<const D: usize>(t: Tensor<D>) -> Tensor<D> {
    from_cube(duplicate(cube(t)))
}

pub(super) fn bytes_of<const D: usize>(t: &Tensor<D>) -> u64 {
    (t.shape().num_elements() * t.dtype().size()) as u64
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

/// `parts` (FP32 or not) written into their segments of `dst` (a `[layout.len]` buffer) by
/// our copy kernel, which allocates nothing: the padding between segments keeps what it held.
pub(super) fn gather_into(layout: &Layout, parts: Vec<Tensor<1>>, dst: &Tensor<1>) {
    for (i, part) in parts.into_iter().enumerate() {
        write(f32_of(part), &layout.view(dst, i));
    }
}

/// `stats` gathered into one flat buffer, and where each sits in it.
fn gather_stats(stats: &[(String, Tensor<1>)], device: &Device) -> (Layout, Tensor<1>) {
    let layout = Layout::new(stats.iter().map(|(_, t)| t.dims()[0]).collect());
    let flat = layout.gather(stats.iter().map(|(_, t)| Some(t.clone())).collect(), device);
    (layout, flat)
}

/// The stage's parameter gradients in `all` (table order) written into `flat`.
fn gather_grads(all: &GradientsParams, params: &[ParamInfo], layout: &Layout, flat: &Tensor<1>) {
    let parts = params
        .iter()
        .map(|p| get_flat(all, p).expect("a parameter with a gradient"))
        .collect();
    gather_into(layout, parts, flat);
}

pub(super) fn is_running_stat(path: &str) -> bool {
    path.ends_with("running_mean") || path.ends_with("running_var")
}

fn is_recorded(path: &str, scope: Scope, control: Control) -> bool {
    scope.covers(path)
        || (control.records_stems() && path.starts_with("head.one2many.pose.point_stems."))
}

/// What the graphs compute from `input`: the stage's outputs, then (`RecordStems`, pose) each
/// level's one-to-many point stem on its feature level.
fn outputs(net: &Yolo, input: &Tensor<4>, scope: Scope, control: Control) -> Vec<Tensor<4>> {
    let mut out = scope.run(net, Tensor::from_inner(input.clone()));
    if control.records_stems() {
        assert_eq!(
            scope,
            Scope::Features,
            "point stems are recorded on the features"
        );
        let pose = net.head.one2many.pose.as_ref().expect("a pose head");
        let stems: Vec<Tensor<4>> = out
            .iter()
            .zip(&pose.point_stems)
            .map(|(x, stem)| stem.forward(x.clone()))
            .collect();
        out.extend(stems);
    }
    out
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
            pinned: None,
        }
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

    /// Bytes of the buffers the recorded graphs read and write beside the stage's activations,
    /// by kind (nothing before the first forward).
    pub fn buffer_bytes(&self) -> Vec<(&'static str, u64)> {
        let Some(r) = &self.state else {
            return Vec::new();
        };
        let sum = |ts: &[Tensor<4>]| ts.iter().map(bytes_of).sum();
        let pool = if r.seeds.is_some() {
            "seeds and gradients (one buffer)"
        } else {
            "gradients"
        };
        vec![
            ("parameters and statistics", r.sources.bytes()),
            ("input", bytes_of(&r.input)),
            ("outputs", sum(&r.outputs)),
            (pool, bytes_of(&r.pool)),
            ("statistics out", bytes_of(&r.stats_flat)),
        ]
    }

    /// Bytes and slices in use before recording, then what each stage of recording added, by
    /// stage, the loss graph's last where one is recorded; nothing before the first forward.
    /// The slices tell a few tensors from many small buffers (e.g. launch metadata a graph
    /// pins); the reservation after each stage tells where the pool grew.
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
        if let Some(l) = &r.loss {
            out.push(delta("loss graph", &l.growth[0], &l.growth[1]));
        }
        out
    }

    /// Replays the forward graph on `images` (recording it first on the first call) and returns
    /// the stage's outputs as leaves; the trainer's BatchNorm running statistics are updated in
    /// `model`.
    /// A recording failure is fatal and names the stage that failed: eligibility was decided
    /// before, and silently training natively would hide it.
    pub fn forward(&mut self, model: &mut Yolo, images: Tensor<4>) -> Vec<Tensor<4>> {
        if self.state.is_none() {
            let recorded = record(
                model,
                images.clone(),
                self.pinned.take().as_ref(),
                &self.device,
                self.scope,
                self.control,
            );
            let r = recorded.unwrap_or_else(|e| panic!("{e}"));
            if self.control.skips_rollback() {
                let net = r.net.as_ref().expect("kept for this control");
                let mut advanced: HashMap<String, Tensor<1>> = float_tensors(&net.valid())
                    .into_iter()
                    .filter(|(p, _)| is_running_stat(p) && is_recorded(p, self.scope, self.control))
                    .map(|(p, t)| (p, copy_of(t)))
                    .collect();
                *model = replace_float_tensors(model.clone(), &mut advanced).0;
            }
            self.state = Some(r);
        }
        let r = self.state.as_mut().expect("recorded");
        r.sources.refresh(model, self.control.stale_sources());
        write(images, &r.input);
        replay(&self.device, &r.forward);
        let flat = copy_of(r.stats_flat.clone());
        let mut stats: HashMap<String, Tensor<1>> = HashMap::new();
        for (k, (i, _)) in r.updated.iter().enumerate() {
            let view = r.stats_layout.view(&flat, k);
            // The graph has written the same values into the source buffer.
            r.sources.written[*i] = Some(cube(view.clone()));
            stats.insert(r.sources.buffers[*i].0.clone(), Tensor::from_inner(view));
        }
        let (updated, missing) = replace_float_tensors(model.clone(), &mut stats);
        assert!(
            missing.is_empty(),
            "running statistics not in the model: {missing:?}"
        );
        *model = updated;
        r.outputs.iter().map(leaf).collect()
    }

    /// Replays the backward graph with the gradients at the stage's outputs (`seeds`) and returns
    /// the stage's parameter gradients: views of the recorder's buffer, valid until the next
    /// backward ([`FlatGrads::copy`]).
    pub fn backward(&mut self, seeds: Vec<Tensor<4>>) -> FlatGrads {
        let r = self.state.as_ref().expect("forward before backward");
        let buffers = r.seeds.as_ref().unwrap_or(&r.outputs);
        assert_eq!(seeds.len(), buffers.len(), "one seed per recorded output");
        for (s, buffer) in seeds.into_iter().zip(buffers) {
            write(s, buffer);
        }
        self.backward_in_place()
    }

    /// How many outputs each head copy has among the stage's (both copies' come in order).
    pub fn outputs_per_copy(&self) -> usize {
        self.state.as_ref().map_or(0, |r| r.outputs.len() / 2)
    }

    /// [`Recorder::backward`] with the seeds already in their buffers (the recorded loss wrote
    /// them).
    pub fn backward_in_place(&mut self) -> FlatGrads {
        let r = self.state.as_ref().expect("forward before backward");
        replay(&self.device, &r.backward);
        FlatGrads {
            params: r.grad_params.clone(),
            layout: r.grad_layout.clone(),
            buf: r.grad_flat.clone(),
            copy: Some(copy_of::<1>),
        }
    }

    /// `replay.scope = "step"`: the recorded loss of `labels` on the outputs the last forward
    /// replay wrote, with the trainer's flow `flow` and (FP16) loss scale `scale`; it leaves the outputs' gradients in their
    /// buffers for [`Recorder::backward_in_place`]. Recorded on the first call, and again
    /// (said on stderr) when a batch needs other shapes (another count of object slots).
    pub fn loss(
        &mut self,
        loss: &E2eLoss,
        labels: &[Vec<Instance>],
        flow: Option<&RealNvp>,
        scale: Option<f32>,
    ) -> PendingLoss {
        let r = self.state.as_mut().expect("forward before the loss");
        if !r
            .loss
            .as_ref()
            .is_some_and(|g| g.fits(labels, loss.object_slots))
        {
            if r.loss.take().is_some() {
                eprintln!(
                    "step replay: recording the loss again for {} object slots per image \
                     (train.object_slots = {})",
                    ObjectSlots::slots_for(labels, loss.object_slots),
                    loss.object_slots
                );
            }
            let g = LossGraph::record(loss, &r.outputs, labels, flow, scale, &self.device)
                .unwrap_or_else(|e| panic!("{e}"));
            self.loss_recordings += 1;
            r.loss = Some(g);
        }
        let g = r.loss.as_mut().expect("recorded");
        let weight = (!self.control.freezes_loss_weight()).then_some(loss.one2many_weight);
        let scale = scale.filter(|_| !self.control.freezes_loss_scale());
        g.replay(labels, weight, scale, flow, &self.device)
    }

    /// How many times the loss was recorded ([`Recorder::loss`]).
    pub fn loss_recordings(&self) -> usize {
        self.loss_recordings
    }
}

pub(super) fn replay(device: &Device, graph: &Graph) {
    let inner = device.clone().inner();
    // Safety: every buffer the graphs touch is owned by `Recorded` and lives as long as the
    // graphs; refreshes and reads are issued from this (the capturing) thread.
    unsafe { Dispatch::graph_replay(inner.as_dispatch(), graph) }
        .unwrap_or_else(|e| panic!("feature replay: graph replay failed: {e:?}"));
}

fn record(
    model: &Yolo,
    images: Tensor<4>,
    pinned: Option<&Pinned>,
    device: &Device,
    scope: Scope,
    control: Control,
) -> Result<Recorded, RecordError> {
    let err = |what: &str, e: &dyn std::fmt::Debug| RecordError(format!("{what}: {e:?}"));
    let inner = device.clone().inner();
    let dispatch = inner.as_dispatch();
    let mut growth = vec![("before", pool_use(&inner))];
    // A private copy with its own buffers and its own BatchNorm state (`valid()` detaches the
    // running statistics, which a plain clone would share), and the same parameter ids, so its
    // gradients key like the trainer's.
    // The parameters' copies are segments of one buffer (`sources::private_copies`), or the
    // optimizer's own values when they are pinned.
    let (net, shared) = {
        let net = model.valid().train();
        let recorded = float_tensors(&net.valid())
            .into_iter()
            .filter(|(p, _)| is_recorded(p, scope, control))
            .collect();
        let (mut copies, shared) = private_copies(&net, recorded, pinned, &inner);
        (replace_float_tensors(net, &mut copies).0, shared)
    };
    let input = copy_of(images.inner());
    let run = |net: &Yolo| outputs(net, &input, scope, control);
    let stage_tensors = |net: &Yolo, keep: fn(&str) -> bool| -> Vec<(String, Tensor<1>)> {
        float_tensors(&net.valid())
            .into_iter()
            .filter(|(p, _)| is_recorded(p, scope, control) && keep(p))
            .collect()
    };

    // The stage's parameters that get a gradient; every warm-up gathers them as the recorded
    // backward will (into the buffer that holds the seeds, allocating nothing).
    let stage_params: Vec<ParamInfo> = param_table(&net)
        .into_iter()
        .filter(|p| is_recorded(&p.path, scope, control))
        .collect();
    let with_grad = |all: &GradientsParams| -> Vec<ParamInfo> {
        stage_params
            .iter()
            .filter(|p| get_flat(all, p).is_some())
            .cloned()
            .collect()
    };
    let backward_of = |net: &Yolo, f: &[Tensor<4>], seeds: &[Tensor<4>]| {
        GradientsParams::from_grads(seeded_root(f, seeds).backward(), net)
    };
    // The seeds and, at most as long as every stage parameter together, the gathered gradients,
    // in one buffer (features stage); the network stage's seeds are the outputs' buffers, and
    // separate ones serve only the warm-ups.
    let dims: Vec<[usize; 4]> = run(&net).iter().map(|t| t.dims()).collect();
    let seed_layout = Layout::new(dims.iter().map(|d| d.iter().product()).collect());
    let grad_room = Layout::new(stage_params.iter().map(ParamInfo::numel).collect()).len;
    let own_seeds = scope.cut() != Scope::Network;
    let pool_len = if own_seeds {
        seed_layout.len.max(grad_room)
    } else {
        grad_room
    };
    let pool = Tensor::<1>::zeros([pool_len], (&inner, DType::F32));
    let seeds: Vec<Tensor<4>> = dims
        .iter()
        .enumerate()
        .map(|(i, d)| match own_seeds {
            true => seed_layout.view(&pool, i).reshape(*d),
            // Burn's `zeros` pitches rows (an 80-wide FP32 row takes 512 bytes); a copy is packed.
            false => copy_of(Tensor::zeros(*d, &inner)),
        })
        .collect();
    growth.push(("private copy, input, seeds and gradients", pool_use(&inner)));

    Dispatch::graph_prepare(dispatch).map_err(|e| err("prepare", &e))?;
    let mut grad_params = Vec::new();
    let mut grad_layout = Layout::new(Vec::new());
    for _ in 0..WARMUPS {
        let f = run(&net);
        let all = backward_of(&net, &f, &seeds);
        grad_params = with_grad(&all);
        grad_layout = Layout::new(grad_params.iter().map(ParamInfo::numel).collect());
        let flat = segment(pool.clone(), 0, grad_layout.len, grad_layout.len);
        gather_grads(&all, &grad_params, &grad_layout, &flat);
        let (_, stats) = gather_stats(&stage_tensors(&net, is_running_stat), &inner);
        inner.sync().map_err(|e| err("warm-up sync", &e))?;
        drop((f, all, stats));
    }
    // What the recorded forward reads. `valid()` also merges the warm-ups' pending running-stat
    // updates now, outside the window.
    let sources = stage_tensors(&net, |_| true);
    inner.sync().map_err(|e| err("sync", &e))?;
    growth.push(("warm-ups", pool_use(&inner)));

    Dispatch::graph_start_capture(dispatch).map_err(|e| err("start forward capture", &e))?;
    let taped = run(&net);
    // Merging the new running statistics inside the window records that step too, so these
    // are buffers every replay rewrites; and their copies into the buffers the next replay reads.
    let index: HashMap<&str, usize> = sources
        .iter()
        .enumerate()
        .map(|(i, (p, _))| (p.as_str(), i))
        .collect();
    let stats = stage_tensors(&net, is_running_stat);
    let (stats_layout, stats_flat) = gather_stats(&stats, &inner);
    let updated: Vec<(usize, Tensor<1>)> = stats
        .into_iter()
        .map(|(p, t)| (index[p.as_str()], t))
        .collect();
    for (i, t) in &updated {
        write(t.clone(), &sources[*i].1);
    }
    let sources = Sources::with_shared(sources, shared);
    let forward = Dispatch::graph_stop_capture(dispatch).map_err(|e| err("forward capture", &e))?;
    growth.push(("forward graph", pool_use(&inner)));

    Dispatch::graph_prepare(dispatch).map_err(|e| err("prepare backward", &e))?;
    let grad_flat = segment(pool.clone(), 0, grad_layout.len, grad_layout.len);
    // The forward graph now holds its pages; the backward needs room outside them. One more
    // eager forward + backward (on a twin with its own autodiff leaves, so the recorded tape's
    // parameter leaves stay unconsumed) makes the pool grow by what the backward allocates.
    {
        let twin = net.valid().train();
        let f = run(&twin);
        let all = backward_of(&twin, &f, &seeds);
        gather_grads(&all, &grad_params, &grad_layout, &grad_flat);
        inner.sync().map_err(|e| err("backward warm-up sync", &e))?;
        drop((f, all, twin));
    }
    growth.push(("backward warm-up", pool_use(&inner)));
    let outputs: Vec<Tensor<4>> = taped.iter().map(|t| t.clone().inner()).collect();
    let seeds = own_seeds.then_some(seeds);
    Dispatch::graph_start_capture(dispatch).map_err(|e| err("start backward capture", &e))?;
    let all = backward_of(&net, &taped, seeds.as_ref().unwrap_or(&outputs));
    let captured = with_grad(&all);
    // Other parameters than the warm-ups' are refused below, once the window is closed (an
    // error inside it would leave the stream recording).
    if captured
        .iter()
        .map(|p| p.id)
        .eq(grad_params.iter().map(|p| p.id))
    {
        gather_grads(&all, &grad_params, &grad_layout, &grad_flat);
    }
    // Dropped inside the window: the graph holds every buffer it wrote that is still alive when
    // it closes, so the per-parameter gradients would stay allocated beside `grad_flat`.
    drop(all);
    let backward =
        Dispatch::graph_stop_capture(dispatch).map_err(|e| err("backward capture", &e))?;
    if captured
        .iter()
        .map(|p| p.id)
        .ne(grad_params.iter().map(|p| p.id))
    {
        return Err(RecordError(
            "the recorded backward reached other parameters than the warm-ups".into(),
        ));
    }
    inner.sync().map_err(|e| err("sync after capture", &e))?;
    growth.push(("backward graph", pool_use(&inner)));
    drop(taped);
    growth.push(("recorded tape dropped", pool_use(&inner)));
    Ok(Recorded {
        forward,
        backward,
        net: control.skips_rollback().then_some(net),
        input,
        sources,
        updated,
        stats_layout,
        stats_flat,
        outputs,
        seeds,
        pool,
        growth,
        grad_params,
        grad_layout,
        grad_flat,
        loss: None,
    })
}
