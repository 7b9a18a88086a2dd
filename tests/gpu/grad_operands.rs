//! `model::ops::grad_operands`: the fused BatchNorm's input-gradient kernel also writes the
//! convolution's output gradient as its data gradient's GEMM takes it (channels-last, cast,
//! zero-padded channels): the same values `channels_last` would make from the FP32 gradient,
//! bit for bit, at shapes with channels that need padding and pixel counts off the tiles; and
//! the recorded step is byte-identical to native with them, and the same as without them.
//! On by default; each test sets the choice it needs and puts the default back.

use super::replay::{assert_parity_of, config_for, fit};
use super::{Choice, cube_values_of, cuda, nhwc_bn_case};
use burn::backend::TensorMetadata;
use burn::prelude::*;
use burn::tensor::FloatDType;
use burn_cubecl::CubeBackend;
use burnpose::model::ops::{self, FastOps, grad_operands};
use burnpose::replay::recorder::Control;

/// `[N, C, H, W]` of the operand tests: channels padded by 0, 3, 5 and 7, pixel counts off the
/// 32-pixel tiles, one 160-px layer.
pub(super) const OPERAND_SHAPES: [[usize; 4]; 5] = [
    [1, 64, 8, 8],
    [3, 40, 29, 31],
    [2, 51, 20, 20],
    [2, 5, 33, 17],
    [4, 16, 160, 160],
];

#[test]
#[ignore = "needs a CUDA GPU"]
fn batch_norm_writes_the_operand_channels_last_would_make_on_cuda() {
    let d = cuda();
    d.seed(31);
    ops::set_conv_bn_ops(ops::ConvBnOps::Fast);
    // NCHW input gradients first; channels-last (the default) below.
    let _nchw = Choice::set(ops::choose_channels_last_grad, false, true);
    for [n, c, h, w] in OPERAND_SHAPES {
        let [x, g, gamma, beta, running_mean, running_var] = nhwc_bn_case(&d, [n, c, h, w]);
        for act in [true, false] {
            let case = format!("[{n}, {c}, {h}, {w}] act={act}");
            let (_, mean, var, _, _) = CubeBackend::bn_act_train(
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
                x.clone(),
                gamma.clone(),
                beta.clone(),
                mean.clone(),
                var.clone(),
                1e-3,
                act,
                g.clone(),
            );
            let (mean3, var3) = (mean.clone(), var.clone());
            let (dx2, d_gamma2, d_beta2, operand) = CubeBackend::bn_act_train_backward_operand(
                x.clone(),
                gamma.clone(),
                beta.clone(),
                mean,
                var,
                1e-3,
                act,
                g.clone(),
                FloatDType::BF16,
            );
            let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
            for (name, a, b) in [
                (
                    "dx",
                    cube_values_of::<4>(dx.clone()),
                    cube_values_of::<4>(dx2),
                ),
                (
                    "dγ",
                    cube_values_of::<1>(d_gamma),
                    cube_values_of::<1>(d_gamma2),
                ),
                (
                    "dβ",
                    cube_values_of::<1>(d_beta),
                    cube_values_of::<1>(d_beta2),
                ),
            ] {
                assert_eq!(bits(a), bits(b), "{case}: {name} moved with the operand");
            }
            let operand = operand.unwrap_or_else(|| panic!("{case}: no operand"));
            assert_operand_of(operand, dx.clone(), FloatDType::BF16, &case);
            // With the input gradient chosen channels-last: so with an operand and a multiple
            // of 4 channels, else NCHW; the same bits either way.
            ops::choose_channels_last_grad(true);
            let (dx3, ..) = CubeBackend::bn_act_train_backward_operand(
                x.clone(),
                gamma.clone(),
                beta.clone(),
                mean3.clone(),
                var3.clone(),
                1e-3,
                act,
                g.clone(),
                FloatDType::BF16,
            );
            ops::choose_channels_last_grad(false);
            let channels_last = dx3.meta.strides().to_vec() == vec![h * w * c, 1, w * c, c];
            assert_eq!(
                channels_last,
                c % 4 == 0,
                "{case}: dx strides {:?}",
                dx3.meta.strides()
            );
            assert!(
                dx.meta.strides()[3] == 1,
                "{case}: dx without an operand not NCHW"
            );
            assert_eq!(
                bits(cube_values_of::<4>(dx3)),
                bits(cube_values_of::<4>(dx)),
                "{case}: dx moved with its layout"
            );
        }
    }
}

/// `operand` is what `channels_last` makes of FP32 `t` `[N, C, H, W]` in `dtype`: `[N, C', H,
/// W]` dense channels-last, `C'` the next multiple of 8, each value `t`'s cast (bit for bit),
/// zero in the padded channels.
pub(super) fn assert_operand_of(
    operand: burn_cubecl::tensor::CubeTensor,
    t: burn_cubecl::tensor::CubeTensor,
    dtype: FloatDType,
    case: &str,
) {
    let [n, c, h, w] = t.shape().dims::<4>();
    let d = cuda();
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    let padded = c.next_multiple_of(8);
    let s = operand.shape();
    assert_eq!(s.dims::<4>(), [n, padded, h, w], "{case}: shape");
    let strides = operand.meta.strides().to_vec();
    assert_eq!(
        strides,
        vec![h * w * padded, 1, w * padded, padded],
        "{case}: not dense channels-last"
    );
    assert_eq!(operand.dtype, dtype.into(), "{case}: dtype");
    // What the convolution would have made: the FP32 tensor cast, channels padded with zeros.
    let cast = Tensor::<4>::from_dispatch(burn::backend::DispatchTensor {
        kind: burn::backend::DispatchTensorKind::Cube(burn::backend::BackendTensor::Float(t)),
        autodiff: Default::default(),
    })
    .cast(dtype)
    .cast(FloatDType::F32);
    let want = if padded == c {
        cast
    } else {
        Tensor::cat(vec![cast, Tensor::zeros([n, padded - c, h, w], &d)], 1)
    };
    let got = cube_values_of::<4>(burn_cubecl::kernel::cast(operand, burn::tensor::DType::F32));
    let want = want
        .into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .unwrap();
    assert_eq!(
        bits(got),
        bits(want),
        "{case}: operand differs from the cast"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn grad_operands_match_native_in_one_graph_bf16() {
    let _on = Choice::set(grad_operands::choose, true, true);
    assert_parity_of("pose-one-graph", "bf16");
}

/// With and without the hand-off, native and recorded fits end with the same bits, and the
/// convolutions did take operands (not a comparison of two identical paths).
#[test]
#[ignore = "needs a CUDA GPU"]
fn grad_operands_change_no_bit() {
    assert_hand_off_changes_no_bit(grad_operands::choose, grad_operands::taken, true);
}

/// A BF16 pose fit, native and in one recorded graph, ends with the same state hashes with an
/// operand hand-off chosen on (`choose(true)`) and off, and took more than 10 operands
/// (`taken`) while on; `default` is put back.
pub(super) fn assert_hand_off_changes_no_bit(
    choose: fn(bool),
    taken: fn() -> usize,
    default: bool,
) {
    for (task, capture) in [("pose", false), ("pose-one-graph", true)] {
        let cfg = config_for(task, "bf16", capture);
        let before = taken();
        let on = {
            let _on = Choice::set(choose, true, default);
            fit(&cfg, Control::None).0
        };
        let took = taken() - before;
        let off = {
            let _off = Choice::set(choose, false, default);
            fit(&cfg, Control::None).0
        };
        assert!(took > 10, "{task}: {took} operands taken");
        assert_eq!(on, off, "{task}: the operands moved the state");
        println!("{task}: {took} operands taken, {:?}", on);
    }
}
