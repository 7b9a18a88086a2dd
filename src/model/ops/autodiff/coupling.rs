//! The flow's operations under autodiff: a coupling net and a whole coupling, one node each.

use super::super::FastOps;
use burn::backend::Backend;
use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::tensor::FloatTensor;

/// [`FastOps::coupling_net`]: the input and the six parameters are checkpointed; the backward
/// is [`FastOps::coupling_net_backward`], which recomputes the hidden layers.
#[derive(Debug)]
pub(super) struct CouplingNetOp;

impl<B: Backend + FastOps> Backward<B, 7> for CouplingNetOp {
    type State = [NodeId; 7];

    fn backward(
        self,
        ops: Ops<Self::State, 7>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let grad = grads.consume::<B>(&ops.node);
        let [x, w1, b1, w2, b2, w3, b3] = ops
            .state
            .map(|id| checkpointer.retrieve_node_output::<FloatTensor<B>>(id));
        let (dx, dw1, db1, dw2, db2, dw3, db3) =
            B::coupling_net_backward(x, w1, b1, w2, b2, w3, b3, grad);
        for (node, g) in ops
            .parents
            .into_iter()
            .zip([dx, dw1, db1, dw2, db2, dw3, db3])
        {
            if let Some(node) = node {
                grads.register::<B>(node.id, g);
            }
        }
    }
}

/// [`FastOps::coupling`]: the state and the twelve parameters are checkpointed, the result kept
/// (its `s` and `t`); the backward is [`FastOps::coupling_backward`].
#[derive(Debug)]
pub(super) struct CouplingOp;

impl<B: Backend + FastOps> Backward<B, 13> for CouplingOp {
    type State = ([NodeId; 13], usize, FloatTensor<B>);

    fn backward(
        self,
        ops: Ops<Self::State, 13>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let grad = grads.consume::<B>(&ops.node);
        let (ids, keep, out) = ops.state;
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
        ] = ids.map(|id| checkpointer.retrieve_node_output::<FloatTensor<B>>(id));
        let (d, a, b, c, e, f, g, h, i, j, k, l, m) = B::coupling_backward(
            state, keep, sw1, sb1, sw2, sb2, sw3, sb3, tw1, tb1, tw2, tb2, tw3, tb3, out, grad,
        );
        for (node, g) in ops
            .parents
            .into_iter()
            .zip([d, a, b, c, e, f, g, h, i, j, k, l, m])
        {
            if let Some(node) = node {
                grads.register::<B>(node.id, g);
            }
        }
    }
}
