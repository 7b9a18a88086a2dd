//! GPU tests (CUDA build only, ignored by default): run them on a machine with an NVIDIA GPU with
//! `cargo test --release --features cuda --test gpu -- --ignored`. Without the `cuda` feature this
//! file compiles to nothing; with it but without a GPU the tests fail (they never pass silently).

#![cfg(feature = "cuda")]

use burn::prelude::*;
use burn::tensor::Distribution;
use burnpose::config::{Config, DeviceKind, device};
use burnpose::model::{Scale, Task, YoloConfig};
use burnpose::train::Trainer;
use std::path::Path;

fn cuda() -> Device {
    device::resolve(DeviceKind::Cuda, 0)
        .expect("a CUDA device")
        .0
}

fn values(t: Tensor<3>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_into_vec().unwrap()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_forward_matches_cpu() {
    let cpu = Device::flex();
    let gpu = cuda();
    cpu.seed(1);
    let model = YoloConfig::new(Scale::N, Task::Pose).init(&cpu);
    let on_gpu = model.clone().to_device(&gpu);
    let x = Tensor::<4>::random([2, 3, 320, 320], Distribution::Uniform(0.0, 1.0), &cpu);
    let a = model.head.forward_one2one(&model.features(x.clone()));
    let b = on_gpu
        .head
        .forward_one2one(&on_gpu.features(x.to_device(&gpu)));
    for (name, p, q) in [
        ("boxes", a.boxes, b.boxes),
        ("scores", a.scores, b.scores),
        ("kpts", a.kpts.unwrap(), b.kpts.unwrap()),
    ] {
        let (p, q) = (values(p), values(q));
        let worst = p
            .iter()
            .zip(&q)
            .map(|(u, v)| (u - v).abs() / (1.0 + u.abs()))
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-3, "{name}: worst relative difference {worst}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_training_learns() {
    let text = "[data]\nimgsz = 128\ntrain_images = 8\nval_images = 2\n[train]\nbatch = 4\nnbs = 4\nepochs = 8\nseed = 3\n[optim]\nwarmup_epochs = 1.0\n[augment]\nmosaic = 0.0\ntranslate = 0.0\nscale = 0.0\nfliplr = 0.0\nhsv_h = 0.0\nhsv_s = 0.0\nhsv_v = 0.0\n";
    let cfg = Config::parse(text, Path::new("gpu.toml")).unwrap();
    let mut t = Trainer::new(cfg, Path::new("gpu.toml"), cuda()).unwrap();
    let mut totals = Vec::new();
    while !t.finished() {
        let r = t.run_epoch(&mut |_, _, _| {}).unwrap();
        totals.push(r.train_loss.iter().sum::<f64>());
    }
    assert!(totals.iter().all(|v| v.is_finite()), "{totals:?}");
    assert!(
        totals.last().unwrap() < &(0.6 * totals[0]),
        "loss did not fall on CUDA: {totals:?}"
    );
}
