//! The RealNVP flow's coupling net (`model::flow::CouplingNet`: `Linear(2, h) → SiLU →
//! Linear(h, h) → SiLU → Linear(h, 2)` on points `[G, M, 2]` in groups) as one operation with a
//! backward written by hand ([`super::FastOps::coupling_net`] and its `_backward`): autodiff
//! records one node per net instead of ~11, and a backend can run either pass as its own
//! kernels. These are the bodies any backend runs: tensor operations, the forward as the module
//! computes it; the backward recomputes the hidden layers from the input.

use super::FastOps;
use burn::backend::Shape;
use burn::backend::TensorMetadata;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, Dispatch};
use burn::prelude::*;

/// `x · w + b` over the last axis of `x` (`[G, M, in]`, `w` `[in, out]`, `b` `[out]`).
fn linear<B: Backend>(x: FloatTensor<B>, w: FloatTensor<B>, b: FloatTensor<B>) -> FloatTensor<B> {
    let s = w.shape();
    let w = B::float_reshape(w, Shape::new([1, s[0], s[1]]));
    let b = B::float_reshape(b, Shape::new([1, 1, s[1]]));
    B::float_add(B::float_matmul(x, w), b)
}

/// `t` (`[G, M, d]`) times the transpose of the matrix `w` (`[k, d]`): `[G, M, k]`.
fn times_transpose<B: Backend>(t: FloatTensor<B>, w: FloatTensor<B>) -> FloatTensor<B> {
    let s = w.shape();
    let wt = B::float_reshape(B::float_swap_dims(w, 0, 1), Shape::new([1, s[1], s[0]]));
    B::float_matmul(t, wt)
}

/// `Σ` over every point of `aᵀ · b` for `a` `[G, M, i]` and `b` `[G, M, o]`: `[i, o]`, one
/// matmul per group, then the groups summed.
fn weight_grad<B: Backend>(a: FloatTensor<B>, b: FloatTensor<B>) -> FloatTensor<B> {
    let per_group = B::float_matmul(B::float_swap_dims(a, 1, 2), b);
    let s = per_group.shape();
    B::float_reshape(B::float_sum_dim(per_group, 0), Shape::new([s[1], s[2]]))
}

/// `Σ` over every point of `g` (`[G, M, o]`): `[o]`, the points of each group summed first,
/// then the groups (as autodiff reduces a bias expanded over the groups, and in parallel).
fn bias_grad<B: Backend>(g: FloatTensor<B>) -> FloatTensor<B> {
    let o = g.shape()[2];
    let s = B::float_sum_dim(B::float_sum_dim(g, 1), 0);
    B::float_reshape(s, Shape::new([o]))
}

/// [`FastOps::coupling_net`]'s body.
pub(super) fn forward<B: Backend + FastOps>(
    x: FloatTensor<B>,
    [w1, b1, w2, b2, w3, b3]: [FloatTensor<B>; 6],
) -> FloatTensor<B> {
    let h1 = B::silu(linear::<B>(x, w1, b1));
    let h2 = B::silu(linear::<B>(h1, w2, b2));
    linear::<B>(h2, w3, b3)
}

/// [`FastOps::coupling_net_backward`]'s body: `(dx, [dw1, db1, dw2, db2, dw3, db3])`.
pub(super) fn backward<B: Backend + FastOps>(
    x: FloatTensor<B>,
    [w1, b1, w2, b2, w3, _b3]: [FloatTensor<B>; 6],
    grad: FloatTensor<B>,
) -> (FloatTensor<B>, [FloatTensor<B>; 6]) {
    let a1 = linear::<B>(x.clone(), w1.clone(), b1);
    let h1 = B::silu(a1.clone());
    let a2 = linear::<B>(h1.clone(), w2.clone(), b2);
    let h2 = B::silu(a2.clone());
    let dw3 = weight_grad::<B>(h2, grad.clone());
    let db3 = bias_grad::<B>(grad.clone());
    let da2 = B::silu_backward(a2, times_transpose::<B>(grad, w3));
    let dw2 = weight_grad::<B>(h1, da2.clone());
    let db2 = bias_grad::<B>(da2.clone());
    let da1 = B::silu_backward(a1, times_transpose::<B>(da2, w2));
    let dw1 = weight_grad::<B>(x, da1.clone());
    let db1 = bias_grad::<B>(da1.clone());
    let dx = times_transpose::<B>(da1, w1);
    (dx, [dw1, db1, dw2, db2, dw3, db3])
}

/// The flow's coupling net through [`FastOps::coupling_net`]: one autodiff node, its backward
/// [`FastOps::coupling_net_backward`].
pub fn coupling_net(
    x: Tensor<3>,
    [w1, w2, w3]: [Tensor<2>; 3],
    [b1, b2, b3]: [Tensor<1>; 3],
) -> Tensor<3> {
    Tensor::from_dispatch(Dispatch::coupling_net(
        x.into_dispatch(),
        w1.into_dispatch(),
        b1.into_dispatch(),
        w2.into_dispatch(),
        b2.into_dispatch(),
        w3.into_dispatch(),
        b3.into_dispatch(),
    ))
}
