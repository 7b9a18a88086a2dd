//! `burnpose predict CHECKPOINT SOURCE...`: a checkpoint's EMA model on images and folders of
//! images (searched below subfolders), batched with a progress bar; one annotated copy per image
//! and `predictions.json` in the run folder. Undecodable files are named and skipped.

use super::DeviceArg;
use crate::predict::{ImagePrediction, PredictOptions, Predictor, draw, image_files};
use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};

/// What `predict` takes besides the checkpoint and sources.
pub struct PredictArgs {
    pub sources: Vec<PathBuf>,
    /// A split of a dataset, predicted on besides `sources`.
    pub split: Option<Split>,
    /// The folder to write into (default: a fresh `runs/predict/predict<N>`).
    pub out: Option<PathBuf>,
    pub options: PredictOptions,
    pub device: Option<DeviceArg>,
    pub batch: usize,
    /// Write YOLO label files (`--save-txt`), with scores (`--save-conf`).
    pub labels: Option<Labels>,
}

/// `--split NAME [--config CONFIG]`: the images of a dataset split.
pub struct Split {
    pub name: String,
    /// The config whose `[data]` names the dataset; default: the checkpoint's.
    pub config: Option<PathBuf>,
}

impl Split {
    /// The split's image files, found as training finds them.
    fn images(&self, checkpoint: &Path) -> anyhow::Result<Vec<PathBuf>> {
        let (cfg, config_path, whose) = match &self.config {
            Some(p) => (
                crate::config::Config::load(p)?,
                p.clone(),
                p.display().to_string(),
            ),
            // No config file: a relative data.path is taken from the working directory.
            None => (
                crate::train::checkpoint::read_config(checkpoint)?,
                PathBuf::new(),
                format!("the config stored in {}", checkpoint.display()),
            ),
        };
        let found = crate::data::Source::split_images(&cfg, &config_path, &self.name)
            .with_context(|| {
                format!(
                    "--split {}: the dataset of {whose} (data.path {:?}; --config CONFIG reads \
                     another config's [data])",
                    self.name,
                    cfg.data.path.clone().unwrap_or_default()
                )
            })?;
        found.ok_or_else(|| {
            anyhow::anyhow!(
                "--split {}: {whose} trains on the built-in dataset, whose images are drawn, not \
                 files; give predict image files or folders",
                self.name
            )
        })
    }
}

/// `--save-txt`: label files in `labels/` of the run folder.
pub struct Labels {
    /// Each row ends with the detection's score.
    pub score: bool,
}

pub fn run(checkpoint: &Path, a: PredictArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.batch > 0, "--batch must be at least 1");
    let mut files = image_files(&a.sources)?;
    if let Some(split) = &a.split {
        files.extend(split.images(checkpoint)?);
    }
    if files.is_empty() {
        let mut names: Vec<String> = a.sources.iter().map(|p| p.display().to_string()).collect();
        names.extend(a.split.as_ref().map(|s| format!("split {}", s.name)));
        anyhow::bail!(
            "no images in {} (images with the extensions {})",
            names.join(", "),
            crate::data::yolo::decodable_extensions()
        );
    }
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
    let labels_dir = out.join("labels");
    if a.labels.is_some() {
        std::fs::create_dir_all(&labels_dir)
            .with_context(|| format!("creating {}", labels_dir.display()))?;
    }
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
    let mut skipped = 0;
    for chunk in files.chunks(a.batch) {
        // A file that cannot be decoded is named once and skipped, as Ultralytics does.
        let mut paths = Vec::with_capacity(chunk.len());
        let mut images = Vec::with_capacity(chunk.len());
        for path in chunk {
            match crate::data::open_rgb(path) {
                Ok(image) => {
                    paths.push(path);
                    images.push(image);
                }
                Err(e) => {
                    bar.suspend(|| eprintln!("warning: {e}; skipped"));
                    skipped += 1;
                    bar.inc(1);
                }
            }
        }
        if images.is_empty() {
            continue;
        }
        let found = predictor.predict(&images);
        for ((path, mut image), detections) in paths.into_iter().zip(images).zip(found) {
            let marks: Vec<draw::Mark> = detections
                .iter()
                .map(|d| draw::Mark::found(d, &predictor.layout))
                .collect();
            draw::annotate(&mut image, &marks, &predictor.layout);
            let name = output_name(path, &mut used);
            let target = out.join(&name);
            image
                .save(&target)
                .with_context(|| format!("writing {}", target.display()))?;
            let prediction = ImagePrediction {
                image: path.clone(),
                width: image.width(),
                height: image.height(),
                detections,
            };
            // As Ultralytics: an image without detections gets no label file (a background).
            if let Some(labels) = &a.labels
                && !prediction.detections.is_empty()
            {
                let file = labels_dir.join(Path::new(&name).with_extension("txt"));
                std::fs::write(&file, prediction.yolo_label(labels.score))
                    .with_context(|| format!("writing {}", file.display()))?;
            }
            results.push(prediction);
            bar.inc(1);
        }
    }
    bar.finish();
    anyhow::ensure!(
        !results.is_empty(),
        "none of the {} images could be decoded (each is named above)",
        files.len()
    );
    let json = out.join("predictions.json");
    crate::train::report::write_atomic(&json, serde_json::to_string_pretty(&results)?.as_bytes())
        .with_context(|| format!("writing {}", json.display()))?;
    let total: usize = results.iter().map(|r| r.detections.len()).sum();
    let skipped = match skipped {
        0 => String::new(),
        n => format!(" ({n} undecodable file(s) skipped)"),
    };
    println!(
        "{total} detections in {} images{skipped}; annotated images and {} in {}",
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
