//! Where a fit's images come from: the built-in dataset or a COCO keypoints dataset, served
//! letterboxed at the training size, with ground truth for COCO-style evaluation.

use crate::config::{Config, DataSource};
use crate::data::coco::{CocoAnnotation, CocoDataset};
use crate::data::letterbox::letterbox;
use crate::data::{BuiltinDataset, DataError, Instance, Sample};
use crate::eval::GtAnn;
use std::path::Path;

/// Maps network-input pixels back to the original image: `x = (x' − pad) / scale`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Frame {
    pub scale: f32,
    pub pad: [f32; 2],
}

impl Frame {
    pub fn to_original(&self, x: f32, y: f32) -> (f64, f64) {
        (
            ((x - self.pad[0]) / self.scale) as f64,
            ((y - self.pad[1]) / self.scale) as f64,
        )
    }
}

#[derive(Clone, Debug)]
pub enum Source {
    Builtin(BuiltinDataset),
    Coco(CocoDataset),
}

impl Source {
    /// Train and val sources of a config, and how many bad records were skipped.
    pub fn open(cfg: &Config, config_path: &Path) -> Result<(Self, Self, usize), DataError> {
        let d = &cfg.data;
        match d.source {
            DataSource::Builtin => {
                let size = d.imgsz as u32;
                // Val images come from a disjoint seed stream.
                let train = BuiltinDataset::new(d.train_images, size, cfg.train.seed);
                let val =
                    BuiltinDataset::new(d.val_images, size, cfg.train.seed ^ 0x0005_eed0_f7a1);
                Ok((Self::Builtin(train), Self::Builtin(val), 0))
            }
            DataSource::Coco => {
                let root = d.path.clone().unwrap_or_default();
                let root = if root.is_relative() && !root.exists() {
                    config_path.parent().unwrap_or(Path::new(".")).join(root)
                } else {
                    root
                };
                let k = cfg.model.kpt_shape[0];
                let (train, s1) = CocoDataset::open(&root, "train2017", k, d.skip_bad)?;
                let (val, s2) = CocoDataset::open(&root, &d.val_split, k, d.skip_bad)?;
                Ok((Self::Coco(train), Self::Coco(val), s1 + s2))
            }
            DataSource::Yolo => Err(DataError::Label {
                path: config_path.to_path_buf(),
                record: "data.source".into(),
                message: "YOLO txt datasets are not supported yet; use \"builtin\" or \"coco\""
                    .into(),
            }),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Source::Builtin(b) => b.len,
            Source::Coco(c) => c.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Image `i` letterboxed to `size`, and its frame.
    pub fn sample(&self, i: usize, size: u32) -> Result<(Sample, Frame), DataError> {
        let (s, f, _) = self.load(i, size, false)?;
        Ok((s, f))
    }

    /// As [`Source::sample`], with the image's ground truth in original pixels, COCO style.
    pub fn sample_with_truth(
        &self,
        i: usize,
        size: u32,
    ) -> Result<(Sample, Frame, Vec<GtAnn>), DataError> {
        self.load(i, size, true)
    }

    fn load(
        &self,
        i: usize,
        size: u32,
        truth: bool,
    ) -> Result<(Sample, Frame, Vec<GtAnn>), DataError> {
        let image_id = self.image_id(i);
        let (raw, gts) = match self {
            Source::Builtin(b) => {
                let raw = b.get(i);
                let gts = if truth {
                    builtin_truth(image_id, &raw.instances)
                } else {
                    Vec::new()
                };
                (raw, gts)
            }
            Source::Coco(c) => {
                let gts = if truth {
                    coco_truth(&c.records[i].annotations)
                } else {
                    Vec::new()
                };
                (c.get(i)?, gts)
            }
        };
        let (s, scale, pad) = letterbox(raw, size);
        Ok((s, Frame { scale, pad }, gts))
    }

    /// Image id used for evaluation.
    pub fn image_id(&self, i: usize) -> u64 {
        match self {
            Source::Builtin(_) => i as u64 + 1,
            Source::Coco(c) => c.records[i].image_id,
        }
    }
}

/// Built-in labels as COCO ground truth (box area stands in for the segmentation area).
fn builtin_truth(image_id: u64, instances: &[Instance]) -> Vec<GtAnn> {
    instances
        .iter()
        .map(|inst| {
            let [x1, y1, x2, y2] = inst.bbox.map(|v| v as f64);
            GtAnn {
                image_id,
                category_id: 1,
                bbox: [x1, y1, x2 - x1, y2 - y1],
                area: (x2 - x1) * (y2 - y1),
                iscrowd: false,
                keypoints: inst
                    .keypoints
                    .iter()
                    .flat_map(|k| k.map(|v| v as f64))
                    .collect(),
                num_keypoints: inst.keypoints.iter().filter(|k| k[2] > 0.0).count() as u32,
            }
        })
        .collect()
}

fn coco_truth(annotations: &[CocoAnnotation]) -> Vec<GtAnn> {
    annotations
        .iter()
        .map(|a| GtAnn {
            image_id: a.image_id,
            category_id: 1,
            bbox: a.bbox,
            area: a.area,
            iscrowd: a.iscrowd == 1,
            keypoints: a.keypoints.clone(),
            num_keypoints: a.num_keypoints,
        })
        .collect()
}
