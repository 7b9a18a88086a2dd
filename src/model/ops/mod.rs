//! Convolution and BatchNorm training as our own backend operations (docs/kernels.md).
//!
//! Burn 0.22.1 without autotune runs every convolution, its weight gradient included, through a
//! direct kernel, and reduces BatchNorm's statistics as `[C, N·H·W]` rows (as few as 16 rows of
//! 409,600 values), so together they were 91 % of a step on the H200 (docs/perf_log.md, 2026-11-29).
//! These operations keep Burn's maths but choose the work layout:
//! - BatchNorm training and the SiLU after it are one operation with one backward (Burn's
//!   formulas), so autodiff records no broadcast reductions and no activation graph. On CUDA it
//!   is six kernels of ours (`kernels/batch_norm.rs`) where the tensor operations took ~60
//!   launches per Conv-BN-SiLU; on the CPU it is a few loops of ours (`cpu.rs`); with
//!   [`ConvBnOps::Staged`] its statistics and gradients are tensor operations reducing along W,
//!   then H, then N.
//! - On CUDA, convolutions without groups use CubeCL's implicit GEMM (tensor cores) for the
//!   forward and the stride-1 data gradient; depthwise convolutions' gradients are our own
//!   kernels (`kernels/depthwise.rs`); other data gradients run Burn's direct kernel in FP32, and
//!   weight gradients are an FP32 im2col matmul (`wgrad`), as on the CPU.
//!
//! [`ConvBnOps::Stock`] keeps Burn's own operations, for comparisons and as a fallback.

mod autodiff;
mod batch_norm;
#[cfg(feature = "cuda")]
#[path = "../../../kernels/bf16_conv.rs"]
mod bf16_conv;
mod bn_act;
#[cfg(feature = "cuda")]
mod buffer;
#[cfg(feature = "cuda")]
pub(crate) use buffer::empty_f32;
#[cfg(feature = "cuda")]
#[path = "../../../kernels/channels.rs"]
pub mod channels;
#[cfg(all(test, feature = "cuda"))]
pub(crate) mod compile_check;
pub mod conv;
mod coupling;
pub use coupling::{STATE, coupling, coupling_net};
#[cfg(feature = "cuda")]
#[path = "../../../kernels/coupling.rs"]
pub mod coupling_kernels;
mod cpu;
mod cpu_batch_norm;
mod cpu_depthwise;
mod cpu_few_channels;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
#[path = "../../../kernels/cuda_source.rs"]
mod cuda_source;
#[cfg(feature = "cuda")]
#[path = "../../../kernels/depthwise.rs"]
pub mod depthwise;
#[cfg(feature = "cuda")]
#[path = "../../../kernels/batch_norm.rs"]
mod fused_bn;
#[cfg(feature = "cuda")]
#[path = "../../../kernels/batch_norm_nhwc.rs"]
mod fused_bn_nhwc;
#[cfg(feature = "cuda")]
#[path = "../../../kernels/batch_norm_single.rs"]
pub mod fused_bn_single;
#[cfg(feature = "cuda")]
#[path = "../../../kernels/batch_norm_sums.rs"]
mod fused_bn_sums;
#[cfg(feature = "cuda")]
#[path = "../../../kernels/batch_norm_tiles.rs"]
mod fused_bn_tiles;
#[cfg(feature = "cuda")]
pub use fused_bn_tiles::choose_channels_last_grad;
pub mod grad_operands;
#[cfg(feature = "cuda")]
pub mod grads_into;
pub(crate) mod host;
#[cfg(feature = "cuda")]
#[path = "../../../kernels/im2col.rs"]
pub mod im2col;
pub mod input_operands;
#[cfg(feature = "cuda")]
#[path = "../../../kernels/leading_sum.rs"]
mod leading_sum;
#[cfg(feature = "cuda")]
pub mod matmul;
#[cfg(feature = "cuda")]
#[path = "../../../kernels/silu.rs"]
mod silu_kernels;
pub mod softmax;
#[cfg(feature = "cuda")]
pub mod stats_into;
#[cfg(feature = "cuda")]
#[path = "../../../kernels/tf32_gemm.rs"]
mod tf32_gemm;
pub mod trace;
#[cfg(feature = "cuda")]
#[path = "../../../kernels/tree.rs"]
mod tree;
pub mod wgrad;

pub use bn_act::batch_norm_act;
pub use conv::options as conv_options;
#[cfg(feature = "cuda")]
pub(crate) use cuda::{cuda_f32, from_cube};

use burn::backend::ops::ConvOptions;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, Dispatch, Shape, TensorMetadata, backend_extension};
use burn::nn::conv::Conv2d;
use burn::prelude::*;
use burn::tensor::FloatDType;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU8, Ordering};

/// Which convolution and BatchNorm-training operations the model runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ConvBnOps {
    /// Ours (this module): BatchNorm + SiLU fused into three kernels forward and three backward
    /// on CUDA (`kernels/batch_norm.rs`) and a few loops on the CPU (`cpu.rs`); implicit-GEMM
    /// convolutions on CUDA.
    #[default]
    Fast,
    /// As `Fast`, but BatchNorm + SiLU as staged tensor operations (for comparisons).
    Staged,
    /// Burn's `conv2d` and `batch_norm_train`.
    Stock,
}

static CONV_BN_OPS: AtomicU8 = AtomicU8::new(0);

/// Chooses the operations for the whole process (the model reads it on every forward).
pub fn set_conv_bn_ops(ops: ConvBnOps) {
    CONV_BN_OPS.store(ops as u8, Ordering::Relaxed);
}

/// The operations in effect.
pub fn conv_bn_ops() -> ConvBnOps {
    match CONV_BN_OPS.load(Ordering::Relaxed) {
        0 => ConvBnOps::Fast,
        1 => ConvBnOps::Staged,
        _ => ConvBnOps::Stock,
    }
}

/// The default bodies are any backend's: staged BatchNorm, Burn's convolutions. The CPU's
/// (`cpu.rs`) and CUDA's (`cuda.rs`) override them.
#[backend_extension(Flex, Cube: cfg(feature = "cuda"), Autodiff)]
pub trait FastOps: Backend {
    /// BatchNorm with the batch's statistics, then SiLU when `act`, and the running statistics'
    /// update `old · (1 − momentum) + stat · momentum`:
    /// `(output, mean, biased variance, running mean', running variance')`.
    // The five outputs stay a plain tuple: `backend_extension` maps each element of it.
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn bn_act_train(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        running_mean: FloatTensor<Self>,
        running_var: FloatTensor<Self>,
        epsilon: f64,
        momentum: f64,
        act: bool,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    ) {
        let [out, mean, var, new_mean, new_var] = batch_norm::act_train::<Self>(
            x,
            gamma,
            beta,
            running_mean,
            running_var,
            epsilon,
            momentum,
            act,
        );
        (out, mean, var, new_mean, new_var)
    }
    /// [`FastOps::bn_act_train`]; where a convolution computed in `dtype` (`Some`) takes the
    /// output as its input, also that input as the convolution's GEMM takes it, where the
    /// backend makes it with the output ([`FastOps::conv_in_given`] takes it); `None` here.
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn bn_act_train_operand(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        running_mean: FloatTensor<Self>,
        running_var: FloatTensor<Self>,
        epsilon: f64,
        momentum: f64,
        act: bool,
        _dtype: Option<FloatDType>,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        Option<FloatTensor<Self>>,
    ) {
        let (out, mean, var, new_mean, new_var) = Self::bn_act_train(
            x,
            gamma,
            beta,
            running_mean,
            running_var,
            epsilon,
            momentum,
            act,
        );
        (out, mean, var, new_mean, new_var, None)
    }
    /// Gradients of [`FastOps::bn_act_train`]'s output: `(x, gamma, beta)`.
    #[allow(clippy::too_many_arguments)]
    fn bn_act_train_backward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        variance: FloatTensor<Self>,
        epsilon: f64,
        act: bool,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        batch_norm::act_backward::<Self>(x, gamma, beta, mean, variance, epsilon, act, grad)
    }
    /// [`FastOps::bn_act_train_backward`], where the BatchNorm's input is the output of a
    /// convolution computed in `dtype` whose data gradient will want its output gradient (this
    /// `x`'s gradient) with `channels` channels as its GEMM operand: also that operand, where
    /// the backend makes it with the gradient ([`FastOps::conv_in_x_backward_with`] takes it);
    /// `None` here.
    #[allow(clippy::too_many_arguments)]
    fn bn_act_train_backward_operand(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        variance: FloatTensor<Self>,
        epsilon: f64,
        act: bool,
        grad: FloatTensor<Self>,
        _dtype: FloatDType,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        Option<FloatTensor<Self>>,
    ) {
        let (dx, d_gamma, d_beta) =
            Self::bn_act_train_backward(x, gamma, beta, mean, variance, epsilon, act, grad);
        (dx, d_gamma, d_beta, None)
    }
    /// A convolution without bias.
    fn conv(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        Self::conv2d(x, weight, None, options)
    }
    /// Gradient of [`FastOps::conv`] with respect to its input.
    fn conv_x_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        Self::conv2d_x_backward(x, weight, grad, options)
    }
    /// Gradient of [`FastOps::conv`] with respect to its weight.
    fn conv_weight_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        Self::conv2d_weight_backward(x, weight, grad, options)
    }
    /// Autocast's convolution as one operation: [`FastOps::conv`] of FP32 `x` and `weight`
    /// computed in `dtype` (both cast down, the result cast back to FP32). Its backward casts only
    /// the incoming gradient down and the data gradient up, and takes the weight gradient from the
    /// FP32 operands, where cast nodes around [`FastOps::conv`] took six casts per convolution.
    fn conv_in(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        options: ConvOptions<2>,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        let y = Self::conv(
            Self::float_cast(x, dtype),
            Self::float_cast(weight, dtype),
            options,
        );
        Self::float_cast(y, FloatDType::F32)
    }
    /// SiLU, `x · σ(x)`, as one operation (one kernel on CUDA, `kernels/silu.rs`).
    fn silu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_mul(x.clone(), Self::sigmoid(x))
    }
    /// Gradient of [`FastOps::silu`] at `x` for the incoming `grad`:
    /// `grad · σ(x) · (1 + x · (1 − σ(x)))`.
    fn silu_backward(x: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        silu_backward_ops::<Self>(x, grad)
    }
    /// The flow's coupling net on points `x` (`[G, M, 2]`): `Linear(2, h) → SiLU → Linear(h, h)
    /// → SiLU → Linear(h, 2)`, weights `[in, out]` as Burn's `Linear` keeps them, biases
    /// `[out]` (`coupling.rs`).
    #[allow(clippy::too_many_arguments)]
    fn coupling_net(
        x: FloatTensor<Self>,
        w1: FloatTensor<Self>,
        b1: FloatTensor<Self>,
        w2: FloatTensor<Self>,
        b2: FloatTensor<Self>,
        w3: FloatTensor<Self>,
        b3: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        coupling::forward::<Self>(x, [w1, b1, w2, b2, w3, b3])
    }
    /// Gradients of [`FastOps::coupling_net`] for the incoming `grad` (`[G, M, 2]`):
    /// `(dx, dw1, db1, dw2, db2, dw3, db3)`, each parameter's summed over every point.
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn coupling_net_backward(
        x: FloatTensor<Self>,
        w1: FloatTensor<Self>,
        b1: FloatTensor<Self>,
        w2: FloatTensor<Self>,
        b2: FloatTensor<Self>,
        w3: FloatTensor<Self>,
        b3: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    ) {
        let (dx, [dw1, db1, dw2, db2, dw3, db3]) =
            coupling::backward::<Self>(x, [w1, b1, w2, b2, w3, b3], grad);
        (dx, dw1, db1, dw2, db2, dw3, db3)
    }
    /// One affine coupling of the flow on the state `[G, M, c ≥ 3]` (columns `z0, z1`, the
    /// running log-determinant; any after them unread), the kept coordinate `keep`: with
    /// `x` = the point with its other coordinate zero, `s = tanh(s_net(x))` and
    /// `t = t_net(x)` on the other coordinate, `z' = (z − t) · exp(−s)` there, the kept one
    /// unchanged, `log_det' = log_det − s`. Returns `[G, M, 5]`: `z0', z1', log_det', s, t`
    /// ([`coupling::STATE`]). Each net's six parameters are [`FastOps::coupling_net`]'s.
    #[allow(clippy::too_many_arguments)]
    fn coupling(
        state: FloatTensor<Self>,
        keep: usize,
        sw1: FloatTensor<Self>,
        sb1: FloatTensor<Self>,
        sw2: FloatTensor<Self>,
        sb2: FloatTensor<Self>,
        sw3: FloatTensor<Self>,
        sb3: FloatTensor<Self>,
        tw1: FloatTensor<Self>,
        tb1: FloatTensor<Self>,
        tw2: FloatTensor<Self>,
        tb2: FloatTensor<Self>,
        tw3: FloatTensor<Self>,
        tb3: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let s_net = [sw1, sb1, sw2, sb2, sw3, sb3];
        let t_net = [tw1, tb1, tw2, tb2, tw3, tb3];
        coupling::layer_forward::<Self>(state, keep, s_net, t_net)
    }
    /// Gradients of [`FastOps::coupling`] for the incoming `grad` (`[G, M, 5]`), given its
    /// result `out`: the state's (shaped as it), then the s-net's six and the t-net's six,
    /// each summed over every point.
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn coupling_backward(
        state: FloatTensor<Self>,
        keep: usize,
        sw1: FloatTensor<Self>,
        sb1: FloatTensor<Self>,
        sw2: FloatTensor<Self>,
        sb2: FloatTensor<Self>,
        sw3: FloatTensor<Self>,
        sb3: FloatTensor<Self>,
        tw1: FloatTensor<Self>,
        tb1: FloatTensor<Self>,
        tw2: FloatTensor<Self>,
        tb2: FloatTensor<Self>,
        tw3: FloatTensor<Self>,
        tb3: FloatTensor<Self>,
        out: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    ) {
        let s_net = [sw1, sb1, sw2, sb2, sw3, sb3];
        let t_net = [tw1, tb1, tw2, tb2, tw3, tb3];
        let (d, [a, b, c, e, f, g], [h, i, j, k, l, m]) =
            coupling::layer_backward::<Self>(state, keep, s_net, t_net, out, grad);
        (d, a, b, c, e, f, g, h, i, j, k, l, m)
    }
    /// `y + bias` for each channel of `[N, C, H, W]` `y` (`bias` `[C]`).
    fn add_bias(y: FloatTensor<Self>, bias: FloatTensor<Self>) -> FloatTensor<Self> {
        let c = bias.shape()[0];
        Self::float_add(y, Self::float_reshape(bias, Shape::new([1, c, 1, 1])))
    }
    /// `Σ` over N, H and W of each channel of `[N, C, H, W]` `x`, as `[C]`: the gradient of
    /// [`FastOps::add_bias`]'s bias.
    fn channel_sums(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let c = x.shape()[1];
        let s = Self::float_sum_dim(Self::float_sum_dim(Self::float_sum_dim(x, 3), 2), 0);
        Self::float_reshape(s, Shape::new([c]))
    }
    /// `Σ` along the last axis of a 2-D `x`, `[R, C]` → `[R, 1]`, in an order fixed by the
    /// shape. CUDA sums each row with a cube (Burn without autotune gives every row to one unit:
    /// a row of 28,926 values took 0.63 ms on the H200, docs/perf_log.md AM1).
    fn row_sums(x: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_sum_dim(x, 1)
    }
    /// Elements `start..start + len` of the 1-D `x`, whose elements `start..start + reach`
    /// (`reach ≥ len`) belong to this segment alone. CUDA makes it a view of `x`'s buffer when
    /// `start` and the end of `reach` fall on the allocator's alignment: Burn's `slice` makes a
    /// view only when the slice's own end does, and copies otherwise (docs/kernels.md).
    fn segment(x: FloatTensor<Self>, start: usize, len: usize, reach: usize) -> FloatTensor<Self> {
        debug_assert!(reach >= len);
        Self::float_slice(x, &[burn::tensor::Slice::from(start..start + len)])
    }
    /// The weight as [`FastOps::conv_in_with`] and [`FastOps::conv_in_x_backward_with`] take
    /// it, made once for both: here the weight itself (the defaults cast it each time); on CUDA
    /// the GEMM's operand, channels-last, cast and padded, which the data gradient would make
    /// again. Beside it, where `data_grad` (the input wants a gradient) and the backend's data
    /// gradient reads the weight in another layout, that form, made in the same launch
    /// ([`FastOps::conv_in_x_backward_swapped`] takes it; on CUDA our BF16 kernel's, the
    /// channel axes swapped); `None` here.
    fn conv_in_operand(
        weight: FloatTensor<Self>,
        _options: ConvOptions<2>,
        _dtype: FloatDType,
        _data_grad: bool,
    ) -> (FloatTensor<Self>, Option<FloatTensor<Self>>) {
        (weight, None)
    }
    /// [`FastOps::conv_in`] with the weight's operand of [`FastOps::conv_in_operand`].
    fn conv_in_with(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        _operand: FloatTensor<Self>,
        options: ConvOptions<2>,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        Self::conv_in(x, weight, options, dtype)
    }
    /// [`FastOps::conv_in_with`] with `x`'s GEMM operand too, as the BatchNorm before the
    /// convolution made it ([`FastOps::bn_act_train_operand`]).
    fn conv_in_given(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        operand: FloatTensor<Self>,
        _x_operand: FloatTensor<Self>,
        options: ConvOptions<2>,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        Self::conv_in_with(x, weight, operand, options, dtype)
    }
    /// [`FastOps::conv_in_x_backward`] with the weight's operand of
    /// [`FastOps::conv_in_operand`].
    fn conv_in_x_backward_with(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        _operand: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        options: ConvOptions<2>,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        Self::conv_in_x_backward(x, weight, grad, options, dtype)
    }
    /// [`FastOps::conv_in_x_backward_with`] with `grad`'s GEMM operand too, as the BatchNorm
    /// after the convolution made it ([`FastOps::bn_act_train_backward_operand`]).
    #[allow(clippy::too_many_arguments)]
    fn conv_in_x_backward_given(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        operand: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        _grad_operand: FloatTensor<Self>,
        options: ConvOptions<2>,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        Self::conv_in_x_backward_with(x, weight, operand, grad, options, dtype)
    }
    /// [`FastOps::conv_in_x_backward_with`] with the data gradient's form of the weight
    /// (`swapped`, made by [`FastOps::conv_in_operand`]); here it is not used.
    fn conv_in_x_backward_swapped(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        operand: FloatTensor<Self>,
        _swapped: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        options: ConvOptions<2>,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        Self::conv_in_x_backward_with(x, weight, operand, grad, options, dtype)
    }
    /// [`FastOps::conv_in_x_backward_given`] with the data gradient's form of the weight, as
    /// [`FastOps::conv_in_x_backward_swapped`].
    #[allow(clippy::too_many_arguments)]
    fn conv_in_x_backward_swapped_given(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        operand: FloatTensor<Self>,
        _swapped: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        grad_operand: FloatTensor<Self>,
        options: ConvOptions<2>,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        Self::conv_in_x_backward_given(x, weight, operand, grad, grad_operand, options, dtype)
    }
    /// Gradient of [`FastOps::conv_in`] with respect to its (FP32) weight, in FP32: here
    /// [`FastOps::conv_weight_backward`]'s, from the FP32 operands (CUDA may take reduced ones,
    /// `wgrad::choose_reduced`).
    fn conv_in_weight_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        options: ConvOptions<2>,
        _dtype: FloatDType,
    ) -> FloatTensor<Self> {
        Self::conv_weight_backward(x, weight, grad, options)
    }
    /// Gradient of [`FastOps::conv_in`] with respect to its (FP32) input, in FP32.
    fn conv_in_x_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        options: ConvOptions<2>,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        let dx = Self::conv_x_backward(
            Self::float_cast(x, dtype),
            Self::float_cast(weight, dtype),
            Self::float_cast(grad, dtype),
            options,
        );
        Self::float_cast(dx, FloatDType::F32)
    }
}

/// [`FastOps::silu_backward`] as tensor operations (any backend, any dtype).
fn silu_backward_ops<B: Backend>(x: FloatTensor<B>, grad: FloatTensor<B>) -> FloatTensor<B> {
    let s = B::sigmoid(x.clone());
    let one_minus = B::float_add_scalar(B::float_neg(s.clone()), 1.0.into());
    let inner = B::float_add_scalar(B::float_mul(x, one_minus), 1.0.into());
    B::float_mul(grad, B::float_mul(s, inner))
}

/// A convolution without bias through [`FastOps::conv`].
pub fn conv2d(x: Tensor<4>, weight: Tensor<4>, options: ConvOptions<2>) -> Tensor<4> {
    trace::note(&x, &weight, &options, None);
    Tensor::from_dispatch(Dispatch::conv(
        x.into_dispatch(),
        weight.into_dispatch(),
        options,
    ))
}

/// [`FastOps::conv_in`]: FP32 `x` and `weight` convolved in `dtype`, the result in FP32.
pub fn conv2d_in(
    x: Tensor<4>,
    weight: Tensor<4>,
    options: ConvOptions<2>,
    dtype: FloatDType,
) -> Tensor<4> {
    trace::note(&x, &weight, &options, Some(dtype));
    Tensor::from_dispatch(Dispatch::conv_in(
        x.into_dispatch(),
        weight.into_dispatch(),
        options,
        dtype,
    ))
}

/// Whether `conv` runs through [`conv2d`] (with its bias, if any, added after): unless
/// [`ConvBnOps::Stock`].
pub fn takes(_conv: &Conv2d) -> bool {
    conv_bn_ops() != ConvBnOps::Stock
}

/// Elements `start..start + len` of `x` through [`FastOps::segment`]: a view on CUDA when
/// `start` and `start + reach` are aligned, else a copy.
pub fn segment(x: Tensor<1>, start: usize, len: usize, reach: usize) -> Tensor<1> {
    Tensor::from_dispatch(Dispatch::segment(x.into_dispatch(), start, len, reach))
}

/// Where `x`'s values sit, `(allocation, byte offset)`, when `x` is a contiguous FP32 CUDA
/// tensor; `None` elsewhere. Sorting by it puts views of one buffer in the buffer's order.
pub fn storage(x: &Tensor<1>) -> Option<(usize, u64)> {
    #[cfg(feature = "cuda")]
    return cuda::storage(x);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = x;
        None
    }
}

/// `parts[i..j]` (`j ≥ i + 2`, the longest such run) as one tensor of elements
/// `offsets[i]..offsets[j - 1] + sizes[j - 1]`, with `j`, when they are FP32 CUDA views of one
/// allocation lying at the distances that `offsets` (in elements) give: copying the run is one
/// copy of the view. `None` when they are not (always off CUDA).
pub fn run(
    parts: &[Option<Tensor<1>>],
    offsets: &[usize],
    sizes: &[usize],
    i: usize,
) -> Option<(usize, Tensor<1>)> {
    #[cfg(feature = "cuda")]
    return cuda::run(parts, offsets, sizes, i);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (parts, offsets, sizes, i);
        None
    }
}

/// SiLU through [`FastOps::silu`].
pub fn silu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    Tensor::from_dispatch(Dispatch::silu(x.into_dispatch()))
}

/// [`FastOps::row_sums`]: `[R, C]` → `[R, 1]`, deterministic on every backend.
pub fn row_sums(x: Tensor<2>) -> Tensor<2> {
    Tensor::from_dispatch(Dispatch::row_sums(x.into_dispatch()))
}

/// `y + bias` per output channel through [`FastOps::add_bias`], when `bias` is given.
pub fn add_bias(y: Tensor<4>, bias: Option<Tensor<1>>) -> Tensor<4> {
    match bias {
        Some(b) => Tensor::from_dispatch(Dispatch::add_bias(y.into_dispatch(), b.into_dispatch())),
        None => y,
    }
}

/// `conv.forward(x)`, through [`conv2d`] when it [`takes`] the convolution. The head's biased
/// 1×1 predictors run here in FP32: Burn's direct kernel took 18 ms of a step's GPU time on
/// the H200 for their gradients, and its bias gradient 4.6 ms (docs/perf_log.md, 2026-12-01).
pub fn conv_forward(conv: &Conv2d, x: Tensor<4>) -> Tensor<4> {
    if !takes(conv) {
        return conv.forward(x);
    }
    let y = conv2d(x, conv.weight.val(), conv::options(conv));
    add_bias(y, conv.bias.as_ref().map(|b| b.val()))
}

#[cfg(test)]
mod tests;
