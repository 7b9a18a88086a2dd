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
    // In the CLI's batches of 3: a batch of one shape is letterboxed to less than the square.
    let want: Vec<_> = originals
        .chunks(3)
        .flat_map(|c| predictor.predict(c))
        .collect();
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
    std::fs::write(dir.join("notes.md"), "x").unwrap();
    let (ok, text) = burnpose(&[
        "predict",
        "x.safetensors",
        dir.join("notes.md").to_str().unwrap(),
    ]);
    assert!(
        !ok && text.contains("notes.md") && text.contains("neither an image"),
        "{text}"
    );
    assert!(!text.contains("panicked"), "{text}");
    // A `.txt` source is a list of sources; a line naming nothing is named with its list.
    std::fs::write(dir.join("list.txt"), "gone.jpg\n").unwrap();
    let (ok, text) = burnpose(&[
        "predict",
        "x.safetensors",
        dir.join("list.txt").to_str().unwrap(),
    ]);
    assert!(
        !ok && text.contains("list.txt: line 1: gone.jpg does not exist"),
        "{text}"
    );
    // An empty folder is named plainly (it was a Rust debug list).
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let (ok, text) = burnpose(&["predict", "x.safetensors", empty.to_str().unwrap()]);
    assert!(
        !ok && text.contains("no images or videos in ") && text.contains("empty ("),
        "{text}"
    );
    assert!(!text.contains("[\""), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A folder with a corrupt JPEG among good images (one in a subfolder): the bad file is named
/// and skipped, the good ones are predicted, the end line counts the skip; a folder of nothing
/// but corrupt files fails, naming the reason.
#[test]
fn predict_skips_undecodable_files_and_searches_subfolders() {
    let dir = std::env::temp_dir().join(format!("burnpose-predict-skip-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("photos/more")).unwrap();
    let run = short_fit(&dir);
    let ckpt = run.join("last.safetensors");
    image::RgbImage::from_pixel(40, 30, image::Rgb([90, 60, 30]))
        .save(dir.join("photos/good.png"))
        .unwrap();
    image::RgbImage::from_pixel(30, 40, image::Rgb([30, 60, 90]))
        .save(dir.join("photos/more/deeper.png"))
        .unwrap();
    std::fs::write(dir.join("photos/broken.jpg"), b"not a jpeg at all").unwrap();
    let out = dir.join("out");
    let (ok, text) = burnpose(&[
        "predict",
        ckpt.to_str().unwrap(),
        dir.join("photos").to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{text}");
    assert!(
        text.contains("broken.jpg") && text.contains("skipped"),
        "the bad file is named: {text}"
    );
    assert!(text.contains("(1 undecodable file(s) skipped)"), "{text}");
    let results: Vec<ImagePrediction> =
        serde_json::from_str(&std::fs::read_to_string(out.join("predictions.json")).unwrap())
            .unwrap();
    assert_eq!(results.len(), 2, "good.png and more/deeper.png");
    assert!(out.join("good.png").exists() && out.join("deeper.png").exists());
    // The streamed record holds the same results, one line each; the end line gives the rate.
    let streamed: Vec<ImagePrediction> = std::fs::read_to_string(out.join("predictions.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(streamed, results);
    assert!(text.contains("images/s"), "{text}");
    let speed = text
        .lines()
        .find(|l| l.starts_with("per image:"))
        .expect(&text);
    for stage in ["decode", "prepare", "network", "draw + write"] {
        assert!(speed.contains(&format!("{stage} ")), "{speed}");
    }

    // A glob source (quoted, as a shell would pass it), `**` reaching into subfolders.
    let out = dir.join("out_glob");
    let pattern = dir.join("photos/**/*.png");
    let (ok, text) = burnpose(&[
        "predict",
        ckpt.to_str().unwrap(),
        pattern.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok && text.contains("in 2 images;"), "{text}");
    assert!(out.join("good.png").exists() && out.join("deeper.png").exists());

    std::fs::create_dir_all(dir.join("bad")).unwrap();
    std::fs::write(dir.join("bad/x.jpg"), b"nope").unwrap();
    let (ok, text) = burnpose(&[
        "predict",
        ckpt.to_str().unwrap(),
        dir.join("bad").to_str().unwrap(),
        "--out",
        dir.join("out_bad").to_str().unwrap(),
    ]);
    assert!(
        !ok && text.contains("none of the 1 sources could be decoded"),
        "{text}"
    );
    assert!(!text.contains("panicked"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Pseudo-labelling: `predict --save-txt` writes YOLO label files that `fit` reads back as a
/// dataset and trains one epoch on.
#[test]
fn predicted_labels_train_a_fit() {
    let dir = std::env::temp_dir().join(format!("burnpose-predict-txt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let run = short_fit(&dir);
    let ckpt = run.join("last.safetensors");
    // Unlabelled images: the built-in ones, exported, with their labels removed.
    let ds = dir.join("ds");
    let (ok, text) = burnpose(&[
        "export-yolo",
        dir.join("tiny.toml").to_str().unwrap(),
        ds.to_str().unwrap(),
    ]);
    assert!(ok, "{text}");
    std::fs::remove_dir_all(ds.join("labels")).unwrap();
    let out = dir.join("pred");
    let (ok, text) = burnpose(&[
        "predict",
        ckpt.to_str().unwrap(),
        ds.join("images/train").to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--conf",
        "0.001",
        "--max-det",
        "3",
        "--save-txt",
    ]);
    assert!(ok, "{text}");
    let labels: Vec<_> = std::fs::read_dir(out.join("labels"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(!labels.is_empty(), "no label file written: {text}");
    for file in &labels {
        for row in std::fs::read_to_string(file).unwrap().lines() {
            assert_eq!(row.split_whitespace().count(), 5 + 17 * 3, "{row}");
        }
    }
    // The labels go where `fit` looks for them; val keeps its (now absent) labels: backgrounds.
    let train_labels = ds.join("labels/train");
    std::fs::create_dir_all(&train_labels).unwrap();
    for file in &labels {
        std::fs::copy(file, train_labels.join(file.file_name().unwrap())).unwrap();
    }
    let cfg = dir.join("pseudo.toml");
    std::fs::write(
        &cfg,
        format!(
            "[data]\nsource = \"yolo\"\npath = {:?}\nimgsz = 64\nworkers = 0\n[train]\nepochs = 1\nbatch = 2\nnbs = 2\n[device]\nkind = \"cpu\"\n[output]\ndir = {:?}\nname = \"pseudo\"\n",
            ds.join("data.yaml").to_str().unwrap(),
            dir.join("runs").to_str().unwrap()
        ),
    )
    .unwrap();
    let (ok, text) = burnpose(&["fit", cfg.to_str().unwrap()]);
    assert!(ok && text.contains("done: 1 epochs"), "{text}");

    // `--split val`: the dataset's val images, from the checkpoint's own config and from a config.
    let pseudo = dir.join("runs/pseudo/last.safetensors");
    let pseudo = pseudo.to_str().unwrap();
    let val = ds.join("images/val");
    let mut expected: Vec<PathBuf> = std::fs::read_dir(&val)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    expected.sort();
    for config in [None, Some(cfg.to_str().unwrap())] {
        let out = dir.join(format!("split-{}", config.is_some()));
        let mut args = vec!["predict", pseudo, "--split", "val"];
        args.extend(config.map(|c| ["--config", c]).into_iter().flatten());
        args.extend(["--out", out.to_str().unwrap()]);
        let (ok, text) = burnpose(&args);
        assert!(ok, "{text}");
        let found: Vec<ImagePrediction> =
            serde_json::from_str(&std::fs::read_to_string(out.join("predictions.json")).unwrap())
                .unwrap();
        let images: Vec<PathBuf> = found.into_iter().map(|p| p.image).collect();
        assert_eq!(images, expected, "{text}");
    }
    // A split the yaml lacks, and a checkpoint trained on the built-in (drawn) images.
    let (ok, text) = burnpose(&["predict", pseudo, "--split", "test"]);
    assert!(
        !ok && text.contains("--split test") && text.contains("no such split"),
        "{text}"
    );
    let (ok, text) = burnpose(&["predict", ckpt.to_str().unwrap(), "--split", "val"]);
    assert!(!ok && text.contains("built-in dataset"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A video among the sources, as a user meets one: an MP4 the test writes (odd size, 7 frames at
/// 5 fps), beside a damaged MP4 and an AVI. Each frame is predicted as the model predicts the
/// decoded frame, recorded with its number and time, labelled as `<stem>_<frame>.txt`, and the
/// annotated frames come back as an MP4 of the same length and rate; the two bad files are named
/// and counted.
#[test]
fn predict_annotates_a_video_frame_by_frame() {
    use burnpose::predict::video::{VideoReader, VideoWriter};
    let dir = std::env::temp_dir().join(format!("burnpose-predict-video-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("clips")).unwrap();
    let run = short_fit(&dir);
    let ckpt = run.join("last.safetensors");
    let (w, h, fps, n) = (161u32, 121u32, 5.0, 7u64);
    let clip = dir.join("clips/walk.mp4");
    let mut writer = VideoWriter::create(&clip, w, h, fps).unwrap();
    for t in 0..n as u32 {
        let frame = image::RgbImage::from_fn(w, h, |x, y| {
            let body = (x + 9 * t) % w > 60 && (x + 9 * t) % w < 100 && y > 20 && y < 110;
            match body {
                true => image::Rgb([200, 150, 120]),
                false => image::Rgb([(x * 2) as u8, (y * 2) as u8, 90]),
            }
        });
        writer.write(&frame).unwrap();
    }
    writer.finish().unwrap();
    // A copy that breaks off at its fourth frame: the three before are kept.
    std::fs::copy(&clip, dir.join("clips/cut.mp4")).unwrap();
    common::break_sample(&dir.join("clips/cut.mp4"), 4);
    std::fs::write(dir.join("clips/broken.mp4"), b"not a video").unwrap();
    std::fs::write(dir.join("clips/old.avi"), b"RIFF....AVI ").unwrap();
    let out = dir.join("out");
    let (ok, text) = burnpose(&[
        "predict",
        ckpt.to_str().unwrap(),
        dir.join("clips").to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--conf",
        "0.001",
        "--max-det",
        "5",
        "--batch",
        "3",
        "--save-txt",
    ]);
    assert!(ok, "{text}");
    assert!(!text.contains("panicked"), "{text}");
    assert!(
        text.contains("broken.mp4") && text.contains("old.avi"),
        "{text}"
    );
    assert!(
        text.contains("in 0 images and 10 frames of 2 videos (2 undecodable file(s) skipped)"),
        "{text}"
    );
    assert!(
        text.contains("cut.mp4: sample 4") && text.contains("the rest of the video is skipped"),
        "{text}"
    );

    let json: Vec<ImagePrediction> =
        serde_json::from_str(&std::fs::read_to_string(out.join("predictions.json")).unwrap())
            .unwrap();
    let predictor = Predictor::load(
        &ckpt,
        &Device::flex(),
        PredictOptions {
            conf: 0.001,
            max_det: 5,
            imgsz: 0,
            ..PredictOptions::default()
        },
    )
    .unwrap();
    let frames: Vec<image::RgbImage> = VideoReader::open(&clip)
        .unwrap()
        .map(|f| f.unwrap().image)
        .collect();
    assert_eq!(frames.len() as u64, n);
    let want = predictor.predict(&frames);
    // Sorted by path: cut.mp4's three frames, then walk.mp4's seven.
    assert_eq!(json.len() as u64, n + 3);
    let cut = dir.join("clips/cut.mp4");
    for (k, (entry, found)) in json[..3].iter().zip(&want).enumerate() {
        assert_eq!((&entry.image, entry.frame), (&cut, Some(k as u64 + 1)));
        assert_eq!(&entry.detections, found, "cut.mp4 frame {}", k + 1);
    }
    assert_eq!(VideoReader::open(&out.join("cut.mp4")).unwrap().count(), 3);
    for (k, (entry, found)) in json[3..].iter().zip(&want).enumerate() {
        let frame = k as u64 + 1;
        assert_eq!(entry.image, clip);
        assert_eq!(entry.frame, Some(frame));
        assert!((entry.time.unwrap() - k as f64 / fps).abs() < 1e-9);
        // H.264 codes even sizes: the odd column and row are repeated.
        assert_eq!((entry.width, entry.height), (w + 1, h + 1));
        assert_eq!(&entry.detections, found, "frame {frame}");
        assert!(!found.is_empty(), "no detections at conf 0.001");
        let label = out.join(format!("labels/walk_{frame}.txt"));
        assert_eq!(
            std::fs::read_to_string(&label).unwrap(),
            entry.yolo_label(false),
            "{}",
            label.display()
        );
    }
    // The annotated video: every frame, at the source's rate.
    let annotated = VideoReader::open(&out.join("walk.mp4")).unwrap();
    assert_eq!(annotated.frame_count(), n);
    assert!((annotated.fps() - fps).abs() < 1e-6);
    let drawn: Vec<image::RgbImage> = annotated.map(|f| f.unwrap().image).collect();
    assert_eq!(drawn.len() as u64, n);
    assert!(drawn.iter().all(|f| f.dimensions() == (w + 1, h + 1)));
    std::fs::remove_dir_all(&dir).unwrap();
}
