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

    /// The model with `layers` (Ultralytics' indices, below [`LAYERS`]) frozen, as Ultralytics'
    /// `freeze` does: their parameters take no gradient and their BatchNorms normalise with the
    /// running statistics without updating them (Burn's `Module::freeze`). Indices whose layer
    /// has no parameters (upsampling, concatenation) change nothing.
    pub fn freeze_layers(mut self, layers: &[usize]) -> Self {
        macro_rules! freeze {
            ($($part:ident . $field:ident = $i:literal),* $(,)?) => {
                $(if layers.contains(&$i) {
                    self.$part.$field = self.$part.$field.freeze();
                })*
            };
        }
        freeze!(
            backbone.l0 = 0,
            backbone.l1 = 1,
            backbone.l2 = 2,
            backbone.l3 = 3,
            backbone.l4 = 4,
            backbone.l5 = 5,
            backbone.l6 = 6,
            backbone.l7 = 7,
            backbone.l8 = 8,
            backbone.l9 = 9,
            backbone.l10 = 10,
            neck.l13 = 13,
            neck.l16 = 16,
            neck.l17 = 17,
            neck.l19 = 19,
            neck.l20 = 20,
            neck.l22 = 22,
        );
        if layers.contains(&23) {
            self.head = self.head.freeze();
        }
        self
    }
}

/// Layers of the model in Ultralytics' numbering: backbone 0–10, neck 11–22, head 23.
pub const LAYERS: usize = 24;
