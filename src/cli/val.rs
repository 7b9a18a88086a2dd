//! `burnpose val`: box and pose mAP (COCOeval's or Ultralytics', `train.val_metric`) of a checkpoint's EMA model (or of the freshly
//! initialised model when no checkpoint is given) on the config's val split, or on `--split`.

use crate::config::DeviceKind;
use crate::train::{Trainer, checkpoint, validate};
use anyhow::Context;
use std::path::{Path, PathBuf};

pub fn run(
    config_path: &Path,
    ckpt: Option<PathBuf>,
    device_arg: Option<DeviceKind>,
    save_json: Option<PathBuf>,
    split: Option<String>,
) -> anyhow::Result<()> {
    let (mut cfg, device, what) = super::config_and_device(config_path, device_arg)?;
    if let Some(split) = split {
        cfg.data.val_split = split;
    }
    // Ultralytics weights load as `model.weights` would (into the model and its EMA).
    let ultralytics = ckpt
        .as_ref()
        .filter(|p| crate::weights::is_ultralytics(p))
        .map(std::path::absolute)
        .transpose()
        .context("resolving --checkpoint")?;
    if let Some(p) = &ultralytics {
        cfg.model.weights = Some(p.clone());
    }
    let mut trainer = Trainer::new(cfg, config_path, device)?;
    let source = match &ckpt {
        Some(p) if ultralytics.is_some() => format!("Ultralytics weights {}", p.display()),
        Some(p) => {
            checkpoint::load_to_evaluate(&mut trainer, p)?;
            format!("EMA of {} (epoch {})", p.display(), trainer.epoch)
        }
        None => "freshly initialised model (no checkpoint)".to_string(),
    };
    let start = std::time::Instant::now();
    let m = validate::validate(
        &trainer.ema.model,
        &trainer.val,
        &trainer.cfg,
        &trainer.loss,
    )?;
    let split = match (trainer.cfg.data.source, trainer.cfg.data.val_split.as_str()) {
        (crate::config::DataSource::Yolo, "test") => "test",
        (crate::config::DataSource::Yolo, _) => "val",
        (_, s) => s,
    };
    // Ultralytics' val scores the one-to-many head with NMS unless told `nms=False`: say which
    // head these numbers are of, so that the two can be compared (docs/weights.md).
    let head = match trainer.cfg.train.val_nms {
        true => "one-to-many head + NMS (train.val_nms)",
        false => "one-to-one head (Ultralytics' val: one-to-many + NMS, train.val_nms = true)",
    };
    let metric = match trainer.cfg.train.val_metric {
        crate::config::ValMetric::Coco => "COCOeval's mAP (train.val_metric = \"coco\")",
        crate::config::ValMetric::Ultralytics => {
            "Ultralytics' mAP (train.val_metric = \"ultralytics\")"
        }
    };
    println!(
        "val on {what}: {source}, {} images ({} objects) of split {split}, {head}, {metric}",
        trainer.val.len(),
        m.objects
    );
    println!(
        "box mAP50 {:.4} mAP50-95 {:.4} | pose mAP50 {:.4} mAP50-95 {:.4} | {:.1} s",
        m.box_map50,
        m.box_map,
        m.pose_map50,
        m.pose_map,
        start.elapsed().as_secs_f64()
    );
    print!(
        "{}",
        validate::per_class_lines(&m.per_class, trainer.val.names(), trainer.cfg.model.nc)
    );
    if let Some(dir) = save_json {
        let (results, truth) = validate::coco_json(&m, trainer.cfg.model.nc, trainer.val.names());
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        for (name, value) in [("predictions.json", results), ("ground_truth.json", truth)] {
            let path = dir.join(name);
            crate::train::report::write_atomic(&path, value.to_string().as_bytes())
                .with_context(|| format!("writing {}", path.display()))?;
        }
        println!(
            "wrote {} detections to {} and the ground truth they were scored against to {}",
            m.detections.len(),
            dir.join("predictions.json").display(),
            dir.join("ground_truth.json").display()
        );
    }
    Ok(())
}
