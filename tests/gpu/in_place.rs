//! `model::ops::grads_into`: every weight gradient's last sum by our kernel, in native and
//! replay alike, and the recorded step's weight gradients written straight into the flat
//! gradient buffer instead of buffers of their own copied there (docs/perf_log.md AX5): the
//! same bits as native, and less kept by the step graph. Off by default; these tests turn it on
//! and off again.

use super::replay::{assert_parity_of, config_for, fit, trainer};
use super::{cube, cube_values_of, cuda, rel_values, values};
use burn::backend::ops::FloatTensorOps;
use burn::prelude::*;
use burn::tensor::Distribution;
use burn_cubecl::CubeBackend;
use burnpose::model::ops::grads_into;
use burnpose::replay::recorder::Control;

const TASK: &str = "pose-one-graph";

/// Turns the in-place sums on for its lifetime (off again even when a test fails).
struct InPlace;

impl InPlace {
    fn on() -> Self {
        grads_into::choose(true);
        Self
    }
}

impl Drop for InPlace {
    fn drop(&mut self) {
        grads_into::choose(false);
    }
}

/// `kernels/leading_sum.rs` against Burn's `sum_dim` over the chunks' products of a weight
/// gradient (`[N·S, co, ci·k·k]`), twice for equal bits, and into a registered parameter's
/// buffer while `grads_into::into` runs: the values land there, and the tensor handed back is
/// that buffer.
#[test]
#[ignore = "needs a CUDA GPU"]
fn leading_sum_gives_burns_sum_and_writes_into_the_registered_buffer_on_cuda() {
    let _on = InPlace::on();
    let d = cuda();
    d.seed(5);
    let (rows, co, x) = (20, 48, 9 * 32);
    let prod = Tensor::<3>::random([rows, co, x], Distribution::Normal(0.0, 1.0), &d);
    let weight = Tensor::<1>::random([co * x], Distribution::Default, &d);
    let reference = cube_values_of::<3>(CubeBackend::float_sum_dim(cube(prod.clone()), 0));
    let run = || cube_values_of::<2>(grads_into::sum(cube(prod.clone()), &cube(weight.clone())));
    let (a, b) = (run(), run());
    assert!(
        a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()),
        "not reproducible"
    );
    let e = rel_values(&a, &reference);
    assert!(e < 1e-6, "differs from Burn's sum_dim by {e}");
    // The destination: a segment of a longer buffer, as the flat gradient buffer's are.
    let flat = Tensor::<1>::zeros([co * x + 256], &d);
    let dst = burnpose::model::ops::segment(flat.clone(), 128, co * x, co * x);
    let written = grads_into::into(&[(weight.clone(), dst)], || {
        grads_into::sum(cube(prod.clone()), &cube(weight.clone()))
    });
    let all = values(flat);
    assert_eq!(
        &all[128..128 + co * x],
        a.as_slice(),
        "not written in place"
    );
    assert!(
        all[..128]
            .iter()
            .chain(&all[128 + co * x..])
            .all(|v| *v == 0.0)
    );
    assert_eq!(cube_values_of::<1>(written), a, "the tensor handed back");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gradients_written_in_place_match_native_bf16() {
    let _on = InPlace::on();
    assert_parity_of(TASK, "bf16");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gradients_written_in_place_match_native_fp32() {
    let _on = InPlace::on();
    assert_parity_of(TASK, "fp32");
}

/// The step graph no longer keeps a buffer per weight gradient beside the flat one: what
/// recording it adds falls by at least half the flat gradient buffer (the weights of the
/// convolutions without groups are most of the network's parameters).
#[test]
#[ignore = "needs a CUDA GPU"]
fn gradients_written_in_place_keep_less() {
    let kept = |in_place: bool| {
        let _on = in_place.then(InPlace::on);
        let mut t = trainer(&config_for(TASK, "bf16", true), Control::None);
        t.run_epoch(&mut |_, _, _| {}).unwrap();
        let graph = t
            .stage
            .recording()
            .into_iter()
            .find(|g| g.what == "step graph")
            .expect("a step graph recorded");
        let gradients = t
            .stage
            .buffer_bytes()
            .into_iter()
            .find(|(what, _)| *what == "gradients")
            .expect("a gradient buffer")
            .1;
        (graph.bytes, graph.slices, gradients as i64)
    };
    let (before, before_slices, gradients) = kept(false);
    let (after, after_slices, _) = kept(true);
    println!(
        "step graph keeps {before} B in {before_slices} slices, in place {after} B in \
         {after_slices}; gradient buffer {gradients} B"
    );
    assert!(
        before - after >= gradients / 2,
        "in place kept {after} B against {before} B (gradients {gradients} B)"
    );
}

/// Negative control: the window gathers nothing, as if every gradient were in place; the ones
/// that are not (BatchNorm's γ/β, biases, depthwise weights) keep the warm-ups' values, and
/// parity must break.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gathering_nothing_breaks_parity_in_place() {
    let _on = InPlace::on();
    let (native, _, _) = fit(&config_for(TASK, "bf16", false), Control::None);
    let (broken, _, _) = fit(&config_for(TASK, "bf16", true), Control::GatherNothing);
    assert_ne!(
        native.model, broken.model,
        "the control did not break parity"
    );
}
