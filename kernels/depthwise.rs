//! Gradients of a depthwise convolution (`groups` = input channels = output channels, weight
//! `[C, 1, kh, kw]`) in FP32, two launches for the weight gradient and one for the data gradient.
//! Through tensor operations the weight gradient took an im2col copy nine times the input, a
//! product as large and two reductions, and Burn 0.22.1's direct transposed convolution took
//! ~0.27 ms per data gradient at batch 16 on the H200 (docs/perf_log.md, 2026-12-02).
//!
//! Every sum runs in a fixed order that depends on the shapes only (a fixed split, a fixed
//! shared-memory tree, the parts merged in order): the same bits every run, no atomics. Every
//! tensor is read by its own strides; outputs are contiguous.

// The kernels' arithmetic stays in the form CubeCL's frontend expands (`(m + parts - 1) / parts`),
// not clippy's rewrite.
#![allow(clippy::manual_div_ceil)]

// `#[cube]` expands to `cubecl::…` paths.
use burn::backend::ops::ConvOptions;
use burn::cubecl;
use burn::tensor::{DType, Shape};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;
use cubecl::{CubeCount, CubeDim, calculate_cube_count_elemwise};

use super::tree::{UNITS, parts, tree_sum};

/// One unit per input element `(n, c, y, x)`: `Σ_{i,j} w[c, i, j] · dY[n, c, oy, ox]` over the
/// taps whose output position `oy = (y + top − i·dh) / sh` (and likewise `ox`) is whole and
/// inside the output, in tap order.
#[cube(launch_unchecked)]
fn data_grad_kernel(
    grad: &Tensor<f32>,
    weight: &Tensor<f32>,
    out: &mut Tensor<f32>,
    kernel_h: u32,
    kernel_w: u32,
    stride_h: u32,
    stride_w: u32,
    dilation_h: u32,
    dilation_w: u32,
    top: u32,
    left: u32,
) {
    let width = out.shape(3);
    let height = out.shape(2);
    let channels = out.shape(1);
    if ABSOLUTE_POS >= out.shape(0) * channels * height * width {
        terminate!();
    }
    let x = ABSOLUTE_POS % width;
    let rest = ABSOLUTE_POS / width;
    let y = rest % height;
    let rest = rest / height;
    let c = rest % channels;
    let n = rest / channels;
    let sh = stride_h as usize;
    let sw = stride_w as usize;
    let row = y + top as usize;
    let col = x + left as usize;
    let g_base = n * grad.stride(0) + c * grad.stride(1);
    let w_base = c * weight.stride(0);
    let mut acc = 0.0f32;
    for i in 0..kernel_h as usize {
        let reach_h = i * (dilation_h as usize);
        if row >= reach_h {
            let q = row - reach_h;
            let oy = q / sh;
            if oy * sh == q && oy < grad.shape(2) {
                for j in 0..kernel_w as usize {
                    let reach_w = j * (dilation_w as usize);
                    if col >= reach_w {
                        let r = col - reach_w;
                        let ox = r / sw;
                        if ox * sw == r && ox < grad.shape(3) {
                            let at_w = w_base + i * weight.stride(2) + j * weight.stride(3);
                            let at_g = g_base + oy * grad.stride(2) + ox * grad.stride(3);
                            acc += weight[at_w] * grad[at_g];
                        }
                    }
                }
            }
        }
    }
    let at = n * out.stride(0) + c * out.stride(1) + y * out.stride(2) + x * out.stride(3);
    out[at] = acc;
}

/// Cube `(p, c, t)`: `Σ dY[n, c, oy, ox] · x[n, c, oy·sh + i·dh − top, ox·sw + j·dw − left]`
/// over its share of the `N·Ho·Wo` output positions (the input is zero outside), for tap
/// `t = (i, j)`, into `partial[(c·taps + t)·P + p]`.
#[cube(launch_unchecked)]
fn weight_grad_partial_kernel(
    x: &Tensor<f32>,
    grad: &Tensor<f32>,
    partial: &mut Tensor<f32>,
    kernel_w: u32,
    stride_h: u32,
    stride_w: u32,
    dilation_h: u32,
    dilation_w: u32,
    top: u32,
    left: u32,
    #[comptime] units: usize,
) {
    let p = CUBE_POS_X as usize;
    let c = CUBE_POS_Y as usize;
    let t = CUBE_POS_Z as usize;
    let parts = CUBE_COUNT_X as usize;
    let taps = CUBE_COUNT_Z as usize;
    let out_w = grad.shape(3);
    let out_hw = grad.shape(2) * out_w;
    let m = grad.shape(0) * out_hw;
    let chunk = (m + parts - 1) / parts;
    let start = p * chunk;
    let mut end = start + chunk;
    if end > m {
        end = m;
    }
    let kw = kernel_w as usize;
    let reach_h = (t / kw) * (dilation_h as usize);
    let reach_w = (t % kw) * (dilation_w as usize);
    let top = top as usize;
    let left = left as usize;
    let mut acc = 0.0f32;
    let mut k = start + UNIT_POS_X as usize;
    while k < end {
        let n = k / out_hw;
        let r = k % out_hw;
        let oy = r / out_w;
        let ox = r % out_w;
        let row = oy * (stride_h as usize) + reach_h;
        let col = ox * (stride_w as usize) + reach_w;
        if row >= top && col >= left {
            let yy = row - top;
            let xx = col - left;
            if yy < x.shape(2) && xx < x.shape(3) {
                let at_g = n * grad.stride(0)
                    + c * grad.stride(1)
                    + oy * grad.stride(2)
                    + ox * grad.stride(3);
                let at_x = n * x.stride(0) + c * x.stride(1) + yy * x.stride(2) + xx * x.stride(3);
                acc += grad[at_g] * x[at_x];
            }
        }
        k += units;
    }
    let total = tree_sum(acc, units);
    if UNIT_POS_X == 0 {
        let at = (c * taps + t) * parts + p;
        partial[at] = total;
    }
}

/// One unit per `(c, t)`: its `P` partial sums added in order.
#[cube(launch_unchecked)]
fn weight_grad_final_kernel(partial: &Tensor<f32>, out: &mut Tensor<f32>, parts: u32) {
    if ABSOLUTE_POS >= out.shape(0) * out.shape(2) * out.shape(3) {
        terminate!();
    }
    let parts = parts as usize;
    let mut acc = 0.0f32;
    for p in 0..parts {
        acc += partial[ABSOLUTE_POS * parts + p];
    }
    out[ABSOLUTE_POS] = acc;
}

/// `t` in FP32 (Burn's cast hands an FP32 tensor back as it is, with no launch).
fn f32(t: CubeTensor) -> CubeTensor {
    burn_cubecl::kernel::cast(t, DType::F32)
}

fn empty(like: &CubeTensor, shape: Shape) -> CubeTensor {
    empty_device_contiguous_dtype(like.client.clone(), like.device.clone(), shape, DType::F32)
}

pub use super::conv::is_depthwise;

/// Data gradient `[N, C, H, W]` (`input`'s shape) in FP32 from `grad` `[N, C, Ho, Wo]` and
/// `weight` `[C, 1, kh, kw]` of any float dtype.
pub fn data_grad(
    grad: CubeTensor,
    weight: CubeTensor,
    input: Shape,
    options: &ConvOptions<2>,
) -> CubeTensor {
    let (grad, weight) = (f32(grad), f32(weight));
    let k = weight.meta.shape().clone();
    let out = empty(&grad, input.clone());
    let total = input.num_elements();
    let dim = CubeDim::new(&grad.client, total);
    let count = calculate_cube_count_elemwise(&grad.client, total, dim);
    let client = grad.client.clone();
    let u = |v: usize| v as u32;
    // SAFETY: every index is bounds-checked against the shapes above, and every tensor is
    // addressed through its own strides.
    unsafe {
        data_grad_kernel::launch_unchecked(
            &client,
            count,
            dim,
            grad.into_tensor_arg(),
            weight.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            u(k[2]),
            u(k[3]),
            u(options.stride[0]),
            u(options.stride[1]),
            u(options.dilation[0]),
            u(options.dilation[1]),
            u(options.padding[0].0),
            u(options.padding[1].0),
        );
    }
    out
}

/// Weight gradient `[C, 1, kh, kw]` in FP32 from `x` `[N, C, H, W]` and `grad`
/// `[N, C, Ho, Wo]` of any float dtype.
pub fn weight_grad(
    x: CubeTensor,
    grad: CubeTensor,
    kernel: [usize; 2],
    options: &ConvOptions<2>,
) -> CubeTensor {
    let (x, grad) = (f32(x), f32(grad));
    let g = grad.meta.shape().clone();
    let (c, taps) = (g[1], kernel[0] * kernel[1]);
    let p = parts(g[0] * g[2] * g[3]);
    let partial = empty(&x, Shape::new([c * taps * p]));
    let out = empty(&x, Shape::new([c, 1, kernel[0], kernel[1]]));
    let dim = CubeDim::new(&x.client, c * taps);
    let count = calculate_cube_count_elemwise(&x.client, c * taps, dim);
    let client = x.client.clone();
    let u = |v: usize| v as u32;
    // SAFETY: the partial kernel bounds its positions by the shapes it reads and writes one
    // record per cube of the `P × C × taps` grid, exactly `partial`'s length; the final kernel
    // bounds its units by `out`'s length.
    unsafe {
        weight_grad_partial_kernel::launch_unchecked(
            &client,
            CubeCount::Static(p as u32, c as u32, taps as u32),
            CubeDim::new_1d(UNITS as u32),
            x.into_tensor_arg(),
            grad.into_tensor_arg(),
            partial.clone().into_tensor_arg(),
            u(kernel[1]),
            u(options.stride[0]),
            u(options.stride[1]),
            u(options.dilation[0]),
            u(options.dilation[1]),
            u(options.padding[0].0),
            u(options.padding[1].0),
            UNITS,
        );
        weight_grad_final_kernel::launch_unchecked(
            &client,
            count,
            dim,
            partial.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            p as u32,
        );
    }
    out
}
