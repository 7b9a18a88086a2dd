//! `bench-step --profile PATH` (cargo feature `profile`): the host's CPU time during the timed
//! steps, sampled by `pprof` on every thread, written as a flamegraph SVG at PATH and as folded
//! stacks (`thread;outermost;…;innermost count`, one line per stack) at PATH with `.folded`, which
//! `benches/gpu/profile_summary.py` sums by layer (docs/perf_log.md).

use anyhow::Context;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Samples per second per busy thread.
const FREQUENCY: i32 = 997;

/// A running sampler, stopped and written by [`Profile::write`].
pub struct Profile {
    guard: pprof::ProfilerGuard<'static>,
    path: PathBuf,
}

impl Profile {
    /// Starts sampling. Samples whose innermost frame is in libc, libgcc, pthread or the vDSO
    /// are dropped (pprof's advice: unwinding from inside them can deadlock) unless
    /// `BURNPOSE_PROFILE_ALL=1`; on the H200 they were ~90 % of the CPU time (docs/perf_log.md).
    pub fn start(path: &Path) -> anyhow::Result<Self> {
        let all = std::env::var("BURNPOSE_PROFILE_ALL").is_ok_and(|v| v == "1");
        let blocklist: &[&str] = if all {
            &[]
        } else {
            &["libc", "libgcc", "pthread", "vdso"]
        };
        let guard = pprof::ProfilerGuardBuilder::default()
            .frequency(FREQUENCY)
            .blocklist(blocklist)
            .build()
            .context("starting the pprof sampler")?;
        Ok(Self {
            guard,
            path: path.to_path_buf(),
        })
    }

    /// Stops sampling; writes the SVG and the folded stacks; returns the sample count.
    pub fn write(self) -> anyhow::Result<isize> {
        let report = self
            .guard
            .report()
            .build()
            .context("building the profile")?;
        let svg = std::fs::File::create(&self.path)
            .with_context(|| format!("creating {}", self.path.display()))?;
        report
            .flamegraph(svg)
            .with_context(|| format!("writing {}", self.path.display()))?;
        let folded_path = self.path.with_extension("folded");
        let mut folded = std::io::BufWriter::new(
            std::fs::File::create(&folded_path)
                .with_context(|| format!("creating {}", folded_path.display()))?,
        );
        let mut total = 0;
        for (frames, count) in &report.data {
            // pprof keeps the innermost frame first.
            let names: Vec<String> = frames
                .frames
                .iter()
                .rev()
                .flat_map(|symbols| symbols.iter().rev().map(|s| s.name().replace(';', ":")))
                .collect();
            writeln!(
                folded,
                "{};{} {count}",
                frames.thread_name_or_id(),
                names.join(";")
            )?;
            total += count;
        }
        folded.flush()?;
        Ok(total)
    }
}
