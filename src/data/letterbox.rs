//! Resizing an image into the network input as Ultralytics does: long side to `size` (aspect
//! kept, OpenCV's bilinear, `data::resize`), centred on a gray (114) canvas, square, only as large
//! as needed (predict) or of a validation batch's shape; labels follow.

use super::{Instance, Sample};
use image::{Rgb, RgbImage};

pub const PAD: u8 = 114;

/// The letterboxed sample and the transform `x' = x·scale + pad`.
pub fn letterbox(sample: Sample, size: u32) -> (Sample, f32, [f32; 2]) {
    place(sample, size, None)
}

/// As [`letterbox`], on a canvas only as large as the resized image rounded up to a multiple of
/// `stride`: how Ultralytics' predict letterboxes a batch whose images share one shape
/// (`LetterBox(auto=True)`, `rect`), e.g. a 640×360 video frame into 640×384 instead of 640×640.
pub fn letterbox_rect(sample: Sample, size: u32, stride: u32) -> (Sample, f32, [f32; 2]) {
    place(sample, size, Some(stride))
}

fn place(sample: Sample, size: u32, stride: Option<u32>) -> (Sample, f32, [f32; 2]) {
    let (resized, scale) = resize_long_side(sample, size);
    let (nw, nh) = resized.image.dimensions();
    let canvas = match stride {
        Some(s) => [nw.next_multiple_of(s), nh.next_multiple_of(s)],
        None => [size, size],
    };
    let (sample, pad) = pad_into(resized, canvas);
    (sample, scale, pad)
}

/// Resizes so the long side is `size` (aspect kept), sides rounded half to even as Python's
/// `round` in Ultralytics' `LetterBox`; labels follow.
pub fn resize_long_side(sample: Sample, size: u32) -> (Sample, f32) {
    let (w, h) = sample.image.dimensions();
    if w.max(h) == size {
        return (sample, 1.0);
    }
    let (nw, nh) = scaled(w, h, size as f64 / w.max(h) as f64);
    let (sample, _) = resize_to(sample, nw, nh);
    (sample, size as f32 / w.max(h) as f32)
}

/// `w × h` scaled by `r` as Ultralytics' `LetterBox` sizes it: each side `round(side · r)` in
/// double precision, half to even (Python's `round`), at least 1.
fn scaled(w: u32, h: u32, r: f64) -> (u32, u32) {
    let side = |v: u32| ((v as f64 * r).round_ties_even() as u32).max(1);
    (side(w), side(h))
}

/// Resizes as Ultralytics loads every image (`data/base.py::load_image`): long side to `size`,
/// each side `ceil(side · size / long side)` but at most `size`. Returns the sample with its
/// labels and the scale of each axis, `[new width / width, new height / height]`.
pub fn resize_for_loading(sample: Sample, size: u32) -> (Sample, [f32; 2]) {
    let (w, h) = sample.image.dimensions();
    let r = size as f64 / w.max(h) as f64;
    if r == 1.0 {
        return (sample, [1.0, 1.0]);
    }
    let side = |v: u32| ((v as f64 * r).ceil() as u32).clamp(1, size);
    resize_to(sample, side(w), side(h))
}

/// `sample` resized to `nw × nh` (OpenCV's bilinear), labels scaled per axis.
fn resize_to(sample: Sample, nw: u32, nh: u32) -> (Sample, [f32; 2]) {
    let (w, h) = sample.image.dimensions();
    let (sx, sy) = (nw as f32 / w as f32, nh as f32 / h as f32);
    let image = super::resize::linear(&sample.image, nw, nh);
    let instances = sample
        .instances
        .iter()
        .map(|i| Instance {
            class: i.class,
            bbox: [
                i.bbox[0] * sx,
                i.bbox[1] * sy,
                i.bbox[2] * sx,
                i.bbox[3] * sy,
            ],
            keypoints: i.mapped_keypoints(|x, y| [x * sx, y * sy]),
        })
        .collect();
    (Sample { image, instances }, [sx, sy])
}

/// Ultralytics' validation letterbox (`LetterBox(scaleup=False)` into a rectangular batch's
/// shape): scaled down only if it does not fit `canvas` (`[width, height]`), centred with the
/// odd pixel of a margin at the bottom or right (`round(d ∓ 0.1)`), gray around. Returns the
/// sample, the scale it was resized by (1 when it fits) and the padding `[left, top]`.
pub fn letterbox_into(sample: Sample, canvas: [u32; 2]) -> (Sample, f32, [f32; 2]) {
    let (w, h) = sample.image.dimensions();
    let [cw, ch] = canvas;
    let r = (cw as f64 / w as f64).min(ch as f64 / h as f64).min(1.0);
    let (nw, nh) = scaled(w, h, r);
    let (resized, scale) = if (nw, nh) == (w, h) {
        (sample, 1.0)
    } else {
        (resize_to(sample, nw, nh).0, r as f32)
    };
    let (sample, pad) = pad_into(resized, canvas);
    (sample, scale, pad)
}

/// `sample` centred on a gray `canvas` (`[width, height]`, at least its size), the odd pixel of
/// a margin at the bottom or right (Ultralytics' `round(d ∓ 0.1)` of a half margin `d`); labels
/// follow. Returns the padding `[left, top]`.
fn pad_into(sample: Sample, canvas: [u32; 2]) -> (Sample, [f32; 2]) {
    let (w, h) = sample.image.dimensions();
    let [cw, ch] = canvas;
    let (left, top) = ((cw - w) / 2, (ch - h) / 2);
    let mut image = RgbImage::from_pixel(cw, ch, Rgb([PAD; 3]));
    image::imageops::replace(&mut image, &sample.image, left as i64, top as i64);
    let pad = [left as f32, top as f32];
    let instances = sample
        .instances
        .iter()
        .map(|i| Instance {
            class: i.class,
            bbox: [
                i.bbox[0] + pad[0],
                i.bbox[1] + pad[1],
                i.bbox[2] + pad[0],
                i.bbox[3] + pad[1],
            ],
            keypoints: i.mapped_keypoints(|x, y| [x + pad[0], y + pad[1]]),
        })
        .collect();
    (Sample { image, instances }, pad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wide_image_is_padded_vertically() {
        let image = RgbImage::from_pixel(200, 100, Rgb([10, 20, 30]));
        let inst = Instance {
            class: 0,
            bbox: [0.0, 0.0, 200.0, 100.0],
            keypoints: vec![[100.0, 50.0, 2.0], [5.0, 5.0, 0.0]],
        };
        let (s, scale, pad) = letterbox(
            Sample {
                image,
                instances: vec![inst],
            },
            64,
        );
        assert_eq!(s.image.dimensions(), (64, 64));
        assert_eq!((scale, pad), (0.32, [0.0, 16.0]));
        assert_eq!(s.instances[0].bbox, [0.0, 16.0, 64.0, 48.0]);
        assert_eq!(
            s.instances[0].keypoints,
            vec![[32.0, 32.0, 2.0], [0.0, 0.0, 0.0]]
        );
        assert_eq!(*s.image.get_pixel(0, 0), Rgb([PAD; 3]));
        assert_eq!(*s.image.get_pixel(32, 32), Rgb([10, 20, 30]));
    }

    /// Ultralytics' loading size rounds each side up (never past `size`), its predict size
    /// rounds half to even; the labels follow each axis.
    #[test]
    fn loading_rounds_sides_up_and_labels_follow_each_axis() {
        let sample = |w, h| Sample {
            image: RgbImage::new(w, h),
            instances: vec![Instance {
                class: 0,
                bbox: [0.0, 0.0, w as f32, h as f32],
                keypoints: vec![[w as f32, h as f32, 2.0]],
            }],
        };
        // 640 · 427 / 641 = 426.33: up to 427 (predict rounds: 426).
        let (s, [sx, sy]) = resize_for_loading(sample(641, 427), 640);
        assert_eq!(s.image.dimensions(), (640, 427));
        assert_eq!(s.instances[0].bbox, [0.0, 0.0, 640.0, 427.0]);
        assert_eq!(s.instances[0].keypoints[0][..2], [640.0, 427.0]);
        assert_eq!((sx, sy), (640.0 / 641.0, 1.0));
        assert_eq!(
            resize_long_side(sample(641, 427), 640).0.image.dimensions(),
            (640, 426)
        );
        // Already at size: untouched.
        assert_eq!(resize_for_loading(sample(320, 200), 320).1, [1.0, 1.0]);
        // Python's ratio is a double: 9 · 160/192 is 7.5 exactly, rounded to even 8 (a single-
        // precision ratio gives 7.4999998 and 7).
        assert_eq!(
            resize_long_side(sample(192, 9), 160).0.image.dimensions(),
            (160, 8)
        );
    }

    /// A validation canvas centres the image, the odd margin pixel at the bottom, and shrinks
    /// only what does not fit.
    #[test]
    fn validation_letterbox_centres_and_never_enlarges() {
        let image = RgbImage::from_pixel(320, 213, Rgb([9, 9, 9]));
        let sample = Sample {
            image,
            instances: Vec::new(),
        };
        // Canvas 320×224: 11 rows of margin, 5 on top, 6 below.
        let (s, scale, pad) = letterbox_into(sample.clone(), [320, 224]);
        assert_eq!(
            (s.image.dimensions(), scale, pad),
            ((320, 224), 1.0, [0.0, 5.0])
        );
        assert_eq!(s.image.get_pixel(0, 4), &Rgb([PAD; 3]));
        assert_eq!(s.image.get_pixel(0, 5), &Rgb([9, 9, 9]));
        assert_eq!(s.image.get_pixel(0, 217), &Rgb([9, 9, 9]));
        assert_eq!(s.image.get_pixel(0, 218), &Rgb([PAD; 3]));
        // A larger canvas does not enlarge it.
        let (s, scale, pad) = letterbox_into(sample.clone(), [352, 352]);
        assert_eq!(
            (s.image.dimensions(), scale, pad),
            ((352, 352), 1.0, [16.0, 69.0])
        );
        // A smaller one shrinks it to fit.
        let (s, scale, _) = letterbox_into(sample, [160, 160]);
        assert_eq!((s.image.dimensions(), scale), ((160, 160), 0.5));
    }

    #[test]
    fn rect_letterbox_pads_only_to_the_stride() {
        let image = RgbImage::from_pixel(640, 360, Rgb([1, 2, 3]));
        let sample = Sample {
            image,
            instances: Vec::new(),
        };
        let (s, scale, pad) = letterbox_rect(sample.clone(), 640, 32);
        assert_eq!(s.image.dimensions(), (640, 384));
        assert_eq!((scale, pad), (1.0, [0.0, 12.0]));
        assert_eq!(s.image.get_pixel(0, 11), &Rgb([PAD; 3]));
        assert_eq!(s.image.get_pixel(0, 12), &Rgb([1, 2, 3]));
        // Halved: 320×180 into 320×192; an odd margin puts its extra row at the bottom.
        let (s, scale, pad) = letterbox_rect(sample, 320, 32);
        assert_eq!(s.image.dimensions(), (320, 192));
        assert_eq!((scale, pad), (0.5, [0.0, 6.0]));
        let tall = Sample {
            image: RgbImage::new(101, 203),
            instances: Vec::new(),
        };
        let (s, _, pad) = letterbox_rect(tall, 160, 32);
        // 101×203 → 80×160 → canvas 96×160, 8 px each side.
        assert_eq!((s.image.dimensions(), pad), ((96, 160), [8.0, 0.0]));
    }
}
