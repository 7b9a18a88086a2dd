//! Our convolution and BatchNorm-training operations (`model::ops`) against Burn's on CUDA:
//! values and gradients, plus the time of one forward+backward of each (median of 5, alternating).

use super::{cuda, values};
use burn::module::Param;
use burn::nn::PaddingConfig2d;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::prelude::*;
use burn::tensor::{Distribution, FloatDType};
use burnpose::model::ops;
use std::time::Instant;

/// Largest absolute difference relative to the largest reference value.
pub(super) fn rel(a: Tensor<4>, reference: Tensor<4>) -> f32 {
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

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Largest |a − b| over the largest |b|.
pub(super) fn rel_vec(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
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
/// counts (85: padded to 88, the result cropped and cast back) and channel counts a multiple of 8
/// (the GEMM writes FP32 itself), at odd sizes; our own (`own-bf16`, the default) is among them.
#[test]
#[ignore = "needs a CUDA GPU"]
fn every_conv_routine_matches_the_reference_on_cuda() {
    use burnpose::model::ops::conv::routine;
    let d = cuda().autodiff();
    d.seed(9);
    let mut failures = vec![];
    for (ci, co, k, st, hw) in [
        (85, 85, 3, 1, 37),
        (64, 85, 3, 1, 20),
        (48, 64, 1, 1, 23),
        (64, 64, 3, 1, 21),
    ] {
        let conv = test_conv([ci, co], k, st, 1, &d);
        let x = Tensor::<4>::random([3, ci, hw, hw], Distribution::Normal(0.0, 1.0), &d);
        let reference = conv_run(&conv, &x, FloatDType::F32, false, &d);
        for name in routine::ROUTINES.iter().map(|r| r.0).chain([routine::OWN]) {
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
    routine::choose_default();
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Our own BF16 implicit GEMM for the forwards and data gradients (`own-bf16`,
/// `kernels/bf16_conv.cu`, the default): the result and the data gradient within BF16's bound
/// of the FP32 reference and of cubek's routine it falls back to, the same bits twice, at the
/// head's 85 channels (padded to 88, as input and output), a strided 3×3, a 1×1, the first
/// layer's 3 channels (padded to 8) at an odd size, and pixel counts off its 128-pixel tiles.
#[test]
#[ignore = "needs a CUDA GPU"]
fn our_bf16_convolution_matches_the_reference_on_cuda() {
    use burnpose::model::ops::conv::routine;
    let d = cuda().autodiff();
    d.seed(23);
    let mut failures = vec![];
    for (ci, co, k, st, hw) in [
        (85, 85, 3, 1, 37),
        (64, 85, 3, 1, 20),
        (48, 64, 1, 1, 23),
        (64, 128, 3, 2, 41),
        (3, 16, 3, 2, 65),
    ] {
        let conv = test_conv([ci, co], k, st, 1, &d);
        let x = Tensor::<4>::random([3, ci, hw, hw], Distribution::Normal(0.0, 1.0), &d);
        let reference = conv_run(&conv, &x, FloatDType::F32, false, &d);
        routine::choose(routine::ROUTINES[routine::DEFAULT].0).unwrap();
        let default = conv_run(&conv, &x, FloatDType::BF16, true, &d);
        routine::choose(routine::OWN).unwrap();
        let (a, b) = (
            conv_run(&conv, &x, FloatDType::BF16, true, &d),
            conv_run(&conv, &x, FloatDType::BF16, true, &d),
        );
        routine::choose_default();
        let errs = [
            rel(a.y.clone(), reference.y.clone()),
            rel(a.y.clone(), default.y),
            rel(a.dx.clone(), reference.dx.clone()),
            rel(a.dx.clone(), default.dx),
        ];
        println!(
            "own-bf16 {ci}->{co} k{k} s{st} {hw}px: error (y, y default, dx, dx default) {errs:?}"
        );
        if errs.iter().any(|e| e.is_nan() || *e >= 2e-2) {
            failures.push(format!("{ci}->{co} k{k} s{st} {hw}px: {errs:?}"));
        }
        let bits = |t: Tensor<4>| values(t).into_iter().map(f32::to_bits).collect::<Vec<_>>();
        if bits(a.y) != bits(b.y) || bits(a.dx) != bits(b.dx) {
            failures.push(format!("{ci}->{co} k{k} s{st} {hw}px: two runs differ"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Wider channel padding (`conv::gemm::choose_padding` 16 and 32) gives the same convolution:
/// the forward and data gradient within BF16's bound of the FP32 reference at the pose head's
/// 85 channels (padded to 96) as input, output or both, stride 1 and 2, 3×3 and 1×1; and the
/// padding applies (85 channels become 96 at 32, stay 88 at 8).
#[test]
#[ignore = "needs a CUDA GPU"]
fn wider_channel_padding_matches_the_reference_on_cuda() {
    use burnpose::model::ops::conv::gemm;
    let d = cuda().autodiff();
    d.seed(17);
    let mut failures = vec![];
    for multiple in [16, 32] {
        gemm::choose_padding(multiple).unwrap();
        assert_eq!(
            gemm::padded(85),
            85usize.next_multiple_of(multiple),
            "not applied"
        );
        for (ci, co, k, st, hw) in [
            (85, 85, 3, 1, 37),
            (64, 85, 3, 1, 20),
            (85, 64, 1, 1, 23),
            (85, 64, 3, 2, 21),
        ] {
            let conv = test_conv([ci, co], k, st, 1, &d);
            let x = Tensor::<4>::random([3, ci, hw, hw], Distribution::Normal(0.0, 1.0), &d);
            let reference = conv_run(&conv, &x, FloatDType::F32, false, &d);
            let o = conv_run(&conv, &x, FloatDType::BF16, true, &d);
            let errs = [
                rel(o.y, reference.y.clone()),
                rel(o.dx, reference.dx.clone()),
            ];
            println!(
                "padding {multiple}: conv {ci}->{co} k{k} s{st} {hw}px: error (y, dx) {errs:?}"
            );
            if errs.iter().any(|e| e.is_nan() || *e >= 2e-2) {
                failures.push(format!(
                    "padding {multiple}: {ci}->{co} k{k} s{st}: {errs:?}"
                ));
            }
        }
    }
    gemm::choose_padding(8).unwrap();
    assert_eq!(gemm::padded(85), 88);
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Strided BF16 data gradients by the routine's stride-1 GEMM on the zero-dilated output
/// gradient (the default, `routine::choose_strided_by_gemm`) stay within BF16's bound of the FP32
/// reference and of the direct kernel's, at odd sizes (the last row and column of the dilated
/// gradient are zeros there), a multiple of 8 channels and not (16 → 24 padded), 3×3 and 1×1,
/// stride 2.
#[test]
#[ignore = "needs a CUDA GPU"]
fn strided_data_gradients_by_gemm_match_the_reference_on_cuda() {
    use burnpose::model::ops::conv::routine;
    let d = cuda().autodiff();
    d.seed(13);
    let mut failures = vec![];
    for (ci, co, k, hw) in [
        (16, 32, 3, 37),
        (32, 64, 3, 20),
        (20, 16, 3, 21),
        (48, 64, 1, 23),
    ] {
        let conv = test_conv([ci, co], k, 2, 1, &d);
        let x = Tensor::<4>::random([3, ci, hw, hw], Distribution::Normal(0.0, 1.0), &d);
        let reference = conv_run(&conv, &x, FloatDType::F32, false, &d);
        routine::choose_strided_by_gemm(false);
        let direct = conv_run(&conv, &x, FloatDType::BF16, true, &d);
        routine::choose_strided_by_gemm(true);
        let gemm = conv_run(&conv, &x, FloatDType::BF16, true, &d);
        let again = conv_run(&conv, &x, FloatDType::BF16, true, &d);
        let errs = [
            rel(gemm.dx.clone(), reference.dx.clone()),
            rel(gemm.dx.clone(), direct.dx.clone()),
        ];
        println!(
            "conv {ci}->{co} k{k} s2 {hw}px: data gradient error (vs FP32, vs direct) {errs:?}"
        );
        if errs.iter().any(|e| e.is_nan() || *e >= 2e-2) {
            failures.push(format!("conv {ci}->{co} k{k} {hw}px: {errs:?}"));
        }
        let (a, b) = (values(gemm.dx), values(again.dx));
        if a != b {
            failures.push(format!("conv {ci}->{co} k{k} {hw}px: two runs differ"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The im2col kernel gives the columns of the tensor operations it replaced bit for bit: odd
/// sizes, padding, stride 2, dilation, 1×1, BF16 input and an NHWC-strided input, in one chunk
/// and in several.
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
        // One chunk, and the largest count up to 4 that divides the positions.
        let positions = out[0] * out[1];
        let most = (1..=4).rev().find(|s| positions % s == 0).unwrap();
        for (x, what) in [(plain, "NCHW"), (nhwc, "NHWC"), (half, "BF16")] {
            for chunks in [1, most] {
                let ours = im2col::columns(cube(x.clone()), [k, k], out, chunks, &options);
                let reference =
                    wgrad::columns::<CubeBackend>(cube(x.clone()), [k, k], out, chunks, &options);
                assert_eq!(ours.meta.shape(), reference.meta.shape(), "{what} shape");
                let (a, b) = (bits(ours), bits(reference));
                let nonzero = b.iter().filter(|&&v| v != 0).count();
                assert!(nonzero > b.len() / 2, "{what}: columns mostly zero");
                assert!(
                    a == b,
                    "c{c} k{k} s{s} p{p} d{dl} {h}x{w} {what} {chunks} chunks: columns differ"
                );
            }
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

/// SiLU as one kernel each way equals Burn's `silu` in value and gradient, on a contiguous
/// input (read at each value's index), a transposed and an odd-sized one (read by strides).
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

/// `ops::row_sums` on CUDA (one cube per row, not Burn's one unit per row): each row within
/// f32 rounding of its exact sum, the same bits on a second run, at row counts and lengths the
/// step meets (one long row of 28,926 as the clipping norm's, lengths not a multiple of 4, a
/// transposed input); its gradient the incoming row gradient along the row, bit for bit.
#[test]
#[ignore = "needs a CUDA GPU"]
fn row_sums_match_exact_sums_and_repeat_on_cuda() {
    let d = cuda();
    d.seed(31);
    let cases: Vec<(&str, Tensor<2>)> = vec![
        (
            "1x28926",
            Tensor::random([1, 28_926], Distribution::Normal(0.5, 2.0), &d),
        ),
        (
            "1x1607",
            Tensor::random([1, 1_607], Distribution::Normal(0.0, 1.0), &d),
        ),
        (
            "34x859",
            Tensor::random([34, 859], Distribution::Normal(0.0, 1.0), &d),
        ),
        (
            "29x1024",
            Tensor::random([29, 1_024], Distribution::Uniform(0.0, 1.0), &d),
        ),
        (
            "1000x7",
            Tensor::random([1_000, 7], Distribution::Normal(0.0, 1.0), &d),
        ),
        (
            "6x3",
            Tensor::random([6, 3], Distribution::Normal(0.0, 1.0), &d),
        ),
        (
            "transposed 300x64",
            Tensor::random([64, 300], Distribution::Normal(0.0, 1.0), &d).swap_dims(0, 1),
        ),
    ];
    for (name, x) in cases {
        let [r, c] = x.dims();
        let host = values(x.clone());
        let ours = ops::row_sums(x.clone());
        assert_eq!(ours.dims(), [r, 1], "{name}");
        let got = values(ours);
        let again = values(ops::row_sums(x.clone()));
        for (i, row) in host.chunks(c).enumerate() {
            let exact: f64 = row.iter().map(|&v| v as f64).sum();
            let mass: f64 = row.iter().map(|&v| (v as f64).abs()).sum();
            let err = (got[i] as f64 - exact).abs();
            assert!(
                err <= 1e-6 * mass + 1e-30,
                "{name} row {i}: {} vs exact {exact} (|x| sum {mass})",
                got[i]
            );
            assert_eq!(
                got[i].to_bits(),
                again[i].to_bits(),
                "{name} row {i}: runs differ"
            );
        }
        // The gradient: row i's incoming gradient along the whole row.
        let da = d.clone().autodiff();
        let xa = Tensor::<2>::from_data(x.into_data(), &da).require_grad();
        let probe = Tensor::<2>::random([r, 1], Distribution::Normal(0.0, 1.0), &da);
        let grads = (ops::row_sums(xa.clone()) * probe.clone()).sum().backward();
        let g = values(xa.grad(&grads).unwrap());
        let p = values(probe);
        for (i, row) in g.chunks(c).enumerate() {
            assert!(
                row.iter().all(|v| v.to_bits() == p[i].to_bits()),
                "{name} gradient row {i}"
            );
        }
        println!("row_sums {name}: within 1e-6 of the exact sums, two runs equal");
    }
}
