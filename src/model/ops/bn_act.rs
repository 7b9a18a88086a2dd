//! BatchNorm followed by SiLU as the model calls it ([`batch_norm_act`]): one operation of ours
//! in training and inference, or Burn's under [`ConvBnOps::Stock`].

#[cfg(feature = "cuda")]
use super::cuda;
use super::{ConvBnOps, FastOps, conv_bn_ops, cpu_batch_norm, input_operands};
use burn::backend::Dispatch;
use burn::module::{ModuleMapper, Param, RunningState};
use burn::nn::BatchNorm;
use burn::prelude::*;

/// `bn.forward(x)`, then SiLU when `act`: in training one [`FastOps::bn_act_train`] with the
/// batch's statistics and the same running-statistics update as Burn's
/// `BatchNorm::forward_train`; in inference on CUDA one kernel with the running statistics, on
/// the CPU one pass ([`cpu_batch_norm::bn_act_inference`]); otherwise Burn's inference (and under [`ConvBnOps::Stock`] Burn's own training BatchNorm) and
/// Burn's `silu`.
pub fn batch_norm_act(bn: &BatchNorm, x: Tensor<4>, act: bool) -> Tensor<4> {
    let device = x.device();
    let training = device.is_autodiff() && bn.training.is_enabled();
    #[cfg(feature = "cuda")]
    if !training
        && conv_bn_ops() != ConvBnOps::Stock
        && let Some(y) = cuda::bn_act_inference(bn, &x, act)
    {
        return y;
    }
    if !training
        && conv_bn_ops() != ConvBnOps::Stock
        && let Some(y) = cpu_batch_norm::bn_act_inference(bn, &x, act)
    {
        return y;
    }
    if !training || conv_bn_ops() == ConvBnOps::Stock {
        let y = bn.forward(x);
        return if act {
            burn::tensor::activation::silu(y)
        } else {
            y
        };
    }
    let running_mean = bn.running_mean.value_sync().to_device(&device);
    let running_var = bn.running_var.value_sync().to_device(&device);
    input_operands::next(bn.gamma.id);
    let (out, _mean, _var, new_mean, new_var) = Dispatch::bn_act_train(
        x.into_dispatch(),
        bn.gamma.val().into_dispatch(),
        bn.beta.val().into_dispatch(),
        running_mean.into_dispatch(),
        running_var.into_dispatch(),
        bn.epsilon,
        bn.momentum,
        act,
    );
    set_running(&bn.running_mean, Tensor::from_dispatch(new_mean).detach());
    set_running(&bn.running_var, Tensor::from_dispatch(new_var).detach());
    Tensor::from_dispatch(out)
}

/// Makes `value` the running state's value, as `RunningState::update` followed by a read does on
/// one thread, but without its merge: `update` keeps one value per thread and the next read
/// averages them, a division by one launched per statistic per step (~100 launches a step for
/// the nano pose model's head alone). The state's clones share the value, as they share
/// `update`'s. Every model here is trained by one thread (data-parallel ranks own theirs).
pub(super) fn set_running(state: &RunningState<Tensor<1>>, value: Tensor<1>) {
    struct Set(Option<Tensor<1>>);
    impl ModuleMapper for Set {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
            let value = self.0.take().expect("a running state holds one tensor");
            Param::initialized(param.id, value.reshape(param.shape()))
        }
    }
    let _shared = state.clone().map(&mut Set(Some(value)));
}
