//! The TOML run configuration: typed sections, unknown keys rejected, values checked once.

mod augment;
pub mod compile_progress;
pub mod device;
mod replay;
mod train;

use crate::model::{Scale, Task, YoloConfig};
pub use augment::Augment;
pub use replay::{ReplaySection, Scope};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
pub use train::{Freeze, LossOn, OptimSection, OptimizerKind, Precision, TrainSection, ValMetric};

/// A configuration problem, always naming the file and, where known, the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("invalid config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid config {path}: key `{key}`: {message}")]
    Value {
        path: PathBuf,
        key: &'static str,
        message: String,
    },
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub model: ModelSection,
    #[serde(default)]
    pub data: DataSection,
    #[serde(default)]
    pub augment: Augment,
    #[serde(default)]
    pub train: TrainSection,
    #[serde(default)]
    pub optim: OptimSection,
    #[serde(default)]
    pub replay: ReplaySection,
    #[serde(default)]
    pub device: DeviceSection,
    #[serde(default)]
    pub output: OutputSection,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    /// Registered size: "n" or "s" (default "n").
    pub scale: Scale,
    /// "pose" or "detect" (default "pose").
    pub task: Task,
    /// Number of classes (default 1).
    pub nc: usize,
    /// Keypoints per object and values per keypoint, 3 (x, y, visibility) or 2; pose only
    /// (default [17, 3]).
    pub kpt_shape: [usize; 2],
    /// Start from Ultralytics YOLO26 weights of the same scale: their checkpoint (`.pt`, e.g.
    /// `yolo26n-pose.pt`) or a state dict (`.pt`, `.safetensors`). A head of another `nc`,
    /// `kpt_shape` or task starts fresh (docs/weights.md). A relative path not found from the
    /// working directory is taken from the config file's folder (default unset: random
    /// initial weights from `train.seed`).
    pub weights: Option<PathBuf>,
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            scale: Scale::N,
            task: Task::Pose,
            nc: 1,
            kpt_shape: [17, 3],
            weights: None,
        }
    }
}

impl ModelSection {
    /// Keypoints per object: `kpt_shape[0]` for pose, 0 for detection.
    pub fn keypoints(&self) -> usize {
        match self.task {
            Task::Pose => self.kpt_shape[0],
            Task::Detect => 0,
        }
    }

    /// The keypoint layout a YOLO dataset's labels must declare: `kpt_shape` for pose, none
    /// (`[0, 0]`) for detection.
    pub fn label_kpt_shape(&self) -> [usize; 2] {
        match self.task {
            Task::Pose => self.kpt_shape,
            Task::Detect => [0, 0],
        }
    }

    /// `model.weights` as a path to open: as written when it exists or is absolute, else
    /// beside the config.
    pub fn weights_path(&self, config_path: &Path) -> Option<PathBuf> {
        self.weights.as_ref().map(|w| beside_config(w, config_path))
    }

    /// The network these keys describe. `[model]` is its TOML face: the same four keys, each
    /// with a default, beside the run-level `weights`.
    pub fn yolo(&self) -> YoloConfig {
        YoloConfig::new(self.scale, self.task)
            .with_nc(self.nc)
            .with_kpt_shape(self.kpt_shape)
    }

    /// Sets the network keys to `model`'s (`kpt_shape` only for pose: a detection model's is
    /// unused and stays as it was).
    pub fn set_network(&mut self, model: &YoloConfig) {
        self.scale = model.scale;
        self.task = model.task;
        self.nc = model.nc;
        if model.task == Task::Pose {
            self.kpt_shape = model.kpt_shape;
        }
    }
}

/// A path from a config: as written when it exists or is absolute, else relative to the
/// config file's folder.
pub fn beside_config(path: &Path, config_path: &Path) -> PathBuf {
    if path.is_relative() && !path.exists() {
        config_path.parent().unwrap_or(Path::new(".")).join(path)
    } else {
        path.to_path_buf()
    }
}

/// Where images come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataSource {
    /// Procedurally drawn figures; needs no files.
    Builtin,
    /// COCO keypoints JSON + image folder.
    Coco,
    /// Ultralytics YOLO txt labels + dataset yaml.
    Yolo,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataSection {
    /// "builtin", "coco" or "yolo" (default "builtin").
    pub source: DataSource,
    /// Dataset root (coco / yolo); a relative path not found from the working directory is
    /// taken from the config file's folder (default unset).
    pub path: Option<PathBuf>,
    /// Square training image size; a multiple of 32 (default 640).
    pub imgsz: usize,
    /// Built-in dataset: train images (default 64).
    pub train_images: usize,
    /// Built-in dataset: val images (default 16).
    pub val_images: usize,
    /// Warn and count bad samples instead of stopping (default false).
    pub skip_bad: bool,
    /// Prepared-image cache: "ram" keeps decoded, resized images after first use, "none"
    /// decodes every time (default "ram").
    pub cache: CacheMode,
    /// Background threads preparing training batches ahead (0: on the training thread;
    /// default 4).
    pub workers: usize,
    /// The last partial batch of an epoch: "drop" it, or "wrap" (fill it with the first images
    /// of the epoch's order, so every image is seen and every batch stays full; default "drop").
    pub last_batch: LastBatch,
    /// COCO split trained on: `annotations/person_keypoints_<split>.json` with images in
    /// `images/<split>/` (CVAT's COCO keypoints export names its split "default"); or a `.json`
    /// file below `data.path` whose `file_name`s are relative to its folder (Label Studio's
    /// `result.json`). Default "train2017".
    pub train_split: String,
    /// Split validated on. COCO: the annotation file's split, "val2017", or "train2017" to
    /// measure fitting of the train split. YOLO: "test" validates on the yaml's `test:`, any
    /// other value on its `val:`. `burnpose val --split` sets it. Default "val2017".
    pub val_split: String,
}

impl Default for DataSection {
    fn default() -> Self {
        Self {
            source: DataSource::Builtin,
            path: None,
            imgsz: 640,
            train_images: 64,
            val_images: 16,
            skip_bad: false,
            cache: CacheMode::Ram,
            workers: 4,
            last_batch: LastBatch::Drop,
            train_split: "train2017".into(),
            val_split: "val2017".into(),
        }
    }
}

/// What happens to an epoch's last partial batch (batches always hold `train.batch` images).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LastBatch {
    Drop,
    Wrap,
}

/// Where prepared (decoded, resized) images are kept between epochs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheMode {
    /// Decode every time.
    None,
    /// Keep in memory after first use.
    Ram,
}

/// Where a run computes (`device.kind`, and `--device` on the command line).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// CUDA when built with it and a GPU is present, else CPU.
    Auto,
    Cpu,
    Cuda,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeviceSection {
    /// "auto" (CUDA when built with it and a GPU is present, else CPU), "cpu" or "cuda"
    /// (default "auto").
    pub kind: DeviceKind,
    /// CUDA device ordinal (default 0).
    pub index: usize,
    /// Convolution and BatchNorm-training operations: "fast" (ours, docs/kernels.md), "staged"
    /// or "stock" (Burn's); default "fast".
    pub conv_bn_ops: crate::model::ops::ConvBnOps,
    /// Processes that compile a CUDA fit's convolution kernels before its first step when this
    /// version has not compiled the same convolutions on this machine before
    /// (`train::precompile`; at most the CPU count); 0 leaves every kernel to be compiled on
    /// first use (default 8).
    pub compile_workers: usize,
}

impl Default for DeviceSection {
    fn default() -> Self {
        Self {
            kind: DeviceKind::Auto,
            index: 0,
            conv_bn_ops: Default::default(),
            compile_workers: 8,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutputSection {
    /// Parent folder of run folders (default "runs").
    pub dir: PathBuf,
    /// Run folder name (`--name` overrides; an existing run folder is never overwritten: the
    /// next free name is taken; default "train").
    pub name: String,
}

impl Default for OutputSection {
    fn default() -> Self {
        Self {
            dir: PathBuf::from("runs"),
            name: "train".into(),
        }
    }
}

/// Every key with its default value and meaning, as commented TOML (`burnpose config`).
pub const DEFAULTS: &str = include_str!("../../configs/defaults.toml");

impl Config {
    /// Every key as TOML (unset optional keys left out).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a config serialises")
    }

    /// Reads, parses and checks `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        Self::parse(&text, path)
    }

    /// Parses TOML text; `path` is only used in messages.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| {
            let mut message = e.to_string().trim_end().to_string();
            if message.contains("unknown field `capture_network`") {
                message.push_str(
                    "\n`model.capture_network` is now `replay.enabled` (the same true/false, \
                     under `[replay]`); move the key",
                );
            } else if message.contains("unknown field `capture`") {
                message.push_str(
                    "\nthe `[capture]` section is now `[replay]`: rename it (`scope` keeps its \
                     name; `warmup_steps` was removed, it was never read: delete it)",
                );
            }
            // serde names the type, not what to write.
            message = message.replace(
                "data did not match any variant of untagged enum Freeze",
                "`train.freeze` expects a number of layers (the first N) or a list of layer \
                 indices, such as 10 or [0, 1, 2]",
            );
            if message.contains("unknown field `kernels`") {
                message.push_str(
                    "\n`device.kernels` is now `device.conv_bn_ops` (the same values: \"fast\", \
                     \"staged\", \"stock\"); rename the key",
                );
            }
            ConfigError::Parse {
                path: path.to_path_buf(),
                message,
            }
        })?;
        config.validate(path)?;
        Ok(config)
    }

    /// A config stored by an earlier version (a checkpoint's): keys that version wrote and this
    /// one no longer has are dropped (`capture.warmup_steps`, never read) or renamed
    /// (`device.kernels` → `device.conv_bn_ops`, `model.capture_network` → `replay.enabled`,
    /// `[capture]` → `[replay]`), the rest as [`toml`] reads it, without the checks of
    /// [`Config::parse`] (the run was checked when it started).
    pub fn from_stored(text: &str) -> Result<Self, toml::de::Error> {
        let mut value: toml::Table = toml::from_str(text)?;
        if let Some(toml::Value::Table(mut capture)) = value.remove("capture") {
            capture.remove("warmup_steps");
            value.insert("replay".into(), capture.into());
        }
        if let Some(toml::Value::Table(model)) = value.get_mut("model")
            && let Some(v) = model.remove("capture_network")
        {
            let replay = value
                .entry("replay")
                .or_insert_with(|| toml::Table::new().into());
            if let Some(t) = replay.as_table_mut() {
                t.insert("enabled".into(), v);
            }
        }
        if let Some(toml::Value::Table(device)) = value.get_mut("device")
            && let Some(v) = device.remove("kernels")
        {
            device.insert("conv_bn_ops".into(), v);
        }
        value.try_into()
    }

    /// Whether a replay stage records the optimizer step and the EMA update
    /// (`replay.record_update`, on by default with the flat update).
    pub fn record_update(&self) -> bool {
        self.optim.flat_update && self.replay.record_update.unwrap_or(true)
    }

    /// Whether a replay stage records the step as one graph: `replay.one_graph`, on by default
    /// with the step scope, which it needs.
    pub fn one_graph(&self) -> bool {
        self.replay_scope() == Scope::Step && self.replay.one_graph.unwrap_or(true)
    }

    /// Whether a step of the recorded step scope that ends without an optimizer step is read
    /// back during the next one: `replay.defer_readback`, on by default with the step scope,
    /// which it needs.
    pub fn defer_readback(&self) -> bool {
        self.replay_scope() == Scope::Step && self.replay.defer_readback.unwrap_or(true)
    }

    /// Whether a step of the recorded step scope uploads the next batch while its graph runs:
    /// `replay.upload_ahead`, on by default with the step scope, which it needs.
    pub fn upload_ahead(&self) -> bool {
        self.replay_scope() == Scope::Step && self.replay.upload_ahead.unwrap_or(true)
    }

    /// The stage's scope: `replay.scope`, or the task's default.
    pub fn replay_scope(&self) -> Scope {
        self.replay.scope.unwrap_or(match self.model.task {
            Task::Pose => Scope::Features,
            Task::Detect => Scope::Network,
        })
    }

    /// Every rule a config must keep; [`Config::parse`] checks it, and a trainer again for a
    /// config changed after parsing (command-line overrides such as `fit --scope`).
    pub fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let bad = |key, message: String| {
            Err(ConfigError::Value {
                path: path.to_path_buf(),
                key,
                message,
            })
        };
        let (m, d, t, o) = (&self.model, &self.data, &self.train, &self.optim);
        if m.nc == 0 {
            return bad("model.nc", "expected at least 1 class, got 0".into());
        }
        if m.task == Task::Pose && (m.kpt_shape[0] == 0 || !matches!(m.kpt_shape[1], 2 | 3)) {
            return bad(
                "model.kpt_shape",
                format!("expected [K >= 1, 2 or 3], got {:?}", m.kpt_shape),
            );
        }
        if d.source == DataSource::Builtin && m.task == Task::Pose && m.kpt_shape[0] != 17 {
            return bad(
                "model.kpt_shape",
                format!(
                    "the built-in dataset draws COCO's 17 keypoints, got {:?}; use [17, 3] or a \
                     dataset with your keypoints (data.source = \"yolo\" or \"coco\")",
                    m.kpt_shape
                ),
            );
        }
        if m.task == Task::Detect && self.replay.scope == Some(Scope::Features) {
            return bad(
                "replay.scope",
                "\"features\" applies to pose models; a detection model's stage is its whole \
                 network (\"network\")"
                    .into(),
            );
        }
        if self.replay.scope == Some(Scope::Step) && t.loss_on != LossOn::Device {
            return bad(
                "replay.scope",
                "\"step\" records the loss on the device: set train.loss_on = \"device\" too"
                    .into(),
            );
        }
        if self.replay.defer_readback == Some(true) && self.replay_scope() != Scope::Step {
            return bad(
                "replay.defer_readback",
                "only the recorded loss is read back a step late: set replay.scope = \"step\" \
                 (with train.loss_on = \"device\") or leave replay.defer_readback unset"
                    .into(),
            );
        }
        if self.replay.upload_ahead == Some(true) && self.replay_scope() != Scope::Step {
            return bad(
                "replay.upload_ahead",
                "only a recorded step waits for its loss with the GPU busy: set replay.scope = \
                 \"step\" (with train.loss_on = \"device\") or leave replay.upload_ahead unset"
                    .into(),
            );
        }
        if self.replay.one_graph == Some(true) && self.replay_scope() != Scope::Step {
            return bad(
                "replay.one_graph",
                "one graph holds the forward, the loss and the backward: set replay.scope = \
                 \"step\" (with train.loss_on = \"device\") or leave replay.one_graph off"
                    .into(),
            );
        }
        if self.replay.record_update == Some(true) && !self.optim.flat_update {
            return bad(
                "replay.record_update",
                "the recorded update is the flat optimizer's: set optim.flat_update = true (the \
                 default) or leave replay.record_update off"
                    .into(),
            );
        }
        if self.replay.shared_parameters && !self.optim.flat_update {
            return bad(
                "replay.shared_parameters",
                "the graphs read the flat optimizer's buffers: set optim.flat_update = true (the \
                 default) or leave replay.shared_parameters off"
                    .into(),
            );
        }
        if d.imgsz == 0 || d.imgsz % 32 != 0 {
            return bad(
                "data.imgsz",
                format!("expected a positive multiple of 32, got {}", d.imgsz),
            );
        }
        if d.source != DataSource::Builtin && d.path.is_none() {
            return bad(
                "data.path",
                format!("data.source = {:?} needs a dataset folder", d.source).to_lowercase(),
            );
        }
        if d.source == DataSource::Builtin && (d.train_images == 0 || d.val_images == 0) {
            return bad(
                "data.train_images",
                "the built-in dataset needs at least one train and one val image".into(),
            );
        }
        for (key, v, ok) in self.augment.checks() {
            if !ok {
                return bad(key, format!("{v} is out of range (see docs/training.md)"));
            }
        }
        if t.epochs == 0 {
            return bad("train.epochs", "expected at least 1 epoch, got 0".into());
        }
        if t.batch == 0 {
            return bad(
                "train.batch",
                "expected a batch of at least 1, got 0".into(),
            );
        }
        if t.nbs == 0 {
            return bad("train.nbs", "expected a nominal batch of at least 1".into());
        }
        let layers = crate::model::LAYERS;
        match &t.freeze {
            Freeze::First(n) if *n > layers => {
                return bad(
                    "train.freeze",
                    format!(
                        "expected at most {layers} (every layer, 0–{}), got {n}",
                        layers - 1
                    ),
                );
            }
            Freeze::Layers(list) => {
                if let Some(l) = list.iter().find(|&&l| l >= layers) {
                    return bad(
                        "train.freeze",
                        format!(
                            "layer {l} does not exist: the model's layers are 0–{}",
                            layers - 1
                        ),
                    );
                }
            }
            _ => {}
        }
        if !(o.lr0 > 0.0 && o.lr0.is_finite()) {
            return bad(
                "optim.lr0",
                format!("expected a positive learning rate, got {}", o.lr0),
            );
        }
        if !(0.0..=1.0).contains(&o.lrf) {
            return bad(
                "optim.lrf",
                format!("expected a value in [0, 1], got {}", o.lrf),
            );
        }
        for (key, v) in [
            ("optim.momentum", o.momentum),
            ("optim.warmup_momentum", o.warmup_momentum),
        ] {
            if !(0.0..1.0).contains(&v) {
                return bad(key, format!("expected a value in [0, 1), got {v}"));
            }
        }
        if !(o.weight_decay >= 0.0 && o.warmup_epochs >= 0.0 && o.warmup_bias_lr >= 0.0) {
            return bad(
                "optim.weight_decay",
                "weight_decay, warmup_epochs and warmup_bias_lr must be >= 0".into(),
            );
        }
        if o.clip_norm.is_nan() || o.clip_norm <= 0.0 {
            return bad(
                "optim.clip_norm",
                format!("expected > 0, got {}", o.clip_norm),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
