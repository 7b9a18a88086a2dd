//! Pictures of what a model sees and finds: boxes with class and score, keypoints and the
//! skeleton, drawn with `imageproc` in the embedded DejaVu font; batch grids for `fit`.

use super::{Found, Layout};
use crate::data::{Batch, Instance};
use ab_glyph::{FontRef, PxScale};
use image::{Rgb, RgbImage};
use imageproc::drawing::{
    draw_filled_circle_mut, draw_filled_rect_mut, draw_hollow_rect_mut, draw_line_segment_mut,
    draw_text_mut, text_size,
};
use imageproc::rect::Rect;

/// Keypoints whose confidence is below this are not drawn (Ultralytics' `kpt_line` rule).
pub const KEYPOINT_CONF: f32 = 0.5;

/// Ultralytics' 20-colour palette, one per class.
const PALETTE: [[u8; 3]; 20] = [
    [255, 56, 56],
    [255, 157, 151],
    [255, 112, 31],
    [255, 178, 29],
    [207, 210, 49],
    [72, 249, 10],
    [146, 204, 23],
    [61, 219, 134],
    [26, 147, 52],
    [0, 212, 187],
    [44, 153, 168],
    [0, 194, 255],
    [52, 69, 147],
    [100, 115, 255],
    [0, 24, 236],
    [132, 56, 255],
    [82, 0, 133],
    [203, 56, 255],
    [255, 149, 200],
    [255, 55, 199],
];

const KEYPOINT_COLOUR: Rgb<u8> = Rgb([0, 255, 0]);
const LIMB_COLOUR: Rgb<u8> = Rgb([51, 153, 255]);

fn font() -> FontRef<'static> {
    FontRef::try_from_slice(dejavu::sans::regular()).expect("the embedded DejaVu Sans font parses")
}

fn class_colour(class: usize) -> Rgb<u8> {
    Rgb(PALETTE[class % PALETTE.len()])
}

/// A thing to draw: a box, its label and keypoints (`[x, y, confidence or visibility]`).
pub struct Mark<'a> {
    pub class: usize,
    pub label: String,
    pub bbox: [f32; 4],
    pub keypoints: &'a [[f32; 3]],
}

impl<'a> Mark<'a> {
    /// A prediction, labelled with its class name (or id) and score.
    pub fn found(f: &'a Found, layout: &Layout) -> Self {
        let name = layout
            .class_name(f.class)
            .unwrap_or_else(|| f.class.to_string());
        Self {
            class: f.class,
            label: format!("{name} {:.2}", f.score),
            bbox: f.bbox,
            keypoints: &f.keypoints,
        }
    }

    /// A ground-truth label, labelled with its class name (or id).
    pub fn label(inst: &'a Instance, layout: &Layout) -> Self {
        Self {
            class: inst.class,
            label: layout
                .class_name(inst.class)
                .unwrap_or_else(|| inst.class.to_string()),
            bbox: inst.bbox,
            keypoints: &inst.keypoints,
        }
    }
}

/// Draws `marks` onto `image`: boxes, labels, skeleton lines, then keypoints; keypoints below
/// [`KEYPOINT_CONF`] (and unlabelled ones, v = 0) are hidden, so are limbs touching them.
pub fn annotate(image: &mut RgbImage, marks: &[Mark], layout: &Layout) {
    let font = font();
    let (w, h) = image.dimensions();
    let thick = ((w.max(h) as f32) / 400.0).ceil().max(1.0) as i32;
    let scale = PxScale::from((w.max(h) as f32 / 45.0).clamp(10.0, 28.0));
    for m in marks {
        let colour = class_colour(m.class);
        let [x1, y1, x2, y2] = m.bbox.map(|v| v.round() as i32);
        for t in 0..thick {
            let (bw, bh) = ((x2 - x1 - 2 * t).max(1), (y2 - y1 - 2 * t).max(1));
            draw_hollow_rect_mut(
                image,
                Rect::at(x1 + t, y1 + t).of_size(bw as u32, bh as u32),
                colour,
            );
        }
        let (tw, th) = text_size(scale, &font, &m.label);
        let top = if y1 >= th as i32 + 2 {
            y1 - th as i32 - 2
        } else {
            y1
        };
        draw_filled_rect_mut(image, Rect::at(x1, top).of_size(tw + 4, th + 2), colour);
        draw_text_mut(
            image,
            Rgb([255, 255, 255]),
            x1 + 2,
            top,
            scale,
            &font,
            &m.label,
        );
        let shown = |k: &[f32; 3]| k[2] >= KEYPOINT_CONF && (k[0] != 0.0 || k[1] != 0.0);
        for &[a, b] in &layout.skeleton {
            let (Some(p), Some(q)) = (m.keypoints.get(a), m.keypoints.get(b)) else {
                continue;
            };
            if shown(p) && shown(q) {
                for t in 0..thick {
                    let o = t as f32;
                    draw_line_segment_mut(image, (p[0] + o, p[1]), (q[0] + o, q[1]), LIMB_COLOUR);
                }
            }
        }
        for k in m.keypoints.iter().filter(|k| shown(k)) {
            let centre = (k[0].round() as i32, k[1].round() as i32);
            draw_filled_circle_mut(image, centre, thick + 1, KEYPOINT_COLOUR);
        }
    }
}

/// The images of a batch side by side in a grid (at most 16), each with its labels, or with the
/// `found` detections per image when given; downscaled so the grid is at most 1920 px wide.
pub fn batch_grid(batch: &Batch, found: Option<&[Vec<Found>]>, layout: &Layout) -> RgbImage {
    let dims: Vec<usize> = batch.images.shape().iter().copied().collect();
    let [b, _, h, w]: [usize; 4] = dims.try_into().expect("a [B, 3, H, W] batch");
    let n = b.min(16);
    let cols = (n as f64).sqrt().ceil() as usize;
    let rows = n.div_ceil(cols);
    let mut grid = RgbImage::from_pixel((cols * w) as u32, (rows * h) as u32, Rgb([255, 255, 255]));
    let bytes = batch.images.as_bytes();
    let plane = h * w;
    for i in 0..n {
        let img = RgbImage::from_fn(w as u32, h as u32, |x, y| {
            let p = y as usize * w + x as usize;
            Rgb([0, 1, 2].map(|c| bytes[(i * 3 + c) * plane + p]))
        });
        let mut img = match &batch.hsv_gains {
            // What the model sees: the deferred HSV jitter too.
            Some(gains) => {
                let mut img = img;
                crate::data::hsv::HsvTables::new(gains[i]).apply(&mut img);
                img
            }
            None => img,
        };
        let marks: Vec<Mark> = match found {
            Some(f) => f[i].iter().map(|d| Mark::found(d, layout)).collect(),
            None => batch.samples[i]
                .instances
                .iter()
                .map(|inst| Mark::label(inst, layout))
                .collect(),
        };
        annotate(&mut img, &marks, layout);
        let (x, y) = ((i % cols) * w, (i / cols) * h);
        image::imageops::replace(&mut grid, &img, x as i64, y as i64);
    }
    let width = grid.width();
    if width > 1920 {
        let height = (grid.height() as u64 * 1920 / width as u64) as u32;
        grid = image::imageops::resize(
            &grid,
            1920,
            height.max(1),
            image::imageops::FilterType::Triangle,
        );
    }
    grid
}

/// Where the labels of a whole training set fall: every box outline and labelled keypoint in
/// image-normalised coordinates, drawn on one `size × size` canvas.
pub fn label_map(labels: &[(u32, u32, Vec<Instance>)], size: u32) -> RgbImage {
    let mut img = RgbImage::from_pixel(size, size, Rgb([255, 255, 255]));
    let s = size as f32;
    for (w, h, instances) in labels {
        let (fx, fy) = (s / *w as f32, s / *h as f32);
        for inst in instances {
            let [x1, y1, x2, y2] = inst.bbox;
            let r = Rect::at((x1 * fx) as i32, (y1 * fy) as i32).of_size(
                (((x2 - x1) * fx) as u32).max(1),
                (((y2 - y1) * fy) as u32).max(1),
            );
            draw_hollow_rect_mut(&mut img, r, class_colour(inst.class));
            for k in inst.keypoints.iter().filter(|k| k[2] > 0.0) {
                draw_filled_circle_mut(
                    &mut img,
                    ((k[0] * fx) as i32, (k[1] * fy) as i32),
                    1,
                    KEYPOINT_COLOUR,
                );
            }
        }
    }
    img
}
