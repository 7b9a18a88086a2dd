//! Ultralytics' own validation metric (8.4.190's `DetectionValidator`/`PoseValidator` with
//! `ap_per_class`), for `train.val_metric = "ultralytics"`: the mAP its `val` prints, which differs
//! from COCOeval's on the same detections by up to ~0.01 (docs/training.md, "Validation").
//!
//! Per image, in the network input's pixels (ground truth and detections both letterboxed,
//! detections not clipped): box IoU, or OKS with the box area × 0.53 as the object's scale, at ten
//! thresholds; each detection, in descending confidence, takes the unclaimed ground truth of its
//! class with the largest overlap, and is a true positive where that overlap reaches the threshold.
//! Then, per class with ground truth, the precision envelope of the detections in descending
//! confidence is sampled at 101 recall points and integrated by trapezoids. No crowd or area
//! ranges, no per-image cap beyond the detector's: every detection and every labelled object
//! counts.

use super::{Detection, Summary};
use crate::data::Instance;
use crate::data::source::AREA_OF_BOX;
use crate::loss::geometry::oks;

/// The ten thresholds, `torch.linspace(0.5, 0.95, 10)` in FP32 (as Ultralytics compares them).
pub fn thresholds() -> [f32; 10] {
    let (start, end, steps) = (0.5f32, 0.95f32, 10usize);
    let step = (end - start) / (steps - 1) as f32;
    std::array::from_fn(|i| match i < steps / 2 {
        true => start + step * i as f32,
        false => end - step * (steps - 1 - i) as f32,
    })
}

/// Ultralytics' `box_iou` in FP32: `[gt][detection]`, boxes `[x1, y1, x2, y2]`.
pub fn box_iou(truth: &[[f32; 4]], dets: &[[f32; 4]]) -> Vec<Vec<f32>> {
    const EPS: f32 = 1e-7;
    truth
        .iter()
        .map(|a| {
            dets.iter()
                .map(|b| {
                    let iw = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
                    let ih = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
                    let inter = iw * ih;
                    let area_a = (a[2] - a[0]) * (a[3] - a[1]);
                    let area_b = (b[2] - b[0]) * (b[3] - b[1]);
                    inter / (area_a + area_b - inter + EPS)
                })
                .collect()
        })
        .collect()
}

/// Ultralytics' `kpt_iou` in FP32: OKS `[gt][detection]`, with `area` per ground truth; a ground
/// truth keypoint counts where its visibility is not 0 (the assigner's [`oks`], the same
/// operations).
pub fn kpt_iou(
    truth: &[&[[f32; 3]]],
    dets: &[&[[f32; 3]]],
    area: &[f32],
    sigmas: &[f32],
) -> Vec<Vec<f32>> {
    let dets: Vec<Vec<[f32; 2]>> = dets
        .iter()
        .map(|d| d.iter().map(|k| [k[0], k[1]]).collect())
        .collect();
    truth
        .iter()
        .zip(area)
        .map(|(g, &a)| dets.iter().map(|d| oks(d, g, a, sigmas)).collect())
        .collect()
}

/// Ultralytics' `match_predictions` (its default, greedy path): detections (in the order given,
/// descending confidence) against ground truth by `overlap[gt][detection]`; a true-positive row of
/// ten flags per detection.
pub fn match_predictions(
    det_class: &[usize],
    gt_class: &[usize],
    overlap: &[Vec<f32>],
    thresholds: &[f32; 10],
) -> Vec<[bool; 10]> {
    let mut correct = vec![[false; 10]; det_class.len()];
    let mut claimed = vec![[false; 10]; gt_class.len()];
    let lowest = thresholds.iter().copied().fold(f32::INFINITY, f32::min);
    let same = |g: usize, j: usize| match gt_class[g] == det_class[j] {
        true => overlap[g][j],
        false => 0.0,
    };
    for (j, row) in correct.iter_mut().enumerate() {
        if !(0..gt_class.len()).any(|g| same(g, j) >= lowest) {
            continue;
        }
        for (t, &threshold) in thresholds.iter().enumerate() {
            // numpy's argmax: the first of the largest; claimed ground truth counts as 0.
            let mut best = (0, f32::NEG_INFINITY);
            for (g, taken) in claimed.iter().enumerate() {
                let v = if taken[t] { 0.0 } else { same(g, j) };
                if v > best.1 {
                    best = (g, v);
                }
            }
            row[t] = best.1 >= threshold;
            claimed[best.0][t] |= row[t];
        }
    }
    correct
}

/// numpy's `interp(x, xp, fp)` for a non-decreasing `xp` (ties included), ends held.
fn interp(x: f64, xp: &[f64], fp: &[f64]) -> f64 {
    let n = xp.len();
    if n == 1 || x < xp[0] {
        return fp[0];
    }
    if x >= xp[n - 1] {
        return fp[n - 1];
    }
    // The last j with xp[j] <= x, as numpy's binary search finds it.
    let j = xp.partition_point(|&v| v <= x) - 1;
    if xp[j] == x {
        return fp[j];
    }
    let slope = (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j]);
    slope * (x - xp[j]) + fp[j]
}

/// Ultralytics' `compute_ap`: the precision envelope over recall with sentinels, sampled at 101
/// recall points and integrated by trapezoids.
pub fn compute_ap(recall: &[f64], precision: &[f64]) -> f64 {
    let mut mrec = Vec::with_capacity(recall.len() + 3);
    mrec.push(0.0);
    mrec.extend_from_slice(recall);
    mrec.push(recall.last().copied().unwrap_or(1.0));
    mrec.push(1.0);
    let mut mpre = Vec::with_capacity(precision.len() + 3);
    mpre.push(1.0);
    mpre.extend_from_slice(precision);
    mpre.extend([0.0, 0.0]);
    for i in (0..mpre.len() - 1).rev() {
        mpre[i] = mpre[i].max(mpre[i + 1]);
    }
    // np.linspace(0, 1, 101): i · (1/100), the last exactly 1.
    let x: Vec<f64> = (0..=100)
        .map(|i| if i == 100 { 1.0 } else { i as f64 * 0.01 })
        .collect();
    let y: Vec<f64> = x.iter().map(|&v| interp(v, &mrec, &mpre)).collect();
    (0..100)
        .map(|i| (x[i + 1] - x[i]) * (y[i + 1] + y[i]) / 2.0)
        .sum()
}

/// Ultralytics' `ap_per_class`: AP at each threshold per class with ground truth (ascending class),
/// 0 for a class without detections. Detections are ranked by confidence, ties in their given
/// order (numpy's sort is not stable there: equal confidences may rank otherwise in Ultralytics).
pub fn ap_per_class(
    tp: &[[bool; 10]],
    conf: &[f32],
    det_class: &[usize],
    gt_class: &[usize],
) -> Vec<(usize, [f64; 10])> {
    let mut order: Vec<usize> = (0..conf.len()).collect();
    order.sort_by(|&a, &b| conf[b].total_cmp(&conf[a]));
    let mut classes = gt_class.to_vec();
    classes.sort_unstable();
    classes.dedup();
    classes
        .into_iter()
        .map(|c| {
            let labels = gt_class.iter().filter(|&&g| g == c).count() as f64 + 1e-16;
            let mine: Vec<&[bool; 10]> = order
                .iter()
                .filter(|&&i| det_class[i] == c)
                .map(|&i| &tp[i])
                .collect();
            let mut ap = [0.0; 10];
            if mine.is_empty() {
                return (c, ap);
            }
            for (t, ap_t) in ap.iter_mut().enumerate() {
                let (mut tpc, mut fpc) = (0.0f64, 0.0f64);
                let (mut recall, mut precision) = (Vec::new(), Vec::new());
                for row in &mine {
                    match row[t] {
                        true => tpc += 1.0,
                        false => fpc += 1.0,
                    }
                    recall.push(tpc / labels);
                    precision.push(tpc / (tpc + fpc));
                }
                *ap_t = compute_ap(&recall, &precision);
            }
            (c, ap)
        })
        .collect()
}

/// Validation's tallies under Ultralytics' metric: each image's true-positive rows (box and, with
/// keypoint sigmas, pose), confidences and classes, then the summaries.
#[derive(Clone, Debug)]
pub struct Tally {
    sigmas: Vec<f32>,
    labelled_only: bool,
    thresholds: [f32; 10],
    box_tp: Vec<[bool; 10]>,
    pose_tp: Vec<[bool; 10]>,
    conf: Vec<f32>,
    det_class: Vec<usize>,
    gt_class: Vec<usize>,
}

impl Tally {
    /// `sigmas`: the keypoints' OKS constants (empty for detection: no pose metric).
    /// `labelled_only`: objects without a labelled keypoint are not ground truth, as when
    /// Ultralytics reads a COCO keypoints file (its `convert_coco(use_keypoints=True)` leaves them
    /// out).
    pub fn new(sigmas: &[f32], labelled_only: bool) -> Self {
        Self {
            sigmas: sigmas.to_vec(),
            labelled_only,
            thresholds: thresholds(),
            box_tp: Vec::new(),
            pose_tp: Vec::new(),
            conf: Vec::new(),
            det_class: Vec::new(),
            gt_class: Vec::new(),
        }
    }

    /// One image: its ground truth and detections in the same (network input) pixels, the
    /// detections in descending confidence.
    pub fn add(&mut self, truth: &[Instance], dets: &[Detection]) {
        let truth: Vec<&Instance> = truth
            .iter()
            .filter(|t| !self.labelled_only || t.keypoints.iter().any(|k| k[2] != 0.0))
            .collect();
        let gt_class: Vec<usize> = truth.iter().map(|t| t.class).collect();
        let det_class: Vec<usize> = dets.iter().map(|d| d.class).collect();
        let gt_boxes: Vec<[f32; 4]> = truth.iter().map(|t| t.bbox).collect();
        let det_boxes: Vec<[f32; 4]> = dets.iter().map(|d| d.bbox).collect();
        let iou = box_iou(&gt_boxes, &det_boxes);
        self.box_tp.extend(match_predictions(
            &det_class,
            &gt_class,
            &iou,
            &self.thresholds,
        ));
        if !self.sigmas.is_empty() {
            let area: Vec<f32> = gt_boxes
                .iter()
                .map(|b| (b[2] - b[0]) * (b[3] - b[1]) * AREA_OF_BOX as f32)
                .collect();
            let gk: Vec<&[[f32; 3]]> = truth.iter().map(|t| t.keypoints.as_slice()).collect();
            let dk: Vec<&[[f32; 3]]> = dets.iter().map(|d| d.keypoints.as_slice()).collect();
            let oks = kpt_iou(&gk, &dk, &area, &self.sigmas);
            self.pose_tp.extend(match_predictions(
                &det_class,
                &gt_class,
                &oks,
                &self.thresholds,
            ));
        }
        self.conf.extend(dets.iter().map(|d| d.score));
        self.det_class.extend(det_class);
        self.gt_class.extend(gt_class);
    }

    /// How many ground-truth objects were scored (Ultralytics' "Instances").
    pub fn objects(&self) -> usize {
        self.gt_class.len()
    }

    /// Box mAPs, as Ultralytics' `metrics.box`.
    pub fn boxes(&self) -> Summary {
        self.summary(&self.box_tp)
    }

    /// Pose (OKS) mAPs, as Ultralytics' `metrics.pose`; absent for detection.
    pub fn pose(&self) -> Summary {
        match self.sigmas.is_empty() {
            true => Summary::absent(),
            false => self.summary(&self.pose_tp),
        }
    }

    fn summary(&self, tp: &[[bool; 10]]) -> Summary {
        let ap = ap_per_class(tp, &self.conf, &self.det_class, &self.gt_class);
        if ap.is_empty() {
            return Summary::absent();
        }
        let n = ap.len() as f64;
        let column = |t: usize| ap.iter().map(|(_, a)| a[t]).sum::<f64>() / n;
        Summary {
            map: ap.iter().flat_map(|(_, a)| a.iter()).sum::<f64>() / (n * 10.0),
            map50: column(0),
            map75: column(5),
            by_area: Vec::new(),
            per_class: ap
                .iter()
                .map(|(c, a)| (*c as u64 + 1, a.iter().sum::<f64>() / 10.0))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests;
