//! `model::ops::grads_into`: every weight gradient's last sum by our kernel, in native and
//! replay alike, and the recorded step's weight gradients written straight into the flat
//! gradient buffer instead of buffers of their own copied there (docs/perf_log.md AX5, AY1):
//! the same bits as native, and most of the gather's copies gone. On by default; each test
//! sets the choice it needs and puts the default back.

use super::replay::{assert_parity_of, config_for, fit, trainer};
use super::{Choice, cube, cube_values_of, cuda, rel_values, values};
use burn::backend::ops::FloatTensorOps;
use burn::prelude::*;
use burn::tensor::Distribution;
use burn_cubecl::CubeBackend;
use burnpose::model::ops::grads_into;
use burnpose::replay::recorder::Control;

const TASK: &str = "pose-one-graph";

/// `kernels/leading_sum.rs` against Burn's `sum_dim` over the chunks' products of a weight
/// gradient (`[N·S, co, ci·k·k]`), twice for equal bits, and into a registered parameter's
/// buffer while `grads_into::into` runs: the values land there, and the tensor handed back is
/// that buffer.
#[test]
#[ignore = "needs a CUDA GPU"]
fn leading_sum_gives_burns_sum_and_writes_into_the_registered_buffer_on_cuda() {
    let _on = Choice::set(grads_into::choose, true, true);
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
    // A view whose first axis is not the outermost in memory is read by its strides.
    let strided =
        Tensor::<3>::random([co, rows, x], Distribution::Normal(0.0, 1.0), &d).swap_dims(0, 1);
    let reference = cube_values_of::<3>(CubeBackend::float_sum_dim(cube(strided.clone()), 0));
    let summed = cube_values_of::<2>(grads_into::sum(cube(strided), &cube(weight.clone())));
    let e = rel_values(&summed, &reference);
    assert!(
        e < 1e-6,
        "a strided input differs from Burn's sum_dim by {e}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gradients_written_in_place_match_native_bf16() {
    let _on = Choice::set(grads_into::choose, true, true);
    assert_parity_of(TASK, "bf16");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gradients_written_in_place_match_native_fp32() {
    let _on = Choice::set(grads_into::choose, true, true);
    assert_parity_of(TASK, "fp32");
}

/// The recorded step's gather copies at most half as many runs of gradients in place as
/// without: the convolutions' weights and BatchNorm's γ/β, most of the network's parameter
/// tensors, are already where it would copy them. (Memory is not the gain: the step graph's
/// pool reuses the freed per-parameter buffers either way, docs/perf_log.md AY1.)
#[test]
#[ignore = "needs a CUDA GPU"]
fn gradients_written_in_place_skip_their_copies() {
    let gathered = |in_place: bool| {
        let _chosen = Choice::set(grads_into::choose, in_place, true);
        let mut t = trainer(&config_for(TASK, "bf16", true), Control::None);
        t.run_epoch(&mut |_, _, _| {}).unwrap();
        t.stage.gradient_copies().expect("a recorded step")
    };
    let (before, before_runs) = gathered(false);
    let (after, after_runs) = gathered(true);
    println!("gather copies {before} of {before_runs} runs; in place {after} of {after_runs} runs");
    assert_eq!(before, before_runs, "without, every run is copied");
    assert!(
        after > 0 && 2 * after <= before,
        "in place still copied {after} runs against {before}"
    );
}

/// Negative control: the window gathers nothing, as if every gradient were in place; the ones
/// that are not (BatchNorm's γ/β, biases, depthwise weights) keep the warm-ups' values, and
/// parity must break.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gathering_nothing_breaks_parity_in_place() {
    let _on = Choice::set(grads_into::choose, true, true);
    let (native, _, _) = fit(&config_for(TASK, "bf16", false), Control::None);
    let (broken, _, _) = fit(&config_for(TASK, "bf16", true), Control::GatherNothing);
    assert_ne!(
        native.model, broken.model,
        "the control did not break parity"
    );
}
