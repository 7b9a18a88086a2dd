//! The native training loop, its validation, checkpoints and run outputs.

pub mod census;
pub mod checkpoint;
pub mod dist;
pub mod pictures;
pub mod plot;
pub mod report;
pub mod timing;
pub mod trainer;
pub mod validate;

pub use trainer::{EpochRecord, StateHashes, StepTiming, TrainError, Trainer, median};
