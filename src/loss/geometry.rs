//! Box and keypoint similarity on the host (assignment) — the same formulas as
//! `ultralytics/utils/metrics.py::bbox_iou(CIoU=True)` and `kpt_iou`.

use super::dual::Real;
use std::f32::consts::PI;

/// COCO keypoint sigmas, nose → ankles (`OKS_SIGMA`).
pub const COCO_SIGMAS: [f32; 17] = [
    0.026, 0.025, 0.025, 0.035, 0.035, 0.079, 0.079, 0.072, 0.072, 0.062, 0.062, 0.107, 0.107,
    0.087, 0.087, 0.089, 0.089,
];

/// Sigmas for `k` keypoints: COCO's for 17, else 1/k each.
pub fn sigmas(k: usize) -> Vec<f32> {
    if k == 17 {
        COCO_SIGMAS.to_vec()
    } else {
        vec![1.0 / k as f32; k]
    }
}

const EPS: f32 = 1e-7;

/// Complete IoU of two `[x1, y1, x2, y2]` boxes.
pub fn ciou(a: [f32; 4], b: [f32; 4]) -> f32 {
    ciou_of(a, b)
}

/// [`ciou`] for any [`Real`]; the aspect weight α is detached, as in Ultralytics' loss (the
/// assignment uses only the value).
pub fn ciou_of<T: Real>(a: [T; 4], b: [T; 4]) -> T {
    let c = |x: f32| T::from(x);
    let sq = |x: T| x * x;
    let (w1, h1) = (a[2] - a[0], a[3] - a[1] + c(EPS));
    let (w2, h2) = (b[2] - b[0], b[3] - b[1] + c(EPS));
    let inter = (a[2].min(b[2]) - a[0].max(b[0])).max(c(0.0))
        * (a[3].min(b[3]) - a[1].max(b[1])).max(c(0.0));
    let union = w1 * h1 + w2 * h2 - inter + c(EPS);
    let iou = inter / union;
    let cw = a[2].max(b[2]) - a[0].min(b[0]);
    let ch = a[3].max(b[3]) - a[1].min(b[1]);
    let c2 = cw * cw + ch * ch + c(EPS);
    let rho2 = (sq(b[0] + b[2] - a[0] - a[2]) + sq(b[1] + b[3] - a[1] - a[3])) / c(4.0);
    let v = c(4.0 / (PI * PI)) * sq((w2 / h2).atan() - (w1 / h1).atan());
    let alpha = (v / (v - iou + c(1.0 + EPS))).detach();
    iou - (rho2 / c2 + v * alpha)
}

/// Object keypoint similarity of predicted `(x, y)` against ground truth `(x, y, v)`, with
/// `area` the GT area term (Ultralytics: box w·h·0.53). Only GT visibility counts.
pub fn oks(pred: &[[f32; 2]], gt: &[[f32; 3]], area: f32, sigmas: &[f32]) -> f32 {
    let mut sum = 0.0;
    let mut visible = 0.0;
    for ((p, g), s) in pred.iter().zip(gt).zip(sigmas) {
        if g[2] != 0.0 {
            let d = (p[0] - g[0]).powi(2) + (p[1] - g[1]).powi(2);
            sum += (-d / (8.0 * s * s * (area + 1e-7))).exp();
            visible += 1.0;
        }
    }
    sum / (visible + 1e-7)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ciou_by_hand() {
        let a = [0.0, 0.0, 2.0, 2.0];
        assert!((ciou(a, a) - 1.0).abs() < 1e-5);
        // Same shape shifted by 1 in x: IoU = 2/6, rho² = 1, c² = 3² + 2², v = 0.
        let b = [1.0, 0.0, 3.0, 2.0];
        let expected = 2.0 / 6.0 - 1.0 / 13.0;
        assert!((ciou(a, b) - expected).abs() < 1e-5, "{}", ciou(a, b));
        // Disjoint boxes are negative.
        assert!(ciou(a, [5.0, 5.0, 6.0, 6.0]) < 0.0);
    }

    #[test]
    fn oks_by_hand() {
        let s = [0.5, 0.5];
        let gt = [[0.0, 0.0, 2.0], [10.0, 0.0, 0.0]];
        let pred = [[1.0, 0.0], [99.0, 99.0]];
        // Only the first keypoint is visible: exp(-1 / (8·0.25·4)).
        let expected = (-1.0f32 / 8.0).exp();
        assert!((oks(&pred, &gt, 4.0, &s) - expected).abs() < 1e-5);
    }
}
