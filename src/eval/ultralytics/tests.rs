//! Against Ultralytics 8.4.190 itself: `tests/fixtures/ultralytics_metric.json`, written by
//! `benches/peer/metric_fixtures.py` (its `PoseValidator._process_batch` and `PoseMetrics` on
//! seeded scenes: 17 keypoints with COCO sigmas and 4 with 1/4 each).

use super::*;
use serde_json::Value;

fn fixture() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/ultralytics_metric.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("json")
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

fn rows<const N: usize>(v: &Value) -> Vec<[f32; N]> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|r| floats(r).try_into().expect("row length"))
        .collect()
}

fn flags(v: &Value) -> Vec<[bool; 10]> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|r| std::array::from_fn(|t| r[t].as_i64() == Some(1)))
        .collect()
}

fn classes(v: &Value) -> Vec<usize> {
    floats(v).into_iter().map(|c| c as usize).collect()
}

struct Image {
    truth: Vec<Instance>,
    dets: Vec<Detection>,
}

fn image(v: &Value) -> Image {
    let kpts = |k: &Value| -> Vec<Vec<[f32; 3]>> {
        k.as_array().expect("array").iter().map(rows::<3>).collect()
    };
    let (gk, dk) = (kpts(&v["gt_kpts"]), kpts(&v["pred_kpts"]));
    let truth = rows::<4>(&v["gt_boxes"])
        .into_iter()
        .zip(classes(&v["gt_cls"]))
        .zip(gk)
        .map(|((bbox, class), keypoints)| Instance {
            class,
            bbox,
            keypoints,
        })
        .collect();
    let dets = rows::<4>(&v["pred_boxes"])
        .into_iter()
        .zip(classes(&v["pred_cls"]))
        .zip(floats(&v["conf"]))
        .zip(dk)
        .map(|(((bbox, class), score), keypoints)| Detection {
            bbox,
            score,
            class,
            keypoints,
        })
        .collect();
    Image { truth, dets }
}

fn cases() -> Vec<Value> {
    fixture()["cases"].as_array().expect("cases").clone()
}

#[test]
fn thresholds_are_torchs_linspace() {
    let want = floats(&fixture()["iouv"]);
    assert_eq!(thresholds().to_vec(), want);
}

/// IoU and OKS as Ultralytics computes them (FP32; OKS's exp and sum may round differently).
#[test]
fn overlaps_match_ultralytics() {
    let mut compared = 0;
    for case in cases() {
        let nk = case["nk"].as_u64().expect("nk") as usize;
        let sigmas = crate::loss::geometry::sigmas(nk);
        for v in case["images"].as_array().expect("images") {
            let Some(want_iou) = v.get("iou") else {
                continue;
            };
            let im = image(v);
            let gb: Vec<[f32; 4]> = im.truth.iter().map(|t| t.bbox).collect();
            let db: Vec<[f32; 4]> = im.dets.iter().map(|d| d.bbox).collect();
            let area: Vec<f32> = gb
                .iter()
                .map(|b| (b[2] - b[0]) * (b[3] - b[1]) * 0.53)
                .collect();
            let gk: Vec<&[[f32; 3]]> = im.truth.iter().map(|t| t.keypoints.as_slice()).collect();
            let dk: Vec<&[[f32; 3]]> = im.dets.iter().map(|d| d.keypoints.as_slice()).collect();
            for (ours, want, tol) in [
                (box_iou(&gb, &db), want_iou, 0.0),
                (kpt_iou(&gk, &dk, &area, &sigmas), &v["oks"], 1e-6),
            ] {
                for (o, w) in ours.iter().zip(want.as_array().expect("rows")) {
                    for (a, b) in o.iter().zip(floats(w)) {
                        assert!((a - b).abs() <= tol, "{a} vs {b}");
                        compared += 1;
                    }
                }
            }
        }
    }
    assert!(compared > 200, "{compared}");
}

/// The greedy matching on Ultralytics' own overlaps gives its true-positive tables exactly.
#[test]
fn matching_matches_ultralytics() {
    let th = thresholds();
    let mut positives = 0;
    for case in cases() {
        for v in case["images"].as_array().expect("images") {
            let (dc, gc) = (classes(&v["pred_cls"]), classes(&v["gt_cls"]));
            for (overlap, want) in [("iou", "tp"), ("oks", "tp_p")] {
                let want = flags(&v[want]);
                let ours = match v.get(overlap) {
                    Some(m) => {
                        let m: Vec<Vec<f32>> =
                            m.as_array().expect("rows").iter().map(floats).collect();
                        match_predictions(&dc, &gc, &m, &th)
                    }
                    None => vec![[false; 10]; dc.len()],
                };
                assert_eq!(ours, want);
                positives += want.iter().flatten().filter(|&&f| f).count();
            }
        }
    }
    assert!(positives > 100, "{positives}");
}

/// Whole scenes from the raw boxes and keypoints: per-class AP and the summary mAPs.
#[test]
fn summaries_match_ultralytics() {
    for case in cases() {
        let nk = case["nk"].as_u64().expect("nk") as usize;
        let mut tally = Tally::new(&crate::loss::geometry::sigmas(nk), false);
        for v in case["images"].as_array().expect("images") {
            let im = image(v);
            tally.add(&im.truth, &im.dets);
        }
        for (ours, want) in [
            (tally.boxes(), &case["summary"]["box"]),
            (tally.pose(), &case["summary"]["pose"]),
        ] {
            let close = |a: f64, b: &Value| (a - b.as_f64().expect("number")).abs() < 1e-12;
            assert!(close(ours.map50, &want["map50"]), "{ours:?} vs {want}");
            assert!(close(ours.map75, &want["map75"]), "{ours:?} vs {want}");
            assert!(close(ours.map, &want["map"]), "{ours:?} vs {want}");
            let want_classes: Vec<u64> = want["classes"]
                .as_array()
                .expect("classes")
                .iter()
                .map(|c| c.as_u64().expect("class") + 1)
                .collect();
            let ours_classes: Vec<u64> = ours.per_class.iter().map(|p| p.0).collect();
            assert_eq!(ours_classes, want_classes);
            for ((_, ap), row) in ours
                .per_class
                .iter()
                .zip(want["ap"].as_array().expect("ap"))
            {
                let mean = row
                    .as_array()
                    .expect("row")
                    .iter()
                    .map(|x| x.as_f64().expect("ap"))
                    .sum::<f64>()
                    / 10.0;
                assert!((ap - mean).abs() < 1e-12, "{ap} vs {mean}");
            }
        }
    }
}

/// The scenes are not degenerate: a class without detections scores 0, and the metric is not
/// COCOeval's (on the same boxes the two differ).
#[test]
fn scenes_exercise_the_rules() {
    let case = &cases()[0];
    let ap = case["summary"]["box"]["ap"].as_array().expect("ap").clone();
    assert!(ap.iter().any(|r| r[0].as_f64() == Some(0.0)));
    assert!(ap.iter().any(|r| r[0].as_f64().expect("ap") > 0.3));
    let mut tally = Tally::new(&[], false);
    let (mut gts, mut dts, mut ids) = (Vec::new(), Vec::new(), Vec::new());
    for (n, v) in case["images"]
        .as_array()
        .expect("images")
        .iter()
        .enumerate()
    {
        let im = image(v);
        tally.add(&im.truth, &im.dets);
        ids.push(n as u64);
        let xywh = |b: [f32; 4]| {
            [
                b[0] as f64,
                b[1] as f64,
                (b[2] - b[0]) as f64,
                (b[3] - b[1]) as f64,
            ]
        };
        for t in &im.truth {
            let b = xywh(t.bbox);
            gts.push(super::super::GtAnn {
                image_id: n as u64,
                category_id: t.class as u64 + 1,
                bbox: b,
                area: b[2] * b[3],
                iscrowd: false,
                keypoints: Vec::new(),
                num_keypoints: 0,
            });
        }
        for d in &im.dets {
            dts.push(super::super::DtAnn {
                image_id: n as u64,
                category_id: d.class as u64 + 1,
                bbox: xywh(d.bbox),
                score: d.score as f64,
                keypoints: Vec::new(),
            });
        }
    }
    let coco = super::super::evaluate(&gts, &dts, &ids, super::super::IouKind::Bbox, &[]);
    let ours = tally.boxes();
    assert!(ours.map > 0.05 && coco.map > 0.05);
    assert_ne!(ours.map, coco.map);
}

/// Read from a COCO keypoints file, a person without a labelled keypoint is no ground truth (as
/// Ultralytics' converter leaves it out): a detection of it is a false positive, not a miss found.
#[test]
fn unlabelled_people_are_left_out_when_asked() {
    let person = |x: f32, v: f32| Instance {
        class: 0,
        bbox: [x, 10.0, x + 40.0, 90.0],
        keypoints: vec![[x + 20.0, 30.0, v], [x + 20.0, 60.0, v]],
    };
    let truth = [person(0.0, 2.0), person(100.0, 0.0)];
    let found = |x: f32, score: f32| Detection {
        bbox: [x, 10.0, x + 40.0, 90.0],
        score,
        class: 0,
        keypoints: vec![[x + 20.0, 30.0, 0.9], [x + 20.0, 60.0, 0.9]],
    };
    // The unlabelled person's detection ranks first.
    let dets = [found(100.0, 0.9), found(0.0, 0.8)];
    let sigmas = [0.5, 0.5];
    let (mut all, mut labelled) = (Tally::new(&sigmas, false), Tally::new(&sigmas, true));
    all.add(&truth, &dets);
    labelled.add(&truth, &dets);
    assert_eq!((all.objects(), labelled.objects()), (2, 1));
    // Both people found: a perfect AP when both count (0.995 under Ultralytics' interpolation,
    // whose sentinel drops precision to 0 at recall 1); with one, the first-ranked detection is
    // a false positive and AP drops.
    assert!(
        (all.boxes().map50 - 0.995).abs() < 1e-12,
        "{:?}",
        all.boxes()
    );
    assert!(labelled.boxes().map50 < 0.9, "{:?}", labelled.boxes());
}
