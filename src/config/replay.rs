//! The `[replay]` section: what a fit records into CUDA graphs, and how (docs/replay.md).

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReplaySection {
    /// Feature replay: record the stage below the cut (`replay.scope`) into CUDA graphs on the
    /// first training step and replay them on every later one, byte-identical to the native loop
    /// (CUDA only; elsewhere, and where a fit cannot be replayed, the stage runs natively and the
    /// fit says why; default false).
    pub enabled: bool,
    /// Where a training step's autodiff tape is cut, and what replay records: "features"
    /// (backbone + neck; the head runs in Burn
    /// autodiff; pose only), "network" (the whole network but the pose loss's flow; only
    /// assignment and losses run in Burn autodiff) or "step" (the network as "network", and the
    /// device loss with its backward recorded too: needs `train.loss_on = "device"`; every
    /// precision, FP16 with its loss scale read by the graph; docs/replay.md). Default unset:
    /// "features" for pose, "network" for detection. Native and replayed fits of one scope are
    /// byte-identical; the two scopes sum gradients in different orders, so their results
    /// differ by rounding (docs/replay.md).
    pub scope: Option<Scope>,
    /// The recorded graphs read the stage's parameters where the flat optimizer keeps them
    /// (gathered before the first step and written in place, `Optimizer::pin`) instead of from
    /// private copies refreshed after every optimizer step: one parameter set on the device
    /// fewer and no copy per step. Needs `optim.flat_update` (the config refuses it otherwise).
    /// Byte-identical to native on the H200 (docs/perf_log.md AU1); off by default until its
    /// memory is measured (default false).
    pub shared_parameters: bool,
    /// With `scope = "step"`: record the network's forward, the device loss and the whole
    /// backward as one CUDA graph instead of three, so the backward reuses the pages the
    /// forward's and the loss's temporaries freed, as the native step does (docs/replay.md,
    /// "One window"): on the H200 1,594 MiB reserved against the three graphs' 1,975 and
    /// native's 1,260, byte-identical to native. Unset: on with the step scope
    /// ([`Config::one_graph`](super::Config::one_graph)); `true` with another scope is refused, `false` records three
    /// graphs.
    pub one_graph: Option<bool>,
    /// Record the optimizer step (with FP16's unscale and skip and the global clip) and the EMA
    /// update as one more CUDA graph, replayed on every optimizer step once both write in place
    /// (from the second): per-step values (learning rates, momentum, bias corrections,
    /// presence, loss scale, EMA decay) are written into its buffers before each replay
    /// (docs/replay.md, "The update recorded"). Byte-identical to native on the H200; an
    /// optimizer step of MuSGD 45 ms against 61 ms eagerly (AdamW's about the same), ~40 MiB
    /// more in use (docs/perf_log.md AU3). Unset: on with `optim.flat_update`, whose update it
    /// records ([`Config::record_update`](super::Config::record_update)); `true` without it is refused.
    pub record_update: Option<bool>,
    /// With `scope = "step"`: a step that ends without an optimizer step is left queued, and
    /// its loss results (items and the counts that decide which gradients are present) are read
    /// once the next step's replay is queued too, so the GPU runs that one while the host reads
    /// and accumulates this one (docs/replay.md, "Reading a step late"). The same decisions on
    /// the same values as reading at once: byte-identical to native on the H100
    /// (docs/perf_log.md AX2, BM3), and with the results' copy to the host enqueued behind the
    /// step's own graph, 24.94 → 21.73 ms a seed step there (BM3). Steps timed by `--report` or
    /// `--phases` read at once. Unset: on with the step scope
    /// ([`Config::defer_readback`](super::Config::defer_readback)); `true` with another scope is
    /// refused.
    pub defer_readback: Option<bool>,
    /// With `scope = "step"`: once a step's recorded graph is queued, the next batch is uploaded
    /// and augmented (its images made on the device, behind the graph on the same stream)
    /// before the host waits for the step's loss results, so that the next step starts from
    /// them instead of leaving the GPU idle while it uploads (docs/replay.md, "The next batch
    /// uploaded ahead"). The same operations on the same bytes: byte-identical. Steps timed by
    /// `--report` or `--phases` upload their own batch. Unset: on with the step scope
    /// ([`Config::upload_ahead`](super::Config::upload_ahead)); `true` with another scope is
    /// refused.
    pub upload_ahead: Option<bool>,
}

/// What the stage of a step computes before the tape is cut (`replay.scope`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Backbone + neck → P3/P4/P5; the head runs in Burn autodiff.
    Features,
    /// The whole network → the head's raw outputs; only the loss runs in Burn autodiff.
    Network,
    /// The network's cut, with the device loss and its backward recorded as well.
    Step,
}

impl Scope {
    /// Where the tape is cut: "step" cuts it where "network" does (at the head's outputs).
    pub fn cut(self) -> Scope {
        match self {
            Scope::Step => Scope::Network,
            s => s,
        }
    }
}
