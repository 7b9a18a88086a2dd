//! `burnpose val`: COCO-style box and pose mAP of a checkpoint's EMA model (or of the freshly
//! initialised model when no checkpoint is given) on the config's val split.

use super::DeviceArg;
use crate::train::{Trainer, checkpoint, validate};
use std::path::{Path, PathBuf};

pub fn run(
    config_path: &Path,
    ckpt: Option<PathBuf>,
    device_arg: Option<DeviceArg>,
) -> anyhow::Result<()> {
    let (cfg, device, what) = super::config_and_device(config_path, device_arg)?;
    let mut trainer = Trainer::new(cfg, config_path, device)?;
    let source = match &ckpt {
        Some(p) => {
            checkpoint::load_into(&mut trainer, p)?;
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
    println!("val on {what}: {source}, {} images", trainer.val.len());
    println!(
        "box mAP50 {:.4} mAP50-95 {:.4} | pose mAP50 {:.4} mAP50-95 {:.4} | {:.1} s",
        m.box_map50,
        m.box_map,
        m.pose_map50,
        m.pose_map,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
