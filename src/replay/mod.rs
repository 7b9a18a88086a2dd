//! Feature replay (docs/replay.md): the backbone and neck of a pose model recorded into CUDA
//! graphs once and replayed every step, with the head, assignment and losses native. One public
//! entry, [`Stage`]: `Native` or `Replay`, byte-identical by construction and by test.

pub mod eligibility;
pub mod stage;
mod tape;

#[cfg(feature = "cuda")]
pub mod control;
#[cfg(feature = "cuda")]
pub(crate) mod copy;
#[cfg(feature = "cuda")]
pub mod loss;
#[cfg(feature = "cuda")]
mod record;
#[cfg(feature = "cuda")]
pub mod recorder;
#[cfg(all(test, feature = "cuda"))]
mod recorder_tests;
#[cfg(feature = "cuda")]
mod sources;
#[cfg(feature = "cuda")]
pub mod update;

pub use stage::{Scope, Stage, StageOutputs};
