//! Our COCO evaluation against an independent implementation (`hotcoco`, verified identical to
//! pycocotools) on the real minicoco ground truth, with perturbed ground truth as predictions.

use burnpose::eval::{DtAnn, GtAnn, IouKind, evaluate};
use burnpose::loss::geometry::COCO_SIGMAS;
use hotcoco::{COCO, COCOeval, IouType};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

fn data_root() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/pose-real");
    if root.exists() {
        return Some(root);
    }
    assert!(
        std::env::var("CI").is_err(),
        "{} is missing under CI",
        root.display()
    );
    eprintln!("skipping: {} not present", root.display());
    None
}

fn load_gt(path: &Path) -> (Vec<GtAnn>, Vec<u64>) {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let images = v["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_u64().unwrap())
        .collect();
    let gts = v["annotations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let b: Vec<f64> = a["bbox"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            GtAnn {
                image_id: a["image_id"].as_u64().unwrap(),
                category_id: a["category_id"].as_u64().unwrap(),
                bbox: [b[0], b[1], b[2], b[3]],
                area: a["area"].as_f64().unwrap(),
                iscrowd: a["iscrowd"].as_u64().unwrap_or(0) == 1,
                keypoints: a["keypoints"]
                    .as_array()
                    .map(|k| k.iter().map(|x| x.as_f64().unwrap()).collect())
                    .unwrap_or_default(),
                num_keypoints: a["num_keypoints"].as_u64().unwrap_or(0) as u32,
            }
        })
        .collect();
    (gts, images)
}

/// Ground truth with noise, some misses, duplicates and false positives; keypoint detections get
/// their box from the keypoint extent as pycocotools' `loadRes` would.
fn perturbed(gts: &[GtAnn], seed: u64) -> Vec<DtAnn> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut dts = Vec::new();
    for g in gts.iter().filter(|g| !g.keypoints.is_empty()) {
        if rng.random_range(0.0..1.0) < 0.15 {
            continue;
        }
        let copies = if rng.random_range(0.0..1.0) < 0.2 {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let scale = g.area.sqrt().max(4.0) * rng.random_range(0.02..0.25);
            let keypoints: Vec<f64> = g
                .keypoints
                .chunks(3)
                .flat_map(|k| {
                    let (x, y) = if k[2] > 0.0 {
                        (k[0], k[1])
                    } else {
                        (g.bbox[0] + g.bbox[2] / 2.0, g.bbox[1] + g.bbox[3] / 2.0)
                    };
                    [
                        x + rng.random_range(-1.0..1.0) * scale,
                        y + rng.random_range(-1.0..1.0) * scale,
                        1.0,
                    ]
                })
                .collect();
            let mut r = |lo: f64, hi: f64| rng.random_range(lo..hi);
            let bbox = [
                g.bbox[0] + g.bbox[2] * r(-0.15, 0.15),
                g.bbox[1] + g.bbox[3] * r(-0.15, 0.15),
                g.bbox[2] * r(0.8, 1.2),
                g.bbox[3] * r(0.8, 1.2),
            ];
            dts.push(DtAnn {
                image_id: g.image_id,
                category_id: g.category_id,
                bbox,
                score: (rng.random_range(0.05..1.0) * 1000.0f64).round() / 1000.0,
                keypoints,
            });
        }
        if rng.random_range(0.0..1.0) < 0.3 {
            let mut fp = dts.last().unwrap().clone();
            fp.bbox[0] += 3.0 * fp.bbox[2];
            for k in fp.keypoints.chunks_mut(3) {
                k[0] += 3.0 * g.bbox[2] + 40.0;
            }
            fp.score = (rng.random_range(0.01..0.6) * 1000.0f64).round() / 1000.0;
            dts.push(fp);
        }
    }
    dts
}

fn hotcoco_stats(gt_path: &Path, dts: &[DtAnn], kind: IouType, tag: &str) -> Vec<f64> {
    let rows: Vec<Value> = dts
        .iter()
        .map(|d| match kind {
            IouType::Keypoints => json!({"image_id": d.image_id, "category_id": d.category_id, "keypoints": d.keypoints, "score": d.score}),
            _ => json!({"image_id": d.image_id, "category_id": d.category_id, "bbox": d.bbox, "score": d.score}),
        })
        .collect();
    let path = std::env::temp_dir().join(format!("burnpose-dt-{tag}-{}.json", std::process::id()));
    std::fs::write(&path, serde_json::to_string(&rows).unwrap()).unwrap();
    let gt = COCO::new(gt_path).unwrap();
    let dt = gt.load_res(&path).unwrap();
    let mut ev = COCOeval::new(gt, dt, kind);
    ev.evaluate().unwrap();
    ev.accumulate();
    ev.summarize();
    ev.stats().unwrap().to_vec()
}

fn compare(gt_path: &Path, seed: u64) {
    let (gts, images) = load_gt(gt_path);
    let dts = perturbed(&gts, seed);
    let sigmas: Vec<f64> = COCO_SIGMAS.iter().map(|&s| s as f64).collect();
    for (kind, theirs_kind, tag) in [
        (IouKind::Keypoints, IouType::Keypoints, "keypoints"),
        (IouKind::Bbox, IouType::Bbox, "bbox"),
    ] {
        let ours = evaluate(&gts, &dts, &images, kind, &sigmas);
        let theirs = hotcoco_stats(gt_path, &dts, theirs_kind, &format!("{tag}{seed}"));
        // hotcoco's stats start with the same AP rows: all, .50, .75, then per area range.
        let mut mine = vec![ours.map, ours.map50, ours.map75];
        mine.extend(&ours.by_area);
        for (i, (a, b)) in mine.iter().zip(&theirs).enumerate() {
            assert!(
                (a - b).abs() < 1e-6,
                "{tag} stat {i}: ours {a} vs hotcoco {b}"
            );
        }
        assert!(
            ours.map > 0.05 && ours.map < 0.95,
            "{tag}: test predictions should be neither useless nor perfect: {}",
            ours.map
        );
    }
}

#[test]
fn keypoint_and_box_map_equal_hotcoco_on_minicoco() {
    let Some(root) = data_root() else { return };
    for split in ["val2017", "train2017"] {
        let path = root.join(format!(
            "pose_minicoco/annotations/person_keypoints_{split}.json"
        ));
        for seed in [1, 2, 3] {
            compare(&path, seed);
        }
    }
    compare(&root.join("coco/test_coco.json"), 4);
}
