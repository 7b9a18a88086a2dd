//! SiLU and its gradient as one launch each, for the RealNVP flow of the RLE loss (24 SiLUs per
//! flow pass). Burn 0.22.1 builds SiLU from a sigmoid of five tensor operations (`exp(−log(1 +
//! exp(−x)))`) and a product, and recomputes that sigmoid in the backward: ~17 launches per SiLU.

// `#[cube]` expands to `cubecl::…` paths.
use burn::cubecl;
use burn::tensor::DType;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;
use cubecl::{CubeDim, calculate_cube_count_elemwise};

/// Offset of the `i`-th value (row-major over `t`'s shape) in `t`, by its strides.
#[cube]
fn offset_of(t: &Tensor<f32>, i: usize) -> usize {
    let rank = t.rank();
    let mut rest = i;
    let mut at = 0;
    for k in 0..rank {
        let d = rank - 1 - k;
        at += (rest % t.shape(d)) * t.stride(d);
        rest /= t.shape(d);
    }
    at
}

/// Values in `t` (its shape's product: a CubeCL buffer may hold padded rows).
#[cube]
fn numel(t: &Tensor<f32>) -> usize {
    let mut n = 1;
    for d in 0..t.rank() {
        n *= t.shape(d);
    }
    n
}

/// `offset_of` for the output, which the frontend takes only by `&mut`.
#[cube]
fn out_offset(t: &mut Tensor<f32>, i: usize) -> usize {
    let rank = t.rank();
    let mut rest = i;
    let mut at = 0;
    for k in 0..rank {
        let d = rank - 1 - k;
        at += (rest % t.shape(d)) * t.stride(d);
        rest /= t.shape(d);
    }
    at
}

#[cube]
pub(super) fn sigmoid(x: f32) -> f32 {
    1.0f32 / (1.0f32 + f32::exp(-x))
}

/// SiLU's derivative at `x`, given `s = σ(x)`: `σ(x) · (1 + x · (1 − σ(x)))`.
#[cube]
pub(super) fn silu_slope(x: f32, s: f32) -> f32 {
    s * (1.0f32 + x * (1.0f32 - s))
}

/// One unit per value: `x · σ(x)`; every tensor by its own strides, or (`dense`: all of them
/// contiguous) at the value's own index, without the divisions that locate a strided value
/// (which made the flow's SiLUs ~3× slower than their memory traffic).
#[cube(launch_unchecked)]
fn silu_kernel(x: &Tensor<f32>, out: &mut Tensor<f32>, #[comptime] dense: bool) {
    if ABSOLUTE_POS >= numel(x) {
        terminate!();
    }
    let mut at = ABSOLUTE_POS;
    let mut dst = ABSOLUTE_POS;
    if !dense {
        at = offset_of(x, ABSOLUTE_POS);
        dst = out_offset(out, ABSOLUTE_POS);
    }
    let v = x[at];
    out[dst] = v * sigmoid(v);
}

/// One unit per value: `g · σ(x) · (1 + x · (1 − σ(x)))`; every tensor by its own strides, or
/// at the value's own index when `dense` (as in `silu_kernel`).
#[cube(launch_unchecked)]
fn silu_backward_kernel(
    x: &Tensor<f32>,
    grad: &Tensor<f32>,
    out: &mut Tensor<f32>,
    #[comptime] dense: bool,
) {
    if ABSOLUTE_POS >= numel(x) {
        terminate!();
    }
    let mut at_x = ABSOLUTE_POS;
    let mut at_g = ABSOLUTE_POS;
    let mut dst = ABSOLUTE_POS;
    if !dense {
        at_x = offset_of(x, ABSOLUTE_POS);
        at_g = offset_of(grad, ABSOLUTE_POS);
        dst = out_offset(out, ABSOLUTE_POS);
    }
    let v = x[at_x];
    let s = sigmoid(v);
    out[dst] = grad[at_g] * silu_slope(v, s);
}

/// A new FP32 tensor shaped like `like`, and the launch geometry of one unit per value.
fn output(like: &CubeTensor) -> (CubeTensor, CubeCount, CubeDim) {
    let shape = like.meta.shape().clone();
    let n = shape.num_elements();
    // Contiguous, not pitched rows (docs/kernels.md, "Output buffers").
    let out =
        empty_device_contiguous_dtype(like.client.clone(), like.device.clone(), shape, DType::F32);
    let dim = CubeDim::new(&like.client, n);
    (
        out,
        calculate_cube_count_elemwise(&like.client, n, dim),
        dim,
    )
}

/// `x · σ(x)` of an FP32 tensor (any strides).
pub fn silu(x: CubeTensor) -> CubeTensor {
    assert!(x.dtype == DType::F32, "silu: f32 only, got {:?}", x.dtype);
    let (out, count, dim) = output(&x);
    let client = x.client.clone();
    let dense = x.is_contiguous();
    // SAFETY: units are bounded by the output's length; `x` has the output's shape and is read
    // through its own strides, or at the value's index where it is contiguous (as `out` is).
    unsafe {
        silu_kernel::launch_unchecked(
            &client,
            count,
            dim,
            x.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            dense,
        );
    }
    out
}

/// The gradient of [`silu`] at `x` for the incoming `grad` (same shape, FP32, any strides).
pub fn silu_backward(x: CubeTensor, grad: CubeTensor) -> CubeTensor {
    assert!(
        x.dtype == DType::F32 && grad.dtype == DType::F32,
        "silu backward: f32 only, got {:?} and {:?}",
        x.dtype,
        grad.dtype
    );
    assert_eq!(
        x.meta.shape(),
        grad.meta.shape(),
        "silu backward: shapes differ"
    );
    let (out, count, dim) = output(&x);
    let client = x.client.clone();
    let dense = x.is_contiguous() && grad.is_contiguous();
    // SAFETY: as in `silu`; both inputs have the output's shape.
    unsafe {
        silu_backward_kernel::launch_unchecked(
            &client,
            count,
            dim,
            x.into_tensor_arg(),
            grad.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            dense,
        );
    }
    out
}
