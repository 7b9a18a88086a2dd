//! `bench-step`'s printed reports: the launch census and the host's spans.

/// The host's ms per step in each span of `n` unsynced steps ([`crate::train::spans`]).
pub(super) fn print_spans(spans: &[(crate::train::spans::Span, f64, u64)], n: usize) {
    let per_step = |ms: f64| ms / n.max(1) as f64;
    let cells: Vec<String> = spans
        .iter()
        .map(|(s, ms, runs)| format!("{} {:.2} ({runs})", s.name(), per_step(*ms)))
        .collect();
    // Nested spans are inside their parent's time already.
    let sum: f64 = spans.iter().filter(|s| !s.0.nested()).map(|s| s.1).sum();
    println!(
        "host ms per unsynced step by span (runs): {}; sum {:.2}",
        cells.join(", "),
        per_step(sum)
    );
}

/// The launch census' tables (and its CSV where asked).
pub(super) fn print_census(
    r: &crate::train::census::CensusReport,
    host_ms: Option<&[f64]>,
    csv: Option<&std::path::Path>,
    trace: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    println!(
        "launch census, per step over {} steps (phase-synced):",
        r.steps
    );
    print!("{}", r.table(host_ms));
    println!("driver calls per step, most first:");
    for (name, n) in r.calls.iter().take(16) {
        println!("  {n:>9.1}  {name}");
    }
    println!("kernels by GPU time per step (phase, runs, ms):");
    for k in r.kernels.iter().take(30) {
        println!(
            "  {:<16} {:>7.1} {:>8.3}  {}",
            k.phase, k.runs, k.gpu_ms, k.name
        );
    }
    if let Some(path) = csv {
        std::fs::write(path, r.kernels_csv())
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
        println!("census per kernel: {}", path.display());
    }
    if let Some(path) = trace {
        std::fs::write(path, r.trace_csv())
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
        println!("census's last step, launch by launch: {}", path.display());
    }
    Ok(())
}
