//! A progress line while CUDA kernels compile on first use. CubeCL logs one line per kernel it
//! compiles (`[Compiling kernel] name`, its "basic" compilation log) to a file we choose
//! (`device::configure_kernel_cache`); a watcher thread counts them and redraws the line, so a
//! cold start shows "compiling kernels: 37/120 (12 s)" instead of a silent pause. The total is
//! the count of the last cold run of the same work, remembered in the per-user cache.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const MARK: &str = "[Compiling kernel]";

/// Where this process asks CubeCL to log compilations.
pub fn log_path() -> PathBuf {
    std::env::temp_dir().join(format!("burnpose-kernels-{}.log", std::process::id()))
}

/// Kernels compiled so far by this process.
pub fn compiled_so_far() -> usize {
    std::fs::read_to_string(log_path())
        .map(|s| s.matches(MARK).count())
        .unwrap_or(0)
}

fn memo_path(work: &str) -> Option<PathBuf> {
    let home = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    let safe: String = work
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    Some(home.join("burnpose").join(format!("kernels-{safe}.txt")))
}

/// Whether [`remember`] was called for `work` on this machine (or a run of it counted its
/// kernels): its kernels are then in the cache, unless the cache was emptied since.
pub fn seen_before(work: &str) -> bool {
    memo_path(work).is_some_and(|p| p.exists())
}

/// Remembers that `work` put `count` kernels in the cache (best effort: a memo that cannot be
/// written only means the work is done again next time).
pub fn remember(work: &str, count: usize) {
    if let Some(p) = memo_path(work) {
        let _ = std::fs::create_dir_all(p.parent().unwrap());
        let _ = std::fs::write(p, count.to_string());
    }
}

/// Counts kernels compiled while it lives and keeps a progress line on stderr.
pub struct CompileProgress {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
    start_count: usize,
    work: String,
}

impl CompileProgress {
    /// Starts watching; `work` names what is being run (e.g. "fit b4 640 pose n"), to remember
    /// how many kernels it needed.
    pub fn start(work: &str) -> Self {
        let expected = memo_path(work)
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|s| s.trim().parse::<usize>().ok());
        let stop = Arc::new(AtomicBool::new(false));
        let start_count = compiled_so_far();
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let started = Instant::now();
            let mut shown = 0;
            while !flag.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(250));
                let n = compiled_so_far() - start_count;
                if n != shown {
                    shown = n;
                    // A remembered total from other work may be too small (new kernels since):
                    // then only the count is shown, never "44/6".
                    let total = expected
                        .filter(|&e| n <= e)
                        .map(|e| format!("/{e}"))
                        .unwrap_or_default();
                    eprint!(
                        "\rcompiling kernels: {n}{total} ({:.0} s)",
                        started.elapsed().as_secs_f64()
                    );
                    let _ = std::io::stderr().flush();
                }
            }
            if shown > 0 {
                eprintln!();
            }
        });
        Self {
            stop,
            handle: Some(handle),
            start_count,
            work: work.to_string(),
        }
    }

    /// Stops the line and returns how many kernels were compiled while watching; a cold run's
    /// count is remembered as the next run's total.
    pub fn finish(mut self) -> usize {
        self.stop_thread();
        let n = compiled_so_far() - self.start_count;
        if n > 0
            && let Some(p) = memo_path(&self.work)
        {
            let _ = std::fs::create_dir_all(p.parent().unwrap());
            let _ = std::fs::write(p, n.to_string());
        }
        n
    }

    fn stop_thread(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for CompileProgress {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_compilation_lines_of_this_process() {
        let path = log_path();
        std::fs::write(&path, format!("{MARK} a\n{MARK} b\nother line\n")).unwrap();
        assert_eq!(compiled_so_far(), 2);
        let watch = CompileProgress {
            stop: Arc::new(AtomicBool::new(false)),
            handle: None,
            start_count: compiled_so_far(),
            // `finish` is not called, so no total is remembered in the user cache.
            work: "unit-test".into(),
        };
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        writeln!(f, "{MARK} c").unwrap();
        assert_eq!(compiled_so_far() - watch.start_count, 1);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(compiled_so_far(), 0);
    }
}
