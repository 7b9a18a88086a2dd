//! The convolution forward split by taps (`model::ops::conv_taps`, `bench-step --tap-split`)
//! against Burn's FP32 convolution on the CPU and against the implicit GEMM it replaces.

use super::kernels::rel_vec;
use super::{cuda, values};
use burn::prelude::*;
use burn::tensor::{Distribution, FloatDType};
use burnpose::model::ops;
use burnpose::model::ops::conv_taps;

/// At the seed's 20×20 shapes (256 → 85, 64 → 64, 85 → 85 channels, 3×3), an odd size with
/// stride 2, an odd batch and a 5×5 kernel with dilation 2, the BF16 forward by taps is within
/// BF16's bound (2e-2 of the largest value) of the FP32 convolution on the CPU and within 1e-2
/// of the implicit GEMM's (whose padded outputs are rounded to BF16), and gives the same bits
/// twice. Each case is one the split takes; it is off again afterwards.
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
        let reference = values(burn::tensor::module::conv2d(
            x.clone(),
            w.clone(),
            None,
            options.clone(),
        ));
        let (xg, wg) = (
            Tensor::<4>::from_data(x.into_data(), &gpu),
            Tensor::<4>::from_data(w.into_data(), &gpu),
        );
        let run = || {
            values(ops::conv2d_in(
                xg.clone(),
                wg.clone(),
                options.clone(),
                FloatDType::BF16,
            ))
        };
        let out = ops::conv::output_len(hw, k, (pad, pad), stride, dilation);
        conv_taps::choose(n * out * out);
        assert!(conv_taps::takes([k, k], n * out * out, &options));
        let (taps, again) = (run(), run());
        conv_taps::choose(0);
        let gemm = run();
        let what = format!("{n}×{ci}×{hw}² → {co} k{k} s{stride} d{dilation}");
        let errs = [rel_vec(&taps, &reference), rel_vec(&taps, &gemm)];
        println!(
            "taps {what}: error against FP32 {:.2e}, against the GEMM {:.2e}",
            errs[0], errs[1]
        );
        if errs.iter().any(|e| e.is_nan()) || errs[0] >= 2e-2 || errs[1] >= 1e-2 {
            failures.push(format!("{what}: {errs:?}"));
        }
        if taps
            .iter()
            .zip(&again)
            .any(|(a, b)| a.to_bits() != b.to_bits())
        {
            failures.push(format!("{what}: two runs differ"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
