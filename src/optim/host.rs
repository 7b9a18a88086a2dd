//! Flat buffers on the CPU: a tensor's values read where they lie, and owned vectors made from
//! tensors without a copy when nothing else holds them. The CPU's optimizer step and EMA update
//! run as one loop over these instead of a tensor operation per pass.

use super::flat::{
    ADAM_BC2, ADAM_DECAY, ADAM_STEP, COLUMNS, FlatState, INIT, MUON_LR, RuleConstants, SGD_LR,
    SGD_WD,
};
use super::groups::ParamInfo;
use super::layout::ALIGN;
use super::muon::uses_muon;
use super::newton_schulz::orthogonalized;
use super::state::Rule;
use burn::prelude::*;
use burn::tensor::TensorData;

/// A CPU tensor's f32 values, read in place when its storage is contiguous (a copy otherwise).
pub(super) enum HostValues {
    InPlace(burn::backend::flex::FlexTensor),
    Copied(Vec<f32>),
}

impl HostValues {
    pub(super) fn of(t: Tensor<1>) -> Self {
        match contiguous_f32(&t) {
            Some(f) => Self::InPlace(f),
            None => Self::Copied(take_host(t)),
        }
    }

    pub(super) fn values(&self) -> &[f32] {
        match self {
            Self::InPlace(f) => f.as_slice::<f32>().expect("checked in `of`"),
            Self::Copied(v) => v,
        }
    }
}

/// `t`'s values as an owned vector. The flat buffers this reads are always shared (the model's
/// or the optimizer state's views hold them), so `into_data` would copy them out and
/// `try_into_vec` copy them again; a contiguous FP32 tensor is copied once, from where it lies.
pub(super) fn take_host(t: Tensor<1>) -> Vec<f32> {
    if let Some(f) = contiguous_f32(&t) {
        return f.as_slice::<f32>().expect("checked").to_vec();
    }
    t.into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .expect("f32 data after convert")
}

/// `t`'s burn-flex storage when it holds contiguous FP32 values readable in place.
fn contiguous_f32(t: &Tensor<1>) -> Option<burn::backend::flex::FlexTensor> {
    use burn::backend::{BackendTensor, DispatchTensorKind};
    match t.clone().into_dispatch().kind {
        DispatchTensorKind::Flex(BackendTensor::Float(f)) if f.as_slice::<f32>().is_some() => {
            Some(f)
        }
        _ => None,
    }
}

/// The update of [`super::flat::step`] as one loop over the buffers on the host (the CPU backend runs each
/// tensor operation as its own pass over all 3.7 M values: ~30 passes, ~90 ms a step on two
/// cores). Per element the same f32 operations in the same order, so the same bits as the
/// tensor operations and the per-tensor update; the clipping norm is summed in [`ALIGN`]-value
/// rows, then the row sums, as [`super::flat::sum_of_squares`] does. MuSGD's orthogonalisation runs as
/// tensor operations per matrix (matrix products), before the loop.
pub(super) fn host_update(
    constants: RuleConstants,
    flat: &mut FlatState,
    table: &[ParamInfo],
    rows: &[f32],
    parts: &[Option<HostValues>],
    mu: f64,
    clip_norm: f64,
) {
    let RuleConstants {
        rule, beta2, eps, ..
    } = constants;
    let device = flat.p.device();
    let layout = &flat.layout;
    // The rows of `ALIGN` values of the flat gradient: each lies in one segment (padding and
    // absent gradients are zeros and add nothing).
    let mut row_sums = Vec::with_capacity(layout.len / ALIGN);
    for (i, &n) in layout.sizes.iter().enumerate() {
        let rows = super::layout::padded(n) / ALIGN;
        match &parts[i] {
            Some(g) => row_sums.extend(
                g.values()
                    .chunks(ALIGN)
                    .map(|r| r.iter().map(|x| x * x).sum::<f32>()),
            ),
            None => row_sums.extend(std::iter::repeat_n(0.0, rows)),
        }
    }
    let norm = row_sums.iter().sum::<f32>().sqrt();
    let factor = ((1.0 / (norm + 1e-6)) * clip_norm as f32).min(1.0);
    // Copies: the model's parameters and the optimizer state are views of these buffers.
    let mut p = take_host(flat.p.clone());
    let mut buf = take_host(flat.buf.clone());
    let mut second =
        matches!(rule, Rule::AdamW | Rule::MuSgd).then(|| take_host(flat.second.clone()));
    let (muf, one_mu) = (mu as f32, (1.0 - mu) as f32);
    let (b2, one_b2, epsf) = (beta2 as f32, (1.0 - beta2) as f32, eps as f32);
    // Every present Muon matrix: its new momentum `m` (written into `second` here: this update
    // runs only when it counts) and the blend `u = m·μ + g·(1 − μ)` orthogonalised, at its place
    // in a flat buffer; per element the tensor path's operations. Matrix by matrix, which the
    // CPU runs faster than the batches of the tensor path (optimizer phase ~200 against ~290 ms
    // on the nano pose model, two cores; the same bits either way).
    let orthogonal: Option<Vec<f32>> = (rule == Rule::MuSgd).then(|| {
        let v = second.as_deref_mut().expect("MuSGD's state");
        let mut out = vec![0f32; layout.len];
        for (i, info) in table.iter().enumerate() {
            let Some(g) = parts[i].as_ref().filter(|_| uses_muon(rule, info)) else {
                continue;
            };
            let init = rows[i * COLUMNS + INIT] == 1.0;
            let (o, n) = (layout.offsets[i], layout.sizes[i]);
            let u: Vec<f32> = g
                .values()
                .iter()
                .zip(&mut v[o..o + n])
                .map(|(&g, v)| {
                    let ge = g * factor;
                    *v = if init {
                        *v * muf + ge * one_mu
                    } else {
                        ge * one_mu
                    };
                    *v * muf + ge * one_mu
                })
                .collect();
            let u = Tensor::<1>::from_data(TensorData::new(u, [n]), &device);
            out[o..o + n].copy_from_slice(&take_host(orthogonalized(u, &info.dims)));
        }
        out
    });
    // Parameter `i`'s update, given its segments of the three buffers.
    let update = |i: usize, p: &mut [f32], buf: &mut [f32], v: Option<&mut [f32]>| {
        let r = &rows[i * COLUMNS..(i + 1) * COLUMNS];
        let Some(g) = &parts[i] else { return };
        let g = g.values();
        let init = r[INIT] == 1.0;
        match (v, rule) {
            (Some(v), Rule::AdamW) => {
                let (decay, bc2, step) = (r[ADAM_DECAY], r[ADAM_BC2], r[ADAM_STEP]);
                for e in 0..p.len() {
                    let ge = g[e] * factor;
                    let m = if init {
                        buf[e] * muf + ge * one_mu
                    } else {
                        ge * one_mu
                    };
                    let ve = if init {
                        v[e] * b2 + ge * ge * one_b2
                    } else {
                        ge * ge * one_b2
                    };
                    let denom = (ve / bc2).sqrt() + epsf;
                    p[e] = p[e] * decay - m / denom * step;
                    buf[e] = m;
                    v[e] = ve;
                }
            }
            (Some(_), Rule::MuSgd) => {
                let (wd, lr, muon_lr) = (r[SGD_WD], r[SGD_LR], r[MUON_LR]);
                let (start, n) = (layout.offsets[i], layout.sizes[i]);
                let o = orthogonal
                    .as_deref()
                    .filter(|_| uses_muon(rule, &table[i]))
                    .map(|o| &o[start..start + n]);
                for e in 0..p.len() {
                    let ge = g[e] * factor;
                    if let Some(o) = o {
                        p[e] -= o[e] * muon_lr;
                    }
                    let gd = ge + p[e] * wd;
                    let b = if init { buf[e] * muf + gd } else { gd };
                    p[e] -= (gd + b * muf) * lr;
                    buf[e] = b;
                }
            }
            _ => {
                let (wd, lr) = (r[SGD_WD], r[SGD_LR]);
                for e in 0..p.len() {
                    let ge = g[e] * factor;
                    let gd = ge + p[e] * wd;
                    let b = if init { buf[e] * muf + gd } else { gd };
                    p[e] -= (gd + b * muf) * lr;
                    buf[e] = b;
                }
            }
        }
    };
    // Parameters `range`, whose segments start at `base` in the given parts of the buffers.
    let run = |range: std::ops::Range<usize>,
               base: usize,
               p: &mut [f32],
               buf: &mut [f32],
               mut v: Option<&mut [f32]>| {
        for i in range {
            let (o, n) = (layout.offsets[i] - base, layout.sizes[i]);
            let v = v.as_deref_mut().map(|v| &mut v[o..o + n]);
            update(i, &mut p[o..o + n], &mut buf[o..o + n], v);
        }
    };
    // Memory-bound and independent per value: the parameters in two halves, one per core.
    let count = layout.sizes.len();
    let k = layout.offsets.partition_point(|&o| o < layout.len / 2);
    let cut = layout.offsets.get(k).copied().unwrap_or(layout.len);
    let (p1, p2) = p.split_at_mut(cut);
    let (buf1, buf2) = buf.split_at_mut(cut);
    let (v1, v2) = match second.as_deref_mut() {
        Some(v) => {
            let (a, b) = v.split_at_mut(cut);
            (Some(a), Some(b))
        }
        None => (None, None),
    };
    std::thread::scope(|s| {
        s.spawn(|| run(k..count, cut, p2, buf2, v2));
        run(0..k, 0, p1, buf1, v1);
    });
    let len = flat.layout.len;
    let upload = |v: Vec<f32>| Tensor::<1>::from_data(TensorData::new(v, [len]), &device);
    flat.p = upload(p);
    flat.buf = upload(buf);
    if let Some(v) = second {
        flat.second = upload(v);
    }
}

/// The tests' switch to run the flat optimizer step's and EMA update's tensor operations (CUDA's
/// path) on the CPU, where the loops over these buffers run otherwise: both must give the
/// per-tensor update's bits.
#[cfg(test)]
pub(crate) mod force {
    use std::cell::Cell;

    thread_local! {
        static TENSOR_PATH: Cell<bool> = const { Cell::new(false) };
    }

    /// Whether this thread's flat updates run as tensor operations on any device.
    pub fn tensor_path() -> bool {
        TENSOR_PATH.with(Cell::get)
    }

    /// Runs `f` with this thread's flat updates as tensor operations.
    pub fn with_tensor_path<T>(f: impl FnOnce() -> T) -> T {
        TENSOR_PATH.with(|c| c.set(true));
        let out = f();
        TENSOR_PATH.with(|c| c.set(false));
        out
    }
}

#[cfg(not(test))]
pub(super) mod force {
    pub fn tensor_path() -> bool {
        false
    }
}
