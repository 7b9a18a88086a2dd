//! Muon's orthogonalisation: five quintic Newton–Schulz steps (yolo_spec §4.4).

use crate::optim::reduce::{sum_all, sum_each_row};
use burn::prelude::*;

pub const COEFFS: (f32, f32, f32) = (3.4445, -4.7750, 2.0315);

/// Approximately orthogonalises `g` (`[rows, cols]`). Computed in the tensor's dtype (FP32 for
/// our master weights; Ultralytics runs it in BF16); on CUDA CubeCL's accelerated matmul stages
/// f32 operands as TF32, so there the products round at TF32's 10-bit mantissa.
pub fn orthogonalize(g: Tensor<2>, steps: usize) -> Tensor<2> {
    let (a, b, c) = COEFFS;
    let [rows, cols] = g.dims();
    let norm = sum_all(g.clone().powi_scalar(2)).sqrt().reshape([1, 1]);
    let mut x = g / (norm + 1e-7);
    let tall = rows > cols;
    if tall {
        x = x.transpose();
    }
    for _ in 0..steps {
        let gram = x.clone().matmul(x.clone().transpose());
        let poly = gram.clone() * b + gram.clone().matmul(gram) * c;
        x = x.clone() * a + poly.matmul(x);
    }
    if tall { x.transpose() } else { x }
}

/// [`orthogonalize`] of `k` matrices of one shape at once (`g`: `[k, rows, cols]`), each in
/// the same operations as alone: its norm summed in [`sum_all`]'s order, the same products
/// batched. ~40 kernel launches per shape instead of per matrix (MuSGD's 186 matrices of the
/// nano pose model come in 43 shapes).
pub fn orthogonalize_batch(g: Tensor<3>, steps: usize) -> Tensor<3> {
    let (a, b, c) = COEFFS;
    let [k, rows, cols] = g.dims();
    let squares = g.clone().powi_scalar(2).reshape([k, rows * cols]);
    let norm = sum_each_row(squares).sqrt().reshape([k, 1, 1]);
    let mut x = g / (norm + 1e-7);
    let tall = rows > cols;
    if tall {
        x = x.swap_dims(1, 2);
    }
    for _ in 0..steps {
        let gram = x.clone().matmul(x.clone().swap_dims(1, 2));
        let poly = gram.clone() * b + gram.clone().matmul(gram) * c;
        x = x.clone() * a + poly.matmul(x);
    }
    if tall { x.swap_dims(1, 2) } else { x }
}

/// The matrix Muon orthogonalises for a parameter of `dims`, as [`orthogonalized`] views it:
/// `(rows, cols, transposed)`, where `transposed` says the matrix is the parameter's `[in, out]`
/// layout transposed (Burn's `Linear`).
pub fn matrix_shape(dims: &[usize]) -> (usize, usize, bool) {
    let n: usize = dims.iter().product();
    if dims.len() == 2 {
        (dims[1], dims[0], true)
    } else {
        (dims[0], n / dims[0], false)
    }
}

/// Muon's scale of an orthogonalised `rows × cols` matrix: √max(1, rows/cols).
pub fn muon_scale(rows: usize, cols: usize) -> f64 {
    (rows as f64 / cols as f64).max(1.0).sqrt()
}

/// Newton–Schulz on the parameter's matrix view (rows = output channels, as PyTorch lays out
/// weights; Burn's `Linear` stores `[in, out]`, so 2-D weights are transposed for it), scaled by
/// √max(1, rows/cols).
pub fn orthogonalized(u: Tensor<1>, dims: &[usize]) -> Tensor<1> {
    let n = u.dims()[0];
    let (m, linear) = if dims.len() == 2 {
        (u.reshape([dims[0], dims[1]]).transpose(), true)
    } else {
        (u.reshape([dims[0], n / dims[0]]), false)
    };
    let [rows, cols] = m.dims();
    let o = orthogonalize(m, 5) * muon_scale(rows, cols);
    let o = if linear { o.transpose() } else { o };
    o.reshape([n])
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    #[test]
    fn singular_values_are_pushed_towards_one() {
        let d = Device::flex();
        d.seed(1);
        let g = Tensor::<2>::random([16, 48], Distribution::Normal(0.0, 1.0), &d);
        let o = orthogonalize(g, 5);
        // O·Oᵀ ≈ I: the quintic iteration lands singular values in roughly [0.7, 1.2].
        let gram = o.clone().matmul(o.transpose());
        let diag: Vec<f32> = (gram.clone() * Tensor::eye(16, &d))
            .sum_dim(1)
            .into_data()
            .try_into_vec()
            .unwrap();
        for v in diag {
            assert!((0.4..1.5).contains(&v), "diag {v}");
        }
        let tall = orthogonalize(
            Tensor::random([48, 16], Distribution::Normal(0.0, 1.0), &d),
            5,
        );
        assert_eq!(tall.dims(), [48, 16]);
    }
}
