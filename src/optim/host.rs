//! Flat buffers on the CPU: a tensor's values read where they lie, and owned vectors made from
//! tensors without a copy when nothing else holds them. The CPU's optimizer step and EMA update
//! run as one loop over these instead of a tensor operation per pass.

use burn::prelude::*;

/// A CPU tensor's f32 values, read in place when its storage is contiguous (a copy otherwise).
pub(super) enum HostValues {
    InPlace(burn::backend::flex::FlexTensor),
    Copied(Vec<f32>),
}

impl HostValues {
    pub(super) fn of(t: Tensor<1>) -> Self {
        match contiguous_f32(&t) {
            Some(f) => Self::InPlace(f),
            None => Self::Copied(take_host(t)),
        }
    }

    pub(super) fn values(&self) -> &[f32] {
        match self {
            Self::InPlace(f) => f.as_slice::<f32>().expect("checked in `of`"),
            Self::Copied(v) => v,
        }
    }
}

/// `t`'s values as an owned vector. The flat buffers this reads are always shared (the model's
/// or the optimizer state's views hold them), so `into_data` would copy them out and
/// `try_into_vec` copy them again; a contiguous FP32 tensor is copied once, from where it lies.
pub(super) fn take_host(t: Tensor<1>) -> Vec<f32> {
    if let Some(f) = contiguous_f32(&t) {
        return f.as_slice::<f32>().expect("checked").to_vec();
    }
    t.into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .expect("f32 data after convert")
}

/// `t`'s burn-flex storage when it holds contiguous FP32 values readable in place.
fn contiguous_f32(t: &Tensor<1>) -> Option<burn::backend::flex::FlexTensor> {
    use burn::backend::{BackendTensor, DispatchTensorKind};
    match t.clone().into_dispatch().kind {
        DispatchTensorKind::Flex(BackendTensor::Float(f)) if f.as_slice::<f32>().is_some() => {
            Some(f)
        }
        _ => None,
    }
}

/// The tests' switch to run the flat optimizer step's and EMA update's tensor operations (CUDA's
/// path) on the CPU, where the loops over these buffers run otherwise: both must give the
/// per-tensor update's bits.
#[cfg(test)]
pub(crate) mod force {
    use std::cell::Cell;

    thread_local! {
        static TENSOR_PATH: Cell<bool> = const { Cell::new(false) };
    }

    /// Whether this thread's flat updates run as tensor operations on any device.
    pub fn tensor_path() -> bool {
        TENSOR_PATH.with(Cell::get)
    }

    /// Runs `f` with this thread's flat updates as tensor operations.
    pub fn with_tensor_path<T>(f: impl FnOnce() -> T) -> T {
        TENSOR_PATH.with(|c| c.set(true));
        let out = f();
        TENSOR_PATH.with(|c| c.set(false));
        out
    }
}

#[cfg(not(test))]
pub(super) mod force {
    pub fn tensor_path() -> bool {
        false
    }
}
