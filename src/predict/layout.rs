//! What a model's outputs are called and how its keypoints connect: class names, keypoint names
//! and the skeleton, from the dataset yaml a config names (keys `names`, `kpt_names`,
//! `skeleton`), else COCO's for 17 keypoints.

use crate::config::{Config, DataSource};
use serde::Deserialize;
use std::collections::BTreeMap;

/// COCO's keypoint names, nose to ankles.
pub const COCO_KEYPOINTS: [&str; 17] = [
    "nose",
    "left_eye",
    "right_eye",
    "left_ear",
    "right_ear",
    "left_shoulder",
    "right_shoulder",
    "left_elbow",
    "right_elbow",
    "left_wrist",
    "right_wrist",
    "left_hip",
    "right_hip",
    "left_knee",
    "right_knee",
    "left_ankle",
    "right_ankle",
];

/// COCO's skeleton as pairs of 0-based keypoint indices (Ultralytics draws the same limbs).
pub const COCO_SKELETON: [[usize; 2]; 19] = [
    [15, 13],
    [13, 11],
    [16, 14],
    [14, 12],
    [11, 12],
    [5, 11],
    [6, 12],
    [5, 6],
    [5, 7],
    [6, 8],
    [7, 9],
    [8, 10],
    [1, 2],
    [0, 1],
    [0, 2],
    [1, 3],
    [2, 4],
    [3, 5],
    [4, 6],
];

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Layout {
    /// Class names by id, when known.
    pub names: Option<Vec<String>>,
    /// Keypoint names by index, when known.
    pub keypoints: Option<Vec<String>>,
    /// Limbs as pairs of 0-based keypoint indices.
    pub skeleton: Vec<[usize; 2]>,
}

#[derive(Deserialize, Default)]
struct YamlLayout {
    #[serde(default)]
    names: Option<crate::data::yolo::Names>,
    #[serde(default)]
    kpt_names: Option<KptNames>,
    #[serde(default)]
    skeleton: Option<Vec<[usize; 2]>>,
}

/// Ultralytics writes `kpt_names` per class (`{0: [nose, …]}`); a plain list is taken too.
#[derive(Deserialize)]
#[serde(untagged)]
enum KptNames {
    List(Vec<String>),
    PerClass(BTreeMap<usize, Vec<String>>),
}

impl Layout {
    /// The layout of `cfg`'s model and data. A yaml that cannot be read (a checkpoint used away
    /// from its data) only loses the names: predictions do not need them.
    pub fn of(cfg: &Config) -> Self {
        let k = cfg.model.kpt_shape[0];
        let yaml: YamlLayout = match (cfg.data.source, &cfg.data.path) {
            (DataSource::Yolo, Some(path)) => std::fs::read_to_string(path)
                .ok()
                .and_then(|t| serde_yaml_ng::from_str(&t).ok())
                .unwrap_or_default(),
            _ => YamlLayout::default(),
        };
        let names = match yaml.names {
            Some(n) => n.ordered().ok(),
            None if cfg.data.source != DataSource::Yolo && cfg.model.nc == 1 => {
                Some(vec!["person".to_string()])
            }
            None => None,
        };
        let keypoints = match yaml.kpt_names {
            Some(KptNames::List(v)) => Some(v),
            Some(KptNames::PerClass(m)) => m.into_values().next(),
            None if k == 17 => Some(COCO_KEYPOINTS.iter().map(|s| s.to_string()).collect()),
            None => None,
        }
        .filter(|v| v.len() == k);
        let skeleton = match yaml.skeleton {
            Some(s) => s.into_iter().filter(|[a, b]| *a < k && *b < k).collect(),
            None if k == 17 => COCO_SKELETON.to_vec(),
            None => Vec::new(),
        };
        Self {
            names,
            keypoints,
            skeleton,
        }
    }

    pub fn class_name(&self, class: usize) -> Option<String> {
        self.names.as_ref().and_then(|n| n.get(class).cloned())
    }
}
