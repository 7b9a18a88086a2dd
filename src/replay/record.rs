//! How the [`super::recorder::Recorder`] records (docs/replay.md, "Recording"): on a private
//! copy of the stage, after eager warm-ups that settle every allocation the recorded launches
//! will reuse (nothing may be allocated inside a window). Two forms:
//! - [`record`]: the forward and the seeded backward as two graphs (and, for
//!   `replay.scope = "step"`, the loss as a third, [`super::loss::LossGraph`], recorded later);
//! - [`record_step`] (`replay.one_graph`): the forward, the device loss and the whole backward
//!   in one window, so the backward reuses the pages the forward's and the loss's temporaries
//!   freed, as the native step does, and no twin warms the backward up.

use super::copy::{copy_of, write};
use super::loss::LossInputs;
use super::recorder::{Graphs, PoolUse, RecordError, Recorded, is_running_stat, pool_use};
use super::sources::{Pinned, SharedParams, Sources, private_copies};
use super::tape::{leaf, seeded_root};
use crate::config::Scope;
use crate::data::Instance;
use crate::loss::E2eLoss;
use crate::model::Yolo;
use crate::model::flow::RealNvp;
use crate::model::ops::{grads_into, segment, stats_into, storage};
use crate::model::precision::autocast;
use crate::optim::grads::get_flat;
use crate::optim::groups::{ParamInfo, param_table};
use crate::optim::layout::Layout;
use crate::optim::tensors::{float_tensors, replace_float_tensors};
use burn::backend::{Backend, Dispatch};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::{DType, FloatDType};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use super::control::Control;

/// Eager runs before each recording: they settle every allocation the recorded launches will
/// reuse (docs/replay.md, "Recording").
const WARMUPS: usize = 3;

static WARM_UP_AS_CAPTURED: AtomicBool = AtomicBool::new(false);

/// With one graph ([`record_step`]), one more warm-up after the statistics and the gradients
/// are laid out that runs eagerly exactly what the window then records — statistics and
/// gradients written in place, in the window's order — so that the pools hold what the
/// window asks for where no page may be added, on every recording (`true`), or only on a
/// recording made again after a window refused for room (`false`, the default: the recorder's
/// retry, docs/replay.md "One window"). A fit on COCO ran out of room at its third recording
/// with the plain warm-ups (docs/perf_log.md BJ3).
pub fn choose_warm_up_as_captured(on: bool) {
    WARM_UP_AS_CAPTURED.store(on, Ordering::Relaxed);
}

/// Whether [`choose_warm_up_as_captured`] asked for the fourth warm-up on every recording.
pub(super) fn warms_up_as_captured() -> bool {
    WARM_UP_AS_CAPTURED.load(Ordering::Relaxed)
}

/// A recording refused by `what`, with the backend's error as it reports it.
pub(super) fn err(what: &str, e: &dyn std::fmt::Debug) -> RecordError {
    RecordError(format!("{what}: {e:?}"))
}

/// Whether the stage records the tensor at `path` (the point stems too under `RecordStems`).
pub(super) fn is_recorded(path: &str, scope: Scope, control: Control) -> bool {
    scope.covers(path)
        || (control.records_stems() && path.starts_with("head.one2many.pose.point_stems."))
}

/// `stats` gathered into one flat buffer, and where each sits in it.
fn gather_stats(stats: &[(String, Tensor<1>)], device: &Device) -> (Layout, Tensor<1>) {
    let layout = Layout::new(stats.iter().map(|(_, t)| t.dims()[0]).collect());
    let flat = layout.gather(stats.iter().map(|(_, t)| Some(t.clone())).collect(), device);
    (layout, flat)
}

/// The stage's parameter gradients in `all` (table order) written into `flat`; returns `(runs
/// copied, runs in all)` ([`Layout::gather_into`]).
fn gather_grads(
    all: &GradientsParams,
    params: &[ParamInfo],
    layout: &Layout,
    flat: &Tensor<1>,
) -> (usize, usize) {
    let parts: Vec<_> = params
        .iter()
        .map(|p| Some(get_flat(all, p).expect("a parameter with a gradient")))
        .collect();
    layout.gather_into(&parts, flat)
}

fn backward_of(net: &Yolo, f: &[Tensor<4>], seeds: &[Tensor<4>]) -> GradientsParams {
    GradientsParams::from_grads(seeded_root(f, seeds).backward(), net)
}

/// What every form of recording starts from: the private copy of the stage and its input.
struct Start {
    scope: Scope,
    control: Control,
    /// A private copy with its own buffers and its own BatchNorm state (`valid()` detaches the
    /// running statistics, which a plain clone would share), and the same parameter ids, so its
    /// gradients key like the trainer's.
    net: Yolo,
    /// The parameters' buffer (`sources::private_copies`), or the optimizer's own values.
    shared: Option<SharedParams>,
    input: Tensor<4>,
    /// The stage's parameters that can get a gradient, in table order.
    stage_params: Vec<ParamInfo>,
    inner: Device,
    growth: Vec<(&'static str, PoolUse)>,
    /// The stage's running statistics as segments of one buffer, which the private copy reads
    /// and a recorded forward updates in place ([`Start::lay_out_statistics`]).
    stat_segments: Option<(Layout, Tensor<1>)>,
}

impl Start {
    fn new(
        model: &Yolo,
        images: Tensor<4>,
        pinned: Option<&Pinned>,
        device: &Device,
        scope: Scope,
        control: Control,
    ) -> Self {
        let inner = device.clone().inner();
        let growth = vec![("before", pool_use(&inner))];
        let (net, shared) = {
            let net = model.valid().train();
            let recorded = float_tensors(&net.valid())
                .into_iter()
                .filter(|(p, _)| is_recorded(p, scope, control))
                .collect();
            let (mut copies, shared) = private_copies(&net, recorded, pinned, &inner);
            (replace_float_tensors(net, &mut copies).0, shared)
        };
        let stage_params = param_table(&net)
            .into_iter()
            .filter(|p| is_recorded(&p.path, scope, control))
            .collect();
        Self {
            scope,
            control,
            net,
            shared,
            input: copy_of(images.inner()),
            stage_params,
            inner,
            growth,
            stat_segments: None,
        }
    }

    /// With `model::ops::stats_into` chosen: the stage's running statistics, as they are now,
    /// written into one buffer, and the private copy made to read each from its segment there;
    /// a recorded forward then updates them in place ([`Start::statistics_in_place`]). Called
    /// after the warm-ups (which replace them) and before the window's sources are taken.
    fn lay_out_statistics(&mut self) {
        if !stats_into::chosen() {
            return;
        }
        let stats = self.tensors(&self.net, is_running_stat);
        let (layout, flat) = gather_stats(&stats, &self.inner);
        let mut views: HashMap<String, Tensor<1>> = stats
            .iter()
            .enumerate()
            .map(|(k, (p, _))| (p.clone(), layout.view(&flat, k)))
            .collect();
        self.net = replace_float_tensors(self.net.clone(), &mut views).0;
        self.stat_segments = Some((layout, flat));
    }

    /// Runs `f` (a forward inside a window) with the laid-out running statistics registered
    /// for in-place updates ([`stats_into::into`]); `f` alone where none are laid out or the
    /// `StatsOutOfPlace` control is on.
    fn statistics_in_place<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.stat_segments {
            Some((layout, flat)) if !self.control.stats_out_of_place() => {
                let views: Vec<Tensor<1>> = (0..layout.sizes.len())
                    .map(|k| layout.view(flat, k))
                    .collect();
                stats_into::into(&views, f)
            }
            _ => f(),
        }
    }

    /// What the graphs compute from the input: the stage's outputs, then (`RecordStems`, pose)
    /// each level's one-to-many point stem on its feature level.
    fn run(&self, net: &Yolo) -> Vec<Tensor<4>> {
        let mut out = self.scope.run(net, Tensor::from_inner(self.input.clone()));
        if self.control.records_stems() {
            assert_eq!(
                self.scope,
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

    /// The stage's forward on the private copy under the autocast dtype `dtype`, as the trainer
    /// runs it.
    fn forward(&self, dtype: Option<FloatDType>) -> Vec<Tensor<4>> {
        let _reduced = autocast(dtype);
        self.run(&self.net)
    }

    /// The stage's float tensors of `net` whose path `keep` accepts.
    fn tensors(&self, net: &Yolo, keep: fn(&str) -> bool) -> Vec<(String, Tensor<1>)> {
        float_tensors(&net.valid())
            .into_iter()
            .filter(|(p, _)| is_recorded(p, self.scope, self.control) && keep(p))
            .collect()
    }

    /// The stage's parameters that have a gradient in `all`.
    fn with_grad(&self, all: &GradientsParams) -> Vec<ParamInfo> {
        self.stage_params
            .iter()
            .filter(|p| get_flat(all, p).is_some())
            .cloned()
            .collect()
    }

    /// How long a buffer must be to hold every stage parameter's gradient.
    fn grad_room(&self) -> usize {
        Layout::new(self.stage_params.iter().map(ParamInfo::numel).collect()).len
    }

    fn mark(&mut self, what: &'static str) {
        self.growth.push((what, pool_use(&self.inner)));
    }

    /// What the recorder keeps of a recording: `graphs`, the outputs per head copy, the static
    /// buffers, the statistics the forward writes (`(index in sources, buffer)`, their layout
    /// and flat buffer), the gradients' pool and the gradients (parameters, layout, flat view,
    /// what the recorded gather copied); the private copy only for the `SkipRollback` control.
    fn finish(
        self,
        graphs: Graphs,
        per_copy: usize,
        sources: Sources,
        stats: WindowStats,
        pool: Tensor<1>,
        grads: (Vec<ParamInfo>, Layout, Tensor<1>, (usize, usize)),
    ) -> Recorded {
        let WindowStats {
            updated,
            layout: stats_layout,
            flat: stats_flat,
            copied: stats_copied,
        } = stats;
        let (grad_params, grad_layout, grad_flat, gathered) = grads;
        Recorded {
            stats_laid_out: self.stat_segments.is_some(),
            stats_copied,
            graphs,
            per_copy,
            net: self.control.skips_rollback().then_some(self.net),
            input: self.input,
            sources,
            updated,
            stats_layout,
            stats_flat,
            pool,
            growth: self.growth,
            grad_params,
            grad_layout,
            grad_flat,
            gathered,
        }
    }
}

/// What a window did with the new running statistics ([`statistics_in_window`]).
struct WindowStats {
    /// `(index in sources, buffer)` of each.
    updated: Vec<(usize, Tensor<1>)>,
    /// Where each sits in `flat`.
    layout: Layout,
    flat: Tensor<1>,
    /// `(copies into the buffers the next replay reads, statistics or runs of them)`.
    copied: (usize, usize),
}

/// Inside a window, after the stage's forward: the new running statistics merged (so these are
/// buffers every replay rewrites), gathered into one flat buffer, and copied into the buffers
/// the next replay reads. With the statistics laid out ([`Start::lay_out_statistics`]) those
/// buffers are the flat one's segments, and only the statistics not updated in place are
/// copied there (none under the `StatsOutOfPlace` control).
fn statistics_in_window(s: &Start, sources: &[(String, Tensor<1>)]) -> WindowStats {
    let index: HashMap<&str, usize> = sources
        .iter()
        .enumerate()
        .map(|(i, (p, _))| (p.as_str(), i))
        .collect();
    let stats = s.tensors(&s.net, is_running_stat);
    let updated: Vec<(usize, Tensor<1>)> = stats
        .iter()
        .map(|(p, t)| (index[p.as_str()], t.clone()))
        .collect();
    let (layout, flat, copied) = match &s.stat_segments {
        Some((layout, flat)) => {
            let copied = match s.control.stats_out_of_place() {
                false => {
                    let parts: Vec<_> = stats.into_iter().map(|(_, t)| Some(t)).collect();
                    layout.gather_into(&parts, flat)
                }
                true => (0, 0),
            };
            (layout.clone(), flat.clone(), copied)
        }
        None => {
            let (layout, flat) = gather_stats(&stats, &s.inner);
            for (i, t) in &updated {
                write(t.clone(), &sources[*i].1);
            }
            (layout, flat, (updated.len(), updated.len()))
        }
    };
    WindowStats {
        updated,
        layout,
        flat,
        copied,
    }
}

/// `(parameter, its segment of flat)` for each of `params` among `sources`: where
/// [`grads_into::into`] writes their gradients.
fn in_place_pairs(
    sources: &[(String, Tensor<1>)],
    params: &[ParamInfo],
    layout: &Layout,
    flat: &Tensor<1>,
) -> Vec<(Tensor<1>, Tensor<1>)> {
    let by_path: HashMap<&str, &Tensor<1>> = sources.iter().map(|(p, t)| (p.as_str(), t)).collect();
    let buffer = storage(flat).map(|(id, _)| id);
    params
        .iter()
        .enumerate()
        .filter_map(|(i, p)| {
            let dst = layout.view(flat, i);
            let param = (*by_path.get(p.path.as_str())?).clone();
            // Only views of `flat` itself: a segment that came out as a copy would lose what
            // is written into it.
            let in_flat = storage(&dst).map(|(id, _)| id) == buffer;
            in_flat.then_some((param, dst))
        })
        .collect()
}

/// Whether the recorded backward reached exactly the warm-ups' parameters.
fn same_params(a: &[ParamInfo], b: &[ParamInfo]) -> bool {
    a.iter().map(|p| p.id).eq(b.iter().map(|p| p.id))
}

/// The forward and the seeded backward of the stage as two graphs (docs/replay.md,
/// "Recording").
pub(super) fn record(
    model: &Yolo,
    images: Tensor<4>,
    pinned: Option<&Pinned>,
    device: &Device,
    scope: Scope,
    control: Control,
) -> Result<Recorded, RecordError> {
    let mut s = Start::new(model, images, pinned, device, scope, control);
    let inner = s.inner.clone();
    let dispatch = inner.as_dispatch();
    // The seeds and, at most as long as every stage parameter together, the gathered gradients,
    // in one buffer (features stage); the network stage's seeds are the outputs' buffers, and
    // separate ones serve only the warm-ups.
    let dims: Vec<[usize; 4]> = s.run(&s.net).iter().map(|t| t.dims()).collect();
    let seed_layout = Layout::new(dims.iter().map(|d| d.iter().product()).collect());
    let own_seeds = scope.cut() != Scope::Network;
    let pool_len = if own_seeds {
        seed_layout.len.max(s.grad_room())
    } else {
        s.grad_room()
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
    s.mark("private copy, input, seeds and gradients");

    Dispatch::graph_prepare(dispatch).map_err(|e| err("prepare", &e))?;
    let mut grad_params = Vec::new();
    let mut grad_layout = Layout::new(Vec::new());
    for _ in 0..WARMUPS {
        let f = s.run(&s.net);
        let all = backward_of(&s.net, &f, &seeds);
        grad_params = s.with_grad(&all);
        grad_layout = Layout::new(grad_params.iter().map(ParamInfo::numel).collect());
        let flat = segment(pool.clone(), 0, grad_layout.len, grad_layout.len);
        gather_grads(&all, &grad_params, &grad_layout, &flat);
        let (_, stats) = gather_stats(&s.tensors(&s.net, is_running_stat), &inner);
        inner.sync().map_err(|e| err("warm-up sync", &e))?;
        drop((f, all, stats));
    }
    // What the recorded forward reads. `valid()` also merges the warm-ups' pending running-stat
    // updates now, outside the window.
    s.lay_out_statistics();
    let sources = s.tensors(&s.net, |_| true);
    inner.sync().map_err(|e| err("sync", &e))?;
    s.mark("warm-ups");

    Dispatch::graph_start_capture(dispatch).map_err(|e| err("start forward capture", &e))?;
    let taped = s.statistics_in_place(|| s.run(&s.net));
    let stats = statistics_in_window(&s, &sources);
    let forward = Dispatch::graph_stop_capture(dispatch).map_err(|e| err("forward capture", &e))?;
    let sources = Sources::with_shared(sources, s.shared.take());
    s.mark("forward graph");

    Dispatch::graph_prepare(dispatch).map_err(|e| err("prepare backward", &e))?;
    let grad_flat = segment(pool.clone(), 0, grad_layout.len, grad_layout.len);
    // The forward graph now holds its pages; the backward needs room outside them. One more
    // eager forward + backward (on a twin with its own autodiff leaves, so the recorded tape's
    // parameter leaves stay unconsumed) makes the pool grow by what the backward allocates.
    {
        let twin = s.net.valid().train();
        let f = s.run(&twin);
        let all = backward_of(&twin, &f, &seeds);
        gather_grads(&all, &grad_params, &grad_layout, &grad_flat);
        inner.sync().map_err(|e| err("backward warm-up sync", &e))?;
        drop((f, all, twin));
    }
    s.mark("backward warm-up");
    let outputs: Vec<Tensor<4>> = taped.iter().map(|t| t.clone().inner()).collect();
    let seeds = own_seeds.then_some(seeds);
    Dispatch::graph_start_capture(dispatch).map_err(|e| err("start backward capture", &e))?;
    let all = backward_of(&s.net, &taped, seeds.as_ref().unwrap_or(&outputs));
    let captured = s.with_grad(&all);
    // Other parameters than the warm-ups' are refused below, once the window is closed (an
    // error inside it would leave the stream recording).
    let mut gathered = (0, 0);
    if same_params(&captured, &grad_params) {
        gathered = gather_grads(&all, &grad_params, &grad_layout, &grad_flat);
    }
    // Dropped inside the window: the graph holds every buffer it wrote that is still alive when
    // it closes, so the per-parameter gradients would stay allocated beside `grad_flat`.
    drop(all);
    let backward =
        Dispatch::graph_stop_capture(dispatch).map_err(|e| err("backward capture", &e))?;
    if !same_params(&captured, &grad_params) {
        return Err(RecordError(
            "the recorded backward reached other parameters than the warm-ups".into(),
        ));
    }
    inner.sync().map_err(|e| err("sync after capture", &e))?;
    s.mark("backward graph");
    drop(taped);
    s.mark("recorded tape dropped");
    let graphs = Graphs::Split {
        forward,
        backward,
        outputs,
        seeds,
        loss: None,
    };
    let grads = (grad_params, grad_layout, grad_flat, gathered);
    Ok(s.finish(graphs, dims.len() / 2, sources, stats, pool, grads))
}

/// What [`record_step`] records the loss with: the loss, the batch's objects, the trainer's
/// flow, FP16's loss scale and the forward's autocast dtype.
#[derive(Clone, Copy)]
pub(super) struct StepInputs<'a> {
    pub loss: &'a E2eLoss,
    pub labels: &'a [Vec<Instance>],
    pub flow: Option<&'a RealNvp>,
    pub scale: Option<f32>,
    pub dtype: Option<FloatDType>,
}

/// `replay.one_graph`: the network's forward (under the step's autocast dtype, as the trainer
/// runs it), the device loss of `step.labels` on its outputs, and the network's backward from
/// the loss's gradients, as one graph (docs/replay.md, "One window"), with the loss's inputs
/// and results ([`LossInputs`]). `as_captured`: one more warm-up that runs the window's work
/// eagerly ([`choose_warm_up_as_captured`]).
pub(super) fn record_step(
    model: &Yolo,
    images: Tensor<4>,
    pinned: Option<&Pinned>,
    device: &Device,
    control: Control,
    step: StepInputs,
    as_captured: bool,
) -> Result<Recorded, RecordError> {
    let mut s = Start::new(model, images, pinned, device, Scope::Step, control);
    let inner = s.inner.clone();
    let dispatch = inner.as_dispatch();
    let pool = Tensor::<1>::zeros([s.grad_room()], (&inner, DType::F32));
    let inputs = LossInputs::prepare(step.loss, step.labels, step.flow, step.scale, device);
    s.mark("private copy, input, loss inputs and gradients");
    // The loss's gradients at the outputs, or `None` where one is missing (the recording is
    // then refused); whether the flow got all of its own.
    let loss_of = |taped: &[Tensor<4>]| -> (Option<Vec<Tensor<4>>>, bool) {
        let leaves: Vec<Tensor<4>> = taped.iter().map(leaf).collect();
        let (seeds, flow_complete) = inputs.run(step.loss, &leaves);
        (seeds.into_iter().collect(), flow_complete)
    };
    let incomplete = || {
        RecordError("the device loss left an output or a flow parameter without a gradient".into())
    };

    Dispatch::graph_prepare(dispatch).map_err(|e| err("prepare", &e))?;
    let mut grad_params = Vec::new();
    let mut grad_layout = Layout::new(Vec::new());
    let mut per_copy = 0;
    for _ in 0..WARMUPS {
        let taped = s.forward(step.dtype);
        per_copy = taped.len() / 2;
        let (_, stats) = gather_stats(&s.tensors(&s.net, is_running_stat), &inner);
        let (seeds, flow_complete) = loss_of(&taped);
        let seeds = seeds.filter(|_| flow_complete).ok_or_else(incomplete)?;
        let all = backward_of(&s.net, &taped, &seeds);
        grad_params = s.with_grad(&all);
        grad_layout = Layout::new(grad_params.iter().map(ParamInfo::numel).collect());
        let flat = segment(pool.clone(), 0, grad_layout.len, grad_layout.len);
        gather_grads(&all, &grad_params, &grad_layout, &flat);
        inner.sync().map_err(|e| err("warm-up sync", &e))?;
        drop((taped, stats, seeds, all));
    }
    s.lay_out_statistics();
    let sources = s.tensors(&s.net, |_| true);
    let grad_flat = segment(pool.clone(), 0, grad_layout.len, grad_layout.len);
    // The seeds are the window's temporaries, not views of the pool: the gradients may be
    // written into `grad_flat` as the backward makes them.
    let in_place = in_place_pairs(&sources, &grad_params, &grad_layout, &grad_flat);
    // The window's run: the statistics and the gradients written in place, the seeds dropped
    // inside it. A refusal waits until the window is closed (an error inside it would leave
    // the stream recording).
    let window = |s: &Start| {
        let taped = s.statistics_in_place(|| s.forward(step.dtype));
        let stats = statistics_in_window(s, &sources);
        let (seeds, flow_complete) = loss_of(&taped);
        let complete = flow_complete && seeds.is_some();
        let mut captured = Vec::new();
        let mut gathered = (0, 0);
        if let (Some(seeds), true) = (&seeds, complete) {
            let all = grads_into::into(&in_place, || backward_of(&s.net, &taped, seeds));
            captured = s.with_grad(&all);
            if same_params(&captured, &grad_params) && !control.gathers_nothing() {
                gathered = gather_grads(&all, &grad_params, &grad_layout, &grad_flat);
            }
        }
        // Dropped inside the window: the graph keeps every buffer it wrote that is still alive
        // when it closes; what the loss and the backward need from the forward is freed here,
        // so its pages serve the rest of the window as natively.
        drop((taped, seeds));
        (stats, complete, captured, gathered)
    };
    if as_captured {
        // The window's run, eagerly, from the pool state the window starts from: its
        // allocations in its order. What it writes (the private statistics, the sources, the
        // gradient buffer) every replay writes again from the trainer's values first.
        let warm = window(&s);
        inner.sync().map_err(|e| err("warm-up sync", &e))?;
        drop(warm);
    }
    inner.sync().map_err(|e| err("sync", &e))?;
    s.mark("warm-ups");

    Dispatch::graph_start_capture(dispatch).map_err(|e| err("start step capture", &e))?;
    let (stats, complete, captured, gathered) = window(&s);
    let graph = Dispatch::graph_stop_capture(dispatch).map_err(|e| err("step capture", &e))?;
    if !complete {
        return Err(incomplete());
    }
    if !same_params(&captured, &grad_params) {
        return Err(RecordError(
            "the recorded backward reached other parameters than the warm-ups".into(),
        ));
    }
    inner.sync().map_err(|e| err("sync after capture", &e))?;
    s.mark("step graph");
    let sources = Sources::with_shared(sources, s.shared.take());
    let graphs = Graphs::One {
        step: graph,
        loss: Box::new(inputs),
    };
    let grads = (grad_params, grad_layout, grad_flat, gathered);
    Ok(s.finish(graphs, per_copy, sources, stats, pool, grads))
}
