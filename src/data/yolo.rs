//! Ultralytics YOLO datasets: a yaml (`path`, `train`, `val`, `kpt_shape`, `flip_idx`, `names`)
//! and one `.txt` per image under `labels/` beside `images/`, a row per object:
//! `class cx cy w h` (+ `k × d` keypoint values for pose), normalised to the image size.

use super::error::DataError;
use super::{Instance, Sample};
use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Deserialize)]
struct YamlFile {
    #[serde(default)]
    path: Option<PathBuf>,
    train: Folders,
    val: Folders,
    #[serde(default)]
    kpt_shape: Option<[usize; 2]>,
    #[serde(default)]
    flip_idx: Option<Vec<usize>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Folders {
    One(PathBuf),
    Many(Vec<PathBuf>),
}

/// One label row in normalised units.
#[derive(Clone, Debug, PartialEq)]
struct Row {
    class: usize,
    /// `[cx, cy, w, h]`.
    bbox: [f32; 4],
    keypoints: Vec<[f32; 3]>,
}

#[derive(Clone, Debug)]
pub struct YoloItem {
    pub image: PathBuf,
    rows: Vec<Row>,
}

#[derive(Clone, Debug)]
pub struct YoloDataset {
    pub yaml: PathBuf,
    pub items: Vec<YoloItem>,
    /// Keypoints per object and values per keypoint (2 or 3); `[0, 0]` for detection.
    pub kpt_shape: [usize; 2],
    pub flip_idx: Option<Vec<usize>>,
}

const IMAGE_EXTENSIONS: [&str; 6] = ["jpg", "jpeg", "png", "bmp", "webp", "tif"];

impl YoloDataset {
    /// Train and val splits of the dataset yaml at `yaml`, whose `kpt_shape` must equal the
    /// model's (`[0, 0]` for detection: no keypoint columns); and how many bad records
    /// `skip_bad` dropped.
    pub fn open_pair(
        yaml: &Path,
        kpt_shape: [usize; 2],
        skip_bad: bool,
    ) -> Result<(Self, Self, usize), DataError> {
        let text = std::fs::read_to_string(yaml).map_err(|error| DataError::Io {
            path: yaml.to_path_buf(),
            error,
        })?;
        let file: YamlFile = serde_yaml_ng::from_str(&text).map_err(|e| DataError::Json {
            path: yaml.to_path_buf(),
            message: e.to_string(),
        })?;
        let declared = file.kpt_shape.unwrap_or([0, 0]);
        if declared != kpt_shape {
            return Err(DataError::Label {
                path: yaml.to_path_buf(),
                record: "kpt_shape".into(),
                message: format!("{declared:?}, but the model expects {kpt_shape:?}"),
            });
        }
        if let Some(f) = &file.flip_idx
            && (f.len() != kpt_shape[0] || f.iter().any(|&i| i >= kpt_shape[0]))
        {
            return Err(DataError::Label {
                path: yaml.to_path_buf(),
                record: "flip_idx".into(),
                message: format!("must permute 0..{}", kpt_shape[0]),
            });
        }
        let here = yaml.parent().unwrap_or(Path::new("."));
        let root = match file.path {
            Some(p) if p.is_absolute() => p,
            Some(p) => here.join(p),
            None => here.to_path_buf(),
        };
        let mut skipped = 0;
        let mut split = |folders: &Folders| -> Result<Self, DataError> {
            let folders = match folders {
                Folders::One(p) => std::slice::from_ref(p),
                Folders::Many(v) => v.as_slice(),
            };
            let mut items = Vec::new();
            for folder in folders {
                let (found, bad) = scan(&root.join(folder), kpt_shape, skip_bad)?;
                items.extend(found);
                skipped += bad;
            }
            Ok(Self {
                yaml: yaml.to_path_buf(),
                items,
                kpt_shape,
                flip_idx: file.flip_idx.clone(),
            })
        };
        let train = split(&file.train)?;
        let val = split(&file.val)?;
        Ok((train, val, skipped))
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Decoded image `i` with its labels in pixels.
    pub fn get(&self, i: usize) -> Result<Sample, DataError> {
        let path = &self.items[i].image;
        let image = image::open(path)
            .map_err(|e| DataError::Image {
                path: path.clone(),
                message: e.to_string(),
            })?
            .to_rgb8();
        let instances = self.instances(i, image.dimensions());
        Ok(Sample { image, instances })
    }

    /// Labels of image `i` in pixels of a `w × h` image.
    pub fn instances(&self, i: usize, (w, h): (u32, u32)) -> Vec<Instance> {
        let (w, h) = (w as f32, h as f32);
        self.items[i]
            .rows
            .iter()
            .map(|r| {
                let [cx, cy, bw, bh] = r.bbox;
                Instance {
                    class: r.class,
                    bbox: [
                        (cx - bw / 2.0) * w,
                        (cy - bh / 2.0) * h,
                        (cx + bw / 2.0) * w,
                        (cy + bh / 2.0) * h,
                    ],
                    keypoints: r
                        .keypoints
                        .iter()
                        .map(|k| match k[2] {
                            0.0 => [0.0; 3],
                            v => [k[0] * w, k[1] * h, v],
                        })
                        .collect(),
                }
            })
            .collect()
    }
}

/// Images of `folder` (sorted by name) with the labels of `…/labels/…/<stem>.txt`. An image
/// whose header cannot be read, or a label file with a bad row, is an error naming the file
/// (and line), or with `skip_bad` a warning and a skipped image.
fn scan(
    folder: &Path,
    kpt_shape: [usize; 2],
    skip_bad: bool,
) -> Result<(Vec<YoloItem>, usize), DataError> {
    let read = std::fs::read_dir(folder).map_err(|error| DataError::Io {
        path: folder.to_path_buf(),
        error,
    })?;
    let mut images: Vec<PathBuf> = read
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| IMAGE_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()))
        })
        .collect();
    images.sort();
    let mut items = Vec::new();
    let mut skipped = 0;
    for image in images {
        match load_item(&image, kpt_shape) {
            Ok(item) => items.push(item),
            Err(e) if skip_bad => {
                eprintln!("warning: {e}; skipped");
                skipped += 1;
            }
            Err(e) => return Err(e),
        }
    }
    Ok((items, skipped))
}

fn load_item(image: &Path, kpt_shape: [usize; 2]) -> Result<YoloItem, DataError> {
    image::image_dimensions(image).map_err(|e| DataError::Image {
        path: image.to_path_buf(),
        message: e.to_string(),
    })?;
    let label = label_path(image);
    let rows = match std::fs::read_to_string(&label) {
        Ok(text) => parse_rows(&text, &label, kpt_shape)?,
        // No label file: a background image, as in Ultralytics.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(error) => {
            return Err(DataError::Io { path: label, error });
        }
    };
    Ok(YoloItem {
        image: image.to_path_buf(),
        rows,
    })
}

/// `…/images/…/name.ext` → `…/labels/…/name.txt` (the last `images` component).
pub fn label_path(image: &Path) -> PathBuf {
    let parts: Vec<_> = image.components().collect();
    let at = parts.iter().rposition(|c| c.as_os_str() == "images");
    let mut out = PathBuf::new();
    for (i, c) in parts.iter().enumerate() {
        if Some(i) == at {
            out.push("labels");
        } else {
            out.push(c);
        }
    }
    out.with_extension("txt")
}

fn parse_rows(text: &str, path: &Path, [k, d]: [usize; 2]) -> Result<Vec<Row>, DataError> {
    let want = 5 + k * d;
    let mut rows: Vec<Row> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let bad = |message: String| DataError::Label {
            path: path.to_path_buf(),
            record: format!("line {}", n + 1),
            message,
        };
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.is_empty() {
            continue;
        }
        if fields.len() != want {
            let what = if k > 0 {
                format!("5 + {k}×{d} keypoint values")
            } else {
                "class cx cy w h".into()
            };
            return Err(bad(format!(
                "{} fields, expected {want} ({what})",
                fields.len()
            )));
        }
        let values = fields
            .iter()
            .map(|f| f.parse::<f32>().ok().filter(|v| v.is_finite()))
            .collect::<Option<Vec<f32>>>()
            .ok_or_else(|| bad("a field is not a finite number".into()))?;
        let class = values[0];
        if class < 0.0 || class.fract() != 0.0 {
            return Err(bad(format!("class {class} is not a non-negative integer")));
        }
        let bbox = [values[1], values[2], values[3], values[4]];
        if bbox.iter().any(|v| !(0.0..=1.01).contains(v)) {
            return Err(bad(format!("box {bbox:?} is not normalised to [0, 1]")));
        }
        let keypoints: Vec<[f32; 3]> = values[5..]
            .chunks(d.max(1))
            .map(|c| match d {
                // Two values per keypoint: a negative coordinate marks it missing.
                2 if c[0] < 0.0 || c[1] < 0.0 => [0.0; 3],
                2 => [c[0], c[1], 2.0],
                _ => [c[0], c[1], c[2]],
            })
            .collect();
        if keypoints
            .iter()
            .any(|p| p[2] > 0.0 && (p[0] > 1.01 || p[1] > 1.01))
        {
            return Err(bad("a keypoint is not normalised to [0, 1]".into()));
        }
        let row = Row {
            class: class as usize,
            bbox,
            keypoints,
        };
        // Duplicate rows are dropped, as Ultralytics does.
        if !rows.contains(&row) {
            rows.push(row);
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests;
