//! `kernels/batch_norm_single.rs`: the channels-last BatchNorm sums in one launch give the
//! two-launch kernels' bits (statistics, running statistics, γ/β gradients) at shapes with one
//! chunk and with hundreds, part-filled channel tiles and many tiles, twice; and the recorded
//! step with them is byte-identical to native. Off by default; each test turns it on and off.

use super::replay::assert_parity_of;
use super::{Choice, cube_values, cube_values_of, cuda, nhwc_bn_case};
use burn_cubecl::CubeBackend;
use burn_cubecl::tensor::CubeTensor;
use burnpose::model::ops::{self, FastOps, fused_bn_single};

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_launch_sums_give_the_two_launch_bits_on_cuda() {
    let d = cuda();
    d.seed(29);
    ops::set_conv_bn_ops(ops::ConvBnOps::Fast);
    // One chunk (64 pixels); two tiles, the second part-filled; 8 lanes; 256 chunks of a
    // 160-px layer; 8 tiles of 32 channels.
    for [n, c, h, w] in [
        [1, 64, 8, 8],
        [3, 40, 29, 31],
        [2, 5, 64, 70],
        [4, 32, 160, 160],
        [2, 256, 20, 20],
    ] {
        let [x, g, gamma, beta, running_mean, running_var] = nhwc_bn_case(&d, [n, c, h, w]);
        for act in [true, false] {
            let run = |single: bool| {
                let _single = Choice::set(fused_bn_single::choose, single, false);
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
                    x.clone(),
                    gamma.clone(),
                    beta.clone(),
                    mean.clone(),
                    var.clone(),
                    1e-3,
                    act,
                    g.clone(),
                );
                let mut out = vec![cube_values(y), cube_values(dx)];
                let all: [CubeTensor; 6] = [mean, var, new_mean, new_var, d_gamma, d_beta];
                for t in all {
                    out.push(cube_values_of::<1>(t));
                }
                out
            };
            let case = format!("[{n}, {c}, {h}, {w}] act={act}");
            let two = run(false);
            let (one, again) = (run(true), run(true));
            assert_eq!(one, again, "{case}: two one-launch runs differ");
            let names = [
                "y",
                "dx",
                "mean",
                "var",
                "running mean",
                "running var",
                "dγ",
                "dβ",
            ];
            for ((a, b), name) in one.iter().zip(&two).zip(names) {
                assert!(
                    a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits()),
                    "{case}: {name} differs from the two-launch kernels"
                );
            }
            // The statistics are not trivially equal: they moved from the running ones.
            assert_ne!(one[4], cube_values_of::<1>(running_mean.clone()), "{case}");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_launch_sums_match_native_in_one_graph_bf16() {
    let _single = Choice::set(fused_bn_single::choose, true, false);
    assert_parity_of("pose-one-graph", "bf16");
}
