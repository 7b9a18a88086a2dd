//! A depthwise convolution (`groups` = input channels = output channels, weight `[C, 1, kh, kw]`)
//! and its gradients in FP32: one launch for the forward (its operands rounded to the autocast
//! dtype, the products summed in FP32; one more where its input is not channels-last), one for
//! the data gradient, two for the weight gradient.
//! Through tensor operations the weight gradient took an im2col copy nine times the input, a
//! product as large and two reductions, and Burn 0.22.1's direct transposed convolution took
//! ~0.27 ms per data gradient at batch 16 on the H200 (docs/perf_log.md, 2026-12-02).
//!
//! Every sum runs in a fixed order that depends on the shapes only (a fixed split, a fixed
//! shared-memory tree, the parts merged in order): the same bits every run, no atomics. Every
//! tensor is read by its own strides; outputs are dense (the forward's channels-last, the
//! gradients' NCHW).

// The kernels' arithmetic stays in the form CubeCL's frontend expands (`(m + parts - 1) / parts`),
// not clippy's rewrite.
#![allow(clippy::manual_div_ceil)]

// `#[cube]` expands to `cubecl::…` paths.
use crate::model::ops::empty_f32;
use burn::backend::ops::ConvOptions;
use burn::cubecl;
use burn::tensor::{DType, FloatDType, Shape};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::{permute_nchw_to_nhwc, permute_nhwc_to_nchw};
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;
use cubecl::{CubeCount, CubeDim, calculate_cube_count_elemwise};

use super::tree::{UNITS, parts, tree_sum};

/// One unit per output element `(n, c, oy, ox)`, in channels-last order: `Σ_{i,j} w[c, i, j] ·
/// x[n, c, oy·sh + i·dh − top, ox·sw + j·dw − left]` over the taps inside `x`, in tap order,
/// each operand rounded to `R` first (the autocast dtype; FP32 leaves it as it is) and the
/// products accumulated in FP32. The taps, strides and dilations are comptime: the loops
/// unroll and the tap offsets are constants.
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
fn forward_kernel<R: Float>(
    x: &Tensor<f32>,
    weight: &Tensor<f32>,
    out: &mut Tensor<f32>,
    top: u32,
    left: u32,
    #[comptime] kh: usize,
    #[comptime] kw: usize,
    #[comptime] sh: usize,
    #[comptime] sw: usize,
    #[comptime] dh: usize,
    #[comptime] dw: usize,
    #[define(R)] _dtype: ElemType,
) {
    let width = out.shape(3);
    let height = out.shape(2);
    let channels = out.shape(1);
    if ABSOLUTE_POS >= out.shape(0) * channels * height * width {
        terminate!();
    }
    // Units in the output's channels-last memory order: a warp writes neighbouring channels of
    // one pixel and reads them from `x`, channels-last too.
    let c = ABSOLUTE_POS % channels;
    let rest = ABSOLUTE_POS / channels;
    let ox = rest % width;
    let rest = rest / width;
    let oy = rest % height;
    let n = rest / height;
    let top = top as usize;
    let left = left as usize;
    let x_base = n * x.stride(0) + c * x.stride(1);
    let w_base = c * weight.stride(0);
    let mut acc = 0.0f32;
    #[unroll]
    for i in 0..kh {
        let row = oy * sh + i * dh;
        if row >= top {
            let yy = row - top;
            if yy < x.shape(2) {
                #[unroll]
                for j in 0..kw {
                    let col = ox * sw + j * dw;
                    if col >= left {
                        let xx = col - left;
                        if xx < x.shape(3) {
                            let wv = weight[w_base + i * weight.stride(2) + j * weight.stride(3)];
                            let xv = x[x_base + yy * x.stride(2) + xx * x.stride(3)];
                            acc +=
                                f32::cast_from(R::cast_from(wv)) * f32::cast_from(R::cast_from(xv));
                        }
                    }
                }
            }
        }
    }
    let at = n * out.stride(0) + c * out.stride(1) + oy * out.stride(2) + ox * out.stride(3);
    out[at] = acc;
}

/// One unit per input element `(n, c, y, x)`: `Σ_{i,j} w[c, i, j] · dY[n, c, oy, ox]` over the
/// taps whose output position `oy = (y + top − i·dh) / sh` (and likewise `ox`) is whole and
/// inside the output, in tap order. Comptime geometry, as [`forward_kernel`].
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
fn data_grad_kernel(
    grad: &Tensor<f32>,
    weight: &Tensor<f32>,
    out: &mut Tensor<f32>,
    top: u32,
    left: u32,
    #[comptime] kh: usize,
    #[comptime] kw: usize,
    #[comptime] sh: usize,
    #[comptime] sw: usize,
    #[comptime] dh: usize,
    #[comptime] dw: usize,
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
    let row = y + top as usize;
    let col = x + left as usize;
    let g_base = n * grad.stride(0) + c * grad.stride(1);
    let w_base = c * weight.stride(0);
    let mut acc = 0.0f32;
    #[unroll]
    for i in 0..kh {
        let reach_h = i * dh;
        if row >= reach_h {
            let q = row - reach_h;
            let oy = q / sh;
            if oy * sh == q && oy < grad.shape(2) {
                #[unroll]
                for j in 0..kw {
                    let reach_w = j * dw;
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

/// Cube `(p, c)`: for every tap `t = (i, j)`, `Σ dY[n, c, oy, ox] · x[n, c, oy·sh + i·dh − top,
/// ox·sw + j·dw − left]` over its share of the `N·Ho·Wo` output positions (the input is zero
/// outside), into `partial[(c·taps + t)·P + p]`. Each output gradient is loaded once for all
/// taps (a cube per tap loaded it once per tap); each unit still takes the positions `start +
/// u`, `start + u + units`, … in order per tap and the units are merged by the same tree, so
/// each tap's sum is what a cube of its own would give.
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
fn weight_grad_partial_kernel(
    x: &Tensor<f32>,
    grad: &Tensor<f32>,
    partial: &mut Tensor<f32>,
    top: u32,
    left: u32,
    #[comptime] kh: usize,
    #[comptime] kw: usize,
    #[comptime] sh: usize,
    #[comptime] sw: usize,
    #[comptime] dh: usize,
    #[comptime] dw: usize,
    #[comptime] units: usize,
) {
    let p = CUBE_POS_X as usize;
    let c = CUBE_POS_Y as usize;
    let parts = CUBE_COUNT_X as usize;
    let taps = comptime!(kh * kw);
    let out_w = grad.shape(3);
    let out_hw = grad.shape(2) * out_w;
    let m = grad.shape(0) * out_hw;
    let chunk = (m + parts - 1) / parts;
    let start = p * chunk;
    let mut end = start + chunk;
    if end > m {
        end = m;
    }
    let top = top as usize;
    let left = left as usize;
    let mut acc = Array::<f32>::new(taps);
    #[unroll]
    for t in 0..taps {
        acc[t] = 0.0f32;
    }
    let mut k = start + UNIT_POS_X as usize;
    while k < end {
        let n = k / out_hw;
        let r = k % out_hw;
        let oy = r / out_w;
        let ox = r % out_w;
        let g = grad
            [n * grad.stride(0) + c * grad.stride(1) + oy * grad.stride(2) + ox * grad.stride(3)];
        let x_base = n * x.stride(0) + c * x.stride(1);
        #[unroll]
        for i in 0..kh {
            let row = oy * sh + i * dh;
            if row >= top {
                let yy = row - top;
                if yy < x.shape(2) {
                    #[unroll]
                    for j in 0..kw {
                        let col = ox * sw + j * dw;
                        if col >= left {
                            let xx = col - left;
                            if xx < x.shape(3) {
                                let t = i * kw + j;
                                acc[t] += g * x[x_base + yy * x.stride(2) + xx * x.stride(3)];
                            }
                        }
                    }
                }
            }
        }
        k += units;
    }
    #[unroll]
    for t in 0..taps {
        let total = tree_sum(acc[t], units);
        if UNIT_POS_X == 0 {
            partial[(c * taps + t) * parts + p] = total;
        }
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

pub use super::conv::is_depthwise;

/// The comptime geometry every kernel here takes: `(kh, kw, sh, sw, dh, dw)`.
fn geometry(kernel: [usize; 2], options: &ConvOptions<2>) -> [usize; 6] {
    let ([kh, kw], [sh, sw], [dh, dw]) = (kernel, options.stride, options.dilation);
    [kh, kw, sh, sw, dh, dw]
}

/// A depthwise convolution `[N, C, Ho, Wo]` in FP32 of `x` `[N, C, H, W]` and `weight`
/// `[C, 1, kh, kw]` (any float dtypes, any strides), each operand rounded to `dtype` and the
/// products summed in FP32 (`FloatDType::F32`: no rounding). Its memory is channels-last, the
/// layout the BatchNorm after it reads fastest and in which it writes the next convolution's
/// operand (docs/kernels.md); `x` is read channels-last too, copied so first where it is not
/// (one launch). Burn's direct kernel on cast operands took five launches (two casts in, the
/// input made channels-last, the convolution accumulating in BF16, a cast out).
pub fn forward(
    x: CubeTensor,
    weight: CubeTensor,
    options: &ConvOptions<2>,
    dtype: FloatDType,
) -> CubeTensor {
    let (x, weight) = (f32(x), f32(weight));
    let x = if super::fused_bn_nhwc::dense_channels_last(&x) {
        x
    } else {
        permute_nhwc_to_nchw(into_contiguous(permute_nchw_to_nhwc(x)))
    };
    let (s, k) = (x.meta.shape().clone(), weight.meta.shape().clone());
    let size = |i: usize| {
        super::conv::output_len(
            s[2 + i],
            k[2 + i],
            options.padding[i],
            options.stride[i],
            options.dilation[i],
        )
    };
    let out = permute_nhwc_to_nchw(empty_f32(&x, Shape::new([s[0], size(0), size(1), s[1]])));
    let total = out.meta.shape().num_elements();
    let dim = CubeDim::new(&x.client, total);
    let count = calculate_cube_count_elemwise(&x.client, total, dim);
    let client = x.client.clone();
    let [kh, kw, sh, sw, dh, dw] = geometry([k[2], k[3]], options);
    let rounding = burn::backend::cubecl::dtype_to_storage_type(DType::from(dtype));
    // SAFETY: every read is bounds-checked against `x`'s and `weight`'s shapes and addressed by
    // their strides; each unit writes its own element of `out`, bounded by its length.
    unsafe {
        forward_kernel::launch_unchecked(
            &client,
            count,
            dim,
            x.into_tensor_arg(),
            weight.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            options.padding[0].0 as u32,
            options.padding[1].0 as u32,
            kh,
            kw,
            sh,
            sw,
            dh,
            dw,
            rounding,
        );
    }
    out
}

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
    let out = empty_f32(&grad, input.clone());
    let total = input.num_elements();
    let dim = CubeDim::new(&grad.client, total);
    let count = calculate_cube_count_elemwise(&grad.client, total, dim);
    let client = grad.client.clone();
    let [kh, kw, sh, sw, dh, dw] = geometry([k[2], k[3]], options);
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
            options.padding[0].0 as u32,
            options.padding[1].0 as u32,
            kh,
            kw,
            sh,
            sw,
            dh,
            dw,
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
    let partial = empty_f32(&x, Shape::new([c * taps * p]));
    let out = empty_f32(&x, Shape::new([c, 1, kernel[0], kernel[1]]));
    let dim = CubeDim::new(&x.client, c * taps);
    let count = calculate_cube_count_elemwise(&x.client, c * taps, dim);
    let client = x.client.clone();
    let [kh, kw, sh, sw, dh, dw] = geometry(kernel, options);
    // SAFETY: the partial kernel bounds its positions by the shapes it reads and writes one
    // record per tap of each cube of the `P × C` grid, exactly `partial`'s length; the final
    // kernel bounds its units by `out`'s length.
    unsafe {
        weight_grad_partial_kernel::launch_unchecked(
            &client,
            CubeCount::Static(p as u32, c as u32, 1),
            CubeDim::new_1d(UNITS as u32),
            x.into_tensor_arg(),
            grad.into_tensor_arg(),
            partial.clone().into_tensor_arg(),
            options.padding[0].0 as u32,
            options.padding[1].0 as u32,
            kh,
            kw,
            sh,
            sw,
            dh,
            dw,
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

#[cfg(test)]
mod tests {
    use super::super::compile_check::{compiles, device, tensor};
    use super::*;
    use cubecl::ir::{ElemType, FloatKind};

    /// The forward (rounding to BF16, to F16 and not at all), data-gradient and weight-gradient
    /// kernels compile for CUDA on a machine without a GPU, for a 3×3 stride-1 and a 5×5
    /// stride-2 dilated geometry.
    #[test]
    fn depthwise_kernels_compile_for_cuda_without_a_device() {
        let (props, target) = device();
        let x = || tensor(&[2, 5, 9, 13]);
        let w = || tensor(&[5, 1, 3, 3]);
        for [kh, kw, sh, sw, dh, dw] in [[3, 3, 1, 1, 1, 1], [5, 3, 2, 1, 2, 1]] {
            for kind in [FloatKind::BF16, FloatKind::F16, FloatKind::F32] {
                let k = forward_kernel::create_dummy_kernel(
                    props.clone(),
                    target.clone(),
                    CubeCount::Static(4, 1, 1),
                    CubeDim::new_1d(256),
                    x(),
                    w(),
                    x(),
                    1,
                    1,
                    kh,
                    kw,
                    sh,
                    sw,
                    dh,
                    dw,
                    ElemType::Float(kind),
                );
                compiles(k.define());
            }
            let k = data_grad_kernel::create_dummy_kernel(
                props.clone(),
                target.clone(),
                CubeCount::Static(4, 1, 1),
                CubeDim::new_1d(256),
                x(),
                w(),
                x(),
                1,
                1,
                kh,
                kw,
                sh,
                sw,
                dh,
                dw,
            );
            compiles(k.define());
            let k = weight_grad_partial_kernel::create_dummy_kernel(
                props.clone(),
                target.clone(),
                CubeCount::Static(2, 5, 1),
                CubeDim::new_1d(UNITS as u32),
                x(),
                x(),
                tensor(&[5 * kh * kw * 2]),
                1,
                1,
                kh,
                kw,
                sh,
                sw,
                dh,
                dw,
                UNITS,
            );
            compiles(k.define());
        }
    }
}
