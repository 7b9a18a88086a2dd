//! The pictures a fit leaves in its run folder, as Ultralytics writes them: the first training
//! batches as the model sees them (`train_batch0.jpg` …), where the labels fall (`labels.jpg`) and
//! the first validation batch with its labels and with the EMA model's predictions
//! (`val_batch0_labels.jpg`, `val_batch0_pred.jpg`). What needs the trainer (the batches, the
//! predictions) is made on the caller's thread; the drawing and encoding run on threads of their
//! own ([`Drawing`]), as Ultralytics draws its plots, so training goes on meanwhile.

use super::Trainer;
use crate::data::{Batch, DataError, Source};
use crate::predict::{Layout, PredictOptions, Predictor, draw};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

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

/// Pictures being drawn and written on threads of their own. [`Drawing::finish`] waits for them
/// and returns what failed; dropping waits too, so no picture is left half-written when a fit
/// ends early.
#[derive(Default)]
pub struct Drawing(Vec<(PathBuf, JoinHandle<Result<(), PictureError>>)>);

impl Drawing {
    /// Runs `draw`, which writes `path` (and maybe more), on a thread of its own.
    fn spawn(
        &mut self,
        path: PathBuf,
        draw: impl FnOnce() -> Result<(), PictureError> + Send + 'static,
    ) {
        self.0.push((path, std::thread::spawn(draw)));
    }

    /// Waits for every picture; the errors of those that could not be drawn or written.
    pub fn finish(mut self) -> Vec<PictureError> {
        self.join()
    }

    fn join(&mut self) -> Vec<PictureError> {
        self.0
            .drain(..)
            .filter_map(|(path, handle)| match handle.join() {
                Ok(result) => result.err(),
                Err(_) => Some(PictureError::Write {
                    path,
                    message: "drawing it panicked".into(),
                }),
            })
            .collect()
    }
}

impl Drop for Drawing {
    fn drop(&mut self) {
        self.join();
    }
}

fn save(image: &image::RgbImage, path: &Path) -> Result<(), PictureError> {
    image.save(path).map_err(|e| PictureError::Write {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// `train_batch0.jpg` … of the first epoch's first batches (made by the trainer's loader from
/// the first epoch's order, so exactly the batches training gets: a batch is a function of its
/// epoch and position), each image with its labels; and `labels.jpg`. Made, drawn and written on
/// `drawing`'s threads.
pub fn training(trainer: &Trainer, dir: &Path, drawing: &mut Drawing) {
    let layout = Layout::of(&trainer.cfg);
    let order = Arc::new(trainer.epoch_order(0));
    let mosaic = trainer.mosaic(0);
    for b in 0..TRAIN_BATCHES.min(trainer.batches_per_epoch()) {
        let (loader, order, layout) = (trainer.loader.clone(), order.clone(), layout.clone());
        let path = dir.join(format!("train_batch{b}.jpg"));
        drawing.spawn(path.clone(), move || {
            let batch = loader.batch(0, &order, b, mosaic)?;
            save(&draw::batch_grid(&batch, None, &layout), &path)
        });
    }
    let (source, path) = (trainer.loader.source.clone(), dir.join("labels.jpg"));
    drawing.spawn(path.clone(), move || {
        save(&draw::label_map(&label_sizes(&source)?, 640), &path)
    });
}

/// Each of the first [`LABEL_IMAGES`] images' size as loaded and its labels.
fn label_sizes(source: &Source) -> Result<Vec<(u32, u32, Vec<crate::data::Instance>)>, DataError> {
    (0..source.len().min(LABEL_IMAGES))
        .map(|i| {
            let p = source.prepared(i)?;
            let (w, h) = p.sample.image.dimensions();
            Ok((w, h, p.sample.instances.clone()))
        })
        .collect()
}

/// `val_batch0_labels.jpg` and `val_batch0_pred.jpg`: the first validation images with their
/// labels, and with the EMA model's predictions at Ultralytics' plotting threshold. The
/// predictions are made on this thread; both pictures are drawn and written on `drawing`'s.
pub fn validation(
    trainer: &Trainer,
    dir: &Path,
    drawing: &mut Drawing,
) -> Result<(), PictureError> {
    let val = &trainer.val;
    let n = val.len().min(VAL_IMAGES);
    if n == 0 {
        return Ok(());
    }
    let samples = (0..n)
        .map(|i| val.sample(i).map(|(s, _)| s))
        .collect::<Result<Vec<_>, _>>()?;
    let images: Vec<image::RgbImage> = samples.iter().map(|s| s.image.clone()).collect();
    let batch = Arc::new(Batch::collate(samples));
    let layout = Layout::of(&trainer.cfg);
    let (labels, path) = (batch.clone(), dir.join("val_batch0_labels.jpg"));
    let labels_layout = layout.clone();
    drawing.spawn(path.clone(), move || {
        save(&draw::batch_grid(&labels, None, &labels_layout), &path)
    });
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
    let path = dir.join("val_batch0_pred.jpg");
    drawing.spawn(path.clone(), move || {
        save(
            &draw::batch_grid(&batch, Some(found.as_slice()), &layout),
            &path,
        )
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    fn slow(flag: &Arc<AtomicBool>) -> impl FnOnce() -> Result<(), PictureError> + Send + 'static {
        let flag = flag.clone();
        move || {
            std::thread::sleep(Duration::from_millis(50));
            flag.store(true, Ordering::SeqCst);
            Ok(())
        }
    }

    /// `finish` waits for every picture and returns the failures, a panic among them; a dropped
    /// `Drawing` waits too.
    #[test]
    fn drawing_waits_for_every_picture_and_reports_failures() {
        let done = Arc::new(AtomicBool::new(false));
        let mut drawing = Drawing::default();
        drawing.spawn("a.jpg".into(), slow(&done));
        drawing.spawn("b.jpg".into(), || {
            Err(PictureError::Write {
                path: "b.jpg".into(),
                message: "disk full".into(),
            })
        });
        drawing.spawn("c.jpg".into(), || panic!("a drawing bug"));
        let errors: Vec<String> = drawing.finish().iter().map(|e| e.to_string()).collect();
        assert!(
            done.load(Ordering::SeqCst),
            "finish returned before a picture was done"
        );
        assert_eq!(
            errors,
            [
                "cannot write b.jpg: disk full",
                "cannot write c.jpg: drawing it panicked"
            ]
        );

        let done = Arc::new(AtomicBool::new(false));
        let mut drawing = Drawing::default();
        drawing.spawn("d.jpg".into(), slow(&done));
        drop(drawing);
        assert!(
            done.load(Ordering::SeqCst),
            "the drop returned before a picture was done"
        );
    }
}
