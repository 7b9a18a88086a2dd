//! Training: the trainer (one step, one epoch), a complete fit ([`fit`]: epochs, validation,
//! checkpoints and the run folder), timing and reports.

pub mod census;
pub mod checkpoint;
pub mod dist;
mod fit;
pub mod pictures;
pub mod plot;
pub mod precompile;
pub mod report;
pub mod spans;
pub mod timing;
pub mod trainer;
pub mod validate;

pub use fit::{FitError, FitEvents, FitSummary, fit, unused_run_name};
pub use trainer::{EpochRecord, StateHashes, StepTiming, TrainError, Trainer, median};
