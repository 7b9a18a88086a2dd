//! The flat (multi-tensor) update: all gradients, values and AdamW/SGD state live in one `[N]`
//! buffer each, every parameter a segment of it, so an optimizer step is ~30 kernels for the whole
//! model instead of ~15 per parameter. CubeCL spends ~40 µs of host time per launch, so the
//! per-tensor step of the nano model (~540 tensors) took 0.4–0.7 s on the H200 (docs/perf_log.md, 2026-11-29).
//!
//! Per element the arithmetic is the per-tensor update's, in the same order, with the per-step
//! scalars read from a small table instead of kernel arguments, so both give the same bits
//! (`optim::tests::flat_update_equals_per_tensor_*`). Parameters and state are handed back as
//! views of the new buffers; segments start and (padded) end on 512-byte boundaries so that a
//! view needs no copy on CUDA. Absent gradients: the segment is masked, so the parameter and its
//! state keep their values and its step count does not move, as in the per-tensor update. On the
//! CPU the same arithmetic runs as one loop over the buffers on the host (`host_update`).

use super::grads::take_flat;
use super::groups::ParamInfo;
use super::host::{HostValues, host_update};
use super::layout::{ALIGN, Layout, f32_of};
use super::muon::{MuonBatches, uses_muon};
use super::reduce::sum_all;
use super::state::{Hyper, ParamState, Rule};
use super::tensors::write_in_place;
use crate::config::device::is_cuda;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::{DType, TensorData};
use std::sync::atomic::{AtomicU64, Ordering};

/// The flat buffers between steps: the model's parameters and the per-parameter state are views
/// of `p`, `buf` and `second`. Anything that replaces parameters or state from outside (a
/// checkpoint load) must drop it (`Optimizer::reset_flat`).
#[derive(Clone, Debug)]
pub struct FlatState {
    pub layout: Layout,
    /// Per element, its segment's row of the per-step table.
    seg: Tensor<1, Int>,
    pub p: Tensor<1>,
    pub buf: Tensor<1>,
    pub second: Tensor<1>,
    /// Whether the model's parameters and the optimizer state are views of these buffers.
    pub viewed: bool,
    /// MuSGD's matrices by shape, made at its first step.
    muon: Option<MuonBatches>,
}

impl FlatState {
    /// Gathers the current values (`params[i]` flattened) and state into new flat buffers.
    pub fn gather(params: Vec<Tensor<1>>, state: &[ParamState], device: &Device) -> Self {
        let layout = Layout::new(params.iter().map(|t| t.dims()[0]).collect());
        let seg = Tensor::<1, Int>::from_data(
            TensorData::new(layout.segment_of_each(), [layout.len]),
            device,
        );
        let p = layout.gather(params.into_iter().map(Some).collect(), device);
        let buf = layout.gather(state.iter().map(|s| s.buf.clone()).collect(), device);
        let second = layout.gather(state.iter().map(|s| s.second.clone()).collect(), device);
        Self {
            layout,
            seg,
            p,
            buf,
            second,
            viewed: false,
            muon: None,
        }
    }

    /// MuSGD's matrices by shape, made now if not yet (a recording must not upload them).
    #[cfg(feature = "cuda")]
    pub(crate) fn prepare_muon(&mut self, rule: Rule, table: &[ParamInfo]) {
        if rule == Rule::MuSgd && self.muon.is_none() {
            let device = self.p.device();
            self.muon = Some(MuonBatches::new(rule, table, &self.layout, &device));
        }
    }

    /// A copy with buffers of its own (`copy` makes each), the same layout and index tensors:
    /// what a recording's warm-ups update instead of the real buffers.
    #[cfg(feature = "cuda")]
    pub(crate) fn scratch(&self, copy: fn(Tensor<1>) -> Tensor<1>) -> Self {
        Self {
            p: copy(self.p.clone()),
            buf: copy(self.buf.clone()),
            second: copy(self.second.clone()),
            ..self.clone()
        }
    }

    /// Points parameter `i`'s state at its segments of the state buffers (the second one too
    /// when the rule keeps one for it).
    pub fn view_state(&self, s: &mut ParamState, i: usize, second: bool) {
        s.buf = Some(self.layout.view(&self.buf, i));
        if second {
            s.second = Some(self.layout.view(&self.second, i));
        }
    }
}

/// Σ x² over a flat buffer, in two stages (rows of [`ALIGN`], then the row sums): one pass over
/// millions of f32 values drifts (CPU: 1e-3 relative on the nano model), two stay at the
/// per-tensor sum's accuracy.
pub fn sum_of_squares(x: &Tensor<1>, len: usize) -> Tensor<1> {
    let rows = x
        .clone()
        .powi_scalar(2)
        .reshape([len / ALIGN, ALIGN])
        .sum_dim(1);
    sum_all(rows)
}

/// `[x, 1 − x]` (each rounded to f32) as one device tensor, whose `[1]` slices broadcast over a
/// flat buffer: a per-step factor a recorded update must read rather than have frozen into its
/// kernels, as a scalar would be. Multiplying by them gives the scalar products' bits.
pub(crate) fn pair(x: f64, device: &Device) -> Tensor<1> {
    Tensor::<1>::from_data(
        TensorData::new(vec![x as f32, (1.0 - x) as f32], [2]),
        (device, DType::F32),
    )
}

static IN_PLACE_STEPS: AtomicU64 = AtomicU64::new(0);

/// How many flat steps in this process wrote their new values in place: a parameter tensor
/// that is the same tensor as before may hold new values when this moved (replay's static
/// copies of the parameters check it).
pub fn in_place_steps() -> u64 {
    IN_PLACE_STEPS.load(Ordering::Acquire)
}

/// What one flat step produced: which parameters had a gradient, whether the new values went
/// into the buffers that were there before (the views of them stay current), and whether the
/// gradients were finite. The parameters' step counts and new state views are the caller's to
/// apply once it knows the last (`Optimizer::settle`).
pub struct FlatStep {
    pub present: Vec<bool>,
    pub in_place: bool,
    pub finite: Finite,
}

/// Whether a step's unscaled gradients were all finite (FP16's loss scale; always so without
/// one): the host's answer, or the device's, read once the step and what follows it are queued.
/// On CUDA the step is applied on the device masked by it, so no readback sits between the
/// backward and the optimizer, and a recorded update could decide it inside its graph.
#[derive(Debug)]
pub enum Finite {
    Known(bool),
    /// A `[1]` value: 0 when every gradient was finite, NaN when not (Σ 0·g).
    OnDevice(Box<Tensor<1>>),
}

impl Finite {
    /// The answer (one read from the device for `OnDevice`).
    pub fn read(self) -> bool {
        match self {
            Finite::Known(b) => b,
            Finite::OnDevice(t) => t.into_scalar::<f32>() == 0.0,
        }
    }
}

/// Columns of the per-step table: one row of scalars per parameter.
pub(super) const COLUMNS: usize = 6;
/// 1 when the parameter has a gradient this step.
pub(super) const PRESENT: usize = 0;
/// 1 when its state exists (the first step's formula differs).
pub(super) const INIT: usize = 1;
/// AdamW: 1 − lr·wd, 1 − β2^t, lr / (1 − β1^t).
pub(super) const ADAM_DECAY: usize = 2;
pub(super) const ADAM_BC2: usize = 3;
pub(super) const ADAM_STEP: usize = 4;
/// SGD and MuSGD: weight decay, the SGD step's learning rate (MuSGD's class-branch boost and,
/// for Muon's matrices, its SGD weight included).
pub(super) const SGD_WD: usize = 2;
pub(super) const SGD_LR: usize = 3;
/// MuSGD: the Muon step's learning rate, and 1 for the matrices Muon updates.
pub(super) const MUON_LR: usize = 4;
pub(super) const MUON: usize = 5;

/// The update rule and its fixed constants.
#[derive(Clone, Copy, Debug)]
pub struct RuleConstants {
    pub rule: Rule,
    pub beta2: f64,
    pub eps: f64,
    /// MuSGD's blend of its Muon and SGD steps.
    pub muon_weight: f64,
    pub sgd_weight: f64,
}

/// One update of every parameter with a gradient in `grads` (consumed): the gradients divided by
/// `loss_scale` first where there is one (and the whole step left out when any is not finite,
/// `LossScaler::unscale`'s rule), then clipped to `clip_norm` over all gradients
/// (`clip::clip_global_norm`'s rule). `state` is read, not changed: the present parameters'
/// step counts advance when the caller applies the step. Where views of `flat`'s buffers are out
/// (`flat.viewed`) and the backend can (CUDA), the new values are written into those buffers, so
/// the views need not be made again; otherwise `flat` holds new buffers and the caller re-points
/// parameters and state at them.
#[allow(clippy::too_many_arguments)]
pub fn step(
    constants: RuleConstants,
    flat: &mut FlatState,
    table: &[ParamInfo],
    state: &[ParamState],
    grads: &mut GradientsParams,
    hyper: &Hyper,
    clip_norm: f64,
    loss_scale: Option<f32>,
) -> FlatStep {
    let device = flat.p.device();
    let parts: Vec<Option<Tensor<1>>> = table.iter().map(|p| take_flat(grads, p)).collect();
    let present: Vec<bool> = parts.iter().map(Option::is_some).collect();
    let host = HostInputs::new(constants, table, state, &present, hyper, loss_scale);
    // Off CUDA the update is one pass on the host.
    if !is_cuda(&device) && !super::host::force::tensor_path() {
        let parts: Vec<Option<HostValues>> = parts
            .into_iter()
            .map(|t| t.map(|t| HostValues::of(unscaled(f32_of(t), host.inv))))
            .collect();
        // Each value checked, as `LossScaler::unscale` checks them.
        let finite = host.inv.is_none()
            || parts
                .iter()
                .flatten()
                .all(|g| g.values().iter().all(|v| v.is_finite()));
        if finite {
            host_update(
                constants, flat, table, &host.rows, &parts, host.mu, clip_norm,
            );
        }
        return FlatStep {
            present,
            in_place: false,
            finite: Finite::Known(finite),
        };
    }
    let inputs = DeviceInputs {
        rows: host.rows_tensor(&device),
        mu: host.mu_tensor(&device),
        inv: host.inv_tensor(&device),
        g: flat.layout.gather(parts, &device),
    };
    let (next, finite) = device_update(constants, flat, table, inputs, clip_norm);
    let in_place = next.apply(flat);
    FlatStep {
        present,
        in_place,
        finite,
    }
}

/// The host's part of one flat update: the per-step table (a row of scalars per parameter and
/// one for padding), the momentum and FP16's loss-scale inverse.
pub(crate) struct HostInputs {
    pub rows: Vec<f32>,
    pub mu: f64,
    pub inv: Option<f32>,
}

impl HostInputs {
    /// The inputs of an update of the parameters `present` marks, with `hyper`'s learning
    /// rates and momentum, gradients scaled by `loss_scale`.
    pub fn new(
        constants: RuleConstants,
        table: &[ParamInfo],
        state: &[ParamState],
        present: &[bool],
        hyper: &Hyper,
        loss_scale: Option<f32>,
    ) -> Self {
        let RuleConstants {
            rule,
            beta2,
            muon_weight,
            sgd_weight,
            ..
        } = constants;
        let mu = hyper.momentum;
        let mut rows = vec![0f32; (table.len() + 1) * COLUMNS];
        for (i, info) in table.iter().enumerate() {
            let s = &state[i];
            let (lr, wd) = hyper.for_group(info.group);
            let init = s.buf.is_some();
            // The step count this update is the parameter's `t`-th.
            let t = (s.steps + present[i] as u64).max(1) as i32;
            let r = &mut rows[i * COLUMNS..(i + 1) * COLUMNS];
            r[PRESENT] = present[i] as u8 as f32;
            r[INIT] = init as u8 as f32;
            match rule {
                Rule::AdamW => {
                    r[ADAM_DECAY] = (1.0 - lr * wd) as f32;
                    r[ADAM_BC2] = (1.0 - beta2.powi(t)) as f32;
                    r[ADAM_STEP] = (lr / (1.0 - mu.powi(t))) as f32;
                }
                Rule::MuSgd => {
                    // `Optimizer::update`'s products, in its order.
                    let lr = lr * if info.class_branch { 3.0 } else { 1.0 };
                    let muon = uses_muon(rule, info);
                    r[SGD_WD] = wd as f32;
                    r[SGD_LR] = if muon { lr * sgd_weight } else { lr } as f32;
                    r[MUON_LR] = (lr * muon_weight) as f32;
                    r[MUON] = muon as u8 as f32;
                }
                Rule::Sgd => {
                    r[SGD_WD] = wd as f32;
                    r[SGD_LR] = lr as f32;
                }
            }
        }
        // Padding divides by its bias correction: 1, not 0 (masked out either way).
        rows[table.len() * COLUMNS + ADAM_BC2] = 1.0;
        Self {
            rows,
            mu,
            inv: loss_scale.map(super::scaler::inverse),
        }
    }

    /// The table as one `[(parameters + 1) · COLUMNS]` device buffer ([`table_view`] reads it
    /// as rows).
    pub fn rows_tensor(&self, device: &Device) -> Tensor<1> {
        Tensor::<1>::from_data(
            TensorData::new(self.rows.clone(), [self.rows.len()]),
            (device, DType::F32),
        )
    }

    /// `[μ, 1 − μ]` (each rounded to f32) on the device ([`pair`]).
    pub fn mu_tensor(&self, device: &Device) -> Tensor<1> {
        pair(self.mu, device)
    }

    /// The loss scale's inverse as a `[1]` device value, where there is one.
    pub fn inv_tensor(&self, device: &Device) -> Option<Tensor<1>> {
        self.inv.map(|inv| {
            Tensor::<1>::from_data(TensorData::new(vec![inv], [1]), (device, DType::F32))
        })
    }
}

/// The per-step table `rows` (one buffer, [`HostInputs::rows_tensor`]) as
/// `[parameters + 1, COLUMNS]`.
pub(crate) fn table_view(rows: &Tensor<1>) -> Tensor<2> {
    rows.clone().reshape([rows.dims()[0] / COLUMNS, COLUMNS])
}

/// The device's part of one flat update: every input a device value (a recorded update reads
/// them from buffers the host rewrites before each replay, `replay::update`).
pub(crate) struct DeviceInputs {
    /// The per-step table ([`HostInputs::rows_tensor`]).
    pub rows: Tensor<1>,
    /// `[μ, 1 − μ]`.
    pub mu: Tensor<1>,
    /// `[1 / loss scale]` (FP16).
    pub inv: Option<Tensor<1>>,
    /// The gradients at the layout's places; padding and absent segments hold anything (they
    /// are masked).
    pub g: Tensor<1>,
}

/// The new values of a flat update, not yet written.
pub(crate) struct Next {
    p: Tensor<1>,
    buf: Tensor<1>,
    second: Option<Tensor<1>>,
}

impl Next {
    /// Writes the new values into `flat`'s buffers (CUDA; a recorded update, which counts its
    /// replays itself).
    #[cfg(feature = "cuda")]
    pub fn write(&self, flat: &FlatState) {
        let done = write_in_place(&self.p, &flat.p);
        assert!(done, "a recorded update writes in place on CUDA");
        write_in_place(&self.buf, &flat.buf);
        if let Some(v) = &self.second {
            write_in_place(v, &flat.second);
        }
    }

    /// Writes the new values into `flat`'s buffers where the model's views of them are out and
    /// the backend can (CUDA), else makes them `flat`'s buffers; whether it wrote in place.
    pub fn apply(self, flat: &mut FlatState) -> bool {
        // Computed whole before any is written: each reads the old values of the others.
        let in_place = flat.viewed && write_in_place(&self.p, &flat.p);
        if in_place {
            count_in_place_step();
            write_in_place(&self.buf, &flat.buf);
            if let Some(v) = &self.second {
                write_in_place(v, &flat.second);
            }
        } else {
            flat.p = self.p;
            flat.buf = self.buf;
            if let Some(v) = self.second {
                flat.second = v;
            }
        }
        in_place
    }
}

/// Counts a flat step written in place ([`in_place_steps`]): replay's copies of the parameters
/// are refreshed after it.
pub(crate) fn count_in_place_step() {
    IN_PLACE_STEPS.fetch_add(1, Ordering::AcqRel);
}

/// The arithmetic of [`step`] on the device, from `inputs`: the new parameters and state, and
/// whether the gradients were finite (FP16's loss scale: decided on the device, the update
/// masked whole when not). `flat`'s buffers are read, not written.
pub(crate) fn device_update(
    constants: RuleConstants,
    flat: &mut FlatState,
    table: &[ParamInfo],
    inputs: DeviceInputs,
    clip_norm: f64,
) -> (Next, Finite) {
    let RuleConstants {
        rule, beta2, eps, ..
    } = constants;
    let device = flat.p.device();
    let layout = &flat.layout;
    // Each column the rule reads, spread from its segments to their values by one gather of
    // the column (a gather of the whole table, then a copy per column, moved six times the
    // values: 0.36 ms of an H100's optimizer step, docs/perf_log.md BP4). The same values.
    let rows = table_view(&inputs.rows);
    let segments = rows.dims()[0];
    let col = |j: usize| {
        rows.clone()
            .slice([0..segments, j..j + 1])
            .reshape([segments])
            .select(0, flat.seg.clone())
    };
    // The momentum changes during warm-up, the loss scale after overflows and clean streaks:
    // device values, as a recorded update must read them.
    let (mu_t, one_mu) = (inputs.mu.clone().slice(0..1), inputs.mu.slice(1..2));
    let present_rows = col(PRESENT);
    let g = match &inputs.inv {
        Some(inv) => inputs.g * inv.clone(),
        None => inputs.g,
    };
    // Padding and absent gradients are zero, whatever a run copied between its segments.
    let g = g.mask_fill(present_rows.clone().equal_elem(1.0).bool_not(), 0.0);
    // With a loss scale: Σ 0·g is 0 when every value is finite and NaN when not, and added to
    // the presence column it leaves every parameter out of a step that must be skipped. The
    // update below is then masked whole: the same bits as not running it.
    let (present_mask, finite) = match inputs.inv {
        Some(_) => {
            let zero_or_nan = sum_all(g.clone().mul_scalar(0.0));
            let mask = (present_rows + zero_or_nan.clone()).equal_elem(1.0);
            (mask, Finite::OnDevice(Box::new(zero_or_nan)))
        }
        None => (present_rows.equal_elem(1.0), Finite::Known(true)),
    };
    let norm = sum_of_squares(&g, layout.len).sqrt();
    let g = g * (norm.add_scalar(1e-6).recip() * clip_norm).clamp_max(1.0);
    let init_mask = col(INIT).equal_elem(1.0);
    let (p, buf, second) = (flat.p.clone(), flat.buf.clone(), flat.second.clone());
    let (p_new, buf_new, second_new) = match rule {
        Rule::AdamW => {
            let first_m = g.clone() * one_mu.clone();
            let m = first_m.mask_where(init_mask.clone(), buf.clone() * mu_t + g.clone() * one_mu);
            let first_v = g.clone().powi_scalar(2) * (1.0 - beta2);
            let v = first_v.mask_where(
                init_mask,
                second.clone() * beta2 + g.powi_scalar(2) * (1.0 - beta2),
            );
            let denom = (v.clone() / col(ADAM_BC2)).sqrt() + eps;
            let p_new = p.clone() * col(ADAM_DECAY) - m.clone() / denom * col(ADAM_STEP);
            (p_new, m, Some(v))
        }
        Rule::MuSgd => {
            // Muon's momentum and Nesterov blend on every segment, its orthogonalised step on
            // its matrices only, then the SGD step from where that left the parameter.
            let muon_mask = col(MUON).equal_elem(1.0);
            let first_m = g.clone() * one_mu.clone();
            let m = first_m.mask_where(
                init_mask.clone(),
                second.clone() * mu_t.clone() + g.clone() * one_mu.clone(),
            );
            let u = m.clone() * mu_t.clone() + g.clone() * one_mu;
            let batches = flat
                .muon
                .get_or_insert_with(|| MuonBatches::new(rule, table, layout, &device));
            let o = batches.orthogonal(&u);
            let p_muon = p
                .clone()
                .mask_where(muon_mask.clone(), p.clone() - o * col(MUON_LR));
            let gd = g + p_muon.clone() * col(SGD_WD);
            let b = gd
                .clone()
                .mask_where(init_mask, buf.clone() * mu_t.clone() + gd.clone());
            let p_new = p_muon - (gd + b.clone() * mu_t) * col(SGD_LR);
            (p_new, b, Some(second.clone().mask_where(muon_mask, m)))
        }
        Rule::Sgd => {
            let gd = g + p.clone() * col(SGD_WD);
            let b = gd
                .clone()
                .mask_where(init_mask, buf.clone() * mu_t.clone() + gd.clone());
            let p_new = p.clone() - (gd + b.clone() * mu_t) * col(SGD_LR);
            (p_new, b, None)
        }
    };
    let next = Next {
        p: p.mask_where(present_mask.clone(), p_new),
        buf: buf.mask_where(present_mask.clone(), buf_new),
        second: second_new.map(|v| second.mask_where(present_mask, v)),
    };
    (next, finite)
}

/// `g` divided by the loss scale (multiplied by its f32 inverse, as `LossScaler::unscale` does).
fn unscaled(g: Tensor<1>, inv: Option<f32>) -> Tensor<1> {
    match inv {
        Some(inv) => g * inv,
        None => g,
    }
}
