//! Copies between CUDA float tensors: the copy kernel (`kernels/copy.rs`), compiled with the
//! CUDA backend, and the recorder's uses of it.

#[path = "../../kernels/copy.rs"]
mod kernel;

pub use kernel::{copy_into, duplicate};

use crate::model::ops::from_cube;
use burn::backend::{BackendTensor, DispatchTensorKind};
use burn::prelude::*;
use burn_cubecl::tensor::CubeTensor;

/// The CUDA float tensor inside `t` (panics on any other device: callers hold CUDA tensors).
pub(crate) fn cube<const D: usize>(t: Tensor<D>) -> CubeTensor {
    match t.inner().into_dispatch().kind {
        DispatchTensorKind::Cube(BackendTensor::Float(c)) => c,
        _ => panic!("expected a CUDA float tensor"),
    }
}

pub(crate) fn write<const D: usize>(src: Tensor<D>, dst: &Tensor<D>) {
    copy_into(cube(src), &cube(dst.clone()));
}

pub(crate) fn copy_of<const D: usize>(t: Tensor<D>) -> Tensor<D> {
    from_cube(duplicate(cube(t)))
}

pub(crate) fn bytes_of<const D: usize>(t: &Tensor<D>) -> u64 {
    (t.shape().num_elements() * t.dtype().size()) as u64
}
