//! Softmax over the last axis as one operation with its backward written out
//! ([`SoftmaxOps`]), for the attention's scores (`model::attention`). Burn 0.22.1 composes it
//! from five tensor operations and autodiff's backward from about ten more; here one kernel each
//! on CUDA (`kernels/softmax.rs`) and one loop each on the CPU ([`host`]). On by default since
//! the H100 measurement of docs/perf_log.md BS2 ([`choose`]; `bench-step --fused-softmax false`
//! takes Burn's): its sums run in another order than Burn's, so the bits differ from the
//! composed softmax's (not between native and replay, which take the same operation).

use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, Dispatch, Flex, backend_extension};
use burn::prelude::*;
use burn::tensor::DType;
use burn::tensor::activation::softmax;
use std::sync::atomic::{AtomicBool, Ordering};

static CHOSEN: AtomicBool = AtomicBool::new(true);

/// Whether [`softmax_last`] is [`SoftmaxOps::softmax_last`] (`true`, the default) or Burn's
/// composed softmax (`false`; `bench-step --fused-softmax false`).
pub fn choose(on: bool) {
    CHOSEN.store(on, Ordering::Relaxed);
}

/// [`choose`]'s choice.
pub fn chosen() -> bool {
    CHOSEN.load(Ordering::Relaxed)
}

/// Units whose partial sums (and maxima) a row's reduction folds: the CUDA kernels' units a
/// cube (one row a cube), whose order the CPU's loops follow. A power of two.
pub const UNITS: usize = 128;

/// Softmax over the last axis as backend operations (FP32).
#[backend_extension(Flex, Cube: cfg(feature = "cuda"), Autodiff)]
pub trait SoftmaxOps: Backend {
    /// `e^(x − max) / Σ e^(x − max)` along the last axis of `x`.
    fn softmax_last(x: FloatTensor<Self>) -> FloatTensor<Self>;
    /// The gradient at the forward's output `y` for the incoming `grad`: `y ⊙ (grad − Σ grad ⊙
    /// y)` along the last axis.
    fn softmax_last_backward(y: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self>;
}

/// Softmax over the last axis of `x`: [`SoftmaxOps::softmax_last`] when [`chosen`] and `x` is
/// FP32, else Burn's.
pub fn softmax_last<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    softmax_last_as(x, chosen())
}

/// [`softmax_last`] with the choice given: `fused` (and FP32) takes the operation.
fn softmax_last_as<const D: usize>(x: Tensor<D>, fused: bool) -> Tensor<D> {
    if !fused || x.dtype() != DType::F32 {
        return softmax(x, D - 1);
    }
    Tensor::from_dispatch(Dispatch::softmax_last(x.into_dispatch()))
}

/// The CPU's loops: per row the kernel's order of operations (unit `u` folds values `u, u +
/// UNITS, …`, then the units meet in the kernel's tree).
pub mod host {
    use super::UNITS;
    use crate::model::ops::host::{tensor, values};
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Flex, TensorMetadata};

    /// The partials folded as the kernel's tree does: `p[u] ⊕= p[u + half]`, halves from
    /// `UNITS / 2` down; `max`, else a sum.
    fn fold(mut p: [f32; UNITS], max: bool) -> f32 {
        let mut half = UNITS / 2;
        while half > 0 {
            for u in 0..half {
                p[u] = if max {
                    p[u].max(p[u + half])
                } else {
                    p[u] + p[u + half]
                };
            }
            half /= 2;
        }
        p[0]
    }

    /// One row's softmax into `out`.
    pub fn forward_row(x: &[f32], out: &mut [f32]) {
        let mut p = [f32::NEG_INFINITY; UNITS];
        for (q, &v) in x.iter().enumerate() {
            p[q % UNITS] = p[q % UNITS].max(v);
        }
        let top = fold(p, true);
        let mut p = [0f32; UNITS];
        for (q, &v) in x.iter().enumerate() {
            p[q % UNITS] += (v - top).exp();
        }
        let sum = fold(p, false);
        for (o, &v) in out.iter_mut().zip(x) {
            *o = (v - top).exp() / sum;
        }
    }

    /// One row's gradient into `out`, from the forward's output `y` and the incoming `g`.
    pub fn backward_row(y: &[f32], g: &[f32], out: &mut [f32]) {
        let mut p = [0f32; UNITS];
        for (q, (&a, &b)) in g.iter().zip(y).enumerate() {
            p[q % UNITS] += a * b;
        }
        let dot = fold(p, false);
        for ((o, &b), &a) in out.iter_mut().zip(y).zip(g) {
            *o = b * (a - dot);
        }
    }

    /// The shape of `t` and the length of its last axis (a row).
    fn rows(t: &FloatTensor<Flex>) -> (Vec<usize>, usize) {
        let shape = t.shape().to_vec();
        let n = *shape.last().expect("softmax: a tensor of rank 1 or more");
        (shape, n)
    }

    pub fn forward(x: &FloatTensor<Flex>) -> FloatTensor<Flex> {
        let (shape, n) = rows(x);
        let v = values(x);
        let mut out = vec![0f32; v.len()];
        if n > 0 {
            for (row, o) in v.chunks(n).zip(out.chunks_mut(n)) {
                forward_row(row, o);
            }
        }
        tensor(out, shape)
    }

    pub fn backward(y: &FloatTensor<Flex>, g: &FloatTensor<Flex>) -> FloatTensor<Flex> {
        let (shape, n) = rows(y);
        assert_eq!(shape, g.shape().to_vec(), "softmax backward: shapes");
        let (y, g) = (values(y), values(g));
        let mut out = vec![0f32; y.len()];
        if n > 0 {
            for ((a, b), o) in y.chunks(n).zip(g.chunks(n)).zip(out.chunks_mut(n)) {
                backward_row(a, b, o);
            }
        }
        tensor(out, shape)
    }
}

impl SoftmaxOps for Flex {
    fn softmax_last(x: FloatTensor<Self>) -> FloatTensor<Self> {
        host::forward(&x)
    }
    fn softmax_last_backward(y: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        host::backward(&y, &grad)
    }
}

#[cfg(feature = "cuda")]
#[path = "../../../kernels/softmax.rs"]
pub mod kernel;

#[cfg(feature = "cuda")]
impl SoftmaxOps for burn_cubecl::CubeBackend {
    fn softmax_last(x: FloatTensor<Self>) -> FloatTensor<Self> {
        kernel::forward(x)
    }
    fn softmax_last_backward(y: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        kernel::backward(y, grad)
    }
}

mod autodiff {
    //! [`SoftmaxOps::softmax_last`] under Burn's autodiff: one node whose state is its output,
    //! its backward [`SoftmaxOps::softmax_last_backward`].

    use super::SoftmaxOps;
    use burn::backend::autodiff::checkpoint::base::Checkpointer;
    use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Autodiff, Backend};

    #[derive(Debug)]
    struct SoftmaxOp;

    impl<B: Backend + SoftmaxOps> Backward<B, 1> for SoftmaxOp {
        type State = FloatTensor<B>;

        fn backward(
            self,
            ops: Ops<FloatTensor<B>, 1>,
            grads: &mut Gradients,
            _checkpointer: &mut Checkpointer,
        ) {
            let [node] = ops.parents;
            let grad = grads.consume::<B>(&ops.node);
            if let Some(node) = node {
                grads.register::<B>(node.id, B::softmax_last_backward(ops.state, grad));
            }
        }
    }

    impl<B: Backend + SoftmaxOps, C: CheckpointStrategy> SoftmaxOps for Autodiff<B, C> {
        fn softmax_last(x: FloatTensor<Self>) -> FloatTensor<Self> {
            match SoftmaxOp
                .prepare::<C>([x.node()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => {
                    let y = B::softmax_last(x.into_primitive());
                    prep.finish(y.clone(), y)
                }
                OpsKind::UnTracked(prep) => prep.finish(B::softmax_last(x.into_primitive())),
            }
        }
        fn softmax_last_backward(
            _y: FloatTensor<Self>,
            _grad: FloatTensor<Self>,
        ) -> FloatTensor<Self> {
            panic!("softmax_last_backward is first-order only")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;
    use rand::{Rng, SeedableRng, rngs::StdRng};

    /// `shape`'s values uniform in `(−scale, scale)` from `seed` (not the device's generator,
    /// which the tests running beside this one seed too).
    fn random<const D: usize>(shape: [usize; D], scale: f32, seed: u64, d: &Device) -> Tensor<D> {
        let mut rng = StdRng::seed_from_u64(seed);
        let n = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| rng.random_range(-scale..scale)).collect();
        Tensor::from_data(TensorData::new(v, shape), d)
    }

    /// Largest absolute difference of `a` and `b`.
    fn gap<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> f32 {
        (a - b).abs().max().into_scalar::<f32>()
    }

    /// Row-wise softmax of `x` and its gradient for the incoming `w`, in f64 (`[rows · n]`).
    fn reference(x: &[f32], w: &[f32], n: usize) -> (Vec<f64>, Vec<f64>) {
        let (mut y, mut dx) = (Vec::new(), Vec::new());
        for (row, g) in x.chunks(n).zip(w.chunks(n)) {
            let top = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
            let sum: f64 = row.iter().map(|&v| (v as f64 - top).exp()).sum();
            let p: Vec<f64> = row.iter().map(|&v| (v as f64 - top).exp() / sum).collect();
            let dot: f64 = p.iter().zip(g).map(|(a, &b)| a * b as f64).sum();
            dx.extend(p.iter().zip(g).map(|(a, &b)| a * (b as f64 - dot)));
            y.extend(p);
        }
        (y, dx)
    }

    /// Largest absolute difference of `t`'s values from `want`.
    fn off<const D: usize>(t: &Tensor<D>, want: &[f64]) -> f64 {
        let v: Vec<f32> = t.to_data().try_to_vec().expect("FP32");
        v.iter()
            .zip(want)
            .fold(0.0, |m, (&a, b)| m.max((a as f64 - b).abs()))
    }

    /// The fused softmax and its gradient (through autodiff) against an f64 reference, at rows
    /// shorter than, equal to and longer than the units (7, 128, 400: the attention's 20 ×
    /// 20), scores spread over ±8: within a few of FP32's steps at 1, within 1e-5 of Burn's
    /// composed softmax and of autodiff's gradient through it, and twice the same bits.
    #[test]
    fn fused_softmax_matches_a_reference_and_burns() {
        let device = Device::flex().autodiff();
        for n in [7usize, 128, 400] {
            let x0 = random([2, 3, 5, n], 8.0, 21, &device);
            let w = random([2, 3, 5, n], 1.0, 22, &device);
            let run = |fused: bool| {
                let x = x0.clone().detach().require_grad();
                let y = if fused {
                    Tensor::from_dispatch(Dispatch::softmax_last(x.clone().into_dispatch()))
                } else {
                    softmax(x.clone(), 3)
                };
                let grads = (y.clone() * w.clone()).sum().backward();
                (y.inner(), x.grad(&grads).expect("a gradient"))
            };
            let (y, dx) = run(true);
            let (burn_y, burn_dx) = run(false);
            let xs: Vec<f32> = x0.to_data().try_to_vec().unwrap();
            let ws: Vec<f32> = w.to_data().try_to_vec().unwrap();
            let (want_y, want_dx) = reference(&xs, &ws, n);
            let (ey, edx) = (off(&y, &want_y), off(&dx, &want_dx));
            assert!(ey < 5e-7, "n {n}: values off the reference by {ey}");
            assert!(edx < 2e-6, "n {n}: gradient off the reference by {edx}");
            let (by, bdx) = (gap(y.clone(), burn_y), gap(dx.clone(), burn_dx));
            assert!(by < 1e-5, "n {n}: values differ from Burn's by {by}");
            assert!(bdx < 1e-5, "n {n}: gradients differ from Burn's by {bdx}");
            let (again, dx_again) = run(true);
            assert_eq!(y.to_data().as_bytes(), again.to_data().as_bytes(), "n {n}");
            assert_eq!(
                dx.to_data().as_bytes(),
                dx_again.to_data().as_bytes(),
                "n {n}"
            );
        }
    }

    /// [`softmax_last`] takes the fused operation only when chosen: a check that can tell the
    /// two apart (their bits differ at a 400-long row). The process-wide choice itself is not
    /// flipped here: other tests run beside this one.
    #[test]
    fn softmax_last_follows_the_choice() {
        let device = Device::flex();
        let x = random([6, 400], 8.0, 23, &device);
        let fused = Tensor::<2>::from_dispatch(Dispatch::softmax_last(x.clone().into_dispatch()));
        let composed = softmax(x.clone(), 1);
        assert_ne!(
            fused.to_data().as_bytes(),
            composed.to_data().as_bytes(),
            "the two forms give the same bits here: the check below could not tell them apart"
        );
        let bits = |t: Tensor<2>| t.to_data().as_bytes().to_vec();
        assert_eq!(bits(softmax_last_as(x.clone(), false)), bits(composed));
        assert_eq!(bits(softmax_last_as(x, true)), bits(fused));
    }
}
