//! Run outputs: `results.csv` (one row per epoch, rewritten atomically), and the atomic write
//! every run output (checkpoints, plots, benchmark reports) goes through.

use super::trainer::{EpochRecord, PHASES, StepTiming};
use crate::loss::TERMS;
use std::io::Write;
use std::path::Path;

pub fn results_csv(history: &[EpochRecord]) -> String {
    let mut s = String::from("epoch");
    for t in TERMS {
        s += &format!(",train/{t}");
    }
    s += ",lr,metrics/box_mAP50,metrics/box_mAP50-95,metrics/pose_mAP50,metrics/pose_mAP50-95,seconds,data_wait_s\n";
    for r in history {
        s += &format!("{}", r.epoch + 1);
        for v in r.train_loss {
            s += &format!(",{v:.6}");
        }
        s += &format!(
            ",{:.6e},{:.5},{:.5},{:.5},{:.5},{:.2},{:.2}\n",
            r.lr, r.box_map50, r.box_map, r.pose_map50, r.pose_map, r.seconds, r.data_wait
        );
    }
    s
}

/// `steps.csv`: one row per timed step — iteration, whether it ended with an optimizer step,
/// step ms, the device-clock step ms (`fit --events`; empty otherwise), the memory pool's MiB in
/// use and reserved after it, and each phase's ms when phases are timed. `first_ni` is the
/// iteration of the first timed step.
pub fn steps_csv(t: &StepTiming, first_ni: usize) -> String {
    let mib = |v: &[u64], i: usize| {
        v.get(i)
            .map_or(String::new(), |b| format!("{:.1}", super::timing::mib(*b)))
    };
    let mut s = String::from("iteration,optimizer_step,step_ms,event_ms,in_use_mib,reserved_mib");
    if !t.phase_ms.is_empty() {
        for p in PHASES {
            s += &format!(",{}_ms", p.replace(' ', "_"));
        }
    }
    s.push('\n');
    for (i, ms) in t.step_ms.iter().enumerate() {
        let stepped = t
            .optimizer_step
            .get(i)
            .map_or(String::new(), |b| (*b as u8).to_string());
        let event = t
            .event_ms
            .get(i)
            .filter(|v| !v.is_nan())
            .map_or(String::new(), |v| format!("{v:.3}"));
        s += &format!(
            "{},{stepped},{ms:.3},{event},{},{}",
            first_ni + i,
            mib(&t.in_use, i),
            mib(&t.reserved, i)
        );
        if let Some(p) = t.phase_ms.get(i) {
            for v in p {
                s += &format!(",{v:.3}");
            }
        }
        s.push('\n');
    }
    s
}

pub fn write_results(dir: &Path, history: &[EpochRecord]) -> std::io::Result<()> {
    write_atomic(&dir.join("results.csv"), results_csv(history).as_bytes())
}

/// Writes `bytes` to `path` so that a reader sees the old file or the new one, never a part:
/// a temporary file in the same folder, synced, then renamed over `path`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    replace_atomic(path, |tmp| {
        let mut f = std::fs::File::create(tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })
}

/// Replaces `path` with the file `make` writes at a temporary path beside it, by a rename: a
/// reader sees the old file or the new one, never a part. If `make` or the rename fails (a full
/// disk), the temporary file is removed and `path` keeps its earlier contents.
pub fn replace_atomic(
    path: &Path,
    make: impl FnOnce(&Path) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let done = make(&tmp).and_then(|()| std::fs::rename(&tmp, path));
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done
}
