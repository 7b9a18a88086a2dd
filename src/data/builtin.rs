//! A dataset that needs no files: stick figures with the 17 COCO keypoints, drawn
//! procedurally and deterministically from `(seed, index)`.

use super::{Instance, Sample};
use image::{Rgb, RgbImage};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// COCO skeleton edges drawn as limbs (keypoint index pairs).
const LIMBS: [(usize, usize); 14] = [
    (5, 6),
    (5, 7),
    (7, 9),
    (6, 8),
    (8, 10),
    (5, 11),
    (6, 12),
    (11, 12),
    (11, 13),
    (13, 15),
    (12, 14),
    (14, 16),
    (0, 5),
    (0, 6),
];

/// Procedural pose dataset of `len` images of `size × size` pixels.
#[derive(Clone, Debug)]
pub struct BuiltinDataset {
    pub len: usize,
    pub size: u32,
    pub seed: u64,
}

/// Mixed into the seed for the validation images (a stream disjoint from training's).
const VAL_SEED_MIX: u64 = 0x0005_eed0_f7a1;

impl BuiltinDataset {
    pub fn new(len: usize, size: u32, seed: u64) -> Self {
        Self { len, size, seed }
    }

    /// The train and validation splits a config trains on (`data.train_images`,
    /// `data.val_images`, `data.imgsz`, `train.seed`).
    pub fn splits(cfg: &crate::config::Config) -> (Self, Self) {
        let (d, size, seed) = (&cfg.data, cfg.data.imgsz as u32, cfg.train.seed);
        (
            Self::new(d.train_images, size, seed),
            Self::new(d.val_images, size, seed ^ VAL_SEED_MIX),
        )
    }

    /// Image `index`; the same `(seed, index)` always gives the same pixels and labels.
    pub fn get(&self, index: usize) -> Sample {
        assert!(index < self.len, "index {index} out of {}", self.len);
        let mut rng =
            StdRng::seed_from_u64(self.seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let s = self.size;
        let base = [
            rng.random_range(40..200u8),
            rng.random_range(40..200),
            rng.random_range(40..200),
        ];
        let mut image = RgbImage::from_fn(s, s, |x, y| {
            let shade = ((x + y) * 32 / (2 * s)) as u8;
            Rgb(base.map(|c| c.saturating_add(shade)))
        });
        let people = rng.random_range(1..=3);
        let instances = (0..people)
            .map(|_| draw_person(&mut image, &mut rng))
            .collect();
        Sample { image, instances }
    }
}

/// Draws one figure and returns its label. Keypoints outside the image are unlabelled (v = 0).
fn draw_person(image: &mut RgbImage, rng: &mut StdRng) -> Instance {
    let s = image.width() as f32;
    let h = rng.random_range(0.25..0.6) * s; // figure height
    let cx = rng.random_range(0.15..0.85) * s;
    let top = rng.random_range(-0.05..0.5) * s;
    let u = h / 8.0;
    let sway = |rng: &mut StdRng| rng.random_range(-1.2..1.2) * u;
    let mut k = [[0.0f32; 2]; 17];
    k[0] = [cx, top + 0.6 * u]; // nose
    k[1] = [cx - 0.25 * u, top + 0.4 * u];
    k[2] = [cx + 0.25 * u, top + 0.4 * u];
    k[3] = [cx - 0.5 * u, top + 0.5 * u];
    k[4] = [cx + 0.5 * u, top + 0.5 * u];
    k[5] = [cx - 1.0 * u, top + 1.6 * u]; // shoulders
    k[6] = [cx + 1.0 * u, top + 1.6 * u];
    k[7] = [k[5][0] - 0.4 * u + sway(rng), top + 3.0 * u];
    k[8] = [k[6][0] + 0.4 * u + sway(rng), top + 3.0 * u];
    k[9] = [k[7][0] + sway(rng), top + 4.2 * u + sway(rng)];
    k[10] = [k[8][0] + sway(rng), top + 4.2 * u + sway(rng)];
    k[11] = [cx - 0.6 * u, top + 4.4 * u]; // hips
    k[12] = [cx + 0.6 * u, top + 4.4 * u];
    k[13] = [k[11][0] + sway(rng), top + 6.1 * u];
    k[14] = [k[12][0] + sway(rng), top + 6.1 * u];
    k[15] = [k[13][0] + sway(rng), top + 7.8 * u];
    k[16] = [k[14][0] + sway(rng), top + 7.8 * u];
    let color = Rgb([
        rng.random_range(0..256u32) as u8,
        rng.random_range(0..256u32) as u8,
        rng.random_range(0..256u32) as u8,
    ]);
    let width = (u * 0.35).max(1.0);
    for (a, b) in LIMBS {
        line(image, k[a], k[b], width, color);
    }
    disc(image, k[0], 0.7 * u, color);
    let inside = |p: [f32; 2]| p[0] >= 0.0 && p[1] >= 0.0 && p[0] < s && p[1] < s;
    let keypoints: Vec<[f32; 3]> = k
        .iter()
        .map(|&p| {
            if inside(p) {
                [p[0], p[1], 2.0]
            } else {
                [0.0, 0.0, 0.0]
            }
        })
        .collect();
    let (mut x1, mut y1, mut x2, mut y2) = (f32::MAX, f32::MAX, f32::MIN, f32::MIN);
    for p in &k {
        x1 = x1.min(p[0]);
        y1 = y1.min(p[1]);
        x2 = x2.max(p[0]);
        y2 = y2.max(p[1]);
    }
    let pad = 0.5 * u;
    let clip = |v: f32| v.clamp(0.0, s);
    Instance {
        class: 0,
        bbox: [
            clip(x1 - pad),
            clip(y1 - 0.8 * u),
            clip(x2 + pad),
            clip(y2 + 0.3 * u),
        ],
        keypoints,
    }
}

fn line(image: &mut RgbImage, a: [f32; 2], b: [f32; 2], width: f32, color: Rgb<u8>) {
    let steps = ((b[0] - a[0]).hypot(b[1] - a[1]) / (width * 0.5))
        .ceil()
        .max(1.0) as usize;
    for i in 0..=steps {
        let t = i as f32 / steps as f32;
        disc(
            image,
            [a[0] + t * (b[0] - a[0]), a[1] + t * (b[1] - a[1])],
            width * 0.5,
            color,
        );
    }
}

fn disc(image: &mut RgbImage, c: [f32; 2], r: f32, color: Rgb<u8>) {
    let (w, h) = (image.width() as i64, image.height() as i64);
    let (x0, x1) = (
        ((c[0] - r).floor() as i64).max(0),
        ((c[0] + r).ceil() as i64).min(w - 1),
    );
    let (y0, y1) = (
        ((c[1] - r).floor() as i64).max(0),
        ((c[1] + r).ceil() as i64).min(h - 1),
    );
    for y in y0..=y1 {
        for x in x0..=x1 {
            let (dx, dy) = (x as f32 + 0.5 - c[0], y as f32 + 0.5 - c[1]);
            if dx * dx + dy * dy <= r * r {
                image.put_pixel(x as u32, y as u32, color);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_labelled() {
        let ds = BuiltinDataset::new(8, 128, 7);
        let (a, b) = (ds.get(3), ds.get(3));
        assert_eq!(a.image.as_raw(), b.image.as_raw());
        assert_eq!(a.instances, b.instances);
        assert_ne!(ds.get(4).image.as_raw(), a.image.as_raw());
        assert_ne!(
            BuiltinDataset::new(8, 128, 8).get(3).image.as_raw(),
            a.image.as_raw()
        );
        for inst in &a.instances {
            assert_eq!(inst.keypoints.len(), 17);
            let [x1, y1, x2, y2] = inst.bbox;
            assert!(0.0 <= x1 && x1 < x2 && x2 <= 128.0 && 0.0 <= y1 && y1 < y2 && y2 <= 128.0);
            for k in inst.keypoints.iter().filter(|k| k[2] > 0.0) {
                assert!(
                    k[0] >= x1 && k[0] <= x2 && k[1] >= y1 && k[1] <= y2,
                    "{k:?} outside {:?}",
                    inst.bbox
                );
            }
        }
    }

    #[test]
    fn figures_are_drawn_at_their_keypoints() {
        let ds = BuiltinDataset::new(4, 96, 1);
        let sample = ds.get(0);
        let bg = *sample.image.get_pixel(0, 0);
        // The nose sits in the head disc, so where labelled it differs from the corner background
        // unless the figure covers the corner too.
        let inst = &sample.instances[0];
        let nose = inst.keypoints[0];
        if nose[2] > 0.0 {
            let px = *sample.image.get_pixel(nose[0] as u32, nose[1] as u32);
            assert_ne!(px, bg);
        }
    }
}
