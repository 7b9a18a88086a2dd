//! 2×2 mosaic (Ultralytics `Mosaic._mosaic4`): four images around a centre on a `2s × 2s`
//! gray canvas, labels shifted, clipped to the canvas and zero-area boxes dropped.

use super::letterbox::PAD;
use super::{Instance, Sample};
use image::{Rgb, RgbImage};

/// `parts[0]` goes top-left of the centre `(xc, yc)`, then top-right, bottom-left, bottom-right.
pub fn mosaic4(parts: [&Sample; 4], s: u32, centre: [u32; 2]) -> Sample {
    let side = 2 * s as i64;
    let (xc, yc) = (centre[0] as i64, centre[1] as i64);
    let mut canvas = RgbImage::from_pixel(2 * s, 2 * s, Rgb([PAD; 3]));
    let mut instances = Vec::new();
    for (i, part) in parts.into_iter().enumerate() {
        let (w, h) = (part.image.width() as i64, part.image.height() as i64);
        // (a) is the region on the canvas, (b) the region of the part that lands there.
        let (x1a, y1a, x2a, y2a, x1b, y1b) = match i {
            0 => {
                let (x1a, y1a) = ((xc - w).max(0), (yc - h).max(0));
                (x1a, y1a, xc, yc, w - (xc - x1a), h - (yc - y1a))
            }
            1 => {
                let (y1a, x2a) = ((yc - h).max(0), (xc + w).min(side));
                (xc, y1a, x2a, yc, 0, h - (yc - y1a))
            }
            2 => {
                let (x1a, y2a) = ((xc - w).max(0), (yc + h).min(side));
                (x1a, yc, xc, y2a, w - (xc - x1a), 0)
            }
            _ => (xc, yc, (xc + w).min(side), (yc + h).min(side), 0, 0),
        };
        for y in 0..(y2a - y1a) {
            for x in 0..(x2a - x1a) {
                let p = *part.image.get_pixel((x1b + x) as u32, (y1b + y) as u32);
                canvas.put_pixel((x1a + x) as u32, (y1a + y) as u32, p);
            }
        }
        let (dx, dy) = ((x1a - x1b) as f32, (y1a - y1b) as f32);
        instances.extend(
            part.instances
                .iter()
                .filter_map(|inst| shift_and_clip(inst, dx, dy, side as f32)),
        );
    }
    Sample {
        image: canvas,
        instances,
    }
}

fn shift_and_clip(inst: &Instance, dx: f32, dy: f32, side: f32) -> Option<Instance> {
    let b = inst.bbox;
    let bbox = [
        (b[0] + dx).clamp(0.0, side),
        (b[1] + dy).clamp(0.0, side),
        (b[2] + dx).clamp(0.0, side),
        (b[3] + dy).clamp(0.0, side),
    ];
    if bbox[2] <= bbox[0] || bbox[3] <= bbox[1] {
        return None;
    }
    let keypoints = inst.moved_keypoints(|x, y| [x + dx, y + dy], side, side);
    Some(Instance {
        class: inst.class,
        bbox,
        keypoints,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(w: u32, h: u32, colour: u8, bbox: [f32; 4]) -> Sample {
        Sample {
            image: RgbImage::from_pixel(w, h, Rgb([colour; 3])),
            instances: vec![Instance {
                class: 0,
                bbox,
                keypoints: vec![[bbox[0] + 1.0, bbox[1] + 1.0, 2.0]],
            }],
        }
    }

    #[test]
    fn quadrants_labels_and_crops() {
        let s = 10;
        let a = part(10, 8, 1, [0.0, 0.0, 10.0, 8.0]);
        let b = part(6, 10, 2, [1.0, 1.0, 5.0, 9.0]);
        let c = part(10, 10, 3, [2.0, 2.0, 4.0, 4.0]);
        let d = part(10, 10, 4, [8.0, 8.0, 10.0, 10.0]);
        let m = mosaic4([&a, &b, &c, &d], s, [12, 15]);
        assert_eq!(m.image.dimensions(), (20, 20));
        // Top-left image ends at the centre, top-right starts there, and so on.
        assert_eq!(m.image.get_pixel(11, 14).0, [1; 3]);
        assert_eq!(m.image.get_pixel(12, 14).0, [2; 3]);
        assert_eq!(m.image.get_pixel(11, 15).0, [3; 3]);
        assert_eq!(m.image.get_pixel(12, 15).0, [4; 3]);
        assert_eq!(m.image.get_pixel(0, 0).0, [PAD; 3], "above image a");
        assert_eq!(m.image.get_pixel(19, 19).0, [4; 3]);
        let boxes: Vec<[f32; 4]> = m.instances.iter().map(|i| i.bbox).collect();
        // a at (2, 7); b at (12, 5); c at (2, 15), cropped at the bottom; d at (12, 15), whose
        // box lies beyond the canvas and is dropped.
        assert_eq!(
            boxes,
            vec![
                [2.0, 7.0, 12.0, 15.0],
                [13.0, 6.0, 17.0, 14.0],
                [4.0, 17.0, 6.0, 19.0]
            ]
        );
        assert_eq!(m.instances[1].keypoints[0], [14.0, 7.0, 2.0]);
    }
}
