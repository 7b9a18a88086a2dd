//! Run outputs: `results.csv` (one row per epoch, rewritten atomically).

use super::trainer::EpochRecord;
use crate::loss::TERMS;
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
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join("results.csv.tmp");
    std::fs::write(&tmp, results_csv(history))?;
    std::fs::rename(tmp, dir.join("results.csv"))
}
