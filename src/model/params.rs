//! Trainable parameters by path. Burn's `num_params` also counts BatchNorm running statistics
//! (they are visited like parameters); PyTorch's and Ultralytics' counts do not.

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::prelude::*;

/// One trainable parameter: dotted path (e.g. `backbone.l0.bn.gamma`), id and shape.
#[derive(Clone, Debug, PartialEq)]
pub struct NamedParam {
    pub path: String,
    pub id: ParamId,
    pub dims: Vec<usize>,
}

/// Every float parameter except BN running mean/variance, in visiting order.
pub fn named_params<M: Module>(module: &M) -> Vec<NamedParam> {
    let mut v = Named::default();
    module.visit(&mut v);
    v.params
}

/// Trainable-parameter count of any module.
pub trait ParamCount {
    fn param_count(&self) -> usize;
}

impl<M: Module> ParamCount for M {
    fn param_count(&self) -> usize {
        named_params(self)
            .iter()
            .map(|p| p.dims.iter().product::<usize>())
            .sum()
    }
}

#[derive(Default)]
struct Named {
    path: Vec<String>,
    params: Vec<NamedParam>,
}

impl ModuleVisitor for Named {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let leaf = self.path.last().map(String::as_str);
        if !matches!(leaf, Some("running_mean" | "running_var")) {
            self.params.push(NamedParam {
                path: self.path.join("."),
                id: param.id,
                dims: param.lazy_shape().dims::<D>().to_vec(),
            });
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
        let names: Vec<String> = named_params(&bn).into_iter().map(|p| p.path).collect();
        assert_eq!(names, vec!["gamma", "beta"]);
    }
}
