//! The `[train]` and `[optim]` sections: how a fit trains, and how its optimizer steps.

use serde::{Deserialize, Serialize};

/// Numeric precision of the forward/backward pass (master weights stay FP32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    Fp32,
    Fp16,
    Bf16,
}

impl Precision {
    /// The dtype convolutions and attention matmuls run in (`None`: FP32); see `model::precision`.
    pub fn compute_dtype(self) -> Option<burn::tensor::FloatDType> {
        match self {
            Precision::Fp32 => None,
            Precision::Fp16 => Some(burn::tensor::FloatDType::F16),
            Precision::Bf16 => Some(burn::tensor::FloatDType::BF16),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainSection {
    /// Epochs to train (default 5).
    pub epochs: usize,
    /// Images per step; every batch is full (default 4).
    pub batch: usize,
    /// Seeds the weights, the data order and every augmentation draw (default 0).
    pub seed: u64,
    /// "fp32" (default), "bf16" or "fp16" for convolutions and attention; weights stay FP32.
    pub precision: Precision,
    /// Nominal batch: gradients accumulate over `nbs / batch` steps (default 64).
    pub nbs: usize,
    /// Epochs at the end trained without mosaic (default 10).
    pub close_mosaic: usize,
    /// Validate with the one-to-many copy + NMS instead of the one-to-one (NMS-free) copy
    /// (default false).
    pub val_nms: bool,
    /// How validation scores detections: "coco" (COCOeval's mAP, as pycocotools) or
    /// "ultralytics" (the mAP Ultralytics' `val` prints: its matching and AP interpolation;
    /// docs/training.md) (default "coco").
    pub val_metric: ValMetric,
    /// Stop early when fitness has not improved for this many epochs (default 100; 0: never).
    pub patience: usize,
    /// Also keep every N-th epoch's checkpoint as `epoch<N>.safetensors` (default 0: only
    /// last/best).
    pub save_period: usize,
    /// Layers (Ultralytics' indices, 0–23) kept as they are: `N` freezes the first N, a list
    /// freezes those (default 0: none). Their parameters get no gradient and their BatchNorms
    /// normalise with the running statistics, which stay put (Ultralytics' `freeze`).
    pub freeze: Freeze,
    /// Where the assignment and the loss terms run: "host" (the assignment on the host from the
    /// predictions read back, the row-wise terms there) or "device" (both as tensor operations
    /// of fixed shapes on the training device, no readback: the path a recorded step takes;
    /// docs/training.md) (default "host").
    pub loss_on: LossOn,
    /// With `loss_on = "device"`: object slots per image, at least (a batch's images hold their
    /// objects in `max(object_slots, the most objects one image of the batch holds)` slots).
    /// On one device the count only grows during a fit: a batch keeps the largest count an
    /// earlier batch needed. The slot count is part of a recorded loss's shapes
    /// (`replay.scope = "step"`): a batch holding more objects than any before it records the
    /// loss again, which the fit logs; set it to the most objects an image of your batches
    /// holds to record once (default 0).
    pub object_slots: usize,
}

/// `train.loss_on`: where the assignment and the loss terms run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LossOn {
    /// `loss::targets` on the host, `loss::terms`' row-wise terms.
    #[default]
    Host,
    /// `loss::assign::device` and `loss::dense` on the training device.
    Device,
}

/// `train.val_metric`: which mAP validation reports (and fitness is made of).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ValMetric {
    /// COCOeval's (pycocotools'): crowd and area rules, at most 20 detections per image for
    /// keypoints and 100 for boxes, interpolated at 101 recall points.
    #[default]
    Coco,
    /// Ultralytics 8.4.190's `ap_per_class` over its greedy matching, in the network input's
    /// pixels (`eval::ultralytics`).
    Ultralytics,
}

/// `train.freeze`: the first N layers, or a list of layer indices.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Freeze {
    First(usize),
    Layers(Vec<usize>),
}

impl Default for Freeze {
    fn default() -> Self {
        Freeze::First(0)
    }
}

impl Freeze {
    /// The frozen layer indices, ascending and without repeats.
    pub fn layers(&self) -> Vec<usize> {
        let mut v: Vec<usize> = match self {
            Freeze::First(n) => (0..*n).collect(),
            Freeze::Layers(l) => l.clone(),
        };
        v.sort_unstable();
        v.dedup();
        v
    }
}

impl Default for TrainSection {
    fn default() -> Self {
        Self {
            epochs: 5,
            batch: 4,
            seed: 0,
            precision: Precision::Fp32,
            nbs: 64,
            close_mosaic: 10,
            val_nms: false,
            val_metric: ValMetric::Coco,
            patience: 100,
            save_period: 0,
            freeze: Freeze::default(),
            loss_on: LossOn::Host,
            object_slots: 0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// Ultralytics' choice: MuSGD beyond 10,000 iterations, else AdamW (docs/training.md).
    Auto,
    /// SGD with Nesterov momentum.
    Sgd,
    /// Muon on conv/linear weights plus SGD.
    Musgd,
    /// AdamW with `lr0`, β1 = `momentum`, β2 0.999 (as Ultralytics' `optimizer=AdamW`).
    Adamw,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimSection {
    /// "auto" (default), "sgd", "musgd" or "adamw".
    pub optimizer: OptimizerKind,
    /// Initial learning rate (default 0.01; "auto" sets its own).
    pub lr0: f64,
    /// Final learning rate as a fraction of lr0 (default 0.01).
    pub lrf: f64,
    /// SGD momentum / AdamW β1 (default 0.937; "auto" sets its own).
    pub momentum: f64,
    /// Weight decay on conv/linear weights, scaled by batch·accumulate/nbs (default 0.0005).
    pub weight_decay: f64,
    /// Warm-up length in epochs, at most epochs − 1 (default 3.0).
    pub warmup_epochs: f64,
    /// Momentum at the start of warm-up (default 0.8).
    pub warmup_momentum: f64,
    /// Bias learning rate at the start of warm-up (default 0.1; "auto" sets 0).
    pub warmup_bias_lr: f64,
    /// Cosine instead of linear learning-rate decay (default false).
    pub cos_lr: bool,
    /// Global gradient-norm clip (default 10.0).
    pub clip_norm: f64,
    /// Update all parameters as one flat buffer (SGD, MuSGD, AdamW): the same bits as the
    /// per-tensor update in far fewer kernel launches (`optim::flat`; on CUDA MuSGD's
    /// Newton–Schulz runs once per matrix shape) (default true).
    pub flat_update: bool,
}

impl Default for OptimSection {
    fn default() -> Self {
        Self {
            optimizer: OptimizerKind::Auto,
            lr0: 0.01,
            lrf: 0.01,
            momentum: 0.937,
            weight_decay: 0.0005,
            warmup_epochs: 3.0,
            warmup_momentum: 0.8,
            warmup_bias_lr: 0.1,
            cos_lr: false,
            clip_norm: 10.0,
            flat_update: true,
        }
    }
}
