//! `burnpose predict CHECKPOINT SOURCE...`: a checkpoint's EMA model on images and videos, folders
//! of them (searched below subfolders), `.txt` lists and glob patterns, batched with a progress
//! bar; one annotated copy per image or video, `predictions.jsonl` written as it goes and
//! `predictions.json` at the end in the run folder. Undecodable files are named and skipped.

use crate::config::DeviceKind;
mod stages;

use crate::predict::video::{self, VideoReader};
use crate::predict::{PredictOptions, Predictor, source_files};
use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use stages::{Count, Predicted, Read, Reader, Writer};
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
            None if crate::weights::is_ultralytics(checkpoint) => anyhow::bail!(
                "--split {}: {} holds Ultralytics weights, which name no dataset; --config \
                 CONFIG gives one",
                self.name,
                checkpoint.display()
            ),
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
    let mut files = source_files(&a.sources)?;
    if let Some(split) = &a.split {
        files.extend(split.images(checkpoint)?);
    }
    if files.is_empty() {
        let mut names: Vec<String> = a.sources.iter().map(|p| p.display().to_string()).collect();
        names.extend(a.split.as_ref().map(|s| format!("split {}", s.name)));
        anyhow::bail!(
            "no images or videos in {} (images with the extensions {}; videos {})",
            names.join(", "),
            crate::data::yolo::decodable_extensions(),
            video::READ.join(", ")
        );
    }
    let mut cfg = crate::predict::model_config(checkpoint)?;
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
    // The bar counts images and video frames (as the containers list them; a video that cannot
    // be opened counts one, and is reported when it is reached).
    let videos = files.iter().filter(|f| video::is_video(f)).count();
    let units: u64 = files
        .iter()
        .map(|f| match video::is_video(f) {
            true => VideoReader::open(f).map_or(1, |r| r.frame_count()),
            false => 1,
        })
        .sum();
    let counted = match videos {
        0 => format!("{} images", files.len()),
        v => format!(
            "{} images and {v} videos ({} frames)",
            files.len() - v,
            units as usize + v - files.len()
        ),
    };
    println!(
        "{} from {} on {what}: {counted} at {} px, batch {}",
        cfg.model.yolo().name(),
        checkpoint.display(),
        predictor.options.imgsz,
        a.batch
    );
    let bar = ProgressBar::new(units);
    bar.set_style(
        ProgressStyle::with_template("{bar:25} {pos}/{len} [{elapsed}<{eta}]").expect("template"),
    );
    // Each image's or frame's result is a line of predictions.jsonl, written as it is produced
    // (flushed per batch), so an interrupted run keeps what it finished and memory does not grow
    // with the number of inputs; predictions.json is made from it at the end.
    let lines_path = out.join("predictions.jsonl");
    let mut lines = std::io::BufWriter::new(
        std::fs::File::create(&lines_path)
            .with_context(|| format!("creating {}", lines_path.display()))?,
    );
    let start = std::time::Instant::now();
    let layout = &predictor.layout;
    // Three stages overlap, one batch apart: a reader decodes and letterboxes the next batch,
    // this thread runs the network on the current one, a writer draws, encodes and records the
    // previous one. Decoding images, drawing and encoding images spread their batch over the
    // cores (results in input order); a video is decoded and encoded in order, and a batch never
    // spans two videos. A file that cannot be decoded is named once and skipped, as Ultralytics
    // does; a video that breaks off keeps the frames before the break.
    let (files, batch_size, labels, imgsz) = (&files, a.batch, &a.labels, predictor.options.imgsz);
    let progress = &bar;
    let mut network = Duration::ZERO;
    let (count, skipped, stages) = std::thread::scope(|scope| {
        let (prepared_tx, prepared_rx) = std::sync::mpsc::sync_channel::<Read>(1);
        let (found_tx, found_rx) = std::sync::mpsc::sync_channel::<Predicted>(1);
        let reader = scope.spawn(move || {
            let mut r = Reader {
                tx: prepared_tx,
                progress,
                imgsz,
                decode: Duration::ZERO,
                prepare: Duration::ZERO,
                skipped: 0,
            };
            let mut i = 0;
            while i < files.len() {
                let more = if video::is_video(&files[i]) {
                    i += 1;
                    r.video(&files[i - 1], batch_size)
                } else {
                    let end = (i..files.len())
                        .take(batch_size)
                        .take_while(|&j| !video::is_video(&files[j]))
                        .last()
                        .map_or(i, |j| j + 1);
                    let chunk = &files[i..end];
                    i = end;
                    r.images(chunk)
                };
                if !more {
                    break;
                }
            }
            (r.decode, r.prepare, r.skipped)
        });
        let writer = scope.spawn(|| -> anyhow::Result<(Count, Duration)> {
            let mut w = Writer::new(&out, &labels_dir, labels, layout);
            let mut busy = Duration::ZERO;
            for batch in found_rx {
                let t = Instant::now();
                for prediction in w.batch(batch)? {
                    serde_json::to_writer(&mut lines, &prediction)?;
                    writeln!(lines).with_context(|| format!("writing {}", lines_path.display()))?;
                    w.count.total += prediction.detections.len();
                    bar.inc(1);
                }
                lines
                    .flush()
                    .with_context(|| format!("writing {}", lines_path.display()))?;
                busy += t.elapsed();
            }
            w.finish_video()?;
            Ok((w.count, busy))
        });
        for (origins, images, prepared) in prepared_rx {
            let t = Instant::now();
            let found = predictor.run(prepared);
            network += t.elapsed();
            let batch = origins
                .into_iter()
                .zip(images)
                .zip(found)
                .map(|((o, i), f)| (o, i, f))
                .collect();
            // The writer stopped: its error is returned below.
            if found_tx.send(batch).is_err() {
                break;
            }
        }
        drop(found_tx);
        let (decode, prepare, skipped) = reader.join().expect("the predict reader panicked");
        let (count, write) = writer.join().expect("the predict writer panicked")?;
        anyhow::Ok((count, skipped, [decode, prepare, network, write]))
    })?;
    bar.finish();
    let seconds = start.elapsed().as_secs_f64();
    let done = count.images + count.frames;
    anyhow::ensure!(
        done > 0,
        "none of the {} sources could be decoded (each is named above)",
        files.len()
    );
    let json = out.join("predictions.json");
    json_array_of_lines(&lines_path, &json)
        .with_context(|| format!("writing {}", json.display()))?;
    let skipped = match skipped {
        0 => String::new(),
        n => format!(" ({n} undecodable file(s) skipped)"),
    };
    let inputs = match count.videos {
        0 => format!("{} images", count.images),
        v => format!(
            "{} images and {} frames of {v} videos",
            count.images, count.frames
        ),
    };
    let per_image = stages.map(|d| 1e3 * d.as_secs_f64() / done as f64);
    println!(
        "{} detections in {inputs}{skipped}; {seconds:.1} s, {:.1} images/s; annotated \
         {} and {} in {}",
        count.total,
        done as f64 / seconds.max(1e-9),
        if count.videos > 0 {
            "images, videos"
        } else {
            "images"
        },
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
