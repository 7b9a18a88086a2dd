//! The optimizer step and the EMA update recorded into one CUDA graph (`replay.record_update`,
//! docs/replay.md "The update recorded"), replayed on every optimizer step once the flat
//! optimizer and the EMA write in place (their buffers then keep their addresses).
//!
//! The graph runs the flat update's device arithmetic (`optim::flat::device_update`: FP16's
//! unscale and skip, the global clip, the rule, the masks) on fixed input buffers, writes the
//! new values in place and averages them into the EMA's buffer where they lie, run by run (the
//! parameters' run reads the optimizer's values; the running statistics' runs read a compact
//! buffer the host fills). What changes per step is a device value the host rewrites before
//! each replay: the per-step table (learning rates, weight decay, bias corrections, presence),
//! the momentum pair, FP16's loss-scale inverse, the EMA's decay pair, the gradients (gathered
//! into a fixed buffer, a copy per run) and the running statistics the EMA averages (their
//! trainer tensors are new every step). Decided on the host, as natively: which parameters are
//! present, the step counts (`Optimizer::settle`, after the replay), the loss scale's next
//! value.

use super::control::Control;
use super::copy::copy_of;
use super::recorder::{Graph, RecordError, replay};
use crate::model::Yolo;
use crate::model::ops::storage;
use crate::optim::ema::average;
use crate::optim::flat::{
    DeviceInputs, Finite, FlatState, HostInputs, count_in_place_step, device_update, pair,
};
use crate::optim::grads::{FlatGrads, take_flat};
use crate::optim::groups::ParamInfo;
use crate::optim::layout::{self, Layout};
use crate::optim::optimizer::Stepped;
use crate::optim::tensors::{FloatIndex, write_in_place};
use crate::optim::{Ema, Hyper, Optimizer};
use crate::train::spans::{self, Span};
use burn::backend::{Backend, Dispatch};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::DType;
use std::sync::atomic::{AtomicBool, Ordering};

static EARLY: AtomicBool = AtomicBool::new(false);

/// Whether a recorded step that ends in an optimizer step walks the trainer's model once, right
/// after its graph is launched and before the host waits for its results, and finds in that walk
/// both the EMA's sources for the recorded update ([`UpdateInputs::walked`]) and the next
/// step's static buffers' (`true`; `bench-step --early-walk true`), or walks the model in the update
/// after the read and again in the next step (`false`, the default until it is measured on a
/// GPU). On one device the recorded update writes the parameters in place and nothing else
/// replaces the model's tensors between that launch and the next step's refresh (the trainer
/// drops the walk wherever something may), so both find the same tensors; early, the walk runs
/// while the GPU runs the step instead of while it waits (docs/perf_log.md BQ3).
pub fn choose_early(on: bool) {
    EARLY.store(on, Ordering::Relaxed);
}

/// [`choose_early`]'s choice.
pub fn early() -> bool {
    EARLY.load(Ordering::Relaxed)
}

/// Eager runs of the update (on scratch copies of the buffers) before recording it.
const WARMUPS: usize = 3;

/// The recorded update and every buffer it reads or writes.
pub struct UpdateGraph {
    graph: Graph,
    u: UpdateBuffers,
    /// Per tensor of the EMA's: written into `u.rest` by the host before each replay (the
    /// others, the parameters, the graph reads from the optimizer's values).
    host_written: Vec<bool>,
    /// FP16: `[1]`, 0 when the gradients were finite, NaN when not; rewritten by every replay.
    finite: Option<Tensor<1>>,
    /// The optimizer's values and the EMA's buffer the graph was recorded on: another buffer
    /// (a checkpoint loaded, the flat buffers gathered again) records it again.
    recorded_on: [Option<(usize, u64)>; 2],
}

/// What one update is given.
pub struct UpdateInputs<'a> {
    pub model: &'a Yolo,
    pub grads: GradientsParams,
    pub hyper: &'a Hyper,
    pub clip_norm: f64,
    pub loss_scale: Option<f32>,
    /// A walk of `model` made after this step's launch ([`early`]), where the EMA's sources
    /// are found; `None`: the update walks `model` itself.
    pub walked: Option<&'a [Tensor<1>]>,
    /// The flat buffers some of `grads` are views of (`Trainer::pending_flat`): one that holds a
    /// run of the optimizer's parameters at its layout is gathered as one copy
    /// ([`FlatGrads::place_in`]), its parameters present without being taken one by one from
    /// `grads`.
    pub flats: Vec<FlatGrads>,
}

/// The gradients the update gathers: per parameter a tensor (`None`: absent or in a run), and
/// the runs of whole flat buffers with where they lie at the optimizer's layout.
struct Gathered {
    parts: Vec<Option<Tensor<1>>>,
    runs: Vec<(layout::Span, Tensor<1>)>,
}

impl Gathered {
    /// `grads` and `flats` at `layout` (the parameters of `table`), and which parameters are
    /// present: those in a run of a flat buffer and those with a gradient in `grads`.
    fn new(
        grads: &mut GradientsParams,
        flats: &[FlatGrads],
        table: &[ParamInfo],
        layout: &Layout,
    ) -> (Self, Vec<bool>) {
        let mut in_run = vec![false; table.len()];
        let runs = flats
            .iter()
            .filter_map(|f| {
                let start = f.place_in(table, layout)?;
                in_run[start..start + f.params.len()].fill(true);
                Some(f.run_at(start, layout))
            })
            .collect();
        let parts: Vec<Option<Tensor<1>>> = table
            .iter()
            .zip(&in_run)
            .map(|(p, &r)| if r { None } else { take_flat(grads, p) })
            .collect();
        let present = parts
            .iter()
            .zip(&in_run)
            .map(|(p, &r)| r || p.is_some())
            .collect();
        (Self { parts, runs }, present)
    }

    /// Everything written into its segments of `dst` (a buffer laid out by `layout`): the parts
    /// run by run (`Layout::gather_into`), then each flat buffer's run as one copy, unless it
    /// lies there already.
    fn write_into(&self, layout: &Layout, dst: &Tensor<1>) {
        layout.gather_into(&self.parts, dst);
        for (at, whole) in &self.runs {
            let view = at.view_of(dst);
            if storage(whole).is_some_and(|s| Some(s) == storage(&view)) {
                continue;
            }
            let done = write_in_place(whole, &view);
            assert!(done, "a fixed buffer is written in place on CUDA only");
        }
    }
}

/// The EMA's current value of each of its tensors (`paths`), from `model`, found through
/// `index` (learnt on the first call), in `walked` (a walk of `model` made earlier) or a walk of
/// its own.
fn ema_parts(
    model: &Yolo,
    paths: &[String],
    index: &mut FloatIndex,
    walked: Option<&[Tensor<1>]>,
) -> Vec<Option<Tensor<1>>> {
    let parts = index.tensors(model, walked, paths.iter().map(String::as_str));
    for (p, t) in paths.iter().zip(&parts) {
        assert!(t.is_some(), "EMA: the model has no tensor {p}");
    }
    parts
}

/// The items of `all` the host writes (`host_written`), in order: the parts (or sizes) of the
/// compact layout of [`UpdateBuffers::rest`].
fn written_by_host<T: Clone>(all: &[T], host_written: &[bool]) -> Vec<T> {
    all.iter()
        .zip(host_written)
        .filter(|(_, h)| **h)
        .map(|(t, _)| t.clone())
        .collect()
}

/// The graph's work on `flat` and `averaged` (the real buffers when recording, scratch copies
/// in the warm-ups): the update written in place, then the average written in place run by
/// run of `sources` (per EMA tensor, its current value: a view of the optimizer's values or of
/// `u.rest`). Returns the finiteness the update decided.
#[allow(clippy::too_many_arguments)]
fn body(
    u: &UpdateBuffers,
    optimizer_constants: crate::optim::flat::RuleConstants,
    table: &[ParamInfo],
    flat: &mut FlatState,
    ema_layout: &Layout,
    sources: &[Option<Tensor<1>>],
    averaged: &Tensor<1>,
    clip_norm: f64,
) -> Finite {
    let inputs = DeviceInputs {
        rows: u.rows.clone(),
        mu: u.mu.clone(),
        inv: u.inv.clone(),
        g: u.g.clone(),
    };
    let (next, finite) = device_update(optimizer_constants, flat, table, inputs, clip_norm);
    next.write(flat);
    // The same arithmetic per value as averaging the whole buffer at once (`Ema::update`),
    // without a copy of the parameters: element-wise operations on any run give its values
    // the same bits.
    ema_layout.each_run(sources, |at, current| {
        let dst = at.view_of(averaged);
        let next = average(&dst, current, u.decay.clone());
        write_in_place(&next, &dst);
    });
    finite
}

/// The buffers the graph reads, made at recording: the per-step table, `[μ, 1 − μ]`,
/// FP16's `[1/scale]`, the EMA's `[d, 1 − d]`, the gradients at the optimizer's layout and the
/// current values of the EMA's tensors that are not parameters (the running statistics) at
/// `rest`'s layout.
struct UpdateBuffers {
    rows: Tensor<1>,
    mu: Tensor<1>,
    inv: Option<Tensor<1>>,
    decay: Tensor<1>,
    g: Tensor<1>,
    rest: Tensor<1>,
    /// The host-written tensors of the EMA's, in its order, each segment padded as in its
    /// layout: runs of the EMA's layout stay runs here.
    rest_layout: Layout,
}

/// Per EMA tensor, where the graph reads its current value: its segment of `rest` where
/// `host_written`, else the parameter itself (a view of the optimizer's values).
fn sources(
    current: &[Option<Tensor<1>>],
    host_written: &[bool],
    rest: &Tensor<1>,
    rest_layout: &Layout,
) -> Vec<Option<Tensor<1>>> {
    let mut k = 0;
    current
        .iter()
        .zip(host_written)
        .map(|(t, &h)| {
            if h {
                k += 1;
                Some(rest_layout.view(rest, k - 1))
            } else {
                t.clone()
            }
        })
        .collect()
}

impl UpdateGraph {
    /// Records the update of `optimizer` (whose flat buffers are written in place: `flat`)
    /// and `ema` for these inputs, and leaves them written into its buffers for the first
    /// replay.
    #[allow(clippy::too_many_arguments)]
    fn record(
        optimizer_constants: crate::optim::flat::RuleConstants,
        table: &[ParamInfo],
        flat: &mut FlatState,
        ema: (&[String], &Layout, &Tensor<1>),
        host: &HostInputs,
        decay: f64,
        grads: &Gathered,
        current: &[Option<Tensor<1>>],
        clip_norm: f64,
    ) -> Result<Self, RecordError> {
        let err = |what: &str, e: &dyn std::fmt::Debug| RecordError(format!("{what}: {e:?}"));
        let (_, ema_layout, averaged) = ema;
        let device = flat.p.device();
        let dispatch = device.as_dispatch();
        flat.prepare_muon(optimizer_constants.rule, table);
        let zeros = |n: usize| copy_of(Tensor::<1>::zeros([n], (&device, DType::F32)));
        // The EMA's tensors that are not views of the optimizer's values (the running
        // statistics): the host writes them into `rest` before each replay; the others the
        // graph averages where they lie, after writing the update.
        let values = storage(&flat.p).map(|(id, _)| id);
        let host_written: Vec<bool> = current
            .iter()
            .map(|t| t.as_ref().and_then(storage).map(|(id, _)| id) != values)
            .collect();
        let rest_layout = Layout::new(written_by_host(&ema_layout.sizes, &host_written));
        let u = UpdateBuffers {
            rows: copy_of(host.rows_tensor(&device)),
            mu: copy_of(host.mu_tensor(&device)),
            inv: host.inv_tensor(&device).map(copy_of),
            decay: copy_of(pair(decay, &device)),
            g: zeros(flat.layout.len),
            rest: zeros(rest_layout.len.max(1)),
            rest_layout,
        };
        grads.write_into(&flat.layout, &u.g);
        u.rest_layout
            .gather_into(&written_by_host(current, &host_written), &u.rest);
        let sources = sources(current, &host_written, &u.rest, &u.rest_layout);

        Dispatch::graph_prepare(dispatch).map_err(|e| err("prepare update", &e))?;
        for _ in 0..WARMUPS {
            let mut scratch = flat.scratch(copy_of::<1>);
            let scratch_avg = copy_of(averaged.clone());
            let finite = body(
                &u,
                optimizer_constants,
                table,
                &mut scratch,
                ema_layout,
                &sources,
                &scratch_avg,
                clip_norm,
            );
            device.sync().map_err(|e| err("update warm-up sync", &e))?;
            drop((scratch, scratch_avg, finite));
        }
        device.sync().map_err(|e| err("sync", &e))?;
        Dispatch::graph_start_capture(dispatch).map_err(|e| err("start update capture", &e))?;
        let finite = body(
            &u,
            optimizer_constants,
            table,
            flat,
            ema_layout,
            &sources,
            averaged,
            clip_norm,
        );
        let graph =
            Dispatch::graph_stop_capture(dispatch).map_err(|e| err("update capture", &e))?;
        device
            .sync()
            .map_err(|e| err("sync after update capture", &e))?;
        let finite = match finite {
            Finite::OnDevice(t) => Some(*t),
            Finite::Known(_) => None,
        };
        Ok(Self {
            graph,
            u,
            host_written,
            finite,
            recorded_on: [storage(&flat.p), storage(averaged)],
        })
    }

    /// Whether the graph reads and writes these buffers.
    fn fits(&self, flat: &FlatState, averaged: &Tensor<1>, scaled: bool) -> bool {
        self.recorded_on == [storage(&flat.p), storage(averaged)] && self.u.inv.is_some() == scaled
    }

    /// Writes this step's inputs into the graph's buffers (`scalars`: the table, momentum,
    /// loss-scale inverse and decay too; only the `FrozenUpdateScalars` control passes false).
    fn write_inputs(
        &self,
        host: &HostInputs,
        decay: f64,
        grads: &Gathered,
        current: &[Option<Tensor<1>>],
        layout: &Layout,
        scalars: bool,
    ) {
        let u = &self.u;
        let device = u.g.device();
        if scalars {
            write_in_place(&host.rows_tensor(&device), &u.rows);
            write_in_place(&host.mu_tensor(&device), &u.mu);
            if let (Some(t), Some(buffer)) = (host.inv_tensor(&device), &u.inv) {
                write_in_place(&t, buffer);
            }
            write_in_place(&pair(decay, &device), &u.decay);
        }
        grads.write_into(layout, &u.g);
        u.rest_layout
            .gather_into(&written_by_host(current, &self.host_written), &u.rest);
    }
}

/// One optimizer step and EMA update through the recorded graph (recording it first when there
/// is none for these buffers), or `Err` with the gradients untouched when the optimizer or the
/// EMA does not write in place yet (their first update, a non-flat update, another device):
/// the caller runs them eagerly then.
pub fn update(
    graph: &mut Option<UpdateGraph>,
    index: &mut FloatIndex,
    control: Control,
    optimizer: &mut Optimizer,
    ema: &mut Ema<Yolo>,
    mut inputs: UpdateInputs,
) -> Result<Stepped, GradientsParams> {
    let ready = optimizer.in_place_buffers().is_some() && ema.flat_buffer().is_some();
    if !ready {
        return Err(inputs.grads);
    }
    let inputs_made = std::time::Instant::now();
    let table = optimizer.table.clone();
    let constants = optimizer.constants();
    let values = optimizer
        .in_place_buffers()
        .expect("checked above")
        .layout
        .clone();
    let (gathered, present) = Gathered::new(&mut inputs.grads, &inputs.flats, &table, &values);
    let host = HostInputs::new(
        constants,
        &table,
        &optimizer.state,
        &present,
        inputs.hyper,
        inputs.loss_scale,
    );
    let decay = ema.next_decay();
    let (paths, ema_layout, averaged) = ema.flat_buffer().expect("checked above");
    let (paths, ema_layout, averaged) = (paths.to_vec(), ema_layout.clone(), averaged.clone());
    let current = ema_parts(inputs.model, &paths, index, inputs.walked);
    let flat = optimizer.in_place_buffers().expect("checked above");
    let scaled = inputs.loss_scale.is_some();
    spans::since(Span::UpdateInputs, inputs_made);
    if !graph
        .as_ref()
        .is_some_and(|g| g.fits(flat, &averaged, scaled))
    {
        // Dropping the old graph first gives its pages back.
        *graph = None;
        let recorded = UpdateGraph::record(
            constants,
            &table,
            flat,
            (&paths, &ema_layout, &averaged),
            &host,
            decay,
            &gathered,
            &current,
            inputs.clip_norm,
        );
        *graph = Some(recorded.unwrap_or_else(|e| panic!("{e}")));
    }
    let g = graph.as_ref().expect("recorded");
    spans::time(Span::UpdateWrite, || {
        g.write_inputs(
            &host,
            decay,
            &gathered,
            &current,
            &flat.layout,
            !control.freezes_update_scalars(),
        )
    });
    spans::time(Span::UpdateLaunch, || replay(&flat.p.device(), &g.graph));
    count_in_place_step();
    ema.count_update();
    let finite = match &g.finite {
        Some(t) => Finite::OnDevice(Box::new(t.clone())),
        None => Finite::Known(true),
    };
    Ok(optimizer.queued(present, finite))
}
