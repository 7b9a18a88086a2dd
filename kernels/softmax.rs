//! Softmax over the last axis and its gradient as one launch each, for the attention's
//! `[B, heads, N, N]` scores (`model::ops::softmax`). Burn 0.22.1 builds softmax from five tensor
//! operations (max, subtract, exp, sum, divide), whose two reductions over a 400-long axis ran
//! on 13 cubes, and autodiff's backward from about ten more, one of them unvectorised: ~155 µs
//! a layer on an H100 (docs/perf_log.md BR3). Here one cube a row.
//!
//! Every reduction is deterministic: unit `u` of [`UNITS`] folds the row's values `u, u +
//! UNITS, …` in order, then the units' partials meet in a fixed tree (the CPU's loops,
//! `model::ops::softmax::host`, take the same order).

// `#[cube]` expands to `cubecl::…` paths.
use burn::cubecl;
use burn::tensor::DType;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

// A new contiguous FP32 tensor on a tensor's device (not pitched rows).
use crate::model::ops::empty_f32;

// Units a cube (one row a cube), a power of two; the CPU's loops fold the same partials.
use super::UNITS;

/// The cube's partials in `s` folded into `s[0]` by the fixed tree: `s[u] ⊕= s[u + half]` for
/// halves from `UNITS / 2` down; `max` (else a sum).
#[cube]
fn fold(s: &mut Shared<[f32]>, u: usize, #[comptime] max: bool) {
    sync_cube();
    // The cube's units (`UNITS` at every launch), read at run time: a mutable counter started
    // from a constant does not compile.
    let mut half = CUBE_DIM_X as usize / 2;
    while half > 0 {
        if u < half {
            if max {
                s[u] = f32::max(s[u], s[u + half]);
            } else {
                s[u] += s[u + half];
            }
        }
        sync_cube();
        half /= 2;
    }
}

/// Cube `r`: row `r` of `x` (`[rows, n]`) as `e^(x − max) / Σ e^(x − max)` into `out`; every
/// tensor read and written by its strides (CubeCL may pitch a row).
#[cube(launch_unchecked, create_dummy_kernel)]
fn softmax_kernel(x: &Tensor<f32>, out: &mut Tensor<f32>) {
    let n = x.shape(1);
    let r = CUBE_POS_X as usize;
    let xr = r * x.stride(0);
    let xq = x.stride(1);
    let or = r * out.stride(0);
    let oq = out.stride(1);
    let u = UNIT_POS_X as usize;
    let mut s = Shared::<[f32]>::new_slice(UNITS);
    let mut m = f32::new(f32::NEG_INFINITY);
    let mut q = u;
    while q < n {
        m = f32::max(m, x[xr + q * xq]);
        q += UNITS;
    }
    s[u] = m;
    fold(&mut s, u, true);
    let top = s[0];
    sync_cube();
    let mut total = 0.0f32;
    q = u;
    while q < n {
        total += f32::exp(x[xr + q * xq] - top);
        q += UNITS;
    }
    s[u] = total;
    fold(&mut s, u, false);
    let sum = s[0];
    q = u;
    while q < n {
        out[or + q * oq] = f32::exp(x[xr + q * xq] - top) / sum;
        q += UNITS;
    }
}

/// Cube `r`: row `r` of the gradient, `y ⊙ (g − Σ g ⊙ y)`, from the forward's output `y` and
/// the incoming `g` (`[rows, n]`, each by its strides).
#[cube(launch_unchecked, create_dummy_kernel)]
fn softmax_backward_kernel(y: &Tensor<f32>, g: &Tensor<f32>, out: &mut Tensor<f32>) {
    let n = y.shape(1);
    let r = CUBE_POS_X as usize;
    let yr = r * y.stride(0);
    let yq = y.stride(1);
    let gr = r * g.stride(0);
    let gq = g.stride(1);
    let or = r * out.stride(0);
    let oq = out.stride(1);
    let u = UNIT_POS_X as usize;
    let mut s = Shared::<[f32]>::new_slice(UNITS);
    let mut dot = 0.0f32;
    let mut q = u;
    while q < n {
        dot += g[gr + q * gq] * y[yr + q * yq];
        q += UNITS;
    }
    s[u] = dot;
    fold(&mut s, u, false);
    let d = s[0];
    q = u;
    while q < n {
        out[or + q * oq] = y[yr + q * yq] * (g[gr + q * gq] - d);
        q += UNITS;
    }
}

/// `x` (FP32, any rank ≥ 1) as `[rows, n]` over its last axis: its values in row-major order,
/// each row's stride 1 (a row may be pitched: the kernels read by strides).
fn rows(x: CubeTensor) -> (CubeTensor, Vec<usize>) {
    assert_eq!(x.dtype, DType::F32, "softmax: FP32 only");
    let shape = x.meta.shape().to_vec();
    let n = *shape.last().expect("softmax: a tensor of rank 1 or more");
    let rows = shape.iter().product::<usize>() / n.max(1);
    let x = burn_cubecl::ops::reshape(into_contiguous(x), [rows, n].into());
    (x, shape)
}

/// Softmax over the last axis of `x` (FP32): a new contiguous tensor of `x`'s shape.
pub fn forward(x: CubeTensor) -> CubeTensor {
    let (x, shape) = rows(x);
    let out = empty_f32(&x, x.meta.shape());
    let count = x.meta.shape()[0] as u32;
    if count > 0 && x.meta.shape()[1] > 0 {
        let client = x.client.clone();
        // SAFETY: both tensors are `[rows, n]`, read and written by their strides; cube `r`
        // reads row `r` of `x` and writes row `r` of `out`.
        unsafe {
            softmax_kernel::launch_unchecked(
                &client,
                CubeCount::Static(count, 1, 1),
                CubeDim::new_1d(UNITS as u32),
                x.into_tensor_arg(),
                out.clone().into_tensor_arg(),
            );
        }
    }
    burn_cubecl::ops::reshape(out, shape.into())
}

/// The gradient of [`forward`] at its output `y` for the incoming `grad` (FP32, `y`'s shape).
pub fn backward(y: CubeTensor, grad: CubeTensor) -> CubeTensor {
    let (y, shape) = rows(y);
    let (grad, _) = rows(grad);
    assert_eq!(
        y.meta.shape(),
        grad.meta.shape(),
        "softmax backward: shapes"
    );
    let out = empty_f32(&y, y.meta.shape());
    let count = y.meta.shape()[0] as u32;
    if count > 0 && y.meta.shape()[1] > 0 {
        let client = y.client.clone();
        // SAFETY: the three tensors are `[rows, n]`, read and written by their strides; cube
        // `r` reads and writes row `r` of each.
        unsafe {
            softmax_backward_kernel::launch_unchecked(
                &client,
                CubeCount::Static(count, 1, 1),
                CubeDim::new_1d(UNITS as u32),
                y.into_tensor_arg(),
                grad.into_tensor_arg(),
                out.clone().into_tensor_arg(),
            );
        }
    }
    burn_cubecl::ops::reshape(out, shape.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ops::compile_check::{compiles, device, tensor};

    /// Both kernels compile to CUDA C++ (no GPU: CubeCL's compiler only).
    #[test]
    fn softmax_kernels_compile_for_cuda() {
        let (props, target) = device();
        let dim = CubeDim::new_1d(UNITS as u32);
        let kernel = softmax_kernel::create_dummy_kernel(
            props.clone(),
            target.clone(),
            CubeCount::Static(3, 1, 1),
            dim,
            tensor(&[3, 400]),
            tensor(&[3, 400]),
        );
        compiles(kernel.define());
        let kernel = softmax_backward_kernel::create_dummy_kernel(
            props,
            target,
            CubeCount::Static(3, 1, 1),
            dim,
            tensor(&[3, 400]),
            tensor(&[3, 400]),
            tensor(&[3, 400]),
        );
        compiles(kernel.define());
    }
}
