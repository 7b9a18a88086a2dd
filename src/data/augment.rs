//! Training augmentation in Ultralytics' order (yolo_spec §5.2): mosaic (or letterbox), random
//! affine, HSV, horizontal flip. Every draw comes from the sample's own RNG, so a sample depends
//! only on (seed, epoch, position), never on which thread made it or when.

use super::affine::{Affine, warp};
use super::hsv::HsvTables;
use super::letterbox::letterbox;
use super::mosaic::mosaic4;
use super::source::Source;
use super::{DataError, Sample};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
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

/// Ultralytics closes mosaic when `epoch == epochs − close_mosaic`, so a run shorter than
/// `close_mosaic` epochs keeps mosaic on throughout; this reproduces that.
pub fn mosaic_active(epoch: usize, epochs: usize, close_mosaic: usize) -> bool {
    !(close_mosaic > 0 && epochs >= close_mosaic && epoch >= epochs - close_mosaic)
}

/// The RNG of the sample at `position` of `epoch`'s order.
pub fn sample_rng(seed: u64, epoch: usize, position: usize) -> StdRng {
    let mix = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add((epoch as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9))
        .wrapping_add((position as u64).wrapping_mul(0x94D0_49BB_1331_11EB));
    StdRng::seed_from_u64(mix)
}

/// Training sample for image `i` of `source`: square, `source.size` pixels, labels in them; and
/// the HSV gains left for the device to apply when `aug.hsv_device` is set.
pub fn train_sample(
    source: &Source,
    aug: &Augment,
    flip_idx: Option<&[usize]>,
    i: usize,
    mosaic: bool,
    rng: &mut StdRng,
) -> Result<(Sample, Option<[f32; 3]>), DataError> {
    let s = source.size;
    let sf = s as f32;
    let use_mosaic = mosaic && aug.mosaic > 0.0 && rng.random::<f64>() < aug.mosaic;
    let (base, centre) = if use_mosaic {
        let partners: [usize; 3] = std::array::from_fn(|_| rng.random_range(0..source.len()));
        let parts = [
            source.prepared(i)?,
            source.prepared(partners[0])?,
            source.prepared(partners[1])?,
            source.prepared(partners[2])?,
        ];
        let xc = rng.random_range(s / 2..s + s / 2);
        let yc = rng.random_range(s / 2..s + s / 2);
        let refs = [
            &parts[0].sample,
            &parts[1].sample,
            &parts[2].sample,
            &parts[3].sample,
        ];
        (mosaic4(refs, s, [xc, yc]), sf)
    } else {
        let (boxed, _, _) = letterbox(source.prepared(i)?.sample.clone(), s);
        (boxed, sf / 2.0)
    };
    let mut out = affine(base, aug, centre, sf, rng);
    let mut deferred = None;
    if aug.hsv_h > 0.0 || aug.hsv_s > 0.0 || aug.hsv_v > 0.0 {
        let gains = [aug.hsv_h, aug.hsv_s, aug.hsv_v];
        let r = gains.map(|g| (rng.random_range(-1.0..1.0) * g) as f32);
        if aug.hsv_device {
            deferred = Some(r);
        } else {
            HsvTables::new(r).apply(&mut out.image);
        }
    }
    if let Some(flip_idx) = flip_idx
        && aug.fliplr > 0.0
        && rng.random::<f64>() < aug.fliplr
    {
        flip_horizontal(&mut out, flip_idx);
    }
    Ok((out, deferred))
}

fn affine(base: Sample, aug: &Augment, centre: f32, size: f32, rng: &mut StdRng) -> Sample {
    if aug.degrees == 0.0 && aug.scale == 0.0 && aug.translate == 0.0 && centre == size / 2.0 {
        return base;
    }
    let deg = if aug.degrees > 0.0 {
        rng.random_range(-aug.degrees..=aug.degrees) as f32
    } else {
        0.0
    };
    let scale = if aug.scale > 0.0 {
        rng.random_range(1.0 - aug.scale..=1.0 + aug.scale) as f32
    } else {
        1.0
    };
    let t = aug.translate;
    let mut shift = || {
        if t > 0.0 {
            rng.random_range(0.5 - t..=0.5 + t) as f32 * size
        } else {
            size / 2.0
        }
    };
    let to = [shift(), shift()];
    let m = Affine::new([centre, centre], deg, scale, to);
    warp(&base, m, scale, size as u32)
}

/// Mirrors image and labels left–right and swaps left/right keypoints by `flip_idx`.
pub fn flip_horizontal(sample: &mut Sample, flip_idx: &[usize]) {
    image::imageops::flip_horizontal_in_place(&mut sample.image);
    let w = sample.image.width() as f32;
    for inst in &mut sample.instances {
        let [x1, y1, x2, y2] = inst.bbox;
        inst.bbox = [w - x2, y1, w - x1, y2];
        let mirrored = inst.mapped_keypoints(|x, y| [w - x, y]);
        inst.keypoints = flip_idx.iter().map(|&j| mirrored[j]).collect();
    }
}

#[cfg(test)]
mod tests;
