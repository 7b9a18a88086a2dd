use super::*;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("burnpose-yolo-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for sub in ["images/train", "images/val", "labels/train", "labels/val"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    dir
}

const YAML: &str = "path: .\ntrain: images/train\nval: images/val\nkpt_shape: [2, 3]\nflip_idx: [1, 0]\nnames:\n  0: person\n";

fn dataset(name: &str, label: &str) -> PathBuf {
    let dir = scratch(name);
    std::fs::write(dir.join("data.yaml"), YAML).unwrap();
    for split in ["train", "val"] {
        image::RgbImage::from_pixel(10, 20, image::Rgb([9, 9, 9]))
            .save(dir.join(format!("images/{split}/a.png")))
            .unwrap();
        std::fs::write(dir.join(format!("labels/{split}/a.txt")), label).unwrap();
    }
    dir
}

fn open(dir: &Path, skip_bad: bool) -> Result<(YoloDataset, YoloDataset, usize), DataError> {
    YoloDataset::open_pair(&dir.join("data.yaml"), 1, [2, 3], skip_bad, "val")
}

#[test]
fn reads_rows_into_pixels() {
    let dir = dataset(
        "ok",
        "0 0.5 0.5 0.2 0.4 0.5 0.25 2 0 0 0\n0 0.5 0.5 0.2 0.4 0.5 0.25 2 0 0 0\n",
    );
    let (train, val, skipped) = open(&dir, false).unwrap();
    assert_eq!((train.len(), val.len(), skipped), (1, 1, 0));
    assert_eq!(train.flip_idx, Some(vec![1, 0]));
    let s = train.get(0).unwrap();
    assert_eq!(s.instances.len(), 1, "duplicate rows are dropped");
    let inst = &s.instances[0];
    assert_eq!(inst.bbox, [4.0, 6.0, 6.0, 14.0]);
    assert_eq!(inst.keypoints, vec![[5.0, 5.0, 2.0], [0.0, 0.0, 0.0]]);
}

#[test]
fn wrong_field_count_names_file_and_line() {
    let dir = dataset(
        "fields",
        "0 0.5 0.5 0.2 0.4 0.5 0.25 2 0 0 0\n0 0.5 0.5 0.2 0.4 1 1\n",
    );
    let err = open(&dir, false).unwrap_err().to_string();
    assert!(
        err.contains("labels/train/a.txt") && err.contains("line 2"),
        "{err}"
    );
    assert!(err.contains("7 fields, expected 11"), "{err}");
    let (train, _, skipped) = open(&dir, true).unwrap();
    assert_eq!(
        (train.len(), skipped),
        (0, 2),
        "skip_bad drops both splits' images"
    );
}

#[test]
fn bad_values_are_errors() {
    for (name, row, what) in [
        ("class", "0.5 0.5 0.5 0.2 0.4 0.5 0.25 2 0 0 0", "class 0.5"),
        (
            "box",
            "0 1.5 0.5 0.2 0.4 0.5 0.25 2 0 0 0",
            "not normalised",
        ),
        ("nan", "0 nan 0.5 0.2 0.4 0.5 0.25 2 0 0 0", "finite"),
    ] {
        let dir = dataset(name, row);
        let err = open(&dir, false).unwrap_err().to_string();
        assert!(err.contains("a.txt: line 1") && err.contains(what), "{err}");
    }
}

#[test]
fn kpt_shape_must_match_the_model() {
    let dir = dataset("shape", "");
    let err = YoloDataset::open_pair(&dir.join("data.yaml"), 1, [17, 3], false, "val")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("data.yaml") && err.contains("kpt_shape"),
        "{err}"
    );
}

#[test]
fn corrupt_image_is_named_or_skipped() {
    let dir = dataset("corrupt", "");
    std::fs::write(dir.join("images/train/b.jpg"), b"not a jpeg").unwrap();
    let err = open(&dir, false).unwrap_err().to_string();
    assert!(err.contains("images/train/b.jpg"), "{err}");
    let (train, _, skipped) = open(&dir, true).unwrap();
    assert_eq!((train.len(), skipped), (1, 1));
}

#[test]
fn missing_or_empty_label_file_is_a_background_image() {
    let dir = dataset("background", "");
    std::fs::remove_file(dir.join("labels/train/a.txt")).unwrap();
    let (train, val, _) = open(&dir, false).unwrap();
    assert!(train.get(0).unwrap().instances.is_empty());
    // val's label file exists but is empty: a background too, not an error.
    assert!(dir.join("labels/val/a.txt").exists());
    assert_eq!(val.len(), 1);
    assert!(val.get(0).unwrap().instances.is_empty());
}

#[test]
fn label_path_swaps_the_last_images_folder() {
    assert_eq!(
        label_path(Path::new("/d/images/x/images/train/a.jpg")),
        PathBuf::from("/d/images/x/labels/train/a.txt")
    );
}

#[test]
fn coco8_pose_real_data() {
    let Some(yaml) = crate::data::shared_test_data("pose-real/coco8-pose/coco8-pose.yaml") else {
        return;
    };
    let (train, val, skipped) = YoloDataset::open_pair(&yaml, 1, [17, 3], false, "val").unwrap();
    assert_eq!((train.len(), val.len(), skipped), (4, 4, 0));
    let s = train.get(0).unwrap();
    assert!(!s.instances.is_empty());
    for inst in &s.instances {
        assert_eq!(inst.keypoints.len(), 17);
        let (w, h) = s.image.dimensions();
        assert!(inst.bbox[2] <= w as f32 + 1.0 && inst.bbox[3] <= h as f32 + 1.0);
    }
}

#[test]
fn detection_labels_have_five_fields() {
    let dir = scratch("detect");
    std::fs::write(
        dir.join("data.yaml"),
        "train: images/train\nval: images/val\nnames: [a, b]\n",
    )
    .unwrap();
    for split in ["train", "val"] {
        image::RgbImage::new(10, 10)
            .save(dir.join(format!("images/{split}/a.png")))
            .unwrap();
        std::fs::write(
            dir.join(format!("labels/{split}/a.txt")),
            "1 0.5 0.5 0.2 0.4\n",
        )
        .unwrap();
    }
    let (train, _, _) =
        YoloDataset::open_pair(&dir.join("data.yaml"), 2, [0, 0], false, "val").unwrap();
    let s = train.get(0).unwrap();
    assert_eq!(s.instances[0].class, 1);
    assert!(s.instances[0].keypoints.is_empty());
    let err = YoloDataset::open_pair(&dir.join("data.yaml"), 2, [17, 3], false, "val")
        .unwrap_err()
        .to_string();
    assert!(err.contains("kpt_shape"), "{err}");
}

/// `dataset(…)` with another yaml.
fn with_yaml(name: &str, yaml: &str) -> PathBuf {
    let dir = dataset(name, "0 0.5 0.5 0.2 0.4 0.5 0.25 2 0 0 0\n");
    std::fs::write(dir.join("data.yaml"), yaml).unwrap();
    dir
}

#[test]
fn class_at_or_above_nc_names_file_and_line() {
    let dir = dataset(
        "nc",
        "0 0.5 0.5 0.2 0.4 0.5 0.25 2 0 0 0\n1 0.5 0.5 0.2 0.4 0.5 0.25 2 0 0 0\n",
    );
    let err = open(&dir, false).unwrap_err().to_string();
    assert!(
        err.contains("labels/train/a.txt: line 2") && err.contains("model.nc = 1"),
        "{err}"
    );
    // With two classes (and two names) the same labels load.
    let yaml = YAML.replace("  0: person\n", "  0: person\n  1: robot\n");
    std::fs::write(dir.join("data.yaml"), yaml).unwrap();
    let (train, _, _) =
        YoloDataset::open_pair(&dir.join("data.yaml"), 2, [2, 3], false, "val").unwrap();
    assert_eq!(train.get(0).unwrap().instances[1].class, 1);
    assert_eq!(
        train.names,
        Some(vec!["person".to_string(), "robot".to_string()])
    );
}

#[test]
fn names_must_count_nc_classes() {
    for (name, names) in [
        ("names-list", "names: [a, b]\n"),
        ("names-map", "names:\n  0: a\n  1: b\n"),
    ] {
        let yaml = YAML.replace("names:\n  0: person\n", names);
        let dir = with_yaml(name, &yaml);
        let err = open(&dir, false).unwrap_err().to_string();
        assert!(
            err.contains("data.yaml: names: 2 class names, but model.nc = 1"),
            "{err}"
        );
    }
    let yaml = YAML.replace("  0: person\n", "  1: person\n");
    let err = open(&with_yaml("names-gap", &yaml), false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("names") && err.contains("id 0 is missing"),
        "{err}"
    );
}

#[test]
fn flip_idx_must_be_a_permutation() {
    for (name, flip) in [
        ("flip-dup", "[0, 0]"),
        ("flip-range", "[1, 2]"),
        ("flip-len", "[1, 0, 2]"),
    ] {
        let yaml = YAML.replace("flip_idx: [1, 0]", &format!("flip_idx: {flip}"));
        let err = open(&with_yaml(name, &yaml), false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("data.yaml: flip_idx") && err.contains("not a permutation of 0..2"),
            "{name}: {err}"
        );
    }
}

#[test]
fn kpt_oks_sigmas_are_read_and_checked() {
    let yaml = format!("{YAML}kpt_oks_sigmas: [0.5, 0.25]\n");
    let (train, _, _) = open(&with_yaml("sigmas", &yaml), false).unwrap();
    assert_eq!(train.kpt_oks_sigmas, Some(vec![0.5, 0.25]));
    for (name, sigmas) in [("sigmas-len", "[0.5]"), ("sigmas-neg", "[0.5, -1.0]")] {
        let yaml = format!("{YAML}kpt_oks_sigmas: {sigmas}\n");
        let err = open(&with_yaml(name, &yaml), false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("kpt_oks_sigmas") && err.contains("expected 2 positive sigmas"),
            "{err}"
        );
    }
}

#[test]
fn every_listed_extension_decodes_or_is_reported() {
    let dir = dataset("formats", "");
    let img = image::RgbImage::from_pixel(10, 20, image::Rgb([9, 9, 9]));
    for ext in ["bmp", "webp", "tif"] {
        img.save(dir.join(format!("images/train/b.{ext}"))).unwrap();
    }
    let (train, _, _) = open(&dir, false).unwrap();
    assert_eq!(train.len(), 4, "png, bmp, webp and tif all load");
    for i in 0..4 {
        assert_eq!(train.get(i).unwrap().image.dimensions(), (10, 20));
    }
    std::fs::write(dir.join("images/train/c.heic"), b"not decodable here").unwrap();
    let err = open(&dir, false).unwrap_err().to_string();
    assert!(
        err.contains("c.heic") && err.contains("this build cannot decode .heic images"),
        "{err}"
    );
    let (train, _, skipped) = open(&dir, true).unwrap();
    assert_eq!((train.len(), skipped), (4, 1));
}

/// A pose image `name` with one labelled person under `images_dir`, its label beside it in the
/// matching `labels` folder.
fn put_image(images_dir: &Path, name: &str) {
    std::fs::create_dir_all(images_dir).unwrap();
    image::RgbImage::from_pixel(10, 20, image::Rgb([9, 9, 9]))
        .save(images_dir.join(name))
        .unwrap();
    let labels = label_path(&images_dir.join(name));
    std::fs::create_dir_all(labels.parent().unwrap()).unwrap();
    std::fs::write(labels, "0 0.5 0.5 0.2 0.4 0.5 0.25 2 0 0 0\n").unwrap();
}

/// A Roboflow export: `data.yaml` in the root names `../train/images` and `../valid/images`, with
/// the keys Roboflow adds; Ultralytics drops the `../` when the path does not exist.
#[test]
fn roboflow_export_with_parent_relative_splits() {
    let dir = scratch("roboflow");
    put_image(&dir.join("train/images"), "a.jpg");
    put_image(&dir.join("train/images"), "b.jpg");
    put_image(&dir.join("valid/images"), "c.jpg");
    std::fs::write(
        dir.join("data.yaml"),
        "train: ../train/images\nval: ../valid/images\ntest: ../test/images\n\nkpt_shape: [2, 3]\n\
         flip_idx: [1, 0]\nnc: 1\nnames: ['person']\n\nroboflow:\n  workspace: w\n  project: p\n  \
         version: 3\n  license: CC BY 4.0\n  url: https://universe.roboflow.com/w/p/dataset/3\n",
    )
    .unwrap();
    let (train, val, skipped) = open(&dir, false).unwrap();
    assert_eq!((train.len(), val.len(), skipped), (2, 1, 0));
    assert!(train.items[0].image.ends_with("train/images/a.jpg"));
    assert_eq!(train.get(1).unwrap().instances.len(), 1, "labels found");
    // An existing `../` folder is taken as written.
    let outside = dir.join("outside");
    put_image(&outside.join("images"), "d.jpg");
    let yaml = format!(
        "path: {}\ntrain: ../outside/images\nval: ../valid/images\nkpt_shape: [2, 3]\nnames: [person]\n",
        dir.join("train").display()
    );
    std::fs::write(dir.join("data.yaml"), yaml).unwrap();
    let (train, val, _) = open(&dir, false).unwrap();
    assert!(train.items[0].image.ends_with("outside/images/d.jpg"));
    assert_eq!(
        val.len(),
        1,
        "../valid/images under train/ exists: taken as written"
    );
}

/// Splits as `.txt` lists, as Ultralytics' coco-pose.yaml: `./` lines are relative to the list's
/// folder, absolute lines as written, blank lines and non-images ignored; a list of sources is
/// merged and sorted; a folder is searched below its subfolders.
#[test]
fn txt_lists_and_nested_folders() {
    let dir = scratch("lists");
    put_image(&dir.join("images/train2017"), "b.jpg");
    put_image(&dir.join("images/train2017"), "a.jpg");
    put_image(&dir.join("images/val2017/sub"), "v.png");
    let absolute = dir.join("images/extra/z.jpg");
    put_image(absolute.parent().unwrap(), "z.jpg");
    std::fs::write(
        dir.join("train2017.txt"),
        format!(
            "./images/train2017/b.jpg\n\n./images/train2017/a.jpg\n{}\n./notes.md\n",
            absolute.display()
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("data.yaml"),
        "path: .\ntrain: train2017.txt\nval: [images/val2017]\nkpt_shape: [2, 3]\nnames: {0: person}\n",
    )
    .unwrap();
    let (train, val, _) = open(&dir, false).unwrap();
    let names: Vec<String> = train
        .items
        .iter()
        .map(|i| i.image.file_name().unwrap().to_string_lossy().into())
        .collect();
    assert_eq!(names, ["z.jpg", "a.jpg", "b.jpg"], "sorted by path text");
    assert_eq!(val.len(), 1, "images in subfolders are found");
    assert_eq!(val.get(0).unwrap().instances.len(), 1);
    // A list naming a missing image is an error naming it.
    std::fs::write(dir.join("train2017.txt"), "./images/train2017/gone.jpg\n").unwrap();
    let err = open(&dir, false).unwrap_err().to_string();
    assert!(err.contains("gone.jpg"), "{err}");
    // A missing list or folder is an error naming it.
    std::fs::write(
        dir.join("data.yaml"),
        "train: missing.txt\nval: images/val2017\nkpt_shape: [2, 3]\n",
    )
    .unwrap();
    let err = open(&dir, false).unwrap_err().to_string();
    assert!(
        err.contains("missing.txt") && err.contains("cannot read"),
        "{err}"
    );
}

/// `nc` is optional; when given it must agree with `names` and with the model.
#[test]
fn nc_is_checked_against_names_and_the_model() {
    let dir = dataset("nc", "0 0.5 0.5 0.2 0.4 0.5 0.25 2 0 0 0\n");
    let base = "path: .\ntrain: images/train\nval: images/val\nkpt_shape: [2, 3]\n";
    for (extra, ok, what) in [
        ("nc: 1\nnames: [person]\n", true, ""),
        ("nc: 1\n", true, ""),
        (
            "nc: 2\nnames: [person]\n",
            false,
            "nc: 2, but names has 1 class names",
        ),
        (
            "nc: 2\nnames: [person, dog]\n",
            false,
            "data.yaml: nc: 2, but model.nc = 1",
        ),
    ] {
        std::fs::write(dir.join("data.yaml"), format!("{base}{extra}")).unwrap();
        match open(&dir, false) {
            Ok(_) => assert!(ok, "{extra} should fail"),
            Err(e) => assert!(!ok && e.to_string().contains(what), "{extra}: {e}"),
        }
    }
}

/// A JPEG whose EXIF says "rotate 90° clockwise" (orientation 6), as phone cameras write them,
/// is decoded turned, so that labels normalised to the picture the labelling tool showed land on
/// the right pixels, and its size read from the header turns with it; the same image without the
/// tag is not turned (the control).
#[test]
fn exif_orientation_is_applied_when_decoding() {
    use image::ImageEncoder;
    let dir = scratch("exif");
    // 40 wide, 20 high: left half red, right half blue.
    let img = image::RgbImage::from_fn(40, 20, |x, _| {
        if x < 20 {
            image::Rgb([250, 0, 0])
        } else {
            image::Rgb([0, 0, 250])
        }
    });
    // Little-endian TIFF: header, IFD0 at 8 with one entry, Orientation (0x0112) SHORT = 6.
    let exif = vec![
        0x49, 0x49, 0x2A, 0x00, 0x08, 0, 0, 0, 0x01, 0x00, 0x12, 0x01, 0x03, 0x00, 0x01, 0, 0, 0,
        6, 0, 0, 0, 0, 0, 0, 0,
    ];
    for (name, tagged) in [("turned.jpg", true), ("plain.jpg", false)] {
        let mut bytes = Vec::new();
        let mut encoder = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut bytes, 95);
        if tagged {
            encoder.set_exif_metadata(exif.clone()).unwrap();
        }
        encoder
            .write_image(img.as_raw(), 40, 20, image::ExtendedColorType::Rgb8)
            .unwrap();
        std::fs::write(dir.join("images/train").join(name), bytes).unwrap();
    }
    let turned = crate::data::open_rgb(&dir.join("images/train/turned.jpg")).unwrap();
    assert_eq!(turned.dimensions(), (20, 40), "width and height swap");
    // Turned clockwise, the left (red) half is on top.
    assert!(turned.get_pixel(10, 5)[0] > 200 && turned.get_pixel(10, 35)[2] > 200);
    let plain = crate::data::open_rgb(&dir.join("images/train/plain.jpg")).unwrap();
    assert_eq!(plain.dimensions(), (40, 20));
    // The header-only size (rectangular validation's batches) agrees with the decoded one.
    let size = |name: &str| crate::data::rgb_dimensions(&dir.join("images/train").join(name));
    assert_eq!(size("turned.jpg").unwrap(), (20, 40));
    assert_eq!(size("plain.jpg").unwrap(), (40, 20));
    assert!(plain.get_pixel(5, 10)[0] > 200 && plain.get_pixel(35, 10)[2] > 200);
}

/// `data.val_split = "test"` validates on the yaml's `test:` split; a yaml without one is an
/// error naming the key; any other value keeps `val:`.
#[test]
fn test_split_is_validated_on_when_asked() {
    let dir = scratch("testsplit");
    put_image(&dir.join("images/train"), "a.jpg");
    put_image(&dir.join("images/val"), "b.jpg");
    put_image(&dir.join("images/test"), "c.jpg");
    put_image(&dir.join("images/test"), "d.jpg");
    let base = "train: images/train\nval: images/val\nkpt_shape: [2, 3]\n";
    std::fs::write(dir.join("data.yaml"), format!("{base}test: images/test\n")).unwrap();
    let yaml = dir.join("data.yaml");
    let (_, val, _) = YoloDataset::open_pair(&yaml, 1, [2, 3], false, "test").unwrap();
    assert_eq!(val.len(), 2);
    let (_, val, _) = YoloDataset::open_pair(&yaml, 1, [2, 3], false, "val2017").unwrap();
    assert_eq!(val.len(), 1);
    std::fs::write(&yaml, base).unwrap();
    let err = YoloDataset::open_pair(&yaml, 1, [2, 3], false, "test")
        .unwrap_err()
        .to_string();
    assert!(err.contains("data.yaml: test: missing"), "{err}");
}
