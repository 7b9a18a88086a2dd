//! COCO evaluation (pycocotools' `COCOeval`) for boxes and keypoints, through the `hotcoco`
//! crate (a Rust port checked against pycocotools): our annotations become an in-memory COCO
//! dataset, the detections its results, and the AP rows and per-class AP are read from its
//! summary and accumulated precision.

use hotcoco::{Annotation, COCO, COCOeval, Category, Dataset, Image, IouType};

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

/// Evaluates `dts` against `gts` over `image_ids` (pycocotools' `imgIds`; images without
/// annotations count too) with keypoint similarity constants `sigmas`, and returns the AP
/// summary. Keypoint detections are matched by their keypoints alone: their box and area are
/// the keypoints' extent, as pycocotools' `loadRes` makes them.
pub fn evaluate(
    gts: &[GtAnn],
    dts: &[DtAnn],
    image_ids: &[u64],
    kind: IouKind,
    sigmas: &[f64],
) -> Summary {
    let mut images: Vec<u64> = image_ids.to_vec();
    images.extend(gts.iter().map(|g| g.image_id));
    images.sort_unstable();
    images.dedup();
    let mut cats: Vec<u64> = gts.iter().map(|g| g.category_id).collect();
    cats.sort_unstable();
    cats.dedup();
    if cats.is_empty() {
        return Summary::absent();
    }
    let dataset = Dataset {
        images: images
            .iter()
            .map(|&id| Image {
                id,
                ..Default::default()
            })
            .collect(),
        annotations: gts
            .iter()
            .enumerate()
            .map(|(i, g)| Annotation {
                id: i as u64 + 1,
                image_id: g.image_id,
                category_id: g.category_id,
                bbox: Some(g.bbox),
                area: Some(g.area),
                iscrowd: g.iscrowd,
                keypoints: (!g.keypoints.is_empty()).then(|| g.keypoints.clone()),
                num_keypoints: Some(g.num_keypoints),
                ..Default::default()
            })
            .collect(),
        categories: cats
            .iter()
            .map(|&id| Category {
                id,
                name: id.to_string(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let gt = COCO::from_dataset(dataset);
    let results: Vec<Annotation> = dts
        .iter()
        .map(|d| Annotation {
            image_id: d.image_id,
            category_id: d.category_id,
            score: Some(d.score),
            bbox: (kind == IouKind::Bbox).then_some(d.bbox),
            keypoints: (kind == IouKind::Keypoints).then(|| d.keypoints.clone()),
            ..Default::default()
        })
        .collect();
    let iou = match kind {
        IouKind::Bbox => IouType::Bbox,
        IouKind::Keypoints => IouType::Keypoints,
    };
    let evaluated = gt.load_res_anns(results).and_then(|dt| {
        let mut ev = COCOeval::new(gt, dt, iou);
        ev.params.img_ids = images.clone();
        ev.params.kpt_oks_sigmas = sigmas.to_vec();
        ev.evaluate()?;
        ev.accumulate();
        ev.summarize_lines();
        Ok(ev)
    });
    let Ok(ev) = evaluated else {
        return Summary::absent();
    };
    let (Some(stats), Some(acc)) = (ev.stats(), ev.accumulated()) else {
        return Summary::absent();
    };
    // The AP rows lead the stats: all, .50, .75, then one per area range.
    let areas = ev.params.area_ranges.len();
    let s = acc.shape;
    let per_class = acc
        .cat_ids
        .iter()
        .enumerate()
        .map(|(k, &cat)| {
            let valid: Vec<f64> = (0..s.t)
                .flat_map(|t| (0..s.r).map(move |r| (t, r)))
                .map(|(t, r)| acc.precision[acc.precision_idx(t, r, k, 0, s.m - 1)])
                .filter(|&v| v > -1.0)
                .collect();
            let ap = match valid.is_empty() {
                true => -1.0,
                false => valid.iter().sum::<f64>() / valid.len() as f64,
            };
            (cat, ap)
        })
        .collect();
    Summary {
        map: stats[0],
        map50: stats[1],
        map75: stats[2],
        by_area: stats[3..3 + areas - 1].to_vec(),
        per_class,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gt(image_id: u64, x: f64) -> GtAnn {
        let keypoints = vec![x + 5.0, 10.0, 2.0, x + 15.0, 20.0, 2.0];
        GtAnn {
            image_id,
            category_id: 1,
            bbox: [x, 5.0, 20.0, 30.0],
            area: 600.0,
            iscrowd: false,
            keypoints,
            num_keypoints: 2,
        }
    }

    fn exact(g: &GtAnn) -> DtAnn {
        DtAnn {
            image_id: g.image_id,
            category_id: g.category_id,
            bbox: g.bbox,
            score: 0.9,
            keypoints: g.keypoints.clone(),
        }
    }

    /// Exact detections score 1, none score 0, and no ground truth at all is "absent"; an
    /// image without annotations still counts its detections as false positives.
    #[test]
    fn exact_missing_and_absent() {
        let gts = vec![gt(1, 0.0), gt(2, 40.0)];
        let sigmas = [0.5, 0.5];
        for kind in [IouKind::Bbox, IouKind::Keypoints] {
            let dts: Vec<DtAnn> = gts.iter().map(exact).collect();
            let s = evaluate(&gts, &dts, &[1, 2, 3], kind, &sigmas);
            assert_eq!(
                (s.map, s.map50, s.per_class.clone()),
                (1.0, 1.0, vec![(1, 1.0)])
            );
            assert_eq!(evaluate(&gts, &[], &[1, 2], kind, &sigmas).map, 0.0);
            assert_eq!(
                evaluate(&[], &dts, &[1, 2], kind, &sigmas),
                Summary::absent()
            );
            // A higher-scored false positive on image 3 (no annotations) lowers precision.
            let mut fp = exact(&gts[0]);
            (fp.image_id, fp.score) = (3, 0.95);
            let worse = evaluate(&gts, &[dts, vec![fp]].concat(), &[1, 2, 3], kind, &sigmas);
            assert!(worse.map < 1.0, "{kind:?}: {worse:?}");
        }
    }
}
