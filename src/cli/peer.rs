//! The peer's report (`benches/peer/ultralytics_pose.py`, e.g. Ultralytics YOLO26n-pose on the
//! same images), read by `burnpose bench --peer FILE` to put it beside the two burnpose arms.

use anyhow::Context;
use serde::Deserialize;
use std::path::Path;

#[derive(Clone, Debug, Deserialize)]
pub struct PeerReport {
    /// Who produced it ("ultralytics").
    pub tool: String,
    pub version: Option<String>,
    pub fit_s: f64,
    /// Whole process seconds, added by `benches/peer/run.sh`.
    pub process_s: Option<f64>,
    /// Every training step, device-synchronised at both ends.
    pub step_ms: Vec<f64>,
    /// PyTorch's in-step peaks (`max_memory_allocated` / `max_memory_reserved`).
    pub peak_allocated_mib: f64,
    pub peak_reserved_mib: f64,
}

impl PeerReport {
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let r: Self = serde_json::from_str(&text).with_context(|| {
            format!(
                "parsing {}: expected the JSON of benches/peer/ultralytics_pose.py (tool, fit_s, step_ms, peak_allocated_mib, peak_reserved_mib)",
                path.display()
            )
        })?;
        anyhow::ensure!(
            r.fit_s.is_finite() && r.fit_s > 0.0,
            "{}: fit_s must be a positive number of seconds, got {}",
            path.display(),
            r.fit_s
        );
        Ok(r)
    }

    /// "ultralytics 8.4.190", or the tool alone.
    pub fn name(&self) -> String {
        match &self.version {
            Some(v) => format!("{} {v}", self.tool),
            None => self.tool.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_text(text: &str) -> anyhow::Result<PeerReport> {
        let path = std::env::temp_dir().join(format!(
            "burnpose-peer-{}-{}.json",
            std::process::id(),
            text.len()
        ));
        std::fs::write(&path, text).unwrap();
        let r = PeerReport::load(&path);
        std::fs::remove_file(&path).unwrap();
        r
    }

    #[test]
    fn reads_the_peer_script_output() {
        let r = load_text(
            r#"{"tool": "ultralytics", "fit_s": 116.4, "step_ms": [150.0, 179.0],
                "peak_allocated_mib": 791.2, "peak_reserved_mib": 940.0, "box_map": 0.3,
                "pose_map": null, "process_s": 122.1}"#,
        )
        .unwrap();
        assert_eq!(r.name(), "ultralytics");
        assert_eq!(r.process_s, Some(122.1));
        assert_eq!(r.step_ms.len(), 2);
    }

    #[test]
    fn bad_reports_name_the_file_and_what_was_expected() {
        let e = format!("{:#}", load_text(r#"{"tool": "x"}"#).unwrap_err());
        assert!(e.contains("burnpose-peer-") && e.contains("fit_s"), "{e}");
        let e = format!(
            "{:#}",
            load_text(
                r#"{"tool": "x", "fit_s": -1, "step_ms": [], "peak_allocated_mib": 1, "peak_reserved_mib": 1}"#
            )
            .unwrap_err()
        );
        assert!(e.contains("positive"), "{e}");
    }
}
