//! The pictures a fit leaves in its run folder, as Ultralytics writes them: the first training
//! batches as the model sees them (`train_batch0.jpg` …), where the labels fall (`labels.jpg`) and
//! the first validation batch with its labels and with the EMA model's predictions
//! (`val_batch0_labels.jpg`, `val_batch0_pred.jpg`).

use super::Trainer;
use crate::data::{Batch, DataError};
use crate::predict::{Layout, PredictOptions, Predictor, draw};
use std::path::{Path, PathBuf};

/// Training batches drawn, and the most images `labels.jpg` reads.
pub const TRAIN_BATCHES: usize = 3;
const LABEL_IMAGES: usize = 500;
/// Images in the validation picture.
const VAL_IMAGES: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum PictureError {
    #[error(transparent)]
    Data(#[from] DataError),
    #[error("cannot write {path}: {message}")]
    Write { path: PathBuf, message: String },
}

fn save(image: &image::RgbImage, path: &Path) -> Result<(), PictureError> {
    image.save(path).map_err(|e| PictureError::Write {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// `train_batch0.jpg` … of the first epoch's first batches (made on this thread, so exactly the
/// batches training gets), each image with its labels; and `labels.jpg`.
pub fn training(trainer: &Trainer, dir: &Path) -> Result<(), PictureError> {
    let layout = Layout::of(&trainer.cfg);
    let order = trainer.epoch_order(0);
    for b in 0..TRAIN_BATCHES.min(trainer.batches_per_epoch()) {
        let batch = trainer.loader.batch(0, &order, b, trainer.mosaic(0))?;
        let grid = draw::batch_grid(&batch, None, &layout);
        save(&grid, &dir.join(format!("train_batch{b}.jpg")))?;
    }
    let source = &trainer.loader.source;
    let mut labels = Vec::new();
    for i in 0..source.len().min(LABEL_IMAGES) {
        let p = source.prepared(i)?;
        let (w, h) = p.sample.image.dimensions();
        labels.push((w, h, p.sample.instances.clone()));
    }
    save(&draw::label_map(&labels, 640), &dir.join("labels.jpg"))
}

/// `val_batch0_labels.jpg` and `val_batch0_pred.jpg`: the first validation images with their
/// labels, and with the EMA model's predictions at Ultralytics' plotting threshold.
pub fn validation(trainer: &Trainer, dir: &Path) -> Result<(), PictureError> {
    let val = &trainer.val;
    let n = val.len().min(VAL_IMAGES);
    if n == 0 {
        return Ok(());
    }
    let samples = (0..n)
        .map(|i| val.sample(i).map(|(s, _)| s))
        .collect::<Result<Vec<_>, _>>()?;
    let images: Vec<image::RgbImage> = samples.iter().map(|s| s.image.clone()).collect();
    let batch = Batch::collate(samples);
    let layout = Layout::of(&trainer.cfg);
    save(
        &draw::batch_grid(&batch, None, &layout),
        &dir.join("val_batch0_labels.jpg"),
    )?;
    let device = trainer.device.clone().inner();
    let predictor = Predictor::new(
        trainer.ema.model.clone(),
        trainer.cfg.clone(),
        PredictOptions {
            imgsz: trainer.cfg.data.imgsz,
            ..PredictOptions::default()
        },
        &device,
    );
    let found = predictor.predict(&images);
    save(
        &draw::batch_grid(&batch, Some(found.as_slice()), &layout),
        &dir.join("val_batch0_pred.jpg"),
    )
}
