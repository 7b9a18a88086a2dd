//! Run outputs: `results.csv` (one row per epoch, rewritten atomically), and the atomic write
//! every run output (checkpoints, plots, benchmark reports) goes through.

use super::trainer::EpochRecord;
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

pub fn write_results(dir: &Path, history: &[EpochRecord]) -> std::io::Result<()> {
    write_atomic(&dir.join("results.csv"), results_csv(history).as_bytes())
}

/// Writes `bytes` to `path` so that a reader sees the old file or the new one, never a part:
/// a temporary file in the same folder, synced, then renamed over `path`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}
