//! Milliseconds of the host-side task-aligned assignment of one training batch (both head
//! copies, `E2eLoss::targets`), on the labels of real training batches of a config (mosaic and
//! all) and the head outputs of an untrained-like model (random logits and distances):
//! `cargo bench --bench assign [-- CONFIG [BATCHES]]` (default `configs/bench_seed.toml`, 16).
//! On the GPU this is a sync point of every step: the device idles while it runs. Also prints
//! the time of `loss::assign::assign` alone (both copies' configurations, every image) on the
//! same labels with predictions already decoded, i.e. without the read-back and the decoding.

use burn::prelude::*;
use burn::tensor::Distribution;
use burnpose::config::Config;
use burnpose::loss::assign::{AssignerConfig, Predicted, Target, assign};
use burnpose::model::{BranchOutput, HeadOutput};
use burnpose::train::Trainer;
use std::path::Path;
use std::time::Instant;

fn branch(b: usize, a: usize, nk: usize, d: &Device) -> BranchOutput {
    let t = |c: usize, dist| Tensor::<3>::random([b, c, a], dist, d);
    BranchOutput {
        boxes: t(4, Distribution::Uniform(0.2, 6.0)),
        scores: t(1, Distribution::Normal(-4.0, 2.0)),
        kpts: Some(t(nk * 3, Distribution::Normal(0.0, 2.0))),
        kpts_sigma: Some(t(nk * 2, Distribution::Normal(0.0, 1.0))),
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let path = Path::new(
        args.first()
            .map(String::as_str)
            .unwrap_or("configs/bench_seed.toml"),
    );
    let batches: usize = args.get(1).map_or(16, |n| n.parse().expect("BATCHES"));
    let mut cfg = Config::load(path).expect("config");
    cfg.device.kind = burnpose::config::DeviceKind::Cpu;
    let device = Device::flex().autodiff();
    let trainer = Trainer::new(cfg, path, device).expect("trainer");
    let order = trainer.epoch_order(0);
    let nb = trainer.batches_per_epoch();
    let d = Device::flex();
    d.seed(5);
    let nk = trainer.loss.sigmas.len();
    let a = trainer.loss.imgsz[0] / 8 * trainer.loss.imgsz[1] / 8 * 21 / 16;
    let mut ms = Vec::new();
    let mut assign_ms = Vec::new();
    let anchors =
        burnpose::loss::assign::Anchors::new(trainer.loss.imgsz[0], trainer.loss.imgsz[1]);
    let boxes: Vec<[f32; 4]> = (0..a)
        .map(|i| {
            let [x, y] = anchors.pixel(i);
            let r = 8.0 + (i % 13) as f32 * 6.0;
            [x - r, y - r * 1.3, x + r, y + r * 0.8]
        })
        .collect();
    let scores: Vec<f32> = (0..a).map(|i| 0.01 + (i % 97) as f32 / 200.0).collect();
    let pk: Vec<[f32; 2]> = (0..a * nk)
        .map(|i| {
            let [x, y] = anchors.pixel(i / nk);
            [x + (i % 7) as f32, y - (i % 5) as f32]
        })
        .collect();
    let pred = Predicted {
        scores: &scores,
        boxes: &boxes,
        keypoints: Some(&pk),
        nc: 1,
    };
    let configs = [
        AssignerConfig::one2many(true),
        AssignerConfig::one2one(true),
    ];
    let (mut objects, mut fg) = (0, 0);
    for i in 0..batches {
        let batch = trainer.batch(&order, i % nb).expect("batch");
        let labels: Vec<_> = batch.samples.iter().map(|s| s.instances.clone()).collect();
        objects += labels.iter().map(Vec::len).sum::<usize>();
        let b = labels.len();
        let out = HeadOutput {
            one2many: branch(b, a, nk, &d),
            one2one: branch(b, a, nk, &d),
        };
        let t = Instant::now();
        let targets = trainer.loss.targets(&out, &labels);
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        fg += targets.one2many.num_fg() + targets.one2one.num_fg();
        let t = Instant::now();
        for image in &labels {
            let targets: Vec<Target> = image
                .iter()
                // One class: the predictions above hold one score per anchor.
                .map(|inst| Target {
                    class: 0,
                    ..Target::of(inst, true)
                })
                .collect();
            for cfg in &configs {
                std::hint::black_box(assign(cfg, &anchors, &pred, &targets, &trainer.loss.sigmas));
            }
        }
        assign_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    assign_ms.sort_by(f64::total_cmp);
    println!(
        "assign ({}): {batches} batches, {objects} objects, {fg} foreground rows; ms per batch median {:.2} (min {:.2}, max {:.2}); assign() alone {:.2} (min {:.2}, max {:.2})",
        path.display(),
        ms[ms.len() / 2],
        ms[0],
        ms[ms.len() - 1],
        assign_ms[assign_ms.len() / 2],
        assign_ms[0],
        assign_ms[assign_ms.len() - 1]
    );
}
