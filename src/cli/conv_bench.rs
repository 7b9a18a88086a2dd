//! `burnpose bench-conv`: every convolution of a config's training step, each pass (forward,
//! data gradient, weight gradient) timed on its own, with its achieved TFLOP/s and GB/s. On CUDA
//! the time is the GPU's busy time read through CUPTI (the launch census); elsewhere, or without
//! CUPTI, wall time with the device synced. The table, worst first by time per step, is the map
//! for making the convolutions faster (docs/bench.md).

use crate::config::DeviceKind;
use crate::model::ops::trace::{ConvCall, Pass};
use crate::train::census::Census;
use crate::train::precompile::step_convolutions;
use burn::prelude::*;
use burn::tensor::Distribution;
use std::path::Path;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct Options {
    #[arg(long, value_enum)]
    pub device: Option<DeviceKind>,
    /// Override `train.batch`.
    #[arg(long)]
    pub batch: Option<usize>,
    /// Timed runs of each pass (after one untimed run that compiles its kernels).
    #[arg(long, default_value_t = 20)]
    pub reps: usize,
    /// Show the kernels of the passes that take this many per cent of the total or more.
    #[arg(long, default_value_t = 3.0)]
    pub kernels_above: f64,
    /// Instead of the table, compare CubeCL's implicit-GEMM routines (comma-separated names,
    /// or `all`) on every pass they run: the reduced-precision forwards and stride-1 data
    /// gradients (CUDA only).
    #[arg(long)]
    pub routines: Option<String>,
    /// Instead of the table, compare CubeCL's matmul routines (comma-separated names, or
    /// `all`; `model::ops::matmul::ROUTINES`) on the weight gradients of the convolutions
    /// without groups, whose im2col product they run (CUDA only).
    #[arg(long, conflicts_with = "routines")]
    pub matmul_routines: Option<String>,
    /// With `--routines` or `--matmul-routines`: only the passes that take the most time per
    /// step under the current routine, this many (each routine compiles its own kernels, ~0.5 s
    /// each).
    #[arg(long, default_value_t = 16)]
    pub top: usize,
    /// Split the weight gradients' im2col products into matmul batches of at least this many
    /// output pixels (default: by the map's size, `model::ops::wgrad::by_size`; see
    /// `model::ops::wgrad::choose_chunk`).
    #[arg(long)]
    pub wgrad_chunk: Option<usize>,
    /// Pad the reduced-precision convolutions' operands whose channel count is not a multiple
    /// of 8, and is at least this many, to a multiple of this many (8, the default, 16 or 32;
    /// `model::ops::conv::gemm::choose_padding`, CUDA only).
    #[arg(long)]
    pub conv_padding: Option<usize>,
}

/// One pass of one convolution, measured.
struct Row {
    layer: usize,
    call: ConvCall,
    count: usize,
    pass: Pass,
    /// Milliseconds per run: GPU busy time on CUDA with CUPTI, else wall time.
    ms: f64,
    /// The kernels it ran, per run: (name, GPU ms), most first (CUPTI only).
    kernels: Vec<(String, f64)>,
}

impl Row {
    fn ms_per_step(&self) -> f64 {
        self.ms * self.count as f64
    }
}

pub fn run(config_path: &Path, o: Options) -> anyhow::Result<()> {
    anyhow::ensure!(o.reps > 0, "--reps must be positive");
    let (mut cfg, device, what) = super::config_and_device(config_path, o.device)?;
    if let Some(b) = o.batch {
        anyhow::ensure!(b > 0, "--batch must be positive");
        cfg.train.batch = b;
    }
    if let Some(pixels) = o.wgrad_chunk {
        crate::model::ops::wgrad::choose_chunk(pixels).map_err(|e| anyhow::anyhow!(e))?;
    }
    super::choose_conv_padding(o.conv_padding)?;
    let calls = step_convolutions(&cfg);
    let gpu_clock = Census::available().is_ok();
    let chunk = crate::model::ops::wgrad::chunk()
        .map_or_else(|| "by the map's size".to_string(), |c| c.to_string());
    #[cfg(feature = "cuda")]
    let routine = format!(
        ", routine {}, matmul routine {}, weight-gradient chunk {chunk}",
        crate::model::ops::conv::routine::chosen(),
        crate::model::ops::matmul::chosen(),
    );
    #[cfg(not(feature = "cuda"))]
    let routine = format!(", weight-gradient chunk {chunk}");
    println!(
        "bench-conv: {} ({what}{routine}), batch {}, {} px, {:?}: {} distinct convolutions, {} runs \
         of each pass; time = {}",
        config_path.display(),
        cfg.train.batch,
        cfg.data.imgsz,
        cfg.train.precision,
        calls.len(),
        o.reps,
        if gpu_clock {
            "GPU busy time (CUPTI)"
        } else {
            "wall time, device synced"
        }
    );
    if let Some(list) = &o.routines {
        return compare_routines(&calls, list, Family::Convolution, &device, &o, gpu_clock);
    }
    if let Some(list) = &o.matmul_routines {
        return compare_routines(&calls, list, Family::Matmul, &device, &o, gpu_clock);
    }
    let mut rows = Vec::new();
    for (layer, (call, count)) in calls.into_iter().enumerate() {
        for pass in call.passes() {
            let (ms, kernels) = time_pass(&call, pass, &device, o.reps, gpu_clock)?;
            rows.push(Row {
                layer,
                call: call.clone(),
                count,
                pass,
                ms,
                kernels,
            });
        }
    }
    print!("{}", table(&rows, o.kernels_above));
    Ok(())
}

/// Which routines [`compare_routines`] compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    /// The implicit-GEMM convolutions' (`model::ops::conv::routine`): the reduced-precision
    /// forwards and stride-1 data gradients without groups.
    Convolution,
    /// The matmuls' (`model::ops::matmul`): the weight gradients without groups.
    Matmul,
}

#[cfg(feature = "cuda")]
impl Family {
    fn names(self) -> Vec<&'static str> {
        use crate::model::ops::{conv::routine, matmul};
        match self {
            Family::Convolution => routine::ROUTINES.iter().map(|r| r.0).collect(),
            Family::Matmul => matmul::ROUTINES.to_vec(),
        }
    }

    fn choose(self, name: &str) -> Result<(), String> {
        use crate::model::ops::{conv::routine, matmul};
        match self {
            Family::Convolution => routine::choose(name),
            Family::Matmul => matmul::choose(name),
        }
    }

    fn chosen(self) -> &'static str {
        use crate::model::ops::{conv::routine, matmul};
        match self {
            Family::Convolution => routine::chosen(),
            Family::Matmul => matmul::chosen(),
        }
    }

    /// Whether a routine of this family runs `pass` of `call`.
    fn runs(self, call: &ConvCall, pass: Pass) -> bool {
        match self {
            Family::Convolution => {
                call.reduced.is_some()
                    && call.groups == 1
                    && (pass == Pass::Forward || (pass == Pass::DataGrad && call.stride == [1, 1]))
            }
            Family::Matmul => call.groups == 1 && pass == Pass::WeightGrad,
        }
    }
}

/// The routines' times on every pass they run, one column each, and their totals per step.
#[cfg(feature = "cuda")]
fn compare_routines(
    calls: &[(ConvCall, usize)],
    list: &str,
    family: Family,
    device: &Device,
    o: &Options,
    gpu_clock: bool,
) -> anyhow::Result<()> {
    let reps = o.reps;
    let names: Vec<&str> = if list == "all" {
        family.names()
    } else {
        list.split(',').map(str::trim).collect()
    };
    let passes: Vec<(usize, &ConvCall, usize, Pass)> = calls
        .iter()
        .enumerate()
        .flat_map(|(i, (c, n))| {
            c.passes()
                .into_iter()
                .filter(move |p| family.runs(c, *p))
                .map(move |p| (i, c, *n, p))
        })
        .collect();
    // The heaviest under the routine in use.
    let mut first = Vec::new();
    for (_, call, count, pass) in &passes {
        first.push(time_pass(call, *pass, device, reps, gpu_clock)?.0 * *count as f64);
    }
    let mut order: Vec<usize> = (0..passes.len()).collect();
    order.sort_by(|&a, &b| first[b].total_cmp(&first[a]));
    let all: f64 = first.iter().sum();
    let kept: f64 = order.iter().take(o.top).map(|&i| first[i]).sum();
    println!(
        "{} passes run a routine, {all:.3} ms per step under {}; comparing the {} heaviest \
         ({kept:.3} ms)",
        passes.len(),
        family.chosen(),
        o.top.min(passes.len())
    );
    let passes: Vec<_> = order.iter().take(o.top).map(|&i| passes[i]).collect();
    // ms per run, [pass][routine].
    let mut ms = vec![vec![f64::NAN; names.len()]; passes.len()];
    for (j, name) in names.iter().enumerate() {
        family.choose(name).map_err(|e| anyhow::anyhow!(e))?;
        let declined = crate::model::ops::matmul::declined();
        for (i, (_, call, _, pass)) in passes.iter().enumerate() {
            ms[i][j] = time_pass(call, *pass, device, reps, gpu_clock)?.0;
        }
        // A declined product ran Burn's routine: its column is not this routine's time.
        let declined = crate::model::ops::matmul::declined() - declined;
        println!("routine {name}: done; matmuls it declined (Burn's ran them): {declined}");
    }
    println!(
        "\n| # | input | weight | stride | × | pass | {} | best |",
        names.join(" | ")
    );
    println!("|{}", "---|".repeat(names.len() + 7));
    for (i, (layer, call, count, pass)) in passes.iter().enumerate() {
        let cells: Vec<String> = ms[i].iter().map(|m| format!("{:.1}", m * 1e3)).collect();
        let best = (0..names.len())
            .min_by(|&a, &b| ms[i][a].total_cmp(&ms[i][b]))
            .map_or("", |b| names[b]);
        println!(
            "| {layer} | {} | {} | {} | {count} | {} | {} | {best} |",
            dims(call.input),
            dims(call.weight),
            call.stride[0],
            pass_name(*pass),
            cells.join(" | ")
        );
    }
    let per_step = |j: usize| -> f64 {
        passes
            .iter()
            .enumerate()
            .map(|(i, p)| ms[i][j] * p.2 as f64)
            .sum()
    };
    let totals: Vec<String> = (0..names.len())
        .map(|j| format!("{:.3}", per_step(j)))
        .collect();
    let oracle: f64 = passes
        .iter()
        .enumerate()
        .map(|(i, p)| ms[i].iter().copied().fold(f64::INFINITY, f64::min) * p.2 as f64)
        .sum();
    println!(
        "| | | | | | ms per step | {} | {oracle:.3} |",
        totals.join(" | ")
    );
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn compare_routines(
    _calls: &[(ConvCall, usize)],
    _list: &str,
    family: Family,
    _device: &Device,
    _o: &Options,
    _gpu_clock: bool,
) -> anyhow::Result<()> {
    let flag = match family {
        Family::Convolution => "--routines",
        Family::Matmul => "--matmul-routines",
    };
    anyhow::bail!("{flag} compares CubeCL's CUDA routines: build with --features cuda")
}

/// Milliseconds per run of `pass`, and on the GPU clock its kernels.
fn time_pass(
    call: &ConvCall,
    pass: Pass,
    device: &Device,
    reps: usize,
    gpu_clock: bool,
) -> anyhow::Result<(f64, Vec<(String, f64)>)> {
    let random = |dims: [usize; 4]| Tensor::<4>::random(dims, Distribution::Default, device);
    let (x, weight, grad) = (
        random(call.input),
        random(call.weight),
        random(call.output()),
    );
    let sync = || {
        device
            .sync()
            .map_err(|e| anyhow::anyhow!("device sync failed: {e:?}"))
    };
    drop(call.launch(pass, &x, &weight, &grad));
    sync()?;
    let census = if gpu_clock {
        Some(Census::start().map_err(|e| anyhow::anyhow!(e))?)
    } else {
        None
    };
    let start = Instant::now();
    for _ in 0..reps {
        drop(call.launch(pass, &x, &weight, &grad));
    }
    sync()?;
    let wall_ms = start.elapsed().as_secs_f64() * 1e3 / reps as f64;
    let Some(census) = census else {
        return Ok((wall_ms, Vec::new()));
    };
    let report = census.finish(reps).map_err(|e| anyhow::anyhow!(e))?;
    let ms = report.phases.iter().map(|p| p.gpu_busy_ms).sum();
    let mut kernels: Vec<(String, f64)> = Vec::new();
    for k in report.kernels {
        match kernels.iter_mut().find(|(n, _)| *n == k.name) {
            Some(e) => e.1 += k.gpu_ms,
            None => kernels.push((k.name, k.gpu_ms)),
        }
    }
    kernels.sort_by(|a, b| b.1.total_cmp(&a.1));
    Ok((ms, kernels))
}

/// A tensor's dimensions as `N×C×H×W`.
fn dims(d: [usize; 4]) -> String {
    format!("{}×{}×{}×{}", d[0], d[1], d[2], d[3])
}

fn pass_name(pass: Pass) -> &'static str {
    match pass {
        Pass::Forward => "forward",
        Pass::DataGrad => "data grad",
        Pass::WeightGrad => "weight grad",
    }
}

/// The rows as markdown, most time per step first, with totals per pass and the kernels of the
/// passes that take `kernels_above` per cent of the total or more.
fn table(rows: &[Row], kernels_above: f64) -> String {
    let mut sorted: Vec<&Row> = rows.iter().collect();
    sorted.sort_by(|a, b| b.ms_per_step().total_cmp(&a.ms_per_step()));
    let total: f64 = rows.iter().map(Row::ms_per_step).sum();
    let mut out = String::from(
        "| # | input | weight | stride | groups | dtype | × per step | pass | µs per run | ms per step | % | TFLOP/s | GB/s (FP32 interface) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in &sorted {
        let s = r.ms * 1e-3;
        out += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.3} | {:.1} | {:.2} | {:.0} |\n",
            r.layer,
            dims(r.call.input),
            dims(r.call.weight),
            r.call.stride[0],
            r.call.groups,
            r.call
                .reduced
                .map_or("f32".to_string(), |d| format!("{d:?}").to_lowercase()),
            r.count,
            pass_name(r.pass),
            r.ms * 1e3,
            r.ms_per_step(),
            100.0 * r.ms_per_step() / total.max(f64::MIN_POSITIVE),
            r.call.flops() / s * 1e-12,
            r.call.min_bytes() / s * 1e-9,
        );
    }
    out += "\n| pass | ms per step | % | TFLOP/s |\n|---|---|---|---|\n";
    for pass in [Pass::Forward, Pass::DataGrad, Pass::WeightGrad] {
        let of: Vec<&Row> = rows.iter().filter(|r| r.pass == pass).collect();
        let ms: f64 = of.iter().map(|r| r.ms_per_step()).sum();
        let flops: f64 = of.iter().map(|r| r.call.flops() * r.count as f64).sum();
        out += &format!(
            "| {} | {:.3} | {:.1} | {:.2} |\n",
            pass_name(pass),
            ms,
            100.0 * ms / total.max(f64::MIN_POSITIVE),
            flops / (ms * 1e-3).max(f64::MIN_POSITIVE) * 1e-12
        );
    }
    out += &format!("| all | {total:.3} | 100 | |\n");
    let heavy: Vec<&&Row> = sorted
        .iter()
        .filter(|r| !r.kernels.is_empty() && 100.0 * r.ms_per_step() / total >= kernels_above)
        .collect();
    if !heavy.is_empty() {
        out += "\nKernels of the heaviest passes (µs per run):\n";
        for r in heavy {
            let ks: Vec<String> = r
                .kernels
                .iter()
                .map(|(n, ms)| format!("{} {:.1}", short(n), ms * 1e3))
                .collect();
            out += &format!("- #{} {}: {}\n", r.layer, pass_name(r.pass), ks.join(", "));
        }
    }
    out
}

/// A kernel's name without CubeCL's type suffixes and hash.
fn short(name: &str) -> &str {
    name.split("_lhs_")
        .next()
        .and_then(|n| n.split("_in_").next())
        .and_then(|n| n.split("_i_").next())
        .unwrap_or(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table sorts by time per step and its totals add up; a pass of a known size gives its
    /// FLOP rate.
    #[test]
    fn the_table_ranks_passes_by_time_per_step() {
        let call = ConvCall {
            input: [2, 8, 16, 16],
            weight: [4, 8, 3, 3],
            stride: [1, 1],
            padding: [(1, 1), (1, 1)],
            dilation: [1, 1],
            groups: 1,
            reduced: None,
            input_grad: true,
            weight_grad: true,
        };
        assert_eq!(call.output(), [2, 4, 16, 16]);
        assert_eq!(call.flops(), 2.0 * (2 * 16 * 16 * 4 * 8 * 9) as f64);
        let strided = ConvCall {
            stride: [2, 2],
            ..call.clone()
        };
        assert_eq!(strided.output_size(), [8, 8]);
        assert_eq!(call.passes().len(), 3);
        let row = |pass, ms, count| Row {
            layer: 0,
            call: call.clone(),
            count,
            pass,
            ms,
            kernels: vec![("matmul_entry_lhs_bf16_x".into(), ms)],
        };
        let rows = [
            row(Pass::Forward, 0.010, 1),
            row(Pass::WeightGrad, 0.008, 2),
        ];
        let t = table(&rows, 0.0);
        let weight = t.find("| weight grad | 8.0 |").expect(&t);
        let forward = t.find("| forward | 10.0 |").expect(&t);
        assert!(weight < forward, "{t}");
        assert!(t.contains("| all | 0.026 | 100 |"), "{t}");
        assert!(t.contains("matmul_entry 8.0"), "{t}");
    }
}
