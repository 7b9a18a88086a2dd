//! The recorded loss of `replay.scope = "step"` (docs/replay.md, "Step recording"): the device
//! loss ([`E2eLoss::dense_loss`]: both copies' assignment and terms, the RLE flow) and its
//! backward down to the network's outputs, recorded into one CUDA graph on the first training
//! step and replayed on every later one, between the network's forward and backward graphs
//! ([`LossGraph`]), or inside the step's one graph with `replay.one_graph` ([`LossInputs`],
//! recorded by `replay::record::record_step`).
//!
//! It reads the network's outputs where the forward graph writes them, the batch's objects from
//! a fixed block of slots ([`ObjectSlots::pack`]), the ProgLoss weight and (FP16) the loss scale
//! from one-value buffers, and the flow's parameters from a private copy refreshed when the trainer's change. It writes
//! the outputs' gradients into the outputs' own buffers (the network backward graph's seeds:
//! every read of the outputs comes before them on the stream), the flow's gradients into one
//! flat buffer, and the loss, its logged items and the four counts of [`Reached::of_counts`]
//! into one small buffer, read back once per step: which outputs the loss reached is decided on
//! the host from those counts, outside the graph, as the native device path decides it.

use super::copy::{copy_of, cube, write};
use super::recorder::{Graph, PoolUse, RecordError, pool_use, replay};
use super::sources::{Sources, private_copies};
use super::stage::outputs_of;
use crate::data::Instance;
use crate::loss::assign::device::ObjectSlots;
use crate::loss::{E2eLoss, LossConstants, Reached};
use crate::model::flow::RealNvp;
use crate::optim::grads::{FlatGrads, get_flat};
use crate::optim::groups::{ParamInfo, param_table};
use crate::optim::layout::Layout;
use crate::optim::tensors::{float_tensors, replace_float_tensors};
use burn::backend::{Backend, Dispatch};
use burn::optim::GradientsParams;
use burn::prelude::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

static FLOW_SEGMENTS: AtomicBool = AtomicBool::new(true);

/// Whether later recorded losses keep the flow's parameters as segments of one buffer laid out
/// as the flat optimizer lays them out (`true`, the default), so that the refresh before each
/// replay copies the trainer's parameters, views of one run of the optimizer's values, in one
/// launch, or each in its own buffer (`false`; `bench-step --flow-segments false`), one copy
/// per tensor: 72 launches a step for the seed's flow (docs/perf_log.md BH2's trace, BI2).
pub fn choose_flow_segments(on: bool) {
    FLOW_SEGMENTS.store(on, Ordering::Relaxed);
}

/// Eager runs of the loss and its backward before recording: they settle every allocation the
/// recorded launches will reuse (nothing may be allocated inside the window).
const WARMUPS: usize = 3;

/// Values in the results buffer: the loss, its six logged items, the four counts.
const RESULTS: usize = 11;

/// A replay of the recorded loss whose results are still on the device: the trainer replays the
/// network's backward first and then [`PendingLoss::read`]s them, so the readback's wait and
/// the host's work after it no longer stand between the two graphs on the GPU. (The results
/// buffer is rewritten by the next loss replay only.)
pub struct PendingLoss {
    results: Tensor<1>,
    flow: Option<FlatGrads>,
    /// The results' copy to the host, enqueued by [`PendingLoss::detached`]: waiting for it
    /// waits for the work queued before it only, not for the next step's replay queued after.
    copied: Option<HostCopy>,
}

/// The bytes a device-to-host copy resolves to.
type Read = Result<burn_cubecl::cubecl::bytes::Bytes, burn_cubecl::cubecl::server::ServerError>;

/// A device-to-host copy already enqueued on the stream, resolved by the fence that follows it
/// (cubecl-server's `read_async`). CubeCL's read borrows the client it was asked through, so
/// the copy keeps that client beside it.
struct HostCopy {
    /// Declared first, so dropped first: it borrows `*client`.
    read: std::pin::Pin<Box<dyn std::future::Future<Output = Read> + Send>>,
    /// On the heap, where it stays put however the struct moves.
    _client: Box<burn_cubecl::cubecl::client::Client>,
}

impl HostCopy {
    /// The copy of `t` to the host enqueued now, behind the work queued so far. Burn's own
    /// read is lazy on this runtime (`read_lazy_async`): its copy would be enqueued only when
    /// the bytes are first touched, behind whatever was queued by then.
    fn of(t: &Tensor<1>) -> Self {
        let c = cube(t.clone());
        let descriptor = burn_cubecl::cubecl::server::CopyDescriptor::new(
            c.handle.clone().binding(),
            c.meta.shape().clone(),
            c.meta.strides().clone(),
            c.elem_size(),
        );
        let client = Box::new(c.client.clone());
        let read: std::pin::Pin<Box<dyn std::future::Future<Output = Read> + Send + '_>> =
            Box::pin(client.read_one_tensor_async(descriptor));
        // SAFETY: `read` borrows `*client` only. That value lives on the heap, where moving the
        // `Box` (or this struct) leaves it, and it is dropped after `read` (field order), so the
        // borrow outlives every use of the future; only the lifetime changes, not the type.
        let read = unsafe {
            std::mem::transmute::<
                std::pin::Pin<Box<dyn std::future::Future<Output = Read> + Send + '_>>,
                std::pin::Pin<Box<dyn std::future::Future<Output = Read> + Send + 'static>>,
            >(read)
        };
        Self {
            read,
            _client: client,
        }
    }

    /// The FP32 values, once the copy has landed.
    fn wait(self) -> Vec<f32> {
        // The future is consumed, and dropped, here: before the client it borrows.
        let bytes = burn_cubecl::cubecl::future::block_on(self.read)
            .unwrap_or_else(|e| panic!("reading the recorded loss back failed: {e:?}"));
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }
}

impl PendingLoss {
    /// The same results and flow gradients on buffers of their own (copies queued now, the
    /// same bits), so that the next replay may rewrite the graph's before these are read
    /// (`replay.defer_readback`); the results' copy to the host is enqueued now too, so that
    /// reading them after the next step's replay is queued does not wait for that replay.
    pub fn detached(self) -> Self {
        let results = copy_of(self.results);
        let copied = (results.dtype() == burn::tensor::DType::F32).then(|| HostCopy::of(&results));
        Self {
            results,
            flow: self.flow.map(FlatGrads::detached),
            copied,
        }
    }

    /// The flow's gradients (pose): a buffer the step's graph writes, readable once
    /// [`PendingLoss::read`] has waited for it; views of it may be made before.
    pub fn flow(&self) -> Option<&FlatGrads> {
        self.flow.as_ref()
    }

    /// Waits for the replay's loss items and counts.
    pub fn read(self) -> RecordedLoss {
        let v: Vec<f32> = match self.copied {
            Some(copy) => copy.wait(),
            None => self
                .results
                .into_data()
                .convert::<f32>()
                .try_into_vec()
                .expect("f32 results"),
        };
        RecordedLoss {
            items: [v[1], v[2], v[3], v[4], v[5], v[6]],
            reached: Reached::of_counts([v[7], v[8], v[9], v[10]]),
            flow: self.flow,
        }
    }
}

/// What one replay of the recorded loss gives the trainer.
pub struct RecordedLoss {
    /// The one-to-one terms × gains, as the native path logs them.
    pub items: [f32; 6],
    pub reached: Reached,
    /// The flow's gradients (pose), on a buffer of their own.
    pub flow: Option<FlatGrads>,
}

/// What the recorded loss reads and writes besides the network's outputs: the batch's objects,
/// the ProgLoss weight, FP16's loss scale, the constants, the private flow and its gradients,
/// the results. Both recordings use it: [`LossGraph`] (a graph of its own) and the one-window
/// step (`replay::record::record_step`).
pub struct LossInputs {
    /// Images and object slots per image the inputs were made for.
    batch: usize,
    slots: usize,
    keypoints: usize,
    /// `[B, slots, 6 + 3K]`: the batch's objects, rewritten before every replay.
    objects: Tensor<3>,
    /// `[1]`: the one-to-many weight (ProgLoss), rewritten before every replay.
    weight: Tensor<1>,
    /// `[1]`: FP16's loss scale (the loss is multiplied by it before its backward), rewritten
    /// before every replay; `None` without loss scaling.
    scale: Option<Tensor<1>>,
    /// The anchors and keypoint rows the graph reads.
    constants: LossConstants,
    /// A private copy of the flow with its own buffers and the trainer's parameter ids, so its
    /// gradients key like the trainer's.
    flow: Option<RealNvp>,
    /// The static buffers of every float tensor of `flow`.
    flow_sources: Sources,
    /// `[RESULTS]`: the loss, the items, the counts.
    results: Tensor<1>,
    flow_params: Vec<ParamInfo>,
    flow_layout: Layout,
    flow_grads: Tensor<1>,
}

impl LossInputs {
    /// The buffers for a batch of `labels` with at least `loss.object_slots` slots, the flow
    /// `flow` (pose) and the loss scale `scale` (FP16; `None`: not scaled), on `device`'s inner
    /// device.
    pub fn prepare(
        loss: &E2eLoss,
        labels: &[Vec<Instance>],
        flow: Option<&RealNvp>,
        scale: Option<f32>,
        device: &Device,
    ) -> Self {
        let inner = device.clone().inner();
        let (batch, keypoints) = (labels.len(), loss.sigmas.len());
        let slots = ObjectSlots::slots_for(labels, loss.object_slots);
        let segments = FLOW_SEGMENTS.load(Ordering::Relaxed);
        let mut shared = None;
        let flow = flow.map(|f| {
            let net = f.valid().train();
            let tensors = float_tensors(&f.valid());
            let mut copies: HashMap<String, Tensor<1>> = if segments {
                let (copies, params) = private_copies(&net, tensors, None, &inner);
                shared = params;
                copies
            } else {
                tensors.into_iter().map(|(p, t)| (p, copy_of(t))).collect()
            };
            replace_float_tensors(net, &mut copies).0
        });
        let flow_params = flow.as_ref().map(param_table).unwrap_or_default();
        let flow_layout = Layout::new(flow_params.iter().map(ParamInfo::numel).collect());
        let flow_sources = flow
            .as_ref()
            .map(|f| float_tensors(&f.valid()))
            .unwrap_or_default();
        Self {
            batch,
            slots,
            keypoints,
            objects: copy_of(ObjectSlots::upload(labels, slots, keypoints, &inner)),
            weight: copy_of(Tensor::<1>::from_floats([loss.one2many_weight], &inner)),
            scale: scale.map(|s| copy_of(Tensor::<1>::from_floats([s], &inner))),
            constants: loss.constants(device),
            flow,
            flow_sources: Sources::with_shared(flow_sources, shared),
            results: Tensor::<1>::zeros([RESULTS], &inner),
            flow_grads: Tensor::<1>::zeros([flow_layout.len.max(1)], &inner),
            flow_params,
            flow_layout,
        }
    }

    /// Whether these inputs' shapes fit a batch of `labels` with at least `min_slots` slots.
    pub fn fits(&self, labels: &[Vec<Instance>], min_slots: usize) -> bool {
        labels.len() == self.batch && ObjectSlots::slots_for(labels, min_slots) == self.slots
    }

    /// The device loss on `leaves` (autodiff leaves over the network's outputs, in
    /// `replay::stage::flatten_outputs` order) and its backward: the results row and the
    /// flow's gradients written into their buffers. Returns each leaf's gradient (`None` where
    /// the loss left one without) and whether every flow parameter got one.
    pub(super) fn run(
        &self,
        loss: &E2eLoss,
        leaves: &[Tensor<4>],
    ) -> (Vec<Option<Tensor<4>>>, bool) {
        let out = outputs_of(leaves);
        let slots =
            ObjectSlots::from_packed(Tensor::from_inner(self.objects.clone()), self.keypoints);
        let w = Tensor::<1>::from_inner(self.weight.clone());
        let (value, counts) = loss.dense_loss(&out, &slots, &self.constants, w, self.flow.as_ref());
        // The scale as a tensor, not a scalar: a scalar would be frozen into the graph. The
        // product is the native path's `loss * scale` (`LossScaler::scale_loss`), bit for bit.
        let grads = match &self.scale {
            Some(s) => (value.total.clone() * Tensor::<1>::from_inner(s.clone())).backward(),
            None => value.total.clone().backward(),
        };
        let row = Tensor::cat(
            vec![value.total.inner(), value.items.inner(), counts.inner()],
            0,
        );
        write(row, &self.results);
        let seeds = leaves.iter().map(|l| l.grad(&grads)).collect();
        let mut complete = true;
        if let Some(f) = &self.flow {
            let all = GradientsParams::from_grads(grads, f);
            let parts: Vec<Option<Tensor<1>>> =
                self.flow_params.iter().map(|p| get_flat(&all, p)).collect();
            if parts.iter().all(Option::is_some) {
                self.flow_layout.gather_into(&parts, &self.flow_grads);
            } else {
                complete = false;
            }
        }
        (seeds, complete)
    }

    /// Before a replay: the objects of `labels` (which must [`LossInputs::fits`]), the
    /// one-to-many weight `weight` and the loss scale `scale` (each `None`: the one it holds;
    /// only the `FrozenLossWeight` and `FrozenLossScale` negative controls pass that) and the
    /// trainer's flow `flow` written into the buffers the graph reads.
    pub fn write(
        &mut self,
        labels: &[Vec<Instance>],
        weight: Option<f32>,
        scale: Option<f32>,
        flow: Option<&RealNvp>,
        device: &Device,
    ) {
        let inner = device.clone().inner();
        write(
            ObjectSlots::upload(labels, self.slots, self.keypoints, &inner),
            &self.objects,
        );
        if let Some(w) = weight {
            write(Tensor::<1>::from_floats([w], &inner), &self.weight);
        }
        if let (Some(s), Some(buffer)) = (scale, &self.scale) {
            write(Tensor::<1>::from_floats([s], &inner), buffer);
        }
        if let Some(f) = flow {
            self.flow_sources.refresh(f, false, None);
        }
    }

    /// After a replay: its results, still on the device, and a copy of the flow's gradients.
    pub fn pending(&self) -> PendingLoss {
        PendingLoss {
            copied: None,
            results: self.results.clone(),
            flow: (!self.flow_params.is_empty()).then(|| FlatGrads {
                params: self.flow_params.clone(),
                layout: self.flow_layout.clone(),
                buf: copy_of(self.flow_grads.clone()),
                copy: None,
            }),
        }
    }

    /// How many object slots per image the inputs hold.
    pub fn slots(&self) -> usize {
        self.slots
    }
}

/// The recorded loss as a graph of its own, and every buffer it reads or writes, kept alive as
/// long as the graph.
pub struct LossGraph {
    graph: Graph,
    inputs: LossInputs,
    /// The device's memory pool before recording and after it.
    pub(super) growth: [PoolUse; 2],
}

impl LossGraph {
    /// Whether this graph's shapes fit a batch of `labels` with at least `min_slots` slots.
    pub fn fits(&self, labels: &[Vec<Instance>], min_slots: usize) -> bool {
        self.inputs.fits(labels, min_slots)
    }

    /// Records the loss of `labels` on the network outputs `outputs` (the forward graph's output
    /// buffers, on the inner device, in `replay::stage::flatten_outputs` order) with the flow
    /// `flow` (pose), the objects in `loss.object_slots` slots at least, and the loss scaled
    /// by `scale` before its backward (FP16's loss scale; `None`: not scaled).
    pub fn record(
        loss: &E2eLoss,
        outputs: &[Tensor<4>],
        labels: &[Vec<Instance>],
        flow: Option<&RealNvp>,
        scale: Option<f32>,
        device: &Device,
    ) -> Result<Self, RecordError> {
        let err = |what: &str, e: &dyn std::fmt::Debug| RecordError(format!("{what}: {e:?}"));
        let inner = device.clone().inner();
        let dispatch = inner.as_dispatch();
        let before = pool_use(&inner);
        let inputs = LossInputs::prepare(loss, labels, flow, scale, device);
        let scratch: Vec<Tensor<4>> = outputs
            .iter()
            .map(|o| copy_of(Tensor::<4>::zeros(o.dims(), &inner)))
            .collect();
        // Whether every output and flow parameter got a gradient, each output's written into
        // its seed.
        let run = |seeds: &[Tensor<4>]| -> bool {
            let leaves: Vec<Tensor<4>> = outputs
                .iter()
                .map(|o| Tensor::<4>::from_inner(o.clone()).require_grad())
                .collect();
            let (grads, mut complete) = inputs.run(loss, &leaves);
            for (g, seed) in grads.into_iter().zip(seeds) {
                match g {
                    Some(g) => write(g, seed),
                    None => complete = false,
                }
            }
            complete
        };

        Dispatch::graph_prepare(dispatch).map_err(|e| err("prepare loss", &e))?;
        for _ in 0..WARMUPS {
            let complete = run(&scratch);
            inner.sync().map_err(|e| err("loss warm-up sync", &e))?;
            if !complete {
                return Err(RecordError(
                    "the device loss left an output or a flow parameter without a gradient".into(),
                ));
            }
        }
        drop(scratch);
        inner.sync().map_err(|e| err("sync", &e))?;
        Dispatch::graph_start_capture(dispatch).map_err(|e| err("start loss capture", &e))?;
        let complete = run(outputs);
        let graph = Dispatch::graph_stop_capture(dispatch).map_err(|e| err("loss capture", &e))?;
        inner
            .sync()
            .map_err(|e| err("sync after loss capture", &e))?;
        if !complete {
            return Err(RecordError(
                "the recorded loss left an output or a flow parameter without a gradient".into(),
            ));
        }
        Ok(Self {
            graph,
            inputs,
            growth: [before, pool_use(&inner)],
        })
    }

    /// Replays the loss on the outputs the forward graph last wrote, with the inputs
    /// [`LossInputs::write`] takes; the outputs' buffers then hold their gradients.
    pub fn replay(
        &mut self,
        labels: &[Vec<Instance>],
        weight: Option<f32>,
        scale: Option<f32>,
        flow: Option<&RealNvp>,
        device: &Device,
    ) -> PendingLoss {
        self.inputs.write(labels, weight, scale, flow, device);
        replay(device, &self.graph);
        self.inputs.pending()
    }
}
