//! Random affine (Ultralytics `RandomPerspective` without perspective/shear): the warp of the
//! image with bilinear sampling on a gray border, and of its labels with the candidate filter.

use super::letterbox::PAD;
use super::{Instance, Sample};
use image::RgbImage;

/// `x' = m[0]·x + m[1]·y + m[2]`, `y' = m[3]·x + m[4]·y + m[5]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Affine(pub [f32; 6]);

impl Affine {
    /// `T · R(degrees, scale) · C`: moves `centre` to the origin, rotates and scales about it
    /// (OpenCV's `getRotationMatrix2D` convention), then moves the origin to `to`.
    pub fn new(centre: [f32; 2], degrees: f32, scale: f32, to: [f32; 2]) -> Self {
        let (sin, cos) = degrees.to_radians().sin_cos();
        let (a, b) = (scale * cos, scale * sin);
        Self([
            a,
            b,
            to[0] - a * centre[0] - b * centre[1],
            -b,
            a,
            to[1] + b * centre[0] - a * centre[1],
        ])
    }

    pub fn apply(&self, x: f32, y: f32) -> [f32; 2] {
        let m = &self.0;
        [m[0] * x + m[1] * y + m[2], m[3] * x + m[4] * y + m[5]]
    }

    fn inverse(&self) -> Self {
        let [a, b, c, d, e, f] = self.0;
        let det = a * e - b * d;
        let (ia, ib, id, ie) = (e / det, -b / det, -d / det, a / det);
        Self([ia, ib, -(ia * c + ib * f), id, ie, -(id * c + ie * f)])
    }
}

/// Warps `sample` into a `size × size` image; labels follow. Instances that become too small,
/// too thin or lose more than 90 % of their (scaled) area are dropped; keypoints that leave the
/// frame become unlabelled.
pub fn warp(sample: &Sample, m: Affine, scale: f32, size: u32) -> Sample {
    Sample {
        image: warp_image(&sample.image, m, size),
        instances: sample
            .instances
            .iter()
            .filter_map(|inst| warp_instance(inst, m, scale, size as f32))
            .collect(),
    }
}

fn warp_image(src: &RgbImage, m: Affine, size: u32) -> RgbImage {
    let inv = m.inverse();
    let (w, h) = (src.width() as i64, src.height() as i64);
    let raw = src.as_raw();
    let pixel = |x: i64, y: i64| -> [f32; 3] {
        if x < 0 || y < 0 || x >= w || y >= h {
            return [PAD as f32; 3];
        }
        let i = 3 * (y * w + x) as usize;
        [raw[i] as f32, raw[i + 1] as f32, raw[i + 2] as f32]
    };
    let mut out = vec![PAD; 3 * (size as usize).pow(2)];
    for (y, row) in out.chunks_exact_mut(3 * size as usize).enumerate() {
        for (x, px) in row.chunks_exact_mut(3).enumerate() {
            let [sx, sy] = inv.apply(x as f32, y as f32);
            let (x0, y0) = (fast_floor(sx), fast_floor(sy));
            let (fx, fy) = (sx - x0, sy - y0);
            let (x0, y0) = (x0 as i64, y0 as i64);
            // All four neighbours outside: the border value, exactly as the blend would give.
            if x0 < -1 || y0 < -1 || x0 >= w || y0 >= h {
                continue;
            }
            let (p00, p10, p01, p11) = if x0 >= 0 && y0 >= 0 && x0 + 1 < w && y0 + 1 < h {
                let i = 3 * (y0 * w + x0) as usize;
                let j = i + 3 * w as usize;
                let at = |k: usize| [raw[k] as f32, raw[k + 1] as f32, raw[k + 2] as f32];
                (at(i), at(i + 3), at(j), at(j + 3))
            } else {
                (
                    pixel(x0, y0),
                    pixel(x0 + 1, y0),
                    pixel(x0, y0 + 1),
                    pixel(x0 + 1, y0 + 1),
                )
            };
            for c in 0..3 {
                let top = p00[c] + (p10[c] - p00[c]) * fx;
                let bottom = p01[c] + (p11[c] - p01[c]) * fx;
                // + 0.5 and truncate: rounding without a libm call (x86-64 has no SSE4.1 round).
                px[c] = ((top + (bottom - top) * fy).clamp(0.0, 255.0) + 0.5) as u8;
            }
        }
    }
    RgbImage::from_raw(size, size, out).expect("size × size × 3 bytes")
}

/// `x.floor()` without a libm call; exact for the coordinate range of an image.
fn fast_floor(x: f32) -> f32 {
    let t = x as i32 as f32;
    if t > x { t - 1.0 } else { t }
}

fn warp_instance(inst: &Instance, m: Affine, scale: f32, size: f32) -> Option<Instance> {
    let [x1, y1, x2, y2] = inst.bbox;
    let corners = [[x1, y1], [x2, y1], [x1, y2], [x2, y2]].map(|[x, y]| m.apply(x, y));
    let min = |i: usize| corners.iter().map(|c| c[i]).fold(f32::INFINITY, f32::min);
    let max = |i: usize| {
        corners
            .iter()
            .map(|c| c[i])
            .fold(f32::NEG_INFINITY, f32::max)
    };
    let bbox = [
        min(0).clamp(0.0, size),
        min(1).clamp(0.0, size),
        max(0).clamp(0.0, size),
        max(1).clamp(0.0, size),
    ];
    let (w1, h1) = ((x2 - x1) * scale, (y2 - y1) * scale);
    let (w2, h2) = (bbox[2] - bbox[0], bbox[3] - bbox[1]);
    let aspect = (w2 / (h2 + 1e-16)).max(h2 / (w2 + 1e-16));
    if !(w2 > 2.0 && h2 > 2.0 && w2 * h2 / (w1 * h1 + 1e-16) > 0.1 && aspect < 100.0) {
        return None;
    }
    let keypoints = inst.moved_keypoints(|x, y| m.apply(x, y), size, size);
    Some(Instance {
        class: inst.class,
        bbox,
        keypoints,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::Rgb;

    fn person(bbox: [f32; 4], kpts: Vec<[f32; 3]>) -> Instance {
        Instance {
            class: 0,
            bbox,
            keypoints: kpts,
        }
    }

    #[test]
    fn identity_keeps_image_and_labels() {
        let image = RgbImage::from_fn(8, 8, |x, y| Rgb([x as u8 * 10, y as u8 * 10, 7]));
        let s = Sample {
            image: image.clone(),
            instances: vec![person([1.0, 1.0, 6.0, 7.0], vec![[2.0, 3.0, 2.0]])],
        };
        let m = Affine::new([4.0, 4.0], 0.0, 1.0, [4.0, 4.0]);
        let out = warp(&s, m, 1.0, 8);
        assert_eq!(out.image, image);
        assert_eq!(out.instances, s.instances);
    }

    #[test]
    fn scale_and_shift_move_labels_and_drop_lost_ones() {
        let s = Sample {
            image: RgbImage::from_pixel(100, 100, Rgb([0, 0, 0])),
            instances: vec![
                person(
                    [40.0, 40.0, 60.0, 60.0],
                    vec![[50.0, 50.0, 2.0], [0.0, 90.0, 1.0]],
                ),
                person([0.0, 0.0, 4.0, 4.0], vec![[1.0, 1.0, 2.0], [0.0, 0.0, 0.0]]),
            ],
        };
        // Centre to the origin, ×2, then to (50, 50): (x, y) → 2(x − 50) + 50.
        let m = Affine::new([50.0, 50.0], 0.0, 2.0, [50.0, 50.0]);
        let out = warp(&s, m, 2.0, 100);
        assert_eq!(out.instances.len(), 1, "the corner box leaves the frame");
        let inst = &out.instances[0];
        assert_eq!(inst.bbox, [30.0, 30.0, 70.0, 70.0]);
        assert_eq!(inst.keypoints[0], [50.0, 50.0, 2.0]);
        assert_eq!(
            inst.keypoints[1],
            [0.0, 0.0, 0.0],
            "out of frame → unlabelled"
        );
        assert_eq!(*out.image.get_pixel(50, 50), Rgb([0, 0, 0]));
        let zoomed_out = warp(
            &s,
            Affine::new([50.0, 50.0], 0.0, 0.5, [50.0, 50.0]),
            0.5,
            100,
        );
        assert_eq!(
            *zoomed_out.image.get_pixel(0, 0),
            Rgb([PAD; 3]),
            "border is gray"
        );
        assert_eq!(*zoomed_out.image.get_pixel(50, 50), Rgb([0, 0, 0]));
    }

    #[test]
    fn rotation_by_90_degrees_matches_opencv_convention() {
        // getRotationMatrix2D(angle = 90) maps (1, 0) to (0, −1): counter-clockwise on screen.
        let m = Affine::new([0.0, 0.0], 90.0, 1.0, [0.0, 0.0]);
        let [x, y] = m.apply(1.0, 0.0);
        assert!(x.abs() < 1e-6 && (y + 1.0).abs() < 1e-6, "{x} {y}");
        let back = m.inverse().apply(x, y);
        assert!((back[0] - 1.0).abs() < 1e-6 && back[1].abs() < 1e-6);
    }
}
