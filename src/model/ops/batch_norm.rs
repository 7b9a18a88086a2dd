//! BatchNorm training statistics and gradients in Burn's formulas (`ModuleOps::batch_norm_train`
//! and its backward), with every per-channel sum reduced along W, then H, then N.

use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, Scalar, Shape, TensorMetadata};

/// Per-channel sum of `[N, C, H, W]` as `[1, C, 1, 1]`.
fn channel_sum<B: Backend>(x: FloatTensor<B>) -> FloatTensor<B> {
    let x = B::float_sum_dim(x, 3);
    let x = B::float_sum_dim(x, 2);
    B::float_sum_dim(x, 0)
}

fn dims(x: &impl TensorMetadata) -> [usize; 4] {
    let shape = x.shape();
    assert_eq!(
        shape.num_dims(),
        4,
        "BatchNorm expects [N, C, H, W], got {shape:?}"
    );
    [shape[0], shape[1], shape[2], shape[3]]
}

fn per_channel<B: Backend>(t: FloatTensor<B>, c: usize) -> FloatTensor<B> {
    B::float_reshape(t, Shape::new([1, c, 1, 1]))
}

fn flat<B: Backend>(t: FloatTensor<B>, c: usize) -> FloatTensor<B> {
    B::float_reshape(t, Shape::new([c]))
}

/// `(output, mean, biased variance)`, the latter two `[C]`.
pub fn train<B: Backend>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    beta: FloatTensor<B>,
    epsilon: f64,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let [n, c, h, w] = dims(&x);
    let count = Scalar::Float((n * h * w) as f64);
    let mean = B::float_div_scalar(channel_sum::<B>(x.clone()), count);
    let centered = B::float_sub(x, mean.clone());
    let variance = B::float_div_scalar(
        channel_sum::<B>(B::float_mul(centered.clone(), centered.clone())),
        count,
    );
    let std = B::float_sqrt(B::float_add_scalar(
        variance.clone(),
        Scalar::Float(epsilon),
    ));
    let normalized = B::float_div(centered, std);
    let output = B::float_add(
        B::float_mul(normalized, per_channel::<B>(gamma, c)),
        per_channel::<B>(beta, c),
    );
    (output, flat::<B>(mean, c), flat::<B>(variance, c))
}

/// `(x, gamma, beta)` gradients.
pub fn backward<B: Backend>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    mean: FloatTensor<B>,
    variance: FloatTensor<B>,
    epsilon: f64,
    grad: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let [n, c, h, w] = dims(&x);
    let count = Scalar::Float((n * h * w) as f64);
    let inv_std = B::float_recip(B::float_sqrt(B::float_add_scalar(
        per_channel::<B>(variance, c),
        Scalar::Float(epsilon),
    )));
    let normalized = B::float_mul(B::float_sub(x, per_channel::<B>(mean, c)), inv_std.clone());
    let beta_grad = channel_sum::<B>(grad.clone());
    let gamma_grad = channel_sum::<B>(B::float_mul(grad.clone(), normalized.clone()));
    let mean_grad = B::float_div_scalar(beta_grad.clone(), count);
    let mean_normalized_grad = B::float_div_scalar(gamma_grad.clone(), count);
    let centred_grad = B::float_sub(grad, mean_grad);
    let projected = B::float_mul(normalized, mean_normalized_grad);
    let scale = B::float_mul(per_channel::<B>(gamma, c), inv_std);
    let x_grad = B::float_mul(scale, B::float_sub(centred_grad, projected));
    (x_grad, flat::<B>(gamma_grad, c), flat::<B>(beta_grad, c))
}
