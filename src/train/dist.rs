//! Data-parallel training (docs/multigpu.md): every rank holds a full replica, trains on its slice
//! of each global batch, and after each backward the ranks average their gradients; BatchNorm
//! running statistics follow rank 0 after every step (what PyTorch DDP's buffer broadcast does).
//! The exchange goes through a [`Collective`]: [`ThreadGroup`] (ranks as threads of one process)
//! is what the CPU tests use; an NCCL collective for GPUs plugs in behind the same trait.

use crate::model::Yolo;
use crate::optim::grads::{put_flat, take_flat};
use crate::optim::groups::ParamInfo;
use crate::optim::tensors::{float_tensors, replace_float_tensors};
use burn::optim::GradientsParams;
use burn::prelude::*;
use std::collections::HashMap;
use std::sync::{Arc, Barrier, Mutex};

/// What data parallelism needs from a communication library.
pub trait Collective: Send + Sync {
    fn rank(&self) -> usize;
    fn world(&self) -> usize;
    /// Element-wise mean over ranks, in place. Every rank passes the same length and gets the
    /// same bytes back.
    fn all_reduce_mean(&self, values: &mut [f32]);
    /// Rank 0's values to every rank, in place.
    fn broadcast(&self, values: &mut [f32]);
}

/// Ranks as threads of one process, exchanging through shared memory.
pub struct ThreadGroup {
    rank: usize,
    shared: Arc<Shared>,
}

struct Shared {
    world: usize,
    barrier: Barrier,
    slots: Mutex<Vec<Vec<f32>>>,
}

impl ThreadGroup {
    /// One handle per rank, to be moved into that rank's thread.
    pub fn new(world: usize) -> Vec<Self> {
        let shared = Arc::new(Shared {
            world,
            barrier: Barrier::new(world),
            slots: Mutex::new(vec![Vec::new(); world]),
        });
        (0..world)
            .map(|rank| Self {
                rank,
                shared: shared.clone(),
            })
            .collect()
    }

    fn exchange(&self, values: &mut [f32], combine: impl Fn(&[Vec<f32>]) -> Vec<f32>) {
        let s = &self.shared;
        s.slots.lock().unwrap()[self.rank] = values.to_vec();
        s.barrier.wait();
        let out = combine(&s.slots.lock().unwrap());
        // Nobody may refill a slot before every rank has read them all.
        s.barrier.wait();
        values.copy_from_slice(&out);
    }
}

impl Collective for ThreadGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.shared.world
    }

    fn all_reduce_mean(&self, values: &mut [f32]) {
        let world = self.shared.world as f32;
        self.exchange(values, |slots| {
            // Summed in rank order on every rank, so all ranks get identical bytes.
            let mut sum = vec![0f32; slots[0].len()];
            for slot in slots {
                for (s, v) in sum.iter_mut().zip(slot) {
                    *s += v;
                }
            }
            sum.iter().map(|s| s / world).collect()
        });
    }

    fn broadcast(&self, values: &mut [f32]) {
        self.exchange(values, |slots| slots[0].clone());
    }
}

/// Gradients averaged over ranks. A parameter without a gradient on some ranks counts as zero
/// there (PyTorch DDP with unused parameters); one without a gradient on every rank stays absent,
/// so the optimizer still skips it (the empty-batch point stems).
pub fn all_reduce_grads(
    collective: &dyn Collective,
    mut grads: GradientsParams,
    table: &[ParamInfo],
    device: &Device,
) -> GradientsParams {
    let sizes: Vec<usize> = table.iter().map(ParamInfo::numel).collect();
    let total: usize = sizes.iter().sum();
    // Layout: one presence flag per parameter, then every parameter's values in table order.
    let mut flat = vec![0f32; table.len() + total];
    let mut offset = table.len();
    for (i, p) in table.iter().enumerate() {
        if let Some(g) = take_flat(&mut grads, p) {
            let v = g.into_data().convert::<f32>().try_into_vec::<f32>();
            flat[i] = 1.0;
            flat[offset..offset + sizes[i]].copy_from_slice(&v.expect("f32 gradient"));
        }
        offset += sizes[i];
    }
    collective.all_reduce_mean(&mut flat);
    let mut out = GradientsParams::new();
    let mut offset = table.len();
    for (i, p) in table.iter().enumerate() {
        let values = &flat[offset..offset + sizes[i]];
        offset += sizes[i];
        if flat[i] == 0.0 {
            continue;
        }
        let t = Tensor::<1>::from_data(TensorData::new(values.to_vec(), [sizes[i]]), device);
        put_flat(&mut out, p, t);
    }
    out
}

/// The model with every BatchNorm running statistic replaced by rank 0's.
pub fn broadcast_buffers(collective: &dyn Collective, model: Yolo, device: &Device) -> Yolo {
    let buffers: Vec<(String, Tensor<1>)> = float_tensors(&model.valid())
        .into_iter()
        .filter(|(path, _)| path.ends_with("running_mean") || path.ends_with("running_var"))
        .collect();
    let mut flat: Vec<f32> = Vec::new();
    let mut lens = Vec::new();
    for (_, t) in &buffers {
        let v = t.clone().into_data().convert::<f32>().try_into_vec::<f32>();
        let v = v.expect("f32 buffer");
        lens.push(v.len());
        flat.extend(v);
    }
    collective.broadcast(&mut flat);
    let mut offset = 0;
    let mut values: HashMap<String, Tensor<1>> = HashMap::new();
    for ((path, _), n) in buffers.into_iter().zip(lens) {
        let v = flat[offset..offset + n].to_vec();
        offset += n;
        values.insert(path, Tensor::from_data(TensorData::new(v, [n]), device));
    }
    replace_float_tensors(model, &mut values).0
}
