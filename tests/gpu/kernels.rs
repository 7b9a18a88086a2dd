//! Our convolution and BatchNorm-training operations (`model::ops`) against Burn's on CUDA:
//! values and gradients, plus the time of one forward+backward of each (median of 5, alternating).

use super::cuda;
use burn::module::Param;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{BatchNormConfig, PaddingConfig2d};
use burn::prelude::*;
use burn::tensor::{Distribution, FloatDType};
use burnpose::model::ops;
use std::time::Instant;

/// Largest absolute difference relative to the largest reference value.
fn rel(a: Tensor<4>, reference: Tensor<4>) -> f32 {
    let scale = reference
        .clone()
        .abs()
        .max()
        .into_scalar::<f32>()
        .max(1e-12);
    (a - reference).abs().max().into_scalar::<f32>() / scale
}

struct Out {
    y: Tensor<4>,
    dx: Tensor<4>,
    dw: Tensor<4>,
    ms: f64,
}

fn conv_run(conv: &Conv2d, x: &Tensor<4>, dtype: FloatDType, fast: bool, device: &Device) -> Out {
    let x = x.clone().detach().require_grad();
    let w = conv.weight.val();
    device.sync().unwrap();
    let t = Instant::now();
    // Reduced precision runs as autocast does: one conv_in operation on the FP32 operands.
    let y = match (fast, dtype) {
        (true, FloatDType::F32) => ops::conv2d(x.clone(), w.clone(), ops::conv_options(conv)),
        (true, _) => ops::conv2d_in(x.clone(), w.clone(), ops::conv_options(conv), dtype),
        (false, _) => burn::tensor::module::conv2d(
            x.clone().cast(dtype),
            w.clone().cast(dtype),
            None,
            ops::conv_options(conv),
        )
        .cast(FloatDType::F32),
    };
    let probe = y.clone().sin();
    let grads = (y.clone() * probe.detach()).sum().backward();
    let dx = x.grad(&grads).unwrap();
    let dw = w.grad(&grads).unwrap();
    device.sync().unwrap();
    let ms = t.elapsed().as_secs_f64() * 1e3;
    Out {
        y: y.inner(),
        dx,
        dw,
        ms,
    }
}

/// A `k×k` convolution without bias, "same" padding, its weight a leaf that autodiff tracks
/// only where a test asks.
fn test_conv(channels: [usize; 2], k: usize, stride: usize, groups: usize, d: &Device) -> Conv2d {
    let conv = Conv2dConfig::new(channels, [k, k])
        .with_stride([stride, stride])
        .with_groups(groups)
        .with_padding(PaddingConfig2d::Explicit(k / 2, k / 2, k / 2, k / 2))
        .with_bias(false)
        .init(d);
    Conv2d {
        weight: Param::from_tensor(conv.weight.val().detach()),
        ..conv
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fast_convolutions_match_stock_on_cuda() {
    let d = cuda().autodiff();
    d.seed(5);
    // (c_in, c_out, kernel, stride, groups, size): layers of the nano model at batch 4, 640 px.
    let shapes = [
        (3, 16, 3, 2, 1, 640),
        (16, 32, 3, 2, 1, 320),
        (32, 32, 1, 1, 1, 160),
        (64, 64, 3, 1, 1, 80),
        (128, 128, 3, 2, 1, 40),
        (64, 64, 3, 1, 64, 80),
        (256, 256, 1, 1, 1, 20),
        // The pose head's keypoint branch: 85 channels, padded to 88 for the GEMM; its 1×1
        // predictors (85 → 51, 85 → 34) and a one-class predictor; an odd size.
        (64, 85, 3, 1, 1, 80),
        (85, 85, 3, 1, 1, 40),
        (85, 51, 1, 1, 1, 80),
        (85, 34, 1, 1, 1, 20),
        (64, 1, 1, 1, 1, 40),
        (85, 85, 3, 1, 1, 37),
    ];
    let mut failures = vec![];
    for (ci, co, k, st, g, hw) in shapes {
        let conv = test_conv([ci, co], k, st, g, &d);
        let x = Tensor::<4>::random([4, ci, hw, hw], Distribution::Normal(0.0, 1.0), &d);
        let reference = conv_run(&conv, &x, FloatDType::F32, false, &d);
        for dtype in [FloatDType::F32, FloatDType::BF16] {
            let (mut fast_ms, mut stock_ms) = (vec![], vec![]);
            let (mut fast, mut stock) = (None, None);
            for _ in 0..5 {
                let f = conv_run(&conv, &x, dtype, true, &d);
                fast_ms.push(f.ms);
                fast = Some(f);
                let s = conv_run(&conv, &x, dtype, false, &d);
                stock_ms.push(s.ms);
                stock = Some(s);
            }
            let (f, s) = (fast.unwrap(), stock.unwrap());
            let errs = |o: Out| {
                [
                    rel(o.y, reference.y.clone()),
                    rel(o.dx, reference.dx.clone()),
                    rel(o.dw, reference.dw.clone()),
                ]
            };
            let (fe, se) = (errs(f), errs(s));
            println!(
                "conv {ci}->{co} k{k} s{st} g{g} {hw}px {dtype:?}: fast {:.3} ms, stock {:.3} ms; \
                 error vs stock FP32 (y, dx, dw) fast {fe:?} stock {se:?}",
                median(fast_ms),
                median(stock_ms)
            );
            for (i, &e) in fe.iter().enumerate() {
                // FP32 on tensor cores is TF32 (10-bit mantissa, FP32 accumulation), as PyTorch's
                // default for convolutions. BF16 is bounded absolutely (measured ≤ 1.1 %): Burn's
                // BF16 weight gradient accumulates in BF16 (up to 98 % off) and is printed only.
                let bound = match dtype {
                    FloatDType::F32 => 1e-2,
                    _ => 2e-2,
                };
                if e >= bound {
                    failures.push(format!(
                        "conv {ci}->{co} k{k} s{st} g{g} {dtype:?} output {i}: {e} >= {bound}"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Every implicit-GEMM routine `bench-conv --routines` compares computes the reduced-precision
/// convolution and its data gradient within BF16's bound of the FP32 reference, at odd channel
/// counts (85: padded to 88) and an odd size; the default routine is among them.
#[test]
#[ignore = "needs a CUDA GPU"]
fn every_conv_routine_matches_the_reference_on_cuda() {
    use burnpose::model::ops::conv::routine;
    let d = cuda().autodiff();
    d.seed(9);
    let mut failures = vec![];
    for (ci, co, k, st, hw) in [(85, 85, 3, 1, 37), (64, 85, 3, 1, 20), (48, 64, 1, 1, 23)] {
        let conv = test_conv([ci, co], k, st, 1, &d);
        let x = Tensor::<4>::random([3, ci, hw, hw], Distribution::Normal(0.0, 1.0), &d);
        let reference = conv_run(&conv, &x, FloatDType::F32, false, &d);
        for (name, _, _) in routine::ROUTINES {
            routine::choose(name).unwrap();
            let o = conv_run(&conv, &x, FloatDType::BF16, true, &d);
            let errs = [
                rel(o.y, reference.y.clone()),
                rel(o.dx, reference.dx.clone()),
            ];
            println!("{name} conv {ci}->{co} k{k} {hw}px: error (y, dx) {errs:?}");
            if errs.iter().any(|e| e.is_nan() || *e >= 2e-2) {
                failures.push(format!("{name} conv {ci}->{co} k{k} {hw}px: {errs:?}"));
            }
        }
    }
    routine::choose(routine::ROUTINES[routine::DEFAULT].0).unwrap();
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fast_batch_norm_matches_stock_on_cuda() {
    let d = cuda().autodiff();
    d.seed(6);
    for (c, hw) in [(16, 320), (64, 80), (256, 20)] {
        let bn = BatchNormConfig::new(c).with_epsilon(1e-3).init(&d);
        let x = Tensor::<4>::random([4, c, hw, hw], Distribution::Normal(0.3, 2.0), &d);
        let run = |fast: bool| {
            let x = x.clone().require_grad();
            d.sync().unwrap();
            let t = Instant::now();
            let y = if fast {
                ops::batch_norm_act(&bn, x.clone(), false)
            } else {
                bn.forward(x.clone())
            };
            let grads = (y.clone() * y.clone().cos().detach()).sum().backward();
            let dx = x.grad(&grads).unwrap();
            let dg = bn.gamma.val().grad(&grads).unwrap();
            d.sync().unwrap();
            (y.inner(), dx, dg, t.elapsed().as_secs_f64() * 1e3)
        };
        let (mut fast_ms, mut stock_ms) = (vec![], vec![]);
        let (mut f, mut s) = (None, None);
        for _ in 0..5 {
            let a = run(true);
            fast_ms.push(a.3);
            f = Some(a);
            let b = run(false);
            stock_ms.push(b.3);
            s = Some(b);
        }
        let (f, s) = (f.unwrap(), s.unwrap());
        let (ey, edx) = (rel(f.0, s.0), rel(f.1, s.1));
        let edg = (f.2.clone() - s.2.clone()).abs().max().into_scalar::<f32>()
            / s.2.abs().max().into_scalar::<f32>();
        println!(
            "bn [4, {c}, {hw}, {hw}]: fast {:.3} ms, stock {:.3} ms; error y {ey}, dx {edx}, dgamma {edg}",
            median(fast_ms),
            median(stock_ms)
        );
        assert!(ey < 1e-4 && edx < 1e-3 && edg < 1e-3, "{ey} {edx} {edg}");
    }
}

/// BatchNorm inference (+ SiLU) as one kernel matches Burn's `BatchNorm::forward` (+ `silu`)
/// with running statistics and affine parameters away from their initial values: odd sizes and
/// an NHWC-strided input. The kernel multiplies by `1/√(var+ε)` where Burn divides by `√(var+ε)`,
/// so some bits differ: that they do shows the kernel ran rather than Burn's operations.
#[test]
#[ignore = "needs a CUDA GPU"]
fn batch_norm_inference_kernel_matches_burns_on_cuda() {
    use burn::module::RunningState;
    let d = cuda();
    d.seed(8);
    for (c, h, w, nhwc) in [(16, 37, 53, false), (85, 20, 20, true), (3, 7, 5, false)] {
        let normal =
            |m: f32, s: f32| Tensor::<1>::random([c], Distribution::Normal(m as f64, s as f64), &d);
        let mut bn = BatchNormConfig::new(c).with_epsilon(1e-3).init(&d);
        bn.gamma = Param::from_tensor(normal(1.0, 0.3));
        bn.beta = Param::from_tensor(normal(0.0, 0.5));
        bn.running_mean = RunningState::new(normal(0.2, 1.0));
        bn.running_var = RunningState::new(normal(0.0, 1.0).abs() + 0.05);
        let x = if nhwc {
            Tensor::<4>::random([3, h, w, c], Distribution::Normal(0.3, 2.0), &d)
                .permute([0, 3, 1, 2])
        } else {
            Tensor::<4>::random([3, c, h, w], Distribution::Normal(0.3, 2.0), &d)
        };
        for act in [false, true] {
            ops::set_conv_bn_ops(ops::ConvBnOps::Fast);
            let fast = ops::batch_norm_act(&bn, x.clone(), act);
            ops::set_conv_bn_ops(ops::ConvBnOps::Stock);
            let stock = ops::batch_norm_act(&bn, x.clone(), act);
            ops::set_conv_bn_ops(ops::ConvBnOps::Fast);
            let e = rel(fast.clone(), stock.clone());
            let bits = |t: Tensor<4>| -> Vec<u32> {
                t.into_data()
                    .try_to_vec::<f32>()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect()
            };
            let differ = bits(fast)
                .iter()
                .zip(bits(stock))
                .filter(|(a, b)| **a != *b)
                .count();
            println!(
                "bn inference [3, {c}, {h}, {w}] nhwc {nhwc} act {act}: error {e}, {differ} values differ in bits"
            );
            assert!(e < 1e-5, "[3, {c}, {h}, {w}] act {act}: {e}");
            assert!(
                differ > 0,
                "[3, {c}, {h}, {w}] act {act}: the kernel did not run"
            );
        }
    }
}

/// Output, input/γ/β gradients and new running statistics of BatchNorm (+ SiLU) in training,
/// under a fixed loss, with the operations `kernels` chooses.
fn bn_act_case(x: &Tensor<4>, act: bool, choice: ops::ConvBnOps, d: &Device) -> [Vec<f32>; 6] {
    ops::set_conv_bn_ops(choice);
    let c = x.dims()[1];
    let mut bn = BatchNormConfig::new(c)
        .with_epsilon(1e-3)
        .with_momentum(0.03)
        .init(d);
    // The same γ and β in every call (a fresh random draw would differ between the arms).
    let gamma: Vec<f32> = (0..c).map(|i| 0.5 + (i as f32 * 0.37) % 1.5).collect();
    let beta: Vec<f32> = (0..c).map(|i| (i as f32 * 0.61) % 2.0 - 1.0).collect();
    bn.gamma = Param::from_tensor(Tensor::from_floats(gamma.as_slice(), d));
    bn.beta = Param::from_tensor(Tensor::from_floats(beta.as_slice(), d));
    let x = x.clone().require_grad();
    let y = ops::batch_norm_act(&bn, x.clone(), act);
    let probe = (y.clone() * 1.3).sin().detach();
    let grads = (y.clone() * probe).sum().backward();
    let v = |t: Tensor<1>| {
        t.into_data()
            .convert::<f32>()
            .try_into_vec::<f32>()
            .unwrap()
    };
    let flat = |t: Tensor<4>| {
        let n = t.shape().num_elements();
        v(t.reshape([n]))
    };
    let out = [
        flat(y.inner()),
        flat(x.grad(&grads).unwrap()),
        v(bn.gamma.val().grad(&grads).unwrap()),
        v(bn.beta.val().grad(&grads).unwrap()),
        v(bn.running_mean.value_sync()),
        v(bn.running_var.value_sync()),
    ];
    ops::set_conv_bn_ops(ops::ConvBnOps::Fast);
    out
}

/// Largest |a − b| over the largest |b|.
fn rel_vec(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_batch_norm_silu_matches_the_staged_operations_on_cuda() {
    let d = cuda().autodiff();
    d.seed(11);
    // Odd sizes, a single value per channel, one image, the 640-px stem layer, and an
    // NHWC-strided input (conv outputs arrive that way).
    let shapes = [
        [3, 5, 53, 37],
        [4, 16, 320, 320],
        [1, 7, 1, 1],
        [2, 130, 9, 11],
    ];
    for (i, shape) in shapes.into_iter().enumerate() {
        let x = Tensor::<4>::random(shape, Distribution::Normal(0.4, 1.7), &d);
        let nhwc = Tensor::<4>::random(
            [shape[0], shape[2], shape[3], shape[1]],
            Distribution::Normal(-0.3, 0.8),
            &d,
        )
        .permute([0, 3, 1, 2]);
        for (x, layout) in [(x, "NCHW"), (nhwc, "NHWC")] {
            for act in [true, false] {
                let fused = bn_act_case(&x, act, ops::ConvBnOps::Fast, &d);
                let again = bn_act_case(&x, act, ops::ConvBnOps::Fast, &d);
                let staged = bn_act_case(&x, act, ops::ConvBnOps::Staged, &d);
                let names = ["y", "dx", "dgamma", "dbeta", "running mean", "running var"];
                let errors: Vec<f32> = (0..6).map(|k| rel_vec(&fused[k], &staged[k])).collect();
                println!("bn_act {shape:?} {layout} act={act}: errors {names:?} {errors:?}");
                // One value per channel has zero variance: y = β and the gradients vanish;
                // only compare where there is something to compare.
                let bound = [1e-5, 1e-3, 1e-3, 1e-4, 1e-5, 1e-5];
                for k in 0..6 {
                    assert!(
                        errors[k] <= bound[k] || (i == 2 && k == 1),
                        "{shape:?} {layout} act={act}: {} off by {}",
                        names[k],
                        errors[k]
                    );
                    assert!(
                        fused[k].iter().all(|v| v.is_finite()),
                        "{} not finite",
                        names[k]
                    );
                }
                assert_eq!(
                    fused, again,
                    "{shape:?} {layout}: two runs differ (not deterministic)"
                );
                // The running statistics moved from their start (mean 0, variance 1): the
                // comparison above is of updated values.
                assert!(
                    fused[4].iter().any(|&m| m != 0.0),
                    "running mean not updated"
                );
                assert!(
                    fused[5].iter().any(|&v| v != 1.0),
                    "running variance not updated"
                );
            }
        }
    }
}

/// The channels-last BatchNorm sums (`kernels/batch_norm_nhwc.rs`) take what convolutions hand
/// BatchNorm, a dense channels-last input: the incoming gradient's own layout changes no bit of
/// any result, two runs are equal, output and input gradient come out NCHW as for any input, and
/// all of it matches the same values laid out NCHW (`batch_norm.rs`'s own sums) to rounding,
/// with statistics whose low bits differ from those sums' (so the channels-last sums ran). The
/// tile kernels (`kernels/batch_norm_tiles.rs`) give the NCHW kernels' bits: the input gradient
/// for either gradient layout (the NCHW one takes `batch_norm.rs`'s kernel), and inference.
#[test]
#[ignore = "needs a CUDA GPU"]
fn channels_last_batch_norm_sums_match_nchw_on_cuda() {
    use super::{cube, cube_values, cube_values_of};
    use burn::module::RunningState;
    use burn::tensor::TensorData;
    use burn_cubecl::CubeBackend;
    use burn_cubecl::tensor::CubeTensor;
    use ops::FastOps;
    let d = cuda();
    d.seed(23);
    ops::set_conv_bn_ops(ops::ConvBnOps::Fast);
    // 40 channels: two channel tiles, the second part-filled, and 29·31 pixels per image (not a
    // multiple of a cube's rows); 5 channels: 8 lanes, 3 idle; the 160-px layer of the seed.
    for [n, c, h, w] in [[3, 40, 29, 31], [2, 5, 64, 70], [4, 32, 160, 160]] {
        let nhwc = |m: f64, s: f64| {
            Tensor::<4>::random([n, h, w, c], Distribution::Normal(m, s), &d).permute([0, 3, 1, 2])
        };
        // The same values, contiguous NCHW.
        let nchw_tensor = |t: &Tensor<4>| {
            let v = t
                .clone()
                .into_data()
                .convert::<f32>()
                .try_into_vec::<f32>()
                .unwrap();
            Tensor::<4>::from_data(TensorData::new(v, [n, c, h, w]), &d)
        };
        let nchw = |t: &Tensor<4>| cube(nchw_tensor(t));
        let (x, g) = (nhwc(0.4, 1.7), nhwc(0.0, 0.3));
        let channel =
            |m: f64, s: f64| cube(Tensor::<1>::random([c], Distribution::Normal(m, s), &d));
        let (gamma, beta, running_mean) = (channel(1.0, 0.3), channel(0.0, 0.5), channel(0.1, 0.2));
        let running_var = cube(Tensor::<1>::ones([c], &d));
        for act in [true, false] {
            let run = |x: CubeTensor, g: CubeTensor| {
                let (y, mean, var, new_mean, new_var) = CubeBackend::bn_act_train(
                    x.clone(),
                    gamma.clone(),
                    beta.clone(),
                    running_mean.clone(),
                    running_var.clone(),
                    1e-3,
                    0.03,
                    act,
                );
                let (dx, d_gamma, d_beta) = CubeBackend::bn_act_train_backward(
                    x,
                    gamma.clone(),
                    beta.clone(),
                    mean.clone(),
                    var.clone(),
                    1e-3,
                    act,
                    g,
                );
                let layouts = [y.meta.strides().to_vec(), dx.meta.strides().to_vec()];
                let mut out = vec![cube_values(y), cube_values(dx)];
                for t in [mean, var, new_mean, new_var, d_gamma, d_beta] {
                    out.push(cube_values_of::<1>(t));
                }
                (out, layouts)
            };
            let (last, layouts) = run(cube(x.clone()), cube(g.clone()));
            let case = format!("[{n}, {c}, {h}, {w}] act={act}");
            let (again, _) = run(cube(x.clone()), cube(g.clone()));
            assert_eq!(last, again, "{case}: two runs differ");
            let (nchw_grad, _) = run(cube(x.clone()), nchw(&g));
            assert_eq!(
                last, nchw_grad,
                "{case}: the gradient's layout changed bits"
            );
            let (plain, plain_layouts) = run(nchw(&x), nchw(&g));
            for s in layouts.iter().chain(&plain_layouts) {
                assert!(s[3] == 1 && s[2] == w, "{case}: results not NCHW: {s:?}");
            }
            // Mean or variance: another order of the same sums.
            assert!(
                last[2] != plain[2] || last[3] != plain[3],
                "{case}: the statistics equal the NCHW sums' bit for bit"
            );
            let names = [
                "y",
                "dx",
                "mean",
                "var",
                "running mean",
                "running var",
                "dgamma",
                "dbeta",
            ];
            let bound = [1e-5, 1e-4, 1e-5, 1e-5, 1e-5, 1e-5, 1e-4, 1e-4];
            for k in 0..names.len() {
                let e = rel_vec(&last[k], &plain[k]);
                println!("{case}: {} off the NCHW path by {e}", names[k]);
                assert!(e <= bound[k], "{case}: {} off by {e}", names[k]);
                assert!(
                    last[k].iter().all(|v| v.is_finite()),
                    "{case}: {} not finite",
                    names[k]
                );
            }
        }
        // Inference: the same running statistics for both layouts, so the tile kernel
        // (`batch_norm_tiles.rs`, channels-last in) gives the NCHW kernel's bits.
        let mut bn = BatchNormConfig::new(c).with_epsilon(1e-3).init(&d);
        let normal = |m: f64, s: f64| Tensor::<1>::random([c], Distribution::Normal(m, s), &d);
        bn.gamma = Param::from_tensor(normal(1.0, 0.3));
        bn.beta = Param::from_tensor(normal(0.0, 0.5));
        bn.running_mean = RunningState::new(normal(0.2, 1.0));
        bn.running_var = RunningState::new(normal(0.0, 1.0).abs() + 0.05);
        let bits = |t: Tensor<4>| {
            let v = t
                .into_data()
                .convert::<f32>()
                .try_into_vec::<f32>()
                .unwrap();
            v.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
        };
        for act in [true, false] {
            let tiled = ops::batch_norm_act(&bn, x.clone(), act);
            let plain = ops::batch_norm_act(&bn, nchw_tensor(&x), act);
            assert_eq!(
                bits(tiled),
                bits(plain),
                "[{n}, {c}, {h}, {w}] act={act}: inference bits differ between layouts"
            );
        }
    }
}

/// The im2col kernel gives the columns of the tensor operations it replaced bit for bit: odd
/// sizes, padding, stride 2, dilation, 1×1, BF16 input and an NHWC-strided input.
#[test]
#[ignore = "needs a CUDA GPU"]
fn im2col_kernel_equals_the_tensor_operations_on_cuda() {
    use super::{cube, cube_values};
    use burn::backend::ops::ConvOptions;
    use burn_cubecl::CubeBackend;
    use burn_cubecl::tensor::CubeTensor;
    use ops::{im2col, wgrad};
    let d = cuda();
    d.seed(17);
    let bits = |c: CubeTensor| {
        cube_values(c)
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<u32>>()
    };
    // (channels, kernel, stride, padding, dilation, height, width)
    let cases = [
        (3, 3, 2, 1, 1, 64, 64),
        (5, 3, 1, 1, 1, 53, 37),
        (7, 1, 1, 0, 1, 20, 11),
        (4, 3, 2, 1, 1, 33, 17),
        (6, 5, 1, 2, 1, 9, 13),
        (3, 3, 1, 2, 2, 21, 19),
        (2, 3, 2, 3, 3, 30, 26),
    ];
    for (c, k, s, p, dl, h, w) in cases {
        let options = ConvOptions::new([s, s], [p, p], [dl, dl], 1);
        let reach = dl * (k - 1) + 1;
        let out = [(h + 2 * p - reach) / s + 1, (w + 2 * p - reach) / s + 1];
        let plain = Tensor::<4>::random([2, c, h, w], Distribution::Normal(0.0, 1.0), &d);
        let nhwc = Tensor::<4>::random([2, h, w, c], Distribution::Normal(0.0, 1.0), &d)
            .permute([0, 3, 1, 2]);
        let half = plain.clone().cast(FloatDType::BF16);
        for (x, what) in [(plain, "NCHW"), (nhwc, "NHWC"), (half, "BF16")] {
            let ours = im2col::columns(cube(x.clone()), [k, k], out, &options);
            let reference = wgrad::columns::<CubeBackend>(cube(x), [k, k], out, &options);
            assert_eq!(ours.meta.shape(), reference.meta.shape(), "{what} shape");
            let (a, b) = (bits(ours), bits(reference));
            let nonzero = b.iter().filter(|&&v| v != 0).count();
            assert!(nonzero > b.len() / 2, "{what}: columns mostly zero");
            assert!(
                a == b,
                "c{c} k{k} s{s} p{p} d{dl} {h}x{w} {what}: columns differ"
            );
        }
    }
}

/// The bias gradient through our channel sums equals Burn's broadcast add's, for NCHW and
/// NHWC-strided gradients, odd sizes and one value per channel; two runs give the same bits.
#[test]
#[ignore = "needs a CUDA GPU"]
fn channel_sums_give_burns_bias_gradient_on_cuda() {
    let d = cuda().autodiff();
    d.seed(19);
    for shape in [
        [4, 51, 80, 80],
        [3, 5, 53, 37],
        [1, 7, 1, 1],
        [2, 130, 9, 11],
    ] {
        let [n, c, h, w] = shape;
        let probe = Tensor::<4>::random([n, h, w, c], Distribution::Normal(0.2, 1.5), &d)
            .permute([0, 3, 1, 2]);
        let bias = Tensor::<1>::random([c], Distribution::Normal(0.0, 1.0), &d);
        let run = |ours: bool| {
            let y = Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), &d).require_grad();
            let b = bias.clone().require_grad();
            let out = if ours {
                ops::add_bias(y, Some(b.clone()))
            } else {
                y + b.clone().reshape([1, c, 1, 1])
            };
            let grads = (out * probe.clone()).sum().backward();
            b.grad(&grads)
                .unwrap()
                .into_data()
                .try_to_vec::<f32>()
                .unwrap()
        };
        let (ours, again, burns) = (run(true), run(true), run(false));
        let e = rel_vec(&ours, &burns);
        println!("channel sums {shape:?}: error vs Burn {e}");
        assert!(e < 1e-5, "{shape:?}: bias gradient off by {e}");
        assert_eq!(
            ours, again,
            "{shape:?}: two runs differ (not deterministic)"
        );
    }
}

/// SiLU as one kernel each way equals Burn's `silu` in value and gradient, on a contiguous, a
/// transposed and an odd-sized input.
#[test]
#[ignore = "needs a CUDA GPU"]
fn silu_matches_burns_on_cuda() {
    use burn::tensor::activation::silu;
    let d = cuda().autodiff();
    d.seed(23);
    let base = Tensor::<4>::random([3, 37, 5, 64], Distribution::Normal(0.0, 3.0), &d);
    for (name, x0) in [
        ("contiguous", base.clone()),
        ("transposed", base.clone().swap_dims(1, 3)),
        ("odd", base.slice([0..1, 0..7, 0..3, 0..5])),
    ] {
        let probe = x0.clone().cos().detach();
        let run = |ours: bool| {
            let x = x0.clone().detach().require_grad();
            let y = if ours {
                ops::silu(x.clone())
            } else {
                silu(x.clone())
            };
            let grads = (y.clone() * probe.clone()).sum().backward();
            (y.inner(), x.grad(&grads).unwrap())
        };
        let (ours, burns) = (run(true), run(false));
        let (ey, eg) = (rel(ours.0, burns.0), rel(ours.1, burns.1));
        println!("silu {name}: error y {ey}, dx {eg}");
        assert!(ey < 1e-6 && eg < 1e-5, "{name}: {ey} {eg}");
    }
}
