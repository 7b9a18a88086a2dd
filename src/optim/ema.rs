//! Exponential moving average of the model (yolo_spec §4.7): every float tensor, parameters and
//! BN running statistics, with decay d = 0.9999·(1 − exp(−k/2000)).

use super::hash::StateHasher;
use super::tensors::{float_tensors, replace_float_tensors};
use burn::module::Module;
use burn::prelude::*;
use std::collections::HashMap;

#[derive(Clone, Debug)]
pub struct Ema<M> {
    /// The averaged model (a `valid()` snapshot: no autodiff, training flags off).
    pub model: M,
    pub updates: u64,
    pub decay: f64,
    pub tau: f64,
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
        }
    }

    /// Decay used by the next update.
    pub fn next_decay(&self) -> f64 {
        self.decay * (1.0 - (-((self.updates + 1) as f64) / self.tau).exp())
    }

    pub fn update(&mut self, model: &M) {
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

    pub fn state_hash(&self) -> String {
        let mut h = StateHasher::new();
        h.u64("updates", self.updates);
        for (path, t) in float_tensors(&self.model) {
            h.tensor(&path, &t);
        }
        h.finish()
    }
}
