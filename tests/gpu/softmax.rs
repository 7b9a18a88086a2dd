//! The attention's fused softmax (`model::ops::softmax`, `kernels/softmax.rs`) on CUDA against
//! the CPU's loops, which follow the kernels' order of operations, and against Burn's composed
//! softmax through autodiff.

use super::{cuda, rel_values, values};
use burn::backend::Dispatch;
use burn::prelude::*;
use burn::tensor::Distribution;
use burn::tensor::activation::softmax;
use burnpose::model::ops::softmax::{SoftmaxOps, host};

/// The fused forward on `x`'s backend (CUDA: `kernels/softmax.rs`).
fn forward(x: Tensor<4>) -> Tensor<4> {
    Tensor::from_dispatch(Dispatch::softmax_last(x.into_dispatch()))
}

/// The fused backward at the forward's output `y` for the incoming `g`.
fn backward(y: Tensor<4>, g: Tensor<4>) -> Tensor<4> {
    Tensor::from_dispatch(Dispatch::softmax_last_backward(
        y.into_dispatch(),
        g.into_dispatch(),
    ))
}

/// `x`'s rows (its last axis `n`) through the CPU loop `row`, with `g`'s when given.
fn cpu_rows(x: &[f32], g: Option<&[f32]>, n: usize) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for (r, o) in out.chunks_mut(n).enumerate() {
        let xs = &x[r * n..(r + 1) * n];
        match g {
            Some(g) => host::backward_row(xs, &g[r * n..(r + 1) * n], o),
            None => host::forward_row(xs, o),
        }
    }
    out
}

/// The kernels against the CPU's loops at the attention's shape (`[4, 2, 400, 400]`, the seed's
/// 640 px), at a transposed view of it (not contiguous: the launcher copies it first) and at
/// rows shorter than a cube's units; a second launch gives the same bits.
#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_softmax_kernels_match_the_cpu_loops_on_cuda() {
    let d = cuda();
    d.seed(31);
    let base = Tensor::<4>::random([4, 2, 400, 400], Distribution::Normal(0.0, 4.0), &d);
    let small = Tensor::<4>::random([3, 5, 2, 7], Distribution::Normal(0.0, 4.0), &d);
    for (name, x) in [
        ("attention", base.clone()),
        ("transposed", base.swap_dims(2, 3)),
        ("short rows", small),
    ] {
        let n = x.dims()[3];
        let g = x.clone().cos();
        let y = forward(x.clone());
        let dx = backward(y.clone(), g.clone());
        let (xs, gs, ys, dxs) = (
            values(x.clone()),
            values(g.clone()),
            values(y.clone()),
            values(dx),
        );
        let (want_y, want_dx) = (cpu_rows(&xs, None, n), cpu_rows(&ys, Some(&gs), n));
        let (ey, edx) = (rel_values(&ys, &want_y), rel_values(&dxs, &want_dx));
        println!("softmax {name}: y {ey}, dx {edx}");
        assert!(ey < 1e-6, "{name}: values {ey}");
        assert!(edx < 1e-5, "{name}: gradient {edx}");
        let again = forward(x);
        assert_eq!(values(again), ys, "{name}: a second launch");
    }
}

/// Through autodiff on CUDA: the fused softmax's values and gradient within 1e-5 of Burn's
/// composed softmax's at the attention's shape.
#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_softmax_matches_burns_through_autodiff_on_cuda() {
    let d = cuda().autodiff();
    d.seed(32);
    let x0 = Tensor::<4>::random([4, 2, 400, 400], Distribution::Normal(0.0, 4.0), &d);
    let probe = x0.clone().sin().detach();
    let run = |fused: bool| {
        let _on = super::Choice::set(burnpose::model::ops::softmax::choose, fused, true);
        let x = x0.clone().detach().require_grad();
        let y = if fused {
            burnpose::model::ops::softmax::softmax_last(x.clone())
        } else {
            softmax(x.clone(), 3)
        };
        let grads = (y.clone() * probe.clone()).sum().backward();
        (values(y.inner()), values(x.grad(&grads).unwrap()))
    };
    let (ours, burns) = (run(true), run(false));
    assert_ne!(ours.0, burns.0, "the choice made no difference");
    let (ey, edx) = (rel_values(&ours.0, &burns.0), rel_values(&ours.1, &burns.1));
    println!("fused softmax through autodiff: y {ey}, dx {edx}");
    assert!(ey < 1e-5 && edx < 1e-5, "{ey} {edx}");
}
