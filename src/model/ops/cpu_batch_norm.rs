//! BatchNorm + SiLU on the CPU as a few passes over each channel's values: training (two passes
//! for the statistics, one for the output; backward one pass for `g_z` and its two sums, one for
//! the input gradient) and inference (one pass). Channels are independent, so from
//! [`TWO_THREAD_VALUES`] values the two halves of the channels run on two threads: the same
//! arithmetic per channel, so the same bits either way.
//!
//! The sums are accumulated in `f64` lanes, as PyTorch's CPU BatchNorm does: in `f32`, a
//! training forward of YOLO26n (160 px, batch 2) ended 2.7e-4 (relative) from the exact values
//! against PyTorch's 7.9e-5, and with `f64` 7e-5 (docs/weights.md, "Parity").

use super::cpu::{TWO_THREAD_WORK, silu_grad, silu_value};
use super::host::{LANES, dispatched, tensor, total, values};
use burn::backend::tensor::FloatTensor;
use burn::backend::{
    BackendTensor, DispatchTensor, DispatchTensorKind, Flex, Shape, TensorMetadata,
};
use burn::prelude::*;
use burn::tensor::DType;
use std::ops::Range;

/// Values of a training BatchNorm from which its channels are split over two threads: a pass
/// costs a few ns per value (an exponential in the SiLU), a thread's start tens of µs.
pub(super) const TWO_THREAD_VALUES: usize = 1 << 16;

/// `Σ f(v)` over a run, value `i` into lane `i mod LANES`.
#[inline(always)]
fn lane_sum(acc: &mut [f64; LANES], v: &[f32], f: impl Fn(f32) -> f64) {
    let (blocks, rest) = v.as_chunks::<LANES>();
    for block in blocks {
        for l in 0..LANES {
            acc[l] += f(block[l]);
        }
    }
    for (l, &x) in rest.iter().enumerate() {
        acc[l] += f(x);
    }
}

/// `[N, C, H, W]` as `(N, C, H·W)`.
fn planes(x: &FloatTensor<Flex>) -> (usize, usize, usize) {
    let s = x.shape();
    assert_eq!(s.num_dims(), 4, "BatchNorm expects [N, C, H, W], got {s:?}");
    (s[0], s[1], s[2] * s[3])
}

/// Channel `channel`'s value runs in `[N, C, H·W]`: one of `hw` values per image.
#[inline(always)]
fn runs(
    (n, c, hw): (usize, usize, usize),
    channel: usize,
) -> impl Iterator<Item = std::ops::Range<usize>> {
    (0..n).map(move |i| (i * c + channel) * hw..(i * c + channel + 1) * hw)
}

/// The output runs of channels `channels` of an `[N, C, H·W]` tensor, image-major: run
/// `(b, ch)` at `b · channels.len() + ch − channels.start`.
type OutRuns<'a, 'b> = &'a mut [&'b mut [f32]];

/// Run `(b, k)`: image `b`, the `k`-th channel of the range, of [`OutRuns`] `width` channels wide.
#[inline(always)]
fn run_of<'a>(out: &'a mut [&mut [f32]], width: usize, b: usize, k: usize) -> &'a mut [f32] {
    &mut *out[b * width + k]
}

/// `out` `[N, C, H·W]` as its channel runs, split at channel `at`: those of channels `0..at`
/// and those of `at..C`, each image-major.
fn split_runs(
    out: &mut [f32],
    (_, c, hw): (usize, usize, usize),
    at: usize,
) -> (Vec<&mut [f32]>, Vec<&mut [f32]>) {
    let (mut first, mut second) = (Vec::new(), Vec::new());
    for (i, run) in out.chunks_exact_mut(hw.max(1)).enumerate() {
        if i % c < at {
            first.push(run);
        } else {
            second.push(run);
        }
    }
    (first, second)
}

/// Runs `body` over all channels of `out` (`[N, C, H·W]`) and the per-channel outputs
/// `per_channel`: on this thread, or from [`TWO_THREAD_VALUES`] values the second half of the
/// channels on another thread (each channel's values are computed alike either way).
fn by_channel_halves(
    dims: (usize, usize, usize),
    two_threads: bool,
    out: &mut [f32],
    [p, q]: [&mut [f32]; 2],
    body: impl Fn(Range<usize>, OutRuns, &mut [f32], &mut [f32]) + Sync,
) {
    let c = dims.1;
    let at = if two_threads && c >= 2 { c / 2 } else { c };
    let (mut first, mut second) = split_runs(out, dims, at);
    let ((pa, pb), (qa, qb)) = (p.split_at_mut(at), q.split_at_mut(at));
    if at == c {
        return body(0..c, &mut first, pa, qa);
    }
    std::thread::scope(|s| {
        let body = &body;
        s.spawn(move || body(at..c, &mut second, pb, qb));
        body(0..at, &mut first, pa, qa);
    });
}

/// `1 / √(var + ε)`, as the CUDA kernels compute it.
#[inline(always)]
fn inv_std(var: f32, epsilon: f32) -> f32 {
    1.0 / (var + epsilon).sqrt()
}

/// Channel `ch` (the `k`-th of `out`'s `width`) of `x` normalised,
/// `out = (x − mean) · inv_std · γ + β` with `[mean, inv_std, γ, β]`, SiLU'd when `act`: the
/// last pass of the training and the inference loops.
#[inline(always)]
fn normalise(
    x: &[f32],
    dims: (usize, usize, usize),
    (ch, k, width): (usize, usize, usize),
    [mean, is, g, b]: [f32; 4],
    act: bool,
    out: OutRuns,
) {
    for (i, r) in runs(dims, ch).enumerate() {
        for (o, &v) in run_of(out, width, i, k).iter_mut().zip(&x[r]) {
            let z = ((v - mean) * is).mul_add(g, b);
            *o = if act { silu_value(z) } else { z };
        }
    }
}

dispatched! {
    /// Per channel of `channels`: the batch mean and biased variance (two passes), then
    /// `out = (x − mean) · inv_std · γ + β`, SiLU'd when `act`.
    fn bn_forward_loops(
        x: &[f32],
        dims: (usize, usize, usize),
        channels: Range<usize>,
        gamma: &[f32],
        beta: &[f32],
        epsilon: f32,
        act: bool,
        out: OutRuns,
        means: &mut [f32],
        vars: &mut [f32],
    ) {
        let (n, _, hw) = dims;
        let count = (n * hw) as f64;
        let width = channels.len();
        for (k, ch) in channels.enumerate() {
            let mut acc = [0.0; LANES];
            for r in runs(dims, ch) {
                lane_sum(&mut acc, &x[r], f64::from);
            }
            let mean64 = total(acc) / count;
            let mut acc = [0.0; LANES];
            for r in runs(dims, ch) {
                lane_sum(&mut acc, &x[r], |v| (f64::from(v) - mean64).powi(2));
            }
            let (mean, var) = (mean64 as f32, (total(acc) / count) as f32);
            let (is, g, b) = (inv_std(var, epsilon), gamma[ch], beta[ch]);
            normalise(x, dims, (ch, k, width), [mean, is, g, b], act, out);
            means[k] = mean;
            vars[k] = var;
        }
    }
}

dispatched! {
    /// Per channel with the running statistics: `out = (x − mean) · inv_std · γ + β`, SiLU'd when
    /// `act` (the CUDA inference kernel's formula), one pass.
    fn bn_inference_loops(
        x: &[f32],
        dims: (usize, usize, usize),
        stats: [&[f32]; 4],
        epsilon: f32,
        act: bool,
        out: &mut [f32],
    ) {
        let [gamma, beta, mean, var] = stats;
        let c = dims.1;
        let (mut out, _) = split_runs(out, dims, c);
        for ch in 0..c {
            let (m, is) = (mean[ch], inv_std(var[ch], epsilon));
            normalise(x, dims, (ch, ch, c), [m, is, gamma[ch], beta[ch]], act, &mut out);
        }
    }
}

/// BatchNorm in inference (the running statistics), SiLU when `act`, as one pass over the values
/// instead of Burn's five tensor operations and its `silu` (libm's `expf` was a quarter of a CPU
/// `predict`'s time); the batch split over two threads when large. `None` off the CPU or under
/// autodiff.
pub fn bn_act_inference(bn: &burn::nn::BatchNorm, x: &Tensor<4>, act: bool) -> Option<Tensor<4>> {
    fn flex<const D: usize>(t: Tensor<D>) -> Option<FloatTensor<Flex>> {
        match t.into_dispatch().kind {
            DispatchTensorKind::Flex(BackendTensor::Float(f)) if f.dtype() == DType::F32 => Some(f),
            _ => None,
        }
    }
    if x.device().is_autodiff() {
        return None;
    }
    let xf = flex(x.clone())?;
    let stats = [
        bn.gamma.val(),
        bn.beta.val(),
        bn.running_mean.value(),
        bn.running_var.value(),
    ]
    .map(flex);
    let [Some(g), Some(b), Some(m), Some(v)] = stats else {
        return None;
    };
    let dims @ (n, c, hw) = planes(&xf);
    let shape = xf.shape();
    let xv = values(&xf);
    let (gv, bv, mv, vv) = (values(&g), values(&b), values(&m), values(&v));
    let stats = [&gv[..], &bv[..], &mv[..], &vv[..]];
    let eps = bn.epsilon as f32;
    let mut out = vec![0.0f32; xv.len()];
    if n < 2 || xv.len() < TWO_THREAD_WORK {
        bn_inference_loops(&xv, dims, stats, eps, act, &mut out);
    } else {
        // Each value on its own: the halves give the same values as one pass.
        let at = n / 2 * c * hw;
        let (xa, xb) = xv.split_at(at);
        let (oa, ob) = out.split_at_mut(at);
        std::thread::scope(|s| {
            s.spawn(|| bn_inference_loops(xa, (n / 2, c, hw), stats, eps, act, oa));
            bn_inference_loops(xb, (n - n / 2, c, hw), stats, eps, act, ob);
        });
    }
    Some(Tensor::from_dispatch(DispatchTensor {
        kind: DispatchTensorKind::Flex(BackendTensor::Float(tensor(out, shape))),
        autodiff: Default::default(),
    }))
}

dispatched! {
    /// Per channel of `channels`: `g_z` (the gradient through SiLU when `act`) into `dx` with
    /// `dβ = Σ g_z` and `dγ = Σ g_z · x̂`, then `dx = γ · inv_std · (g_z − dβ / M − x̂ · dγ / M)`
    /// in place.
    fn bn_backward_loops(
        x: &[f32],
        grad: &[f32],
        dims: (usize, usize, usize),
        channels: Range<usize>,
        stats: [&[f32]; 4],
        epsilon: f32,
        act: bool,
        dx: OutRuns,
        d_gamma: &mut [f32],
        d_beta: &mut [f32],
    ) {
        let (n, _, hw) = dims;
        let [mean, var, gamma, beta] = stats;
        let count = (n * hw) as f64;
        let width = channels.len();
        for (k, ch) in channels.enumerate() {
            let (mu, is, g, b) = (mean[ch], inv_std(var[ch], epsilon), gamma[ch], beta[ch]);
            let (mut acc_g, mut acc_gx) = ([0.0; LANES], [0.0; LANES]);
            for (i, r) in runs(dims, ch).enumerate() {
                let (v, gr, d) = (&x[r.clone()], &grad[r], run_of(dx, width, i, k));
                let (vb, vr) = v.as_chunks::<LANES>();
                let (gb, gr_rest) = gr.as_chunks::<LANES>();
                let (db, dr) = d.as_chunks_mut::<LANES>();
                let mut one = |v: f32, gr: f32, d: &mut f32, l: usize| {
                    let xhat = (v - mu) * is;
                    let gz = if act { silu_grad(gr, xhat.mul_add(g, b)) } else { gr };
                    *d = gz;
                    acc_g[l] += f64::from(gz);
                    acc_gx[l] += f64::from(gz) * f64::from(xhat);
                };
                for ((vb, gb), db) in vb.iter().zip(gb).zip(db) {
                    for l in 0..LANES {
                        one(vb[l], gb[l], &mut db[l], l);
                    }
                }
                for (l, ((&v, &gr), d)) in vr.iter().zip(gr_rest).zip(dr).enumerate() {
                    one(v, gr, d, l);
                }
            }
            let (sum_g, sum_gx) = (total(acc_g), total(acc_gx));
            let (mean_g, mean_gx) = ((sum_g / count) as f32, (sum_gx / count) as f32);
            let (sum_g, sum_gx, scale) = (sum_g as f32, sum_gx as f32, g * is);
            for (i, r) in runs(dims, ch).enumerate() {
                for (d, &v) in run_of(dx, width, i, k).iter_mut().zip(&x[r]) {
                    let xhat = (v - mu) * is;
                    *d = scale * ((*d - mean_g) - xhat * mean_gx);
                }
            }
            d_gamma[k] = sum_gx;
            d_beta[k] = sum_g;
        }
    }
}

/// BatchNorm with the batch's statistics, SiLU when `act`, and the running statistics
/// `old · (1 − momentum) + stat · momentum`; channels on two threads when `two_threads`.
#[allow(clippy::too_many_arguments)]
pub(super) fn bn_act_forward(
    x: FloatTensor<Flex>,
    gamma: FloatTensor<Flex>,
    beta: FloatTensor<Flex>,
    running_mean: FloatTensor<Flex>,
    running_var: FloatTensor<Flex>,
    epsilon: f32,
    momentum: f32,
    act: bool,
    two_threads: bool,
) -> [FloatTensor<Flex>; 5] {
    let dims @ (_, c, _) = planes(&x);
    let shape = x.shape();
    let xv = values(&x);
    let mut out = vec![0.0f32; xv.len()];
    let mut means = vec![0.0f32; c];
    let mut vars = vec![0.0f32; c];
    let (gv, bv) = (values(&gamma), values(&beta));
    let per_channel = [&mut means[..], &mut vars[..]];
    by_channel_halves(
        dims,
        two_threads,
        &mut out,
        per_channel,
        |chs, out, m, v| bn_forward_loops(&xv, dims, chs, &gv, &bv, epsilon, act, out, m, v),
    );
    let keep = 1.0 - momentum;
    let running = |old: &[f32], stat: &[f32]| -> Vec<f32> {
        old.iter()
            .zip(stat)
            .map(|(&o, &s)| o * keep + s * momentum)
            .collect()
    };
    let new_mean = running(&values(&running_mean), &means);
    let new_var = running(&values(&running_var), &vars);
    [
        tensor(out, shape),
        tensor(means, Shape::new([c])),
        tensor(vars, Shape::new([c])),
        tensor(new_mean, Shape::new([c])),
        tensor(new_var, Shape::new([c])),
    ]
}

/// `(x, γ, β)` gradients of [`bn_act_forward`]'s output; channels on two threads when
/// `two_threads`.
#[allow(clippy::too_many_arguments)]
pub(super) fn bn_act_backward(
    x: FloatTensor<Flex>,
    gamma: FloatTensor<Flex>,
    beta: FloatTensor<Flex>,
    mean: FloatTensor<Flex>,
    variance: FloatTensor<Flex>,
    epsilon: f32,
    act: bool,
    grad: FloatTensor<Flex>,
    two_threads: bool,
) -> [FloatTensor<Flex>; 3] {
    let dims @ (_, c, _) = planes(&x);
    let shape = x.shape();
    let (xv, grad_v) = (values(&x), values(&grad));
    let stats = [
        values(&mean),
        values(&variance),
        values(&gamma),
        values(&beta),
    ];
    let stats = [&stats[0][..], &stats[1][..], &stats[2][..], &stats[3][..]];
    let mut dx = vec![0.0f32; xv.len()];
    let mut d_gamma = vec![0.0f32; c];
    let mut d_beta = vec![0.0f32; c];
    let per_channel = [&mut d_gamma[..], &mut d_beta[..]];
    by_channel_halves(
        dims,
        two_threads,
        &mut dx,
        per_channel,
        |chs, dx, dg, db| {
            bn_backward_loops(&xv, &grad_v, dims, chs, stats, epsilon, act, dx, dg, db)
        },
    );
    [
        tensor(dx, shape),
        tensor(d_gamma, Shape::new([c])),
        tensor(d_beta, Shape::new([c])),
    ]
}

#[cfg(test)]
mod tests {
    use super::super::host::testing::{bits, random};
    use super::*;
    use rand::{SeedableRng, rngs::StdRng};

    /// The channels' halves on two threads give the same bits as one thread, forward and
    /// backward, with and without the SiLU, at an odd channel count and odd planes.
    #[test]
    fn two_threads_give_one_threads_bits() {
        let mut rng = StdRng::seed_from_u64(3);
        let shape = [3, 7, 5, 9];
        let c = shape[1];
        let x = random(shape, 2.0, &mut rng);
        let grad = random(shape, 2.0, &mut rng);
        let per_channel = |rng: &mut StdRng| random([c, 1, 1, 1], 2.0, rng);
        let (gamma, beta) = (per_channel(&mut rng), per_channel(&mut rng));
        let flat = |t: &FloatTensor<Flex>| tensor(values(t).to_vec(), [c]);
        let (gamma, beta) = (flat(&gamma), flat(&beta));
        let (rm, rv) = (tensor(vec![0.0; c], [c]), tensor(vec![1.0; c], [c]));
        for act in [true, false] {
            let forward = |two| {
                bn_act_forward(
                    x.clone(),
                    gamma.clone(),
                    beta.clone(),
                    rm.clone(),
                    rv.clone(),
                    1e-3,
                    0.03,
                    act,
                    two,
                )
            };
            let (one, two) = (forward(false), forward(true));
            for (a, b) in one.iter().zip(&two) {
                assert_eq!(bits(a), bits(b), "forward, act {act}");
            }
            let [_, mean, var, ..] = one;
            let backward = |two| {
                bn_act_backward(
                    x.clone(),
                    gamma.clone(),
                    beta.clone(),
                    mean.clone(),
                    var.clone(),
                    1e-3,
                    act,
                    grad.clone(),
                    two,
                )
            };
            let (one, two) = (backward(false), backward(true));
            for (a, b) in one.iter().zip(&two) {
                assert_eq!(bits(a), bits(b), "backward, act {act}");
            }
            // The split covers every channel: no output left at its initial zero.
            assert!(values(&one[0]).iter().all(|&v| v != 0.0));
        }
    }
}
