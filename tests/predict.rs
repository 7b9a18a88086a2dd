//! `predict` and the pictures a fit writes, as a user meets them: a short CPU fit, then the
//! checkpoint on real COCO images.

mod common;

use burn::prelude::*;
use burnpose::predict::{ImagePrediction, PredictOptions, Predictor};
use common::{burnpose, shared_data};
use std::path::{Path, PathBuf};

/// A two-epoch CPU fit at 64 px; its run folder.
fn short_fit(dir: &Path) -> PathBuf {
    let cfg = dir.join("tiny.toml");
    std::fs::write(
        &cfg,
        format!(
            "[data]\nimgsz = 64\ntrain_images = 6\nval_images = 3\nworkers = 0\n[train]\nepochs = 2\nbatch = 2\nnbs = 2\n[device]\nkind = \"cpu\"\n[output]\ndir = {:?}\nname = \"fit\"\n",
            dir.join("runs").to_str().unwrap()
        ),
    )
    .unwrap();
    let (ok, text) = burnpose(&["fit", cfg.to_str().unwrap()]);
    assert!(ok, "{text}");
    dir.join("runs/fit")
}

fn decoded_size(path: &Path) -> (u32, u32) {
    let img = image::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (img.width(), img.height())
}

#[test]
fn fit_writes_its_pictures_and_predict_annotates_real_images() {
    let dir = std::env::temp_dir().join(format!("burnpose-predict-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let run = short_fit(&dir);
    // Batch 2 at 64 px: a 2 × 1 grid; three batches in an epoch of three.
    for b in 0..3 {
        assert_eq!(
            decoded_size(&run.join(format!("train_batch{b}.jpg"))),
            (128, 64)
        );
    }
    assert_eq!(decoded_size(&run.join("labels.jpg")), (640, 640));
    // Three val images: a 2 × 2 grid.
    for name in ["val_batch0_labels.jpg", "val_batch0_pred.jpg"] {
        assert_eq!(decoded_size(&run.join(name)), (128, 128), "{name}");
    }

    let Some(images) = shared_data("pose-real/coco") else {
        return;
    };
    let out = dir.join("predicted");
    let ckpt = run.join("last.safetensors");
    let (ok, text) = burnpose(&[
        "predict",
        ckpt.to_str().unwrap(),
        images.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--conf",
        "0.001",
        "--max-det",
        "20",
        "--batch",
        "3",
        "--device",
        "cpu",
    ]);
    assert!(ok, "{text}");
    let json: Vec<ImagePrediction> =
        serde_json::from_str(&std::fs::read_to_string(out.join("predictions.json")).unwrap())
            .unwrap();
    let mut sources: Vec<PathBuf> = std::fs::read_dir(&images)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jpg"))
        .collect();
    sources.sort();
    assert_eq!(json.len(), sources.len());
    let predictor = Predictor::load(
        &ckpt,
        &Device::flex(),
        PredictOptions {
            conf: 0.001,
            max_det: 20,
            imgsz: 0,
            ..PredictOptions::default()
        },
    )
    .unwrap();
    let originals: Vec<image::RgbImage> = sources
        .iter()
        .map(|p| image::open(p).unwrap().to_rgb8())
        .collect();
    let want = predictor.predict(&originals);
    for ((entry, source), (original, found)) in
        json.iter().zip(&sources).zip(originals.iter().zip(&want))
    {
        assert_eq!(&entry.image, source);
        assert_eq!((entry.width, entry.height), original.dimensions());
        assert_eq!(&entry.detections, found, "{}", source.display());
        assert!(!found.is_empty(), "no detections at conf 0.001");
        for d in found {
            assert_eq!(d.keypoints.len(), 17);
            assert_eq!(d.name.as_deref(), Some("person"));
        }
        let stem = source.file_stem().unwrap().to_str().unwrap();
        assert_eq!(
            decoded_size(&out.join(format!("{stem}.jpg"))),
            original.dimensions()
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn predict_rejects_bad_sources_clearly() {
    let dir = std::env::temp_dir().join(format!("burnpose-predict-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    image::RgbImage::new(8, 8).save(dir.join("a.png")).unwrap();
    let (ok, text) = burnpose(&["predict", "no/such.safetensors", dir.to_str().unwrap()]);
    assert!(!ok && text.contains("no/such.safetensors"), "{text}");
    let missing = dir.join("missing.jpg");
    let (ok, text) = burnpose(&["predict", "x.safetensors", missing.to_str().unwrap()]);
    assert!(!ok && text.contains("missing.jpg"), "{text}");
    std::fs::write(dir.join("notes.txt"), "x").unwrap();
    let (ok, text) = burnpose(&[
        "predict",
        "x.safetensors",
        dir.join("notes.txt").to_str().unwrap(),
    ]);
    assert!(
        !ok && text.contains("notes.txt") && text.contains("not an image"),
        "{text}"
    );
    assert!(!text.contains("panicked"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}
