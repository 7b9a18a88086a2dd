//! Resizing an image into the square network input: long side to `size` (aspect kept, bilinear),
//! centred on a gray (114) canvas; labels follow.

use super::{Instance, Sample};
use image::imageops::{FilterType, resize};
use image::{Rgb, RgbImage};

pub const PAD: u8 = 114;

/// The letterboxed sample and the transform `x' = x·scale + pad`.
pub fn letterbox(sample: Sample, size: u32) -> (Sample, f32, [f32; 2]) {
    let (resized, scale) = resize_long_side(sample, size);
    let (nw, nh) = resized.image.dimensions();
    let (px, py) = ((size - nw) / 2, (size - nh) / 2);
    let mut canvas = RgbImage::from_pixel(size, size, Rgb([PAD; 3]));
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
}
