//! `burnpose predict CHECKPOINT SOURCE...`: a checkpoint's EMA model on images, folders of images
//! (searched below subfolders), `.txt` lists and glob patterns, batched with a progress bar; one
//! annotated copy per image, `predictions.jsonl` written as it goes and `predictions.json` at the
//! end in the run folder. Undecodable files are named and skipped.

use crate::config::DeviceKind;
use crate::predict::{ImagePrediction, PredictOptions, Predictor, draw, image_files};
use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What `predict` takes besides the checkpoint and sources.
pub struct PredictArgs {
    pub sources: Vec<PathBuf>,
    /// A split of a dataset, predicted on besides `sources`.
    pub split: Option<Split>,
    /// The folder to write into (default: a fresh `runs/predict/predict<N>`).
    pub out: Option<PathBuf>,
    pub options: PredictOptions,
    pub device: Option<DeviceKind>,
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
            parent.join(crate::train::unused_run_name(&parent, "predict"))
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
    // Each image's result is a line of predictions.jsonl, written as it is produced (flushed per
    // batch), so an interrupted run keeps what it finished and memory does not grow with the
    // number of images; predictions.json is made from it at the end.
    let lines_path = out.join("predictions.jsonl");
    let mut lines = std::io::BufWriter::new(
        std::fs::File::create(&lines_path)
            .with_context(|| format!("creating {}", lines_path.display()))?,
    );
    let start = std::time::Instant::now();
    let layout = &predictor.layout;
    // Three stages overlap, one batch apart: a reader decodes and letterboxes the next batch,
    // this thread runs the network on the current one, a writer draws, encodes and records the
    // previous one. Decoding, drawing and encoding spread their batch over the cores (results in
    // input order). A file that cannot be decoded is named once and skipped, as Ultralytics does.
    let (files, batch_size, labels, imgsz) = (&files, a.batch, &a.labels, predictor.options.imgsz);
    let progress = &bar;
    let mut network = Duration::ZERO;
    let (done, total, skipped, stages) = std::thread::scope(|scope| {
        let (prepared_tx, prepared_rx) = std::sync::mpsc::sync_channel::<Read>(1);
        let (found_tx, found_rx) = std::sync::mpsc::sync_channel::<Predicted>(1);
        let reader = scope.spawn(move || {
            let (mut decode, mut prepare, mut skipped) = (Duration::ZERO, Duration::ZERO, 0);
            for chunk in files.chunks(batch_size) {
                let t = Instant::now();
                let decoded = in_parallel(chunk.iter().collect(), |p| crate::data::open_rgb(p));
                decode += t.elapsed();
                let mut paths = Vec::with_capacity(chunk.len());
                let mut images = Vec::with_capacity(chunk.len());
                for (path, decoded) in chunk.iter().zip(decoded) {
                    match decoded {
                        Ok(image) => {
                            paths.push(path);
                            images.push(image);
                        }
                        Err(e) => {
                            progress.suspend(|| eprintln!("warning: {e}; skipped"));
                            skipped += 1;
                            progress.inc(1);
                        }
                    }
                }
                if images.is_empty() {
                    continue;
                }
                let t = Instant::now();
                let prepared = crate::predict::prepare(&images, imgsz);
                prepare += t.elapsed();
                if prepared_tx.send((paths, images, prepared)).is_err() {
                    break;
                }
            }
            (decode, prepare, skipped)
        });
        let writer = scope.spawn(|| -> anyhow::Result<(usize, usize, Duration)> {
            let (mut done, mut total, mut busy) = (0, 0, Duration::ZERO);
            let mut used = std::collections::HashSet::new();
            for batch in found_rx {
                let t = Instant::now();
                let jobs: Vec<_> = batch
                    .into_iter()
                    .map(|(path, image, detections)| {
                        let name = output_name(path, &mut used);
                        (path, image, detections, name)
                    })
                    .collect();
                let written = in_parallel(jobs, |(path, mut image, detections, name)| {
                    let marks: Vec<draw::Mark> = detections
                        .iter()
                        .map(|d| draw::Mark::found(d, layout))
                        .collect();
                    draw::annotate(&mut image, &marks, layout);
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
                    // As Ultralytics: an image without detections gets no label file (a
                    // background).
                    if let Some(labels) = labels
                        && !prediction.detections.is_empty()
                    {
                        let file = labels_dir.join(Path::new(&name).with_extension("txt"));
                        std::fs::write(&file, prediction.yolo_label(labels.score))
                            .with_context(|| format!("writing {}", file.display()))?;
                    }
                    anyhow::Ok(prediction)
                });
                for prediction in written {
                    let prediction = prediction?;
                    serde_json::to_writer(&mut lines, &prediction)?;
                    writeln!(lines).with_context(|| format!("writing {}", lines_path.display()))?;
                    done += 1;
                    total += prediction.detections.len();
                    bar.inc(1);
                }
                lines
                    .flush()
                    .with_context(|| format!("writing {}", lines_path.display()))?;
                busy += t.elapsed();
            }
            Ok((done, total, busy))
        });
        for (paths, images, prepared) in prepared_rx {
            let t = Instant::now();
            let found = predictor.run(prepared);
            network += t.elapsed();
            let batch = paths
                .into_iter()
                .zip(images)
                .zip(found)
                .map(|((p, i), f)| (p, i, f))
                .collect();
            // The writer stopped: its error is returned below.
            if found_tx.send(batch).is_err() {
                break;
            }
        }
        drop(found_tx);
        let (decode, prepare, skipped) = reader.join().expect("the predict reader panicked");
        let (done, total, write) = writer.join().expect("the predict writer panicked")?;
        anyhow::Ok((done, total, skipped, [decode, prepare, network, write]))
    })?;
    bar.finish();
    let seconds = start.elapsed().as_secs_f64();
    anyhow::ensure!(
        done > 0,
        "none of the {} images could be decoded (each is named above)",
        files.len()
    );
    let json = out.join("predictions.json");
    json_array_of_lines(&lines_path, &json)
        .with_context(|| format!("writing {}", json.display()))?;
    let skipped = match skipped {
        0 => String::new(),
        n => format!(" ({n} undecodable file(s) skipped)"),
    };
    let per_image = stages.map(|d| 1e3 * d.as_secs_f64() / done as f64);
    println!(
        "{total} detections in {done} images{skipped}; {seconds:.1} s, {:.1} images/s; annotated \
         images and {} in {}",
        done as f64 / seconds.max(1e-9),
        json.file_name().expect("a file").to_string_lossy(),
        out.display()
    );
    // As Ultralytics' "Speed: … per image" line; the stages overlap, so the slowest one bounds
    // the rate.
    println!(
        "per image: decode {:.1} ms, prepare {:.1} ms, network {:.1} ms, draw + write {:.1} ms \
         (overlapping stages)",
        per_image[0], per_image[1], per_image[2], per_image[3]
    );
    Ok(())
}

/// One batch's decoded images, and the same letterboxed for the network, from the reader.
type Read<'a> = (
    Vec<&'a PathBuf>,
    Vec<image::RgbImage>,
    crate::predict::Prepared,
);

/// One batch's images with their detections, from the network to the writer.
type Predicted<'a> = Vec<(&'a PathBuf, image::RgbImage, Vec<crate::predict::Found>)>;

/// `f` of every item (moved in, not copied), in the items' order, spread over up to the machine's
/// cores in contiguous runs of items.
fn in_parallel<T: Send, R: Send>(mut items: Vec<T>, f: impl Fn(T) -> R + Sync) -> Vec<R> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if items.len() <= 1 || cores == 1 {
        return items.into_iter().map(f).collect();
    }
    let per = items.len().div_ceil(cores);
    let mut runs = Vec::new();
    while !items.is_empty() {
        let rest = items.split_off(per.min(items.len()));
        runs.push(std::mem::replace(&mut items, rest));
    }
    std::thread::scope(|scope| {
        let f = &f;
        let runs: Vec<_> = runs
            .into_iter()
            .map(|run| scope.spawn(move || run.into_iter().map(f).collect::<Vec<R>>()))
            .collect();
        runs.into_iter()
            .flat_map(|h| h.join().expect("a predict worker panicked"))
            .collect()
    })
}

/// The JSON values of `lines` (one per line) as one JSON array in `json`, streamed through a
/// temporary file and renamed into place.
fn json_array_of_lines(lines: &Path, json: &Path) -> anyhow::Result<()> {
    use std::io::BufRead;
    let tmp = json.with_extension("json.tmp");
    let mut w = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
    w.write_all(b"[")?;
    for (i, line) in std::io::BufReader::new(std::fs::File::open(lines)?)
        .lines()
        .enumerate()
    {
        w.write_all(if i == 0 { b"\n" } else { b",\n" })?;
        w.write_all(line?.as_bytes())?;
    }
    w.write_all(b"\n]\n")?;
    w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    std::fs::rename(&tmp, json)?;
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
