//! Optimizers (SGD, MuSGD, AdamW), parameter groups, schedule, clipping and EMA (yolo_spec §4).
//! All state is plain data that can be hashed and saved.

pub mod clip;
pub mod ema;
pub mod flat;
pub mod grads;
pub mod groups;
pub mod hash;
mod host;
pub mod layout;
pub mod muon;
pub mod newton_schulz;
pub mod optimizer;
pub mod reduce;
pub mod scaler;
pub mod schedule;
pub mod state;
pub mod tensors;

pub use ema::Ema;
pub use optimizer::Optimizer;
pub use scaler::LossScaler;
pub use schedule::Schedule;
pub use state::{Hyper, Rule};

#[cfg(test)]
mod scaled_tests;
#[cfg(test)]
mod tests;
