//! The copy kernel (`kernels/copy.rs`), compiled with the CUDA backend.

#[path = "../../kernels/copy.rs"]
mod kernel;

pub use kernel::{copy_into, duplicate};
