//! Weight gradients from BF16 operands (`model::ops::wgrad::choose_reduced`): at every
//! weight-gradient shape of the seed's step, within BF16's rounding of the FP32-operand
//! gradient and the same bits twice; and the recorded step with them byte-identical to native.
//! Off by default; each test turns it on and off again.

use super::replay::assert_parity_of;
use super::{cuda, rel_values, values};
use burn::prelude::*;
use burn::tensor::{Distribution, FloatDType};
use burnpose::model::ops::trace::{ConvCall, Pass};
use burnpose::model::ops::wgrad;

/// Turns the reduced operands on for its lifetime (off again even when a test fails).
struct Reduced;

impl Reduced {
    fn on() -> Self {
        wgrad::choose_reduced(true);
        Self
    }
}

impl Drop for Reduced {
    fn drop(&mut self) {
        wgrad::choose_reduced(false);
    }
}

/// BF16 keeps 8 bits of mantissa: each operand is off by up to 2⁻⁹ of itself, so a sum of
/// products of random-signed values lands within a few tenths of a percent of the largest
/// gradient value. 1e-2 leaves room and still catches a wrong layout or a lost chunk (errors
/// of order 1).
const BOUND: f32 = 1e-2;

#[test]
#[ignore = "needs a CUDA GPU"]
fn reduced_operands_give_the_weight_gradient_at_every_seed_shape() {
    let d = cuda();
    let cfg = burnpose::config::Config::load(std::path::Path::new("configs/bench_seed.toml"))
        .expect("configs/bench_seed.toml");
    let calls: Vec<ConvCall> = burnpose::train::precompile::step_convolutions(&cfg)
        .into_iter()
        .map(|(c, _)| c)
        .filter(|c| c.groups == 1 && c.weight_grad && c.reduced == Some(FloatDType::BF16))
        .collect();
    assert!(
        calls.len() > 40,
        "only {} BF16 weight gradients traced",
        calls.len()
    );
    let mut failures = vec![];
    let mut worst = 0f32;
    for call in &calls {
        let random =
            |dims: [usize; 4]| Tensor::<4>::random(dims, Distribution::Normal(0.0, 1.0), &d);
        let (x, w, grad) = (
            random(call.input),
            Tensor::<4>::zeros(call.weight, &d),
            random(call.output()),
        );
        let run = |reduced: bool| {
            wgrad::choose_reduced(reduced);
            let dw = values(call.launch(Pass::WeightGrad, &x, &w, &grad));
            wgrad::choose_reduced(false);
            dw
        };
        let reference = run(false);
        let (a, b) = (run(true), run(true));
        let err = rel_values(&a, &reference);
        worst = worst.max(err);
        println!(
            "{:?} {:?} s{}: error {err:.2e}",
            call.input, call.weight, call.stride[0]
        );
        if err.is_nan() || err >= BOUND {
            failures.push(format!("{:?} {:?}: error {err}", call.input, call.weight));
        }
        // Rounding must have happened: equal to the FP32 operands' gradient means the switch
        // did not reach the kernels.
        if err == 0.0 {
            failures.push(format!("{:?} {:?}: not reduced", call.input, call.weight));
        }
        if a != b {
            failures.push(format!(
                "{:?} {:?}: two runs differ",
                call.input, call.weight
            ));
        }
    }
    println!("{} shapes, worst error {worst:.2e}", calls.len());
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn reduced_operands_match_native_in_the_recorded_step_bf16() {
    let _on = Reduced::on();
    assert_parity_of("pose-one-graph", "bf16");
}
