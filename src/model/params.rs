//! Trainable-parameter counting. Burn's `num_params` also counts BatchNorm running statistics
//! (they are visited like parameters); PyTorch's and Ultralytics' counts do not.

use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;

/// Trainable-parameter count of any module.
pub trait ParamCount {
    /// Number of trainable scalars: every float parameter except BN running mean/variance.
    fn param_count(&self) -> usize;
}

impl<M: Module> ParamCount for M {
    fn param_count(&self) -> usize {
        let mut counter = Counter::default();
        self.visit(&mut counter);
        counter.total
    }
}

#[derive(Default)]
struct Counter {
    path: Vec<String>,
    total: usize,
}

impl ModuleVisitor for Counter {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let running = matches!(
            self.path.last().map(String::as_str),
            Some("running_mean" | "running_var")
        );
        if !running {
            self.total += param.lazy_shape().num_elements();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::nn::BatchNormConfig;

    #[test]
    fn batch_norm_counts_gamma_and_beta_only() {
        let bn = BatchNormConfig::new(8).init(&Device::flex());
        assert_eq!(bn.num_params(), 32);
        assert_eq!(bn.param_count(), 16);
    }
}
