//! `burnpose bench`: complete fits in fresh processes, native and replay alternately, compared.
//! Each child is `burnpose fit CONFIG --replay B --report FILE`; the child times its whole fit
//! (trainer construction to the last checkpoint, device synced at the end) and every step, and
//! writes a [`FitReport`]; the parent times the whole process.

use super::peer::PeerReport;
use crate::config::DeviceKind;
use crate::train::report::write_atomic;
use crate::train::timing::mib;
use crate::train::{StateHashes, Trainer};
use anyhow::Context;
use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What one benchmarked fit reports.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FitReport {
    pub replay: bool,
    /// Why the stage ran natively, if it did.
    pub replay_off: Option<String>,
    pub fit_s: f64,
    /// Of `fit_s`: building the trainer (model, optimizer, datasets, RAM cache).
    #[serde(default)]
    pub setup_s: Option<f64>,
    /// Of `fit_s`: the epochs (their steps, data waits and validation).
    #[serde(default)]
    pub epochs_s: Option<f64>,
    /// Of the epochs: validating the EMA.
    #[serde(default)]
    pub validation_s: Option<f64>,
    /// Every training step, device-synchronised at both ends (or, with `unsynced`, by the
    /// host's clock alone).
    pub step_ms: Vec<f64>,
    /// The steps were timed without device syncs (`fit --unsynced`): their mean is the pace.
    #[serde(default)]
    pub unsynced: bool,
    /// Every training step by the device's clock (`fit --events`; NaN for the recording step).
    #[serde(default)]
    pub event_ms: Vec<f64>,
    pub peak_in_use_mib: f64,
    /// The largest bytes in use read inside a step (`StepTiming::in_step_memory`), MiB.
    #[serde(default)]
    pub peak_in_step_mib: Option<f64>,
    pub peak_reserved_mib: f64,
    pub hashes: StateHashes,
    pub box_map: f64,
    pub pose_map: f64,
    /// Whole process seconds, added by the `bench` parent.
    #[serde(default)]
    pub process_s: Option<f64>,
}

impl FitReport {
    /// The report of a fit that took `fit_s` seconds, `setup_s` of them building `t`.
    pub fn of(t: &Trainer, fit_s: f64, setup_s: f64, hashes: StateHashes) -> Self {
        let timing = t.timing.clone().unwrap_or_default();
        let last = t.history.last();
        Self {
            replay: t.stage.is_replay(),
            replay_off: t.replay_off.clone(),
            fit_s,
            setup_s: Some(setup_s),
            epochs_s: Some(t.history.iter().map(|r| r.seconds).sum()),
            validation_s: Some(t.history.iter().map(|r| r.val_seconds).sum()),
            peak_in_use_mib: mib(timing.peak_in_use()),
            peak_in_step_mib: timing.peak_in_step().map(mib),
            peak_reserved_mib: mib(timing.peak_reserved()),
            unsynced: timing.unsynced,
            step_ms: timing.step_ms,
            event_ms: timing.event_ms,
            hashes,
            box_map: last.map_or(f64::NAN, |r| r.box_map),
            pose_map: last.map_or(f64::NAN, |r| r.pose_map),
            process_s: None,
        }
    }

    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    }

    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        write(path, &serde_json::to_string_pretty(self)?)
    }
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    write_atomic(path, text.as_bytes()).with_context(|| format!("writing {}", path.display()))
}

struct Run {
    arm: &'static str,
    pair: usize,
    report: FitReport,
}

/// Kernel cache state the fits start from.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheState {
    /// The per-user cache, filled first by `burnpose warmup CONFIG`.
    Warm,
    /// An empty cache directory per fit: compilation is part of every measurement.
    Cold,
}

/// What `burnpose bench` runs and where it writes.
#[derive(clap::Args, Debug)]
pub struct Plan {
    /// Native/replay pairs.
    #[arg(long, default_value_t = 5)]
    pub pairs: usize,
    /// Where runs, reports and the tables go.
    #[arg(long, default_value = "runs/bench")]
    pub out: PathBuf,
    #[arg(long, value_enum)]
    pub device: Option<DeviceKind>,
    /// Steps excluded from the post-warm-up step time.
    #[arg(long, default_value_t = 64)]
    pub skip: usize,
    /// Kernel cache each fit starts from.
    #[arg(long, value_enum, default_value = "warm")]
    pub cache: CacheState,
    /// Also time every step by the device's clock (CUDA events) in each fit (`fit --events`).
    #[arg(long)]
    pub events: bool,
    /// A peer's report (benches/peer/ultralytics_pose.py JSON), shown beside the two arms.
    #[arg(long)]
    pub peer: Option<PathBuf>,
    /// Time the fits' steps without device syncs (`fit --unsynced`): the step row becomes the
    /// pace (a mean) and the in-step memory row is left empty.
    #[arg(long, conflicts_with = "events")]
    pub unsynced: bool,
    /// Keep the fits an earlier `bench` with the same `--out` completed, run only the rest (to
    /// split a benchmark over several device sessions).
    #[arg(long)]
    pub resume: bool,
}

pub fn run(config: &Path, plan: Plan) -> anyhow::Result<()> {
    let Plan {
        pairs,
        out,
        device,
        skip,
        cache,
        peer,
        resume,
        events,
        unsynced,
    } = plan;
    let out = out.as_path();
    anyhow::ensure!(pairs > 0, "--pairs must be at least 1");
    let setup = setup_line(&crate::config::Config::load(config)?);
    // Read before the fits, so a wrong path fails in seconds, not after them.
    let peer = peer.as_deref().map(PeerReport::load).transpose()?;
    let device_args: Vec<String> = device
        .map(|d| {
            let v = d.to_possible_value().expect("device values are named");
            vec!["--device".to_string(), v.get_name().to_string()]
        })
        .unwrap_or_default();
    let child = Child {
        exe: std::env::current_exe().context("locating the burnpose binary")?,
        config,
        device_args,
        out,
        cache,
        events,
        unsynced,
    };
    let plan: Vec<(usize, &'static str)> = (0..pairs)
        .flat_map(|pair| [(pair, "native"), (pair, "replay")])
        .collect();
    // A fit is complete once the parent has added its whole-process seconds.
    let kept: Vec<Option<FitReport>> = plan
        .iter()
        .map(|&(pair, arm)| {
            let path = child.report_path(&run_name(arm, pair));
            let r = FitReport::load(&path).ok().filter(|_| resume)?;
            r.process_s.is_some().then_some(r)
        })
        .collect();
    if cache == CacheState::Warm && kept.iter().any(Option::is_none) {
        child.warmup()?;
    }
    let mut runs = Vec::new();
    for ((pair, arm), kept) in plan.into_iter().zip(kept) {
        let name = run_name(arm, pair);
        let report = match kept {
            Some(r) => {
                println!(
                    "pair {}/{pairs}: {arm} fit: kept from an earlier run",
                    pair + 1
                );
                r
            }
            None => {
                println!("pair {}/{pairs}: {arm} fit ...", pair + 1);
                child
                    .fit(&name, arm == "replay")
                    .with_context(|| format!("the {arm} fit of pair {}", pair + 1))?
            }
        };
        runs.push(Run { arm, pair, report });
    }
    let csv = runs_csv(&runs, skip);
    write(&out.join("bench.csv"), &csv)?;
    let md = table(&runs, pairs, skip, config, cache, peer.as_ref()) + &setup;
    write(&out.join("bench.md"), &md)?;
    println!("{md}");
    println!(
        "written: {} and {}",
        out.join("bench.csv").display(),
        out.join("bench.md").display()
    );
    Ok(())
}

fn run_name(arm: &str, pair: usize) -> String {
    format!("bench-{arm}-{pair}")
}

/// How the parent starts its child processes.
struct Child<'a> {
    exe: PathBuf,
    config: &'a Path,
    device_args: Vec<String>,
    out: &'a Path,
    cache: CacheState,
    events: bool,
    unsynced: bool,
}

impl Child<'_> {
    fn report_path(&self, name: &str) -> PathBuf {
        self.out.join("reports").join(format!("{name}.json"))
    }

    fn warmup(&self) -> anyhow::Result<()> {
        println!(
            "warming the kernel cache: burnpose warmup {}",
            self.config.display()
        );
        let status = std::process::Command::new(&self.exe)
            .arg("warmup")
            .arg(self.config)
            .args(&self.device_args)
            .status()
            .context("starting burnpose warmup")?;
        anyhow::ensure!(status.success(), "burnpose warmup failed ({status})");
        Ok(())
    }

    /// One complete fit in a fresh process; its report, with the whole process time added
    /// (and written back, so that `--resume` can keep it).
    fn fit(&self, name: &str, replay: bool) -> anyhow::Result<FitReport> {
        let report_path = self.report_path(name);
        let log_path = self.out.join("logs").join(format!("{name}.log"));
        std::fs::create_dir_all(log_path.parent().expect("has a parent"))?;
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("creating {}", log_path.display()))?;
        let mut cmd = std::process::Command::new(&self.exe);
        cmd.arg("fit")
            .arg(self.config)
            .args([
                "--name",
                name,
                "--replay",
                &replay.to_string(),
                "--exist-ok",
            ])
            .arg("--report")
            .arg(&report_path)
            .args(self.events.then_some("--events"))
            .args(self.unsynced.then_some("--unsynced"))
            .args(&self.device_args)
            .stdout(log.try_clone()?)
            .stderr(log);
        if self.cache == CacheState::Cold {
            // CubeCL's per-user cache lives under the XDG cache home: a fresh one is empty.
            let empty = self.out.join("cold-cache").join(name);
            if empty.exists() {
                std::fs::remove_dir_all(&empty)
                    .with_context(|| format!("clearing {}", empty.display()))?;
            }
            std::fs::create_dir_all(&empty)?;
            cmd.env("XDG_CACHE_HOME", std::path::absolute(&empty)?);
        }
        let start = Instant::now();
        let status = cmd.status().context("starting a fit process")?;
        let process_s = start.elapsed().as_secs_f64();
        anyhow::ensure!(
            status.success(),
            "failed ({status}); its output is in {}",
            log_path.display()
        );
        let mut report = FitReport::load(&report_path)?;
        report.process_s = Some(process_s);
        report.write(&report_path)?;
        Ok(report)
    }
}

/// What was trained, for the table: the data (and whether it is the built-in synthetic set) and
/// the settings the seed benchmark fixes.
fn setup_line(cfg: &crate::config::Config) -> String {
    let (m, d, t) = (&cfg.model, &cfg.data, &cfg.train);
    let data = match d.source {
        crate::config::DataSource::Builtin => format!(
            "built-in synthetic images, {} train / {} val",
            d.train_images, d.val_images
        ),
        other => format!(
            "{other:?} dataset at {}",
            d.path
                .as_ref()
                .map_or("(no path)".into(), |p| p.display().to_string())
        ),
    };
    format!(
        "\nSetup: {:?} {:?}; data: {data}; {} epochs, batch {} (nbs {}), {} px, {:?}, seed {}, image cache {:?}, device HSV {}, {} loader workers.\n",
        m.scale,
        m.task,
        t.epochs,
        t.batch,
        t.nbs,
        d.imgsz,
        t.precision,
        t.seed,
        d.cache,
        cfg.augment.hsv_device,
        d.workers
    )
}

/// "equal", or which hashes differ.
fn differing(a: &StateHashes, b: &StateHashes) -> String {
    let parts = [
        ("model", a.model == b.model),
        ("EMA", a.ema == b.ema),
        ("optimizer", a.optimizer == b.optimizer),
        ("scheduler", a.scheduler == b.scheduler),
        ("scaler", a.scaler == b.scaler),
        ("per-step losses", a.losses == b.losses),
    ];
    let off: Vec<&str> = parts.iter().filter(|p| !p.1).map(|p| p.0).collect();
    if off.is_empty() {
        "equal".into()
    } else {
        format!("{} differ", off.join(", "))
    }
}

/// Median of the steps after the first `skip` (NaN entries — steps not timed — left out), if
/// there are any.
fn step_median(step_ms: &[f64], skip: usize) -> Option<f64> {
    let timed: Vec<f64> = step_ms
        .iter()
        .skip(skip)
        .copied()
        .filter(|v| !v.is_nan())
        .collect();
    (!timed.is_empty()).then(|| crate::train::median(&timed))
}

/// Mean of the steps after the first `skip`, if there are any: an unsynced fit's pace.
fn step_mean(step_ms: &[f64], skip: usize) -> Option<f64> {
    let v = step_ms.get(skip..).filter(|v| !v.is_empty())?;
    Some(crate::train::timing::mean(v))
}

/// Seconds in all timed steps (NaN entries, steps not timed, left out).
fn steps_total_s(step_ms: &[f64]) -> f64 {
    step_ms.iter().filter(|v| !v.is_nan()).sum::<f64>() / 1e3
}

/// A row of the table: its name, a burnpose run's value, the peer's value.
type Metric = (
    &'static str,
    fn(&Run, usize) -> Option<f64>,
    fn(&PeerReport, usize) -> Option<f64>,
);

const METRICS: [Metric; 12] = [
    (
        "complete fit (s)",
        |r, _| Some(r.report.fit_s),
        |p, _| Some(p.fit_s),
    ),
    (
        "whole process (s)",
        |r, _| r.report.process_s,
        |p, _| p.process_s,
    ),
    (
        "post-warm-up step (ms)",
        |r, skip| step_median(&r.report.step_ms, skip).filter(|_| !r.report.unsynced),
        |p, skip| step_median(&p.step_ms, skip),
    ),
    // Only with `bench --events`; the peer's script times with synchronised wall clock.
    (
        "post-warm-up step, device clock (ms)",
        |r, skip| step_median(&r.report.event_ms, skip),
        |_, _| None,
    ),
    // Only with `bench --unsynced`: no sync around a step, so one step's time is not its cost,
    // but their mean is the fit's pace.
    (
        "post-warm-up pace, unsynced mean (ms)",
        |r, skip| step_mean(&r.report.step_ms, skip).filter(|_| r.report.unsynced),
        |_, _| None,
    ),
    // The peer's is PyTorch's peak (`max_memory_allocated`); ours the largest of the pool reads
    // inside each step (`StepTiming::in_step_memory`): a lower bound of the true peak.
    (
        "peak in use within a step (MiB)",
        |r, _| r.report.peak_in_step_mib,
        |p, _| Some(p.peak_allocated_mib),
    ),
    // What stays allocated between steps (replay keeps its graphs' buffers).
    (
        "peak in use after a step (MiB)",
        |r, _| Some(r.report.peak_in_use_mib),
        |_, _| None,
    ),
    (
        "peak reserved (MiB)",
        |r, _| Some(r.report.peak_reserved_mib),
        |p, _| Some(p.peak_reserved_mib),
    ),
    // Where the fit's seconds went: setup + epochs + the rest (checkpoints, plots, pictures);
    // the epochs hold the steps (every one, the first included) and validation.
    (
        "complete fit: setup (s)",
        |r, _| r.report.setup_s,
        |_, _| None,
    ),
    (
        "complete fit: all steps (s)",
        |r, _| Some(steps_total_s(&r.report.step_ms)),
        |p, _| Some(steps_total_s(&p.step_ms)),
    ),
    (
        "complete fit: validation (s)",
        |r, _| r.report.validation_s,
        |_, _| None,
    ),
    (
        "complete fit: outside the epochs (s)",
        |r, _| {
            let (setup, epochs) = (r.report.setup_s?, r.report.epochs_s?);
            Some(r.report.fit_s - setup - epochs)
        },
        |_, _| None,
    ),
];

fn runs_csv(runs: &[Run], skip: usize) -> String {
    let mut s = String::from("pair,arm,replay_active");
    for (name, _, _) in METRICS {
        // Quoted where the name holds a comma, as CSV readers expect.
        match name.contains(',') {
            true => s += &format!(",\"{name}\""),
            false => s += &format!(",{name}"),
        }
    }
    s += ",steps,box_mAP50-95,pose_mAP50-95,model_hash,optimizer_hash,losses_hash\n";
    for r in runs {
        s += &format!("{},{},{}", r.pair + 1, r.arm, r.report.replay);
        for (_, f, _) in METRICS {
            s += &f(r, skip).map_or(",".into(), |v| format!(",{v:.3}"));
        }
        let h = &r.report.hashes;
        s += &format!(
            ",{},{:.5},{:.5},{},{},{}\n",
            r.report.step_ms.len(),
            r.report.box_map,
            r.report.pose_map,
            h.model,
            h.optimizer,
            h.losses
        );
    }
    s
}

fn summary(v: &[f64]) -> String {
    if v.is_empty() {
        return "n/a".into();
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let median = crate::train::median(&s);
    format!("{median:.1} ({:.1}–{:.1})", s[0], s[s.len() - 1])
}

fn table(
    runs: &[Run],
    pairs: usize,
    skip: usize,
    config: &Path,
    cache: CacheState,
    peer: Option<&PeerReport>,
) -> String {
    let arm = |name: &str, p: usize| runs.iter().find(|r| r.arm == name && r.pair == p);
    let (peer_head, peer_rule) = match peer {
        Some(p) => (format!(" {} (one run) |", p.name()), "---|"),
        None => (String::new(), ""),
    };
    let mut md = format!(
        "Benchmark of `{}`: {pairs} pairs of fresh `fit` processes (native, replay, native, …), {} kernel cache; step times exclude the first {skip} steps.\n\n| metric | native median (range) | replay median (range) | paired reduction (range) |{peer_head}\n|---|---|---|---|{peer_rule}\n",
        config.display(),
        match cache {
            CacheState::Warm => "warm (filled by `burnpose warmup` first)",
            CacheState::Cold => "cold (an empty cache per fit)",
        }
    );
    for (name, f, of_peer) in METRICS {
        let vals = |a: &str| -> Vec<f64> {
            (0..pairs)
                .filter_map(|p| arm(a, p).and_then(|r| f(r, skip)))
                .collect()
        };
        let reductions: Vec<f64> = (0..pairs)
            .filter_map(|p| {
                let n = arm("native", p).and_then(|r| f(r, skip))?;
                let r = arm("replay", p).and_then(|r| f(r, skip))?;
                // No reduction of nothing (the CPU's memory pool reports no use).
                (n > 0.0).then(|| 100.0 * (1.0 - r / n))
            })
            .collect();
        let red = if reductions.is_empty() {
            "n/a".into()
        } else {
            let lo = reductions.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = reductions.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            format!("{lo:.1} % to {hi:.1} %")
        };
        let peer_cell = peer.map_or(String::new(), |p| {
            format!(
                " {} |",
                of_peer(p, skip).map_or("n/a".into(), |v| format!("{v:.1}"))
            )
        });
        md += &format!(
            "| {name} | {} | {} | {red} |{peer_cell}\n",
            summary(&vals("native")),
            summary(&vals("replay"))
        );
    }
    md += "\nState hashes (model, EMA, optimizer, scheduler, scaler, per-step losses), native vs replay:";
    for p in 0..pairs {
        let verdict = match (arm("native", p), arm("replay", p)) {
            (Some(n), Some(r)) => differing(&n.report.hashes, &r.report.hashes),
            _ => "missing run".into(),
        };
        md += &format!(" pair {}: {verdict};", p + 1);
    }
    if pairs > 1 {
        // The control: does the same arm reproduce itself from process to process?
        for a in ["native", "replay"] {
            if let (Some(x), Some(y)) = (arm(a, 0), arm(a, 1)) {
                md += &format!(
                    " {a} pair 1 vs pair 2: {};",
                    differing(&x.report.hashes, &y.report.hashes)
                );
            }
        }
    }
    md += "\n";
    if let Some(why) = runs
        .iter()
        .filter(|r| r.arm == "replay")
        .find_map(|r| r.report.replay_off.clone())
    {
        md += &format!("\n**The replay arm ran natively**: {why}.\n");
    }
    md
}
