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
        use burn::backend::{BackendTensor, DispatchTensorKind};
        if let DispatchTensorKind::Flex(BackendTensor::Float(f)) = t.clone().into_dispatch().kind
            && f.as_slice::<f32>().is_some()
        {
            return Self::InPlace(f);
        }
        Self::Copied(take_host(t))
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
    use burn::backend::{BackendTensor, DispatchTensorKind};
    if let DispatchTensorKind::Flex(BackendTensor::Float(f)) = t.clone().into_dispatch().kind
        && let Some(values) = f.as_slice::<f32>()
    {
        return values.to_vec();
    }
    t.into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .expect("f32 data after convert")
}
