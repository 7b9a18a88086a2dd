//! The convolution forward split by taps (`model::ops::conv_taps`, `bench-step --tap-split`)
//! against Burn's FP32 convolution on the CPU and against the implicit GEMM it replaces.

use super::kernels::rel_vec;
use super::{cuda, values};
use burn::prelude::*;
use burn::tensor::{Distribution, FloatDType};
use burnpose::model::ops;
use burnpose::model::ops::conv_taps;

/// At the seed's 20×20 shapes (256 → 85, 64 → 64, 85 → 85 channels, 3×3), an odd size with
/// stride 2, an odd batch and a 5×5 kernel with dilation 2, the BF16 forward and data gradient
/// by taps are within BF16's bound (2e-2 of the largest value) of the FP32 convolution on the
/// CPU and within 1e-2 of the implicit GEMM's (whose padded results are rounded to BF16), and
/// give the same bits twice. Each case is one the split takes; it is off again afterwards.
#[test]
#[ignore = "needs a CUDA GPU"]
fn convolutions_by_taps_match_the_reference_on_cuda() {
    let (cpu, gpu) = (Device::flex(), cuda());
    cpu.seed(47);
    let mut failures = vec![];
    for (n, ci, co, k, stride, dilation, hw) in [
        (4, 256, 85, 3, 1, 1, 20),
        (4, 64, 64, 3, 1, 1, 20),
        (4, 85, 85, 3, 1, 1, 20),
        (3, 64, 128, 3, 2, 1, 21),
        (3, 24, 40, 5, 1, 2, 13),
    ] {
        let x = Tensor::<4>::random([n, ci, hw, hw], Distribution::Normal(0.0, 1.0), &cpu);
        let scale = 1.0 / ((ci * k * k) as f64).sqrt();
        let w = Tensor::<4>::random([co, ci, k, k], Distribution::Normal(0.0, scale), &cpu);
        let pad = dilation * (k - 1) / 2;
        let options = burn::backend::ops::ConvOptions::new([stride; 2], [pad; 2], [dilation; 2], 1);
        let out = ops::conv::output_len(hw, k, (pad, pad), stride, dilation);
        let probe = Tensor::<4>::random([n, co, out, out], Distribution::Normal(0.0, 1.0), &cpu);
        // The output and the input's gradient of `(y · probe).sum()`: Burn's FP32 convolution
        // on the CPU, or ours in BF16 on CUDA.
        let run = |device: &Device, ours: bool| {
            let d = device.clone().autodiff();
            let x = Tensor::<4>::from_data(x.to_data(), &d).require_grad();
            let w = Tensor::<4>::from_data(w.to_data(), &d);
            let y = if ours {
                ops::conv2d_in(x.clone(), w, options.clone(), FloatDType::BF16)
            } else {
                burn::tensor::module::conv2d(x.clone(), w, None, options.clone())
            };
            let p = Tensor::<4>::from_data(probe.to_data(), &d);
            let grads = (y.clone() * p).sum().backward();
            [
                values(y.inner()),
                values(x.grad(&grads).expect("the input's gradient")),
            ]
        };
        let reference = run(&cpu, false);
        conv_taps::choose(n * hw * hw);
        assert!(conv_taps::takes([k, k], n * out * out, &options));
        let (taps, again) = (run(&gpu, true), run(&gpu, true));
        conv_taps::choose(0);
        let gemm = run(&gpu, true);
        let what = format!("{n}×{ci}×{hw}² → {co} k{k} s{stride} d{dilation}");
        for (i, name) in ["y", "dx"].iter().enumerate() {
            let errs = [
                rel_vec(&taps[i], &reference[i]),
                rel_vec(&taps[i], &gemm[i]),
            ];
            println!(
                "taps {what} {name}: error against FP32 {:.2e}, against the GEMM {:.2e}",
                errs[0], errs[1]
            );
            if errs.iter().any(|e| e.is_nan()) || errs[0] >= 2e-2 || errs[1] >= 1e-2 {
                failures.push(format!("{what} {name}: {errs:?}"));
            }
            if taps[i]
                .iter()
                .zip(&again[i])
                .any(|(a, b)| a.to_bits() != b.to_bits())
            {
                failures.push(format!("{what} {name}: two runs differ"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
