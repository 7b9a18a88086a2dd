//! [`super::LossOps::rle_rows`] on the CPU: the rows' loop forward, the anchors' loop backward.
//! The formulas, operation by operation, are `kernels/rle_rows.rs`' (the CUDA kernels'): the
//! GPU test compares the two, and CI holds these to the tensor operations.

use crate::loss::assign::device::PACKED;
use crate::loss::terms::sign;
use crate::model::ops::host::{tensor, values};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Flex, TensorMetadata};

/// Columns of a row: εx, εy, the row's log terms, counted.
pub const COLUMNS: usize = 4;

/// Burn's sigmoid, `exp(−ln(exp(−x) + 1))`.
fn sigmoid(x: f32) -> f32 {
    (-((-x).exp() + 1.0).ln()).exp()
}

/// `ε` and `log σ + log 2σ + |ε|` of one coordinate: raw output `r`, the truth's offset `o`,
/// the raw sigma `raw`.
fn coordinate(r: f32, o: f32, raw: f32) -> (f32, f32) {
    let s = sigmoid(raw).max(f32::MIN_POSITIVE);
    let e = ((r - o) / (s + 1e-9)).clamp(-100.0, 100.0);
    (e, s.ln() + (s * 2.0).ln() + e.abs())
}

/// The gradients `(d r, d raw)` of one coordinate for its `ε` and log-term gradients.
fn coordinate_grads(r: f32, o: f32, raw: f32, g_e: f32, g_per: f32) -> (f32, f32) {
    let sig = sigmoid(raw);
    let s = sig.max(f32::MIN_POSITIVE);
    let den = s + 1e-9;
    let q = (r - o) / den;
    let e = q.clamp(-100.0, 100.0);
    let dq = if (-100.0..=100.0).contains(&q) {
        g_e + g_per * sign(e)
    } else {
        0.0
    };
    let ds = g_per / s + g_per / (s * 2.0) * 2.0 - dq * (r - o) / (den * den);
    let draw = if sig >= f32::MIN_POSITIVE {
        ds * (sig * (-sig + 1.0))
    } else {
        0.0
    };
    (dq / den, draw)
}

/// The values the loops read, contiguous, with `B, A, K, kd, R` and the slot width.
struct Inputs {
    kpts: Vec<f32>,
    sigma: Vec<f32>,
    fixed: [Vec<f32>; 8],
    dims: [usize; 5],
    width: usize,
}

impl Inputs {
    fn new(
        kpts: &FloatTensor<Flex>,
        sigma: &FloatTensor<Flex>,
        fixed: &[FloatTensor<Flex>; 8],
    ) -> Self {
        let (ks, ss, ps) = (kpts.shape(), sigma.shape(), fixed[3].shape());
        let k = ss[1] / 2;
        Self {
            kpts: values(kpts).into_owned(),
            sigma: values(sigma).into_owned(),
            fixed: std::array::from_fn(|i| values(&fixed[i]).into_owned()),
            dims: [ks[0], ks[2], k, ks[1] / k, ps[1]],
            width: fixed[0].shape()[2],
        }
    }

    /// Anchor `a` of image `b`: its object's slot offset, centre and stride.
    fn anchor(&self, b: usize, a: usize) -> (usize, [f32; 2], f32) {
        let [objects, slot, _, _, _, ax, ay, st] = &self.fixed;
        let [nb, na, ..] = self.dims;
        let slots = objects.len() / (nb * self.width);
        let n = slot[b * na + a] as usize;
        ((b * slots + n) * self.width, [ax[a], ay[a]], st[a])
    }

    /// Keypoint `k`'s truth offsets from the anchor and whether it is labelled.
    fn truth(&self, o: usize, k: usize, c: [f32; 2], s: f32) -> ([f32; 2], bool) {
        let obj = &self.fixed[0][o..o + self.width];
        let g = |i: usize| obj[PACKED + 3 * k + i] / s - c[i];
        ([g(0), g(1)], obj[PACKED + 3 * k + 2] != 0.0)
    }

    /// Raw keypoint coordinate `i` and raw sigma `i` of keypoint `k` at anchor `(b, a)`.
    fn raw(&self, b: usize, a: usize, k: usize, i: usize) -> (f32, f32) {
        let [_, na, nk, kd, _] = self.dims;
        (
            self.kpts[(b * nk * kd + k * kd + i) * na + a],
            self.sigma[(b * nk * 2 + 2 * k + i) * na + a],
        )
    }
}

/// The forward on the CPU: `[B·K, R, 4]`.
pub fn forward(
    kpts: &FloatTensor<Flex>,
    sigma: &FloatTensor<Flex>,
    fixed: &[FloatTensor<Flex>; 8],
) -> FloatTensor<Flex> {
    let x = Inputs::new(kpts, sigma, fixed);
    let [b, _, k, _, r] = x.dims;
    let (picked, count) = (&x.fixed[3], &x.fixed[4]);
    let mut out = vec![0.0f32; b * k * r * COLUMNS];
    for bi in 0..b {
        for j in 0..r {
            let a = picked[bi * r + j] as usize;
            let used = (j as f32) < count[bi];
            let (o, c, s) = x.anchor(bi, a);
            for ki in 0..k {
                let (off, seen) = x.truth(o, ki, c, s);
                let (rx, sx) = x.raw(bi, a, ki, 0);
                let (ry, sy) = x.raw(bi, a, ki, 1);
                let (ex, px) = coordinate(rx, off[0], sx);
                let (ey, py) = coordinate(ry, off[1], sy);
                let at = ((bi * k + ki) * r + j) * COLUMNS;
                out[at..at + COLUMNS].copy_from_slice(&[
                    ex,
                    ey,
                    px + py,
                    if seen && used { 1.0 } else { 0.0 },
                ]);
            }
        }
    }
    tensor(out, [b * k, r, COLUMNS])
}

/// The backward on the CPU: `(d_kpts [B, K·kd, A], d_sigma [B, 2K, A])`.
pub fn backward(
    kpts: &FloatTensor<Flex>,
    sigma: &FloatTensor<Flex>,
    fixed: &[FloatTensor<Flex>; 8],
    grad: &FloatTensor<Flex>,
) -> (FloatTensor<Flex>, FloatTensor<Flex>) {
    let x = Inputs::new(kpts, sigma, fixed);
    let grad = values(grad);
    let [b, a, k, kd, r] = x.dims;
    let place = &x.fixed[2];
    let mut d_kpts = vec![0.0f32; b * k * kd * a];
    let mut d_sigma = vec![0.0f32; b * 2 * k * a];
    for bi in 0..b {
        for ai in 0..a {
            let row = place[bi * a + ai];
            if !(row >= 0.0 && row < r as f32) {
                continue;
            }
            let j = row as usize;
            let (o, c, s) = x.anchor(bi, ai);
            for ki in 0..k {
                let (off, _) = x.truth(o, ki, c, s);
                let g = ((bi * k + ki) * r + j) * COLUMNS;
                for i in 0..2 {
                    let (rv, sv) = x.raw(bi, ai, ki, i);
                    let (dr, ds) = coordinate_grads(rv, off[i], sv, grad[g + i], grad[g + 2]);
                    d_kpts[(bi * k * kd + ki * kd + i) * a + ai] = dr;
                    d_sigma[(bi * 2 * k + 2 * ki + i) * a + ai] = ds;
                }
            }
        }
    }
    (
        tensor(d_kpts, [b, k * kd, a]),
        tensor(d_sigma, [b, 2 * k, a]),
    )
}
