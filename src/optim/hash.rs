//! Stable byte hashes of training state: tensors (shape + f32 little-endian bytes) and
//! counters, fed in a fixed order. Two states hash equal exactly when every value is equal.

use burn::prelude::*;
use sha2::{Digest, Sha256};

pub struct StateHasher(Sha256);

impl Default for StateHasher {
    fn default() -> Self {
        Self::new()
    }
}

impl StateHasher {
    pub fn new() -> Self {
        Self(Sha256::new())
    }

    pub fn label(&mut self, name: &str) {
        self.0.update((name.len() as u64).to_le_bytes());
        self.0.update(name.as_bytes());
    }

    pub fn u64(&mut self, name: &str, value: u64) {
        self.label(name);
        self.0.update(value.to_le_bytes());
    }

    pub fn f64(&mut self, name: &str, value: f64) {
        self.label(name);
        self.0.update(value.to_le_bytes());
    }

    pub fn tensor<const D: usize>(&mut self, name: &str, tensor: &Tensor<D>) {
        let data = tensor.clone().into_data().convert::<f32>();
        self.label(name);
        for d in data.shape().iter() {
            self.0.update((*d as u64).to_le_bytes());
        }
        self.0.update(data.as_bytes());
    }

    /// Hex digest (first 16 bytes).
    pub fn finish(self) -> String {
        self.0.finalize()[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// Hash of every float tensor of a module (parameters and BN running statistics) in
/// visiting order, with their paths.
pub fn module_hash<M: burn::module::Module>(module: &M) -> String {
    let mut h = StateHasher::new();
    for (path, t) in crate::optim::tensors::float_tensors(module) {
        h.tensor(&path, &t);
    }
    h.finish()
}
