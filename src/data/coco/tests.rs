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
