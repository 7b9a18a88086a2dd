//! `burnpose predict CHECKPOINT SOURCE...`: a checkpoint's EMA model on images and folders of
//! images, batched with a progress bar; one annotated copy per image and `predictions.json` in
//! the run folder.

use super::DeviceArg;
use crate::predict::{ImagePrediction, PredictOptions, Predictor, draw, image_files};
use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};

/// What `predict` takes besides the checkpoint and sources.
pub struct PredictArgs {
    pub sources: Vec<PathBuf>,
    /// The folder to write into (default: a fresh `runs/predict/predict<N>`).
    pub out: Option<PathBuf>,
    pub options: PredictOptions,
    pub device: Option<DeviceArg>,
    pub batch: usize,
}

pub fn run(checkpoint: &Path, a: PredictArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.batch > 0, "--batch must be at least 1");
    let files = image_files(&a.sources)?;
    anyhow::ensure!(!files.is_empty(), "no images in {:?}", a.sources);
    let mut cfg = crate::train::checkpoint::read_config(checkpoint)?;
    let (device, what) = super::device_for(&mut cfg, checkpoint, a.device)?;
    let predictor = Predictor::load(checkpoint, &device, a.options)?;
    let out = match a.out {
        Some(dir) => dir,
        None => {
            let parent = Path::new("runs").join("predict");
            parent.join(super::fit::unused_run_name(&parent, "predict"))
        }
    };
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    println!(
        "{} from {} on {what}: {} images at {} px, batch {}",
        cfg.model.yolo().name(),
        checkpoint.display(),
        files.len(),
        predictor.options.imgsz,
        a.batch
    );
    let bar = ProgressBar::new(files.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:25} {pos}/{len} [{elapsed}<{eta}]").expect("template"),
    );
    let mut results: Vec<ImagePrediction> = Vec::with_capacity(files.len());
    let mut used = std::collections::HashSet::new();
    for chunk in files.chunks(a.batch) {
        let images = chunk
            .iter()
            .map(|p| crate::data::open_rgb(p))
            .collect::<Result<Vec<_>, _>>()?;
        let found = predictor.predict(&images);
        for ((path, mut image), detections) in chunk.iter().zip(images).zip(found) {
            let marks: Vec<draw::Mark> = detections
                .iter()
                .map(|d| draw::Mark::found(d, &predictor.layout))
                .collect();
            draw::annotate(&mut image, &marks, &predictor.layout);
            let target = out.join(output_name(path, &mut used));
            image
                .save(&target)
                .with_context(|| format!("writing {}", target.display()))?;
            results.push(ImagePrediction {
                image: path.clone(),
                width: image.width(),
                height: image.height(),
                detections,
            });
            bar.inc(1);
        }
    }
    bar.finish();
    let json = out.join("predictions.json");
    crate::train::report::write_atomic(&json, serde_json::to_string_pretty(&results)?.as_bytes())
        .with_context(|| format!("writing {}", json.display()))?;
    let total: usize = results.iter().map(|r| r.detections.len()).sum();
    println!(
        "{total} detections in {} images; annotated images and {} in {}",
        results.len(),
        json.file_name().expect("a file").to_string_lossy(),
        out.display()
    );
    Ok(())
}

/// `<stem>.jpg` (PNG sources stay PNG), with a numeric suffix when two sources share a stem.
fn output_name(path: &Path, used: &mut std::collections::HashSet<String>) -> String {
    let stem = path
        .file_stem()
        .map_or("image".into(), |s| s.to_string_lossy().to_string());
    let ext = match path.extension().and_then(|e| e.to_str()) {
        Some(e) if e.eq_ignore_ascii_case("png") => "png",
        _ => "jpg",
    };
    let mut name = format!("{stem}.{ext}");
    let mut i = 2;
    while !used.insert(name.clone()) {
        name = format!("{stem}_{i}.{ext}");
        i += 1;
    }
    name
}
