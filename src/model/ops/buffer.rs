//! The output buffers of our CUDA kernels.

use burn::tensor::{DType, Shape};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;

/// An uninitialised FP32 tensor of `shape` on `like`'s device, contiguous rather than CubeCL's
/// pitched rows (docs/kernels.md, "Output buffers"): our kernels write every value of it.
pub(crate) fn empty_f32(like: &CubeTensor, shape: impl Into<Shape>) -> CubeTensor {
    empty_device_contiguous_dtype(
        like.client.clone(),
        like.device.clone(),
        shape.into(),
        DType::F32,
    )
}
