//! COCO keypoints datasets: `annotations/person_keypoints_<split>.json` + `images/<split>/`, or
//! one named `.json` file with images relative to it.

use super::error::DataError;
use super::{Instance, Sample};
use serde::Deserialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The annotation file of split `split` of `root` and the folder its `file_name`s are relative to:
/// `annotations/person_keypoints_<split>.json` with `images/<split>/`; or, when `split` names a
/// `.json` file (relative to `root`), that file with names relative to its own folder — Label
/// Studio's COCO export (`result.json` beside `images/`, each `file_name` `images/<name>`) and
/// converters' single files.
fn files_of(root: &Path, split: &str) -> (PathBuf, PathBuf) {
    if split.ends_with(".json") {
        let json = root.join(split);
        let here = json.parent().map(Path::to_path_buf).unwrap_or_default();
        return (json, here);
    }
    (
        root.join("annotations")
            .join(format!("person_keypoints_{split}.json")),
        root.join("images").join(split),
    )
}

/// `json` parsed as `T`; an unreadable file or bad JSON is an error naming the file.
fn read_json<T: serde::de::DeserializeOwned>(json: &Path) -> Result<T, DataError> {
    let text = std::fs::read_to_string(json).map_err(|error| DataError::Io {
        path: json.to_path_buf(),
        error,
    })?;
    serde_json::from_str(&text).map_err(|e| DataError::Json {
        path: json.to_path_buf(),
        message: e.to_string(),
    })
}

#[derive(Deserialize)]
struct CocoFile {
    images: Vec<CocoImage>,
    annotations: Vec<CocoAnnotation>,
    #[serde(default)]
    categories: Vec<CocoCategory>,
}

#[derive(Deserialize)]
struct CocoCategory {
    #[serde(default)]
    name: String,
}

/// A COCO file's image list alone (the annotations are skipped, not parsed).
#[derive(Deserialize)]
struct CocoImages {
    images: Vec<CocoImage>,
}

#[derive(Deserialize)]
struct CocoImage {
    id: u64,
    file_name: String,
}

/// One COCO annotation as the file stores it (original pixel coordinates).
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct CocoAnnotation {
    #[serde(default)]
    pub id: u64,
    pub image_id: u64,
    /// `[x, y, w, h]`.
    pub bbox: [f64; 4],
    #[serde(default)]
    pub keypoints: Vec<f64>,
    #[serde(default)]
    pub num_keypoints: u32,
    #[serde(default)]
    pub iscrowd: u8,
    #[serde(default)]
    pub area: f64,
    #[serde(default)]
    pub category_id: u64,
}

/// One image and its annotations.
#[derive(Clone, Debug)]
pub struct CocoRecord {
    pub image_id: u64,
    pub path: PathBuf,
    pub annotations: Vec<CocoAnnotation>,
}

#[derive(Clone, Debug)]
pub struct CocoDataset {
    pub json: PathBuf,
    pub records: Vec<CocoRecord>,
    pub num_keypoints: usize,
}

impl CocoDataset {
    /// Opens split `split` of `root` ([`files_of`]).
    /// Every referenced image must exist with a readable header and every keypoint list must
    /// hold `num_keypoints` triples; with `skip_bad` such records are dropped and counted instead.
    pub fn open(
        root: &Path,
        split: &str,
        num_keypoints: usize,
        skip_bad: bool,
    ) -> Result<(Self, usize), DataError> {
        let (json, images) = files_of(root, split);
        Self::from_files(&json, &images, num_keypoints, skip_bad)
    }

    /// The image files of `root`'s split `split`, in image-id order, without reading annotations
    /// or images: for `predict --split`.
    pub fn split_images(root: &Path, split: &str) -> Result<Vec<PathBuf>, DataError> {
        let (json, images) = files_of(root, split);
        let mut file: CocoImages = read_json(&json)?;
        file.images.sort_by_key(|i| i.id);
        Ok(file
            .images
            .iter()
            .map(|i| images.join(&i.file_name))
            .collect())
    }

    pub fn from_files(
        json: &Path,
        images: &Path,
        num_keypoints: usize,
        skip_bad: bool,
    ) -> Result<(Self, usize), DataError> {
        let file: CocoFile = read_json(json)?;
        // One class: a file listing several would otherwise train them as one (Label Studio
        // numbers its categories from 0, so ids 0 and 1 both pass the id check below).
        if file.categories.len() > 1 {
            let names: Vec<&str> = file.categories.iter().map(|c| c.name.as_str()).collect();
            return Err(DataError::Label {
                path: json.to_path_buf(),
                record: "categories".into(),
                message: format!(
                    "{} categories ({}); a COCO file here holds one class; for several classes \
                     use a YOLO dataset",
                    names.len(),
                    names.join(", ")
                ),
            });
        }
        let mut by_image: HashMap<u64, Vec<CocoAnnotation>> = HashMap::new();
        let mut skipped = 0;
        for ann in file.annotations {
            // A keypoints file annotates people; other categories have no class here.
            if ann.category_id > 1 {
                let err = DataError::Label {
                    path: json.to_path_buf(),
                    record: format!("annotation {}", ann.id),
                    message: format!(
                        "category_id {}: COCO keypoint files hold one class, person (category \
                         1); for several classes use a YOLO dataset",
                        ann.category_id
                    ),
                };
                if skip_bad {
                    eprintln!("warning: {err}; skipped");
                    skipped += 1;
                    continue;
                }
                return Err(err);
            }
            if ann.keypoints.len() != 3 * num_keypoints
                && !(ann.keypoints.is_empty() && num_keypoints == 0)
            {
                let err = DataError::Label {
                    path: json.to_path_buf(),
                    record: format!("annotation {}", ann.id),
                    message: format!(
                        "{} keypoint values, expected {} ({} keypoints × 3)",
                        ann.keypoints.len(),
                        3 * num_keypoints,
                        num_keypoints
                    ),
                };
                if skip_bad {
                    eprintln!("warning: {err}; skipped");
                    skipped += 1;
                    continue;
                }
                return Err(err);
            }
            by_image.entry(ann.image_id).or_default().push(ann);
        }
        let mut records = Vec::new();
        let mut images_sorted = file.images;
        images_sorted.sort_by_key(|i| i.id);
        for img in images_sorted {
            let path = images.join(&img.file_name);
            let problem = if !path.is_file() {
                Some(DataError::MissingImage {
                    json: json.to_path_buf(),
                    image_id: img.id,
                    path: path.clone(),
                })
            } else {
                // The header only: a body corrupt behind a valid header is found at decode.
                image::image_dimensions(&path)
                    .err()
                    .map(|e| DataError::Image {
                        path: path.clone(),
                        message: e.to_string(),
                    })
            };
            if let Some(err) = problem {
                if skip_bad {
                    eprintln!("warning: {err}; skipped");
                    skipped += 1;
                    continue;
                }
                return Err(err);
            }
            records.push(CocoRecord {
                image_id: img.id,
                path,
                annotations: by_image.remove(&img.id).unwrap_or_default(),
            });
        }
        Ok((
            Self {
                json: json.to_path_buf(),
                records,
                num_keypoints,
            },
            skipped,
        ))
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Decoded image `i` with its non-crowd instances, in original pixels.
    pub fn get(&self, i: usize) -> Result<Sample, DataError> {
        let rec = &self.records[i];
        let image = super::open_rgb(&rec.path)?;
        let instances = rec
            .annotations
            .iter()
            .filter(|a| a.iscrowd == 0 && a.bbox[2] > 0.0 && a.bbox[3] > 0.0)
            .map(|a| Instance {
                class: 0,
                bbox: [
                    a.bbox[0] as f32,
                    a.bbox[1] as f32,
                    (a.bbox[0] + a.bbox[2]) as f32,
                    (a.bbox[1] + a.bbox[3]) as f32,
                ],
                keypoints: a
                    .keypoints
                    .chunks(3)
                    .map(|k| [k[0] as f32, k[1] as f32, k[2] as f32])
                    .collect(),
            })
            .collect();
        Ok(Sample { image, instances })
    }
}

#[cfg(test)]
mod tests;
