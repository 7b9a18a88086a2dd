//! The depthwise kernels (`kernels/depthwise.rs`) against the operations they replace: Burn's
//! direct convolution in FP32 (on operands rounded to BF16 for the autocast forward) for the
//! forward, Burn's direct transposed convolution in FP32 for the data gradient, the im2col
//! product and reductions of `model::ops::wgrad` for the weight gradient. Odd sizes, batches of
//! 1 and 3, stride 2, dilation, padding other than k/2, a 5×5 kernel, NHWC-strided and BF16
//! inputs, and positions enough for several partial sums per channel; two runs give the same
//! bits.

use super::{cube, cube_values as values, cuda, rel_values};
use burn::backend::ops::{ConvOptions, FloatTensorOps};
use burn::prelude::*;
use burn::tensor::{DType, Distribution, FloatDType};
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::conv::{self, ConvStrategy};
use burnpose::model::ops::{depthwise, wgrad};

#[test]
#[ignore = "needs a CUDA GPU"]
fn depthwise_gradients_match_the_operations_they_replace_on_cuda() {
    let d = cuda();
    d.seed(23);
    // (batch, channels, kernel, stride, padding, dilation, height, width)
    let cases = [
        (4, 64, 3, 1, 1, 1, 80, 80),
        (3, 5, 3, 1, 1, 1, 53, 37),
        (1, 7, 3, 2, 1, 1, 33, 17),
        (3, 6, 5, 1, 2, 1, 9, 13),
        (2, 3, 3, 1, 2, 2, 21, 19),
        (2, 4, 3, 2, 0, 1, 30, 26),
        (1, 2, 3, 1, 1, 1, 1, 1),
    ];
    for (n, c, k, s, p, dl, h, w) in cases {
        let options = ConvOptions::new([s, s], [p, p], [dl, dl], c);
        let reach = dl * (k - 1) + 1;
        let out = [(h + 2 * p - reach) / s + 1, (w + 2 * p - reach) / s + 1];
        let what = format!("n{n} c{c} k{k} s{s} p{p} d{dl} {h}x{w}");
        let weight = Tensor::<4>::random([c, 1, k, k], Distribution::Normal(0.0, 1.0), &d);
        let grad = Tensor::<4>::random([n, c, out[0], out[1]], Distribution::Normal(0.0, 1.0), &d);
        let plain = Tensor::<4>::random([n, c, h, w], Distribution::Normal(0.0, 1.0), &d);
        let nhwc = Tensor::<4>::random([n, h, w, c], Distribution::Normal(0.0, 1.0), &d)
            .permute([0, 3, 1, 2]);
        let half = plain.clone().cast(FloatDType::BF16);
        let shape = plain.shape();
        assert!(
            depthwise::is_depthwise(c, &weight.shape(), &options),
            "{what}"
        );

        // Data gradient: Burn's direct kernel in FP32 as the reference.
        let reference = values(
            conv::conv_data_backward(
                cube(grad.clone()),
                cube(weight.clone()),
                shape.clone(),
                options.clone(),
                ConvStrategy::Direct,
            )
            .unwrap(),
        );
        let run = || {
            depthwise::data_grad(
                cube(grad.clone()),
                cube(weight.clone()),
                shape.clone(),
                &options,
            )
        };
        let (a, b) = (run(), run());
        assert_eq!(a.dtype, DType::F32);
        let (a, b) = (values(a), values(b));
        assert!(
            a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{what}: dx not reproducible"
        );
        assert!(
            a.iter().filter(|v| **v != 0.0).count() > a.len() / 2,
            "{what}: dx mostly zero"
        );
        let e = rel_values(&a, &reference);
        assert!(e < 1e-5, "{what}: dx differs from Burn's by {e}");

        // Forward: Burn's direct kernel in FP32 as the reference, on the operands as given and
        // rounded to BF16 first (what autocast convolves); the same values NHWC-strided give the
        // same bits, and rounding changes the result.
        let plain_nhwc = Tensor::<4>::from_data(plain.clone().permute([0, 2, 3, 1]).to_data(), &d)
            .permute([0, 3, 1, 2]);
        let mut by_dtype = Vec::new();
        for dtype in [FloatDType::F32, FloatDType::BF16] {
            let round = |t: &Tensor<4>| t.clone().cast(dtype).cast(FloatDType::F32);
            let reference = values(
                conv::conv_forward::<2>(
                    cube(round(&plain)),
                    cube(round(&weight)),
                    None,
                    options.clone(),
                    ConvStrategy::Direct,
                )
                .unwrap(),
            );
            let run = |x: &Tensor<4>| {
                depthwise::forward(cube(x.clone()), cube(weight.clone()), &options, dtype)
            };
            let y = run(&plain);
            assert_eq!(y.dtype, DType::F32);
            assert_eq!(y.meta.shape().dims::<4>(), [n, c, out[0], out[1]], "{what}");
            let (a, b, t) = (values(y), values(run(&plain)), values(run(&plain_nhwc)));
            assert!(
                a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{what} {dtype:?}: forward not reproducible"
            );
            assert!(
                a.iter().zip(&t).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{what} {dtype:?}: an NHWC-strided input gives other bits"
            );
            let e = rel_values(&a, &reference);
            assert!(
                e < 1e-5,
                "{what} {dtype:?}: forward differs from Burn's by {e}"
            );
            by_dtype.push(a);
        }
        assert!(
            by_dtype[0].iter().zip(&by_dtype[1]).any(|(x, y)| x != y),
            "{what}: rounding to BF16 changed nothing"
        );

        // Weight gradient: the tensor-operation columns, product and reductions as the reference,
        // for an NCHW, an NHWC-strided and a BF16 input.
        for (x, layout) in [(plain.clone(), "NCHW"), (nhwc, "NHWC"), (half, "BF16")] {
            let reference = values(
                wgrad::weight_backward::<CubeBackend>(
                    cube(x.clone()),
                    cube(weight.clone()),
                    cube(grad.clone()),
                    &options,
                    wgrad::columns::<CubeBackend>,
                    CubeBackend::float_matmul,
                )
                .unwrap(),
            );
            let run =
                || depthwise::weight_grad(cube(x.clone()), cube(grad.clone()), [k, k], &options);
            let (a, b) = (values(run()), values(run()));
            assert!(
                a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{what} {layout}: dw not reproducible"
            );
            assert!(
                a.iter().any(|v| *v != 0.0),
                "{what} {layout}: weight gradient all zero"
            );
            let e = rel_values(&a, &reference);
            assert!(
                e < 1e-5,
                "{what} {layout}: dw differs from the tensor operations by {e}"
            );
        }
    }
}
