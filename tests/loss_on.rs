//! `train.loss_on = "device"`: the assignment and the loss terms as tensor operations on the
//! training device (the path a recorded step takes) train as the host path does.

use burn::prelude::*;
use burnpose::config::{Config, LossOn};
use burnpose::train::Trainer;
use std::path::Path;

fn trainer(loss_on: &str, task: &str) -> Trainer {
    let text = format!(
        "[data]\nimgsz = 64\ntrain_images = 8\nval_images = 2\n[model]\ntask = \"{task}\"\n\
         [train]\nbatch = 2\nnbs = 2\nseed = 5\nepochs = 2\nloss_on = \"{loss_on}\"\n"
    );
    let cfg = Config::parse(&text, Path::new("test.toml")).unwrap();
    Trainer::new(cfg, Path::new("test.toml"), Device::flex()).unwrap()
}

/// The same weights and batch give the same logged loss on either path (the sums run in another
/// order: within 1e-4), and a whole fit on the device path keeps every loss finite.
#[test]
fn the_device_path_gives_the_host_loss_and_trains() {
    for task in ["pose", "detect"] {
        let (mut host, mut device) = (trainer("host", task), trainer("device", task));
        assert_eq!(device.cfg.train.loss_on, LossOn::Device);
        let order = host.epoch_order(0);
        let batch = host.batch(&order, 0).unwrap();
        let (a, b) = (host.train_step(&batch), device.train_step(&batch));
        for (k, (x, y)) in b.iter().zip(a).enumerate() {
            assert!(
                (x - y).abs() <= 1e-4 * y.abs().max(1.0),
                "{task} item {k}: device {x} vs host {y}"
            );
        }
        assert!(
            a.iter().sum::<f32>() > 0.0,
            "{task}: a zero loss compares nothing"
        );
        let mut device = trainer("device", task);
        while !device.finished() {
            device.run_epoch(&mut |_, _, _| {}).unwrap();
        }
        assert!(
            device.step_losses.iter().flatten().all(|v| v.is_finite()),
            "{task}: {:?}",
            device.step_losses
        );
    }
}

/// A batch without objects on the device path: as on the host path, the point stems (pose) and
/// the box branches (detection) get no gradient and stay where they are, while the class
/// branch trains.
#[test]
fn the_device_path_leaves_unreached_branches_alone() {
    use burnpose::data::Batch;
    type Weight = fn(&Trainer) -> TensorData;
    let cases: [(&str, Weight); 2] = [
        ("pose", |t| {
            let pose = t.model.head.one2many.pose.as_ref().unwrap();
            pose.point_stems[0].cv1.conv.weight.val().into_data()
        }),
        ("detect", |t| {
            t.model.head.one2many.boxes[0]
                .cv1
                .conv
                .weight
                .val()
                .into_data()
        }),
    ];
    for (task, still) in cases {
        let mut t = trainer("device", task);
        let order = t.epoch_order(0);
        t.train_step(&t.batch(&order, 0).unwrap());
        let mut samples = t.batch(&order, 1).unwrap().samples;
        for s in &mut samples {
            s.instances.clear();
        }
        let cls = |t: &Trainer| {
            t.model.head.one2many.classes[0]
                .out
                .weight
                .val()
                .into_data()
        };
        let (still_before, cls_before) = (still(&t), cls(&t));
        t.train_step(&Batch::collate(samples));
        assert_eq!(
            still(&t),
            still_before,
            "{task}: a branch moved without positives"
        );
        assert_ne!(
            cls(&t),
            cls_before,
            "{task}: the class branch should still train"
        );
    }
}
