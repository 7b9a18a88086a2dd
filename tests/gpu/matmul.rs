//! The weight gradients' matmul routines (`model::ops::matmul`) on CUDA: every routine gives
//! the FP32 weight gradient of the CPU within TF32's bound, the same bits twice, and says when
//! it declined a product (Burn's routine ran it then).

use super::{cube, cube_values_of, cuda, rel_values, values};
use burn::backend::ops::ConvOptions;
use burn::prelude::*;
use burn::tensor::Distribution;
use burnpose::model::ops::matmul;
use burnpose::model::ops::trace::{ConvCall, Pass};

/// The weight gradient of `call` for `x` and the output gradient `grad` on `device`.
fn weight_grad(call: &ConvCall, x: &[f32], grad: &[f32], device: &Device) -> Vec<f32> {
    let t = |v: &[f32], dims: [usize; 4]| Tensor::<1>::from_floats(v, device).reshape(dims);
    let w = Tensor::<4>::zeros(call.weight, device);
    let dw = call.launch(
        Pass::WeightGrad,
        &t(x, call.input),
        &w,
        &t(grad, call.output()),
    );
    values(dw)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_matmul_routine_gives_the_weight_gradient_on_cuda() {
    let d = cuda();
    let cpu = Device::flex();
    let mut failures = vec![];
    // (c_in, c_out, kernel, stride, size): the head's odd 85 channels, four chunks of 1,024
    // positions, a strided 3×3, a 1×1 (its columns are its input), the first layer.
    for (ci, co, k, s, hw) in [
        (85, 85, 3, 1, 37),
        (64, 64, 3, 1, 64),
        (32, 64, 3, 2, 80),
        (48, 32, 1, 1, 23),
        (3, 16, 3, 2, 64),
    ] {
        let p = k / 2;
        let options = ConvOptions::new([s, s], [p, p], [1, 1], 1);
        let call = ConvCall {
            input: [3, ci, hw, hw],
            weight: [co, ci, k, k],
            stride: options.stride,
            padding: options.padding,
            dilation: options.dilation,
            groups: 1,
            reduced: None,
            input_grad: false,
            weight_grad: true,
        };
        let random = |dims: [usize; 4]| {
            values(Tensor::<4>::random(
                dims,
                Distribution::Normal(0.0, 1.0),
                &cpu,
            ))
        };
        let (x, grad) = (random(call.input), random(call.output()));
        // The CPU's weight gradient: FP32 throughout, one matmul over every position.
        let reference = weight_grad(&call, &x, &grad, &cpu);
        for name in matmul::ROUTINES {
            matmul::choose(name).unwrap();
            let declined = matmul::declined();
            let a = weight_grad(&call, &x, &grad, &d);
            let b = weight_grad(&call, &x, &grad, &d);
            let declined = matmul::declined() - declined;
            let err = rel_values(&a, &reference);
            println!("{name} {ci}->{co} k{k} s{s} {hw}px: error {err:.2e}, declined {declined}");
            // TF32 keeps 10 mantissa bits: ~1e-3 of each product, less in the sums.
            if err.is_nan() || err >= 1e-2 {
                failures.push(format!("{name} {ci}->{co} k{k} s{s}: error {err}"));
            }
            if a != b {
                failures.push(format!("{name} {ci}->{co} k{k} s{s}: two runs differ"));
            }
            // Ours takes every FP32 product: a decline would have timed Burn's routine.
            if name.starts_with("own-") && declined != 0 {
                failures.push(format!("{name} {ci}->{co} k{k} s{s}: declined {declined}"));
            }
        }
    }
    matmul::choose(matmul::ROUTINES[matmul::DEFAULT]).unwrap();
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Every weight gradient of the seed's training step (batch 4, 640 px), at its own shape, by
/// the default routine against Burn's on the same GPU: within TF32's bound of each other, and
/// the default's bits the same twice. The shape-by-shape check the five shapes above cannot be:
/// a routine can be right at one shape and wrong at another (the TMA routines were).
#[test]
#[ignore = "needs a CUDA GPU"]
fn the_default_routine_gives_burns_weight_gradients_at_every_seed_shape() {
    let default = matmul::ROUTINES[matmul::DEFAULT];
    assert_ne!(
        default,
        matmul::ROUTINES[0],
        "the default is Burn's: nothing to compare"
    );
    routine_at_every_seed_shape(default);
}

/// The same with our kernel reading the columns from the convolution's input
/// (`own-tf32-implicit`): no columns written, the same products.
#[test]
#[ignore = "needs a CUDA GPU"]
fn our_tf32_kernel_with_implicit_columns_gives_burns_weight_gradients_at_every_seed_shape() {
    routine_at_every_seed_shape("own-tf32-implicit");
}

/// Routine `name` against Burn's at every weight gradient of the seed's step (see above).
fn routine_at_every_seed_shape(name: &str) {
    let d = cuda();
    let cfg = burnpose::config::Config::load(std::path::Path::new("configs/bench_seed.toml"))
        .expect("configs/bench_seed.toml");
    let calls: Vec<ConvCall> = burnpose::train::precompile::step_convolutions(&cfg)
        .into_iter()
        .map(|(c, _)| c)
        .filter(|c| c.groups == 1 && c.weight_grad)
        .collect();
    assert!(
        calls.len() > 40,
        "only {} weight gradients traced",
        calls.len()
    );
    let burns = matmul::ROUTINES[0];
    let mut failures = vec![];
    for call in &calls {
        let random =
            |dims: [usize; 4]| Tensor::<4>::random(dims, Distribution::Normal(0.0, 1.0), &d);
        let (x, w, grad) = (
            random(call.input),
            Tensor::<4>::zeros(call.weight, &d),
            random(call.output()),
        );
        let run = |name: &str| {
            matmul::choose(name).unwrap();
            values(call.launch(Pass::WeightGrad, &x, &w, &grad))
        };
        let reference = run(burns);
        let declined = matmul::declined();
        let (a, b) = (run(name), run(name));
        let declined = matmul::declined() - declined;
        let err = rel_values(&a, &reference);
        println!(
            "{name} {:?} {:?} s{}: error {err:.2e}, declined {declined}",
            call.input, call.weight, call.stride[0]
        );
        if err.is_nan() || err >= 1e-2 {
            failures.push(format!("{:?} {:?}: error {err}", call.input, call.weight));
        }
        if a != b {
            failures.push(format!(
                "{:?} {:?}: two runs differ",
                call.input, call.weight
            ));
        }
        if name.starts_with("own-") && declined != 0 {
            failures.push(format!("{:?} {:?}: declined", call.input, call.weight));
        }
    }
    matmul::choose(matmul::ROUTINES[matmul::DEFAULT]).unwrap();
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Our kernel on operands of every layout it reads (K contiguous or not, in either operand),
/// rank 3 and 4, sizes off its 64 × 64 × 32 tiles, against Burn's routine on the same GPU:
/// within TF32's bound, the same bits twice, nothing declined; with wide tiles (128 rows or
/// columns, `own-tf32-wide`) and with asynchronous copies (`own-tf32-async`, 16 bytes a copy
/// where the layout is aligned, 4 where not) the same bits.
#[test]
#[ignore = "needs a CUDA GPU"]
fn our_tf32_kernel_reads_operands_by_their_strides_on_cuda() {
    use burnpose::model::ops::matmul::matmul as product;
    let d = cuda();
    d.seed(11);
    let r = |dims: [usize; 4]| Tensor::<4>::random(dims, Distribution::Normal(0.0, 1.0), &d);
    let mut failures = vec![];
    for (m, k, n, a_k_inner, b_k_inner) in [
        (70, 130, 90, true, true),
        (70, 130, 90, false, false),
        (16, 1000, 27, false, true),
        (129, 33, 65, true, false),
        // Aligned: 16-byte copies of both operands, in either layout.
        (64, 256, 96, true, true),
        (64, 256, 96, false, false),
        (16, 1000, 28, false, true),
    ] {
        let lhs = if a_k_inner {
            r([2, 3, m, k])
        } else {
            r([2, 3, k, m]).swap_dims(2, 3)
        };
        let rhs = if b_k_inner {
            r([2, 3, n, k]).swap_dims(2, 3)
        } else {
            r([2, 3, k, n])
        };
        for rank in [4, 3] {
            let run = |name: &str| {
                matmul::choose(name).unwrap();
                let (a, b) = (cube(lhs.clone()), cube(rhs.clone()));
                if rank == 4 {
                    cube_values_of::<4>(product(a, b))
                } else {
                    // The first batch axis only: `[3, m, k]` views of the first image.
                    let first = |t: &Tensor<4>| cube(t.clone().narrow(0, 0, 1).squeeze_dim::<3>(0));
                    cube_values_of::<3>(product(first(&lhs), first(&rhs)))
                }
            };
            let reference = run(matmul::ROUTINES[0]);
            let declined = matmul::declined();
            let (a, b) = (run("own-tf32"), run("own-tf32"));
            // Wide tiles add the same K steps in the same order: the same bits.
            let wide = run("own-tf32-wide");
            let pipelined = run("own-tf32-async");
            let declined = matmul::declined() - declined;
            let err = rel_values(&a, &reference);
            let case = format!("{m}×{k}×{n} rank {rank}, K inner {a_k_inner}/{b_k_inner}");
            println!("{case}: error {err:.2e}, declined {declined}");
            if err.is_nan() || err >= 1e-2 || a != b || declined != 0 {
                failures.push(format!(
                    "{case}: error {err}, equal {}, declined {declined}",
                    a == b
                ));
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            if bits(&wide) != bits(&a) {
                failures.push(format!("{case}: wide tiles changed the bits"));
            }
            if bits(&pipelined) != bits(&a) {
                failures.push(format!("{case}: asynchronous copies changed the bits"));
            }
        }
    }
    matmul::choose(matmul::ROUTINES[matmul::DEFAULT]).unwrap();
    assert!(failures.is_empty(), "{failures:#?}");
}
