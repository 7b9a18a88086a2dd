//! The optimizer step and the EMA update of a [`Trainer`] (recorded or eager), the gradients'
//! accumulation before it, and the walk of the model a recorded step keeps for the next one.

use super::*;

impl Trainer {
    /// An optimizer step (clip, update, EMA) now, whatever the accumulation count says; for
    /// `burnpose warmup`, which only needs the kernels it runs.
    pub fn force_optimizer_step(&mut self) {
        let stepped = self.optimizer_update();
        self.ema.update(&self.model);
        self.settle(stepped);
        self.last_opt_step = self.ni as i64;
    }

    /// Unscale, clip and update with the accumulated gradients, queued; the caller updates the
    /// EMA, then [`Trainer::settle`]s the step. A skipped FP16 step (a gradient not finite)
    /// leaves parameters and optimizer state as they are; the EMA is still updated, as
    /// Ultralytics' `optimizer_step` does.
    pub(super) fn optimizer_update(&mut self) -> Stepped {
        let grads = self.pending.take().unwrap_or_default();
        self.pending_flat.clear();
        let hyper = self.schedule.hyper(self.epoch, self.ni);
        let scale = self.scaler.as_ref().map(|s| s.scale);
        let model = self.model.clone();
        let (model, stepped) =
            self.optimizer
                .step_scaled(model, grads, &hyper, self.cfg.optim.clip_norm, scale);
        self.model = model;
        stepped
    }

    /// The optimizer step and the EMA update (`replay.record_update`: through their recorded
    /// graph once both write in place; eagerly before), each phase marked on `clock`.
    pub(super) fn optimizer_and_ema(&mut self, clock: &mut PhaseClock) -> Stepped {
        #[cfg(feature = "cuda")]
        if self.cfg.record_update() && self.stage.is_replay() {
            let grads = self.pending.take().unwrap_or_default();
            let hyper = self.schedule.hyper(self.epoch, self.ni);
            let inputs = crate::replay::update::UpdateInputs {
                model: &self.model,
                grads,
                hyper: &hyper,
                clip_norm: self.cfg.optim.clip_norm,
                loss_scale: self.scaler.as_ref().map(|s| s.scale),
                walked: self.walked.as_deref(),
                flats: std::mem::take(&mut self.pending_flat),
            };
            match self
                .stage
                .recorded_update(&mut self.optimizer, &mut self.ema, inputs)
            {
                Ok(stepped) => {
                    self.pending_flat.clear();
                    clock.mark(Phase::Optimizer);
                    clock.mark(Phase::Ema);
                    return stepped;
                }
                Err(grads) => self.pending = Some(grads),
            }
        }
        // The eager update gives the model new tensors.
        #[cfg(feature = "cuda")]
        if !self.stage.control().keeps_walk() {
            self.forget_walk();
        }
        let stepped = self.optimizer_update();
        clock.mark(Phase::Optimizer);
        self.ema.update(&self.model);
        clock.mark(Phase::Ema);
        stepped
    }

    /// Drops the model's walk made for the next step ([`Trainer`]'s `walked`): the model's
    /// tensors may be replaced before it. Nothing to drop without CUDA.
    pub(in crate::train) fn forget_walk(&mut self) {
        #[cfg(feature = "cuda")]
        {
            self.walked = None;
        }
    }

    /// Learns whether the queued optimizer step counted (FP16: its gradients were finite; read
    /// from the device after the EMA is queued, so nothing waits between the backward and the
    /// update) and moves the loss scale accordingly.
    pub(super) fn settle(&mut self, stepped: Stepped) {
        let finite = self.optimizer.settle(stepped);
        if let Some(s) = &mut self.scaler {
            s.update(finite);
        }
    }

    /// Adds a micro-batch's gradients to the pending ones ([`grads::accumulate`]); `kept`: no
    /// optimizer step consumes them in this step.
    pub(super) fn accumulate(&mut self, grads: GradientsParams, flats: Vec<FlatGrads>, kept: bool) {
        let table = &self.optimizer.table;
        grads::accumulate(
            &mut self.pending,
            &mut self.pending_flat,
            grads,
            flats,
            table,
            kept,
        );
    }
}
