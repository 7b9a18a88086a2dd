//! [`Recorder::loss`] with one graph (`replay.one_graph`): the step recorded as one window on
//! the first call and again where the objects outnumber the slots, then replayed.

use super::{Graphs, RecordError, Recorded, Recorder, Unrecorded, replay, say_recording_again};
use crate::data::Instance;
use crate::loss::E2eLoss;
use crate::model::Yolo;
use crate::replay::copy::write;
use crate::replay::loss::PendingLoss;
use crate::replay::record::{StepInputs, record_step, warms_up_as_captured};
use crate::train::spans::{self, Span};
use burn::prelude::*;

impl Recorder {
    /// [`Recorder::loss`] with one graph. A step that cannot be recorded comes back with its
    /// images ([`Unrecorded`]); the recorder is left without a graph.
    pub(super) fn step(
        &mut self,
        model: &mut Yolo,
        loss: &E2eLoss,
        labels: &[Vec<Instance>],
        scale: Option<f32>,
        mut walked: Option<Vec<Tensor<1>>>,
    ) -> Result<PendingLoss, Unrecorded> {
        let images = self.images.take().expect("forward before the loss");
        let fits = |r: &Recorded| match &r.graphs {
            Graphs::One { loss: l, .. } => l.fits(labels, loss.object_slots),
            Graphs::Split { .. } => false,
        };
        if !self.state.as_ref().is_some_and(fits) {
            // A recording's controls may replace the model's tensors (`skip_rollback`).
            walked = None;
            // Dropping the old graph first gives its pages back for the new recording.
            if self.state.take().is_some() {
                say_recording_again(labels, loss.object_slots);
            }
            let step = StepInputs {
                loss,
                labels,
                flow: model.head.flow.as_ref(),
                scale,
                dtype: self.dtype,
            };
            let record = |as_captured: bool| {
                let pinned = self.pinned.as_ref();
                let (device, control) = (&self.device, self.control);
                record_step(
                    &*model,
                    images.clone(),
                    pinned,
                    device,
                    control,
                    step,
                    as_captured,
                )
            };
            // A window refused for room is recorded again after a warm-up that runs exactly
            // its work eagerly, which adds the pages it asked for (docs/replay.md, "One window").
            let mut retried = false;
            let refused = self.control.refuses_recording_again() && self.loss_recordings > 0;
            let first = if refused {
                Err(RecordError::refused_by_control())
            } else {
                record(warms_up_as_captured())
            };
            let recorded = first.or_else(|e| {
                if !e.wants_room() {
                    return Err(e);
                }
                retried = true;
                eprintln!(
                    "step replay: no room in the pages held for an allocation inside the \
                     window; recording again after one more warm-up"
                );
                // What the refused window left cached goes before anything runs eagerly, as
                // for a step that falls back (`Recorder::unrecorded`).
                self.forget_refused_windows();
                record(true)
            });
            let recorded = match recorded {
                Ok(r) => r,
                Err(error) => return Err(self.unrecorded(error, images)),
            };
            self.state = Some(recorded);
            self.loss_recordings += 1;
            self.room_retries += usize::from(retried);
            self.skip_rollback(model);
        }
        let (weight, scale) = self.loss_values(loss, scale);
        let r = self.state.as_mut().expect("recorded");
        let stale = self.control.stale_sources();
        self.walks_taken += usize::from(walked.is_some());
        spans::time(Span::LossSources, || {
            r.sources.refresh(model, stale, walked.as_deref())
        });
        spans::time(Span::LossImages, || write(images, &r.input));
        let Graphs::One { step, loss: inputs } = &mut r.graphs else {
            unreachable!("one graph")
        };
        spans::time(Span::LossLabels, || {
            inputs.write(
                labels,
                weight,
                scale,
                model.head.flow.as_ref(),
                &self.device,
            )
        });
        spans::time(Span::LossLaunch, || replay(&self.device, step));
        let pending = inputs.pending();
        spans::time(Span::LossStatistics, || r.statistics_into(model));
        Ok(pending)
    }
}
