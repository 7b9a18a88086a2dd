//! HSV jitter (yolo_spec §5.2 step 7) in OpenCV's 8-bit HSV (H in [0, 180)): hue shifted by
//! `180·r_h` modulo 180, saturation and value scaled by `1 + r_s`, `1 + r_v`, truncated to u8
//! through lookup tables as Ultralytics does. The colour conversion follows OpenCV's formulas in
//! floating point, so single pixels may differ from OpenCV by one level.

use image::RgbImage;

/// Lookup tables for one draw of the gains `r = [r_h, r_s, r_v]`.
pub struct HsvTables {
    hue: [u8; 256],
    sat: [u8; 256],
    val: [u8; 256],
}

impl HsvTables {
    pub fn new(r: [f32; 3]) -> Self {
        let lut = |f: &dyn Fn(f32) -> f32| std::array::from_fn(|x| f(x as f32) as u8);
        Self {
            hue: lut(&|x| (x + 180.0 * r[0]).rem_euclid(180.0)),
            sat: lut(&|x| (x * (1.0 + r[1])).clamp(0.0, 255.0)),
            val: lut(&|x| (x * (1.0 + r[2])).clamp(0.0, 255.0)),
        }
    }

    pub fn apply(&self, image: &mut RgbImage) {
        for p in image.chunks_exact_mut(3) {
            let [h, s, v] = rgb_to_hsv([p[0], p[1], p[2]]);
            p.copy_from_slice(&hsv_to_rgb([
                self.hue[h as usize],
                self.sat[s as usize],
                self.val[v as usize],
            ]));
        }
    }
}

/// `1 / n` for n in 0..256 (0 for 0): the conversion multiplies instead of dividing.
static RECIPROCAL: std::sync::LazyLock<[f32; 256]> =
    std::sync::LazyLock::new(|| std::array::from_fn(|n| if n == 0 { 0.0 } else { 1.0 / n as f32 }));

/// OpenCV `COLOR_RGB2HSV` for 8-bit images.
pub fn rgb_to_hsv([r, g, b]: [u8; 3]) -> [u8; 3] {
    let (max, min) = (r.max(g).max(b), r.min(g).min(b));
    let (inv_v, inv_diff) = (RECIPROCAL[max as usize], RECIPROCAL[(max - min) as usize]);
    let (r, g, b) = (r as f32, g as f32, b as f32);
    let v = max as f32;
    let diff = v - min as f32;
    let s = 255.0 * diff * inv_v;
    let mut h = if diff == 0.0 {
        0.0
    } else if v == r {
        60.0 * (g - b) * inv_diff
    } else if v == g {
        120.0 + 60.0 * (b - r) * inv_diff
    } else {
        240.0 + 60.0 * (r - g) * inv_diff
    };
    if h < 0.0 {
        h += 360.0
    }
    // + 0.5 and truncate: rounding of non-negative values without a libm call.
    let h = (h * 0.5 + 0.5) as u32 % 180;
    [h as u8, (s + 0.5) as u8, v as u8]
}

/// OpenCV `COLOR_HSV2RGB` for 8-bit images.
pub fn hsv_to_rgb([h, s, v]: [u8; 3]) -> [u8; 3] {
    let (h, s, v) = (h as f32 * (1.0 / 30.0), s as f32 * (1.0 / 255.0), v as f32);
    let sector = h as u32 as f32; // h >= 0: truncation is floor
    let f = h - sector;
    let (p, q, t) = (v * (1.0 - s), v * (1.0 - s * f), v * (1.0 - s * (1.0 - f)));
    let (r, g, b) = match sector as u32 % 6 {
        0 => (v, t, p),
        1 => (q, v, p),
        2 => (p, v, t),
        3 => (p, q, v),
        4 => (t, p, v),
        _ => (v, p, q),
    };
    [r, g, b].map(|c| (c.clamp(0.0, 255.0) + 0.5) as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primaries_match_opencv() {
        assert_eq!(rgb_to_hsv([255, 0, 0]), [0, 255, 255]);
        assert_eq!(rgb_to_hsv([0, 255, 0]), [60, 255, 255]);
        assert_eq!(rgb_to_hsv([0, 0, 255]), [120, 255, 255]);
        assert_eq!(rgb_to_hsv([128, 128, 128]), [0, 0, 128]);
        // By hand: V = 200, S = 255·190/200 = 242, H = (120 + 60·90/190) / 2 = 74.
        assert_eq!(rgb_to_hsv([10, 200, 100]), [74, 242, 200]);
    }

    #[test]
    fn round_trip_is_within_one_level() {
        for r in (0..=255).step_by(15) {
            for g in (0..=255).step_by(17) {
                for b in (0..=255).step_by(51) {
                    let back = hsv_to_rgb(rgb_to_hsv([r as u8, g as u8, b as u8]));
                    for (x, y) in [r, g, b].iter().zip(back) {
                        // H has 2° steps; a saturated colour can move by a few levels.
                        assert!((*x - y as i32).abs() <= 4, "{r} {g} {b} -> {back:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn zero_gains_are_identity_tables_and_value_gain_darkens() {
        let t = HsvTables::new([0.0, 0.0, 0.0]);
        assert!((0..256).all(|x| t.hue[x] == (x % 180) as u8 && t.val[x] == x as u8));
        let mut img = RgbImage::from_pixel(2, 2, image::Rgb([200, 100, 50]));
        HsvTables::new([0.0, 0.0, -0.5]).apply(&mut img);
        assert_eq!(img.get_pixel(0, 0).0, [100, 50, 25]);
    }
}
