//! Feature replay (docs/capture.md): the backbone and neck of a pose model recorded into CUDA
//! graphs once and replayed every step, with the head, assignment and losses native. One public
//! entry, [`FeatureStage`]: `Native` or `Replay`, byte-identical by construction and by test.

pub mod eligibility;
pub mod stage;
mod tape;

#[cfg(feature = "cuda")]
pub(crate) mod copy;
#[cfg(feature = "cuda")]
pub mod recorder;

pub use stage::{FeatureStage, Scope, StepFeatures};
