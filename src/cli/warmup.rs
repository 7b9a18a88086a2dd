//! `burnpose warmup`: run what a fit of the config runs once — a training step with an
//! optimizer step and EMA update, and validation — so that every kernel it needs is compiled
//! into the persistent per-user cache before the fit. Throwaway: nothing is saved.

use crate::config::DeviceKind;
use crate::config::compile_progress::CompileProgress;
use crate::train::{Trainer, validate};
use std::path::Path;
use std::time::Instant;

pub fn run(config_path: &Path, device_arg: Option<DeviceKind>) -> anyhow::Result<()> {
    let start = Instant::now();
    let (cfg, device, what) = super::config_and_device(config_path, device_arg)?;
    println!("warmup on {what}: {}", config_path.display());
    if crate::config::device::is_cuda(&device) {
        super::precompile::run(&cfg, true);
    }
    let mut trainer = Trainer::new(cfg, config_path, device.clone())?;
    let order = trainer.epoch_order(0);
    let batch = trainer.batch(&order, 0)?;
    let setup = start.elapsed().as_secs_f64();
    let watch = CompileProgress::start(&super::fit::work_name(&trainer.cfg));
    let t = Instant::now();
    trainer.train_step(&batch);
    trainer.force_optimizer_step();
    device
        .sync()
        .map_err(|e| anyhow::anyhow!("device sync failed: {e:?}"))?;
    let step = t.elapsed().as_secs_f64();
    let t = Instant::now();
    validate::validate(
        &trainer.ema.model,
        &trainer.val,
        &trainer.cfg,
        &trainer.loss,
    )?;
    let val = t.elapsed().as_secs_f64();
    let kernels = watch.finish();
    println!(
        "setup {setup:.1} s, training + optimizer step {step:.1} s, validation {val:.1} s, total {:.1} s; {kernels} kernels compiled",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
