use super::bn_act::set_running;
use super::*;
use burn::module::Param;
use burn::nn::PaddingConfig2d;
use burn::nn::conv::Conv2dConfig;
use burn::nn::{BatchNorm, BatchNormConfig};

fn device() -> Device {
    Device::flex().autodiff()
}

/// Deterministic test values (no shared RNG between parallel tests).
fn fill(dims: [usize; 4], k: f32, device: &Device) -> Tensor<4> {
    let n: usize = dims.iter().product();
    let v: Vec<f32> = (0..n).map(|i| (i as f32 * k).sin() * 2.0 + 0.5).collect();
    Tensor::<1>::from_floats(v.as_slice(), device).reshape(dims)
}

fn rel_diff<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> f32 {
    let scale = b.clone().abs().max().into_scalar::<f32>().max(1e-6);
    (a - b).abs().max().into_scalar::<f32>() / scale
}

/// Output, input/γ/β gradients and running statistics of `run(bn, x)`, under a fixed loss.
fn bn_case(
    run: impl Fn(&BatchNorm, Tensor<4>) -> Tensor<4>,
) -> (
    Tensor<4>,
    Tensor<4>,
    Tensor<1>,
    Tensor<1>,
    Tensor<1>,
    Tensor<1>,
) {
    let d = device();
    let x0 = fill([3, 5, 6, 7], 0.37, &d);
    let weights = fill([3, 5, 6, 7], 1.91, &d);
    let mut bn = BatchNormConfig::new(5)
        .with_epsilon(1e-3)
        .with_momentum(0.03)
        .init(&d);
    bn.gamma = Param::from_tensor(Tensor::from_floats([1.75, 0.5, 1.0, 2.0, 0.25], &d));
    bn.beta = Param::from_tensor(Tensor::from_floats([-0.5, 0.0, 0.5, 1.0, -1.0], &d));
    let x = x0.require_grad();
    let y = run(&bn, x.clone());
    let grads = (y.clone() * weights).sum().backward();
    let bn_v = bn.clone().valid();
    (
        y.inner(),
        x.grad(&grads).unwrap(),
        bn.gamma.val().grad(&grads).unwrap(),
        bn.beta.val().grad(&grads).unwrap(),
        bn_v.running_mean.value(),
        bn_v.running_var.value(),
    )
}

#[test]
fn staged_batch_norm_matches_burns_values_gradients_and_running_statistics() {
    let stock = bn_case(|bn, x| bn.forward(x));
    let ours = bn_case(|bn, x| batch_norm_act(bn, x, false));
    assert!(rel_diff(ours.0, stock.0) < 1e-5, "output");
    assert!(rel_diff(ours.1, stock.1) < 1e-4, "input gradient");
    assert!(rel_diff(ours.2, stock.2) < 1e-5, "gamma gradient");
    assert!(rel_diff(ours.3, stock.3) < 1e-5, "beta gradient");
    assert!(rel_diff(ours.4, stock.4) < 1e-6, "running mean");
    assert!(rel_diff(ours.5, stock.5) < 1e-6, "running variance");
}

#[test]
fn fused_batch_norm_silu_matches_burns_batch_norm_then_silu() {
    use burn::tensor::activation::silu;
    let stock = bn_case(|bn, x| silu(bn.forward(x)));
    let ours = bn_case(|bn, x| batch_norm_act(bn, x, true));
    assert!(rel_diff(ours.0, stock.0) < 1e-5, "output");
    assert!(rel_diff(ours.1, stock.1.clone()) < 1e-4, "input gradient");
    assert!(rel_diff(ours.2, stock.2) < 1e-5, "gamma gradient");
    assert!(rel_diff(ours.3, stock.3) < 1e-5, "beta gradient");
    assert!(rel_diff(ours.4, stock.4) < 1e-6, "running mean");
    assert!(rel_diff(ours.5, stock.5) < 1e-6, "running variance");
    // A wrong activation derivative must show: the same case without SiLU is far off.
    let plain = bn_case(|bn, x| batch_norm_act(bn, x, false));
    assert!(rel_diff(plain.1, stock.1) > 1e-2, "the check cannot fail");
}

/// Three training steps in a row: the running statistics follow Burn's `update` after each (ours
/// set the value in place), and a clone of the module sees them, as it sees Burn's.
#[test]
fn running_statistics_follow_burns_step_after_step() {
    let d = device();
    let stats = |bn: &BatchNorm| {
        let v = bn.clone().valid();
        (v.running_mean.value(), v.running_var.value())
    };
    let init = || BatchNormConfig::new(5).with_momentum(0.1).init(&d);
    let (stock, ours) = (init(), init());
    let ours_clone = ours.clone();
    for k in [0.37, 1.13, 2.9] {
        let x = fill([2, 5, 4, 3], k, &d);
        let _ = stock.forward(x.clone());
        let _ = batch_norm_act(&ours, x, true);
        let ((sm, sv), (om, ov)) = (stats(&stock), stats(&ours));
        assert!(rel_diff(om, sm.clone()) < 1e-6, "running mean at {k}");
        assert!(rel_diff(ov, sv) < 1e-6, "running variance at {k}");
        assert!(
            rel_diff(stats(&ours_clone).0, sm) < 1e-6,
            "the clone's mean at {k}"
        );
    }
    // The check can fail: the initial statistics are far from the third step's.
    assert!(rel_diff(stats(&init()).0, stats(&stock).0) > 1e-2);
}

#[test]
fn batch_norm_outside_training_is_burns_inference() {
    let d = Device::flex();
    let bn = BatchNormConfig::new(4).init(&d);
    let x = fill([2, 4, 3, 3], 0.7, &d);
    let y = batch_norm_act(&bn, x.clone(), false);
    // Running statistics are 0 and 1: inference only scales by 1/sqrt(1 + eps).
    assert!(rel_diff(y, x.clone().div_scalar((1.0f64 + bn.epsilon).sqrt())) < 1e-6);
    let y = batch_norm_act(&bn, x.clone(), true);
    let z = x.div_scalar((1.0f64 + bn.epsilon).sqrt());
    assert!(rel_diff(y, burn::tensor::activation::silu(z)) < 1e-6);
}

/// Inference with real running statistics, γ and β, at an odd shape and at one large enough for
/// two threads: Burn's BatchNorm then SiLU within float rounding, and the threaded batch equal,
/// bit for bit, to its images run one by one.
#[test]
fn batch_norm_inference_on_the_cpu_matches_burns() {
    let d = Device::flex();
    let set = |c: usize, k: f32, shift: f32| {
        let v: Vec<f32> = (0..c).map(|i| (i as f32 * k).cos() * 0.5 + shift).collect();
        Tensor::<1>::from_floats(v.as_slice(), &d)
    };
    for dims in [[3, 5, 7, 9], [2, 16, 256, 260]] {
        let c = dims[1];
        let mut bn = BatchNormConfig::new(c).init(&d);
        bn.gamma = Param::from_tensor(set(c, 0.9, 1.0));
        bn.beta = Param::from_tensor(set(c, 1.3, -0.2));
        set_running(&bn.running_mean, set(c, 0.4, 0.3));
        set_running(&bn.running_var, set(c, 0.7, 0.8));
        let x = fill(dims, 0.37, &d);
        for act in [false, true] {
            let y = batch_norm_act(&bn, x.clone(), act);
            let burn_y = bn.forward(x.clone());
            let burn_y = match act {
                true => burn::tensor::activation::silu(burn_y),
                false => burn_y,
            };
            assert!(rel_diff(y.clone(), burn_y) < 1e-5, "{dims:?} act {act}");
            let one_by_one: Vec<Tensor<4>> = (0..dims[0])
                .map(|i| batch_norm_act(&bn, x.clone().slice(i..i + 1), act))
                .collect();
            assert_eq!(
                y.into_data(),
                Tensor::cat(one_by_one, 0).into_data(),
                "{dims:?} act {act}: the halves differ from the images one by one"
            );
        }
    }
}

fn conv_case(
    groups: usize,
    stride: usize,
    [n, h, w]: [usize; 3],
    ours: bool,
) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
    let d = device();
    let conv = Conv2dConfig::new([8, 12], [3, 3])
        .with_stride([stride, stride])
        .with_groups(groups)
        .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
        .with_bias(false)
        .init(&d);
    // Both arms must see the same weights: replace the random initialisation.
    let dims = conv.weight.dims();
    let conv = Conv2d {
        weight: Param::from_tensor(fill(dims, 0.29, &d)),
        ..conv
    };
    let x = fill([n, 8, h, w], 0.53, &d).require_grad();
    let y = if ours {
        conv2d(x.clone(), conv.weight.val(), conv_options(&conv))
    } else {
        conv.forward(x.clone())
    };
    let w = fill(y.dims(), 1.3, &d);
    let grads = (y.clone() * w).sum().backward();
    (
        y.inner(),
        x.grad(&grads).unwrap(),
        conv.weight.val().grad(&grads).unwrap(),
    )
}

#[test]
fn convolution_op_has_burns_values_and_gradients_on_the_cpu() {
    // On the CPU both paths run Flex's kernels for the output and the data gradient, so only the
    // autodiff wiring differs: bit equal. The weight gradient is our im2col matmul where it takes
    // the convolution (groups 1 or depthwise; close, summed in another order) and Burn's otherwise.
    // The larger shapes (odd batch, odd sizes) split the forward over two threads by images.
    let shapes = [[2, 9, 10], [3, 61, 47], [5, 33, 35]];
    for (groups, stride, shape) in shapes
        .into_iter()
        .flat_map(|s| [(1, 1, s), (1, 2, s), (4, 1, s)])
    {
        let (a, b) = (
            conv_case(groups, stride, shape, true),
            conv_case(groups, stride, shape, false),
        );
        a.0.into_data().assert_eq(&b.0.into_data(), true);
        a.1.into_data().assert_eq(&b.1.into_data(), true);
        if groups == 1 {
            let err = rel_diff(a.2, b.2);
            assert!(err < 1e-5, "weight gradient off by {err} at {shape:?}");
        } else {
            a.2.into_data().assert_eq(&b.2.into_data(), true);
        }
    }
}

#[test]
fn kernels_default_to_fast() {
    assert_eq!(ConvBnOps::default(), ConvBnOps::Fast);
    assert_eq!(conv_bn_ops(), ConvBnOps::Fast);
}

fn flex(t: Tensor<4>) -> FloatTensor<burn::backend::Flex> {
    use burn::backend::{BackendTensor, DispatchTensorKind};
    match t.into_dispatch().kind {
        DispatchTensorKind::Flex(BackendTensor::Float(p)) => p,
        other => panic!("expected a Flex float tensor, got {other:?}"),
    }
}

/// [`flex`]'s inverse: a Flex float primitive as a tensor.
fn from_flex(t: FloatTensor<burn::backend::Flex>) -> Tensor<4> {
    Tensor::from_dispatch(burn::backend::DispatchTensor {
        kind: burn::backend::DispatchTensorKind::Flex(burn::backend::BackendTensor::Float(t)),
        autodiff: Default::default(),
    })
}

#[test]
fn im2col_weight_gradient_matches_burns() {
    use burn::backend::Flex;
    use burn::backend::ops::{FloatTensorOps, ModuleOps};
    let d = Device::flex();
    // (c_in, c_out, kernel, stride, padding, dilation, groups, size); 64×64 outputs make 4
    // chunks; odd sizes leave partial rows at stride 2.
    let cases = [
        (3, 8, 3, 1, 1, 1, 1, 64),
        (4, 6, 3, 2, 1, 1, 1, 33),
        (5, 7, 1, 1, 0, 1, 1, 20),
        (4, 5, 1, 2, 0, 1, 1, 21),
        (6, 6, 3, 1, 1, 1, 6, 64),
        (6, 6, 3, 2, 1, 1, 6, 17),
        (3, 4, 3, 1, 2, 2, 1, 19),
        (2, 3, 5, 2, 2, 1, 1, 23),
    ];
    for (i, (ci, co, k, s, pad, dil, g, hw)) in cases.into_iter().enumerate() {
        let options = ConvOptions::new([s, s], [pad, pad], [dil, dil], g);
        // The 1×1 case reads a channel slice, a view whose columns are not contiguous.
        let x = match i {
            2 => fill([3, 2 * ci, hw, hw], 0.31, &d).narrow(1, ci, ci),
            _ => fill([3, ci, hw, hw], 0.31, &d),
        };
        let w = fill([co, ci / g, k, k], 0.77, &d);
        let ho = (hw + 2 * pad - dil * (k - 1) - 1) / s + 1;
        let dy = fill([3, co, ho, ho], 0.13, &d);
        let ours = wgrad::weight_backward::<Flex>(
            flex(x.clone()),
            flex(w.clone()),
            flex(dy.clone()),
            &options,
            wgrad::columns::<Flex>,
            Flex::float_matmul,
        )
        .expect("groups 1 or depthwise");
        // What the CPU runs: the host loop without groups, the tensor operations otherwise.
        let cpu = <Flex as FastOps>::conv_weight_backward(
            flex(x.clone()),
            flex(w.clone()),
            flex(dy.clone()),
            options.clone(),
        );
        let stock = from_flex(Flex::conv2d_weight_backward(
            flex(x),
            flex(w),
            flex(dy),
            options,
        ));
        for (path, a) in [("tensor ops", from_flex(ours)), ("cpu", from_flex(cpu))] {
            assert_eq!(a.dims(), stock.dims());
            let err = rel_diff(a, stock.clone());
            assert!(
                err < 1e-5,
                "{path}: case {ci}->{co} k{k} s{s} d{dil} g{g} {hw}px: {err}"
            );
        }
    }
    // Other grouped convolutions are declined (the caller runs Burn's).
    let options = ConvOptions::new([1, 1], [0, 0], [1, 1], 2);
    let (x, w, dy) = (
        fill([1, 4, 5, 5], 0.1, &d),
        fill([6, 2, 1, 1], 0.2, &d),
        fill([1, 6, 5, 5], 0.3, &d),
    );
    assert!(
        wgrad::weight_backward::<Flex>(
            flex(x),
            flex(w),
            flex(dy),
            &options,
            wgrad::columns::<Flex>,
            Flex::float_matmul,
        )
        .is_none()
    );
}

/// A channels-last output gradient read as chunks through its NHWC memory gives the weight
/// gradient the NCHW chunks give, at maps split into several chunks (1,024 and 1,600 pixels),
/// whether its memory is channels-last or not (the reading is a view either way).
#[test]
fn channels_last_output_gradients_give_the_same_weight_gradient() {
    use burn::backend::Flex;
    use burn::backend::ops::FloatTensorOps;
    use burn::tensor::FloatDType;
    let d = Device::flex();
    for (ci, co, k, pad, hw) in [(5, 6, 3, 1, 32), (4, 7, 1, 0, 40), (3, 8, 3, 0, 42)] {
        let options = ConvOptions::new([1, 1], [pad, pad], [1, 1], 1);
        let x = fill([2, ci, hw, hw], 0.31, &d);
        let w = fill([co, ci, k, k], 0.77, &d);
        let ho = hw + 2 * pad + 1 - k;
        // Values with channels-last memory, and the same values with NCHW memory.
        let channels_last = fill([2, ho, ho, co], 0.13, &d).permute([0, 3, 1, 2]);
        let nchw = Tensor::<4>::from_data(channels_last.to_data(), &d);
        let run = |dy: Tensor<4>, flag: bool| {
            let how: wgrad::How<Flex> =
                (wgrad::columns::<Flex>, Flex::float_matmul, FloatDType::F32);
            let dw = wgrad::weight_backward_in::<Flex>(
                flex(x.clone()),
                flex(w.clone()),
                flex(dy),
                &options,
                how,
                flag,
                |prod| Flex::float_sum_dim(prod, 0),
            )
            .expect("groups 1");
            from_flex(dw)
        };
        let reference = run(nchw.clone(), false);
        for (what, dy, flag) in [
            ("channels-last memory", channels_last.clone(), true),
            ("NCHW memory read as channels-last", nchw.clone(), true),
            ("channels-last memory read as NCHW", channels_last, false),
        ] {
            let err = rel_diff(run(dy, flag), reference.clone());
            assert!(err < 1e-6, "{what}: {ci}->{co} k{k} {hw}px: {err}");
        }
    }
}

/// A weight gradient whose product reads its columns itself (`wgrad::implicit_weight_backward`,
/// as our CUDA kernel does) gives the one with the columns written first, at chunked maps,
/// strides, padding and a channels-last gradient; a 1×1 convolution (columns = input) and a
/// grouped one are declined. The product here makes the columns per chunk from the input, in
/// the `[N, S, co, ci·kk]` order the kernel writes.
#[test]
fn implicit_columns_give_the_weight_gradient_of_written_ones() {
    use burn::backend::Flex;
    use burn::backend::ops::FloatTensorOps;
    use burn::tensor::FloatDType;
    let d = Device::flex();
    use burn::backend::TensorMetadata;
    let product: wgrad::Implicit<Flex> = |g, x, k, out, options| {
        let s = g.shape()[1];
        let cols = wgrad::columns::<Flex>(x, k, out, s, options);
        Some(Flex::float_matmul(g, Flex::float_swap_dims(cols, 2, 3)))
    };
    for (ci, co, k, stride, pad, hw, channels_last) in [
        (5, 6, 3, 1, 1, 32, false),
        (3, 8, 3, 2, 1, 64, false),
        (4, 7, 3, 1, 0, 42, true),
    ] {
        let options = ConvOptions::new([stride, stride], [pad, pad], [1, 1], 1);
        let x = fill([2, ci, hw, hw], 0.31, &d);
        let w = fill([co, ci, k, k], 0.77, &d);
        let ho = (hw + 2 * pad - k) / stride + 1;
        let dy = if channels_last {
            fill([2, ho, ho, co], 0.13, &d).permute([0, 3, 1, 2])
        } else {
            fill([2, co, ho, ho], 0.13, &d)
        };
        let how: wgrad::How<Flex> = (wgrad::columns::<Flex>, Flex::float_matmul, FloatDType::F32);
        let sum = |prod| Flex::float_sum_dim(prod, 0);
        let args = || (flex(x.clone()), flex(w.clone()), flex(dy.clone()));
        let (a, b, c) = args();
        let written =
            wgrad::weight_backward_in::<Flex>(a, b, c, &options, how, channels_last, sum).unwrap();
        let (a, b, c) = args();
        let implicit =
            wgrad::implicit_weight_backward::<Flex>(a, b, c, &options, product, channels_last, sum)
                .expect("a 3×3 convolution without groups");
        let err = rel_diff(from_flex(implicit), from_flex(written));
        assert!(err < 1e-6, "{ci}->{co} k{k} s{stride} {hw}px: {err}");
    }
    let x = fill([2, 4, 16, 16], 0.31, &d);
    for (w, groups) in [
        (fill([6, 4, 1, 1], 0.77, &d), 1),
        (fill([4, 2, 3, 3], 0.77, &d), 2),
    ] {
        let options = ConvOptions::new([1, 1], [0, 0], [1, 1], groups);
        let ho = 17 - w.dims()[2];
        let dy = fill([2, w.dims()[0], ho, ho], 0.13, &d);
        let sum = |prod| Flex::float_sum_dim(prod, 0);
        let declined = wgrad::implicit_weight_backward::<Flex>(
            flex(x.clone()),
            flex(w),
            flex(dy),
            &options,
            product,
            false,
            sum,
        );
        assert!(declined.is_none(), "groups {groups}");
    }
}

/// The bias operation's gradients are those of Burn's broadcasting add; and the check can fail:
/// a bias gradient that left out one image would not pass.
#[test]
fn add_bias_has_the_gradients_of_burns_broadcast_add() {
    let d = device();
    let run = |ours: bool| {
        let y = fill([3, 5, 7, 4], 0.41, &d).require_grad();
        let b = Tensor::<1>::from_floats([0.5, -1.0, 2.0, 0.25, -0.75], &d).require_grad();
        let out = if ours {
            add_bias(y.clone(), Some(b.clone()))
        } else {
            y.clone() + b.clone().reshape([1, 5, 1, 1])
        };
        let grads = (out.clone() * fill([3, 5, 7, 4], 1.3, &d)).sum().backward();
        (
            out.inner(),
            y.grad(&grads).unwrap(),
            b.grad(&grads).unwrap(),
        )
    };
    let (ours, burns) = (run(true), run(false));
    assert!(rel_diff(ours.0, burns.0) < 1e-7, "output");
    assert!(rel_diff(ours.1, burns.1) < 1e-7, "input gradient");
    assert!(
        rel_diff(ours.2.clone(), burns.2.clone()) < 1e-6,
        "bias gradient"
    );
    let g = fill([3, 5, 7, 4], 1.3, &d).inner();
    let partial = g
        .narrow(0, 0, 2)
        .sum_dim(3)
        .sum_dim(2)
        .sum_dim(0)
        .reshape([5]);
    assert!(rel_diff(partial, burns.2) > 1e-3, "control");
}

/// The SiLU operation's values and gradients are Burn's `silu`'s; a control with the derivative
/// of `x · σ(x)` taken as `σ(x)` alone fails the same bound.
#[test]
fn silu_has_the_values_and_gradients_of_burns() {
    use burn::tensor::activation::{sigmoid, silu as burns_silu};
    let d = device();
    let x0 = fill([2, 3, 5, 7], 0.73, &d) * 3.0;
    let probe = fill([2, 3, 5, 7], 1.7, &d);
    let run = |ours: bool| {
        let x = x0.clone().detach().require_grad();
        let y = if ours {
            silu(x.clone())
        } else {
            burns_silu(x.clone())
        };
        let grads = (y.clone() * probe.clone()).sum().backward();
        (y.inner(), x.grad(&grads).unwrap())
    };
    let (ours, burns) = (run(true), run(false));
    assert!(rel_diff(ours.0, burns.0) < 1e-6, "output");
    assert!(rel_diff(ours.1, burns.1.clone()) < 1e-6, "gradient");
    let wrong = sigmoid(x0.inner()) * probe.inner();
    assert!(rel_diff(wrong, burns.1) > 1e-2, "control");
}
