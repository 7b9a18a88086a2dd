//! Training batches: fixed shape (`batch` full images of `size × size`; the last partial batch
//! of an epoch is dropped), augmented, and prepared ahead on background threads while the
//! device trains. Which thread makes a batch never changes its bytes.

use super::augment::{sample_rng, train_sample};
use super::source::Source;
use super::{Batch, DataError};
use crate::config::Augment;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Full batches in an epoch of `n` images: the last partial one dropped or wrapped.
pub fn batches_per_epoch(n: usize, batch: usize, wrap_last: bool) -> usize {
    if wrap_last {
        n.div_ceil(batch)
    } else {
        n / batch
    }
}

/// Makes the batches of an epoch from a shared source.
#[derive(Clone, Debug)]
pub struct Loader {
    pub source: Arc<Source>,
    pub augment: Augment,
    /// Keypoint order after a horizontal flip; `None` disables flips (a pose dataset without it).
    pub flip_idx: Option<Vec<usize>>,
    /// Global batch: the images of one step over all ranks.
    pub batch: usize,
    pub seed: u64,
    /// Data-parallel rank and number of ranks: rank `r` makes the `r`-th of `world` equal slices
    /// of every global batch (docs/multigpu.md).
    pub rank: usize,
    pub world: usize,
    /// Fill the last partial batch with the first images of the order instead of dropping it.
    pub wrap_last: bool,
    /// Background threads; 0 makes batches on the caller's thread when asked.
    pub workers: usize,
    /// Batches each worker may hold ready.
    pub depth: usize,
}

impl Loader {
    pub fn batches_per_epoch(&self) -> usize {
        batches_per_epoch(self.source.len(), self.batch, self.wrap_last)
    }

    /// This rank's share of global batch `b` of an epoch whose image order is `order`: the
    /// same samples, bit for bit, that a single device would put at those positions.
    pub fn batch(
        &self,
        epoch: usize,
        order: &[usize],
        b: usize,
        mosaic: bool,
    ) -> Result<Batch, DataError> {
        let local = self.batch / self.world;
        let first = b * self.batch + self.rank * local;
        let made = (first..first + local)
            .map(|pos| {
                let mut rng = sample_rng(self.seed, epoch, pos);
                train_sample(
                    &self.source,
                    &self.augment,
                    self.flip_idx.as_deref(),
                    order[pos % order.len()],
                    mosaic,
                    &mut rng,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let gains: Option<Vec<[f32; 3]>> = made.iter().map(|(_, g)| *g).collect();
        let mut batch = Batch::collate(made.into_iter().map(|(s, _)| s).collect());
        batch.hsv_gains = gains;
        Ok(batch)
    }

    /// Batches `first..end` of an epoch, in order, made ahead by the workers.
    pub fn prefetch(
        &self,
        epoch: usize,
        order: Vec<usize>,
        first: usize,
        end: usize,
        mosaic: bool,
    ) -> Prefetch {
        let order = Arc::new(order);
        let n = self.workers;
        let mut receivers = Vec::new();
        let mut handles = Vec::new();
        for w in 0..n {
            let (tx, rx): (SyncSender<_>, Receiver<_>) = sync_channel(self.depth.max(1));
            let (loader, order) = (self.clone(), order.clone());
            handles.push(std::thread::spawn(move || {
                for b in (first + w..end).step_by(n) {
                    if tx.send(loader.batch(epoch, &order, b, mosaic)).is_err() {
                        return;
                    }
                }
            }));
            receivers.push(rx);
        }
        Prefetch {
            loader: self.clone(),
            epoch,
            order,
            mosaic,
            receivers,
            handles,
            first,
            next: first,
            end,
            wait: Duration::ZERO,
        }
    }
}

/// The batches of an epoch in order. `wait` is how long the consumer blocked on them.
pub struct Prefetch {
    loader: Loader,
    epoch: usize,
    order: Arc<Vec<usize>>,
    mosaic: bool,
    receivers: Vec<Receiver<Result<Batch, DataError>>>,
    handles: Vec<JoinHandle<()>>,
    first: usize,
    next: usize,
    end: usize,
    pub wait: Duration,
}

impl Prefetch {
    /// Index of the next batch it will yield.
    pub fn position(&self) -> usize {
        self.next
    }
}

impl Iterator for Prefetch {
    type Item = Result<Batch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.end {
            return None;
        }
        let b = self.next;
        self.next += 1;
        let start = Instant::now();
        let out = if self.receivers.is_empty() {
            self.loader.batch(self.epoch, &self.order, b, self.mosaic)
        } else {
            let rx = &self.receivers[(b - self.first) % self.receivers.len()];
            rx.recv().expect("a prefetch worker died (it panicked)")
        };
        self.wait += start.elapsed();
        Some(out)
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        // Closing the channels first unblocks workers waiting to send.
        self.receivers.clear();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}
