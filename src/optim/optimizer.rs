//! SGD (Nesterov, dampening 0), MuSGD and AdamW as PyTorch/Ultralytics define them, over
//! parameter groups. A parameter whose gradient is absent this step is skipped entirely: no
//! momentum decay, no weight decay, no step count — as a PyTorch optimizer skips `grad is None`.

use super::clip::clip_global_norm;
use super::flat::{self, Finite, FlatState};
use super::groups::{ParamInfo, param_table};
use super::hash::StateHasher;
use super::layout::Layout;
use super::newton_schulz::orthogonalized;
use super::state::{Hyper, ParamState, Rule};
use super::tensors::float_tensors;
use burn::module::{Module, ModuleMapper, Param, ParamId};
use burn::optim::GradientsParams;
use burn::prelude::*;
use std::collections::HashMap;

#[derive(Clone, Debug)]
pub struct Optimizer {
    pub rule: Rule,
    pub table: Vec<ParamInfo>,
    pub state: Vec<ParamState>,
    index: HashMap<ParamId, usize>,
    /// MuSGD blend (current Ultralytics: 0.2 / 1.0).
    pub muon_weight: f64,
    pub sgd_weight: f64,
    pub beta2: f64,
    pub eps: f64,
    /// Update through [`flat`]: same bits as per tensor (MuSGD's orthogonalisation still runs
    /// per matrix), ~20× fewer kernel launches.
    pub flat_update: bool,
    flat: Option<FlatState>,
    /// A step is queued whose bookkeeping [`Optimizer::settle`] has not applied yet.
    unsettled: bool,
}

/// A queued optimizer step, for [`Optimizer::settle`]: whether its gradients were finite and,
/// for a flat step, which parameters had one and whether it wrote in place.
#[must_use = "an optimizer step must be settled before the next"]
#[derive(Debug)]
pub struct Stepped {
    finite: Finite,
    flat: Option<(Vec<bool>, bool)>,
}

impl Optimizer {
    pub fn new<M: Module>(rule: Rule, model: &M) -> Self {
        let table = param_table(model);
        let index = table.iter().enumerate().map(|(i, p)| (p.id, i)).collect();
        Self {
            rule,
            state: vec![ParamState::default(); table.len()],
            table,
            index,
            muon_weight: 0.2,
            sgd_weight: 1.0,
            beta2: 0.999,
            eps: 1e-8,
            flat_update: false,
            flat: None,
            unsettled: false,
        }
    }

    /// On CUDA with the flat update: gathers the flat buffers now, before the first step, and
    /// returns `model` with its parameters as views of them (and the state, where there is
    /// some, as views of the state buffers), so that every step writes in place from the first
    /// and the parameters keep one address for the fit: recorded graphs can read them there
    /// (`replay.shared_parameters`). The values are unchanged. Nothing happens elsewhere, or
    /// when the buffers exist already; after `reset_flat` it gathers them again.
    pub fn pin<M: Module>(&mut self, model: M) -> M {
        if !self.flat_active() || self.flat.is_some() {
            return model;
        }
        let params = param_values(&model, &self.table);
        let device = params[0].device();
        // (The tests pin on the CPU too, through the tensor path.)
        if !crate::config::device::is_cuda(&device) && !super::host::force::tensor_path() {
            return model;
        }
        let mut f = FlatState::gather(params, &self.state, &device);
        f.viewed = true;
        for (i, s) in self.state.iter_mut().enumerate() {
            if s.buf.is_some() {
                f.view_state(s, i, keeps_second(self.rule, &self.table[i]));
            }
        }
        let mut mapper = ViewMapper {
            index: &self.index,
            flat: &f,
        };
        let model = model.map(&mut mapper);
        self.flat = Some(f);
        model
    }

    /// The flat parameter values and their layout (the parameter table's order) while the
    /// model's parameters are views of them ([`Optimizer::pin`], or after a flat step).
    pub fn pinned(&self) -> Option<(&Layout, &Tensor<1>)> {
        self.flat
            .as_ref()
            .filter(|f| f.viewed)
            .map(|f| (&f.layout, &f.p))
    }

    /// Whether steps go through the flat update.
    pub fn flat_active(&self) -> bool {
        self.flat_update
    }

    /// Forgets the flat buffers; call after replacing the model's parameters or the optimizer
    /// state from outside (checkpoint load): the next step gathers them again.
    pub fn reset_flat(&mut self) {
        self.flat = None;
    }

    /// Global-norm clipping (`clip_norm`) then [`Optimizer::step`]; through the flat update
    /// when [`Optimizer::flat_active`].
    pub fn step_clipped<M: Module>(
        &mut self,
        model: M,
        grads: GradientsParams,
        hyper: &Hyper,
        clip_norm: f64,
    ) -> M {
        let (model, stepped) = self.step_scaled(model, grads, hyper, clip_norm, None);
        self.settle(stepped);
        model
    }

    /// [`Optimizer::step_clipped`] on gradients of a loss multiplied by `loss_scale` (FP16):
    /// they are unscaled first, and when any of them is not finite the parameters and the state
    /// stay as they are (`LossScaler::unscale`'s rule). Through the flat update on CUDA that
    /// decision is the device's: the step is queued without waiting for it, and
    /// [`Optimizer::settle`] — which must come before the next step — reads it and applies
    /// the step counts.
    pub fn step_scaled<M: Module>(
        &mut self,
        model: M,
        mut grads: GradientsParams,
        hyper: &Hyper,
        clip_norm: f64,
        loss_scale: Option<f32>,
    ) -> (M, Stepped) {
        assert!(
            !self.unsettled,
            "an optimizer step is queued but not settled"
        );
        if self.flat_active() {
            return self.step_flat(model, grads, hyper, clip_norm, loss_scale);
        }
        let known = |finite| Stepped {
            finite: Finite::Known(finite),
            flat: None,
        };
        if let Some(scale) = loss_scale
            && !super::scaler::unscale(&mut grads, &self.table, scale)
        {
            return (model, known(false));
        }
        clip_global_norm(&mut grads, &self.table, clip_norm);
        (self.step(model, grads, hyper), known(true))
    }

    /// Reads whether the last step's gradients were finite (one read from the device when the
    /// device decided it) and applies that step's bookkeeping: the present parameters' step
    /// counts, and their state's views of the flat buffers. Returns whether the step counted.
    pub fn settle(&mut self, stepped: Stepped) -> bool {
        let finite = stepped.finite.read();
        self.unsettled = false;
        let Some((present, in_place)) = stepped.flat else {
            return finite;
        };
        let f = self.flat.as_ref().expect("a flat step keeps its buffers");
        for (i, s) in self.state.iter_mut().enumerate() {
            let counted = finite && present[i];
            if counted {
                s.steps += 1;
            }
            // Written in place, the views made before still show the state; a parameter with
            // its first gradient needs its own. Written anew, every view moves to the new
            // buffers (their values are the old ones where the step did not count).
            let fresh = s.buf.is_none() && counted;
            if fresh || (!in_place && s.buf.is_some()) {
                f.view_state(s, i, keeps_second(self.rule, &self.table[i]));
            }
        }
        finite
    }

    /// The fixed constants of the update rule.
    pub(crate) fn constants(&self) -> flat::RuleConstants {
        flat::RuleConstants {
            rule: self.rule,
            beta2: self.beta2,
            eps: self.eps,
            muon_weight: self.muon_weight,
            sgd_weight: self.sgd_weight,
        }
    }

    /// While every flat step writes in place (the buffers gathered and viewed, CUDA): the flat
    /// buffers, for a recorded update to read and write (`replay::update`).
    #[cfg(feature = "cuda")]
    pub(crate) fn in_place_buffers(&mut self) -> Option<&mut FlatState> {
        let f = self.flat.as_mut().filter(|f| f.viewed)?;
        crate::config::device::is_cuda(&f.p.device()).then_some(f)
    }

    /// A step a recorded update queued for the parameters `present` (written in place, its
    /// finiteness `finite`), to [`Optimizer::settle`] as any other.
    #[cfg(feature = "cuda")]
    pub(crate) fn queued(&mut self, present: Vec<bool>, finite: Finite) -> Stepped {
        assert!(
            !self.unsettled,
            "an optimizer step is queued but not settled"
        );
        self.unsettled = true;
        Stepped {
            finite,
            flat: Some((present, true)),
        }
    }

    fn step_flat<M: Module>(
        &mut self,
        model: M,
        mut grads: GradientsParams,
        hyper: &Hyper,
        clip_norm: f64,
        loss_scale: Option<f32>,
    ) -> (M, Stepped) {
        if self.flat.is_none() {
            let params = param_values(&model, &self.table);
            let device = params[0].device();
            self.flat = Some(FlatState::gather(params, &self.state, &device));
        }
        let constants = self.constants();
        let f = self.flat.as_mut().expect("gathered above");
        let done = flat::step(
            constants,
            f,
            &self.table,
            &self.state,
            &mut grads,
            hyper,
            clip_norm,
            loss_scale,
        );
        self.unsettled = true;
        let stepped = Stepped {
            finite: done.finite,
            flat: Some((done.present, done.in_place)),
        };
        // In place, the parameters' views show the new values (~300 views and a module
        // rebuild fewer: most of the optimizer phase's host time on the H200).
        if done.in_place {
            return (model, stepped);
        }
        // From here until `reset_flat` (the model replaced from outside) the model's parameters
        // are views of the flat values.
        f.viewed = true;
        let mut mapper = ViewMapper {
            index: &self.index,
            flat: f,
        };
        (model.map(&mut mapper), stepped)
    }

    /// One update of every parameter that has a gradient in `grads` (consumed).
    pub fn step<M: Module>(&mut self, model: M, mut grads: GradientsParams, hyper: &Hyper) -> M {
        let mut mapper = StepMapper {
            opt: self,
            grads: &mut grads,
            hyper,
        };
        model.map(&mut mapper)
    }

    /// Hash of all buffers and step counts, in parameter-table order.
    pub fn state_hash(&self) -> String {
        let mut h = StateHasher::new();
        h.label(&format!("{:?}", self.rule));
        for (info, s) in self.table.iter().zip(&self.state) {
            h.u64(&info.path, s.steps);
            if let Some(b) = &s.buf {
                h.tensor("buf", b);
            }
            if let Some(b) = &s.second {
                h.tensor("second", b);
            }
        }
        h.finish()
    }

    fn update(&mut self, i: usize, p: Tensor<1>, g: Tensor<1>, hyper: &Hyper) -> Tensor<1> {
        let info = &self.table[i];
        let group = info.group;
        let boost = if self.rule == Rule::MuSgd && info.class_branch {
            3.0
        } else {
            1.0
        };
        let (lr, wd) = hyper.for_group(group);
        let lr = lr * boost;
        let mu = hyper.momentum;
        let muon = super::muon::uses_muon(self.rule, info);
        let dims = info.dims.clone();
        let s = &mut self.state[i];
        s.steps += 1;
        match self.rule {
            Rule::AdamW => {
                let p = p.clone() * (1.0 - lr * wd);
                let m = match s.buf.take() {
                    Some(m) => m * mu + g.clone() * (1.0 - mu),
                    None => g.clone() * (1.0 - mu),
                };
                let v = match s.second.take() {
                    Some(v) => v * self.beta2 + g.powi_scalar(2) * (1.0 - self.beta2),
                    None => g.powi_scalar(2) * (1.0 - self.beta2),
                };
                let t = s.steps as i32;
                let bc1 = 1.0 - mu.powi(t);
                let bc2 = 1.0 - self.beta2.powi(t);
                let denom = (v.clone() / bc2).sqrt() + self.eps;
                s.buf = Some(m.clone());
                s.second = Some(v);
                p - m / denom * (lr / bc1)
            }
            _ if muon => {
                let m = match s.second.take() {
                    Some(m) => m * mu + g.clone() * (1.0 - mu),
                    None => g.clone() * (1.0 - mu),
                };
                let u = m.clone() * mu + g.clone() * (1.0 - mu);
                s.second = Some(m);
                let o = orthogonalized(u, &dims);
                let p = p - o * (lr * self.muon_weight);
                let gd = g + p.clone() * wd;
                let b = match s.buf.take() {
                    Some(b) => b * mu + gd.clone(),
                    None => gd.clone(),
                };
                s.buf = Some(b.clone());
                p - (gd + b * mu) * (lr * self.sgd_weight)
            }
            _ => {
                let gd = g + p.clone() * wd;
                let b = match s.buf.take() {
                    Some(b) => b * mu + gd.clone(),
                    None => gd.clone(),
                };
                s.buf = Some(b.clone());
                p - (gd + b * mu) * lr
            }
        }
    }
}

/// Whether `rule` keeps a second state buffer for this parameter (AdamW's second moment,
/// Muon's momentum).
fn keeps_second(rule: Rule, info: &ParamInfo) -> bool {
    rule == Rule::AdamW || super::muon::uses_muon(rule, info)
}

/// The current value of every parameter in the table (inner, `[numel]`), in table order.
fn param_values<M: Module>(model: &M, table: &[ParamInfo]) -> Vec<Tensor<1>> {
    let mut by_path: HashMap<String, Tensor<1>> = float_tensors(model).into_iter().collect();
    table
        .iter()
        .map(|p| {
            let t = by_path.remove(&p.path);
            t.unwrap_or_else(|| panic!("parameter {} is not in the model", p.path))
                .inner()
        })
        .collect()
}

/// Points every table parameter at its segment of the flat value buffer.
struct ViewMapper<'a> {
    index: &'a HashMap<ParamId, usize>,
    flat: &'a FlatState,
}

impl ModuleMapper for ViewMapper<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let Some(&i) = self.index.get(&param.id) else {
            return param; // BN running statistics
        };
        let (id, tensor, mapper) = param.consume();
        let dims = tensor.dims();
        let view = Tensor::from_inner(self.flat.layout.view(&self.flat.p, i).reshape(dims));
        // A frozen parameter (no gradient ever, its segment masked) stays frozen.
        let value = if tensor.is_require_grad() {
            view.require_grad()
        } else {
            view
        };
        Param::from_mapped_value(id, value, mapper)
    }
}

struct StepMapper<'a> {
    opt: &'a mut Optimizer,
    grads: &'a mut GradientsParams,
    hyper: &'a Hyper,
}

impl ModuleMapper for StepMapper<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let Some(&i) = self.opt.index.get(&param.id) else {
            return param; // BN running statistics
        };
        let Some(grad) = self.grads.remove::<D>(param.id) else {
            return param; // no gradient this step: untouched, state untouched
        };
        let (id, tensor, mapper) = param.consume();
        let dims = tensor.dims();
        let n: usize = dims.iter().product();
        let p = tensor.inner().reshape([n]);
        let new = self.opt.update(i, p, grad.reshape([n]), self.hyper);
        let value = Tensor::from_inner(new.reshape(dims)).require_grad();
        Param::from_mapped_value(id, value, mapper)
    }
}
