//! Resizing an image into the network input: long side to `size` (aspect kept, bilinear),
//! centred on a gray (114) canvas, square or (for predict) only as large as needed; labels
//! follow.

use super::{Instance, Sample};
use image::imageops::{FilterType, resize};
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
    let (cw, ch) = match stride {
        Some(s) => (nw.next_multiple_of(s), nh.next_multiple_of(s)),
        None => (size, size),
    };
    let (px, py) = ((cw - nw) / 2, (ch - nh) / 2);
    let mut canvas = RgbImage::from_pixel(cw, ch, Rgb([PAD; 3]));
    image::imageops::replace(&mut canvas, &resized.image, px as i64, py as i64);
    let pad = [px as f32, py as f32];
    let instances = resized
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
    (
        Sample {
            image: canvas,
            instances,
        },
        scale,
        pad,
    )
}

/// Resizes so the long side is `size` (bilinear, aspect kept); labels follow.
pub fn resize_long_side(sample: Sample, size: u32) -> (Sample, f32) {
    let (w, h) = sample.image.dimensions();
    if w.max(h) == size {
        return (sample, 1.0);
    }
    let scale = size as f32 / w.max(h) as f32;
    let (nw, nh) = (
        ((w as f32 * scale).round() as u32).max(1),
        ((h as f32 * scale).round() as u32).max(1),
    );
    let image = resize(&sample.image, nw, nh, FilterType::Triangle);
    let instances = sample
        .instances
        .iter()
        .map(|i| Instance {
            class: i.class,
            bbox: i.bbox.map(|v| v * scale),
            keypoints: i.mapped_keypoints(|x, y| [x * scale, y * scale]),
        })
        .collect();
    (Sample { image, instances }, scale)
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
