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

/// Receives each float tensor of a module with its dotted path ([`walk_floats`]).
pub trait FloatSink {
    fn float<const D: usize>(&mut self, path: &str, param: &Param<Tensor<D>>);
}

/// Hands `sink` every float tensor of `module` (parameters and BatchNorm running statistics)
/// with its dotted path (`backbone.l0.bn.gamma`), in visiting order: the one walk behind
/// [`named_params`], [`float_shapes`] and `optim::tensors`' readers.
pub fn walk_floats<M: Module, S: FloatSink>(module: &M, sink: &mut S) {
    struct Walk<'a, S> {
        path: Vec<String>,
        sink: &'a mut S,
    }
    impl<S: FloatSink> ModuleVisitor for Walk<'_, S> {
        fn enter_module(&mut self, name: &str, _container_type: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.sink.float(&self.path.join("."), param);
        }
    }
    module.visit(&mut Walk {
        path: Vec::new(),
        sink,
    });
}

/// Every float parameter except BN running mean/variance, in visiting order.
pub fn named_params<M: Module>(module: &M) -> Vec<NamedParam> {
    struct Named(Vec<NamedParam>);
    impl FloatSink for Named {
        fn float<const D: usize>(&mut self, path: &str, param: &Param<Tensor<D>>) {
            let leaf = path.rsplit('.').next();
            if !matches!(leaf, Some("running_mean" | "running_var")) {
                self.0.push(NamedParam {
                    path: path.to_string(),
                    id: param.id,
                    dims: param.lazy_shape().dims::<D>().to_vec(),
                });
            }
        }
    }
    let mut named = Named(Vec::new());
    walk_floats(module, &mut named);
    named.0
}

/// Every float tensor's path and shape (running statistics included), in visiting order,
/// without reading any value.
pub fn float_shapes<M: Module>(module: &M) -> Vec<(String, Vec<usize>)> {
    struct Shapes(Vec<(String, Vec<usize>)>);
    impl FloatSink for Shapes {
        fn float<const D: usize>(&mut self, path: &str, param: &Param<Tensor<D>>) {
            self.0
                .push((path.to_string(), param.lazy_shape().dims::<D>().to_vec()));
        }
    }
    let mut shapes = Shapes(Vec::new());
    walk_floats(module, &mut shapes);
    shapes.0
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
