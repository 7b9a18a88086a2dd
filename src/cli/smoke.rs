//! `burnpose smoke`: forward + backward of the full model, timed, to check a device works.

use crate::config::{DeviceKind, compile_progress::CompileProgress, device};
use crate::model::{Scale, Task, YoloConfig};
use burn::prelude::*;
use std::time::Instant;

pub fn run(kind: DeviceKind, batch: usize, imgsz: usize, steps: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        imgsz.is_multiple_of(32) && imgsz > 0,
        "--imgsz must be a positive multiple of 32"
    );
    let (device, what) = device::resolve(kind, 0).map_err(anyhow::Error::msg)?;
    println!("device: {what}");
    let device = device.autodiff();
    device.seed(0);
    let model = YoloConfig::new(Scale::N, Task::Pose).init(&device);
    let mut watch = Some(CompileProgress::start(&format!("smoke-b{batch}-{imgsz}")));
    for step in 0..steps {
        let t = Instant::now();
        let images = Tensor::<4>::random(
            [batch, 3, imgsz, imgsz],
            burn::tensor::Distribution::Uniform(0.0, 1.0),
            &device,
        );
        let out = model.forward(images);
        // A surrogate scalar that touches every output of both head copies.
        let mut total = out.one2many.boxes.mean() + out.one2many.scores.mean();
        total = total + out.one2one.boxes.mean() + out.one2one.scores.mean();
        for t in [
            out.one2many.kpts,
            out.one2many.kpts_sigma,
            out.one2one.kpts,
            out.one2one.kpts_sigma,
        ]
        .into_iter()
        .flatten()
        {
            total = total + t.mean();
        }
        let fwd = t.elapsed();
        let grads = total.clone().backward();
        let g = model
            .backbone
            .l0
            .conv
            .weight
            .grad(&grads)
            .ok_or_else(|| anyhow::anyhow!("no gradient reached layer 0"))?;
        let gnorm = g.powi_scalar(2).sum().sqrt().into_scalar::<f32>() as f64;
        let value = total.into_scalar::<f32>() as f64;
        device
            .sync()
            .map_err(|e| anyhow::anyhow!("device sync failed: {e:?}"))?;
        let kernels = watch.take().map(CompileProgress::finish).unwrap_or(0);
        println!(
            "step {step}: forward {:.3} s (enqueue), forward+backward {:.3} s, {kernels} kernels compiled, surrogate {value:.6}, |grad l0| {gnorm:.6e}",
            fwd.as_secs_f64(),
            t.elapsed().as_secs_f64()
        );
        anyhow::ensure!(
            value.is_finite() && gnorm.is_finite() && gnorm > 0.0,
            "non-finite or zero result"
        );
    }
    Ok(())
}
