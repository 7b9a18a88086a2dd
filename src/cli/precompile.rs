//! The worker processes of `train::precompile`: the parent writes the fit's config (as the fit
//! will read it) to a temporary file and starts `device.compile_workers` copies of this program
//! as `burnpose precompile-part FILE --part I --of N`; each compiles its share of the fit's
//! convolutions into the kernel cache.

use crate::config::compile_progress::{remember, seen_before};
use crate::config::{Config, DeviceKind};
use crate::train::precompile;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

/// Compiles the convolution kernels of a fit of `cfg` (a CUDA config) in worker processes and
/// says so on stdout, unless this build already compiled the same convolutions on this machine
/// and `always` is false. Never fails the caller: a worker that fails is reported, and whatever
/// it left out compiles on first use as without workers.
pub fn run(cfg: &Config, always: bool) {
    if cfg.device.compile_workers == 0 {
        return;
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let traced = precompile::convolutions(cfg);
    let work = precompile::work_name(&traced);
    if !always && seen_before(&work) {
        return;
    }
    let calls = traced.len();
    let workers = cfg.device.compile_workers.min(cpus).min(calls);
    if workers == 0 {
        return;
    }
    let start = Instant::now();
    println!(
        "compiling {calls} convolutions' kernels in {workers} processes before the first step \
         (device.compile_workers)"
    );
    if let Err(e) = spawn_and_wait(cfg, workers) {
        println!(
            "kernel compilation ahead of the step stopped: {e}; the rest compiles on first use"
        );
        return;
    }
    remember(&work, calls);
    println!("kernels compiled in {:.1} s", start.elapsed().as_secs_f64());
}

fn spawn_and_wait(cfg: &Config, workers: usize) -> Result<(), String> {
    let file =
        std::env::temp_dir().join(format!("burnpose-precompile-{}.toml", std::process::id()));
    std::fs::write(&file, cfg.to_toml())
        .map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let children: Vec<_> = (0..workers)
        .map(|part| {
            Command::new(&exe)
                .arg("precompile-part")
                .arg(&file)
                .args(["--part", &part.to_string(), "--of", &workers.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
        })
        .collect();
    let mut failures = Vec::new();
    for (part, child) in children.into_iter().enumerate() {
        let result = child
            .and_then(|c| c.wait_with_output())
            .map_err(|e| e.to_string())
            .and_then(|out| match out.status.success() {
                true => Ok(()),
                false => Err(String::from_utf8_lossy(&out.stderr).trim().to_string()),
            });
        if let Err(e) = result {
            failures.push(format!("worker {part}: {e}"));
        }
    }
    std::fs::remove_file(&file).ok();
    match failures.is_empty() {
        true => Ok(()),
        false => Err(failures.join("; ")),
    }
}

/// One worker: part `part` of `of` of the convolutions of the fit configured in `config`.
pub fn part(config: &Path, part: usize, of: usize) -> anyhow::Result<()> {
    anyhow::ensure!(part < of, "--part {part} is not below --of {of}");
    let cfg = Config::load(config)?;
    let (device, _) = crate::config::device::resolve(DeviceKind::Cuda, cfg.device.index)
        .map_err(anyhow::Error::msg)?;
    let calls = precompile::convolutions(&cfg);
    precompile::compile(&precompile::share(&calls, part, of), &device).map_err(anyhow::Error::msg)
}
