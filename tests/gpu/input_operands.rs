//! `model::ops::input_operands`: the fused BatchNorm's normalising kernel also writes the next
//! convolution's input as its GEMM takes it (channels-last, cast, zero-padded channels): the
//! same values `channels_last` would make from the FP32 output, bit for bit, at shapes with
//! channels that need padding and pixel counts off the tiles; and native and recorded fits end
//! with the same bits with them as without them. Off by default; each test sets the choice it
//! needs and puts the default back.

use super::grad_operands::{OPERAND_SHAPES, assert_hand_off_changes_no_bit, assert_operand_of};
use super::replay::assert_parity_of;
use super::{Choice, cube_values_of, cuda, nhwc_bn_case};
use burn::tensor::FloatDType;
use burn_cubecl::CubeBackend;
use burnpose::model::ops::{self, FastOps, input_operands};

#[test]
#[ignore = "needs a CUDA GPU"]
fn batch_norm_writes_the_input_operand_channels_last_would_make_on_cuda() {
    let d = cuda();
    d.seed(37);
    ops::set_conv_bn_ops(ops::ConvBnOps::Fast);
    for [n, c, h, w] in OPERAND_SHAPES {
        let [x, _, gamma, beta, running_mean, running_var] = nhwc_bn_case(&d, [n, c, h, w]);
        for (act, dtype) in [
            (true, FloatDType::BF16),
            (false, FloatDType::BF16),
            (true, FloatDType::F16),
        ] {
            let case = format!("[{n}, {c}, {h}, {w}] act={act} {dtype:?}");
            let plain = CubeBackend::bn_act_train(
                x.clone(),
                gamma.clone(),
                beta.clone(),
                running_mean.clone(),
                running_var.clone(),
                1e-3,
                0.03,
                act,
            );
            let (out, mean, var, new_mean, new_var, operand) = CubeBackend::bn_act_train_operand(
                x.clone(),
                gamma.clone(),
                beta.clone(),
                running_mean.clone(),
                running_var.clone(),
                1e-3,
                0.03,
                act,
                Some(dtype),
            );
            let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
            let (a, b) = (
                cube_values_of::<4>(plain.0.clone()),
                cube_values_of::<4>(out.clone()),
            );
            assert_eq!(
                bits(a),
                bits(b),
                "{case}: the output moved with the operand"
            );
            for (name, a, b) in [
                ("mean", plain.1, mean),
                ("variance", plain.2, var),
                ("running mean", plain.3, new_mean),
                ("running variance", plain.4, new_var),
            ] {
                let (a, b) = (cube_values_of::<1>(a), cube_values_of::<1>(b));
                assert_eq!(bits(a), bits(b), "{case}: {name} moved with the operand");
            }
            let operand = operand.unwrap_or_else(|| panic!("{case}: no operand"));
            assert_operand_of(operand, out, dtype, &case);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn input_operands_match_native_in_one_graph_bf16() {
    let _on = Choice::set(input_operands::choose, true, true);
    assert_parity_of("pose-one-graph", "bf16");
}

/// With and without the hand-off, native and recorded fits end with the same bits, and the
/// convolutions did take operands (not a comparison of two identical paths).
#[test]
#[ignore = "needs a CUDA GPU"]
fn input_operands_change_no_bit() {
    assert_hand_off_changes_no_bit(input_operands::choose, input_operands::taken, true);
}
