//! Validation of a model on the val source: one-to-one predictions (or one-to-many + NMS),
//! mapped back to original image pixels and scored COCO-style (box mAP and, for pose, OKS mAP),
//! or scored as Ultralytics' `val` scores them (`train.val_metric`).

use crate::config::{Config, ValMetric};
use crate::data::{Batch, DataError, Frame, Source};
use crate::eval::{DtAnn, GtAnn, IouKind, Select, detect, evaluate};
use crate::loss::E2eLoss;
use crate::model::Yolo;

#[derive(Clone, Debug, PartialEq)]
pub struct Metrics {
    pub box_map50: f64,
    pub box_map: f64,
    pub pose_map50: f64,
    pub pose_map: f64,
    /// Box and pose mAP50-95 per class with ground truth in the val split (pose: -1 for
    /// detection).
    pub per_class: Vec<ClassMap>,
    /// Ground-truth objects the metric counted (Ultralytics' "Instances"): under COCOeval's the
    /// non-crowd ones; under Ultralytics' those it would read.
    pub objects: usize,
    /// What was scored: every detection and ground truth (original pixels) and the image ids.
    pub detections: Vec<DtAnn>,
    pub truth: Vec<GtAnn>,
    pub image_ids: Vec<u64>,
}

/// One class's mAP50-95.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ClassMap {
    pub class: usize,
    pub box_map: f64,
    pub pose_map: f64,
}

/// Confidence floor and per-image cap of validation (Ultralytics defaults).
pub const CONF: f32 = 0.001;
pub const MAX_DET: usize = 300;
/// NMS IoU threshold of the one-to-many path.
pub const IOU: f32 = 0.7;

/// Scores `model` (an inference copy, e.g. the EMA) on every image of `val`.
pub fn validate(
    model: &Yolo,
    val: &Source,
    cfg: &Config,
    loss: &E2eLoss,
) -> Result<Metrics, DataError> {
    let device = model.backbone.l0.conv.weight.val().device();
    let nk = cfg.model.keypoints();
    let select = Select {
        nk,
        nms: cfg.train.val_nms,
        max_det: MAX_DET,
        conf: CONF,
        iou: IOU,
    };
    let mut gts: Vec<GtAnn> = Vec::new();
    let mut dts: Vec<DtAnn> = Vec::new();
    let mut ids = Vec::new();
    let sigmas: Vec<f32> = loss.sigmas.iter().copied().take(nk).collect();
    // Ultralytics reads a COCO keypoints file through its converter, which leaves out people
    // without a labelled keypoint (and crowds, which our samples never hold).
    let labelled_only = nk > 0 && matches!(val.dataset, crate::data::source::Dataset::Coco(_));
    let mut tally = (cfg.train.val_metric == ValMetric::Ultralytics)
        .then(|| crate::eval::ultralytics::Tally::new(&sigmas, labelled_only));
    // Ultralytics' batches: twice the training batch, rectangular (its trainer's and its
    // `val`'s default), so each image is padded only to its batch's shape.
    let chunk = (2 * cfg.train.batch).max(1);
    let stride = *crate::model::STRIDES.last().expect("strides") as u32;
    for batch in val.rect_batches(chunk, stride)? {
        let (part, canvas) = (batch.images, batch.canvas);
        let mut samples = Vec::new();
        let mut frames: Vec<Frame> = Vec::new();
        let mut letterboxed = Vec::new();
        for &i in &part {
            let (s, f, truth) = val.sample_rect_with_truth(i, canvas)?;
            if tally.is_some() {
                // Ultralytics scores in the letterboxed pixels the network saw.
                letterboxed.push(s.instances.clone());
            }
            samples.push(s);
            frames.push(f);
            gts.extend(truth);
            ids.push(val.image_id(i));
        }
        let batch = Batch::collate(samples);
        let per_image = detect(model, batch.images_f32(&device), &select);
        for (j, dets) in per_image.into_iter().enumerate() {
            if let Some(t) = &mut tally {
                t.add(&letterboxed[j], &dets);
            }
            let frame = frames[j];
            for d in dets {
                let (x1, y1) = frame.to_original(d.bbox[0], d.bbox[1]);
                let (x2, y2) = frame.to_original(d.bbox[2], d.bbox[3]);
                let keypoints = d
                    .keypoints
                    .iter()
                    .flat_map(|k| {
                        let (x, y) = frame.to_original(k[0], k[1]);
                        [x, y, k[2] as f64]
                    })
                    .collect();
                dts.push(DtAnn {
                    image_id: val.image_id(part[j]),
                    category_id: d.class as u64 + 1,
                    bbox: [x1, y1, x2 - x1, y2 - y1],
                    score: d.score as f64,
                    keypoints,
                });
            }
        }
    }
    let sigmas: Vec<f64> = sigmas.iter().map(|&s| s as f64).collect();
    let (boxes, pose) = match &tally {
        Some(t) => (t.boxes(), t.pose()),
        None => (
            evaluate(&gts, &dts, &ids, IouKind::Bbox, &sigmas),
            match nk > 0 {
                true => evaluate(&gts, &dts, &ids, IouKind::Keypoints, &sigmas),
                false => crate::eval::Summary::absent(),
            },
        ),
    };
    let per_class = boxes
        .per_class
        .iter()
        .map(|&(cat, box_map)| ClassMap {
            class: cat as usize - 1,
            box_map,
            pose_map: pose
                .per_class
                .iter()
                .find(|(c, _)| *c == cat)
                .map_or(-1.0, |p| p.1),
        })
        .collect();
    let objects = match &tally {
        Some(t) => t.objects(),
        None => gts.iter().filter(|g| !g.iscrowd).count(),
    };
    Ok(Metrics {
        objects,
        box_map50: boxes.map50,
        box_map: boxes.map,
        pose_map50: pose.map50,
        pose_map: pose.map,
        per_class,
        detections: dts,
        truth: gts,
        image_ids: ids,
    })
}

/// Per-class lines (`class 0 (person): box mAP50-95 …`) for a model with several classes; empty
/// for one class, whose numbers are the overall ones.
pub fn per_class_lines(per_class: &[ClassMap], names: Option<&[String]>, nc: usize) -> String {
    if nc < 2 {
        return String::new();
    }
    let mut out = String::new();
    for c in per_class {
        let name = names
            .and_then(|n| n.get(c.class))
            .map_or(String::new(), |n| format!(" ({n})"));
        out += &format!("  class {}{name}: box mAP50-95 {:.4}", c.class, c.box_map);
        if c.pose_map >= 0.0 {
            out += &format!(" | pose mAP50-95 {:.4}", c.pose_map);
        }
        out.push('\n');
    }
    out
}

/// What `val --save-json` writes: the detections as a COCO results file (`image_id`,
/// `category_id` = class + 1, `bbox` as `[x, y, w, h]`, `score`, and for pose `keypoints` as
/// `x, y, confidence` triples), and the ground truth it was scored against as a COCO annotation
/// file, so that pycocotools or hotcoco can score the same predictions.
pub fn coco_json(
    m: &Metrics,
    nc: usize,
    names: Option<&[String]>,
) -> (serde_json::Value, serde_json::Value) {
    use serde_json::json;
    let results: Vec<serde_json::Value> = m
        .detections
        .iter()
        .map(|d| {
            let mut r = json!({"image_id": d.image_id, "category_id": d.category_id,
                "bbox": d.bbox, "score": d.score});
            if !d.keypoints.is_empty() {
                r["keypoints"] = json!(d.keypoints);
            }
            r
        })
        .collect();
    let annotations: Vec<serde_json::Value> = m
        .truth
        .iter()
        .enumerate()
        .map(|(n, g)| {
            json!({"id": n + 1, "image_id": g.image_id, "category_id": g.category_id,
                "bbox": g.bbox, "area": g.area, "iscrowd": u8::from(g.iscrowd),
                "keypoints": g.keypoints, "num_keypoints": g.num_keypoints})
        })
        .collect();
    let images: Vec<serde_json::Value> = m.image_ids.iter().map(|id| json!({"id": id})).collect();
    let categories: Vec<serde_json::Value> = (0..nc)
        .map(|c| {
            let name = names
                .and_then(|n| n.get(c).cloned())
                .unwrap_or(c.to_string());
            json!({"id": c + 1, "name": name})
        })
        .collect();
    let truth = json!({"images": images, "annotations": annotations, "categories": categories});
    (json!(results), truth)
}
