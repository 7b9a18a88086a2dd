//! The three overlapping stages of `predict` (docs/predict.md): the reader decodes images and
//! video frames and letterboxes them, the network runs on the caller's thread, the writer draws,
//! writes pictures, videos, label files, and makes the JSON records.

use super::Labels;
use crate::predict::video::{self, VideoReader, VideoWriter};
use crate::predict::{ImagePrediction, draw};
use anyhow::Context;
use indicatif::ProgressBar;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where an image in the pipeline comes from.
#[derive(Clone, Copy)]
pub(super) enum Origin<'a> {
    File(&'a PathBuf),
    Frame {
        video: &'a PathBuf,
        frame: u64,
        time: f64,
        fps: f64,
    },
}

/// One batch's sources and decoded images, and the same letterboxed for the network, from the
/// reader.
pub(super) type Read<'a> = (
    Vec<Origin<'a>>,
    Vec<image::RgbImage>,
    crate::predict::Prepared,
);

/// One batch's images with their detections, from the network to the writer.
pub(super) type Predicted<'a> = Vec<(Origin<'a>, image::RgbImage, Vec<crate::predict::Found>)>;

/// The reading stage: decodes, letterboxes and hands on batches; names and counts what it skips.
pub(super) struct Reader<'a, 'b> {
    pub(super) tx: std::sync::mpsc::SyncSender<Read<'a>>,
    pub(super) progress: &'b ProgressBar,
    pub(super) imgsz: usize,
    pub(super) decode: Duration,
    pub(super) prepare: Duration,
    pub(super) skipped: usize,
}

impl<'a> Reader<'a, '_> {
    fn warn(&self, message: impl std::fmt::Display) {
        self.progress.suspend(|| eprintln!("warning: {message}"));
    }

    /// Hands on a batch; false once the network side has stopped.
    fn send(&mut self, origins: Vec<Origin<'a>>, images: Vec<image::RgbImage>) -> bool {
        let t = Instant::now();
        let prepared = crate::predict::prepare(&images, self.imgsz);
        self.prepare += t.elapsed();
        self.tx.send((origins, images, prepared)).is_ok()
    }

    /// A batch of image files, decoded in parallel.
    pub(super) fn images(&mut self, chunk: &'a [PathBuf]) -> bool {
        let t = Instant::now();
        let decoded = in_parallel(chunk.iter().collect(), |p| crate::data::open_rgb(p));
        self.decode += t.elapsed();
        let mut origins = Vec::with_capacity(chunk.len());
        let mut images = Vec::with_capacity(chunk.len());
        for (path, decoded) in chunk.iter().zip(decoded) {
            match decoded {
                Ok(image) => {
                    origins.push(Origin::File(path));
                    images.push(image);
                }
                Err(e) => {
                    self.warn(format_args!("{e}; skipped"));
                    self.skipped += 1;
                    self.progress.inc(1);
                }
            }
        }
        images.is_empty() || self.send(origins, images)
    }

    /// One video's frames, in batches of `batch`.
    pub(super) fn video(&mut self, path: &'a PathBuf, batch: usize) -> bool {
        let mut reader = match VideoReader::open(path) {
            Ok(r) => r,
            Err(e) => {
                self.warn(format_args!("{e}; skipped"));
                self.skipped += 1;
                self.progress.inc(1);
                return true;
            }
        };
        let (listed, fps) = (reader.frame_count(), reader.fps());
        let (mut got, mut failed) = (0, false);
        loop {
            let t = Instant::now();
            let (mut origins, mut images, mut done) = (Vec::new(), Vec::new(), false);
            while images.len() < batch {
                match reader.next() {
                    Some(Ok(f)) => {
                        origins.push(Origin::Frame {
                            video: path,
                            frame: f.frame,
                            time: f.time,
                            fps,
                        });
                        images.push(f.image);
                    }
                    Some(Err(e)) => {
                        self.warn(format_args!("{e}; the rest of the video is skipped"));
                        (done, failed) = (true, true);
                        break;
                    }
                    None => {
                        done = true;
                        break;
                    }
                }
            }
            self.decode += t.elapsed();
            got += images.len() as u64;
            if !images.is_empty() && !self.send(origins, images) {
                return false;
            }
            if done {
                break;
            }
        }
        // The bar counted the frames the container lists.
        if got < listed {
            self.progress.inc(listed - got);
        } else {
            self.progress.inc_length(got - listed);
        }
        if got == 0 {
            if !failed {
                self.warn(format_args!("{}: no frames; skipped", path.display()));
            }
            self.skipped += 1;
        }
        true
    }
}

#[derive(Default)]
pub(super) struct Count {
    pub(super) images: usize,
    pub(super) frames: usize,
    pub(super) videos: usize,
    /// Detections.
    pub(super) total: usize,
}

/// The video being written: its source, its output and its label files' base name.
struct OpenVideo<'a> {
    source: &'a PathBuf,
    base: String,
    writer: VideoWriter,
}

/// The writing stage: draws, writes pictures, videos and label files, makes the JSON records.
pub(super) struct Writer<'a, 'b> {
    pub(super) out: &'b Path,
    pub(super) labels_dir: &'b Path,
    pub(super) labels: &'b Option<Labels>,
    pub(super) layout: &'b crate::predict::Layout,
    used: std::collections::HashSet<String>,
    video: Option<OpenVideo<'a>>,
    pub(super) count: Count,
}

impl<'a, 'b> Writer<'a, 'b> {
    pub(super) fn new(
        out: &'b Path,
        labels_dir: &'b Path,
        labels: &'b Option<Labels>,
        layout: &'b crate::predict::Layout,
    ) -> Self {
        Self {
            out,
            labels_dir,
            labels,
            layout,
            used: Default::default(),
            video: None,
            count: Count::default(),
        }
    }

    /// One batch: drawn (and image files written) in parallel, video frames encoded in order;
    /// the records in input order.
    pub(super) fn batch(&mut self, batch: Predicted<'a>) -> anyhow::Result<Vec<ImagePrediction>> {
        // Names in input order: an image's file, a video frame's label file base.
        let mut jobs = Vec::with_capacity(batch.len());
        for (origin, image, detections) in batch {
            let name = match origin {
                Origin::File(path) => output_name(path, image_extension(path), &mut self.used),
                Origin::Frame { video, frame, .. } => {
                    if self.video.as_ref().is_none_or(|v| v.source != video) {
                        self.start_video(video, &image, origin)?;
                    }
                    let base = &self.video.as_ref().expect("started above").base;
                    format!("{base}_{frame}")
                }
            };
            jobs.push((origin, image, detections, name));
        }
        let (out, labels_dir, labels, layout) =
            (self.out, self.labels_dir, self.labels, self.layout);
        let coded_size = self.video.as_ref().map(|v| v.writer.size());
        let drawn = in_parallel(jobs, |(origin, mut image, detections, name)| {
            let marks: Vec<draw::Mark> = detections
                .iter()
                .map(|d| draw::Mark::found(d, layout))
                .collect();
            draw::annotate(&mut image, &marks, layout);
            let (source, frame, time) = match origin {
                Origin::File(path) => {
                    let target = out.join(&name);
                    image
                        .save(&target)
                        .with_context(|| format!("writing {}", target.display()))?;
                    (path, None, None)
                }
                Origin::Frame {
                    video, frame, time, ..
                } => (video, Some(frame), Some(time)),
            };
            let prediction = ImagePrediction {
                image: source.clone(),
                frame,
                time,
                width: image.width(),
                height: image.height(),
                detections,
            };
            // As Ultralytics: an image or frame without detections gets no label file (a
            // background).
            if let Some(labels) = labels
                && !prediction.detections.is_empty()
            {
                let label = match origin {
                    Origin::File(_) => Path::new(&name).with_extension("txt"),
                    Origin::Frame { .. } => PathBuf::from(format!("{name}.txt")),
                };
                let file = labels_dir.join(label);
                std::fs::write(&file, prediction.yolo_label(labels.score))
                    .with_context(|| format!("writing {}", file.display()))?;
            }
            // A frame's colour conversion here, on the drawing threads; its encoding below, in
            // order.
            let coded = match (frame, coded_size) {
                (Some(_), Some(size)) => {
                    Some(video::coded(&image, size).map_err(anyhow::Error::msg)?)
                }
                _ => None,
            };
            anyhow::Ok((prediction, coded))
        });
        let mut records = Vec::with_capacity(drawn.len());
        for item in drawn {
            let (prediction, coded) = item?;
            match coded {
                Some(frame) => {
                    let v = self.video.as_mut().expect("a frame's video is open");
                    v.writer.write_coded(&frame)?;
                    self.count.frames += 1;
                }
                None => self.count.images += 1,
            }
            records.push(prediction);
        }
        Ok(records)
    }

    /// Finishes the open video, if any, and opens `<stem>.mp4` for `video`.
    fn start_video(
        &mut self,
        video: &'a PathBuf,
        first: &image::RgbImage,
        origin: Origin<'a>,
    ) -> anyhow::Result<()> {
        self.finish_video()?;
        let Origin::Frame { fps, .. } = origin else {
            unreachable!("called for frames")
        };
        let name = output_name(video, "mp4", &mut self.used);
        let path = self.out.join(&name);
        let writer = VideoWriter::create(&path, first.width(), first.height(), fps)?;
        let base = name.trim_end_matches(".mp4").to_string();
        self.video = Some(OpenVideo {
            source: video,
            base,
            writer,
        });
        self.count.videos += 1;
        Ok(())
    }

    pub(super) fn finish_video(&mut self) -> anyhow::Result<()> {
        if let Some(v) = self.video.take() {
            v.writer.finish()?;
        }
        Ok(())
    }
}

/// `f` of every item (moved in, not copied), in the items' order, spread over up to the machine's
/// cores in contiguous runs of items.
pub(super) fn in_parallel<T: Send, R: Send>(
    mut items: Vec<T>,
    f: impl Fn(T) -> R + Sync,
) -> Vec<R> {
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

/// An annotated image's extension: PNG sources stay PNG, others become JPEG.
fn image_extension(path: &Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()) {
        Some(e) if e.eq_ignore_ascii_case("png") => "png",
        _ => "jpg",
    }
}

/// `<stem>.<ext>`, with a numeric suffix when two sources share a stem.
fn output_name(path: &Path, ext: &str, used: &mut std::collections::HashSet<String>) -> String {
    let stem = path
        .file_stem()
        .map_or("image".into(), |s| s.to_string_lossy().to_string());
    let mut name = format!("{stem}.{ext}");
    let mut i = 2;
    while !used.insert(name.clone()) {
        name = format!("{stem}_{i}.{ext}");
        i += 1;
    }
    name
}
