//! Our fused BatchNorm + SiLU (`kernels/batch_norm*.rs`) against Burn's operations and against
//! itself across layouts on CUDA: values, gradients, running statistics, bits where the same
//! expressions run, and the time of one forward+backward (median of 5, alternating).

use super::cuda;
use super::kernels::{median, rel, rel_vec};
use burn::module::Param;
use burn::nn::BatchNormConfig;
use burn::prelude::*;
use burn::tensor::Distribution;
use burnpose::model::ops;
use std::time::Instant;

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
