//! The recorder's negative controls: deliberately broken variants that the parity tests run to
//! show they catch them (docs/replay.md, "Proof"). Only `Control::None` exists without the
//! `controls` feature, which only this package's tests turn on.

/// Deliberately broken variants, kept so that the parity tests can show they catch them; only
/// `None` exists without the `controls` feature (which only this package's tests turn on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    /// The real recorder.
    None,
    /// Hands the BatchNorm statistics of the private copy, as the warm-up and recording runs
    /// left them, to the trainer (no rollback): what recording on the trainer's own modules
    /// would do, without graphs that share tensors with the trainer (docs/replay.md).
    #[cfg(feature = "controls")]
    SkipRollback,
    /// Records the one-to-many point stems too: their recorded backward always writes a
    /// gradient, so a batch without positives gives them zeros instead of none, and the
    /// optimizer moves them and their state where the native loop skips them.
    #[cfg(feature = "controls")]
    RecordStems,
    /// Copies the trainer's tensors in before the first replay only, as if they never changed:
    /// the graph keeps training the first step's weights.
    #[cfg(feature = "controls")]
    StaleSources,
    /// Keeps the recorded gradients of parameters that feed only head outputs the loss did not
    /// read (`Scope::Network`): their zero seeds give zero gradients, and the optimizer moves
    /// them where the native loop skips them.
    #[cfg(feature = "controls")]
    KeepUnreached,
    /// Writes the ProgLoss weight into the recorded loss's buffer at recording only, as if it
    /// were a value frozen into the graph: the loss keeps the first epoch's weight.
    #[cfg(feature = "controls")]
    FrozenLossWeight,
    /// Writes FP16's loss scale into the recorded loss's buffer at recording only: the seeds
    /// keep the first scale while the optimizer unscales by the current one.
    #[cfg(feature = "controls")]
    FrozenLossScale,
    /// Writes the recorded update's per-step values (the table of learning rates, weight decay,
    /// bias corrections and presence, the momentum, the loss-scale inverse, the EMA's decay)
    /// at recording only, as if they were frozen into the graph.
    #[cfg(feature = "controls")]
    FrozenUpdateScalars,
    /// A step left queued (`replay.defer_readback`) keeps the recorder's own buffers instead
    /// of copies: the next step's replay rewrites them before the step is read, so it logs and
    /// accumulates the next step's loss and gradients.
    #[cfg(feature = "controls")]
    ReadLateInPlace,
    /// The one-graph step window gathers no gradient, as if every part were already in place
    /// (`model::ops::grads_into`): the parts that are not (BatchNorm's γ/β, biases, depthwise
    /// weights) keep what the warm-ups gathered.
    #[cfg(feature = "controls")]
    GatherNothing,
    /// With the running statistics laid out in one buffer (`model::ops::stats_into`), the
    /// window's forward writes them into buffers of their own and gathers none back, as if
    /// every layer had updated its own in place: the replays keep reading, and the trainer keeps
    /// getting, the statistics the recording started from.
    #[cfg(feature = "controls")]
    StatsOutOfPlace,
    /// With `replay.upload_ahead`, a step makes its own batch's images again instead of the
    /// next one's, and the next step takes them as its own: every step after the first trains
    /// on the batch before it.
    #[cfg(feature = "controls")]
    AheadOfThisBatch,
    /// With `replay::update::early`, the walk of the model made for the next step is kept
    /// across an eager optimizer step, which gives the model new tensors: the next step's
    /// graph reads its parameters from the tensors the update replaced.
    #[cfg(feature = "controls")]
    KeepWalk,
    /// Not a broken variant but an injected fault: with one graph, every recording after the
    /// first is refused as CubeCL refuses a window it cannot record (not for room), so the
    /// tests see the trainer run the rest of the fit natively.
    #[cfg(feature = "controls")]
    RefuseRecordingAgain,
    /// An injected fault too: with split graphs (any scope), the first recording of the
    /// stage's forward and backward is refused, so the tests see the trainer run the whole fit
    /// natively from its first step.
    #[cfg(feature = "controls")]
    RefuseRecording,
}

/// Which control is on, as the recorder asks it.
#[cfg(feature = "controls")]
impl Control {
    pub fn skips_rollback(self) -> bool {
        self == Control::SkipRollback
    }

    pub fn records_stems(self) -> bool {
        self == Control::RecordStems
    }

    pub fn stale_sources(self) -> bool {
        self == Control::StaleSources
    }

    pub fn keeps_unreached(self) -> bool {
        self == Control::KeepUnreached
    }

    pub fn freezes_loss_weight(self) -> bool {
        self == Control::FrozenLossWeight
    }

    pub fn freezes_loss_scale(self) -> bool {
        self == Control::FrozenLossScale
    }

    pub fn freezes_update_scalars(self) -> bool {
        self == Control::FrozenUpdateScalars
    }

    pub fn reads_late_in_place(self) -> bool {
        self == Control::ReadLateInPlace
    }

    pub fn gathers_nothing(self) -> bool {
        self == Control::GatherNothing
    }

    pub fn stats_out_of_place(self) -> bool {
        self == Control::StatsOutOfPlace
    }

    pub fn uploads_this_batch_ahead(self) -> bool {
        self == Control::AheadOfThisBatch
    }

    pub fn keeps_walk(self) -> bool {
        self == Control::KeepWalk
    }

    pub fn refuses_recording_again(self) -> bool {
        self == Control::RefuseRecordingAgain
    }

    pub fn refuses_recording(self) -> bool {
        self == Control::RefuseRecording
    }
}

/// Without the `controls` feature no control exists.
#[cfg(not(feature = "controls"))]
impl Control {
    pub fn skips_rollback(self) -> bool {
        false
    }

    pub fn records_stems(self) -> bool {
        false
    }

    pub fn stale_sources(self) -> bool {
        false
    }

    pub fn keeps_unreached(self) -> bool {
        false
    }

    pub fn freezes_loss_weight(self) -> bool {
        false
    }

    pub fn freezes_loss_scale(self) -> bool {
        false
    }

    pub fn freezes_update_scalars(self) -> bool {
        false
    }

    pub fn reads_late_in_place(self) -> bool {
        false
    }

    pub fn gathers_nothing(self) -> bool {
        false
    }

    pub fn stats_out_of_place(self) -> bool {
        false
    }

    pub fn uploads_this_batch_ahead(self) -> bool {
        false
    }

    pub fn keeps_walk(self) -> bool {
        false
    }

    pub fn refuses_recording_again(self) -> bool {
        false
    }

    pub fn refuses_recording(self) -> bool {
        false
    }
}
