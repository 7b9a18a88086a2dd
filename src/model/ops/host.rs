//! FP32 values of CPU (burn-flex) tensors as slices and back, for the loops of ours that run
//! on the host (`cpu.rs`, `wgrad::host_weight_backward`).

use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Flex, Shape, TensorData};
use std::borrow::Cow;

/// A tensor's FP32 values in order: borrowed when they lie contiguous, a copy otherwise. The
/// caller has checked that the tensor is FP32.
pub fn values(t: &FloatTensor<Flex>) -> Cow<'_, [f32]> {
    match t.as_slice::<f32>() {
        Some(v) => Cow::Borrowed(v),
        None => Cow::Owned(t.to_contiguous().as_slice::<f32>().unwrap().to_vec()),
    }
}

/// A CPU tensor of `shape` holding `values`.
pub fn tensor(values: Vec<f32>, shape: impl Into<Shape>) -> FloatTensor<Flex> {
    Flex::float_from_data(TensorData::new(values, shape.into()), &Default::default())
}
