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
use burn::backend::{Backend, Dispatch, Scalar, Slice};
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

/// Columns of the state [`FastOps::coupling`] returns: the point `z0, z1`, the running
/// log-determinant, then the coupling's `s` (after tanh) and `t` on the transformed coordinate.
pub const STATE: usize = 5;

/// Column `k` of `[G, M, c]` `t`: `[G, M, 1]` (a view).
fn column<B: Backend>(t: FloatTensor<B>, k: usize) -> FloatTensor<B> {
    let full = Slice::new(0, None, 1);
    B::float_slice(
        t,
        &[full, full, Slice::new(k as isize, Some(k as isize + 1), 1)],
    )
}

/// `[G, M, 2]` with `kept` in column `keep` and `other` in the other one.
fn pair<B: Backend>(kept: FloatTensor<B>, other: FloatTensor<B>, keep: usize) -> FloatTensor<B> {
    match keep {
        0 => B::float_cat(vec![kept, other], 2),
        _ => B::float_cat(vec![other, kept], 2),
    }
}

/// Zeros shaped as `t`.
fn zeros_as<B: Backend>(t: &FloatTensor<B>) -> FloatTensor<B> {
    B::float_zeros(t.shape(), &t.device(), t.dtype().into())
}

/// `[G, M, 2]` with `v` in column `at` and zeros in the other: the nets' input (the kept
/// coordinate, as the module's `z · mask`) and their output gradient (the transformed one).
fn alone<B: Backend>(v: FloatTensor<B>, at: usize) -> FloatTensor<B> {
    let zeros = zeros_as::<B>(&v);
    pair::<B>(v, zeros, at)
}

/// [`FastOps::coupling`]'s body.
pub(super) fn layer_forward<B: Backend + FastOps>(
    state: FloatTensor<B>,
    keep: usize,
    s_net: [FloatTensor<B>; 6],
    t_net: [FloatTensor<B>; 6],
) -> FloatTensor<B> {
    let other = 1 - keep;
    let kept = column::<B>(state.clone(), keep);
    let z = column::<B>(state.clone(), other);
    let log_det = column::<B>(state, 2);
    let x = alone::<B>(kept.clone(), keep);
    let s = B::float_tanh(column::<B>(forward::<B>(x.clone(), s_net), other));
    let t = column::<B>(forward::<B>(x, t_net), other);
    let z = B::float_mul(
        B::float_sub(z, t.clone()),
        B::float_exp(B::float_neg(s.clone())),
    );
    let log_det = B::float_sub(log_det, s.clone());
    let [a, b] = match keep {
        0 => [kept, z],
        _ => [z, kept],
    };
    B::float_cat(vec![a, b, log_det, s, t], 2)
}

/// [`FastOps::coupling_backward`]'s body: `(d state, s-net's six gradients, t-net's six)`.
/// `out` is the forward's result (its `s` and `t` are not recomputed).
pub(super) fn layer_backward<B: Backend + FastOps>(
    state: FloatTensor<B>,
    keep: usize,
    s_net: [FloatTensor<B>; 6],
    t_net: [FloatTensor<B>; 6],
    out: FloatTensor<B>,
    grad: FloatTensor<B>,
) -> (FloatTensor<B>, [FloatTensor<B>; 6], [FloatTensor<B>; 6]) {
    let other = 1 - keep;
    let width = state.shape()[2];
    let kept = column::<B>(state.clone(), keep);
    let z = column::<B>(state.clone(), other);
    let x = alone::<B>(kept, keep);
    let s = column::<B>(out.clone(), 3);
    let t = column::<B>(out, 4);
    let g = |k| column::<B>(grad.clone(), k);
    let (g_kept, g_z, g_log_det, g_s, g_t) = (g(keep), g(other), g(2), g(3), g(4));
    // z' = (z − t) · e with e = exp(−s); log_det' = log_det − s.
    let dz = B::float_mul(g_z, B::float_exp(B::float_neg(s.clone())));
    let dt = B::float_sub(g_t, dz.clone());
    let ds = B::float_sub(
        B::float_sub(g_s, B::float_mul(dz.clone(), B::float_sub(z, t))),
        g_log_det.clone(),
    );
    let one_minus_s2 =
        B::float_add_scalar(B::float_neg(B::float_mul(s.clone(), s)), Scalar::Float(1.0));
    let ds_raw = B::float_mul(ds, one_minus_s2);
    let (dx_s, s_grads) = backward::<B>(x.clone(), s_net, alone::<B>(ds_raw, other));
    let (dx_t, t_grads) = backward::<B>(x, t_net, alone::<B>(dt, other));
    let d_kept = B::float_add(
        g_kept,
        B::float_add(column::<B>(dx_s, keep), column::<B>(dx_t, keep)),
    );
    let [a, b] = match keep {
        0 => [d_kept, dz],
        _ => [dz, d_kept],
    };
    let mut parts = vec![a, b, g_log_det];
    if width > 3 {
        // The columns after the log-determinant are not read: no gradient.
        let points = grad.shape();
        let dims = Shape::new([points[0], points[1], width - 3]);
        parts.push(B::float_zeros(dims, &grad.device(), grad.dtype().into()));
    }
    (B::float_cat(parts, 2), s_grads, t_grads)
}

/// One coupling of the flow through [`FastOps::coupling`] (one autodiff node, its backward
/// [`FastOps::coupling_backward`]); each net's weights and biases as [`coupling_net`] takes them.
pub fn coupling(
    state: Tensor<3>,
    keep: usize,
    (s_weights, s_biases): ([Tensor<2>; 3], [Tensor<1>; 3]),
    (t_weights, t_biases): ([Tensor<2>; 3], [Tensor<1>; 3]),
) -> Tensor<3> {
    let [sw1, sw2, sw3] = s_weights.map(Tensor::into_dispatch);
    let [sb1, sb2, sb3] = s_biases.map(Tensor::into_dispatch);
    let [tw1, tw2, tw3] = t_weights.map(Tensor::into_dispatch);
    let [tb1, tb2, tb3] = t_biases.map(Tensor::into_dispatch);
    Tensor::from_dispatch(Dispatch::coupling(
        state.into_dispatch(),
        keep,
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
    ))
}
