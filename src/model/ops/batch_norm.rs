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

/// `z · σ(z)` as Burn's `silu` computes it.
fn silu<B: Backend>(z: FloatTensor<B>) -> FloatTensor<B> {
    B::float_mul(z.clone(), B::sigmoid(z))
}

/// The gradient through `silu` at `z`, summed in the order Burn's autodiff sums it (the product's
/// left-hand term first, then the sigmoid's), so the CPU path keeps its bits.
fn silu_backward<B: Backend>(z: FloatTensor<B>, grad: FloatTensor<B>) -> FloatTensor<B> {
    let s = B::sigmoid(z.clone());
    let through_product = B::float_mul(grad.clone(), s.clone());
    let through_sigmoid = B::sigmoid_backward(s, B::float_mul(grad, z));
    B::float_add(through_product, through_sigmoid)
}

/// The BatchNorm output before the activation, recomputed with [`train`]'s operations.
fn normalized_output<B: Backend>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    beta: FloatTensor<B>,
    mean: FloatTensor<B>,
    variance: FloatTensor<B>,
    epsilon: f64,
) -> FloatTensor<B> {
    let c = dims(&x)[1];
    let centered = B::float_sub(x, per_channel::<B>(mean, c));
    let std = B::float_sqrt(B::float_add_scalar(
        per_channel::<B>(variance, c),
        Scalar::Float(epsilon),
    ));
    B::float_add(
        B::float_mul(B::float_div(centered, std), per_channel::<B>(gamma, c)),
        per_channel::<B>(beta, c),
    )
}

/// `stat · momentum + old · (1 − momentum)` as Burn's `BatchNorm` updates its running statistics.
fn running<B: Backend>(old: FloatTensor<B>, stat: FloatTensor<B>, momentum: f64) -> FloatTensor<B> {
    B::float_add(
        B::float_mul_scalar(old, Scalar::Float(1.0 - momentum)),
        B::float_mul_scalar(stat, Scalar::Float(momentum)),
    )
}

/// [`train`], then SiLU when `act`, and the running statistics' update:
/// `(output, mean, variance, running mean', running variance')`.
#[allow(clippy::too_many_arguments)]
pub fn act_train<B: Backend>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    beta: FloatTensor<B>,
    running_mean: FloatTensor<B>,
    running_var: FloatTensor<B>,
    epsilon: f64,
    momentum: f64,
    act: bool,
) -> [FloatTensor<B>; 5] {
    let (z, mean, var) = train::<B>(x, gamma, beta, epsilon);
    let out = if act { silu::<B>(z) } else { z };
    let new_mean = running::<B>(running_mean, mean.clone(), momentum);
    let new_var = running::<B>(running_var, var.clone(), momentum);
    [out, mean, var, new_mean, new_var]
}

/// `(x, gamma, beta)` gradients of [`act_train`]'s output.
#[allow(clippy::too_many_arguments)]
pub fn act_backward<B: Backend>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    beta: FloatTensor<B>,
    mean: FloatTensor<B>,
    variance: FloatTensor<B>,
    epsilon: f64,
    act: bool,
    grad: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let grad = if act {
        let z = normalized_output::<B>(
            x.clone(),
            gamma.clone(),
            beta,
            mean.clone(),
            variance.clone(),
            epsilon,
        );
        silu_backward::<B>(z, grad)
    } else {
        grad
    };
    backward::<B>(x, gamma, mean, variance, epsilon, grad)
}
