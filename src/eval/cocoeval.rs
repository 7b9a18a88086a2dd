//! COCO evaluation (pycocotools' `COCOeval`) for boxes and keypoints: greedy matching by
//! score per IoU/OKS threshold, crowd and area-range ignores, 101-point interpolated precision.
//! Written from pycocotools' algorithm and checked against the `hotcoco` crate in tests.

/// What similarity matches detections to ground truth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IouKind {
    Bbox,
    Keypoints,
}

/// A ground-truth annotation in original image pixels.
#[derive(Clone, Debug, PartialEq)]
pub struct GtAnn {
    pub image_id: u64,
    pub category_id: u64,
    /// `[x, y, w, h]`.
    pub bbox: [f64; 4],
    pub area: f64,
    pub iscrowd: bool,
    /// `x, y, v` triples (keypoints evaluation).
    pub keypoints: Vec<f64>,
    pub num_keypoints: u32,
}

/// A detection in original image pixels.
#[derive(Clone, Debug, PartialEq)]
pub struct DtAnn {
    pub image_id: u64,
    pub category_id: u64,
    pub bbox: [f64; 4],
    pub score: f64,
    pub keypoints: Vec<f64>,
}

/// Summary statistics, as `COCOeval.summarize()` prints their AP rows.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// AP at IoU/OKS 0.50:0.95, all areas.
    pub map: f64,
    pub map50: f64,
    pub map75: f64,
    /// AP per area range (bbox: small, medium, large; keypoints: medium, large).
    pub by_area: Vec<f64>,
    /// AP at 0.50:0.95, all areas, per category id with ground truth (ascending ids); -1 where
    /// a category's ground truth is all ignored.
    pub per_class: Vec<(u64, f64)>,
}

impl Summary {
    /// What an evaluation that did not run reports (detection has no keypoint mAP).
    pub fn absent() -> Self {
        Self {
            map: -1.0,
            map50: -1.0,
            map75: -1.0,
            by_area: Vec::new(),
            per_class: Vec::new(),
        }
    }
}

struct Params {
    thresholds: Vec<f64>,
    recall_points: Vec<f64>,
    max_det: usize,
    areas: Vec<[f64; 2]>,
}

impl Params {
    fn new(kind: IouKind) -> Self {
        let big = 1e5f64 * 1e5;
        let (max_det, areas) = match kind {
            IouKind::Bbox => (
                100,
                vec![[0.0, big], [0.0, 1024.0], [1024.0, 9216.0], [9216.0, big]],
            ),
            IouKind::Keypoints => (20, vec![[0.0, big], [1024.0, 9216.0], [9216.0, big]]),
        };
        Self {
            thresholds: linspace(0.5, 0.95, 10),
            recall_points: linspace(0.0, 1.0, 101),
            max_det,
            areas,
        }
    }
}

/// `numpy.linspace(start, stop, num)` value for value: `i·step + start`, last = `stop`.
fn linspace(start: f64, stop: f64, num: usize) -> Vec<f64> {
    let step = (stop - start) / (num - 1) as f64;
    let mut v: Vec<f64> = (0..num).map(|i| i as f64 * step + start).collect();
    v[num - 1] = stop;
    v
}

/// Per (image, category, area) result of `evaluateImg`.
struct ImageEval {
    scores: Vec<f64>,
    /// `[T][D]` matched.
    matched: Vec<Vec<bool>>,
    /// `[T][D]` ignored.
    dt_ignore: Vec<Vec<bool>>,
    gt_ignore: Vec<bool>,
}

/// Detection area as pycocotools' `loadRes` sets it: box w·h, or the keypoint extent's area.
fn dt_area(d: &DtAnn, kind: IouKind) -> f64 {
    match kind {
        IouKind::Bbox => d.bbox[2] * d.bbox[3],
        IouKind::Keypoints => {
            let (xs, ys): (Vec<f64>, Vec<f64>) =
                d.keypoints.chunks(3).map(|k| (k[0], k[1])).unzip();
            let span = |v: &[f64]| {
                v.iter().cloned().fold(f64::MIN, f64::max)
                    - v.iter().cloned().fold(f64::MAX, f64::min)
            };
            span(&xs) * span(&ys)
        }
    }
}

fn box_iou(d: &[f64; 4], g: &[f64; 4], crowd: bool) -> f64 {
    let iw = (d[0] + d[2]).min(g[0] + g[2]) - d[0].max(g[0]);
    let ih = (d[1] + d[3]).min(g[1] + g[3]) - d[1].max(g[1]);
    if iw <= 0.0 || ih <= 0.0 {
        return 0.0;
    }
    let inter = iw * ih;
    let union = if crowd {
        d[2] * d[3]
    } else {
        d[2] * d[3] + g[2] * g[3] - inter
    };
    inter / union
}

fn oks(d: &DtAnn, g: &GtAnn, sigmas: &[f64]) -> f64 {
    let labelled = g.keypoints.chunks(3).filter(|k| k[2] > 0.0).count();
    let [bx, by, bw, bh] = g.bbox;
    let (x0, x1, y0, y1) = (bx - bw, bx + 2.0 * bw, by - bh, by + 2.0 * bh);
    let mut sum = 0.0;
    let mut count = 0usize;
    for ((gk, dk), s) in g.keypoints.chunks(3).zip(d.keypoints.chunks(3)).zip(sigmas) {
        let (dx, dy) = if labelled > 0 {
            (dk[0] - gk[0], dk[1] - gk[1])
        } else {
            (
                (x0 - dk[0]).max(0.0) + (dk[0] - x1).max(0.0),
                (y0 - dk[1]).max(0.0) + (dk[1] - y1).max(0.0),
            )
        };
        if labelled > 0 && gk[2] <= 0.0 {
            continue;
        }
        let var = (2.0 * s).powi(2);
        let e = (dx * dx + dy * dy) / var / (g.area + f64::EPSILON) / 2.0;
        sum += (-e).exp();
        count += 1;
    }
    sum / count as f64
}

/// Evaluates `dts` against `gts` over `image_ids` (pycocotools' `imgIds`; images without
/// annotations count too) and returns the AP summary.
pub fn evaluate(
    gts: &[GtAnn],
    dts: &[DtAnn],
    image_ids: &[u64],
    kind: IouKind,
    sigmas: &[f64],
) -> Summary {
    let p = Params::new(kind);
    let mut images: Vec<u64> = image_ids.to_vec();
    images.sort_unstable();
    images.dedup();
    let mut cats: Vec<u64> = gts.iter().map(|g| g.category_id).collect();
    cats.sort_unstable();
    cats.dedup();
    let (t_len, r_len, a_len) = (p.thresholds.len(), p.recall_points.len(), p.areas.len());
    // precision[t][r][k][a]; -1 where a category has no ground truth in range.
    let mut precision = vec![vec![vec![vec![-1.0f64; a_len]; cats.len()]; r_len]; t_len];
    for (k, &cat) in cats.iter().enumerate() {
        let mut per_area: Vec<Vec<ImageEval>> = (0..a_len).map(|_| Vec::new()).collect();
        for &img in &images {
            let g: Vec<&GtAnn> = gts
                .iter()
                .filter(|g| g.image_id == img && g.category_id == cat)
                .collect();
            let mut d: Vec<&DtAnn> = dts
                .iter()
                .filter(|d| d.image_id == img && d.category_id == cat)
                .collect();
            if g.is_empty() && d.is_empty() {
                continue;
            }
            // Stable sort by descending score, then the per-image cap.
            d.sort_by(|a, b| b.score.total_cmp(&a.score));
            d.truncate(p.max_det);
            let sim: Vec<Vec<f64>> = d
                .iter()
                .map(|dt| {
                    g.iter()
                        .map(|gt| match kind {
                            IouKind::Bbox => box_iou(&dt.bbox, &gt.bbox, gt.iscrowd),
                            IouKind::Keypoints => oks(dt, gt, sigmas),
                        })
                        .collect()
                })
                .collect();
            for (a, range) in p.areas.iter().enumerate() {
                per_area[a].push(evaluate_image(&p, kind, &g, &d, &sim, *range));
            }
        }
        for (a, evals) in per_area.iter().enumerate() {
            accumulate(&p, evals, &mut |t, r, v| precision[t][r][k][a] = v);
        }
    }
    let mean = |vals: Vec<f64>| {
        let valid: Vec<f64> = vals.into_iter().filter(|&v| v > -1.0).collect();
        if valid.is_empty() {
            -1.0
        } else {
            valid.iter().sum::<f64>() / valid.len() as f64
        }
    };
    let collect = |ts: &[usize], a: usize| {
        let mut v = Vec::new();
        for &t in ts {
            for per_recall in &precision[t] {
                v.extend(per_recall.iter().map(|per_cat| per_cat[a]));
            }
        }
        v
    };
    let all: Vec<usize> = (0..t_len).collect();
    let per_class = cats
        .iter()
        .enumerate()
        .map(|(k, &cat)| {
            let v = precision
                .iter()
                .flat_map(|per_recall| per_recall.iter().map(|per_cat| per_cat[k][0]))
                .collect();
            (cat, mean(v))
        })
        .collect();
    Summary {
        map: mean(collect(&all, 0)),
        map50: mean(collect(&[0], 0)),
        map75: mean(collect(&[5], 0)),
        by_area: (1..a_len).map(|a| mean(collect(&all, a))).collect(),
        per_class,
    }
}

fn evaluate_image(
    p: &Params,
    kind: IouKind,
    g: &[&GtAnn],
    d: &[&DtAnn],
    sim: &[Vec<f64>],
    range: [f64; 2],
) -> ImageEval {
    let outside = |area: f64| area < range[0] || area > range[1];
    let ignore: Vec<bool> = g
        .iter()
        .map(|g| {
            let base = g.iscrowd || (kind == IouKind::Keypoints && g.num_keypoints == 0);
            base || outside(g.area)
        })
        .collect();
    // Ground truth: not-ignored first (stable).
    let mut order: Vec<usize> = (0..g.len()).collect();
    order.sort_by_key(|&i| ignore[i]);
    let t_len = p.thresholds.len();
    let mut gt_taken = vec![vec![false; g.len()]; t_len];
    let mut matched = vec![vec![false; d.len()]; t_len];
    let mut dt_ignore = vec![vec![false; d.len()]; t_len];
    for (t, &thr) in p.thresholds.iter().enumerate() {
        for di in 0..d.len() {
            let mut best = thr.min(1.0 - 1e-10);
            let mut m: Option<usize> = None;
            for (pos, &gi) in order.iter().enumerate() {
                if gt_taken[t][pos] && !g[gi].iscrowd {
                    continue;
                }
                if let Some(mp) = m
                    && !ignore[order[mp]]
                    && ignore[gi]
                {
                    break;
                }
                if sim[di][gi] < best {
                    continue;
                }
                best = sim[di][gi];
                m = Some(pos);
            }
            if let Some(mp) = m {
                dt_ignore[t][di] = ignore[order[mp]];
                matched[t][di] = true;
                gt_taken[t][mp] = true;
            }
        }
    }
    for (di, dt) in d.iter().enumerate() {
        if outside(dt_area(dt, kind)) {
            for t in 0..t_len {
                dt_ignore[t][di] |= !matched[t][di];
            }
        }
    }
    ImageEval {
        scores: d.iter().map(|d| d.score).collect(),
        matched,
        dt_ignore,
        gt_ignore: order.iter().map(|&i| ignore[i]).collect(),
    }
}

fn accumulate(p: &Params, evals: &[ImageEval], set: &mut dyn FnMut(usize, usize, f64)) {
    let npig = evals
        .iter()
        .flat_map(|e| &e.gt_ignore)
        .filter(|&&i| !i)
        .count();
    if npig == 0 {
        return;
    }
    // Concatenate in image order, then a stable sort by descending score.
    let mut rows: Vec<(f64, usize, usize)> = Vec::new();
    for (e, ev) in evals.iter().enumerate() {
        for di in 0..ev.scores.len() {
            rows.push((ev.scores[di], e, di));
        }
    }
    rows.sort_by(|a, b| b.0.total_cmp(&a.0));
    for t in 0..p.thresholds.len() {
        let (mut tp, mut fp) = (0.0f64, 0.0f64);
        let mut rc = Vec::with_capacity(rows.len());
        let mut pr = Vec::with_capacity(rows.len());
        for &(_, e, di) in &rows {
            let ev = &evals[e];
            if ev.dt_ignore[t][di] {
                // Ignored detections add to neither count but keep their place.
            } else if ev.matched[t][di] {
                tp += 1.0;
            } else {
                fp += 1.0;
            }
            rc.push(tp / npig as f64);
            pr.push(tp / (fp + tp + f64::EPSILON));
        }
        for i in (1..pr.len()).rev() {
            if pr[i] > pr[i - 1] {
                pr[i - 1] = pr[i];
            }
        }
        for (r, &thr) in p.recall_points.iter().enumerate() {
            let pi = rc.partition_point(|&v| v < thr);
            set(t, r, if pi < pr.len() { pr[pi] } else { 0.0 });
        }
    }
}
