//! One training step ([`Trainer::train_step`]): forward, loss and backward — the loss in Burn
//! autodiff or recorded (`replay.scope = "step"`) — then accumulation, the optimizer and the EMA.

use super::*;
use crate::train::spans::{Span, time};

impl Trainer {
    /// The loss and the backward in Burn autodiff (the stage's own backward from the seeds
    /// the loss sends to its outputs): the step's gradients, the buffer the stage's are views
    /// of, and the logged items (still on the device).
    fn loss_and_backward(
        &mut self,
        out: &HeadOutput,
        features: StageOutputs,
        labels: &[Vec<Instance>],
        clock: &mut PhaseClock,
    ) -> (GradientsParams, Vec<FlatGrads>, Items) {
        let flow = self.model.head.flow.as_ref();
        let loss = match self.cfg.train.loss_on {
            LossOn::Host => {
                let targets = self.loss.targets(out, labels);
                clock.mark(Phase::Assign);
                self.loss.compute(out, &targets, flow)
            }
            LossOn::Device => {
                clock.mark(Phase::Assign);
                self.loss.compute_on_device(out, labels, flow)
            }
        };
        clock.mark(Phase::Loss);
        let total = match &self.scaler {
            Some(s) => s.scale_loss(loss.total),
            None => loss.total,
        };
        let head_grads = total.backward();
        clock.mark(Phase::HeadBackward);
        let reached = loss.reached;
        let (stage_grads, flat) =
            self.stage
                .backward(&self.model, features, &head_grads, reached.as_ref());
        let mut grads = GradientsParams::from_grads(head_grads, &self.model);
        if let Some(r) = &reached {
            drop_unreached(&mut grads, &self.model, r);
        }
        merge(&mut grads, stage_grads, &self.optimizer.table);
        clock.mark(Phase::FeatureBackward);
        let items = match loss.items_read {
            Some(v) => Items::Read(v),
            None => Items::OnDevice(Box::new(loss.items)),
        };
        (grads, flat.into_iter().collect(), items)
    }

    /// The recorded loss and backward of `labels` (`replay.scope = "step"`) replayed: their
    /// results still on the device. `detach`: on buffers of their own (copies queued behind
    /// the replay), so the step can be finished after the next one's replay
    /// (`replay.defer_readback`).
    #[cfg(feature = "cuda")]
    fn launch_recorded(
        &mut self,
        features: StageOutputs,
        labels: &[Vec<Instance>],
        clock: &mut PhaseClock,
        detach: bool,
        walked: Option<Vec<Tensor<1>>>,
    ) -> Result<Launched, crate::replay::recorder::Unrecorded> {
        clock.mark(Phase::Assign);
        let scale = self.scaler.as_ref().map(|s| s.scale);
        let pending = self.stage.recorded_loss(
            &mut self.model,
            features,
            &self.loss,
            labels,
            scale,
            walked,
        )?;
        clock.mark(Phase::Loss);
        clock.mark(Phase::HeadBackward);
        let grads = self.stage.recorded_grads();
        Ok(if detach && !self.stage.control().reads_late_in_place() {
            Launched {
                grads: grads.detached(),
                pending: pending.detached(),
            }
        } else {
            Launched { grads, pending }
        })
    }

    /// `train.loss_on = "device"` on one device: the device loss's object slots per image only
    /// grow during a fit (from `train.object_slots`): a batch with fewer objects than an
    /// earlier one keeps the larger count, so the step scope records the step again only for a
    /// batch that holds more objects than any before it, not whenever the count changes. The
    /// native loop takes the same count, so the two stay byte-identical; the count is training
    /// state (hashed, checkpointed). With a data-parallel group each rank would grow its own
    /// count from its own slice, so the count stays each batch's own there, as before.
    fn grow_object_slots(&mut self, labels: &[Vec<Instance>]) {
        if self.cfg.train.loss_on == LossOn::Device && self.collective.is_none() {
            self.loss.object_slots =
                crate::loss::assign::device::ObjectSlots::slots_for(labels, self.loss.object_slots);
        }
    }

    /// A step the recorder could not record: replay is off from here on (the reason logged
    /// and kept in [`Trainer::replay_off`]), and this step's stage runs natively on its images,
    /// which nothing has read yet, so the fit stays byte-identical to a native one.
    #[cfg(feature = "cuda")]
    fn fall_back(&mut self, unrecorded: crate::replay::stage::Unrecorded) -> StageOutputs {
        let why = format!("the step could not be recorded ({})", unrecorded.error);
        eprintln!("feature replay off: {why}; the network runs natively from this step on");
        self.stage = Stage::Native(self.cfg.replay_scope());
        self.replay_off = Some(why);
        let _reduced = autocast(self.cfg.train.precision.compute_dtype());
        let native = self.stage.forward(&mut self.model, *unrecorded.images);
        native.expect("a native stage records nothing")
    }

    /// Without CUDA nothing is recorded, so nothing falls back.
    #[cfg(not(feature = "cuda"))]
    fn fall_back(&mut self, unrecorded: crate::replay::stage::Unrecorded) -> StageOutputs {
        match unrecorded {}
    }

    /// [`Trainer::loss_and_backward`] from a [`Trainer::launch_recorded`] replay: its items are
    /// read back with the counts that decide which gradients are present (after the network's
    /// backward is queued).
    #[cfg(feature = "cuda")]
    fn finish_recorded(
        &mut self,
        launched: Launched,
        clock: &mut PhaseClock,
    ) -> (GradientsParams, Vec<FlatGrads>, Items) {
        // The flow's views before the read waits, as the network's are made.
        let mut grads = GradientsParams::new();
        if let Some(f) = launched.pending.flow() {
            f.put_views(&mut grads);
        }
        let (stage_grads, flat, recorded) =
            self.stage
                .recorded_backward(&self.model, launched.grads, launched.pending);
        drop_unreached(&mut grads, &self.model, &recorded.reached);
        merge(&mut grads, stage_grads, &self.optimizer.table);
        // Where the loss reached the flow (all its gradients kept), they accumulate as one
        // buffer too.
        let flow = recorded.flow.filter(|f| {
            f.params
                .iter()
                .all(|p| grads::get_flat(&grads, p).is_some())
        });
        clock.mark(Phase::FeatureBackward);
        let flats = flat.into_iter().chain(flow).collect();
        (grads, flats, Items::Read(recorded.items))
    }

    /// The step [`Trainer::queue_step`] left queued, if any, finished: its loss read back, its
    /// gradients accumulated (it ended without an optimizer step), its items logged and given.
    pub fn finish_queued(&mut self) -> Option<[f32; 6]> {
        #[cfg(feature = "cuda")]
        if let Some(launched) = self.queued.take() {
            let mut clock = PhaseClock::new(None, &self.device);
            let (grads, flats, items) = self.finish_recorded(launched, &mut clock);
            self.accumulate(grads, flats, true);
            let items = items.read();
            self.step_losses.push(items);
            return Some(items);
        }
        None
    }

    /// `replay.shared_parameters`, before the recording: the optimizer's flat buffers gathered
    /// now (`Optimizer::pin`; the model's parameters become views of them, with the same
    /// values) and handed to the stage, whose graphs then read them in place.
    fn share_parameters(&mut self) {
        self.model = self.optimizer.pin(self.model.clone());
        if let Some((layout, values)) = self.optimizer.pinned() {
            self.stage
                .share_parameters(&self.optimizer.table, layout, values);
        }
    }

    /// [`Trainer::train_step`], timed between device syncs when [`Trainer::timing`] is set.
    pub fn timed_step(&mut self, batch: &Batch) -> Result<[f32; 6], TrainError> {
        if self.timing.is_none() {
            return Ok(self.train_step(batch));
        }
        let sync = |d: &Device| {
            d.sync()
                .map_err(|e| TrainError::Setup(format!("device sync failed: {e:?}")))
        };
        sync(&self.device)?;
        let start = std::time::Instant::now();
        let events = self.timing.as_ref().is_some_and(|t| t.events) && !self.stage.records_next();
        let (items, window) = if events {
            let device = self.device.clone();
            let (items, window) = device
                .profile(|| self.train_step(batch))
                .map_err(|e| TrainError::Setup(format!("device profiling failed: {e:?}")))?;
            (items, Some(window))
        } else {
            (self.train_step(batch), None)
        };
        sync(&self.device)?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        let event_ms = window.map(|w| {
            burn::tensor::read_sync(w.resolve())
                .map_or(f64::NAN, |ticks| ticks.duration().as_secs_f64() * 1e3)
        });
        let usage = self.pool_usage();
        let t = self.timing.as_mut().expect("checked above");
        t.push_step(ms, usage);
        if t.events {
            t.event_ms.push(event_ms.unwrap_or(f64::NAN));
        }
        Ok(items)
    }

    /// One micro-batch: forward, assignment, loss, backward, and — when enough micro-batches
    /// are accumulated — clip, optimizer step and EMA update. Returns the logged loss items.
    pub fn train_step(&mut self, batch: &Batch) -> [f32; 6] {
        let mut done = self.step(batch, None, false);
        done.pop()
            .expect("a step that is not left queued is finished")
    }

    /// [`Trainer::train_step`], except that with `replay.defer_readback` (and no timing, no
    /// data-parallel group) a replayed step that ends without an optimizer step is left
    /// queued: its loss is read back and its gradients accumulated by the next call, once that
    /// call's replay is queued behind it, or by [`Trainer::finish_queued`]. `next`: the batch
    /// the next call will bring, whose images a recorded step makes while its graph runs
    /// (`replay.upload_ahead`). Returns the logged items of every step this call finished,
    /// oldest first.
    pub fn queue_step(&mut self, batch: &Batch, next: Option<&Batch>) -> Vec<[f32; 6]> {
        // Only a recorded loss is read late, and never on the step that records it.
        let defer = self.cfg.defer_readback()
            && !self.steps_synced()
            && self.collective.is_none()
            && self.stage.records_loss()
            && !self.stage.records_next();
        self.step(batch, next, defer)
    }

    /// [`Trainer::queue_step`], its call timed by the host's clock alone when
    /// [`StepTiming::unsynced`](super::StepTiming::unsynced) (with the pool's bytes after it).
    pub fn paced_step(&mut self, batch: &Batch, next: Option<&Batch>) -> Vec<[f32; 6]> {
        let start = std::time::Instant::now();
        let done = self.queue_step(batch, next);
        let ms = start.elapsed().as_secs_f64() * 1e3;
        if self.timing.as_ref().is_some_and(|t| t.unsynced) {
            let usage = self.pool_usage();
            let t = self.timing.as_mut().expect("checked above");
            t.push_step(ms, usage);
        }
        done
    }

    /// Whether every step is timed between device syncs ([`Trainer::timing`] set, and not
    /// [`StepTiming::unsynced`](super::StepTiming::unsynced)): such steps read at once.
    pub(super) fn steps_synced(&self) -> bool {
        self.timing.as_ref().is_some_and(|t| !t.unsynced)
    }

    /// The memory pool's bytes in use and reserved now (`None` without a pool).
    fn pool_usage(&self) -> Option<(u64, u64)> {
        self.device
            .memory_pool_usage()
            .map(|u| (u.bytes_in_use, u.bytes_reserved))
    }

    /// The images of `batch` on the device: those [`Trainer::upload_ahead`] made, when it made
    /// them of this batch, else uploaded and augmented now (the phases marked on `clock`).
    fn images(&mut self, batch: &Batch, clock: &mut PhaseClock) -> Tensor<4> {
        #[cfg(feature = "cuda")]
        if let Some(ahead) = self.ahead.take()
            && ahead.key == batch.key()
        {
            clock.mark(Phase::Upload);
            self.uploaded_ahead += 1;
            return ahead.images;
        }
        let how = self.timing.as_ref().map(|t| t.upload).unwrap_or_default();
        let pixels = batch.upload(&self.device, how);
        clock.mark(Phase::Upload);
        batch.augment(pixels)
    }

    /// `replay.upload_ahead`: `next`'s images made now, behind the graph just queued, for
    /// the next step to take ([`Trainer::images`]). With the negative control
    /// `Control::AheadOfThisBatch` it makes `current`'s instead, under `next`'s key.
    #[cfg(feature = "cuda")]
    fn upload_ahead(&mut self, current: &Batch, next: &Batch) {
        let of = if self.stage.control().uploads_this_batch_ahead() {
            current
        } else {
            next
        };
        let _reduced = autocast(self.cfg.train.precision.compute_dtype());
        let how = self.timing.as_ref().map(|t| t.upload).unwrap_or_default();
        let images = of.augment(of.upload(&self.device, how));
        self.ahead = Some(Ahead {
            key: next.key(),
            images,
        });
    }

    fn step(&mut self, batch: &Batch, next: Option<&Batch>, defer: bool) -> Vec<[f32; 6]> {
        let labels: Vec<Vec<Instance>> =
            batch.samples.iter().map(|s| s.instances.clone()).collect();
        self.grow_object_slots(&labels);
        let mut clock = PhaseClock::new(self.timing.as_ref(), &self.device);
        // The last step's walk serves this step only, and only while the model keeps the
        // tensors it found.
        #[cfg(feature = "cuda")]
        let mut walked = self.walked.take();
        if self.cfg.replay.shared_parameters && self.stage.records_next() {
            self.share_parameters();
            #[cfg(feature = "cuda")]
            {
                walked = None;
            }
        }
        let dtype = self.cfg.train.precision.compute_dtype();
        let features = {
            let _reduced = autocast(dtype);
            let images = time(Span::Images, || self.images(batch, &mut clock));
            clock.mark(Phase::Augment);
            let features = time(Span::Stage, || self.stage.forward(&mut self.model, images));
            // Nothing of the step has run where the stage could not be recorded: natively.
            let features = features.unwrap_or_else(|unrecorded| self.fall_back(unrecorded));
            clock.mark(Phase::Features);
            features
        };
        let stepped =
            self.ni as i64 - self.last_opt_step >= self.schedule.accumulate(self.ni) as i64;
        // Left queued: a step without an optimizer step, whose update would have to precede
        // the next forward.
        let queue = defer && !stepped;
        let mut done = Vec::new();
        // The recorded loss reads the outputs' buffers itself: no head view of them.
        #[cfg(feature = "cuda")]
        let path = if self.stage.records_loss() {
            clock.mark(Phase::Head);
            match time(Span::Loss, || {
                self.launch_recorded(features, &labels, &mut clock, queue, walked)
            }) {
                Ok(launched) => LossPath::Recorded(Box::new(launched)),
                // Nothing of the step has run: it runs natively below.
                Err(unrecorded) => LossPath::Native(self.fall_back(unrecorded)),
            }
        } else {
            LossPath::Native(features)
        };
        #[cfg(not(feature = "cuda"))]
        let path = {
            let _ = (queue, next);
            LossPath::Native(features)
        };
        let (mut grads, mut flats, items) = match path {
            #[cfg(feature = "cuda")]
            LossPath::Recorded(launched) => {
                // Read at once, this step waits for its graph below: the next batch's upload
                // and augmentation go behind the graph first, so the GPU runs them then
                // instead of idling while the next step starts.
                if let Some(next) = next.filter(|_| !queue && self.cfg.upload_ahead()) {
                    time(Span::Ahead, || self.upload_ahead(batch, next));
                }
                // The step queued before this one accumulates first, while this one runs.
                done.extend(time(Span::Read, || self.finish_queued()));
                if queue {
                    self.queued = Some(*launched);
                    self.read_late += 1;
                    if let Some(t) = self.timing.as_mut() {
                        t.optimizer_step.push(false);
                    }
                    self.ni += 1;
                    return done;
                }
                // On one device nothing replaces the model's tensors before the recorded
                // update, which writes them in place: one walk while the graph runs, not while
                // the GPU waits, finds the EMA's sources and the next step's.
                if stepped
                    && self.collective.is_none()
                    && self.cfg.record_update()
                    && crate::replay::update::early()
                {
                    self.walked = Some(time(Span::Walk, || {
                        crate::optim::tensors::float_values(&self.model)
                    }));
                }
                time(Span::Read, || self.finish_recorded(*launched, &mut clock))
            }
            LossPath::Native(features) => {
                let out = {
                    let _reduced = autocast(dtype);
                    features.head(&self.model.head)
                };
                clock.mark(Phase::Head);
                let r = self.loss_and_backward(&out, features, &labels, &mut clock);
                done.extend(self.finish_queued());
                r
            }
        };
        if let Some(c) = &self.collective {
            grads = all_reduce_grads(c.as_ref(), grads, &self.optimizer.table, &self.device);
            flats.clear();
            // Before the optimizer step, so the EMA copies rank 0's statistics too.
            self.model = broadcast_buffers(c.as_ref(), self.model.clone(), &self.device);
        }
        time(Span::Accumulate, || self.accumulate(grads, flats, !stepped));
        let queued = if stepped {
            self.last_opt_step = self.ni as i64;
            Some(self.optimizer_and_ema(&mut clock))
        } else {
            clock.mark(Phase::Optimizer);
            clock.mark(Phase::Ema);
            None
        };
        self.ni += 1;
        let items = time(Span::Settle, || {
            if let Some(q) = queued {
                self.settle(q);
            }
            items.read()
        });
        clock.mark(Phase::Readback);
        if let Some(t) = self.timing.as_mut() {
            t.optimizer_step.push(stepped);
            if clock.device.is_some() {
                t.phase_ms.push(clock.ms);
            }
            if let Some(bytes) = clock.in_use {
                t.in_step.push(bytes);
                t.in_step_padding.push(clock.padding);
            }
        }
        self.step_losses.push(items);
        done.push(items);
        done
    }
}

/// Where a step's loss and backward run after its forward.
enum LossPath {
    /// In Burn autodiff, from the stage's outputs (the stage native, or replaying the features
    /// or the network, or a step that could not be recorded).
    Native(StageOutputs),
    /// Recorded (`replay.scope = "step"`), replayed already.
    #[cfg(feature = "cuda")]
    Recorded(Box<Launched>),
}

/// A replay of the recorded loss and backward whose results are still on the device
/// ([`Trainer::launch_recorded`]).
#[cfg(feature = "cuda")]
pub(crate) struct Launched {
    /// The network's parameter gradients (the recorder's buffer, or a copy of it).
    grads: FlatGrads,
    pending: crate::replay::loss::PendingLoss,
}

/// The next batch's images, made on the device while a recorded step's graph ran
/// ([`Trainer::upload_ahead`]), and the key of the batch they were made for.
#[cfg(feature = "cuda")]
pub(crate) struct Ahead {
    key: crate::data::batch::BatchKey,
    images: Tensor<4>,
}

/// A step's logged loss items: read back already, or still on the device.
enum Items {
    Read([f32; 6]),
    OnDevice(Box<Tensor<1>>),
}

impl Items {
    /// The values (one read from the device for `OnDevice`).
    fn read(self) -> [f32; 6] {
        match self {
            Items::Read(v) => v,
            Items::OnDevice(t) => {
                let v: Vec<f32> = (*t)
                    .into_data()
                    .convert::<f32>()
                    .try_into_vec()
                    .expect("f32 items");
                [v[0], v[1], v[2], v[3], v[4], v[5]]
            }
        }
    }
}
