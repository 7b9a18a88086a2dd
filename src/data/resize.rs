//! Bilinear resizing as OpenCV's `cv2.resize(..., interpolation=INTER_LINEAR)` does it on 8-bit
//! images, which is how Ultralytics sizes every image it trains, validates and predicts on
//! (`data/base.py::load_image`, `LetterBox`): pixel centres aligned (`(d + ½)·scale − ½`), no
//! antialiasing when shrinking (each output pixel reads its 2×2 nearest inputs, whatever the
//! scale), edges clamped, weights in 11-bit fixed point and the vertical pass rounded as
//! OpenCV's vector code rounds it; an exact halving of both sides averages 2×2 blocks, as
//! OpenCV switches to `INTER_AREA` there. `tests/fixtures/cv2_linear_resize.json` holds
//! OpenCV's own outputs; the test asks for every value within one grey level.

use image::RgbImage;

/// Fixed-point scale of OpenCV's resize weights (`INTER_RESIZE_COEF_BITS = 11`).
const ONE: i32 = 1 << 11;

/// `image` resized to `width × height` as OpenCV's `INTER_LINEAR` resizes it.
pub fn linear(image: &RgbImage, width: u32, height: u32) -> RgbImage {
    let (w, h) = image.dimensions();
    if (w, h) == (width, height) {
        return image.clone();
    }
    if w == 2 * width && h == 2 * height {
        return halve(image);
    }
    let xs = taps(w, width);
    let ys = taps(h, height);
    let src = image.as_raw();
    let row_len = (w * 3) as usize;
    // Horizontal pass of every source row an output row reads, in fixed point.
    let horizontal = |y: usize| -> Vec<i32> {
        let row = &src[y * row_len..(y + 1) * row_len];
        let mut out = Vec::with_capacity(width as usize * 3);
        for &(x, a0, a1) in &xs {
            for c in 0..3 {
                let s0 = row[x * 3 + c] as i32;
                let s1 = row[(x + 1).min(w as usize - 1) * 3 + c] as i32;
                out.push(s0 * a0 + s1 * a1);
            }
        }
        out
    };
    let below = |y: usize| (y + 1).min(h as usize - 1);
    let mut out = Vec::with_capacity((width * height * 3) as usize);
    // The two source rows the last output row read: consecutive output rows mostly read the
    // same rows, or move down by one, so each source row's pass is computed once.
    let mut rows: Option<(usize, Vec<i32>, Vec<i32>)> = None;
    for &(y, b0, b1) in &ys {
        let next = match rows.take() {
            Some(same) if same.0 == y => same,
            Some((last, _, r1)) if below(last) == y => (y, r1, horizontal(below(y))),
            _ => (y, horizontal(y), horizontal(below(y))),
        };
        let (_, r0, r1) = rows.insert(next);
        for (s0, s1) in r0.iter().zip(r1.iter()) {
            // OpenCV's `VResizeLinearVec_32s8u`: high halves of 16-bit products, then
            // `(· + 2) >> 2` with unsigned saturation.
            let v = mul_hi(s0 >> 4, b0) + mul_hi(s1 >> 4, b1) + 2;
            out.push((v >> 2).clamp(0, 255) as u8);
        }
    }
    RgbImage::from_raw(width, height, out).expect("width · height · 3 values")
}

/// `(a · b) >> 16` as a 16-bit SIMD multiply-high gives it.
fn mul_hi(a: i32, b: i32) -> i32 {
    (a * b) >> 16
}

/// For each output position along an axis of `from` → `to` pixels: the first source index and
/// the two fixed-point weights, OpenCV's way (`fx = (d + ½)·from/to − ½`, clamped to the edges).
fn taps(from: u32, to: u32) -> Vec<(usize, i32, i32)> {
    let scale = from as f64 / to as f64;
    (0..to)
        .map(|d| {
            let f = ((d as f64 + 0.5) * scale - 0.5) as f32;
            let mut s = f.floor() as i64;
            let mut frac = f - s as f32;
            if s < 0 {
                s = 0;
                frac = 0.0;
            }
            if s >= from as i64 - 1 {
                s = from as i64 - 1;
                frac = 0.0;
            }
            let a1 = (frac * ONE as f32).round() as i32;
            let a0 = ((1.0 - frac) * ONE as f32).round() as i32;
            (s as usize, a0, a1)
        })
        .collect()
}

/// Each output pixel the rounded mean of its 2×2 source block (OpenCV's `INTER_AREA` for an
/// exact halving).
fn halve(image: &RgbImage) -> RgbImage {
    let (w, h) = image.dimensions();
    let (nw, nh) = (w / 2, h / 2);
    let mut out = Vec::with_capacity((nw * nh * 3) as usize);
    let src = image.as_raw();
    let at = |x: u32, y: u32, c: u32| src[((y * w + x) * 3 + c) as usize] as u32;
    for y in 0..nh {
        for x in 0..nw {
            for c in 0..3 {
                let sum = at(2 * x, 2 * y, c)
                    + at(2 * x + 1, 2 * y, c)
                    + at(2 * x, 2 * y + 1, c)
                    + at(2 * x + 1, 2 * y + 1, c);
                out.push(((sum + 2) >> 2) as u8);
            }
        }
    }
    RgbImage::from_raw(nw, nh, out).expect("nw · nh · 3 values")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fixture's source image, regenerated from its formula.
    fn source(w: u32, h: u32) -> RgbImage {
        RgbImage::from_fn(w, h, |x, y| {
            image::Rgb([
                ((x * 37 + y * 11) % 256) as u8,
                ((x * x + 3 * y * y) % 256) as u8,
                (((x ^ y) * 29) % 256) as u8,
            ])
        })
    }

    /// Shrinking, enlarging, one axis at a time and an exact halving, against OpenCV's own
    /// outputs (`tests/fixtures/cv2_linear_resize.json`, made by `cv2.resize` 5.1.0): every
    /// value within one grey level, and most equal.
    #[test]
    fn linear_resize_matches_opencv() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/cv2_linear_resize.json"
        ))
        .unwrap();
        let fixture: serde_json::Value = serde_json::from_str(&text).unwrap();
        let cases = fixture["cases"].as_array().unwrap();
        assert_eq!(cases.len(), 6);
        for case in cases {
            let n = |k: &str| case[k].as_u64().unwrap() as u32;
            let (w, h, nw, nh) = (n("w"), n("h"), n("nw"), n("nh"));
            let expected: Vec<u8> = case["data"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u8)
                .collect();
            let got = linear(&source(w, h), nw, nh);
            assert_eq!(got.dimensions(), (nw, nh));
            let diffs: Vec<i32> = got
                .as_raw()
                .iter()
                .zip(&expected)
                .map(|(&a, &b)| (a as i32 - b as i32).abs())
                .collect();
            let worst = diffs.iter().max().copied().unwrap_or(0);
            let equal = diffs.iter().filter(|&&d| d == 0).count();
            assert!(worst <= 1, "{w}×{h} → {nw}×{nh}: off by {worst}");
            assert!(
                equal * 100 >= diffs.len() * 95,
                "{w}×{h} → {nw}×{nh}: only {equal} of {} equal",
                diffs.len()
            );
        }
    }
}
