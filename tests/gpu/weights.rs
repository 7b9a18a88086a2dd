//! Ultralytics' weights on CUDA: the fixture model (`tests/fixtures/ultralytics`) on the two real
//! images against Ultralytics' float64 outputs, FP32, as `tests/ultralytics.rs` checks the CPU
//! (docs/weights.md, "Parity").

use super::common::fixtures::{Outputs, assert_close, compare, eval_rows, input, model};
use super::cuda;
use burnpose::model::Task;

#[test]
#[ignore = "needs a CUDA GPU and ../shared/data/pose-real/pose_minicoco"]
fn ultralytics_weights_forward_on_cuda_matches_ultralytics() {
    let d = cuda();
    let x = input(&d).expect("the real images (../shared/data) on the GPU machine");
    let eval = eval_rows(model(Task::Pose, &d), x, "pose");
    let ad = d.autodiff();
    let out = model(Task::Pose, &ad).forward(input(&ad).unwrap());
    let fx = Outputs::open();
    let mut train = compare(&out.one2many, &fx, "pose.train.one2many");
    train.extend(compare(&out.one2one, &fx, "pose.train.one2one"));
    for (name, err) in &train {
        eprintln!("{name}: worst relative difference {err:.2e}");
    }
    assert_close(&eval);
    // Train mode's batch statistics are summed in f32 by the CUDA BatchNorm kernels (in f64 on
    // the CPU): a looser bound, measured and recorded in docs/weights.md.
    for (name, err) in &train {
        assert!(*err <= 1e-3, "{name}: {err:.3e} > 1e-3");
    }
}
