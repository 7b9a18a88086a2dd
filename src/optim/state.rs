//! What an optimizer step is told and keeps, below both update paths (per tensor in
//! `optimizer`, flat in `flat`): the rule, the step's hyper-parameters, a parameter's state.

use super::groups::Group;
use burn::prelude::*;

/// The update rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Rule {
    Sgd,
    MuSgd,
    AdamW,
}

/// Per-step hyper-parameters (they change during warm-up and across epochs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hyper {
    /// Learning rate of the [`Group::Weight`], [`Group::Norm`] and [`Group::Bias`] groups.
    pub lr: [f64; 3],
    /// SGD momentum, Muon β and AdamW β1.
    pub momentum: f64,
    /// Decay of the weight group (already scaled by batch·accumulate/nbs).
    pub weight_decay: f64,
}

impl Hyper {
    /// Learning rate and weight decay of a parameter of `group`: the group's rate; decay for
    /// weights only.
    pub fn for_group(&self, group: Group) -> (f64, f64) {
        let wd = if group == Group::Weight {
            self.weight_decay
        } else {
            0.0
        };
        (self.lr[group as usize], wd)
    }
}

/// Optimizer state of one parameter, flattened to `[numel]`.
#[derive(Clone, Debug, Default)]
pub struct ParamState {
    /// SGD momentum buffer (MuSGD: the SGD half's buffer); AdamW: first moment.
    pub buf: Option<Tensor<1>>,
    /// Muon momentum; AdamW: second moment.
    pub second: Option<Tensor<1>>,
    /// Steps this parameter was updated.
    pub steps: u64,
}
