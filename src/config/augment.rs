//! The `[augment]` section: training augmentation's settings (applied by `data::augment`).

use serde::{Deserialize, Serialize};

/// Augmentation settings; defaults are Ultralytics' (`ultralytics/cfg/default.yaml`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Augment {
    /// Probability of a 2×2 mosaic (default 1.0).
    pub mosaic: f64,
    /// Rotation range, ± degrees (default 0.0).
    pub degrees: f64,
    /// Translation range, ± fraction of the image size (default 0.1).
    pub translate: f64,
    /// Scale range, 1 ± scale (default 0.5).
    pub scale: f64,
    /// Probability of a horizontal flip (default 0.5).
    pub fliplr: f64,
    /// HSV gain for hue, a fraction of the hue circle (default 0.015).
    pub hsv_h: f64,
    /// HSV gain for saturation, a fraction (default 0.7).
    pub hsv_s: f64,
    /// HSV gain for value, a fraction (default 0.4).
    pub hsv_v: f64,
    /// Apply the HSV jitter to the uploaded batch on its device (our CUDA kernel) instead of in the
    /// loader; the gains are drawn in the loader either way, so batches stay deterministic
    /// (default false).
    pub hsv_device: bool,
}

impl Default for Augment {
    fn default() -> Self {
        Self {
            mosaic: 1.0,
            degrees: 0.0,
            translate: 0.1,
            scale: 0.5,
            fliplr: 0.5,
            hsv_h: 0.015,
            hsv_s: 0.7,
            hsv_v: 0.4,
            hsv_device: false,
        }
    }
}

impl Augment {
    /// No augmentation at all: every sample is the letterboxed image.
    pub fn none() -> Self {
        Self {
            mosaic: 0.0,
            degrees: 0.0,
            translate: 0.0,
            scale: 0.0,
            fliplr: 0.0,
            hsv_h: 0.0,
            hsv_s: 0.0,
            hsv_v: 0.0,
            hsv_device: false,
        }
    }

    /// The values that must lie in a range, checked at config load: (key, value, ok).
    pub fn checks(&self) -> [(&'static str, f64, bool); 8] {
        let p = |v: f64| (0.0..=1.0).contains(&v);
        [
            ("augment.mosaic", self.mosaic, p(self.mosaic)),
            ("augment.fliplr", self.fliplr, p(self.fliplr)),
            (
                "augment.degrees",
                self.degrees,
                (0.0..=180.0).contains(&self.degrees),
            ),
            (
                "augment.translate",
                self.translate,
                (0.0..0.5).contains(&self.translate),
            ),
            (
                "augment.scale",
                self.scale,
                (0.0..1.0).contains(&self.scale),
            ),
            ("augment.hsv_h", self.hsv_h, p(self.hsv_h)),
            ("augment.hsv_s", self.hsv_s, p(self.hsv_s)),
            ("augment.hsv_v", self.hsv_v, p(self.hsv_v)),
        ]
    }
}
