//! Model structure against the reference numbers of yolo_spec §1.2 / §1.5 (CPU).

use burn::prelude::*;
use burnpose::model::summary::{gflops, layer_table};
use burnpose::model::{ParamCount, Scale, Task, YoloConfig};

/// Parameter counts of layers 0–22 from yolo_spec §1.2.
const LAYER_PARAMS: [usize; 23] = [
    464, 4_672, 6_640, 36_992, 26_080, 147_712, 87_040, 295_424, 346_112, 164_608, 249_728, 0, 0,
    119_808, 0, 0, 34_304, 36_992, 0, 95_232, 147_712, 0, 463_104,
];

#[test]
fn nano_pose_parameter_counts_match_reference() {
    let d = Device::flex();
    let model = YoloConfig::new(Scale::N, Task::Pose).init(&d);
    assert_eq!(model.feature_params(), 2_262_624);
    assert_eq!(model.param_count(), 3_679_464);
    let rows = layer_table(&model, 640);
    let got: Vec<usize> = rows.iter().take(23).map(|r| r.params).collect();
    assert_eq!(got, LAYER_PARAMS);
    assert_eq!(rows[23].params, 1_416_840);
    assert_eq!(rows.iter().map(|r| r.params).sum::<usize>(), 3_679_464);
}

#[test]
fn nano_pose_nc80_matches_yaml_summary() {
    let d = Device::flex();
    let model = YoloConfig::new(Scale::N, Task::Pose).with_nc(80).init(&d);
    assert_eq!(model.param_count(), 3_747_554);
    assert_eq!(model.head.param_count(), 1_484_930);
}

#[test]
fn nano_pose_gflops_near_reference() {
    let d = Device::flex();
    let model = YoloConfig::new(Scale::N, Task::Pose).init(&d);
    let g = gflops(&layer_table(&model, 640));
    // yolo_spec §1.5: ≈10.4 GFLOPs for the nc=1 training graph (thop also counts BN; we count
    // convolutions, attention matmuls only).
    assert!((g - 10.4).abs() < 0.5, "GFLOPs {g}");
    let g80 = gflops(&layer_table(
        &YoloConfig::new(Scale::N, Task::Pose).with_nc(80).init(&d),
        640,
    ));
    assert!((g80 - 10.7).abs() < 0.5, "GFLOPs nc=80 {g80}");
}

#[test]
fn detect_task_shares_backbone_and_neck() {
    let d = Device::flex();
    let pose = YoloConfig::new(Scale::N, Task::Pose).init(&d);
    let det = YoloConfig::new(Scale::N, Task::Detect).with_nc(80).init(&d);
    assert_eq!(det.feature_params(), pose.feature_params());
    assert!(det.head.one2many.pose.is_none() && det.head.flow.is_none());
    let s = YoloConfig::new(Scale::S, Task::Pose).init(&d);
    assert!(s.param_count() > 3 * pose.param_count() / 2);
}

#[test]
fn forward_shapes_at_640() {
    let d = Device::flex();
    let model = YoloConfig::new(Scale::N, Task::Pose).init(&d);
    let out = model.forward(Tensor::zeros([1, 3, 640, 640], &d));
    for branch in [&out.one2many, &out.one2one] {
        assert_eq!(branch.boxes.dims(), [1, 4, 8400]);
        assert_eq!(branch.scores.dims(), [1, 1, 8400]);
        assert_eq!(branch.kpts.as_ref().unwrap().dims(), [1, 51, 8400]);
        assert_eq!(branch.kpts_sigma.as_ref().unwrap().dims(), [1, 34, 8400]);
    }
}

#[test]
fn feature_shapes_and_one2one_is_detached() {
    let d = Device::flex().autodiff();
    let model = YoloConfig::new(Scale::N, Task::Detect).with_nc(2).init(&d);
    let images = Tensor::<4>::ones([2, 3, 64, 96], &d);
    let f = model.features(images);
    assert_eq!(f.p3.dims(), [2, 64, 8, 12]);
    assert_eq!(f.p4.dims(), [2, 128, 4, 6]);
    assert_eq!(f.p5.dims(), [2, 256, 2, 3]);
    // A loss on the one-to-one copy alone must leave backbone/neck without gradient.
    let out = model.head.forward(&f);
    let grads = out.one2one.scores.sum().backward();
    assert!(model.backbone.l0.conv.weight.grad(&grads).is_none());
    assert!(model.neck.l22.cv2.conv.weight.grad(&grads).is_none());
    assert!(
        model.head.one2one.classes[0]
            .out
            .weight
            .grad(&grads)
            .is_some()
    );
}
