//! Exponential moving average of the model (yolo_spec §4.7): every float tensor, parameters and
//! BN running statistics, with decay d = 0.9999·(1 − exp(−k/2000)).

use super::hash::StateHasher;
use super::host::{HostValues, take_host};
use super::layout::Layout;
use super::tensors::{float_tensors, replace_float_tensors, write_in_place};
use crate::config::device::is_cuda;
use crate::model::ops::storage;
use burn::module::Module;
use burn::prelude::*;
use std::collections::HashMap;

/// Not `Clone`: on CUDA the averaged model's tensors are views of one buffer that every update
/// rewrites in place, which a clone would share.
#[derive(Debug)]
pub struct Ema<M> {
    /// The averaged model (a `valid()` snapshot: no autodiff, training flags off).
    pub model: M,
    pub updates: u64,
    pub decay: f64,
    pub tau: f64,
    /// Average every tensor as one flat buffer (`optim.flat_update`): the same bits in ~3×
    /// fewer kernel launches.
    pub flat_update: bool,
    /// The averaged tensors' flat buffer, paths and layout; `model`'s tensors are views of it.
    /// Dropped by [`Ema::reset_flat`] when `model` is replaced from outside.
    flat: Option<(Vec<String>, Layout, Tensor<1>)>,
}

impl<M: Module> Ema<M> {
    /// Starts from a copy of `model` (new buffers, same parameter ids).
    pub fn new(model: &M) -> Self {
        let copy = model.valid();
        let mut fresh: HashMap<String, Tensor<1>> = float_tensors(&copy)
            .into_iter()
            .map(|(k, t)| (k, Tensor::from_data(t.to_data(), &t.device())))
            .collect();
        let (model, _) = replace_float_tensors(copy, &mut fresh);
        Self {
            model,
            updates: 0,
            decay: 0.9999,
            tau: 2000.0,
            flat_update: false,
            flat: None,
        }
    }

    /// Decay used by the next update.
    pub fn next_decay(&self) -> f64 {
        self.decay * (1.0 - (-((self.updates + 1) as f64) / self.tau).exp())
    }

    /// Forgets the flat buffer; call after replacing `model` from outside (checkpoint load).
    pub fn reset_flat(&mut self) {
        self.flat = None;
    }

    pub fn update(&mut self, model: &M) {
        if self.flat_update {
            return self.update_flat(model);
        }
        let d = self.next_decay();
        self.updates += 1;
        let current: HashMap<String, Tensor<1>> =
            float_tensors(&model.valid()).into_iter().collect();
        let mut next: HashMap<String, Tensor<1>> = float_tensors(&self.model)
            .into_iter()
            .map(|(path, e)| {
                let m = current[&path].clone();
                (path, e * d + m * (1.0 - d))
            })
            .collect();
        let (model, _) = replace_float_tensors(self.model.clone(), &mut next);
        self.model = model;
    }

    fn update_flat(&mut self, model: &M) {
        let d = self.next_decay();
        self.updates += 1;
        let mut current: HashMap<String, Tensor<1>> =
            float_tensors(&model.valid()).into_iter().collect();
        // Whether `self.model`'s tensors are views of `averaged` already.
        let viewed = self.flat.is_some();
        let (paths, layout, averaged) = match self.flat.take() {
            Some(f) => f,
            None => {
                // In the order the model's tensors sit in their buffers (the optimizer's flat
                // values, replay's statistics): each such buffer is then one copy per update.
                let mut own = float_tensors(&self.model);
                own.sort_by_key(|(p, _)| current.get(p).and_then(storage));
                let (paths, tensors): (Vec<String>, Vec<Tensor<1>>) = own.into_iter().unzip();
                let device = tensors[0].device();
                let layout = Layout::new(tensors.iter().map(|t| t.dims()[0]).collect());
                let flat = layout.gather(tensors.into_iter().map(Some).collect(), &device);
                (paths, layout, flat)
            }
        };
        let parts = in_order(&mut current, &paths);
        let averaged = if is_cuda(&averaged.device()) || super::host::force::tensor_path() {
            let device = averaged.device();
            let m = layout.gather(parts, &device);
            // The decay changes every update.
            let next = average(&averaged, m, super::flat::pair(d, &device));
            // On CUDA the new values go into the buffer the model's tensors are views of: the
            // views stay valid, so none is made again (~600 views and a module rebuild, a few
            // ms of host time an update), and the buffer keeps its address.
            if viewed && write_in_place(&next, &averaged) {
                self.flat = Some((paths, layout, averaged));
                return;
            }
            next
        } else {
            host_average(&layout, &averaged, parts, d)
        };
        let mut views: HashMap<String, Tensor<1>> = paths
            .iter()
            .enumerate()
            .map(|(i, p)| (p.clone(), layout.view(&averaged, i)))
            .collect();
        let (model, _) = replace_float_tensors(self.model.clone(), &mut views);
        self.model = model;
        self.flat = Some((paths, layout, averaged));
    }

    /// While the averaged model's tensors are views of one buffer updated in place (CUDA, from
    /// the second flat update): the buffer, its layout and the tensors' paths in it.
    #[cfg(feature = "cuda")]
    pub(crate) fn flat_buffer(&self) -> Option<(&[String], &Layout, &Tensor<1>)> {
        self.flat
            .as_ref()
            .map(|(paths, layout, averaged)| (paths.as_slice(), layout, averaged))
    }

    /// Counts an update made outside [`Ema::update`] (a recorded one) and returns its decay.
    #[cfg(feature = "cuda")]
    pub(crate) fn count_update(&mut self) -> f64 {
        let d = self.next_decay();
        self.updates += 1;
        d
    }

    pub fn state_hash(&self) -> String {
        let mut h = StateHasher::new();
        h.u64("updates", self.updates);
        for (path, t) in float_tensors(&self.model) {
            h.tensor(&path, &t);
        }
        h.finish()
    }
}

/// The tensors of `current` (the model's, by path) at `paths`, in that order.
fn in_order(current: &mut HashMap<String, Tensor<1>>, paths: &[String]) -> Vec<Option<Tensor<1>>> {
    paths
        .iter()
        .map(|p| {
            let t = current.remove(p);
            assert!(t.is_some(), "EMA: the model has no tensor {p}");
            t
        })
        .collect()
}

/// `averaged · d + m · (1 − d)`, `decay` the `[d, 1 − d]` device pair (`flat::pair`): a recorded
/// update reads the decay from a buffer, as a value that changes every update must be read.
pub(crate) fn average(averaged: &Tensor<1>, m: Tensor<1>, decay: Tensor<1>) -> Tensor<1> {
    let (d, keep) = (decay.clone().slice(0..1), decay.slice(1..2));
    averaged.clone() * d + m * keep
}

/// `averaged · d + current · (1 − d)` as one loop on the host, the current tensors read where
/// they lie (no gathered copy): per value the tensor operations' f32 arithmetic (both factors
/// rounded to f32, two products, one sum), so the same bits.
fn host_average(
    layout: &Layout,
    averaged: &Tensor<1>,
    parts: Vec<Option<Tensor<1>>>,
    d: f64,
) -> Tensor<1> {
    let (d32, keep) = (d as f32, (1.0 - d) as f32);
    let mut out = take_host(averaged.clone());
    for (i, part) in parts.into_iter().enumerate() {
        let part = part.expect("every averaged tensor has a current one");
        let current = HostValues::of(super::layout::f32_of(part));
        let (o, n) = (layout.offsets[i], layout.sizes[i]);
        for (e, &m) in out[o..o + n].iter_mut().zip(current.values()) {
            *e = *e * d32 + m * keep;
        }
    }
    // Padding is left as it was: only the segments are ever read (as views).
    Tensor::from_data(TensorData::new(out, [layout.len]), &averaged.device())
}
