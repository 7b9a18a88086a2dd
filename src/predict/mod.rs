//! Prediction: a trained model run on images, detections mapped back to each image's own pixels,
//! annotated copies and a JSON file written (`burnpose predict`; contract in docs/predict.md).
//!
//! The one public entry is [`Predictor`]: built from a checkpoint (its EMA weights and config, no
//! training data needed), it turns images into [`ImagePrediction`]s. Drawing lives in [`draw`].

pub mod draw;
pub mod layout;
pub mod video;

use crate::config::Config;
use crate::data::letterbox::{letterbox, letterbox_rect};
use crate::data::{Batch, Frame, Sample};
use crate::eval::{Detection, Select, detect};
use crate::model::Yolo;
use burn::prelude::*;
use std::path::{Path, PathBuf};

pub use layout::Layout;

/// How detections are chosen; defaults are Ultralytics' for `predict`.
#[derive(Clone, Debug, PartialEq)]
pub struct PredictOptions {
    /// Keep detections scoring above this.
    pub conf: f32,
    /// NMS IoU threshold; used only with `nms` (the one-to-one head needs no NMS).
    pub iou: f32,
    /// At most this many detections per image.
    pub max_det: usize,
    /// Square network input; a multiple of 32.
    pub imgsz: usize,
    /// Use the one-to-many head with NMS instead of the one-to-one (NMS-free) head.
    pub nms: bool,
}

impl Default for PredictOptions {
    fn default() -> Self {
        Self {
            conf: 0.25,
            iou: 0.7,
            max_det: 300,
            imgsz: 640,
            nms: false,
        }
    }
}

/// One image's detections in its own pixels (`bbox` as `[x1, y1, x2, y2]`, keypoints as
/// `[x, y, confidence]`).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ImagePrediction {
    /// The image file, or the video the frame is from.
    pub image: PathBuf,
    /// A video frame's number, from 1 (as in its label file's name, `<stem>_<frame>.txt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frame: Option<u64>,
    /// A video frame's time in seconds from the first frame, at the video's frame rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<f64>,
    pub width: u32,
    pub height: u32,
    pub detections: Vec<Found>,
}

/// One detection, as the JSON file stores it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Found {
    pub class: usize,
    /// The class's name, where the dataset names its classes.
    pub name: Option<String>,
    pub score: f32,
    pub bbox: [f32; 4],
    pub keypoints: Vec<[f32; 3]>,
}

impl ImagePrediction {
    /// The detections as a YOLO label file, as Ultralytics' `save_txt` writes it: a row per
    /// detection, `class cx cy w h` normalised to the image, then `x y confidence` per keypoint
    /// (a keypoint outside the image is written as missing, `0 0 0`, so that `fit` reads the file
    /// back as a dataset), then the detection's score when `with_score` (`save_conf`).
    pub fn yolo_label(&self, with_score: bool) -> String {
        let (w, h) = (self.width.max(1) as f32, self.height.max(1) as f32);
        let mut text = String::new();
        for d in &self.detections {
            let [x1, y1, x2, y2] = d.bbox;
            let (x1, x2) = ((x1 / w).clamp(0.0, 1.0), (x2 / w).clamp(0.0, 1.0));
            let (y1, y2) = ((y1 / h).clamp(0.0, 1.0), (y2 / h).clamp(0.0, 1.0));
            let mut row = vec![
                d.class.to_string(),
                number((x1 + x2) / 2.0),
                number((y1 + y2) / 2.0),
                number(x2 - x1),
                number(y2 - y1),
            ];
            for &[x, y, c] in &d.keypoints {
                let (x, y) = (x / w, y / h);
                if (0.0..=1.0).contains(&x) && (0.0..=1.0).contains(&y) {
                    row.extend([number(x), number(y), number(c)]);
                } else {
                    row.extend(["0".into(), "0".into(), "0".into()]);
                }
            }
            if with_score {
                row.push(number(d.score));
            }
            text.push_str(&row.join(" "));
            text.push('\n');
        }
        text
    }
}

/// `v` with six decimals, trailing zeros dropped.
fn number(v: f32) -> String {
    let s = format!("{v:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() || s == "-" {
        "0".into()
    } else {
        s.into()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PredictError {
    #[error(transparent)]
    Checkpoint(#[from] crate::train::checkpoint::CheckpointError),
    #[error(transparent)]
    Weights(#[from] crate::weights::WeightsError),
    #[error("predict: --imgsz {0} is not a positive multiple of 32")]
    ImageSize(usize),
}

/// `images` letterboxed to `imgsz` and collated for [`Predictor::run`] (host work only, so it
/// can run beside the network). As Ultralytics' predict: a batch whose images share one shape
/// (a video's frames, a folder of one camera's photos) is padded only up to the network's stride,
/// a mixed batch to the square.
pub fn prepare(images: &[image::RgbImage], imgsz: usize) -> Prepared {
    let size = imgsz as u32;
    let same_shape = images
        .iter()
        .all(|i| Some(i.dimensions()) == images.first().map(|f| f.dimensions()));
    let (samples, frames): (Vec<Sample>, Vec<Frame>) = images
        .iter()
        .map(|img| {
            let sample = Sample {
                image: img.clone(),
                instances: Vec::new(),
            };
            let (s, scale, pad) = match same_shape {
                true => letterbox_rect(sample, size, crate::model::STRIDES[2] as u32),
                false => letterbox(sample, size),
            };
            let size = [img.width() as f32, img.height() as f32];
            (s, Frame { scale, pad, size })
        })
        .unzip();
    Prepared {
        batch: Batch::collate(samples),
        frames,
    }
}

/// The config a model file carries: a checkpoint's own, or for Ultralytics weights one that
/// describes them (scale, task, classes, keypoints read off their shapes; the rest defaults,
/// `imgsz` 640, the built-in data).
pub fn model_config(path: &Path) -> Result<Config, PredictError> {
    if crate::weights::is_burn_native(path) {
        return Ok(config_for(&crate::weights::burn_file_model(path)?));
    }
    if !crate::weights::is_ultralytics(path) {
        return Ok(crate::train::checkpoint::read_config(path)?);
    }
    Ok(config_for(&crate::weights::file_model(path)?))
}

/// A config for a model that comes without one (weights files): its model, the rest default,
/// `imgsz` 640.
pub fn config_for(model: &crate::model::YoloConfig) -> Config {
    let mut cfg = Config::default();
    cfg.model.set_network(model);
    cfg.data.imgsz = 640;
    cfg
}

fn ultralytics_model(path: &Path, device: &Device) -> Result<(Config, Yolo), PredictError> {
    let cfg = model_config(path)?;
    let (model, _) = crate::weights::load_ultralytics(cfg.model.yolo().init(device), path)?;
    Ok((cfg, model))
}

/// Images letterboxed and collated for [`Predictor::run`], with how each was placed.
pub struct Prepared {
    batch: Batch,
    frames: Vec<Frame>,
}

/// A model ready to predict, with what it needs to name and draw what it finds.
pub struct Predictor {
    pub model: Yolo,
    pub cfg: Config,
    pub layout: Layout,
    pub options: PredictOptions,
    device: Device,
}

impl Predictor {
    /// The EMA weights of the checkpoint at `path` on `device`, with its config; `options.imgsz`
    /// 0 takes the checkpoint's training size. Ultralytics weights
    /// ([`crate::weights::is_ultralytics`]) are taken too: the model is read off their shapes
    /// and `imgsz` 0 is 640, Ultralytics' default.
    pub fn load(
        path: &Path,
        device: &Device,
        mut options: PredictOptions,
    ) -> Result<Self, PredictError> {
        let (cfg, model) = if crate::weights::is_burn_native(path) {
            let (about, model) = crate::weights::load_burn(path, device)?;
            (config_for(&about), model)
        } else if crate::weights::is_ultralytics(path) {
            ultralytics_model(path, device)?
        } else {
            crate::train::checkpoint::load_model(path, device)?
        };
        if options.imgsz == 0 {
            options.imgsz = cfg.data.imgsz;
        }
        if options.imgsz == 0 || !options.imgsz.is_multiple_of(32) {
            return Err(PredictError::ImageSize(options.imgsz));
        }
        Ok(Self::new(model, cfg, options, device))
    }

    /// `model` (on `device`, built from `cfg`) as a predictor; `options.imgsz` a multiple of 32.
    pub fn new(model: Yolo, cfg: Config, options: PredictOptions, device: &Device) -> Self {
        Self {
            layout: Layout::of(&cfg),
            model,
            cfg,
            options,
            device: device.clone(),
        }
    }

    /// Detections for each image, in that image's pixels.
    pub fn predict(&self, images: &[image::RgbImage]) -> Vec<Vec<Found>> {
        if images.is_empty() {
            return Vec::new();
        }
        self.run(prepare(images, self.options.imgsz))
    }

    /// The network and its post-processing on a prepared batch: detections for each image, in
    /// that image's pixels.
    pub fn run(&self, prepared: Prepared) -> Vec<Vec<Found>> {
        if prepared.frames.is_empty() {
            return Vec::new();
        }
        let o = &self.options;
        let select = Select {
            nk: self.cfg.model.keypoints(),
            nms: o.nms,
            max_det: o.max_det,
            conf: o.conf,
            iou: o.iou,
        };
        let images = prepared.batch.images_f32(&self.device);
        let per_image = detect(&self.model, images, &select);
        per_image
            .into_iter()
            .zip(prepared.frames)
            .map(|(dets, frame)| dets.iter().map(|d| self.found(d, &frame)).collect())
            .collect()
    }

    fn found(&self, d: &Detection, frame: &Frame) -> Found {
        let to = |x: f32, y: f32| {
            let (x, y) = frame.to_original(x, y);
            [x as f32, y as f32]
        };
        let [x1, y1] = to(d.bbox[0], d.bbox[1]);
        let [x2, y2] = to(d.bbox[2], d.bbox[3]);
        Found {
            class: d.class,
            name: self.layout.class_name(d.class),
            score: d.score,
            bbox: [x1, y1, x2, y2],
            keypoints: d
                .keypoints
                .iter()
                .map(|k| {
                    let [x, y] = to(k[0], k[1]);
                    [x, y, k[2]]
                })
                .collect(),
        }
    }
}

/// The sources a `.txt` list names, one per line, sorted, as Ultralytics' predict reads one: a
/// line is taken as written (absolute, or relative to the working directory) when it exists, else
/// relative to the list's folder; a line that names nothing is an error naming the list and line.
fn listed_sources(list: &Path) -> Result<Vec<PathBuf>, crate::data::DataError> {
    use crate::data::DataError;
    let text = std::fs::read_to_string(list).map_err(|error| DataError::Io {
        path: list.to_path_buf(),
        error,
    })?;
    let mut lines: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .map(|(n, l)| (n + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty())
        .collect();
    lines.sort_by_key(|&(_, l)| l);
    let here = list.parent().unwrap_or(Path::new("."));
    lines
        .into_iter()
        .map(|(n, line)| {
            let as_written = PathBuf::from(line);
            if as_written.exists() {
                return Ok(as_written);
            }
            let beside = here.join(line);
            if beside.exists() {
                return Ok(beside);
            }
            Err(DataError::Label {
                path: list.to_path_buf(),
                record: format!("line {n}"),
                message: format!(
                    "{line} does not exist (as written, or beside the list in {})",
                    here.display()
                ),
            })
        })
        .collect()
}

/// The images and videos of `sources`: files as given, folders searched below every subfolder (as
/// Ultralytics does), each folder's files sorted by path text, and a `.txt` file taken as a list
/// of such sources ([`listed_sources`]). Videos are told by their extension
/// ([`video::is_video`]; one this build cannot read is refused when it is reached). A missing
/// source, or a file that is neither an image this build decodes nor a video by its extension,
/// is an error naming it.
pub fn source_files(sources: &[PathBuf]) -> Result<Vec<PathBuf>, crate::data::DataError> {
    use crate::data::DataError;
    let is_source = |p: &Path| {
        video::is_video(p)
            || p.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| crate::data::yolo::decodable(&e.to_ascii_lowercase()))
    };
    let is_list =
        |p: &Path| p.extension().is_some_and(|e| e.eq_ignore_ascii_case("txt")) && p.is_file();
    let mut expanded = Vec::new();
    let mut out = Vec::new();
    for src in sources {
        if is_list(src) {
            expanded.extend(listed_sources(src)?);
        } else if src.to_string_lossy().contains('*') {
            out.extend(glob_sources(src, is_source)?);
        } else {
            expanded.push(src.clone());
        }
    }
    for src in &expanded {
        let meta = std::fs::metadata(src).map_err(|error| DataError::Io {
            path: src.clone(),
            error,
        })?;
        if meta.is_dir() {
            out.extend(crate::data::files_below(src, is_source)?);
        } else if is_source(src) {
            out.push(src.clone());
        } else {
            return Err(DataError::Image {
                path: src.clone(),
                message: format!(
                    "neither an image this build decodes ({}) nor a video ({})",
                    crate::data::yolo::decodable_extensions(),
                    video::READ.join(", ")
                ),
            });
        }
    }
    Ok(out)
}

/// The images and videos a glob pattern matches (`**` reaches into subfolders), sorted by path, as
/// Ultralytics expands a source holding `*`; other files it matches are left out. A pattern that
/// matches none is named in a warning (the run fails later only if no source gave an image).
fn glob_sources(
    pattern: &Path,
    is_source: impl Fn(&Path) -> bool,
) -> Result<Vec<PathBuf>, crate::data::DataError> {
    use crate::data::DataError;
    let text = pattern.to_string_lossy();
    let matches = glob::glob(&text).map_err(|e| DataError::Label {
        path: pattern.to_path_buf(),
        record: "glob pattern".into(),
        message: e.to_string(),
    })?;
    let mut found = Vec::new();
    for m in matches {
        let path = m.map_err(|e| DataError::Io {
            path: e.path().to_path_buf(),
            error: std::io::Error::new(e.error().kind(), e.error().to_string()),
        })?;
        if path.is_file() && is_source(&path) {
            found.push(path);
        }
    }
    if found.is_empty() {
        eprintln!("warning: {text} matches no image or video");
    }
    found.sort_by(|a, b| a.as_os_str().cmp(b.as_os_str()));
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_sources_expand_as_ultralytics_expands_them() {
        let dir = std::env::temp_dir().join(format!("burnpose-glob-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub/deeper")).unwrap();
        for f in [
            "a.png",
            "b.txt",
            "sub/c.jpg",
            "sub/deeper/d.png",
            "sub/deeper/e.PNG",
        ] {
            std::fs::write(dir.join(f), b"").unwrap();
        }
        let files = |pattern: &str| source_files(&[dir.join(pattern)]).unwrap();
        let under = |names: &[&str]| names.iter().map(|n| dir.join(n)).collect::<Vec<_>>();
        assert_eq!(
            files("**/*.png"),
            under(&["a.png", "sub/deeper/d.png"]),
            "sorted, subfolders included, case as written"
        );
        assert_eq!(files("*"), under(&["a.png"]), "images only, no folders");
        assert_eq!(
            files("sub/**/*"),
            under(&["sub/c.jpg", "sub/deeper/d.png", "sub/deeper/e.PNG"])
        );
        assert!(files("*.webp").is_empty(), "no match: a warning, no error");
        let e = source_files(&[dir.join("[*.png")]).unwrap_err().to_string();
        assert!(e.contains("glob pattern"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_txt_source_lists_files_and_folders_as_ultralytics_reads_it() {
        let dir = std::env::temp_dir().join(format!("burnpose-list-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub/deeper")).unwrap();
        for f in ["a.png", "sub/b.png", "sub/deeper/c.png", "d.png"] {
            image::RgbImage::new(4, 4).save(dir.join(f)).unwrap();
        }
        let absolute = dir.join("d.png");
        let list = dir.join("list.txt");
        // Relative lines are beside the list (they name nothing in the working directory); an
        // absolute one as written; blank lines are skipped; the lines are taken sorted.
        let text = format!("sub\n\n{}\n./a.png\n", absolute.display());
        std::fs::write(&list, text).unwrap();
        let files = source_files(std::slice::from_ref(&list)).unwrap();
        // Sorted as text: "./a.png" < "/…/d.png" < "sub".
        let want = [
            dir.join("./a.png"),
            absolute,
            dir.join("sub/b.png"),
            dir.join("sub/deeper/c.png"),
        ];
        assert_eq!(files, want);

        std::fs::write(&list, "a.png\nmissing.png\n").unwrap();
        let err = source_files(std::slice::from_ref(&list))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("list.txt") && err.contains("line 2") && err.contains("missing.png"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn yolo_label_rows_are_normalised_and_read_back() {
        let p = ImagePrediction {
            image: PathBuf::from("a.jpg"),
            frame: None,
            time: None,
            width: 200,
            height: 100,
            detections: vec![Found {
                class: 0,
                name: None,
                score: 0.875,
                bbox: [20.0, 10.0, 120.0, 90.0],
                keypoints: vec![[50.0, 25.0, 0.5], [250.0, 50.0, 0.9]],
            }],
        };
        // The second keypoint lies outside the image: written as missing.
        assert_eq!(
            p.yolo_label(false),
            "0 0.35 0.5 0.5 0.8 0.25 0.25 0.5 0 0 0\n"
        );
        assert_eq!(
            p.yolo_label(true),
            "0 0.35 0.5 0.5 0.8 0.25 0.25 0.5 0 0 0 0.875\n"
        );
    }
}
