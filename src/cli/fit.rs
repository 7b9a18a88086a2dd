//! `burnpose fit`: train from a config (or resume a checkpoint), with a progress bar, a
//! `results.csv`, and `last`/`best` checkpoints in the run folder.

use crate::config::DeviceKind;
use crate::config::{Config, compile_progress::CompileProgress};
use crate::loss::TERMS;
use crate::model::ParamCount;
use crate::train::{EpochRecord, FitEvents, Trainer, checkpoint};
use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};

/// What `fit` takes besides the config.
#[derive(Default)]
pub struct FitOptions {
    pub name: Option<String>,
    pub resume: Option<PathBuf>,
    /// Override `model.weights` (not with `resume`).
    pub weights: Option<PathBuf>,
    pub device: Option<DeviceKind>,
    /// Override `replay.enabled`.
    pub replay: Option<bool>,
    /// Override `replay.scope`; on `--resume` it must equal the checkpoint's.
    pub scope: Option<crate::config::Scope>,
    /// Write a benchmark report (JSON, `bench::FitReport`) here; also times every step.
    pub report: Option<PathBuf>,
    /// Time every step's phases and print their medians per epoch.
    pub phases: bool,
    /// Also time every step with the device's clock (`StepTiming::events`).
    pub events: bool,
    /// Time the steps without device syncs (`StepTiming::unsynced`).
    pub unsynced: bool,
    /// Write into an existing run folder of the same name instead of a new `<name>2`, `<name>3`…
    pub exist_ok: bool,
}

pub fn run(config_path: &Path, o: FitOptions) -> anyhow::Result<()> {
    let FitOptions {
        name,
        resume,
        weights,
        device: device_arg,
        replay,
        scope,
        report: report_path,
        phases,
        events,
        unsynced,
        exist_ok,
    } = o;
    let process_start = std::time::Instant::now();
    let mut cfg = match &resume {
        Some(ckpt) => {
            let stored = checkpoint::read_config(ckpt)?;
            let given = Config::load(config_path)?;
            if let Some(s) = scope {
                anyhow::ensure!(
                    s == stored.replay_scope(),
                    "--scope {} differs from the scope {} was trained with ({}): the scope \
                     decides the order gradients are added in, so a resumed fit keeps it",
                    format!("{s:?}").to_lowercase(),
                    ckpt.display(),
                    format!("{:?}", stored.replay_scope()).to_lowercase()
                );
            }
            let differ = config_differences(&stored, &given);
            anyhow::ensure!(
                differ.is_empty(),
                "{} differs from the config {} was trained with ({}); a resumed fit goes on with \
                 the checkpoint's own config: pass that one (its run folder has config.toml)",
                config_path.display(),
                ckpt.display(),
                differ.join("; ")
            );
            stored
        }
        None => {
            let mut cfg = Config::load(config_path)?;
            cfg.replay.scope = scope.or(cfg.replay.scope);
            if let Some(w) = weights {
                cfg.model.weights = Some(
                    std::path::absolute(&w)
                        .with_context(|| format!("--weights {}", w.display()))?,
                );
            }
            cfg
        }
    };
    if let Some(n) = name {
        cfg.output.name = n;
    }
    if resume.is_none() && !exist_ok {
        let chosen = crate::train::unused_run_name(&cfg.output.dir, &cfg.output.name);
        if chosen != cfg.output.name {
            println!(
                "{} exists; this run writes {} (--exist-ok reuses the folder)",
                cfg.output.dir.join(&cfg.output.name).display(),
                cfg.output.dir.join(&chosen).display()
            );
            cfg.output.name = chosen;
        }
    }
    if let Some(r) = replay {
        cfg.replay.enabled = r;
    }
    let (device, what) = super::device_for(&mut cfg, config_path, device_arg)?;
    let run_dir = cfg.output.dir.join(&cfg.output.name);
    let fit_start = std::time::Instant::now();
    if crate::config::device::is_cuda(&device) {
        super::precompile::run(&cfg, false);
    }
    // A resumed fit takes every weight from its checkpoint: the starting weights are neither
    // read again nor required to still exist, and its checkpoints go on naming them.
    let start_weights = cfg.model.weights.clone();
    if resume.is_some() {
        cfg.model.weights = None;
    }
    let mut trainer = Trainer::new(cfg, config_path, device.clone())?;
    trainer.cfg.model.weights = start_weights;
    let setup_s = fit_start.elapsed().as_secs_f64();
    if report_path.is_some() || phases || events || unsynced {
        trainer.timing = Some(crate::train::StepTiming {
            phases,
            events,
            unsynced,
            // A benchmark's report compares memory with the peer's in-step peak (a read inside
            // the step, which waits for the device thread: not in an unsynced fit).
            in_step_memory: report_path.is_some() && !unsynced,
            ..Default::default()
        });
    }
    if let Some(ckpt) = &resume {
        checkpoint::load_into(&mut trainer, ckpt)?;
        println!(
            "resumed {} at epoch {}, iteration {}",
            ckpt.display(),
            trainer.epoch + 1,
            trainer.ni
        );
    }
    let cfg = trainer.cfg.clone();
    println!(
        "{} ({} parameters) on {what}; {} train / {} val images at {}px, batch {}, {} epochs, optimizer {:?}",
        cfg.model.yolo().name(),
        trainer.model.param_count(),
        trainer.loader.source.len(),
        trainer.val.len(),
        cfg.data.imgsz,
        cfg.train.batch,
        cfg.train.epochs,
        trainer.optimizer.rule
    );
    println!("run folder: {}", run_dir.display());
    let mut progress = Progress {
        bar: ProgressBar::hidden(),
        watch: Some(CompileProgress::start(&work_name(&cfg))),
        process_start,
        epochs: cfg.train.epochs,
        nc: cfg.model.nc,
        phases,
    };
    crate::train::fit(&mut trainer, &run_dir, &mut progress)?;
    device
        .sync()
        .map_err(|e| anyhow::anyhow!("device sync failed: {e:?}"))?;
    let fit_s = fit_start.elapsed().as_secs_f64();
    let h = trainer.state_hashes();
    if let Some(path) = &report_path {
        super::bench::FitReport::of(&trainer, fit_s, setup_s, h.clone()).write(path)?;
    }
    println!(
        "done: {} epochs in {fit_s:.1} s; results in {}",
        trainer.epoch,
        run_dir.join("results.csv").display()
    );
    println!(
        "state hashes: model {} ema {} optimizer {} scheduler {} scaler {}",
        h.model, h.ema, h.optimizer, h.scheduler, h.scaler
    );
    if let Some(s) = &trainer.scaler {
        println!(
            "fp16 loss scale {} ({} optimizer steps skipped for inf/NaN gradients)",
            s.scale, s.skipped
        );
    }
    Ok(())
}

/// What decides the kernels a fit compiles, to remember their count between runs.
pub fn work_name(cfg: &Config) -> String {
    format!(
        "fit-{}-b{}-{}",
        cfg.model.yolo().name(),
        cfg.train.batch,
        cfg.data.imgsz
    )
}

/// The keys whose values differ between two configs, as `key: a vs b`, leaving out what may
/// change between a run and its resumption: the device, the output folder and the replay switch.
pub fn config_differences(stored: &Config, given: &Config) -> Vec<String> {
    let table = |c: &Config| {
        let mut v = toml::Value::try_from(c).expect("config serialises");
        if let Some(t) = v.as_table_mut() {
            t.remove("device");
            t.remove("output");
            if let Some(r) = t.get_mut("replay").and_then(|r| r.as_table_mut()) {
                r.remove("enabled");
            }
        }
        v
    };
    let mut out = Vec::new();
    diff("", &table(stored), &table(given), &mut out);
    out
}

fn diff(prefix: &str, a: &toml::Value, b: &toml::Value, out: &mut Vec<String>) {
    match (a.as_table(), b.as_table()) {
        (Some(ta), Some(tb)) => {
            let mut keys: Vec<&String> = ta.keys().chain(tb.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                match (ta.get(k), tb.get(k)) {
                    (Some(x), Some(y)) => diff(&key, x, y, out),
                    (x, y) => out.push(format!("{key}: {x:?} vs {y:?}")),
                }
            }
        }
        _ if a != b => out.push(format!("{prefix}: checkpoint {a}, config {b}")),
        _ => {}
    }
}

/// The fit's progress on the terminal: a bar per epoch, the first step's compile time, a line
/// per epoch with its losses, metrics and (when timed) step medians.
struct Progress {
    bar: ProgressBar,
    watch: Option<CompileProgress>,
    process_start: std::time::Instant,
    epochs: usize,
    nc: usize,
    phases: bool,
}

impl FitEvents for Progress {
    fn epoch_start(&mut self, epoch: usize, batches: usize) {
        self.bar = ProgressBar::new(batches as u64);
        self.bar.set_style(
            ProgressStyle::with_template(
                "{prefix} {bar:25} {pos}/{len} {msg} [{elapsed}<{eta}, {per_sec}]",
            )
            .expect("template"),
        );
        self.bar
            .set_prefix(format!("epoch {}/{}", epoch + 1, self.epochs));
    }

    fn step(&mut self, batch: usize, _batches: usize, items: &[f32; 6]) {
        if let Some(w) = self.watch.take() {
            let kernels = w.finish();
            let seconds = self.process_start.elapsed().as_secs_f64();
            // Printed directly: a hidden bar (no terminal) would drop `bar.println`.
            self.bar.suspend(|| {
                println!("first step done {seconds:.1} s after start ({kernels} kernels compiled)")
            });
        }
        self.bar.set_position(batch as u64 + 1);
        self.bar.set_message(terms(items.iter().map(|&v| v as f64)));
    }

    fn epoch_end(&mut self, trainer: &Trainer, record: &EpochRecord, timed_from: usize) {
        self.bar.finish();
        let total: f64 = record.train_loss.iter().sum();
        println!(
            "epoch {}/{}: loss {total:.4} ({}), lr {:.2e} | val box mAP50 {:.4} mAP50-95 {:.4} | pose mAP50 {:.4} mAP50-95 {:.4} | {:.1} s (data wait {:.1} s)",
            record.epoch + 1,
            self.epochs,
            terms(record.train_loss),
            record.lr,
            record.box_map50,
            record.box_map,
            record.pose_map50,
            record.pose_map,
            record.seconds,
            record.data_wait
        );
        print!(
            "{}",
            crate::train::validate::per_class_lines(
                &record.per_class,
                trainer.val.names(),
                self.nc
            )
        );
        // Per epoch: the step can drift as training goes on (docs/perf_log.md).
        if let Some(t) = &trainer.timing {
            let mut line = if t.unsynced {
                format!(
                    "  pace {:.1} ms per step (unsynced mean; {} read late so far)",
                    t.mean_from(timed_from),
                    trainer.read_late
                )
            } else {
                format!(
                    "  step median {:.1} ms ({})",
                    crate::train::median(&t.step_ms[timed_from..]),
                    t.optimizer_split(timed_from)
                )
            };
            if self.phases {
                line += &format!("; phases (median ms, synced): {}", t.phase_line(timed_from));
            }
            println!("{line}");
        }
        if trainer.skipped_records > 0 {
            println!(
                "  ({} bad images/records skipped, data.skip_bad = true)",
                trainer.skipped_records
            );
        }
    }

    fn warning(&mut self, message: &str) {
        eprintln!("warning: {message}");
    }

    fn notice(&mut self, message: &str) {
        println!("{message}");
    }
}

/// `box 1.234 pose 0.567 …`: loss items by their names.
fn terms(items: impl IntoIterator<Item = f64>) -> String {
    TERMS
        .iter()
        .zip(items)
        .map(|(t, v)| format!("{t} {v:.3}"))
        .collect::<Vec<_>>()
        .join(" ")
}
