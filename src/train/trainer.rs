//! The native training loop. One [`Trainer`] owns everything a resume or a parity test must
//! see: model, EMA, optimizer, loss weights, schedule position and pending gradients.

use super::dist::{Collective, all_reduce_grads, broadcast_buffers};
pub use super::timing::{PHASES, StepTiming, median};
use super::timing::{Phase, PhaseClock};
use crate::config::{Config, LastBatch, LossOn, OptimizerKind, Precision};
use crate::data::augment::mosaic_active;
use crate::data::loader::batches_per_epoch;
use crate::data::source::Dataset;
use crate::data::{Batch, COCO_FLIP_IDX, DataError, Instance, Loader, Source};
use crate::loss::E2eLoss;
use crate::model::HeadOutput;
use crate::model::precision::autocast;
use crate::model::{Task, Yolo};
use crate::optim::grads::{self, FlatGrads};
use crate::optim::hash::{StateHasher, module_hash};
use crate::optim::optimizer::Stepped;
use crate::optim::{Ema, LossScaler, Optimizer, Rule, Schedule};
use crate::replay::eligibility::{self, Setup};
use crate::replay::stage::{Scope, drop_unreached, merge};
use crate::replay::{Stage, StageOutputs};
use burn::optim::GradientsParams;
use burn::prelude::*;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use std::path::Path;
use std::sync::Arc;

mod step;
mod update;

/// Why a fit cannot start or go on.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Data(#[from] DataError),
    #[error("{0}")]
    Setup(String),
    /// Not a `source`: the message already holds it, and a chain would print it twice.
    #[error("model.weights: {0}")]
    Weights(crate::weights::WeightsError),
    #[error(
        "the loss became {value} at epoch {epoch}, iteration {iteration} of {of}: the fit stops \
         here and its run folder keeps the last good checkpoint (try a lower optim.lr0, or \
         train.precision = \"fp32\")"
    )]
    NonFinite {
        /// 1-based, as the progress lines count.
        epoch: usize,
        iteration: usize,
        of: usize,
        value: f32,
    },
}

/// Mean loss items of an epoch and what validation measured.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EpochRecord {
    pub epoch: usize,
    /// Mean of the logged (one-to-one, gain-weighted) items: box, pose, kobj, cls, l1, rle.
    pub train_loss: [f64; 6],
    pub lr: f64,
    pub box_map50: f64,
    pub box_map: f64,
    pub pose_map50: f64,
    pub pose_map: f64,
    pub seconds: f64,
    /// Seconds the training thread waited for batches (decoding, augmentation).
    #[serde(default)]
    pub data_wait: f64,
    /// Seconds of `seconds` spent validating the EMA (absent in older checkpoints).
    #[serde(default)]
    pub val_seconds: f64,
    /// Per-class box and pose mAP50-95.
    #[serde(default)]
    pub per_class: Vec<super::validate::ClassMap>,
}

impl EpochRecord {
    /// Ultralytics' fitness: pose mAP50-95 + box mAP50-95.
    pub fn fitness(&self) -> f64 {
        self.pose_map.max(0.0) + self.box_map.max(0.0)
    }
}

pub struct Trainer {
    pub cfg: Config,
    pub device: Device,
    pub model: Yolo,
    pub ema: Ema<Yolo>,
    pub optimizer: Optimizer,
    pub loss: E2eLoss,
    pub schedule: Schedule,
    /// Next epoch to run.
    pub epoch: usize,
    /// Global iteration (micro-batches done).
    pub ni: usize,
    pub last_opt_step: i64,
    /// Gradients summed since the last optimizer step.
    pub pending: Option<GradientsParams>,
    /// The flat buffers that entries of `pending` are views of (the replayed stage's, see
    /// [`FlatGrads`]); dropped whenever `pending` is replaced.
    pub(crate) pending_flat: Vec<FlatGrads>,
    pub history: Vec<EpochRecord>,
    /// Training batches (augmented, prefetched) and the validation images.
    pub loader: Loader,
    pub val: Source,
    /// Loss items of every step (one-to-one, gain-weighted), for logs and parity.
    pub step_losses: Vec<[f32; 6]>,
    /// Bad images/records dropped when the datasets were opened (`data.skip_bad`).
    pub skipped_records: usize,
    /// Data-parallel group this trainer is one rank of (`None`: single device).
    pub collective: Option<Arc<dyn Collective>>,
    /// Dynamic loss scaling; present exactly when training in FP16.
    pub scaler: Option<LossScaler>,
    /// Backbone + neck: native or replayed from CUDA graphs (`replay.enabled`).
    pub stage: Stage,
    /// Why the stage is native (`None` while replaying).
    pub replay_off: Option<String>,
    /// When set, every training step is timed between two device syncs (benchmarks).
    pub timing: Option<StepTiming>,
    /// Steps whose loss was read back after the next step's replay was queued
    /// (`replay.defer_readback`).
    pub read_late: usize,
    /// Steps that took their images made while the step before ran (`replay.upload_ahead`).
    pub uploaded_ahead: usize,
    /// The step [`Trainer::queue_step`] left to finish (`replay.defer_readback`).
    #[cfg(feature = "cuda")]
    queued: Option<step::Launched>,
    /// The next batch's images, made while the last step's graph ran (`replay.upload_ahead`).
    #[cfg(feature = "cuda")]
    ahead: Option<step::Ahead>,
    /// A walk of the model made while this step's graph ran (`replay::update::choose_early`):
    /// the EMA's sources for its recorded update and the next step's recorded sources. Dropped
    /// wherever the model's tensors may be replaced before then ([`Trainer::forget_walk`]).
    #[cfg(feature = "cuda")]
    walked: Option<Vec<Tensor<1>>>,
}

/// The optimizer 'auto' resolves to, with its lr0 and momentum (yolo_spec §4.2).
pub fn resolve_optimizer(cfg: &Config, n_train: usize) -> (Rule, f64, f64, f64) {
    let o = &cfg.optim;
    match o.optimizer {
        OptimizerKind::Sgd => (Rule::Sgd, o.lr0, o.momentum, o.warmup_bias_lr),
        OptimizerKind::Musgd => (Rule::MuSgd, o.lr0, o.momentum, o.warmup_bias_lr),
        OptimizerKind::Adamw => (Rule::AdamW, o.lr0, o.momentum, o.warmup_bias_lr),
        OptimizerKind::Auto => {
            let per_epoch = n_train.div_ceil(cfg.train.batch.max(cfg.train.nbs));
            if per_epoch * cfg.train.epochs > 10_000 {
                (Rule::MuSgd, 0.01, 0.9, 0.0)
            } else {
                let lr = (0.002 * 5.0 / (4.0 + cfg.model.nc as f64) * 1e6).round() / 1e6;
                (Rule::AdamW, lr, 0.9, 0.0)
            }
        }
    }
}

impl Trainer {
    /// A fresh run: seeded model, EMA, optimizer and schedule.
    pub fn new(cfg: Config, config_path: &Path, device: Device) -> Result<Self, TrainError> {
        cfg.validate(config_path)
            .map_err(|e| TrainError::Setup(e.to_string()))?;
        let (train, val, skipped) = Source::open(&cfg, config_path)?;
        if skipped > 0 {
            eprintln!("warning: {skipped} bad records skipped (data.skip_bad = true)");
        }
        let batch = cfg.train.batch;
        let flip_idx = flip_idx(&cfg, &train);
        if train.len() < batch {
            return Err(TrainError::Setup(format!(
                "{}: {} training images but train.batch = {batch}; a batch must be full",
                config_path.display(),
                train.len()
            )));
        }
        let device = device.autodiff();
        crate::model::ops::set_conv_bn_ops(cfg.device.conv_bn_ops);
        let model = {
            // Burn's device RNG is process-wide: seeding it and drawing the initial weights must
            // not interleave with another trainer doing the same (parallel tests, data-parallel
            // ranks as threads). Burn initialises parameters lazily, on first use, so every one
            // is touched here, inside the lock.
            static INIT: std::sync::Mutex<()> = std::sync::Mutex::new(());
            let _only_me = INIT.lock().unwrap_or_else(|e| e.into_inner());
            device.seed(cfg.train.seed);
            let model = cfg.model.yolo().init(&device);
            crate::optim::tensors::float_tensors(&model);
            model
        };
        let model = match cfg.model.weights_path(config_path) {
            Some(path) => {
                let (model, report) =
                    crate::weights::load_ultralytics(model, &path).map_err(TrainError::Weights)?;
                println!("model.weights {}: {report}", path.display());
                model
            }
            None => model,
        };
        let model = model.freeze_layers(&cfg.train.freeze.layers());
        let mut ema = Ema::new(&model);
        ema.flat_update = cfg.optim.flat_update;
        let (rule, lr0, momentum, warmup_bias_lr) = resolve_optimizer(&cfg, train.len());
        let mut optimizer = Optimizer::new(rule, &model);
        optimizer.flat_update = cfg.optim.flat_update;
        let wrap_last = cfg.data.last_batch == LastBatch::Wrap;
        let nb = batches_per_epoch(train.len(), batch, wrap_last);
        let o = &cfg.optim;
        let schedule = Schedule {
            lr0,
            lrf: o.lrf,
            epochs: cfg.train.epochs,
            cosine: o.cos_lr,
            momentum,
            warmup_momentum: o.warmup_momentum,
            warmup_bias_lr,
            warmup_iters: Schedule::warmup_iters(o.warmup_epochs, cfg.train.epochs, nb),
            batch,
            nbs: cfg.train.nbs,
            weight_decay: o.weight_decay,
        };
        let imgsz = cfg.data.imgsz;
        let mut loss = E2eLoss::new(cfg.model.task, cfg.model.kpt_shape[0], [imgsz, imgsz]);
        loss.object_slots = cfg.train.object_slots;
        // The dataset's own OKS sigmas, where its yaml gives them, for the loss and validation.
        if let Some(sigmas) = train.kpt_oks_sigmas()
            && cfg.model.task == Task::Pose
        {
            loss.sigmas = sigmas.to_vec();
        }
        let scaler = (cfg.train.precision == Precision::Fp16).then(LossScaler::default);
        let (stage, replay_off) = choose_stage(&cfg, &model, &device, false);
        Ok(Self {
            device,
            model,
            ema,
            optimizer,
            loss,
            schedule,
            epoch: 0,
            ni: 0,
            last_opt_step: -1,
            pending: None,
            pending_flat: Vec::new(),
            read_late: 0,
            uploaded_ahead: 0,
            #[cfg(feature = "cuda")]
            queued: None,
            #[cfg(feature = "cuda")]
            ahead: None,
            #[cfg(feature = "cuda")]
            walked: None,
            history: Vec::new(),
            loader: Loader {
                source: Arc::new(train),
                augment: cfg.augment.clone(),
                flip_idx,
                batch,
                seed: cfg.train.seed,
                rank: 0,
                world: 1,
                wrap_last,
                workers: cfg.data.workers,
                depth: 2,
            },
            cfg,
            val,
            step_losses: Vec::new(),
            skipped_records: skipped,
            collective: None,
            scaler,
            stage,
            replay_off,
            timing: None,
        })
    }

    /// Makes this trainer one rank of a data-parallel group: it trains on its slice of every
    /// global batch (`train.batch` must divide by the world size), averages gradients with the
    /// other ranks and takes BatchNorm statistics from rank 0 (docs/multigpu.md).
    pub fn join(mut self, collective: Arc<dyn Collective>) -> Result<Self, TrainError> {
        let world = collective.world();
        if !self.cfg.train.batch.is_multiple_of(world) {
            return Err(TrainError::Setup(format!(
                "train.batch = {} does not split over {world} ranks",
                self.cfg.train.batch
            )));
        }
        if self.stage.is_replay() {
            let (stage, why) = choose_stage(&self.cfg, &self.model, &self.device, true);
            (self.stage, self.replay_off) = (stage, why);
        }
        self.loader.rank = collective.rank();
        self.loader.world = world;
        self.collective = Some(collective);
        Ok(self)
    }

    pub fn batches_per_epoch(&self) -> usize {
        self.loader.batches_per_epoch()
    }

    /// Whether mosaic is on in `epoch` (see [`mosaic_active`]).
    pub fn mosaic(&self, epoch: usize) -> bool {
        let t = &self.cfg.train;
        mosaic_active(epoch, t.epochs, t.close_mosaic)
    }

    /// Image order of an epoch: a permutation drawn from (seed, epoch) only, so a resumed run
    /// sees the same batches.
    pub fn epoch_order(&self, epoch: usize) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.loader.source.len()).collect();
        let mut rng = StdRng::seed_from_u64(
            self.cfg
                .train
                .seed
                .wrapping_mul(1_000_003)
                .wrapping_add(epoch as u64),
        );
        order.shuffle(&mut rng);
        order
    }

    /// Batch `b` of the current epoch whose image order is `order` (from
    /// [`Trainer::epoch_order`]), made on this thread.
    pub fn batch(&self, order: &[usize], b: usize) -> Result<Batch, DataError> {
        self.loader
            .batch(self.epoch, order, b, self.mosaic(self.epoch))
    }

    /// Trains one epoch, updates the loss weights, validates the EMA and records the epoch.
    pub fn run_epoch(
        &mut self,
        on_step: &mut dyn FnMut(usize, usize, &[f32; 6]),
    ) -> Result<EpochRecord, TrainError> {
        let start = std::time::Instant::now();
        let nb = self.batches_per_epoch();
        let first = self.ni - self.epoch * nb;
        let mut sums = [0f64; 6];
        let order = self.epoch_order(self.epoch);
        let mut batches =
            self.loader
                .prefetch(self.epoch, order, first, nb, self.mosaic(self.epoch));
        // Batch index of the next step to finish (`queue_step` may finish one a call later).
        let mut b = first;
        // One batch ahead, so that a step may make the next one's images while it runs
        // (`replay.upload_ahead`).
        let mut upcoming = batches.next();
        loop {
            let current = upcoming.take();
            if current.is_some() {
                upcoming = batches.next();
            }
            let done = match current {
                Some(batch) if !self.steps_synced() => {
                    let next = upcoming.as_ref().and_then(|r| r.as_ref().ok());
                    self.paced_step(&batch?, next)
                }
                Some(batch) => vec![self.timed_step(&batch?)?],
                None => match self.finish_queued() {
                    Some(items) => vec![items],
                    None => break,
                },
            };
            for items in done {
                // FP16's loss scaler skips non-finite steps itself; in FP32 and BF16 such a
                // step has already spread NaN into the weights, so nothing after it may be saved.
                if self.scaler.is_none()
                    && let Some(&value) = items.iter().find(|v| !v.is_finite())
                {
                    return Err(TrainError::NonFinite {
                        epoch: self.epoch + 1,
                        iteration: b + 1,
                        of: nb,
                        value,
                    });
                }
                for (s, v) in sums.iter_mut().zip(items) {
                    *s += v as f64;
                }
                on_step(b, nb, &items);
                b += 1;
            }
        }
        // Walks never cross an epoch's end (validation, checkpoints, the data's next shapes).
        self.forget_walk();
        let lr = self.schedule.hyper(self.epoch, self.ni).lr[0];
        self.loss.update(self.epoch + 1, self.cfg.train.epochs);
        let val_start = std::time::Instant::now();
        let metrics = super::validate::validate(&self.ema.model, &self.val, &self.cfg, &self.loss)?;
        let val_seconds = val_start.elapsed().as_secs_f64();
        let record = EpochRecord {
            epoch: self.epoch,
            train_loss: sums.map(|s| s / (nb - first).max(1) as f64),
            lr,
            box_map50: metrics.box_map50,
            box_map: metrics.box_map,
            pose_map50: metrics.pose_map50,
            pose_map: metrics.pose_map,
            seconds: start.elapsed().as_secs_f64(),
            data_wait: batches.wait.as_secs_f64(),
            val_seconds,
            per_class: metrics.per_class,
        };
        self.history.push(record.clone());
        self.epoch += 1;
        Ok(record)
    }

    pub fn finished(&self) -> bool {
        self.epoch >= self.cfg.train.epochs
    }

    /// Hashes of every piece of training state.
    pub fn state_hashes(&self) -> StateHashes {
        let mut sched = StateHasher::new();
        sched.u64("epoch", self.epoch as u64);
        sched.u64("ni", self.ni as u64);
        sched.u64("last_opt_step", self.last_opt_step as u64);
        sched.f64("one2many_weight", self.loss.one2many_weight as f64);
        sched.u64("object_slots", self.loss.object_slots as u64);
        let mut losses = StateHasher::new();
        for l in &self.step_losses {
            for v in l {
                losses.f64("l", *v as f64);
            }
        }
        StateHashes {
            // `valid()` first merges pending BatchNorm running-stat updates (Burn keeps the
            // latest one per thread until then).
            model: module_hash(&self.model.valid()),
            ema: self.ema.state_hash(),
            optimizer: self.optimizer.state_hash(),
            scheduler: sched.finish(),
            scaler: self
                .scaler
                .as_ref()
                .map_or_else(|| "none".into(), LossScaler::state_hash),
            losses: losses.finish(),
        }
    }
}

/// The stage a fit uses, and why it is native when it is. A refusal of a requested
/// replay is logged here, once.
fn choose_stage(
    cfg: &Config,
    model: &Yolo,
    device: &Device,
    multi_device: bool,
) -> (Stage, Option<String>) {
    let enabled = cfg.replay.enabled;
    let scope = cfg.replay_scope();
    let verdict = eligibility::check(&Setup {
        enabled,
        device,
        multi_device,
        scope,
        model,
    });
    match verdict {
        Ok(()) => (replay_stage(device, scope, cfg.one_graph()), None),
        Err(why) => {
            if enabled {
                let stage = match scope {
                    Scope::Features => "the backbone and neck run",
                    Scope::Network | Scope::Step => "the network runs",
                };
                eprintln!("feature replay off: {why}; {stage} natively");
            }
            (Stage::Native(scope), Some(why))
        }
    }
}

#[cfg(feature = "cuda")]
fn replay_stage(device: &Device, scope: Scope, one_graph: bool) -> Stage {
    let recorder = crate::replay::recorder::Recorder::new(device, scope).with_one_graph(one_graph);
    Stage::Replay(Box::new(recorder))
}

#[cfg(not(feature = "cuda"))]
fn replay_stage(_device: &Device, _scope: Scope, _one_graph: bool) -> Stage {
    unreachable!("eligibility refuses replay without the CUDA backend")
}

/// Keypoint order after a horizontal flip: the YOLO yaml's `flip_idx`, COCO's for 17 keypoints,
/// nothing to swap for detection; `None` (no flips) for other pose layouts.
fn flip_idx(cfg: &Config, train: &Source) -> Option<Vec<usize>> {
    let k = cfg.model.kpt_shape[0];
    match (&train.dataset, cfg.model.task) {
        (_, Task::Detect) => Some(Vec::new()),
        (Dataset::Yolo(y), _) if y.flip_idx.is_some() => y.flip_idx.clone(),
        _ if k == COCO_FLIP_IDX.len() => Some(COCO_FLIP_IDX.to_vec()),
        _ => {
            eprintln!("note: no flip_idx for {k} keypoints; horizontal flips are off");
            None
        }
    }
}

/// Byte hashes of the training state.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StateHashes {
    pub model: String,
    pub ema: String,
    pub optimizer: String,
    pub scheduler: String,
    /// FP16 loss scaler ("none" in FP32/BF16).
    pub scaler: String,
    /// Every per-step loss vector.
    pub losses: String,
}
