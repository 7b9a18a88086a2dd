//! Our COCO evaluation (`eval::evaluate`: hotcoco fed in memory from our annotations) against
//! hotcoco reading the same ground truth and results as JSON files, the way pycocotools reads
//! them, on the real minicoco ground truth with perturbed ground truth as predictions: checks
//! what we hand the evaluator (areas, crowds, keypoint results' extent, images without
//! annotations, categories) and what we read back (AP rows, per class).

mod common;

use burnpose::eval::{DtAnn, GtAnn, IouKind, evaluate};
use burnpose::loss::geometry::COCO_SIGMAS;
use hotcoco::{COCO, COCOeval, IouType};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

fn data_root() -> Option<PathBuf> {
    common::shared_data("pose-real")
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

/// Hotcoco's summary stats; `cat`: one category only (pycocotools' `params.catIds = [c]`).
fn hotcoco_eval(
    gt_path: &Path,
    dts: &[DtAnn],
    kind: IouType,
    cat: Option<u64>,
    tag: &str,
) -> Vec<f64> {
    // Keypoint results without a box, as pycocotools' `loadRes` then takes the keypoint extent.
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
    if let Some(cat) = cat {
        ev.params.cat_ids = vec![cat];
    }
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
        let theirs = hotcoco_eval(gt_path, &dts, theirs_kind, None, &format!("{tag}{seed}"));
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

/// A two-class pose dataset (the built-in images written as YOLO, every other object made
/// class 1) read by burnpose: its ground truth carries category class + 1, and burnpose's mAP,
/// overall and per class, equals hotcoco's on the same predictions.
#[test]
fn two_class_pose_dataset_scores_as_hotcoco() {
    use burnpose::config::Config;
    use burnpose::data::{BuiltinDataset, Source, export::write_yolo};
    let dir = std::env::temp_dir().join(format!("burnpose-two-class-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let yaml = write_yolo(
        &BuiltinDataset::new(2, 160, 1),
        &BuiltinDataset::new(12, 160, 2),
        &dir,
    )
    .unwrap();
    let mut flipped = 0;
    for entry in std::fs::read_dir(dir.join("labels/val")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let rows: Vec<String> = text
            .lines()
            .map(|row| {
                flipped += 1;
                match flipped % 2 {
                    0 => format!("1{}", &row[1..]),
                    _ => row.to_string(),
                }
            })
            .collect();
        std::fs::write(&path, rows.join("\n") + "\n").unwrap();
    }
    let text = std::fs::read_to_string(&yaml).unwrap();
    std::fs::write(
        &yaml,
        text.replace("  0: person\n", "  0: person\n  1: robot\n"),
    )
    .unwrap();
    let cfg = Config::parse(
        &format!(
            "[model]\nnc = 2\n[data]\nsource = \"yolo\"\npath = {:?}\nimgsz = 160\n",
            yaml.to_str().unwrap()
        ),
        Path::new("two.toml"),
    )
    .unwrap();
    let (_, val, _) = Source::open(&cfg, Path::new("two.toml")).unwrap();
    let mut gts = Vec::new();
    let mut images = Vec::new();
    let mut json_images = Vec::new();
    for i in 0..val.len() {
        let (s, _, truth) = val.sample_with_truth(i).unwrap();
        let (w, h) = s.image.dimensions();
        images.push(val.image_id(i));
        json_images.push(json!({"id": val.image_id(i), "width": w, "height": h, "file_name": format!("{i}.png")}));
        gts.extend(truth);
    }
    let cats: Vec<u64> = gts.iter().map(|g| g.category_id).collect();
    assert!(
        cats.contains(&1) && cats.contains(&2) && cats.iter().all(|&c| c == 1 || c == 2),
        "category ids follow the class: {cats:?}"
    );
    let annotations: Vec<Value> = gts
        .iter()
        .enumerate()
        .map(|(n, g)| {
            json!({"id": n + 1, "image_id": g.image_id, "category_id": g.category_id, "bbox": g.bbox,
                   "area": g.area, "iscrowd": 0, "keypoints": g.keypoints, "num_keypoints": g.num_keypoints})
        })
        .collect();
    let gt_path = dir.join("gt.json");
    let gt_json = json!({"images": json_images, "annotations": annotations,
        "categories": [{"id": 1, "name": "person"}, {"id": 2, "name": "robot"}]});
    std::fs::write(&gt_path, gt_json.to_string()).unwrap();
    let sigmas: Vec<f64> = COCO_SIGMAS.iter().map(|&s| s as f64).collect();
    for seed in [5, 6] {
        let mut dts = perturbed(&gts, seed);
        // Some detections of the wrong class: they must not match the other class's truth.
        for d in dts.iter_mut().step_by(7) {
            d.category_id = 3 - d.category_id;
        }
        for (kind, theirs_kind, tag) in [
            (IouKind::Keypoints, IouType::Keypoints, "keypoints"),
            (IouKind::Bbox, IouType::Bbox, "bbox"),
        ] {
            let ours = evaluate(&gts, &dts, &images, kind, &sigmas);
            let theirs = hotcoco_eval(
                &gt_path,
                &dts,
                theirs_kind,
                None,
                &format!("two{tag}{seed}"),
            );
            assert!(
                (ours.map - theirs[0]).abs() < 1e-6,
                "{tag}: {} vs {}",
                ours.map,
                theirs[0]
            );
            assert!((ours.map50 - theirs[1]).abs() < 1e-6, "{tag} AP50");
            assert_eq!(ours.per_class.len(), 2);
            for &(cat, ap) in &ours.per_class {
                let want = hotcoco_eval(
                    &gt_path,
                    &dts,
                    theirs_kind,
                    Some(cat),
                    &format!("c{cat}{tag}{seed}"),
                )[0];
                assert!(
                    (ap - want).abs() < 1e-6,
                    "{tag} class {cat}: ours {ap} vs hotcoco {want}"
                );
            }
            assert!(
                ours.per_class[0].1 != ours.per_class[1].1,
                "{tag}: per-class APs should differ on this data: {:?}",
                ours.per_class
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `val --save-json`: hotcoco scores the written predictions against the written ground truth
/// and gets the box and pose mAP50-95 that `val` printed.
#[test]
fn saved_json_scores_as_val_printed() {
    let dir = std::env::temp_dir().join(format!("burnpose-savejson-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // Four built-in images written as YOLO, validated on the same images (no augmentation), so a
    // few epochs at 128 px find some of them.
    let yaml = burnpose::data::export::write_yolo(
        &burnpose::data::BuiltinDataset::new(4, 128, 0),
        &burnpose::data::BuiltinDataset::new(1, 128, 1),
        &dir.join("data"),
    )
    .unwrap();
    let text = std::fs::read_to_string(&yaml).unwrap();
    std::fs::write(&yaml, text.replace("val: images/val", "val: images/train")).unwrap();
    let cfg = dir.join("tiny.toml");
    std::fs::write(
        &cfg,
        format!(
            "[data]\nsource = \"yolo\"\npath = {:?}\nimgsz = 128\nworkers = 0\n[augment]\nmosaic = 0.0\ntranslate = 0.0\nscale = 0.0\nfliplr = 0.0\nhsv_h = 0.0\nhsv_s = 0.0\nhsv_v = 0.0\n[train]\nepochs = 5\nbatch = 2\nnbs = 2\n[optim]\nwarmup_epochs = 1.0\n[device]\nkind = \"cpu\"\n[output]\ndir = {:?}\nname = \"fit\"\n",
            yaml.to_str().unwrap(),
            dir.join("runs").to_str().unwrap()
        ),
    )
    .unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_burnpose"))
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{text}");
        text
    };
    run(&["fit", cfg.to_str().unwrap()]);
    let ckpt = dir.join("runs/fit/last.safetensors");
    let json = dir.join("json");
    let text = run(&[
        "val",
        cfg.to_str().unwrap(),
        "--checkpoint",
        ckpt.to_str().unwrap(),
        "--save-json",
        json.to_str().unwrap(),
    ]);
    let printed = |key: &str| -> f64 {
        let line = text.lines().find(|l| l.starts_with("box mAP50")).unwrap();
        let part = line
            .split(key)
            .nth(1)
            .unwrap_or_else(|| panic!("{key} in {line}"));
        // `<mAP50> mAP50-95 <mAP50-95>`
        part.split_whitespace().nth(2).unwrap().parse().unwrap()
    };
    let (box_map, pose_map) = (printed("box mAP50 "), printed("pose mAP50 "));
    let gt = json.join("ground_truth.json");
    let dts: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(json.join("predictions.json")).unwrap())
            .unwrap();
    assert!(!dts.is_empty(), "no detections written");
    for (kind, want) in [(IouType::Bbox, box_map), (IouType::Keypoints, pose_map)] {
        let coco = COCO::new(&gt).unwrap();
        let results = coco.load_res(&json.join("predictions.json")).unwrap();
        let mut ev = COCOeval::new(coco, results, kind);
        ev.evaluate().unwrap();
        ev.accumulate();
        ev.summarize();
        let got = ev.stats().unwrap()[0];
        assert_eq!(
            format!("{got:.4}"),
            format!("{want:.4}"),
            "{kind:?}: {text}"
        );
    }
    assert!(
        box_map > 0.0,
        "the test model should find something: {text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
