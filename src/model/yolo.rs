//! The whole YOLO26 network: backbone → neck → head, for the registered tasks and sizes.

use super::backbone::{Backbone, BackboneConfig, Features, Neck, NeckConfig};
use super::head::{Head, HeadConfig, HeadOutput};
use super::params::ParamCount;
use super::scale::Scale;
use burn::prelude::*;
use serde::{Deserialize, Serialize};

/// What the head predicts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Task {
    /// Boxes, classes and keypoints (Pose26 head).
    Pose,
    /// Boxes and classes (Detect head, same backbone and neck).
    Detect,
}

#[derive(Config, Debug)]
pub struct YoloConfig {
    pub scale: Scale,
    pub task: Task,
    /// Number of classes.
    #[config(default = 1)]
    pub nc: usize,
    /// Keypoints and values per keypoint (pose only).
    #[config(default = "[17, 3]")]
    pub kpt_shape: [usize; 2],
}

impl YoloConfig {
    pub fn init(&self, device: &Device) -> Yolo {
        let s = self.scale;
        let channels = [s.channels(256), s.channels(512), s.channels(1024)];
        let kpt_shape = (self.task == Task::Pose).then_some(self.kpt_shape);
        Yolo {
            backbone: BackboneConfig::new(s).init(device),
            neck: NeckConfig::new(s).init(device),
            head: HeadConfig::new(channels, self.nc)
                .with_kpt_shape(kpt_shape)
                .init(device),
        }
    }

    /// Display name in Ultralytics' style, e.g. `yolo26n-pose`.
    pub fn name(&self) -> String {
        let suffix = match self.task {
            Task::Pose => "-pose",
            Task::Detect => "",
        };
        format!("yolo26{}{}", self.scale.name(), suffix)
    }
}

#[derive(Module, Debug)]
pub struct Yolo {
    pub backbone: Backbone,
    pub neck: Neck,
    pub head: Head,
}

impl Yolo {
    /// The backbone+neck stage: image `[B, 3, H, W]` (values in [0, 1]) → P3/P4/P5.
    pub fn features(&self, images: Tensor<4>) -> Features {
        self.neck.forward(self.backbone.forward(images))
    }

    /// Training forward: both head copies.
    pub fn forward(&self, images: Tensor<4>) -> HeadOutput {
        self.head.forward(&self.features(images))
    }

    /// Parameters of backbone and neck (the recorded stage of feature replay).
    pub fn feature_params(&self) -> usize {
        self.backbone.param_count() + self.neck.param_count()
    }
}
