//! Our operations on CUDA: the fused BatchNorm + SiLU kernels, CubeCL's implicit GEMM with
//! channels-last, padded operands for convolutions, the channel sums of bias gradients and SiLU.

use super::{
    ConvBnOps, FastOps, batch_norm, channels, conv, conv_bn_ops, coupling, coupling_kernels,
    fused_bn, silu_kernels,
};
use burn::backend::ops::ConvOptions;
use burn::backend::tensor::FloatTensor;
use burn::backend::{BackendTensor, DispatchTensor, DispatchTensorKind};
use burn::prelude::*;
use burn::tensor::DType::F32;
use burn::tensor::FloatDType;
// Our SiLU and channel-sum kernels take FP32; Burn's cast returns a tensor already in the asked
// dtype as it is, so FP32 inputs pass through with no launch either way.
use burn_cubecl::kernel::cast;
use burn_cubecl::tensor::CubeTensor;
use std::cell::RefCell;
use std::thread::LocalKey;

impl FastOps for burn_cubecl::CubeBackend {
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
        let (out, mean, var, new_mean, new_var, _) = Self::bn_act_train_operand(
            x,
            gamma,
            beta,
            running_mean,
            running_var,
            epsilon,
            momentum,
            act,
            None,
        );
        (out, mean, var, new_mean, new_var)
    }
    fn bn_act_train_operand(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        running_mean: FloatTensor<Self>,
        running_var: FloatTensor<Self>,
        epsilon: f64,
        momentum: f64,
        act: bool,
        dtype: Option<FloatDType>,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        Option<FloatTensor<Self>>,
    ) {
        let operand = dtype.map(|d| (conv::gemm::padded(x.meta.shape()[1]), d.into()));
        let ([out, mean, var, new_mean, new_var], operand) = if conv_bn_ops() == ConvBnOps::Staged {
            let all = batch_norm::act_train::<Self>(
                x,
                gamma,
                beta,
                running_mean,
                running_var,
                epsilon,
                momentum,
                act,
            );
            (all, None)
        } else {
            fused_bn::forward(
                x,
                gamma,
                beta,
                running_mean,
                running_var,
                epsilon as f32,
                momentum as f32,
                act,
                operand,
            )
        };
        (out, mean, var, new_mean, new_var, operand)
    }
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
        let (dx, d_gamma, d_beta, _) =
            bn_backward(x, gamma, beta, mean, variance, epsilon, act, grad, None);
        (dx, d_gamma, d_beta)
    }
    fn bn_act_train_backward_operand(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        variance: FloatTensor<Self>,
        epsilon: f64,
        act: bool,
        grad: FloatTensor<Self>,
        dtype: FloatDType,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        Option<FloatTensor<Self>>,
    ) {
        let channels = conv::gemm::padded(x.meta.shape()[1]);
        let operand = Some((channels, dtype.into()));
        bn_backward(x, gamma, beta, mean, variance, epsilon, act, grad, operand)
    }
    fn conv(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        conv::gemm::forward(x, weight, options)
    }
    fn conv_x_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        conv::gemm::x_backward(x, weight, grad, options)
    }
    fn conv_weight_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        conv::gemm::weight_backward(x, weight, grad, options)
    }
    fn conv_in(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        options: ConvOptions<2>,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        conv::gemm::forward_in(x, weight, options, dtype)
    }
    fn silu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let d = x.dtype;
        cast(silu_kernels::silu(cast(x, F32)), d)
    }
    fn silu_backward(x: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        let d = grad.dtype;
        cast(
            silu_kernels::silu_backward(cast(x, F32), cast(grad, F32)),
            d,
        )
    }
    fn coupling_net(
        x: FloatTensor<Self>,
        w1: FloatTensor<Self>,
        b1: FloatTensor<Self>,
        w2: FloatTensor<Self>,
        b2: FloatTensor<Self>,
        w3: FloatTensor<Self>,
        b3: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let params = [w1, b1, w2, b2, w3, b3];
        match coupling_kernels::supported(&x, &params) {
            Some(h) => coupling_kernels::forward(x, params, h),
            None => coupling::forward::<Self>(x, params),
        }
    }
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
        let params = [w1, b1, w2, b2, w3, b3];
        let (dx, [dw1, db1, dw2, db2, dw3, db3]) =
            match coupling_kernels::supported(&x, &params).filter(|_| grad.dtype == F32) {
                Some(h) => coupling_kernels::backward(x, params, grad, h),
                None => coupling::backward::<Self>(x, params, grad),
            };
        (dx, dw1, db1, dw2, db2, dw3, db3)
    }
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
        use coupling_kernels::layer_kernels;
        let s_net = [sw1, sb1, sw2, sb2, sw3, sb3];
        let t_net = [tw1, tb1, tw2, tb2, tw3, tb3];
        match layer_kernels::supported(&state, &s_net, &t_net) {
            Some(h) => layer_kernels::forward(state, keep, s_net, t_net, h),
            None => coupling::layer_forward::<Self>(state, keep, s_net, t_net),
        }
    }
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
        use coupling_kernels::layer_kernels;
        let s_net = [sw1, sb1, sw2, sb2, sw3, sb3];
        let t_net = [tw1, tb1, tw2, tb2, tw3, tb3];
        let kernels = layer_kernels::supported(&state, &s_net, &t_net)
            .filter(|_| grad.dtype == F32 && out.dtype == F32);
        let (d, [a, b, c, e, f, g], [h, i, j, k, l, m]) = match kernels {
            Some(h) => layer_kernels::backward(state, keep, s_net, t_net, out, grad, h),
            None => coupling::layer_backward::<Self>(state, keep, s_net, t_net, out, grad),
        };
        (d, a, b, c, e, f, g, h, i, j, k, l, m)
    }
    fn segment(x: FloatTensor<Self>, start: usize, len: usize, reach: usize) -> FloatTensor<Self> {
        let size = x.dtype.size();
        let total = x.meta.shape()[0];
        let align = x.client.properties().memory.alignment;
        let (head, tail) = (
            (start * size) as u64,
            ((total - start - reach) * size) as u64,
        );
        if x.meta.strides()[0] != 1 || !head.is_multiple_of(align) || !tail.is_multiple_of(align) {
            let range = [burn::tensor::Slice::from(start..start + len)];
            return <Self as burn::backend::ops::FloatTensorOps<Self>>::float_slice(x, &range);
        }
        let handle = x.handle.clone().offset_start(head).offset_end(tail);
        let meta = burn_cubecl::cubecl::zspace::metadata::Metadata::new([len], [1]);
        burn_cubecl::tensor::CubeTensor::new(
            x.client.clone(),
            handle,
            meta,
            x.device.clone(),
            x.dtype,
        )
    }
    fn channel_sums(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let d = x.dtype;
        cast(channels::channel_sums(cast(x, F32)), d)
    }
    fn row_sums(x: FloatTensor<Self>) -> FloatTensor<Self> {
        cube_row_sums(x)
    }
    fn conv_in_operand(
        weight: FloatTensor<Self>,
        options: ConvOptions<2>,
        dtype: FloatDType,
        data_grad: bool,
    ) -> (FloatTensor<Self>, Option<FloatTensor<Self>>) {
        conv::gemm::weight_operand(weight, &options, dtype, data_grad)
    }
    fn conv_in_with(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        operand: FloatTensor<Self>,
        options: ConvOptions<2>,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        conv::gemm::forward_with(x, weight, [Some(operand), None], options, dtype)
    }
    fn conv_in_given(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        operand: FloatTensor<Self>,
        x_operand: FloatTensor<Self>,
        options: ConvOptions<2>,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        conv::gemm::forward_with(x, weight, [Some(operand), Some(x_operand)], options, dtype)
    }
    fn conv_in_x_backward_with(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        operand: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        options: ConvOptions<2>,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        conv::gemm::x_backward_with(x, weight, [Some(operand), None, None], grad, options, dtype)
    }
    fn conv_in_x_backward_swapped(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        operand: FloatTensor<Self>,
        swapped: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        options: ConvOptions<2>,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        let operands = [Some(operand), Some(swapped), None];
        conv::gemm::x_backward_with(x, weight, operands, grad, options, dtype)
    }
    fn conv_in_x_backward_swapped_given(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        operand: FloatTensor<Self>,
        swapped: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        grad_operand: FloatTensor<Self>,
        options: ConvOptions<2>,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        let operands = [Some(operand), Some(swapped), Some(grad_operand)];
        conv::gemm::x_backward_with(x, weight, operands, grad, options, dtype)
    }
    fn conv_in_x_backward_given(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        operand: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        grad_operand: FloatTensor<Self>,
        options: ConvOptions<2>,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        conv::gemm::x_backward_with(
            x,
            weight,
            [Some(operand), None, Some(grad_operand)],
            grad,
            options,
            dtype,
        )
    }
    fn conv_in_weight_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        options: ConvOptions<2>,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        conv::gemm::weight_backward_in(x, weight, grad, options, dtype)
    }
    fn conv_in_x_backward(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        options: ConvOptions<2>,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        conv::gemm::x_backward_in(x, weight, grad, options, dtype)
    }
}

/// `(dx, dγ, dβ)` of the fused BatchNorm + SiLU, and with `operand` `(channels, dtype)` the
/// convolution's output-gradient operand where the fused kernels make it
/// (`kernels/batch_norm.rs::backward`); the staged operations make none.
#[allow(clippy::too_many_arguments)]
fn bn_backward(
    x: CubeTensor,
    gamma: CubeTensor,
    beta: CubeTensor,
    mean: CubeTensor,
    variance: CubeTensor,
    epsilon: f64,
    act: bool,
    grad: CubeTensor,
    operand: Option<(usize, burn::tensor::DType)>,
) -> (CubeTensor, CubeTensor, CubeTensor, Option<CubeTensor>) {
    if conv_bn_ops() == ConvBnOps::Staged {
        let (dx, d_gamma, d_beta) = batch_norm::act_backward::<burn_cubecl::CubeBackend>(
            x, gamma, beta, mean, variance, epsilon, act, grad,
        );
        return (dx, d_gamma, d_beta, None);
    }
    let ([dx, d_gamma, d_beta], operand) = fused_bn::backward(
        x,
        gamma,
        beta,
        mean,
        variance,
        grad,
        epsilon as f32,
        act,
        operand,
    );
    (dx, d_gamma, d_beta, operand)
}

/// Each row of `[R, C]` `x` summed by one cube (cubek's cube routine: a fixed stride per unit,
/// then a fixed tree through planes and shared memory, no atomics, so the same bits every run).
/// Burn's `sum_dim` without autotune takes the unit routine, one unit walking a whole row.
fn cube_row_sums(x: CubeTensor) -> CubeTensor {
    use burn_cubecl::kernel::reduce::{KernelReduceStrategy, reduce_dim};
    use cubek::reduce::components::instructions::ReduceOperationConfig;
    use cubek::reduce::launch::{ReduceStrategy, RoutineStrategy, VectorizationStrategy};
    use cubek::reduce::routines::{BlueprintStrategy, cube::CubeStrategy};
    let strategy = ReduceStrategy {
        routine: RoutineStrategy::Cube(BlueprintStrategy::Inferred(CubeStrategy {
            use_planes: true,
        })),
        vectorization: VectorizationStrategy {
            parallel_output_vectorization: false,
        },
        autotune_level: Default::default(),
    };
    reduce_dim(
        x,
        None,
        1,
        KernelReduceStrategy::Specific(strategy),
        ReduceOperationConfig::Sum,
    )
    .expect("a sum along a row of a 2-D CUDA tensor is a valid reduction")
}

/// BatchNorm inference with the running statistics, then SiLU when `act`, as one kernel
/// (`kernels/batch_norm.rs`), when `x` and the layer's tensors are FP32 CUDA tensors outside
/// autodiff; `None` otherwise.
pub fn bn_act_inference(bn: &burn::nn::BatchNorm, x: &Tensor<4>, act: bool) -> Option<Tensor<4>> {
    if x.device().is_autodiff() {
        return None;
    }
    let y = fused_bn::inference(
        cuda_f32(x)?,
        cuda_f32(&bn.gamma.val())?,
        cuda_f32(&bn.beta.val())?,
        cuda_f32(&bn.running_mean.value())?,
        cuda_f32(&bn.running_var.value())?,
        bn.epsilon as f32,
        act,
    );
    Some(from_cube(y))
}

/// The FP32 CUDA tensor inside `t` (past any autodiff wrapper), or `None` for any other dtype
/// or device.
pub(crate) fn cuda_f32<const D: usize>(t: &Tensor<D>) -> Option<CubeTensor> {
    match t.clone().inner().into_dispatch().kind {
        DispatchTensorKind::Cube(BackendTensor::Float(c)) if c.dtype == F32 => Some(c),
        _ => None,
    }
}

/// `c` as a tensor of the (non-autodiff) CUDA device.
pub(crate) fn from_cube<const D: usize>(c: CubeTensor) -> Tensor<D> {
    Tensor::from_dispatch(DispatchTensor {
        kind: DispatchTensorKind::Cube(BackendTensor::Float(c)),
        autodiff: Default::default(),
    })
}

/// `x`'s CUDA tensor when it is a contiguous 1-D FP32 tensor on a CUDA device.
fn contiguous_f32(x: &Tensor<1>) -> Option<CubeTensor> {
    cuda_f32(x).filter(|c| c.meta.strides()[0] == 1)
}

/// See [`super::storage`].
pub fn storage(x: &Tensor<1>) -> Option<(usize, u64)> {
    Some(storage_of(&contiguous_f32(x)?))
}

/// The allocation `c` lies in and its byte offset there.
pub(super) fn storage_of(c: &CubeTensor) -> (usize, u64) {
    (
        c.handle.memory.descriptor().id.value,
        c.handle.offset_start.unwrap_or(0),
    )
}

/// Buffers registered, by the storage of the tensor whose new value each receives, on one
/// thread while a closure runs ([`with_registered`]): `grads_into`'s gradient destinations and
/// `stats_into`'s running statistics.
pub(super) type Registered = RefCell<Vec<((usize, u64), CubeTensor)>>;

/// Runs `f` with `entries` in `list`, and empties it after.
pub(super) fn with_registered<R>(
    list: &'static LocalKey<Registered>,
    entries: Vec<((usize, u64), CubeTensor)>,
    f: impl FnOnce() -> R,
) -> R {
    list.with(|l| *l.borrow_mut() = entries);
    let r = f();
    list.with(|l| l.borrow_mut().clear());
    r
}

/// The buffer registered in `list` for `c` (the same storage, as many values), taken: each is
/// handed out once.
pub(super) fn take_registered(
    list: &'static LocalKey<Registered>,
    c: &CubeTensor,
) -> Option<CubeTensor> {
    let key = storage_of(c);
    let n = c.meta.shape().num_elements();
    list.with(|l| {
        let mut l = l.borrow_mut();
        let at = l
            .iter()
            .position(|(k, d)| *k == key && d.meta.shape().num_elements() == n)?;
        Some(l.swap_remove(at).1)
    })
}

/// See [`super::run`].
pub fn run(
    parts: &[Option<Tensor<1>>],
    offsets: &[usize],
    sizes: &[usize],
    i: usize,
) -> Option<(usize, Tensor<1>)> {
    let size = F32.size() as u64;
    let at = |k: usize| {
        let c = contiguous_f32(parts[k].as_ref()?)?;
        (c.meta.shape()[0] == sizes[k]).then_some(c)
    };
    let first = at(i)?;
    let (id, base) = (
        first.handle.memory.descriptor().id,
        first.handle.offset_start.unwrap_or(0),
    );
    let mut last = None;
    let mut j = i + 1;
    while j < parts.len() {
        let Some(c) = at(j) else { break };
        let expected = base + (offsets[j] - offsets[i]) as u64 * size;
        if c.handle.memory.descriptor().id != id || c.handle.offset_start.unwrap_or(0) != expected {
            break;
        }
        last = Some(c);
        j += 1;
    }
    let last = last?;
    // The first part's start and the last part's end: both lie inside the one allocation.
    let mut handle = first.handle.clone();
    handle.offset_end = last.handle.offset_end;
    let len = offsets[j - 1] + sizes[j - 1] - offsets[i];
    let meta = burn_cubecl::cubecl::zspace::metadata::Metadata::new([len], [1]);
    let view = CubeTensor::new(
        first.client.clone(),
        handle,
        meta,
        first.device.clone(),
        F32,
    );
    Some((j, from_cube(view)))
}
