//! The stage's cut against one uncut backward, and the unreached-output rule (CPU).

use super::*;
use crate::model::{Scale, Task, YoloConfig};
use crate::optim::grads::get_flat;

type Loss = fn(HeadOutput) -> Tensor<1>;

/// Gradients of one uncut backward and of the stage's cut backward (merged), for `task`.
fn both(task: Task, scope: Scope, loss: Loss) -> (Yolo, GradientsParams, GradientsParams) {
    let device = Device::flex().autodiff();
    device.seed(3);
    let mut model = YoloConfig::new(Scale::N, task).init(&device);
    let x = Tensor::<4>::random(
        [2, 3, 64, 64],
        burn::tensor::Distribution::Uniform(0.0, 1.0),
        &device,
    );
    let whole = GradientsParams::from_grads(loss(model.forward(x.clone())).backward(), &model);
    let mut stage = Stage::Native(scope);
    let f = stage
        .forward(&mut model, x)
        .expect("a native stage records nothing");
    let rest = loss(f.head(&model.head)).backward();
    let (below, _) = stage.backward(&model, f, &rest, None);
    let mut cut = GradientsParams::from_grads(rest, &model);
    merge(&mut cut, below, &param_table(&model));
    (model, whole, cut)
}

fn every_output(out: HeadOutput) -> Tensor<1> {
    let b = out.one2many;
    let kpts = b
        .kpts
        .map_or(Tensor::zeros([1], &b.scores.device()), |k| k.tanh().sum());
    (b.boxes.powi_scalar(2).sum() + b.scores.sum() + kpts).sum()
}

/// The cut changes only summation order: gradients of every parameter equal those of one
/// uncut backward to float rounding, and the same parameters have one.
fn assert_cut_matches(task: Task, scope: Scope, loss: Loss, at_least: usize) {
    let (model, whole, cut) = both(task, scope, loss);
    // Per tensor relative to its own size, with a floor at the largest gradient's rounding
    // level for tensors whose gradient nearly cancels (e.g. a beta before another BN).
    let table = param_table(&model);
    let pairs: Vec<_> = table
        .iter()
        .map(|p| (p, get_flat(&whole, p), get_flat(&cut, p)))
        .collect();
    let max = |t: &Tensor<1>| t.clone().abs().max().into_scalar::<f32>();
    let global = pairs
        .iter()
        .filter_map(|(_, a, _)| a.as_ref().map(max))
        .fold(0f32, f32::max);
    let mut compared = 0;
    for (p, a, b) in pairs {
        assert_eq!(a.is_some(), b.is_some(), "{:?} {}", task, p.path);
        let (Some(a), Some(b)) = (a, b) else { continue };
        let scale = max(&a);
        let diff = max(&(a - b));
        assert!(
            diff <= 1e-4 * scale + 1e-6 * global,
            "{}: diff {diff} of {scale} (largest gradient {global})",
            p.path
        );
        compared += 1;
    }
    assert!(compared >= at_least, "only {compared} gradients compared");
}

#[test]
fn cut_at_the_features_equals_one_backward() {
    assert_cut_matches(Task::Pose, Scope::Features, every_output, 200);
}

#[test]
fn cut_at_the_pose_head_outputs_equals_one_backward() {
    assert_cut_matches(Task::Pose, Scope::Network, every_output, 200);
}

#[test]
fn cut_at_the_head_outputs_equals_one_backward() {
    assert_cut_matches(Task::Detect, Scope::Network, every_output, 200);
}

/// A loss that never reads the box outputs (a batch without positives) leaves the box
/// branches without gradient after the cut too, not with zeros.
#[test]
fn unreached_head_outputs_leave_their_branches_absent() {
    let scores_only: Loss = |out| out.one2many.scores.sum() + out.one2one.scores.sum();
    assert_cut_matches(Task::Detect, Scope::Network, scores_only, 150);
    let (model, _, cut) = both(Task::Detect, Scope::Network, scores_only);
    let table = param_table(&model);
    let boxes: Vec<_> = table
        .iter()
        .filter(|p| p.path.starts_with("head.one2many.boxes."))
        .collect();
    assert!(!boxes.is_empty());
    assert!(boxes.iter().all(|p| get_flat(&cut, p).is_none()));
}

/// A pose loss without keypoint terms (a batch without positives) leaves the point stems and
/// the keypoint and sigma predictors without gradient when the head is inside the stage; one
/// read output of the two keeps the stems.
#[test]
fn unreached_keypoint_outputs_leave_the_point_stems_absent() {
    let no_kpts: Loss = |out| {
        let b = out.one2many;
        b.boxes.sum() + b.scores.sum() + out.one2one.scores.sum()
    };
    assert_cut_matches(Task::Pose, Scope::Network, no_kpts, 150);
    let (model, _, cut) = both(Task::Pose, Scope::Network, no_kpts);
    let table = param_table(&model);
    let under = |prefix: &str| -> Vec<_> {
        table
            .iter()
            .filter(|p| p.path.starts_with(prefix))
            .collect()
    };
    for prefix in [
        "head.one2many.pose.point_stems.",
        "head.one2many.pose.kpts.",
        "head.one2many.pose.sigma.",
        "head.one2one.",
    ] {
        let dropped = under(prefix);
        assert!(!dropped.is_empty(), "{prefix}");
        let kept = dropped.iter().filter(|p| get_flat(&cut, p).is_some());
        // The one-to-one scores feed its class branches only.
        let want = if prefix == "head.one2one." {
            under("head.one2one.classes.").len()
        } else {
            0
        };
        assert_eq!(kept.count(), want, "{prefix}");
    }
    let sigma_only: Loss = |out| out.one2many.kpts_sigma.unwrap().sum();
    let (model, _, cut) = both(Task::Pose, Scope::Network, sigma_only);
    let table = param_table(&model);
    let stems = |p: &&crate::optim::groups::ParamInfo| {
        p.path.starts_with("head.one2many.pose.point_stems.")
    };
    assert!(
        table
            .iter()
            .filter(stems)
            .all(|p| get_flat(&cut, p).is_some())
    );
}

#[test]
fn head_outputs_survive_the_round_trip() {
    let d = Device::flex();
    let model = YoloConfig::new(Scale::N, Task::Pose).init(&d);
    let x = Tensor::<4>::random([1, 3, 64, 64], burn::tensor::Distribution::Default, &d);
    let out = model.forward(x);
    let back = outputs_of(&flatten_outputs(out.clone()));
    let bits = |t: &Tensor<3>| t.clone().into_data().try_to_vec::<f32>().unwrap();
    for (a, b) in [
        (&out.one2many, &back.one2many),
        (&out.one2one, &back.one2one),
    ] {
        assert_eq!(bits(&a.boxes), bits(&b.boxes));
        assert_eq!(bits(&a.scores), bits(&b.scores));
        assert_eq!(
            bits(a.kpts.as_ref().unwrap()),
            bits(b.kpts.as_ref().unwrap())
        );
        assert_eq!(
            bits(a.kpts_sigma.as_ref().unwrap()),
            bits(b.kpts_sigma.as_ref().unwrap())
        );
    }
    assert_eq!(
        unreached_prefixes(&[false, false, true, false]),
        ["head.one2one.boxes."]
    );
    assert_eq!(
        unreached_prefixes(&[false, false, true, true, false, false, false, false]),
        [
            "head.one2many.pose.kpts.",
            "head.one2many.pose.sigma.",
            "head.one2many.pose.point_stems."
        ]
    );
}
