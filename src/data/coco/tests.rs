use super::*;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("burnpose-coco-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("img")).unwrap();
    dir
}

fn write_image(path: &Path) {
    image::RgbImage::from_pixel(8, 6, image::Rgb([1, 2, 3]))
        .save(path)
        .unwrap();
}

const JSON: &str = r#"{"images": [{"id": 1, "file_name": "a.png"}, {"id": 2, "file_name": "b.png"}],
 "annotations": [{"id": 7, "image_id": 1, "bbox": [1, 1, 4, 3], "keypoints": [2, 2, 2, 0, 0, 0], "num_keypoints": 1, "category_id": 1}]}"#;

#[test]
fn loads_records_and_instances() {
    let dir = scratch("ok");
    write_image(&dir.join("img/a.png"));
    write_image(&dir.join("img/b.png"));
    std::fs::write(dir.join("ann.json"), JSON).unwrap();
    let (ds, skipped) =
        CocoDataset::from_files(&dir.join("ann.json"), &dir.join("img"), 2, false).unwrap();
    assert_eq!((ds.len(), skipped), (2, 0));
    let s = ds.get(0).unwrap();
    assert_eq!(s.image.dimensions(), (8, 6));
    assert_eq!(s.instances[0].bbox, [1.0, 1.0, 5.0, 4.0]);
    assert_eq!(
        s.instances[0].keypoints,
        vec![[2.0, 2.0, 2.0], [0.0, 0.0, 0.0]]
    );
    assert!(ds.get(1).unwrap().instances.is_empty());
}

#[test]
fn missing_image_names_json_and_file() {
    let dir = scratch("missing");
    write_image(&dir.join("img/a.png"));
    std::fs::write(dir.join("ann.json"), JSON).unwrap();
    let e = CocoDataset::from_files(&dir.join("ann.json"), &dir.join("img"), 2, false)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("ann.json") && e.contains("b.png") && e.contains("image id 2"),
        "{e}"
    );
    let (ds, skipped) =
        CocoDataset::from_files(&dir.join("ann.json"), &dir.join("img"), 2, true).unwrap();
    assert_eq!((ds.len(), skipped), (1, 1));
}

#[test]
fn wrong_keypoint_count_names_annotation() {
    let dir = scratch("kpts");
    write_image(&dir.join("img/a.png"));
    write_image(&dir.join("img/b.png"));
    std::fs::write(dir.join("ann.json"), JSON).unwrap();
    let e = CocoDataset::from_files(&dir.join("ann.json"), &dir.join("img"), 17, false)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("annotation 7") && e.contains("expected 51"),
        "{e}"
    );
}

#[test]
fn corrupt_image_and_json_are_named() {
    let dir = scratch("corrupt");
    std::fs::write(dir.join("img/a.png"), b"not a png").unwrap();
    write_image(&dir.join("img/b.png"));
    std::fs::write(dir.join("ann.json"), JSON).unwrap();
    let e = CocoDataset::from_files(&dir.join("ann.json"), &dir.join("img"), 2, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("a.png"), "{e}");
    let (ds, skipped) =
        CocoDataset::from_files(&dir.join("ann.json"), &dir.join("img"), 2, true).unwrap();
    assert_eq!((ds.len(), skipped), (1, 1));
    // A valid header with a broken body is found when decoded.
    let mut bytes = std::fs::read(dir.join("img/b.png")).unwrap();
    bytes.truncate(bytes.len() / 2);
    std::fs::write(dir.join("img/b.png"), bytes).unwrap();
    let e = ds.get(0).unwrap_err().to_string();
    assert!(e.contains("b.png"), "{e}");
    std::fs::write(dir.join("bad.json"), "{\"images\": [").unwrap();
    let e = CocoDataset::from_files(&dir.join("bad.json"), &dir.join("img"), 2, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("bad.json"), "{e}");
}

#[test]
fn shared_minicoco_loads() {
    let Some(root) = crate::data::shared_test_data("pose-real/pose_minicoco") else {
        return;
    };
    let (train, skipped) = CocoDataset::open(&root, "train2017", 17, false).unwrap();
    assert_eq!((train.len(), skipped), (30, 0));
    let anns: usize = train.records.iter().map(|r| r.annotations.len()).sum();
    assert_eq!(anns, 87);
}

#[test]
fn other_categories_than_person_are_errors() {
    let dir = scratch("category");
    write_image(&dir.join("img/a.png"));
    write_image(&dir.join("img/b.png"));
    std::fs::write(
        dir.join("ann.json"),
        JSON.replace("\"category_id\": 1", "\"category_id\": 3"),
    )
    .unwrap();
    let e = CocoDataset::from_files(&dir.join("ann.json"), &dir.join("img"), 2, false)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("ann.json: annotation 7: category_id 3") && e.contains("person"),
        "{e}"
    );
    let (ds, skipped) =
        CocoDataset::from_files(&dir.join("ann.json"), &dir.join("img"), 2, true).unwrap();
    assert_eq!((ds.len(), skipped), (2, 1));
}

/// A CVAT "COCO Keypoints 1.0" export as written: split `default`, `segmentation` lists, an
/// image without annotations (a background), a crowd annotation (not trained on), an annotation
/// with `num_keypoints = 0` (its box trains, every keypoint missing) and no `area`/`iscrowd` keys
/// on one annotation.
#[test]
fn cvat_keypoints_export_loads() {
    let dir = scratch("cvat");
    let images = dir.join("images/default");
    std::fs::create_dir_all(&images).unwrap();
    std::fs::create_dir_all(dir.join("annotations")).unwrap();
    for name in ["p1.png", "p2.png", "empty.png"] {
        write_image(&images.join(name));
    }
    let json = r#"{"licenses": [{"name": "", "id": 0, "url": ""}], "info": {"contributor": ""},
 "categories": [{"id": 1, "name": "person", "supercategory": "", "keypoints": ["a", "b"], "skeleton": [[1, 2]]}],
 "images": [{"id": 1, "width": 8, "height": 6, "file_name": "p1.png", "license": 0, "flickr_url": "", "coco_url": "", "date_captured": 0},
            {"id": 2, "width": 8, "height": 6, "file_name": "p2.png"},
            {"id": 3, "width": 8, "height": 6, "file_name": "empty.png"}],
 "annotations": [
  {"id": 1, "image_id": 1, "category_id": 1, "segmentation": [], "area": 12.0, "bbox": [1, 1, 4, 3], "iscrowd": 0, "attributes": {"occluded": false}, "keypoints": [2, 2, 2, 3, 3, 1], "num_keypoints": 2},
  {"id": 2, "image_id": 1, "category_id": 1, "segmentation": {"counts": [0, 4], "size": [6, 8]}, "area": 4.0, "bbox": [0, 0, 2, 2], "iscrowd": 1, "keypoints": [0, 0, 0, 0, 0, 0], "num_keypoints": 0},
  {"id": 3, "image_id": 2, "category_id": 1, "bbox": [2, 1, 3, 4], "keypoints": [0, 0, 0, 0, 0, 0], "num_keypoints": 0}]}"#;
    std::fs::write(dir.join("annotations/person_keypoints_default.json"), json).unwrap();
    let (ds, skipped) = CocoDataset::open(&dir, "default", 2, false).unwrap();
    assert_eq!((ds.len(), skipped), (3, 0));
    let first = ds.get(0).unwrap();
    assert_eq!(
        first.instances.len(),
        1,
        "the crowd annotation is not trained on"
    );
    assert_eq!(
        first.instances[0].keypoints,
        vec![[2.0, 2.0, 2.0], [3.0, 3.0, 1.0]]
    );
    let second = ds.get(1).unwrap();
    assert_eq!(second.instances.len(), 1);
    assert_eq!(second.instances[0].bbox, [2.0, 1.0, 5.0, 5.0]);
    assert!(second.instances[0].keypoints.iter().all(|k| k[2] == 0.0));
    assert!(
        ds.get(2).unwrap().instances.is_empty(),
        "a background image"
    );
    // `predict --split default` sees the same images, backgrounds included.
    let paths: Vec<_> = ds.records.iter().map(|r| r.path.clone()).collect();
    assert_eq!(CocoDataset::split_images(&dir, "default").unwrap(), paths);
}

/// `data.train_split` and `data.val_split` pick the annotation files a fit opens.
#[test]
fn config_splits_choose_the_annotation_files() {
    let dir = scratch("splits");
    for split in ["default", "holdout"] {
        let images = dir.join("images").join(split);
        std::fs::create_dir_all(&images).unwrap();
        write_image(&images.join("a.png"));
        write_image(&images.join("b.png"));
    }
    std::fs::create_dir_all(dir.join("annotations")).unwrap();
    let one = r#"{"images": [{"id": 1, "file_name": "a.png"}], "annotations": []}"#;
    let two = r#"{"images": [{"id": 1, "file_name": "a.png"}, {"id": 2, "file_name": "b.png"}], "annotations": []}"#;
    std::fs::write(dir.join("annotations/person_keypoints_default.json"), one).unwrap();
    std::fs::write(dir.join("annotations/person_keypoints_holdout.json"), two).unwrap();
    let text = format!(
        "[model]\nkpt_shape = [2, 3]\n[data]\nsource = \"coco\"\npath = \"{}\"\ntrain_split = \"default\"\nval_split = \"holdout\"\ncache = \"none\"\n",
        dir.display()
    );
    let cfg = crate::config::Config::parse(&text, Path::new("c.toml")).unwrap();
    let (train, val, _) = crate::data::source::Source::open(&cfg, Path::new("c.toml")).unwrap();
    assert_eq!((train.len(), val.len()), (1, 2));
}

/// A split named as a `.json` file: Label Studio's `result.json`, whose `file_name`s (with the
/// `images/` prefix) are relative to its folder; category 0, no keypoints (a detection export).
#[test]
fn a_json_split_reads_names_beside_the_file() {
    let dir = scratch("labelstudio");
    let export = dir.join("export");
    std::fs::create_dir_all(export.join("images")).unwrap();
    write_image(&export.join("images/1a2b-cat.png"));
    let json = r#"{"images": [{"width": 8, "height": 6, "id": 0, "file_name": "images/1a2b-cat.png"}],
 "categories": [{"id": 0, "name": "cat"}],
 "annotations": [{"id": 0, "image_id": 0, "category_id": 0, "segmentation": [], "bbox": [1, 1, 4, 3], "ignore": 0, "iscrowd": 0, "area": 12}]}"#;
    std::fs::write(export.join("result.json"), json).unwrap();
    let (ds, skipped) = CocoDataset::open(&dir, "export/result.json", 0, false).unwrap();
    assert_eq!((ds.len(), skipped), (1, 0));
    assert_eq!(ds.records[0].path, export.join("images/1a2b-cat.png"));
    let sample = ds.get(0).unwrap();
    assert_eq!(sample.instances.len(), 1);
    assert_eq!(sample.instances[0].bbox, [1.0, 1.0, 5.0, 4.0]);
    assert_eq!(
        CocoDataset::split_images(&dir, "export/result.json").unwrap(),
        vec![export.join("images/1a2b-cat.png")]
    );
    // Two categories (ids 0 and 1, both below the id check) are refused, not merged.
    let two = json.replace(
        r#"[{"id": 0, "name": "cat"}]"#,
        r#"[{"id": 0, "name": "cat"}, {"id": 1, "name": "dog"}]"#,
    );
    std::fs::write(export.join("result.json"), two).unwrap();
    let e = CocoDataset::open(&dir, "export/result.json", 0, false)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("result.json: categories: 2 categories (cat, dog)"),
        "{e}"
    );
}
