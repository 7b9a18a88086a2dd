//! Reading and replacing a module's float tensors by path (parameters and running stats),
//! for hashing, EMA and checkpoints.

use crate::model::{FloatSink, walk_floats};
use burn::module::{Module, ModuleMapper, Param};
use burn::prelude::*;
use std::collections::HashMap;

/// Every float tensor (as `[numel]`) with its dotted path, in visiting order. BatchNorm running
/// statistics are read as stored: call it on `module.valid()` to include the latest update.
pub fn float_tensors<M: Module>(module: &M) -> Vec<(String, Tensor<1>)> {
    visit_floats(module)
        .into_iter()
        .map(|(path, t, _)| (path, t))
        .collect()
}

/// `t` (without autodiff) as `[numel]`. A tensor of rank 1 is handed on as it is: the same
/// primitive a reshape to its own shape gives back, without the reshape's dispatch (a third of
/// a model walk's host time: most of its tensors are BatchNorm's and the biases' vectors). Not
/// for autodiff parameters, whose reshape is a non-leaf where this would hand on the leaf.
pub(crate) fn flattened<const D: usize>(t: Tensor<D>) -> Tensor<1> {
    if D == 1 {
        return Tensor::from_bridge(t.into_bridge());
    }
    let n = t.shape().num_elements();
    t.reshape([n])
}

/// The tensors [`float_tensors`]`(&module.valid())` gives, in its order, without their paths:
/// each float tensor of `module` without autodiff, flattened, visited in place (no module
/// mapped, no path built).
pub fn float_values<M: Module>(module: &M) -> Vec<Tensor<1>> {
    struct Values(Vec<Tensor<1>>);
    impl burn::module::ModuleVisitor for Values {
        fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<D>>) {
            self.0.push(flattened(param.val().without_autodiff()));
        }
    }
    let mut values = Values(Vec::new());
    module.visit(&mut values);
    values.0
}

/// Where some paths fall among a module's float tensors in visiting order, learnt by one walk
/// by path: later lookups walk the module without paths ([`float_values`]) and take each path's
/// tensor at its index. A module's structure does not change during a fit; one with another
/// count of float tensors, or asked for another count of paths, is looked up by path again.
#[derive(Default)]
pub struct FloatIndex {
    /// `(float tensors in the module, per path its index or None)`.
    learnt: Option<(usize, Vec<Option<usize>>)>,
}

impl FloatIndex {
    /// `module`'s tensors at `paths` (`None`: no such path), as [`float_tensors`]`(&module.valid())`
    /// gives them: without autodiff, flattened. Give the same paths on every call. `walked`: a
    /// walk of `module` made earlier ([`float_values`]) while its tensors are still the
    /// module's, taken instead of walking it here (one walk serves several indexes).
    pub fn tensors<'a, M: Module>(
        &mut self,
        module: &M,
        walked: Option<&[Tensor<1>]>,
        paths: impl ExactSizeIterator<Item = &'a str>,
    ) -> Vec<Option<Tensor<1>>> {
        let own;
        let values = match walked {
            Some(values) => values,
            None => {
                own = float_values(module);
                &own
            }
        };
        let stale = self
            .learnt
            .as_ref()
            .is_none_or(|(count, index)| *count != values.len() || index.len() != paths.len());
        if stale {
            let at: HashMap<String, usize> = float_tensors(&module.valid())
                .into_iter()
                .enumerate()
                .map(|(i, (path, _))| (path, i))
                .collect();
            let index = paths.map(|p| at.get(p).copied()).collect();
            self.learnt = Some((values.len(), index));
        }
        let (_, index) = self.learnt.as_ref().expect("set above");
        index.iter().map(|i| i.map(|i| values[i].clone())).collect()
    }
}

/// [`float_tensors`] with whether each tensor requires a gradient (read before flattening).
pub fn visit_floats<M: Module>(module: &M) -> Vec<(String, Tensor<1>, bool)> {
    struct Floats(Vec<(String, Tensor<1>, bool)>);
    impl FloatSink for Floats {
        fn float<const D: usize>(&mut self, path: &str, param: &Param<Tensor<D>>) {
            let t = param.val();
            let tracked = t.is_require_grad();
            // Reshaped even at rank 1: an autodiff parameter comes out as a non-leaf, whose
            // `detach()` no longer asks for a gradient (Burn's `detach` keeps a leaf's).
            let n = t.shape().num_elements();
            self.0.push((path.to_string(), t.reshape([n]), tracked));
        }
    }
    let mut floats = Floats(Vec::new());
    walk_floats(module, &mut floats);
    floats.0
}

/// Replaces float tensors whose path is in `values` (given as `[numel]`, reshaped back). Ids are
/// kept, so optimizer state stays attached. Returns the paths that were not found.
pub fn replace_float_tensors<M: Module>(
    module: M,
    values: &mut HashMap<String, Tensor<1>>,
) -> (M, Vec<String>) {
    struct R<'a> {
        path: Vec<String>,
        values: &'a mut HashMap<String, Tensor<1>>,
    }
    impl ModuleMapper for R<'_> {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.pop();
        }
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
            let Some(new) = self.values.remove(&self.path.join(".")) else {
                return param;
            };
            let (id, old, mapper) = param.consume();
            let dims = old.dims();
            let tracked = old.is_require_grad();
            let mut t: Tensor<D> = new.to_device(&old.device()).reshape(dims);
            // `to_device` treats the autodiff and the inner device as equal and keeps `new` as
            // it is; an autodiff module needs autodiff tensors.
            if old.is_autodiff() {
                t = t.autodiff();
            }
            if tracked {
                t = t.require_grad();
            }
            Param::from_mapped_value(id, t, mapper)
        }
    }
    let mut r = R {
        path: Vec::new(),
        values,
    };
    let module = module.map(&mut r);
    let missing = values.keys().cloned().collect();
    (module, missing)
}

/// Writes `src` into `dst`'s buffer where the backend can (CUDA: the copy kernel); `false`
/// elsewhere.
pub fn write_in_place(src: &Tensor<1>, dst: &Tensor<1>) -> bool {
    #[cfg(feature = "cuda")]
    if crate::config::device::is_cuda(&dst.device()) {
        use crate::replay::copy::cube;
        crate::replay::copy::copy_into(cube(src.clone()), &cube(dst.clone()));
        return true;
    }
    let _ = (src, dst);
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Scale, Task, YoloConfig};

    /// The walk without paths gives, from a module still in autodiff, the tensors the walk by
    /// path gives from its `valid()` copy, in the same order (replay's sources find theirs by
    /// that index): the same shapes and values, without autodiff.
    #[test]
    fn float_values_are_the_valid_modules_tensors_in_order() {
        let device = Device::flex();
        device.seed(3);
        let model = YoloConfig::new(Scale::N, Task::Pose).init(&device).train();
        assert!(
            float_tensors(&model)[0].1.is_autodiff(),
            "the model is in autodiff"
        );
        let by_path = float_tensors(&model.valid());
        let values = float_values(&model);
        assert_eq!(values.len(), by_path.len());
        assert!(values.len() > 500, "{} tensors", values.len());
        for ((path, a), b) in by_path.iter().zip(&values) {
            assert!(!b.is_autodiff(), "{path}");
            assert_eq!(a.shape(), b.shape(), "{path}");
            assert_eq!(a.to_data().as_bytes(), b.to_data().as_bytes(), "{path}");
        }
    }

    /// A [`FloatIndex`] gives the tensors at its paths as the walk by path does: on the first
    /// lookup, after the module's tensors were replaced (the new ones), and for a module of
    /// another structure (learnt again); a path the module lacks gives `None`.
    #[test]
    fn a_float_index_finds_the_tensors_at_its_paths() {
        let device = Device::flex();
        device.seed(4);
        let by_path = |m: &crate::model::Yolo| -> HashMap<String, Tensor<1>> {
            float_tensors(&m.valid()).into_iter().collect()
        };
        let check = |index: &mut FloatIndex, m: &crate::model::Yolo, paths: &[String]| {
            let want = by_path(m);
            let got = index.tensors(m, None, paths.iter().map(String::as_str));
            assert_eq!(got.len(), paths.len());
            for (p, t) in paths.iter().zip(got) {
                match (want.get(p), t) {
                    (None, None) => {}
                    (Some(a), Some(b)) => {
                        assert_eq!(a.to_data().as_bytes(), b.to_data().as_bytes(), "{p}")
                    }
                    (a, b) => panic!("{p}: by path {:?}, by index {:?}", a.is_some(), b.is_some()),
                }
            }
        };
        let pose = YoloConfig::new(Scale::N, Task::Pose).init(&device).train();
        let all: Vec<String> = float_tensors(&pose).into_iter().map(|(p, _)| p).collect();
        // Some paths out of visiting order, and one the model lacks.
        let mut paths: Vec<String> = all.iter().rev().step_by(7).cloned().collect();
        paths.push("no.such.tensor".into());
        let mut index = FloatIndex::default();
        check(&mut index, &pose, &paths);
        let mut changed: HashMap<String, Tensor<1>> = paths[..3]
            .iter()
            .map(|p| {
                let t = by_path(&pose)[p].clone();
                (p.clone(), t + 1.0)
            })
            .collect();
        let (pose, missing) = replace_float_tensors(pose, &mut changed);
        assert!(missing.is_empty());
        check(&mut index, &pose, &paths);
        let detect = YoloConfig::new(Scale::N, Task::Detect)
            .init(&device)
            .train();
        assert_ne!(float_tensors(&detect).len(), all.len());
        check(&mut index, &detect, &paths);
    }

    /// One walk serves two indexes over different paths (`FloatIndex::tensors`' `walked`): each
    /// gets the tensors a walk of its own gives.
    #[test]
    fn one_walk_serves_two_indexes() {
        let device = Device::flex();
        device.seed(5);
        let pose = YoloConfig::new(Scale::N, Task::Pose).init(&device).train();
        let all: Vec<String> = float_tensors(&pose).into_iter().map(|(p, _)| p).collect();
        let odd: Vec<&str> = all.iter().skip(1).step_by(2).map(String::as_str).collect();
        let tail: Vec<&str> = all.iter().rev().take(40).map(String::as_str).collect();
        let walk = float_values(&pose);
        for paths in [odd, tail] {
            let (mut own, mut shared) = (FloatIndex::default(), FloatIndex::default());
            let want = own.tensors(&pose, None, paths.iter().copied());
            let got = shared.tensors(&pose, Some(&walk), paths.iter().copied());
            assert_eq!(want.len(), paths.len());
            assert_eq!(got.len(), paths.len());
            for ((p, a), b) in paths.iter().zip(want).zip(got) {
                let (a, b) = (a.expect(p), b.expect(p));
                assert_eq!(a.shape(), b.shape(), "{p}");
                assert_eq!(a.to_data().as_bytes(), b.to_data().as_bytes(), "{p}");
            }
        }
    }
}
