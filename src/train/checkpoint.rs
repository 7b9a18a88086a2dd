//! Checkpoints: one safetensors file holding model, EMA, optimizer state and pending gradients
//! (all FP32), with the config, counters and history as JSON metadata. Written atomically:
//! a temporary file in the same folder, synced, then renamed over the target.

use super::report::write_atomic;
use super::trainer::{EpochRecord, Trainer};
use crate::config::{Config, ModelSection};
use crate::optim::grads::{get_flat, put_flat};
use crate::optim::tensors::{float_tensors, replace_float_tensors};
use crate::optim::{LossScaler, Rule};
use crate::weights::Owned;
use burn::optim::GradientsParams;
use burn::prelude::*;
use safetensors::tensor::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("cannot write checkpoint {path}: {error}")]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("cannot read checkpoint {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("invalid checkpoint {path}: {message}")]
    Format { path: PathBuf, message: String },
    #[error(
        "not writing checkpoint {path}: {tensor} holds NaN or infinite values (the file keeps its \
         earlier contents)"
    )]
    NonFinite { path: PathBuf, tensor: String },
    #[error("checkpoint {path} does not fit this run: {message}")]
    Mismatch { path: PathBuf, message: String },
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Meta {
    format: String,
    config: String,
    epoch: usize,
    ni: usize,
    last_opt_step: i64,
    ema_updates: u64,
    rule: Rule,
    /// Optimizer step count per parameter path.
    steps: Vec<(String, u64)>,
    one2many_weight: f32,
    history: Vec<EpochRecord>,
    /// FP16 loss scaler state.
    #[serde(default)]
    scaler: Option<LossScaler>,
    /// Training images the run's epochs were counted over (absent in older checkpoints).
    #[serde(default)]
    train_images: Option<usize>,
    /// The device loss's object slots per image reached so far (`Trainer::grow_object_slots`;
    /// absent in older checkpoints: `train.object_slots` then).
    #[serde(default)]
    object_slots: Option<usize>,
}

const FORMAT: &str = "burnpose-checkpoint-1";

/// Reads `tensors` from the device in one transaction (one wait for the device, not one per
/// tensor: a checkpoint holds ~1,500 of them) as FP32 views; a tensor marked `true` must be
/// finite, so a diverged model never replaces a saved one.
fn read_views(
    tensors: Vec<(String, Tensor<1>, bool)>,
    path: &Path,
) -> Result<Vec<(String, Owned)>, CheckpointError> {
    let mut transaction = burn::tensor::Transaction::default();
    let mut names = Vec::with_capacity(tensors.len());
    for (name, t, finite) in tensors {
        transaction = transaction.register(t);
        names.push((name, finite));
    }
    let data = transaction
        .try_execute()
        .map_err(|e| CheckpointError::Format {
            path: path.to_path_buf(),
            message: format!("reading the state from the device: {e:?}"),
        })?;
    names
        .into_iter()
        .zip(data)
        .map(|((name, finite), data)| {
            let data = data.convert::<f32>();
            let bytes = data.as_bytes().to_vec();
            if finite
                && !bytes
                    .chunks_exact(4)
                    .all(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite())
            {
                return Err(CheckpointError::NonFinite {
                    path: path.to_path_buf(),
                    tensor: name,
                });
            }
            let shape = vec![data.num_elements()];
            Ok((name, Owned::f32_bytes(shape, bytes)))
        })
        .collect()
}

/// Writes the trainer's complete state to `path` atomically; refuses (and leaves the file as it
/// was) when the model or its EMA holds a NaN or infinite value.
pub fn save(trainer: &Trainer, path: &Path) -> Result<(), CheckpointError> {
    let mut tensors: Vec<(String, Tensor<1>, bool)> = Vec::new();
    // `valid()` merges pending BatchNorm running-stat updates into the values we save.
    for (p, t) in float_tensors(&trainer.model.valid()) {
        tensors.push((format!("model.{p}"), t, true));
    }
    for (p, t) in float_tensors(&trainer.ema.model) {
        tensors.push((format!("ema.{p}"), t, true));
    }
    let opt = &trainer.optimizer;
    for (info, s) in opt.table.iter().zip(&opt.state) {
        if let Some(b) = &s.buf {
            tensors.push((format!("optim.{}.buf", info.path), b.clone(), false));
        }
        if let Some(b) = &s.second {
            tensors.push((format!("optim.{}.second", info.path), b.clone(), false));
        }
        if let Some(g) = trainer.pending.as_ref().and_then(|g| get_flat(g, info)) {
            tensors.push((format!("pending.{}", info.path), g, false));
        }
    }
    let tensors = read_views(tensors, path)?;
    let meta = Meta {
        format: FORMAT.into(),
        config: trainer.cfg.to_toml(),
        epoch: trainer.epoch,
        ni: trainer.ni,
        last_opt_step: trainer.last_opt_step,
        ema_updates: trainer.ema.updates,
        rule: opt.rule,
        steps: opt
            .table
            .iter()
            .zip(&opt.state)
            .map(|(i, s)| (i.path.clone(), s.steps))
            .collect(),
        one2many_weight: trainer.loss.one2many_weight,
        history: trainer.history.clone(),
        scaler: trainer.scaler.clone(),
        object_slots: Some(trainer.loss.object_slots),
        train_images: Some(trainer.loader.source.len()),
    };
    let info = HashMap::from([(
        "burnpose".to_string(),
        serde_json::to_string(&meta).expect("meta"),
    )]);
    let bytes =
        safetensors::serialize(tensors.iter().map(|(n, t)| (n, t)), Some(info)).map_err(|e| {
            CheckpointError::Format {
                path: path.to_path_buf(),
                message: e.to_string(),
            }
        })?;
    write_atomic(path, &bytes).map_err(|error| CheckpointError::Write {
        path: path.to_path_buf(),
        error,
    })
}

/// The config stored in a checkpoint (to rebuild its trainer before [`load_into`]).
pub fn read_config(path: &Path) -> Result<Config, CheckpointError> {
    stored_config(&read(path)?.0, path)
}

/// The config in a checkpoint's metadata.
fn stored_config(meta: &Meta, path: &Path) -> Result<Config, CheckpointError> {
    Config::from_stored(&meta.config).map_err(|e| CheckpointError::Format {
        path: path.to_path_buf(),
        message: format!("stored config: {e}"),
    })
}

fn read(path: &Path) -> Result<(Meta, Vec<u8>), CheckpointError> {
    let bytes = std::fs::read(path).map_err(|error| CheckpointError::Read {
        path: path.to_path_buf(),
        error,
    })?;
    let bad = |message: String| CheckpointError::Format {
        path: path.to_path_buf(),
        message,
    };
    let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| bad(e.to_string()))?;
    let json = header
        .metadata()
        .as_ref()
        .and_then(|m| m.get("burnpose"))
        .ok_or_else(|| bad("no burnpose metadata (not a burnpose checkpoint)".into()))?;
    let meta: Meta = serde_json::from_str(json).map_err(|e| bad(format!("metadata: {e}")))?;
    if meta.format != FORMAT {
        return Err(bad(format!(
            "format {:?}, expected {FORMAT:?}",
            meta.format
        )));
    }
    Ok((meta, bytes))
}

/// The checkpoint's config and its EMA weights (what `val` scores and `predict` runs) in a model
/// on `device`; needs neither a trainer nor the training data.
pub fn load_model(
    path: &Path,
    device: &Device,
) -> Result<(Config, crate::model::Yolo), CheckpointError> {
    let (meta, bytes) = read(path)?;
    let bad = |message: String| CheckpointError::Format {
        path: path.to_path_buf(),
        message,
    };
    let cfg = stored_config(&meta, path)?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| bad(e.to_string()))?;
    let mut ema: HashMap<String, Tensor<1>> = HashMap::new();
    for (name, t) in st.tensors() {
        let Some(rest) = name.strip_prefix("ema.") else {
            continue;
        };
        ema.insert(rest.to_string(), f32_tensor(&name, &t, device, path)?);
    }
    let model = cfg.model.yolo().init(device);
    let expected = float_tensors(&model).len();
    let stored = ema.len();
    let (model, extra) = replace_float_tensors(model, &mut ema);
    if !extra.is_empty() || stored != expected {
        return Err(bad(format!(
            "its EMA holds {stored} tensors for a model of {expected} (not in the model: {extra:?})"
        )));
    }
    Ok((cfg, model))
}

/// One stored tensor as a flat f32 tensor on `device`.
fn f32_tensor(
    name: &str,
    t: &safetensors::tensor::TensorView<'_>,
    device: &Device,
    path: &Path,
) -> Result<Tensor<1>, CheckpointError> {
    if t.dtype() != Dtype::F32 {
        return Err(CheckpointError::Format {
            path: path.to_path_buf(),
            message: format!("tensor {name} is {:?}, expected F32", t.dtype()),
        });
    }
    let values: Vec<f32> = t
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let n = values.len();
    Ok(Tensor::<1>::from_data(TensorData::new(values, [n]), device))
}

/// The model a config builds, as a checkpoint check names it.
fn model_of(m: &ModelSection) -> String {
    format!(
        "{} (nc {}, kpt_shape {:?})",
        m.yolo().name(),
        m.nc,
        m.kpt_shape
    )
}

/// Whether the checkpoint's stored config builds the model `trainer` has; and, to resume, whether
/// it counted its epochs over as many training images as `trainer` has now.
fn check_fit(
    trainer: &Trainer,
    path: &Path,
    meta: &Meta,
    resume: bool,
) -> Result<(), CheckpointError> {
    let mismatch = |message: String| CheckpointError::Mismatch {
        path: path.to_path_buf(),
        message,
    };
    let stored = stored_config(meta, path)?;
    let (theirs, ours) = (&stored.model, &trainer.cfg.model);
    if (theirs.scale, theirs.task, theirs.nc, theirs.kpt_shape)
        != (ours.scale, ours.task, ours.nc, ours.kpt_shape)
    {
        return Err(mismatch(format!(
            "it holds {}, but the config builds {}; use the config it was trained with (its run \
             folder has config.toml)",
            model_of(theirs),
            model_of(ours)
        )));
    }
    let now = trainer.loader.source.len();
    if let (true, Some(then)) = (resume, meta.train_images)
        && then != now
    {
        return Err(mismatch(format!(
            "it was trained on {then} training images, the data now has {now}; resuming would \
             skip or repeat images (its epoch and iteration counts assume {then})"
        )));
    }
    Ok(())
}

/// Restores a trainer built from the checkpoint's config to the saved state, to go on training:
/// the model and the training data must be those the checkpoint was trained with.
pub fn load_into(trainer: &mut Trainer, path: &Path) -> Result<(), CheckpointError> {
    load(trainer, path, true)
}

/// As [`load_into`], to evaluate: the model must match, the data may differ.
pub fn load_to_evaluate(trainer: &mut Trainer, path: &Path) -> Result<(), CheckpointError> {
    load(trainer, path, false)
}

fn load(trainer: &mut Trainer, path: &Path, resume: bool) -> Result<(), CheckpointError> {
    let (meta, bytes) = read(path)?;
    check_fit(trainer, path, &meta, resume)?;
    let bad = |message: String| CheckpointError::Format {
        path: path.to_path_buf(),
        message,
    };
    let st = SafeTensors::deserialize(&bytes).map_err(|e| bad(e.to_string()))?;
    let inner = trainer.device.clone().inner();
    let mut groups: HashMap<String, HashMap<String, Tensor<1>>> = HashMap::new();
    for (name, t) in st.tensors() {
        let (prefix, rest) = name
            .split_once('.')
            .ok_or_else(|| bad(format!("tensor name {name}")))?;
        let device = if prefix == "model" {
            &trainer.device
        } else {
            &inner
        };
        let tensor = f32_tensor(&name, &t, device, path)?;
        if !matches!(prefix, "model" | "ema" | "optim" | "pending") {
            return Err(bad(format!("unknown tensor group {prefix}")));
        }
        groups
            .entry(prefix.to_string())
            .or_default()
            .insert(rest.to_string(), tensor);
    }
    let mut take = |k: &str| groups.remove(k).unwrap_or_default();
    let (model, missing) = replace_float_tensors(trainer.model.clone(), &mut take("model"));
    let mut ema_values = take("ema");
    let (ema, missing_ema) = replace_float_tensors(trainer.ema.model.clone(), &mut ema_values);
    if !missing.is_empty() || !missing_ema.is_empty() {
        return Err(bad(format!(
            "tensors not in this model: {:?}",
            [missing, missing_ema].concat()
        )));
    }
    let mut optim = take("optim");
    let mut pending_values = take("pending");
    let opt = &mut trainer.optimizer;
    if opt.rule != meta.rule {
        return Err(bad(format!(
            "optimizer {:?}, this run resolves to {:?}",
            meta.rule, opt.rule
        )));
    }
    if trainer.scaler.is_some() != meta.scaler.is_some() {
        return Err(bad(
            "FP16 loss-scaler state does not match train.precision".into()
        ));
    }
    let steps: HashMap<String, u64> = meta.steps.into_iter().collect();
    let mut pending = GradientsParams::new();
    let mut any_pending = false;
    for (info, s) in opt.table.iter().zip(opt.state.iter_mut()) {
        s.buf = optim.remove(&format!("{}.buf", info.path));
        s.second = optim.remove(&format!("{}.second", info.path));
        s.steps = *steps
            .get(&info.path)
            .ok_or_else(|| bad(format!("no step count for {}", info.path)))?;
        if let Some(g) = pending_values.remove(&info.path) {
            any_pending = true;
            put_flat(&mut pending, info, g);
        }
    }
    if !optim.is_empty() || !pending_values.is_empty() {
        return Err(bad(
            "optimizer state for parameters this model does not have".into(),
        ));
    }
    trainer.model = model;
    trainer.forget_walk();
    trainer.optimizer.reset_flat();
    trainer.ema.model = ema;
    trainer.ema.reset_flat();
    trainer.ema.updates = meta.ema_updates;
    trainer.epoch = meta.epoch;
    trainer.ni = meta.ni;
    trainer.last_opt_step = meta.last_opt_step;
    trainer.loss.one2many_weight = meta.one2many_weight;
    if let Some(slots) = meta.object_slots {
        trainer.loss.object_slots = slots;
    }
    trainer.history = meta.history;
    trainer.scaler = meta.scaler;
    trainer.pending = any_pending.then_some(pending);
    trainer.pending_flat.clear();
    Ok(())
}
