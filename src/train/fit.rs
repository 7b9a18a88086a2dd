//! A complete fit of a [`Trainer`]: its epochs, validation, checkpoints and run folder, with
//! progress reported through [`FitEvents`] (docs/training.md, "A fit from a Burn program").

use super::checkpoint::{self, CheckpointError};
use super::{EpochRecord, TrainError, Trainer, pictures, plot, report};
use std::path::{Path, PathBuf};

/// What a fit tells its caller as it goes. Every method does nothing unless implemented.
pub trait FitEvents {
    /// Before the first batch of `epoch` (0-based), which has `batches` batches.
    fn epoch_start(&mut self, _epoch: usize, _batches: usize) {}
    /// After batch `batch` (0-based) of `batches`, with its logged loss items
    /// ([`crate::loss::TERMS`]).
    fn step(&mut self, _batch: usize, _batches: usize, _items: &[f32; 6]) {}
    /// After an epoch's validation, with its record; the epoch's timed steps (when the trainer
    /// times them) start at `timed_from` in `trainer.timing`.
    fn epoch_end(&mut self, _trainer: &Trainer, _record: &EpochRecord, _timed_from: usize) {}
    /// An output that could not be written (a picture, the plot); the fit goes on.
    fn warning(&mut self, _message: &str) {}
    /// Something else the user should read: an early stop.
    fn notice(&mut self, _message: &str) {}
}

/// Events nobody listens to.
impl FitEvents for () {}

/// How a fit ended.
#[derive(Clone, Debug, PartialEq)]
pub struct FitSummary {
    /// Epochs completed, resumed ones included.
    pub epochs: usize,
    /// The epoch (1-based) whose model is `best.safetensors`; 0 when no epoch had a fitness.
    pub best_epoch: usize,
    /// Whether `train.patience` stopped it before `train.epochs`.
    pub stopped_early: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum FitError {
    #[error(transparent)]
    Train(#[from] TrainError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("writing {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn write_err(path: PathBuf) -> impl FnOnce(std::io::Error) -> FitError {
    move |source| FitError::Write { path, source }
}

/// Trains `trainer` from where it stands (a new or a resumed fit) to `train.epochs`, or until
/// `train.patience` epochs pass without a better fitness. Writes into `run_dir`: `config.toml`,
/// `last.safetensors` after every epoch (before anything else of that epoch), `best.safetensors`
/// (the same file as that `last`) when the fitness improves, `epoch<N>.safetensors` every `train.save_period` epochs,
/// `results.csv` and `results.png`, `steps.csv` when the trainer times its steps, and the
/// training and validation pictures. A picture or plot that cannot be drawn is a warning, not an
/// error.
pub fn fit(
    trainer: &mut Trainer,
    run_dir: &Path,
    events: &mut dyn FitEvents,
) -> Result<FitSummary, FitError> {
    let cfg = trainer.cfg.clone();
    std::fs::create_dir_all(run_dir).map_err(write_err(run_dir.to_path_buf()))?;
    let config_file = run_dir.join("config.toml");
    std::fs::write(&config_file, cfg.to_toml()).map_err(write_err(config_file))?;
    // The best fitness so far and its epoch (1-based; 0 before any).
    let (mut best, mut best_epoch) = trainer
        .history
        .iter()
        .map(|r| (r.fitness(), r.epoch + 1))
        .fold((f64::MIN, 0), |a, b| if b.0 > a.0 { b } else { a });
    // Drawn on threads of their own while training goes on; waited for before the fit returns
    // (and when it fails, by the drop).
    let mut drawing = pictures::Drawing::default();
    if trainer.epoch == 0 {
        pictures::training(trainer, run_dir, &mut drawing);
    }
    let first_timed_ni = trainer.ni;
    let mut stopped_early = false;
    while !trainer.finished() {
        let epoch = trainer.epoch;
        let timed_from = trainer.timing.as_ref().map_or(0, |t| t.step_ms.len());
        events.epoch_start(epoch, trainer.batches_per_epoch());
        let record = trainer.run_epoch(&mut |b, nb, items| events.step(b, nb, items))?;
        events.epoch_end(trainer, &record, timed_from);
        // Checkpoints first: nothing written after them can lose the epoch.
        let last = run_dir.join("last.safetensors");
        checkpoint::save(trainer, &last)?;
        if record.fitness() > best {
            (best, best_epoch) = (record.fitness(), epoch + 1);
            let path = run_dir.join("best.safetensors");
            keep_as_best(&last, &path).map_err(write_err(path))?;
        }
        let period = cfg.train.save_period;
        if period > 0 && (epoch + 1).is_multiple_of(period) {
            let path = run_dir.join(format!("epoch{}.safetensors", epoch + 1));
            checkpoint::save(trainer, &path)?;
        }
        let patience = cfg.train.patience;
        let stop = patience > 0 && epoch + 1 - best_epoch >= patience && !trainer.finished();
        report::write_results(run_dir, &trainer.history)
            .map_err(write_err(run_dir.join("results.csv")))?;
        if let Some(t) = &trainer.timing {
            let path = run_dir.join("steps.csv");
            report::write_atomic(&path, report::steps_csv(t, first_timed_ni).as_bytes())
                .map_err(write_err(path))?;
        }
        if let Err(e) = plot::write_plot(run_dir, &trainer.history) {
            let path = run_dir.join("results.png");
            events.warning(&format!("could not write {}: {e}", path.display()));
        }
        if trainer.finished() || stop {
            picture(pictures::validation(trainer, run_dir, &mut drawing), events);
        }
        if stop {
            events.notice(&format!(
                "stopping early: no improvement in {patience} epochs (train.patience); the best, \
                 epoch {best_epoch}, is {}",
                run_dir.join("best.safetensors").display()
            ));
            stopped_early = true;
            break;
        }
    }
    for e in drawing.finish() {
        events.warning(&e.to_string());
    }
    Ok(FitSummary {
        epochs: trainer.epoch,
        best_epoch,
        stopped_early,
    })
}

/// Makes `best` the file `last` is now (the same state, so the same bytes): a hard link where the
/// filesystem has them, else a copy, renamed into place either way. A save gathers and writes the
/// whole state again (0.18–0.37 s for the nano pose model on a 2-core CPU); the link takes
/// microseconds. `last` is only ever replaced by a rename, never written in place, so a later
/// `last` leaves `best` as it is.
fn keep_as_best(last: &Path, best: &Path) -> std::io::Result<()> {
    report::replace_atomic(best, |tmp| {
        std::fs::hard_link(last, tmp).or_else(|_| {
            std::fs::copy(last, tmp)?;
            std::fs::File::open(tmp)?.sync_all()
        })
    })
}

/// A picture is not worth a fit: a failure to draw it is reported and training goes on.
fn picture(result: Result<(), pictures::PictureError>, events: &mut dyn FitEvents) {
    if let Err(e) = result {
        events.warning(&e.to_string());
    }
}

/// `name`, or the first of `name2`, `name3`, … that is not a non-empty folder under `dir`
/// (Ultralytics' rule), so a fit never writes over an earlier run.
pub fn unused_run_name(dir: &Path, name: &str) -> String {
    let taken =
        |n: &str| std::fs::read_dir(dir.join(n)).is_ok_and(|mut entries| entries.next().is_some());
    if !taken(name) {
        return name.to_string();
    }
    (2..)
        .map(|i| format!("{name}{i}"))
        .find(|n| !taken(n))
        .expect("some suffix is free")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `best` takes `last`'s bytes when kept, and keeps them when a later `last` replaces the
    /// file (as every save does, by a rename).
    #[test]
    fn best_keeps_the_last_it_was_made_from() {
        let dir = std::env::temp_dir().join(format!("burnpose-best-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (last, best) = (dir.join("last.safetensors"), dir.join("best.safetensors"));
        report::write_atomic(&last, b"epoch 1").unwrap();
        keep_as_best(&last, &best).unwrap();
        assert_eq!(std::fs::read(&best).unwrap(), b"epoch 1");
        report::write_atomic(&last, b"epoch 2").unwrap();
        assert_eq!(
            std::fs::read(&best).unwrap(),
            b"epoch 1",
            "a new last changed best"
        );
        keep_as_best(&last, &best).unwrap();
        assert_eq!(std::fs::read(&best).unwrap(), b"epoch 2");
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(left.len(), 2, "a temporary file was left behind");
        std::fs::remove_dir_all(&dir).ok();
    }
}
