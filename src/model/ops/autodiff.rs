//! Our operations under Burn's autodiff: one graph node each, with the backward written by hand
//! ([`FastOps`]' `*_backward` methods), so autodiff records no broadcasts, reductions or
//! activation graph inside them.

use super::FastOps;
mod coupling;
use super::{grad_operands, input_operands};
use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::ops::ConvOptions;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, AutodiffBackend, Backend, Shape, TensorMetadata};
use burn::tensor::FloatDType;
use coupling::{CouplingNetOp, CouplingOp};

#[derive(Debug)]
struct BnActOp;

impl<B: Backend + FastOps> Backward<B, 3> for BnActOp {
    // Input, γ and β are checkpointed; the batch statistics come along as the forward made them;
    // the dtype of the convolution before, when its data gradient takes an operand made here.
    type State = (
        NodeId,
        NodeId,
        NodeId,
        FloatTensor<B>,
        FloatTensor<B>,
        f64,
        bool,
        Option<FloatDType>,
    );

    fn backward(
        self,
        ops: Ops<Self::State, 3>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let [node_x, node_gamma, node_beta] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let (x_state, gamma_state, beta_state, mean, variance, epsilon, act, conv) = ops.state;
        let x = checkpointer.retrieve_node_output::<FloatTensor<B>>(x_state);
        let gamma = checkpointer.retrieve_node_output::<FloatTensor<B>>(gamma_state);
        let beta = checkpointer.retrieve_node_output::<FloatTensor<B>>(beta_state);
        let (x_grad, gamma_grad, beta_grad) = match (conv, &node_x) {
            (Some(dtype), Some(node)) => {
                let (dx, d_gamma, d_beta, operand) = B::bn_act_train_backward_operand(
                    x, gamma, beta, mean, variance, epsilon, act, grad, dtype,
                );
                if let Some(operand) = operand {
                    grad_operands::give::<B>(node.id, operand);
                }
                (dx, d_gamma, d_beta)
            }
            _ => B::bn_act_train_backward(x, gamma, beta, mean, variance, epsilon, act, grad),
        };
        for (node, g) in [
            (node_x, x_grad),
            (node_gamma, gamma_grad),
            (node_beta, beta_grad),
        ] {
            if let Some(node) = node {
                grads.register::<B>(node.id, g);
            }
        }
    }
}

/// A convolution without bias, in FP32 or (`Some((dtype, operand))`, [`FastOps::conv_in_with`])
/// computed in a reduced dtype, the weight's operand kept for the data gradient.
#[derive(Debug)]
struct ConvOp;

impl<B: Backend + FastOps> Backward<B, 2> for ConvOp {
    type State = (
        NodeId,
        NodeId,
        ConvOptions<2>,
        Option<(FloatDType, FloatTensor<B>, Option<FloatTensor<B>>)>,
    );

    fn backward(
        self,
        ops: Ops<Self::State, 2>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let [node_x, node_weight] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let (x_state, weight_state, options, reduced) = ops.state;
        let dtype = reduced.as_ref().map(|(d, _, _)| *d);
        let x = checkpointer.retrieve_node_output::<FloatTensor<B>>(x_state);
        let weight = checkpointer.retrieve_node_output::<FloatTensor<B>>(weight_state);
        if let (Some(nx), Some(nw), None) = (&node_x, &node_weight, dtype)
            && on_the_host::<B>()
        {
            // Two independent matmul-bound computations: on the CPU, one per core. Each is
            // single-threaded and the same whichever thread runs it, so the bits do not move.
            let (dx, dw) = std::thread::scope(|s| {
                let (xc, wc, gc, oc) = (x.clone(), weight.clone(), grad.clone(), options.clone());
                let dw = s.spawn(move || B::conv_weight_backward(xc, wc, gc, oc));
                let dx = B::conv_x_backward(x, weight, grad, options);
                (
                    dx,
                    dw.join().unwrap_or_else(|e| std::panic::resume_unwind(e)),
                )
            });
            grads.register::<B>(nx.id, dx);
            grads.register::<B>(nw.id, dw);
            return;
        }
        if let Some(node) = node_x {
            let (x, w, g, o) = (x.clone(), weight.clone(), grad.clone(), options.clone());
            let dx = match (&reduced, grad_operands::take::<B>(ops.node.id)) {
                (Some((d, operand, Some(swapped))), Some(gp)) => {
                    let (op, sw) = (operand.clone(), swapped.clone());
                    B::conv_in_x_backward_swapped_given(x, w, op, sw, g, gp, o, *d)
                }
                (Some((d, operand, Some(swapped))), None) => {
                    let (op, sw) = (operand.clone(), swapped.clone());
                    B::conv_in_x_backward_swapped(x, w, op, sw, g, o, *d)
                }
                (Some((d, operand, None)), Some(gp)) => {
                    B::conv_in_x_backward_given(x, w, operand.clone(), g, gp, o, *d)
                }
                (Some((d, operand, None)), None) => {
                    B::conv_in_x_backward_with(x, w, operand.clone(), g, o, *d)
                }
                (None, _) => B::conv_x_backward(x, w, g, o),
            };
            grads.register::<B>(node.id, dx);
        }
        if let Some(node) = node_weight {
            let dw = match dtype {
                Some(dtype) => B::conv_in_weight_backward(x, weight, grad, options, dtype),
                None => B::conv_weight_backward(x, weight, grad, options),
            };
            grads.register::<B>(node.id, dw);
        }
    }
}

/// Whether `B` computes on the host (burn-flex), where independent operations may run on
/// different cores; on CUDA they queue on one stream anyway.
fn on_the_host<B: 'static>() -> bool {
    std::any::TypeId::of::<B>() == std::any::TypeId::of::<burn::backend::Flex>()
}

/// [`FastOps::silu`]: its input is checkpointed, the backward is [`FastOps::silu_backward`].
#[derive(Debug)]
struct SiluOp;

impl<B: Backend + FastOps> Backward<B, 1> for SiluOp {
    type State = NodeId;

    fn backward(self, ops: Ops<NodeId, 1>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
        let [node_x] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let x = checkpointer.retrieve_node_output::<FloatTensor<B>>(ops.state);
        if let Some(node) = node_x {
            grads.register::<B>(node.id, B::silu_backward(x, grad));
        }
    }
}

/// [`FastOps::add_bias`]: the input's gradient passes through, the bias's is
/// [`FastOps::channel_sums`] of it (one reduction of ours on CUDA, where the broadcast's backward
/// took three strided ones: 6 ms of a seed-shape step on the H200, docs/perf_log.md).
#[derive(Debug)]
struct BiasOp;

impl<B: Backend + FastOps> Backward<B, 2> for BiasOp {
    type State = ();

    fn backward(self, ops: Ops<(), 2>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_y, node_bias] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        if let Some(node) = node_bias {
            grads.register::<B>(node.id, B::channel_sums(grad.clone()));
        }
        if let Some(node) = node_y {
            grads.register::<B>(node.id, grad);
        }
    }
}

/// [`FastOps::row_sums`]: each row's gradient is its sum's, broadcast along the row (Burn's
/// `sum_dim` multiplies it by ones: the same values, two launches more).
#[derive(Debug)]
struct RowSumsOp;

impl<B: Backend + FastOps> Backward<B, 1> for RowSumsOp {
    type State = Shape;

    fn backward(self, ops: Ops<Shape, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_x] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        if let Some(node) = node_x {
            grads.register::<B>(node.id, B::float_expand(grad, ops.state));
        }
    }
}

/// [`FastOps::conv`] (`dtype` `None`) or [`FastOps::conv_in`] under autodiff: one node.
fn tracked_conv<B: Backend + FastOps, C: CheckpointStrategy>(
    x: FloatTensor<Autodiff<B, C>>,
    weight: FloatTensor<Autodiff<B, C>>,
    options: ConvOptions<2>,
    dtype: Option<FloatDType>,
) -> FloatTensor<Autodiff<B, C>> {
    let inner = |x, w, options| match dtype {
        Some(dtype) => B::conv_in(x, w, options, dtype),
        None => B::conv(x, w, options),
    };
    match ConvOp
        .prepare::<C>([x.node(), weight.node()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(mut prep) => {
            let x_state = prep.checkpoint(&x);
            let weight_state = prep.checkpoint(&weight);
            // The data gradient's GEMM takes an output-gradient operand the BatchNorm after it
            // can make (stride 1, no groups, reduced dtype, an input that wants a gradient).
            let x_tracked = x.is_tracked();
            let gemm_data_grad =
                dtype.filter(|_| x_tracked && options.groups == 1 && options.stride == [1, 1]);
            // The input's operand where the BatchNorm before made it (no groups, reduced dtype).
            let x_operand = dtype
                .filter(|_| options.groups == 1)
                .and_then(|d| input_operands::take::<B>(x.id(), d));
            let (x, w) = (x.into_primitive(), weight.into_primitive());
            let (out, reduced) = match dtype {
                // The weight's operand made once, for the forward and the data gradient.
                Some(d) => {
                    let (operand, swapped) =
                        B::conv_in_operand(w.clone(), options.clone(), d, x_tracked);
                    let out = match x_operand {
                        Some(xp) => B::conv_in_given(x, w, operand.clone(), xp, options.clone(), d),
                        None => B::conv_in_with(x, w, operand.clone(), options.clone(), d),
                    };
                    (out, Some((d, operand, swapped)))
                }
                None => (B::conv(x, w, options.clone()), None),
            };
            let out = prep.finish((x_state, weight_state, options, reduced), out);
            grad_operands::produced(gemm_data_grad.map(|d| (out.id(), d)));
            out
        }
        OpsKind::UnTracked(prep) => {
            prep.finish(inner(x.into_primitive(), weight.into_primitive(), options))
        }
    }
}

impl<B: Backend + FastOps, C: CheckpointStrategy> FastOps for Autodiff<B, C> {
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
        // The BatchNorm, and the dtype of the convolution after it that takes an input operand.
        let key = input_operands::key();
        let next_conv = key.and_then(input_operands::wanted);
        let inner = |x: FloatTensor<Self>, gamma: FloatTensor<Self>, beta: FloatTensor<Self>| {
            let (out, mean, var, new_mean, new_var, operand) = B::bn_act_train_operand(
                x.into_primitive(),
                gamma.into_primitive(),
                beta.into_primitive(),
                running_mean.into_primitive(),
                running_var.into_primitive(),
                epsilon,
                momentum,
                act,
                next_conv,
            );
            let operand = operand.zip(next_conv).map(|(t, d)| (d, t));
            ((out, mean, var, new_mean, new_var), operand)
        };
        let conv = grad_operands::wanted_for(x.id());
        match BnActOp
            .prepare::<C>([x.node(), gamma.node(), beta.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let x_state = prep.checkpoint(&x);
                let gamma_state = prep.checkpoint(&gamma);
                let beta_state = prep.checkpoint(&beta);
                let ((out, mean, var, new_mean, new_var), operand) = inner(x, gamma, beta);
                let state = (
                    x_state,
                    gamma_state,
                    beta_state,
                    mean.clone(),
                    var.clone(),
                    epsilon,
                    act,
                    conv,
                );
                let out = prep.finish(state, out);
                if let Some(key) = key {
                    input_operands::made::<B>(out.id(), key, operand);
                }
                (
                    out,
                    Self::from_inner(mean),
                    Self::from_inner(var),
                    Self::from_inner(new_mean),
                    Self::from_inner(new_var),
                )
            }
            OpsKind::UnTracked(prep) => {
                let ((out, mean, var, new_mean, new_var), _) = inner(x, gamma, beta);
                (
                    prep.finish(out),
                    Self::from_inner(mean),
                    Self::from_inner(var),
                    Self::from_inner(new_mean),
                    Self::from_inner(new_var),
                )
            }
        }
    }
    fn bn_act_train_backward(
        _x: FloatTensor<Self>,
        _gamma: FloatTensor<Self>,
        _beta: FloatTensor<Self>,
        _mean: FloatTensor<Self>,
        _variance: FloatTensor<Self>,
        _epsilon: f64,
        _act: bool,
        _grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        panic!("bn_act_train_backward is first-order only")
    }
    fn conv(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        tracked_conv::<B, C>(x, weight, options, None)
    }
    fn conv_in(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        options: ConvOptions<2>,
        dtype: FloatDType,
    ) -> FloatTensor<Self> {
        tracked_conv::<B, C>(x, weight, options, Some(dtype))
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
        let inputs = [x, w1, b1, w2, b2, w3, b3];
        let nodes = inputs.each_ref().map(|t| t.node());
        let forward = |inputs: [FloatTensor<Self>; 7]| {
            let [x, w1, b1, w2, b2, w3, b3] = inputs.map(|t| t.into_primitive());
            B::coupling_net(x, w1, b1, w2, b2, w3, b3)
        };
        match CouplingNetOp.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(mut prep) => {
                let state = inputs.each_ref().map(|t| prep.checkpoint(t));
                prep.finish(state, forward(inputs))
            }
            OpsKind::UnTracked(prep) => prep.finish(forward(inputs)),
        }
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
        let inputs = [
            state, sw1, sb1, sw2, sb2, sw3, sb3, tw1, tb1, tw2, tb2, tw3, tb3,
        ];
        let nodes = inputs.each_ref().map(|t| t.node());
        let forward = |inputs: [FloatTensor<Self>; 13]| {
            let [
                state,
                sw1,
                sb1,
                sw2,
                sb2,
                sw3,
                sb3,
                tw1,
                tb1,
                tw2,
                tb2,
                tw3,
                tb3,
            ] = inputs.map(|t| t.into_primitive());
            B::coupling(
                state, keep, sw1, sb1, sw2, sb2, sw3, sb3, tw1, tb1, tw2, tb2, tw3, tb3,
            )
        };
        match CouplingOp.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(mut prep) => {
                let ids = inputs.each_ref().map(|t| prep.checkpoint(t));
                let out = forward(inputs);
                prep.finish((ids, keep, out.clone()), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(forward(inputs)),
        }
    }
    #[allow(clippy::type_complexity)]
    fn coupling_backward(
        _state: FloatTensor<Self>,
        _keep: usize,
        _sw1: FloatTensor<Self>,
        _sb1: FloatTensor<Self>,
        _sw2: FloatTensor<Self>,
        _sb2: FloatTensor<Self>,
        _sw3: FloatTensor<Self>,
        _sb3: FloatTensor<Self>,
        _tw1: FloatTensor<Self>,
        _tb1: FloatTensor<Self>,
        _tw2: FloatTensor<Self>,
        _tb2: FloatTensor<Self>,
        _tw3: FloatTensor<Self>,
        _tb3: FloatTensor<Self>,
        _out: FloatTensor<Self>,
        _grad: FloatTensor<Self>,
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
        panic!("coupling_backward is first-order only")
    }
    fn coupling_net_backward(
        _x: FloatTensor<Self>,
        _w1: FloatTensor<Self>,
        _b1: FloatTensor<Self>,
        _w2: FloatTensor<Self>,
        _b2: FloatTensor<Self>,
        _w3: FloatTensor<Self>,
        _b3: FloatTensor<Self>,
        _grad: FloatTensor<Self>,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    ) {
        panic!("coupling_net_backward is first-order only")
    }
    fn silu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        match SiluOp.prepare::<C>([x.node()]).compute_bound().stateful() {
            OpsKind::Tracked(mut prep) => {
                let state = prep.checkpoint(&x);
                prep.finish(state, B::silu(x.into_primitive()))
            }
            OpsKind::UnTracked(prep) => prep.finish(B::silu(x.into_primitive())),
        }
    }
    fn silu_backward(_x: FloatTensor<Self>, _grad: FloatTensor<Self>) -> FloatTensor<Self> {
        panic!("silu_backward is first-order only")
    }
    fn add_bias(y: FloatTensor<Self>, bias: FloatTensor<Self>) -> FloatTensor<Self> {
        BiasOp
            .prepare::<C>([y.node(), bias.node()])
            .compute_bound()
            .stateless(B::add_bias(y.into_primitive(), bias.into_primitive()))
    }
    fn channel_sums(_x: FloatTensor<Self>) -> FloatTensor<Self> {
        panic!("channel_sums is first-order only")
    }
    fn row_sums(x: FloatTensor<Self>) -> FloatTensor<Self> {
        match RowSumsOp
            .prepare::<C>([x.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let shape = x.primitive().shape();
                prep.finish(shape, B::row_sums(x.into_primitive()))
            }
            OpsKind::UnTracked(prep) => prep.finish(B::row_sums(x.into_primitive())),
        }
    }
    fn conv_in_x_backward(
        _x: FloatTensor<Self>,
        _weight: FloatTensor<Self>,
        _grad: FloatTensor<Self>,
        _options: ConvOptions<2>,
        _dtype: FloatDType,
    ) -> FloatTensor<Self> {
        panic!("conv_in_x_backward is first-order only")
    }
    fn conv_in_weight_backward(
        _x: FloatTensor<Self>,
        _weight: FloatTensor<Self>,
        _grad: FloatTensor<Self>,
        _options: ConvOptions<2>,
        _dtype: FloatDType,
    ) -> FloatTensor<Self> {
        panic!("conv_in_weight_backward is first-order only")
    }
    fn conv_x_backward(
        _x: FloatTensor<Self>,
        _weight: FloatTensor<Self>,
        _grad: FloatTensor<Self>,
        _options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        panic!("conv_x_backward is first-order only")
    }
    fn conv_weight_backward(
        _x: FloatTensor<Self>,
        _weight: FloatTensor<Self>,
        _grad: FloatTensor<Self>,
        _options: ConvOptions<2>,
    ) -> FloatTensor<Self> {
        panic!("conv_weight_backward is first-order only")
    }
}
