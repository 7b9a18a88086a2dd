//! `burnpose fit`. The trainer is not built yet: this checks the config, device, model and one
//! data batch end to end, then says plainly that it stops there.

use super::DeviceArg;
use crate::config::{Config, DataSource, device};
use crate::data::{Batch, BuiltinDataset};
use crate::model::ParamCount;
use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::time::Instant;

pub fn run(
    config_path: &Path,
    name: Option<String>,
    resume: Option<PathBuf>,
    device_arg: Option<DeviceArg>,
) -> anyhow::Result<()> {
    let mut cfg = Config::load(config_path)?;
    if let Some(d) = device_arg {
        cfg.device.kind = d.into();
    }
    if let Some(n) = name {
        cfg.output.name = n;
    }
    if let Some(r) = resume {
        bail!(
            "--resume {}: checkpoints are not implemented yet",
            r.display()
        );
    }
    let (device, what) = device::resolve(cfg.device.kind, cfg.device.index)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("{}: key `device.kind`", config_path.display()))?;
    let yolo = cfg.model.yolo();
    println!("config: {}", config_path.display());
    println!("device: {what}");
    let t = Instant::now();
    let model = yolo.init(&device);
    println!(
        "model: {} with {} parameters, built in {:.2} s",
        yolo.name(),
        model.param_count(),
        t.elapsed().as_secs_f64()
    );
    let batch = match cfg.data.source {
        DataSource::Builtin => {
            let ds =
                BuiltinDataset::new(cfg.data.train_images, cfg.data.imgsz as u32, cfg.train.seed);
            let n = cfg.train.batch.min(ds.len);
            Batch::collate((0..n).map(|i| ds.get(i)).collect())
        }
        other => bail!(
            "{}: data.source = {other:?}: dataset loading is not implemented yet",
            config_path.display()
        ),
    };
    let persons: usize = batch.samples.iter().map(|s| s.instances.len()).sum();
    let t = Instant::now();
    let out = model.forward(batch.images_f32(&device));
    let anchors = out.one2one.boxes.dims()[2];
    let s = cfg.data.imgsz;
    println!(
        "batch: [{}, 3, {s}, {s}] images, {persons} labelled persons; forward gives {anchors} anchors ({:.2} s)",
        batch.samples.len(),
        t.elapsed().as_secs_f64()
    );
    println!(
        "fit: STOPPING HERE - the training loop (losses, optimizer, validation, checkpoints) is not \
         implemented yet. Nothing was trained and nothing was written to {}.",
        cfg.output.dir.join(&cfg.output.name).display()
    );
    Ok(())
}
