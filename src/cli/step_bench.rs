//! `burnpose bench-step`: post-warm-up training step time of a config, native or replayed
//! stage, with the device synchronised at both ends of every timed step
//! (`Trainer::timed_step`), and the memory pool's peak use. One process measures one variant;
//! run variants alternately in fresh processes (docs/bench.md).

use crate::config::DeviceKind;
use crate::config::Precision;
use crate::train::timing::{IN_STEP_SAMPLES, PHASES, mib};
use crate::train::{Trainer, median};
use std::path::Path;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct Options {
    #[arg(long, value_enum)]
    pub device: Option<DeviceKind>,
    /// Override `replay.enabled`.
    #[arg(long)]
    pub replay: Option<bool>,
    /// Override `replay.scope`.
    #[arg(long, value_enum)]
    pub scope: Option<crate::config::Scope>,
    /// Override `train.precision`.
    #[arg(long, value_enum)]
    pub precision: Option<Precision>,
    /// Override `train.loss_on`.
    #[arg(long, value_enum)]
    pub loss_on: Option<crate::config::LossOn>,
    /// Override `replay.shared_parameters`.
    #[arg(long)]
    pub shared_parameters: Option<bool>,
    /// Override `replay.one_graph`.
    #[arg(long)]
    pub one_graph: Option<bool>,
    /// Override `replay.record_update`.
    #[arg(long)]
    pub record_update: Option<bool>,
    /// Override `replay.defer_readback` (it applies to the `--unsynced` steps: the timed ones
    /// read at once).
    #[arg(long)]
    pub defer_readback: Option<bool>,
    /// Override `replay.upload_ahead` (it applies to the `--unsynced` steps: the timed ones
    /// upload their own batch).
    #[arg(long)]
    pub upload_ahead: Option<bool>,
    /// Override `optim.optimizer` (e.g. `musgd`, which `auto` picks for fits of more than
    /// 10,000 iterations).
    #[arg(long, value_enum)]
    pub optimizer: Option<crate::config::OptimizerKind>,
    /// Override `optim.flat_update`.
    #[arg(long)]
    pub flat_update: Option<bool>,
    /// Override `train.batch` (and `train.nbs`, so every step is an optimizer step).
    #[arg(long)]
    pub batch: Option<usize>,
    /// Override `device.conv_bn_ops`.
    #[arg(long, value_enum)]
    pub conv_bn_ops: Option<crate::model::ops::ConvBnOps>,
    /// Run the reduced-precision convolutions with this routine: our `own-bf16` (the default)
    /// or one of CubeCL's (`bench-conv --routines`; CUDA only).
    #[arg(long)]
    pub conv_routine: Option<String>,
    /// Run the weight gradients' matmuls with this routine: one of ours (`own-tf32`, the
    /// default, and its forms) or one of CubeCL's (`bench-conv --matmul-routines`; CUDA only).
    #[arg(long)]
    pub matmul_routine: Option<String>,
    /// Split the weight gradients' im2col products into matmul batches of at least this many
    /// output pixels (default: by the map's size, `model::ops::wgrad::by_size`; see
    /// `model::ops::wgrad::choose_chunk`).
    #[arg(long)]
    pub wgrad_chunk: Option<usize>,
    /// How the RLE flow runs: each coupling as one operation (`couplings`, the default), each
    /// coupling net as one (`nets`), or the module's layers (`layers`); `model::flow::choose`.
    #[arg(long)]
    pub flow: Option<String>,
    /// Pad the reduced-precision convolutions' operands whose channel count is not a multiple
    /// of 8, and is at least this many, to a multiple of this many (8, the default, 16 or 32;
    /// `model::ops::conv::gemm::choose_padding`, CUDA only).
    #[arg(long)]
    pub conv_padding: Option<usize>,
    /// Whether the BF16 data gradients of strided convolutions run by the
    /// routine's stride-1 GEMM on the zero-dilated output gradient (`true`, the default) or by
    /// Burn's direct kernel in FP32 (`false`; CUDA only).
    #[arg(long)]
    pub strided_by_gemm: Option<bool>,
    /// Sum every weight gradient's chunks by our kernel, native and replay alike, and write
    /// the recorded step's weight gradients straight into the flat gradient buffer (`true`, the
    /// default; `model::ops::grads_into`, CUDA only) or by Burn's `sum_dim` with a copy after
    /// (`false`).
    #[arg(long)]
    pub grads_in_place: Option<bool>,
    /// Weight gradients of the convolutions computed in BF16 from BF16 operands, accumulated in
    /// FP32 (`true`; `model::ops::wgrad::choose_reduced`, CUDA only), or from FP32 operands
    /// (`false`, the default).
    #[arg(long)]
    pub reduced_wgrad: Option<bool>,
    /// Lay a recording's BatchNorm running statistics out in one buffer and update them there
    /// in place (`true`, the default; `model::ops::stats_into`, CUDA only), or gather and copy
    /// them after each recorded forward (`false`).
    #[arg(long)]
    pub stats_in_place: Option<bool>,
    /// Run each channels-last BatchNorm sum (statistics, γ/β gradients) in one launch, the last
    /// cube of a channel tile merging its partials (`true`; `kernels/batch_norm_single.rs`,
    /// CUDA only), or in two (`false`, the default: the one launch is slower on the GPU). Both
    /// give the same bits.
    #[arg(long)]
    pub bn_single_pass: Option<bool>,
    /// Have the fused BatchNorm's backward write its input gradient (the convolution's output
    /// gradient) channels-last where its tile kernel runs for a stride-1 convolution without
    /// groups with a multiple of 4 channels (`true`; the weight gradient's matmul then reads it
    /// without a copy; CUDA only; the default), or NCHW (`false`). The same values either way.
    #[arg(long)]
    pub bn_grad_channels_last: Option<bool>,
    /// Keep a recorded loss's flow parameters as segments of one buffer, refreshed from the
    /// trainer's by one copy of their run in the flat optimizer's values (`true`;
    /// `replay::loss::choose_flow_segments`, CUDA only; the default), or each in its own
    /// buffer, one copy per tensor (`false`). The same values either way.
    #[arg(long)]
    pub flow_segments: Option<bool>,
    /// With one graph, run one more warm-up before each step recording that runs the window's
    /// own work eagerly (`true`; `replay::recorder::choose_warm_up_as_captured`, CUDA only), or
    /// only the plain warm-ups (`false`, the default; a window refused for room is then
    /// recorded again with it). The same values either way.
    #[arg(long)]
    pub warm_up_as_captured: Option<bool>,
    /// Have each BatchNorm's backward write its convolution's output gradient as the data
    /// gradient's GEMM takes it (`true`, the default; `model::ops::grad_operands`, CUDA only), or
    /// have the convolution cast it (`false`). Both give the same bits.
    #[arg(long)]
    pub grad_operands: Option<bool>,
    /// Have each BatchNorm whose output a convolution takes write that convolution's input as
    /// its GEMM takes it (`true`, the default; `model::ops::input_operands`, CUDA only), or
    /// have the convolution cast it (`false`). Both give the same bits.
    #[arg(long)]
    pub input_operands: Option<bool>,
    /// Cast NCHW operands channels-last through shared-memory tiles (`true`;
    /// `model::ops::channels::choose_tiled`, CUDA only) or one unit per value (`false`, the
    /// default). Both give the same bits.
    #[arg(long)]
    pub tiled_casts: Option<bool>,
    /// Also read the memory pool inside every step (at the ends of loss, backward and optimizer)
    /// and print the largest bytes in use.
    #[arg(long)]
    pub in_step_memory: bool,
    /// Steps run before timing starts.
    #[arg(long, default_value_t = 64)]
    pub skip: usize,
    /// Timed steps.
    #[arg(long, default_value_t = 64)]
    pub steps: usize,
    /// Also break every step down into phases between device syncs (upload, augment, forward,
    /// assign, loss, backward, optimizer, readback); the syncs make the steps themselves slower.
    #[arg(long)]
    pub phases: bool,
    /// Also time every step with the device's own clock (CUDA events on the training stream)
    /// and print its median beside the wall-clock one.
    #[arg(long)]
    pub events: bool,
    /// After the timed steps, run this many more with phase syncs and count, per phase, the
    /// CUDA driver calls, kernel launches, kernels run and GPU busy time (CUPTI; CUDA build).
    /// With `--phases` the table adds host ms and µs per driver call from the timed steps.
    #[arg(long, default_value_t = 0)]
    pub census: usize,
    /// Write the census per (phase, kernel) here as CSV: runs and GPU ms per step.
    #[arg(long, requires = "census")]
    pub census_csv: Option<std::path::PathBuf>,
    /// Write the census's last step here as CSV: every kernel and copy in the order the GPU
    /// started it, with its phase, GPU µs, grid and block.
    #[arg(long, requires = "census")]
    pub census_trace: Option<std::path::PathBuf>,
    /// After the timed steps, run this many more without a device sync between them and print
    /// their mean: the pace of a fit without `--report`, where the host may run ahead of the
    /// GPU (the timed steps sync before and after each step).
    #[arg(long, default_value_t = 0)]
    pub unsynced: usize,
    /// With `--unsynced`: also sum the host's wall time in each part of those steps
    /// (`train::spans`) and print it per step.
    #[arg(long, requires = "unsynced")]
    pub spans: bool,
    /// How batches reach the device: bytes widened there (u8) or on the host (i32).
    #[arg(long, value_enum, default_value = "u8")]
    pub upload: crate::data::batch::Upload,
    /// Sample the host's threads during the timed steps; write a flamegraph SVG here and the
    /// folded stacks beside it (`.folded`).
    #[cfg(feature = "profile")]
    #[arg(long)]
    pub profile: Option<std::path::PathBuf>,
}

pub fn run(config_path: &Path, o: Options) -> anyhow::Result<()> {
    let (mut cfg, device, what) = super::config_and_device(config_path, o.device)?;
    if let Some(r) = o.replay {
        cfg.replay.enabled = r;
    }
    if let Some(s) = o.scope {
        cfg.replay.scope = Some(s);
    }
    if let Some(p) = o.precision {
        cfg.train.precision = p;
    }
    if let Some(l) = o.loss_on {
        cfg.train.loss_on = l;
    }
    if let Some(s) = o.shared_parameters {
        cfg.replay.shared_parameters = s;
    }
    if let Some(g) = o.one_graph {
        cfg.replay.one_graph = Some(g);
    }
    if let Some(u) = o.record_update {
        cfg.replay.record_update = Some(u);
    }
    if let Some(d) = o.defer_readback {
        cfg.replay.defer_readback = Some(d);
    }
    if let Some(u) = o.upload_ahead {
        cfg.replay.upload_ahead = Some(u);
    }
    if let Some(k) = o.optimizer {
        cfg.optim.optimizer = k;
    }
    if let Some(f) = o.flat_update {
        cfg.optim.flat_update = f;
    }
    if let Some(b) = o.batch {
        cfg.train.batch = b;
        cfg.train.nbs = b;
    }
    if let Some(name) = &o.conv_routine {
        #[cfg(feature = "cuda")]
        crate::model::ops::conv::routine::choose(name).map_err(|e| anyhow::anyhow!(e))?;
        #[cfg(not(feature = "cuda"))]
        anyhow::bail!("--conv-routine {name}: CubeCL's routines run on CUDA only");
    }
    if let Some(name) = &o.matmul_routine {
        #[cfg(feature = "cuda")]
        crate::model::ops::matmul::choose(name).map_err(|e| anyhow::anyhow!(e))?;
        #[cfg(not(feature = "cuda"))]
        anyhow::bail!("--matmul-routine {name}: CubeCL's routines run on CUDA only");
    }
    if let Some(pixels) = o.wgrad_chunk {
        crate::model::ops::wgrad::choose_chunk(pixels).map_err(|e| anyhow::anyhow!(e))?;
    }
    if let Some(way) = &o.flow {
        crate::model::flow::choose(way).map_err(|e| anyhow::anyhow!("--flow: {e}"))?;
    }
    super::choose_conv_padding(o.conv_padding)?;
    if let Some(gemm) = o.strided_by_gemm {
        #[cfg(feature = "cuda")]
        crate::model::ops::conv::routine::choose_strided_by_gemm(gemm);
        #[cfg(not(feature = "cuda"))]
        anyhow::bail!("--strided-by-gemm {gemm}: CubeCL's routines run on CUDA only");
    }
    if let Some(ours) = o.grads_in_place {
        #[cfg(feature = "cuda")]
        crate::model::ops::grads_into::choose(ours);
        #[cfg(not(feature = "cuda"))]
        anyhow::bail!("--grads-in-place {ours}: the recorded step runs on CUDA only");
    }
    if let Some(reduced) = o.reduced_wgrad {
        #[cfg(feature = "cuda")]
        crate::model::ops::wgrad::choose_reduced(reduced);
        #[cfg(not(feature = "cuda"))]
        anyhow::bail!("--reduced-wgrad {reduced}: reduced operands run on CUDA only");
    }
    if let Some(in_place) = o.stats_in_place {
        #[cfg(feature = "cuda")]
        crate::model::ops::stats_into::choose(in_place);
        #[cfg(not(feature = "cuda"))]
        anyhow::bail!("--stats-in-place {in_place}: the recordings run on CUDA only");
    }
    if let Some(on) = o.grad_operands {
        #[cfg(feature = "cuda")]
        crate::model::ops::grad_operands::choose(on);
        #[cfg(not(feature = "cuda"))]
        anyhow::bail!("--grad-operands {on}: the operands are made on CUDA only");
    }
    if let Some(on) = o.input_operands {
        #[cfg(feature = "cuda")]
        crate::model::ops::input_operands::choose(on);
        #[cfg(not(feature = "cuda"))]
        anyhow::bail!("--input-operands {on}: the operands are made on CUDA only");
    }
    if let Some(on) = o.tiled_casts {
        #[cfg(feature = "cuda")]
        crate::model::ops::channels::choose_tiled(on);
        #[cfg(not(feature = "cuda"))]
        anyhow::bail!("--tiled-casts {on}: the casts run on CUDA only");
    }
    if let Some(single) = o.bn_single_pass {
        #[cfg(feature = "cuda")]
        crate::model::ops::fused_bn_single::choose(single);
        #[cfg(not(feature = "cuda"))]
        anyhow::bail!("--bn-single-pass {single}: our BatchNorm kernels run on CUDA only");
    }
    if let Some(on) = o.bn_grad_channels_last {
        #[cfg(feature = "cuda")]
        crate::model::ops::choose_channels_last_grad(on);
        #[cfg(not(feature = "cuda"))]
        anyhow::bail!("--bn-grad-channels-last {on}: our BatchNorm kernels run on CUDA only");
    }
    if let Some(on) = o.flow_segments {
        #[cfg(feature = "cuda")]
        crate::replay::loss::choose_flow_segments(on);
        #[cfg(not(feature = "cuda"))]
        anyhow::bail!("--flow-segments {on}: the loss is recorded on CUDA only");
    }
    if let Some(on) = o.warm_up_as_captured {
        #[cfg(feature = "cuda")]
        crate::replay::recorder::choose_warm_up_as_captured(on);
        #[cfg(not(feature = "cuda"))]
        anyhow::bail!("--warm-up-as-captured {on}: the step is recorded on CUDA only");
    }
    if let Some(k) = o.conv_bn_ops {
        cfg.device.conv_bn_ops = k;
    }
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
