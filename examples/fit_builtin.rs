//! Training from a Burn program through burnpose's library entry, `burnpose::train::fit`: two
//! epochs of the nano pose model on the built-in images, on the CPU, with a line per epoch.
//!
//! `cargo run --release --example fit_builtin [RUN_FOLDER]` (default: `runs/example`, or the
//! first of `runs/example2`, `runs/example3`, … that is free).

use burnpose::config::{Config, DeviceKind, device};
use burnpose::train::{EpochRecord, FitEvents, Trainer};
use std::path::{Path, PathBuf};

/// Prints one line per epoch; every other event keeps its default (nothing).
struct EpochLines;

impl FitEvents for EpochLines {
    fn epoch_end(&mut self, _trainer: &Trainer, record: &EpochRecord, _timed_from: usize) {
        println!(
            "epoch {}: loss {:.3}, val box mAP50 {:.3}, pose mAP50 {:.3}",
            record.epoch + 1,
            record.train_loss.iter().sum::<f64>(),
            record.box_map50,
            record.pose_map50
        );
    }

    fn warning(&mut self, message: &str) {
        eprintln!("warning: {message}");
    }
}

fn main() -> anyhow::Result<()> {
    // A fit never writes over an earlier run: `runs/example`, else `runs/example2`, ….
    let run_dir = match std::env::args_os().nth(1) {
        Some(dir) => PathBuf::from(dir),
        None => Path::new("runs").join(burnpose::train::unused_run_name(
            Path::new("runs"),
            "example",
        )),
    };
    // The defaults train on the built-in images; a small size keeps the example quick.
    let text =
        "[data]\nimgsz = 128\ntrain_images = 16\nval_images = 4\n[train]\nepochs = 2\nbatch = 4\n";
    let cfg = Config::parse(text, Path::new("example.toml"))?;
    let (device, what) = device::resolve(DeviceKind::Cpu, 0).map_err(anyhow::Error::msg)?;
    let mut trainer = Trainer::new(cfg, Path::new("example.toml"), device)?;
    println!("training on {what} into {}", run_dir.display());
    let summary = burnpose::train::fit(&mut trainer, &run_dir, &mut EpochLines)?;
    println!(
        "{} epochs; best epoch {}; state hash {}",
        summary.epochs,
        summary.best_epoch,
        trainer.state_hashes().model
    );
    Ok(())
}
