//! Parameter groups (yolo_spec §4.3): which parameters decay, which use Muon, which get a
//! boosted learning rate. Decided once from the module tree, by path.

use crate::model::params::named_params;
use burn::module::{Module, ParamId};

/// How a parameter is updated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Group {
    /// Conv/Linear weights: weight decay; Muon under MuSGD.
    Weight,
    /// BatchNorm γ: no decay.
    Norm,
    /// Biases and BatchNorm β: no decay; warm up from `warmup_bias_lr`.
    Bias,
}

/// One trainable parameter.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamInfo {
    pub id: ParamId,
    /// Dotted module path, e.g. `head.one2many.classes.0.out.bias`.
    pub path: String,
    pub dims: Vec<usize>,
    pub group: Group,
    /// Part of a class branch (`cv3` / `one2one_cv3` in Ultralytics).
    pub class_branch: bool,
}

impl ParamInfo {
    /// Number of values.
    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }

    /// Muon applies to matrices and conv kernels.
    pub fn muon_eligible(&self) -> bool {
        matches!(self.dims.len(), 2 | 4)
    }
}

/// Every trainable parameter in visiting order (BN running statistics excluded), grouped.
pub fn param_table<M: Module>(module: &M) -> Vec<ParamInfo> {
    named_params(module)
        .into_iter()
        .map(|p| {
            let parts: Vec<&str> = p.path.split('.').collect();
            let leaf = parts.last().copied().unwrap_or("");
            let in_norm = parts.iter().rev().nth(1).is_some_and(|&m| m == "bn");
            let group = match leaf {
                "bias" | "beta" => Group::Bias,
                "gamma" if in_norm => Group::Norm,
                _ if p.dims.len() >= 2 => Group::Weight,
                _ => Group::Norm,
            };
            ParamInfo {
                class_branch: parts.contains(&"classes"),
                id: p.id,
                path: p.path,
                dims: p.dims,
                group,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Scale, Task, YoloConfig};
    use burn::prelude::*;

    #[test]
    fn nano_pose_groups() {
        let d = Device::flex();
        let model = YoloConfig::new(Scale::N, Task::Pose).init(&d);
        let table = param_table(&model);
        let total: usize = table.iter().map(|p| p.dims.iter().product::<usize>()).sum();
        assert_eq!(total, 3_679_464);
        let find = |path: &str| {
            table
                .iter()
                .find(|p| p.path == path)
                .unwrap_or_else(|| panic!("{path}"))
        };
        assert_eq!(find("backbone.l0.conv.weight").group, Group::Weight);
        assert_eq!(find("backbone.l0.bn.gamma").group, Group::Norm);
        assert_eq!(find("backbone.l0.bn.beta").group, Group::Bias);
        assert_eq!(find("head.one2many.boxes.0.out.bias").group, Group::Bias);
        assert!(find("head.one2one.classes.2.out.weight").class_branch);
        assert!(!find("head.one2one.boxes.2.out.weight").class_branch);
        let flow = find("head.flow.scale_nets.0.fc1.weight");
        assert!(flow.muon_eligible() && flow.dims == vec![2, 64]);
        // Every parameter has a distinct id.
        let mut ids: Vec<_> = table.iter().map(|p| p.id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), table.len());
    }
}
