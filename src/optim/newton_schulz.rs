//! Muon's orthogonalisation: five quintic Newton–Schulz steps (yolo_spec §4.4).

use crate::optim::reduce::sum_all;
use burn::prelude::*;

pub const COEFFS: (f32, f32, f32) = (3.4445, -4.7750, 2.0315);

/// Approximately orthogonalises `g` (`[rows, cols]`). Computed in the tensor's dtype (FP32 for
/// our master weights; Ultralytics runs it in BF16).
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
