//! [`LossOps::anchor_terms`] under Burn's autodiff: one node, its backward
//! [`LossOps::anchor_terms_backward`]. Only the predictions (`boxes`, `kpts`) are its parents;
//! the fixed inputs are the assignment's and carry no gradient.

use super::LossOps;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend};

/// The backward's state: the predictions, the fixed inputs, the image `[h, w]`.
type State<B> = (
    FloatTensor<B>,
    FloatTensor<B>,
    [FloatTensor<B>; 8],
    [usize; 2],
);

#[derive(Debug)]
struct AnchorTermsOp;

impl<B: Backend + LossOps> Backward<B, 2> for AnchorTermsOp {
    type State = State<B>;

    fn backward(
        self,
        ops: Ops<State<B>, 2>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let [node_boxes, node_kpts] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let (boxes, kpts, fixed, [h, w]) = ops.state;
        let [objects, slot, fg, weight, ax, ay, st, sig] = fixed;
        let (d_boxes, d_kpts) = B::anchor_terms_backward(
            boxes, kpts, objects, slot, fg, weight, ax, ay, st, sig, grad, h, w,
        );
        if let Some(node) = node_boxes {
            grads.register::<B>(node.id, d_boxes);
        }
        if let Some(node) = node_kpts {
            grads.register::<B>(node.id, d_kpts);
        }
    }
}

/// [`LossOps::rle_rows`]' backward state: the predictions and the fixed inputs.
type RleState<B> = (FloatTensor<B>, FloatTensor<B>, [FloatTensor<B>; 8]);

#[derive(Debug)]
struct RleRowsOp;

impl<B: Backend + LossOps> Backward<B, 2> for RleRowsOp {
    type State = RleState<B>;

    fn backward(
        self,
        ops: Ops<RleState<B>, 2>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let [node_kpts, node_sigma] = ops.parents;
        let grad = grads.consume::<B>(&ops.node);
        let (kpts, sigma, fixed) = ops.state;
        let [objects, slot, place, picked, count, ax, ay, st] = fixed;
        let (d_kpts, d_sigma) = B::rle_rows_backward(
            kpts, sigma, objects, slot, place, picked, count, ax, ay, st, grad,
        );
        if let Some(node) = node_kpts {
            grads.register::<B>(node.id, d_kpts);
        }
        if let Some(node) = node_sigma {
            grads.register::<B>(node.id, d_sigma);
        }
    }
}

impl<B: Backend + LossOps, C: CheckpointStrategy> LossOps for Autodiff<B, C> {
    fn anchor_terms(
        boxes: FloatTensor<Self>,
        kpts: FloatTensor<Self>,
        objects: FloatTensor<Self>,
        slot: FloatTensor<Self>,
        fg: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        ax: FloatTensor<Self>,
        ay: FloatTensor<Self>,
        st: FloatTensor<Self>,
        sig: FloatTensor<Self>,
        height: usize,
        width: usize,
    ) -> FloatTensor<Self> {
        let fixed = [objects, slot, fg, weight, ax, ay, st, sig].map(|t| t.into_primitive());
        let run = |boxes: FloatTensor<B>, kpts: FloatTensor<B>, f: [FloatTensor<B>; 8]| {
            let [objects, slot, fg, weight, ax, ay, st, sig] = f;
            B::anchor_terms(
                boxes, kpts, objects, slot, fg, weight, ax, ay, st, sig, height, width,
            )
        };
        match AnchorTermsOp
            .prepare::<C>([boxes.node(), kpts.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (boxes, kpts) = (boxes.into_primitive(), kpts.into_primitive());
                let out = run(boxes.clone(), kpts.clone(), fixed.clone());
                prep.finish((boxes, kpts, fixed, [height, width]), out)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(run(boxes.into_primitive(), kpts.into_primitive(), fixed))
            }
        }
    }
    fn anchor_terms_backward(
        _boxes: FloatTensor<Self>,
        _kpts: FloatTensor<Self>,
        _objects: FloatTensor<Self>,
        _slot: FloatTensor<Self>,
        _fg: FloatTensor<Self>,
        _weight: FloatTensor<Self>,
        _ax: FloatTensor<Self>,
        _ay: FloatTensor<Self>,
        _st: FloatTensor<Self>,
        _sig: FloatTensor<Self>,
        _grad: FloatTensor<Self>,
        _height: usize,
        _width: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        panic!("anchor_terms_backward is first-order only")
    }
    fn rle_rows(
        kpts: FloatTensor<Self>,
        sigma: FloatTensor<Self>,
        objects: FloatTensor<Self>,
        slot: FloatTensor<Self>,
        place: FloatTensor<Self>,
        picked: FloatTensor<Self>,
        count: FloatTensor<Self>,
        ax: FloatTensor<Self>,
        ay: FloatTensor<Self>,
        st: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let fixed = [objects, slot, place, picked, count, ax, ay, st].map(|t| t.into_primitive());
        let run = |kpts: FloatTensor<B>, sigma: FloatTensor<B>, f: [FloatTensor<B>; 8]| {
            let [objects, slot, place, picked, count, ax, ay, st] = f;
            B::rle_rows(kpts, sigma, objects, slot, place, picked, count, ax, ay, st)
        };
        match RleRowsOp
            .prepare::<C>([kpts.node(), sigma.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (kpts, sigma) = (kpts.into_primitive(), sigma.into_primitive());
                let out = run(kpts.clone(), sigma.clone(), fixed.clone());
                prep.finish((kpts, sigma, fixed), out)
            }
            OpsKind::UnTracked(prep) => {
                prep.finish(run(kpts.into_primitive(), sigma.into_primitive(), fixed))
            }
        }
    }
    fn rle_rows_backward(
        _kpts: FloatTensor<Self>,
        _sigma: FloatTensor<Self>,
        _objects: FloatTensor<Self>,
        _slot: FloatTensor<Self>,
        _place: FloatTensor<Self>,
        _picked: FloatTensor<Self>,
        _count: FloatTensor<Self>,
        _ax: FloatTensor<Self>,
        _ay: FloatTensor<Self>,
        _st: FloatTensor<Self>,
        _grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        panic!("rle_rows_backward is first-order only")
    }
}
