//! Ultralytics YOLO datasets: a yaml (`path`, `train`, `val`, `kpt_shape`, `flip_idx`, `names`,
//! `nc`, `kpt_oks_sigmas`; other keys such as Roboflow's `roboflow:` are ignored) and one `.txt`
//! per image under `labels/` beside `images/`, a row per object: `class cx cy w h` (+ `k × d`
//! keypoint values for pose), normalised to the image size. A split is a folder, a `.txt` list of
//! image paths, or a list of those (docs/data.md, "YOLO datasets").

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
    /// Validated on instead of `val` when `data.val_split = "test"`.
    #[serde(default)]
    test: Option<Folders>,
    #[serde(default)]
    kpt_shape: Option<[usize; 2]>,
    #[serde(default)]
    flip_idx: Option<Vec<usize>>,
    /// A list, or a map from class id to name.
    #[serde(default)]
    names: Option<Names>,
    /// The class count; optional, but when given it must agree with `names` and the model.
    #[serde(default)]
    nc: Option<usize>,
    /// Per-keypoint OKS sigmas for the keypoint loss and validation.
    #[serde(default)]
    kpt_oks_sigmas: Option<Vec<f32>>,
}

/// A yaml's `names`: a list, or a map from class id to name.
#[derive(Deserialize)]
#[serde(untagged)]
pub(crate) enum Names {
    List(Vec<String>),
    Map(std::collections::BTreeMap<usize, String>),
}

impl Names {
    /// Class names in id order; an error names the first id missing from a map.
    pub(crate) fn ordered(self) -> Result<Vec<String>, String> {
        match self {
            Names::List(v) => Ok(v),
            Names::Map(m) => m
                .into_iter()
                .enumerate()
                .map(|(i, (id, name))| {
                    if i == id {
                        Ok(name)
                    } else {
                        Err(format!(
                            "class ids must run 0, 1, 2, ...: id {i} is missing"
                        ))
                    }
                })
                .collect(),
        }
    }
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
    /// Class names from the yaml, when it has them (their count equals `model.nc`).
    pub names: Option<Vec<String>>,
    /// The yaml's `kpt_oks_sigmas`, one per keypoint.
    pub kpt_oks_sigmas: Option<Vec<f32>>,
}

/// Image extensions Ultralytics lists. Those this build cannot decode are reported as such rather
/// than skipped (`image` is built with the decoders named in Cargo.toml).
const IMAGE_EXTENSIONS: [&str; 11] = [
    "jpg", "jpeg", "png", "bmp", "webp", "tif", "tiff", "dng", "mpo", "pfm", "heic",
];

/// Whether this build decodes files with extension `ext` (lower case).
pub fn decodable(ext: &str) -> bool {
    image::ImageFormat::from_extension(ext).is_some_and(|f| f.reading_enabled())
}

/// The listed extensions this build decodes, for messages: "jpg, jpeg, …".
pub fn decodable_extensions() -> String {
    IMAGE_EXTENSIONS
        .iter()
        .filter(|e| decodable(e))
        .copied()
        .collect::<Vec<_>>()
        .join(", ")
}

impl YoloDataset {
    /// Train and val splits of the dataset yaml at `yaml`, checked against the model: `names` (if
    /// given) must count `nc` classes, every label's class must be below `nc`, `kpt_shape` must
    /// equal the model's (`[0, 0]` for detection: no keypoint columns), `flip_idx` must permute
    /// the keypoints and `kpt_oks_sigmas` give one positive sigma per keypoint. Also returns how
    /// many bad records `skip_bad` dropped. The second split is the yaml's `val`, or its `test`
    /// when `val_split` is `"test"`.
    pub fn open_pair(
        yaml: &Path,
        nc: usize,
        kpt_shape: [usize; 2],
        skip_bad: bool,
        val_split: &str,
    ) -> Result<(Self, Self, usize), DataError> {
        let file = read_yaml(yaml)?;
        let root = root_of(yaml, &file);
        let bad = |record: &str, message: String| DataError::Label {
            path: yaml.to_path_buf(),
            record: record.into(),
            message,
        };
        let declared = file.kpt_shape.unwrap_or([0, 0]);
        if declared != kpt_shape {
            return Err(bad(
                "kpt_shape",
                format!("{declared:?}, but the model expects {kpt_shape:?}"),
            ));
        }
        let k = kpt_shape[0];
        if let Some(f) = &file.flip_idx {
            let mut sorted = f.clone();
            sorted.sort_unstable();
            if !sorted.iter().copied().eq(0..k) {
                return Err(bad(
                    "flip_idx",
                    format!("{f:?} is not a permutation of 0..{k} (each keypoint index once)"),
                ));
            }
        }
        let names = file
            .names
            .map(Names::ordered)
            .transpose()
            .map_err(|m| bad("names", m))?;
        if let Some(declared) = file.nc {
            if let Some(n) = names.as_ref().filter(|n| n.len() != declared) {
                return Err(bad(
                    "nc",
                    format!("{declared}, but names has {} class names", n.len()),
                ));
            }
            if declared != nc {
                return Err(bad("nc", format!("{declared}, but model.nc = {nc}")));
            }
        }
        if let Some(n) = &names
            && n.len() != nc
        {
            return Err(bad(
                "names",
                format!("{} class names, but model.nc = {nc}", n.len()),
            ));
        }
        if let Some(s) = &file.kpt_oks_sigmas
            && (s.len() != k || s.iter().any(|v| !(*v > 0.0 && v.is_finite())))
        {
            return Err(bad(
                "kpt_oks_sigmas",
                format!("expected {k} positive sigmas, one per keypoint, got {s:?}"),
            ));
        }
        let mut skipped = 0;
        let mut split = |folders: &Folders| -> Result<Self, DataError> {
            let images = image_files(&sources(&root, folders))?;
            let (items, dropped) = load_items(&images, nc, kpt_shape, skip_bad)?;
            skipped += dropped;
            Ok(Self {
                yaml: yaml.to_path_buf(),
                items,
                kpt_shape,
                flip_idx: file.flip_idx.clone(),
                names: names.clone(),
                kpt_oks_sigmas: file.kpt_oks_sigmas.clone(),
            })
        };
        let train = split(&file.train)?;
        let val = match (val_split, &file.test) {
            ("test", Some(test)) => split(test)?,
            ("test", None) => {
                return Err(bad(
                    "test",
                    "missing, but data.val_split = \"test\" asks to validate on it".into(),
                ));
            }
            _ => split(&file.val)?,
        };
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
        let image = super::open_rgb(path)?;
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

/// The images of split `name` (`train`, `val` or `test`) of the dataset yaml at `yaml`, found by
/// the rules training uses (no label is read): for `predict --split`.
pub fn split_images(yaml: &Path, name: &str) -> Result<Vec<PathBuf>, DataError> {
    let file = read_yaml(yaml)?;
    let folders = match name {
        "train" => Some(&file.train),
        "val" => Some(&file.val),
        "test" => file.test.as_ref(),
        _ => None,
    };
    let folders = folders.ok_or_else(|| DataError::Label {
        path: yaml.to_path_buf(),
        record: name.into(),
        message: "no such split in the yaml (it has train, val and, if given, test)".into(),
    })?;
    image_files(&sources(&root_of(yaml, &file), folders))
}

fn read_yaml(yaml: &Path) -> Result<YamlFile, DataError> {
    let text = std::fs::read_to_string(yaml).map_err(|error| DataError::Io {
        path: yaml.to_path_buf(),
        error,
    })?;
    serde_yaml_ng::from_str(&text).map_err(|e| DataError::Json {
        path: yaml.to_path_buf(),
        message: e.to_string(),
    })
}

/// The dataset's root: the yaml's `path` (absolute, or relative to the yaml's folder), else the
/// yaml's folder.
fn root_of(yaml: &Path, file: &YamlFile) -> PathBuf {
    let here = yaml.parent().unwrap_or(Path::new("."));
    match &file.path {
        Some(p) if p.is_absolute() => p.clone(),
        Some(p) => here.join(p),
        None => here.to_path_buf(),
    }
}

/// A split's sources: its one entry by [`split_source`], or each entry of its list below `root`.
fn sources(root: &Path, folders: &Folders) -> Vec<PathBuf> {
    match folders {
        Folders::One(p) => vec![split_source(root, p)],
        Folders::Many(v) => v.iter().map(|p| root.join(p)).collect(),
    }
}

/// Where a split's single `train:`/`val:` entry points: `root/entry`, or, when that does not exist
/// and the entry starts with `../`, `root/` + the entry without it (Roboflow's exports write
/// `../train/images` beside a `data.yaml` in the dataset's root; Ultralytics reads them so). A
/// list's entries are taken as `root/entry` only, as Ultralytics does.
fn split_source(root: &Path, entry: &Path) -> PathBuf {
    let joined = root.join(entry);
    match entry.strip_prefix("..") {
        Ok(rest) if !joined.exists() => root.join(rest),
        _ => joined,
    }
}

/// Whether `path` has one of the image extensions Ultralytics lists (any case).
fn is_image(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| IMAGE_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()))
}

/// The images of a split's sources, sorted by path as text: a folder gives every image below it
/// (subfolders too); a file is a list of image paths, one per line, where a line starting with
/// `./` is relative to the list's folder and any other line is taken as written (absolute, or
/// relative to the working directory), as Ultralytics reads `train2017.txt`. A source that does
/// not exist is an error naming it.
fn image_files(sources: &[PathBuf]) -> Result<Vec<PathBuf>, DataError> {
    let io = |path: &Path, error| DataError::Io {
        path: path.to_path_buf(),
        error,
    };
    let mut found = Vec::new();
    for source in sources {
        if source.is_dir() {
            found.extend(super::files_below(source, is_image)?);
        } else {
            let text = std::fs::read_to_string(source).map_err(|e| io(source, e))?;
            let here = source.parent().unwrap_or(Path::new("."));
            found.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|line| !line.is_empty())
                    .map(|line| match line.strip_prefix("./") {
                        Some(rest) => here.join(rest),
                        None => PathBuf::from(line),
                    })
                    .filter(|p| is_image(p)),
            );
        }
    }
    found.sort_by(|a, b| a.as_os_str().cmp(b.as_os_str()));
    Ok(found)
}

/// Each image with the labels of `…/labels/…/<stem>.txt`. An image whose header cannot be read,
/// or a label file with a bad row, is an error naming the file (and line), or with `skip_bad` a
/// warning and a skipped image.
fn load_items(
    images: &[PathBuf],
    nc: usize,
    kpt_shape: [usize; 2],
    skip_bad: bool,
) -> Result<(Vec<YoloItem>, usize), DataError> {
    // Reading 60,000 headers and label files from a cold disk is I/O-bound: several threads
    // keep requests in flight. Results are consumed in image order, so warnings, the first
    // error and the items come out as a single thread would give them.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) * 4;
    let chunk = images.len().div_ceil(threads).max(256);
    let checked: Vec<Result<YoloItem, DataError>> = std::thread::scope(|scope| {
        let workers: Vec<_> = images
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || {
                    part.iter()
                        .map(|image| load_item(image, nc, kpt_shape))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a label-scan thread panicked"))
            .collect()
    });
    let mut items = Vec::new();
    let mut skipped = 0;
    for result in checked {
        match result {
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

fn load_item(image: &Path, nc: usize, kpt_shape: [usize; 2]) -> Result<YoloItem, DataError> {
    let ext = image
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or_default()
        .to_ascii_lowercase();
    if !decodable(&ext) {
        return Err(DataError::Image {
            path: image.to_path_buf(),
            message: format!(
                "this build cannot decode .{ext} images (it decodes {}); convert it to one of those",
                decodable_extensions()
            ),
        });
    }
    image::image_dimensions(image).map_err(|e| DataError::Image {
        path: image.to_path_buf(),
        message: e.to_string(),
    })?;
    let label = label_path(image);
    let rows = match std::fs::read_to_string(&label) {
        Ok(text) => parse_rows(&text, &label, nc, kpt_shape)?,
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

fn parse_rows(
    text: &str,
    path: &Path,
    nc: usize,
    [k, d]: [usize; 2],
) -> Result<Vec<Row>, DataError> {
    let want = 5 + k * d;
    let mut rows: Vec<Row> = Vec::new();
    let mut duplicates = 0;
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
        if class as usize >= nc {
            return Err(bad(format!(
                "class {class}, but model.nc = {nc} (classes 0..{})",
                nc - 1
            )));
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
        if rows.contains(&row) {
            duplicates += 1;
        } else {
            rows.push(row);
        }
    }
    if duplicates > 0 {
        eprintln!(
            "warning: {}: {duplicates} duplicate label row(s) dropped",
            path.display()
        );
    }
    Ok(rows)
}

#[cfg(test)]
mod tests;
