//! `burnpose bench-step`: post-warm-up training step time of a config, native or replayed
//! stage, with the device synchronised at both ends of every timed step
//! (`Trainer::timed_step`), and the memory pool's peak use. One process measures one variant;
//! run variants alternately in fresh processes (docs/bench.md).

use super::step_options::Options;
use crate::train::timing::{IN_STEP_SAMPLES, PHASES, mib};
use crate::train::{Trainer, median};
use std::path::Path;
use std::time::Instant;

pub fn run(config_path: &Path, o: Options) -> anyhow::Result<()> {
    let (mut cfg, device, what) = super::config_and_device(config_path, o.device)?;
    super::step_options::apply(&o, &mut cfg)?;
    anyhow::ensure!(o.steps > 0, "--steps must be at least 1");
    if o.census > 0 {
        // Before any step runs, not after the timed ones.
        crate::train::census::Census::available().map_err(|e| anyhow::anyhow!("--census: {e}"))?;
        anyhow::ensure!(
            crate::config::device::is_cuda(&device),
            "--census counts CUDA launches; the device is {what}"
        );
    }
    let mut t = Trainer::new(cfg, config_path, device)?;
    t.timing = Some(crate::train::StepTiming {
        phases: o.phases,
        events: o.events,
        upload: o.upload,
        in_step_memory: o.in_step_memory,
        ..Default::default()
    });
    let order = t.epoch_order(0);
    let nb = t.batches_per_epoch();
    for i in 0..o.skip {
        t.timed_step(&t.batch(&order, i % nb)?)?;
    }
    // The timed steps' batches are made first: the loader is benchmarked on its own, and a
    // profile of the timed steps then holds nothing else.
    let batches = (o.skip..o.skip + o.steps)
        .map(|i| t.batch(&order, i % nb))
        .collect::<Result<Vec<_>, _>>()?;
    #[cfg(feature = "profile")]
    let profile = o
        .profile
        .as_deref()
        .map(super::profile::Profile::start)
        .transpose()?;
    let cpu_before = process_cpu_seconds();
    for batch in &batches {
        t.timed_step(batch)?;
    }
    // The timed steps' own: the unsynced and census steps after them replay it too.
    let timed_updates = t.stage.update_replays();
    let cpu = process_cpu_seconds()
        .zip(cpu_before)
        .map(|(after, before)| after - before);
    #[cfg(feature = "profile")]
    if let Some(p) = profile {
        let path = o.profile.clone().expect("set with the profile");
        let samples = p.write()?;
        println!(
            "host profile: {samples} samples at 997 Hz; {} and {}",
            path.display(),
            path.with_extension("folded").display()
        );
    }
    let unsynced = if o.unsynced > 0 {
        if o.spans {
            crate::train::spans::start();
        }
        let ms = run_unsynced(&mut t, &order, nb, o.skip + o.steps, o.unsynced);
        if o.spans {
            super::step_report::print_spans(&crate::train::spans::stop(), o.unsynced);
        }
        Some(ms?)
    } else {
        None
    };
    let first_census = o.skip + o.steps + o.unsynced;
    let census = if o.census > 0 {
        Some(run_census(&mut t, &order, nb, first_census, o.census)?)
    } else {
        None
    };
    let timing = t.timing.take().expect("set above");
    let mut times = timing.step_ms[o.skip..].to_vec();
    times.sort_by(f64::total_cmp);
    let q = |f: f64| quantile(&times, f);
    let (peak_use, peak_reserved) = (timing.peak_in_use(), timing.peak_reserved());
    let h = t.state_hashes();
    println!(
        "bench-step {what} replay={}{}{} precision={:?} optimizer={:?} flat={} batch={} upload={:?} steps={} skip={}: median {:.2} ms (min {:.2}, p10 {:.2}, p90 {:.2}, max {:.2}); peak in use {:.0} MiB, reserved {:.0} MiB; hashes model {} optimizer {} losses {}",
        t.stage.is_replay(),
        if t.stage.is_replay() && t.cfg.one_graph() {
            " one_graph=true"
        } else {
            ""
        },
        if t.stage.is_replay() && t.cfg.record_update() {
            " record_update=true"
        } else {
            ""
        },
        t.cfg.train.precision,
        t.optimizer.rule,
        t.optimizer.flat_active(),
        t.cfg.train.batch,
        o.upload,
        o.steps,
        o.skip,
        q(0.5),
        q(0.0),
        q(0.1),
        q(0.9),
        q(1.0),
        mib(peak_use),
        mib(peak_reserved),
        h.model,
        h.optimizer,
        h.losses
    );
    // "phase MiB, …" over the in-step samples, with `digits` decimals.
    let at = |by: [u64; IN_STEP_SAMPLES.len()], digits: usize| -> String {
        let parts: Vec<String> = IN_STEP_SAMPLES
            .iter()
            .zip(by)
            .map(|(p, b)| format!("{} {:.digits$}", PHASES[*p as usize], mib(b)))
            .collect();
        parts.join(", ")
    };
    if let (Some(b), Some(by)) = (timing.peak_in_step(), timing.peak_in_step_by_sample()) {
        println!(
            "peak in use within a step: {:.0} MiB (largest at the end of: {})",
            mib(b),
            at(by, 0)
        );
    }
    if let Some(by) = timing.padding_in_step_by_sample() {
        println!("padding in use within a step (MiB): {}", at(by, 1));
    }
    // Medians per block of steps, from the first: shows warm-up, and any drift a
    // growing pool or tape would cause.
    let blocks: Vec<String> = timing
        .step_ms
        .chunks(16)
        .map(|c| format!("{:.0}", median(c)))
        .collect();
    println!("per 16 steps (median ms): {}", blocks.join(" "));
    // Whole MiB: the small pools move by a few KiB from step to step.
    let whole = |i: usize| timing.reserved[i] >> 20;
    let changed: Vec<String> = (0..timing.reserved.len())
        .filter(|&i| i == 0 || whole(i - 1) != whole(i))
        .map(|i| {
            let (u, r) = (mib(timing.in_use[i]), mib(timing.reserved[i]));
            format!("{} {u:.0}/{r:.0}", i + 1)
        })
        .collect();
    println!(
        "MiB in use/reserved after step n, where the reservation changed: {}",
        changed.join(", ")
    );
    println!("steps {}", timing.optimizer_split(o.skip));
    if o.phases {
        println!("phases (median ms, synced): {}", timing.phase_line(o.skip));
    }
    if o.events {
        println!(
            "device clock (events): median {:.2} ms per step",
            median(&timing.event_ms[o.skip..])
        );
    }
    if let Some(cpu) = cpu {
        // Against the wall clock this says whether the host or the device sets the pace.
        println!(
            "host CPU time of the process (all threads) during the timed steps: {:.1} ms per step",
            cpu * 1e3 / o.steps as f64
        );
    }
    if let Some(ms) = unsynced {
        println!(
            "unsynced: {ms:.2} ms per step over {} steps (no device sync between them; {} read \
             late; {} uploaded ahead)",
            o.unsynced, t.read_late, t.uploaded_ahead
        );
    }
    if let Some(report) = census {
        // Host ms per phase from the timed steps (CUPTI's callbacks slow the census steps).
        // "Between steps" has no phase of its own: NaN.
        let host: Option<Vec<f64>> = o.phases.then(|| {
            let mut ms = timing.phase_medians(o.skip).to_vec();
            ms.push(f64::NAN);
            ms
        });
        super::step_report::print_census(
            &report,
            host.as_deref(),
            o.census_csv.as_deref(),
            o.census_trace.as_deref(),
        )?;
    }
    if let Some(why) = &t.replay_off {
        println!("stage native (no replay): {why}");
    }
    if t.cfg.record_update() && t.stage.is_replay() {
        let steps = timing.optimizer_step.iter().filter(|s| **s).count();
        println!(
            "recorded updates: {timed_updates} replays in the {steps} timed optimizer steps \
             (the first records it)"
        );
    }
    let buffers = t.stage.buffer_bytes();
    if !buffers.is_empty() {
        let parts: Vec<String> = buffers
            .iter()
            .map(|(what, b)| format!("{what} {:.1}", mib(*b)))
            .collect();
        println!("replay buffers (MiB): {}", parts.join(", "));
    }
    if let Some((copied, runs)) = t.stage.gradient_copies() {
        println!(
            "recorded gradient gather: {copied} of {runs} runs copied, {} written in place",
            runs - copied
        );
    }
    if let Some((copied, of)) = t.stage.statistics_copies() {
        println!("recorded running statistics: {copied} copies of {of} statistics or runs");
    }
    let taken = crate::model::ops::grad_operands::taken();
    if taken > 0 {
        // Native steps take them every step, a recording once per recorded backward.
        println!("output-gradient operands taken by convolutions: {taken} in this process");
    }
    let taken = crate::model::ops::input_operands::taken();
    if taken > 0 {
        println!("input operands taken by convolutions: {taken} in this process");
    }
    let growth = t.stage.recording();
    if !growth.is_empty() {
        let parts: Vec<String> = growth
            .iter()
            .map(|g| {
                let (b, r) = (g.bytes as f64 / 1048576.0, mib(g.reserved));
                format!("{} {b:+.1} ({:+}) [{r:.0}]", g.what, g.slices)
            })
            .collect();
        println!(
            "recording, MiB in use (slices) [MiB reserved after]: {}",
            parts.join(", ")
        );
    }
    Ok(())
}

/// Mean ms per step of `n` steps from batch `first` on, with the device synced only before the
/// first and after the last (timing off for them: nothing else syncs; with
/// `replay.defer_readback` they are queued as a fit queues them).
fn run_unsynced(
    t: &mut Trainer,
    order: &[usize],
    nb: usize,
    first: usize,
    n: usize,
) -> anyhow::Result<f64> {
    let batches = (first..first + n)
        .map(|i| t.batch(order, i % nb))
        .collect::<Result<Vec<_>, _>>()?;
    let sync = |t: &Trainer| {
        t.device
            .sync()
            .map_err(|e| anyhow::anyhow!("device sync around the unsynced steps: {e:?}"))
    };
    let timing = t.timing.take();
    sync(t)?;
    let start = Instant::now();
    for (i, batch) in batches.iter().enumerate() {
        t.queue_step(batch, batches.get(i + 1));
    }
    t.finish_queued();
    let synced = sync(t);
    let ms = start.elapsed().as_secs_f64() * 1e3 / n as f64;
    t.timing = timing;
    synced?;
    Ok(ms)
}

/// `n` more steps with phase syncs under the launch census (batches made before it starts).
fn run_census(
    t: &mut Trainer,
    order: &[usize],
    nb: usize,
    first: usize,
    n: usize,
) -> anyhow::Result<crate::train::census::CensusReport> {
    use crate::train::census::Census;
    let batches = (first..first + n)
        .map(|i| t.batch(order, i % nb))
        .collect::<Result<Vec<_>, _>>()?;
    let timing = t.timing.as_mut().expect("set by the caller");
    let phases = timing.phases;
    timing.phases = true;
    let census = Census::start().map_err(|e| anyhow::anyhow!("launch census: {e}"))?;
    let mut result = Ok(());
    for batch in &batches {
        if let Err(e) = t.timed_step(batch) {
            result = Err(e);
            break;
        }
    }
    let synced = t.device.sync();
    let report = census
        .finish(n)
        .map_err(|e| anyhow::anyhow!("launch census: {e}"))?;
    result?;
    synced.map_err(|e| anyhow::anyhow!("device sync after the census: {e:?}"))?;
    let timing = t.timing.as_mut().expect("set by the caller");
    timing.phases = phases;
    // The census steps are not timed steps: the medians stay the timed ones'.
    timing.drop_last(n);
    Ok(report)
}

/// The `f` quantile (nearest rank) of ascending `sorted`.
fn quantile(sorted: &[f64], f: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * f).round() as usize]
}

/// User + system CPU seconds of this process, all threads (Linux: `/proc/self/stat`; `None`
/// elsewhere).
fn process_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // Linux reports these in USER_HZ, 100 per second on every platform it supports.
    Some(ticks / 100.0)
}
