//! The flat (multi-tensor) optimizer update and EMA against the per-tensor ones on CUDA: the same
//! bits (the CPU tests in `optim::tests` check the same on the flex backend; MuSGD's batched
//! Newton–Schulz agrees to rounding). The flat side's
//! gradients are views of one buffer, as replay hands them on, so its gather copies them as runs.

use super::cuda;
use burn::module::Module;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::Distribution;
use burnpose::model::ops;
use burnpose::model::{Scale, Task, Yolo, YoloConfig};
use burnpose::optim::grads::put_flat;
use burnpose::optim::hash::module_hash;
use burnpose::optim::layout::Layout;
use burnpose::optim::tensors::float_tensors;
use burnpose::optim::{Ema, Hyper, Optimizer, Rule};

fn grads_of(opt: &Optimizer, g: &[Option<Tensor<1>>]) -> GradientsParams {
    let mut out = GradientsParams::new();
    for (p, g) in opt.table.iter().zip(g) {
        if let Some(g) = g {
            put_flat(&mut out, p, g.clone());
        }
    }
    out
}

/// `g` as views of one buffer in the table's layout, as replay's gradients sit in theirs, but with
/// ones in the padding and in absent gradients' segments: the flat update copies the views as runs
/// (padding included) and must count neither.
fn as_views(opt: &Optimizer, g: &[Option<Tensor<1>>], device: &Device) -> Vec<Option<Tensor<1>>> {
    let layout = Layout::new(opt.table.iter().map(|p| p.dims.iter().product()).collect());
    let mut buf = Tensor::<1>::ones([layout.len], device);
    for (i, g) in g.iter().enumerate() {
        if let Some(g) = g {
            let o = layout.offsets[i];
            buf = buf.slice_assign(o..o + layout.sizes[i], g.clone());
        }
    }
    let views: Vec<Option<Tensor<1>>> = g
        .iter()
        .enumerate()
        .map(|(i, g)| g.as_ref().map(|_| layout.view(&buf, i)))
        .collect();
    let (end, _) = ops::run(&views, &layout.offsets, &layout.sizes, 0)
        .expect("views of one buffer in order are one run");
    assert!(end > 50, "the run stopped at {end}");
    views
}

/// Both arms after three steps of `rule`: the per-tensor update and EMA, and the flat ones.
struct Arms {
    a: Yolo,
    b: Yolo,
    per_tensor: Optimizer,
    flat: Optimizer,
    ema_a: Ema<Yolo>,
    ema_b: Ema<Yolo>,
}

fn three_steps(rule: Rule, model: &Yolo) -> Arms {
    let d = cuda().autodiff();
    let mut per_tensor = Optimizer::new(rule, model);
    let mut flat = per_tensor.clone();
    flat.flat_update = true;
    let mut ema_a = Ema::new(model);
    let mut ema_b = Ema::new(model);
    ema_b.flat_update = true;
    assert!(
        per_tensor
            .table
            .iter()
            .any(|p| p.path.contains("one2one") && p.path.contains("point_stems")),
        "no one-to-one point stems to leave absent"
    );
    let (mut a, mut b) = (model.clone(), model.clone());
    let inner = d.inner();
    // The same random gradients every call (two calls must give the same bits).
    inner.seed(5);
    for step in 0..3 {
        // Small enough that the clip multiplies by exactly 1; the point stems are absent in step
        // 1, the one-to-one ones in step 0 too: their first gradient comes in step 2, after the
        // flat values are written in place (on CUDA) from step 1 on.
        let g: Vec<Option<Tensor<1>>> = per_tensor
            .table
            .iter()
            .map(|p| {
                let n: usize = p.dims.iter().product();
                let stem = p.path.contains("point_stems");
                let late = stem && p.path.contains("one2one");
                let absent = (step == 1 && stem) || (step == 0 && late);
                (!absent).then(|| Tensor::random([n], Distribution::Uniform(-1e-4, 1e-4), &inner))
            })
            .collect();
        let h = Hyper {
            lr: [0.01, 0.02, 0.1 - 0.01 * step as f64],
            momentum: 0.8 + 0.05 * step as f64,
            weight_decay: 5e-4,
        };
        a = per_tensor.step_clipped(a, grads_of(&per_tensor, &g), &h, 10.0);
        let views = as_views(&flat, &g, &inner);
        b = flat.step_clipped(b, grads_of(&flat, &views), &h, 10.0);
        ema_a.update(&a);
        ema_b.update(&b);
    }
    Arms {
        a,
        b,
        per_tensor,
        flat,
        ema_a,
        ema_b,
    }
}

fn flat_equals_per_tensor_on_cuda(rule: Rule) {
    let model = YoloConfig::new(Scale::N, Task::Pose).init(&cuda().autodiff());
    let Arms {
        a,
        b,
        per_tensor,
        flat,
        ema_a,
        ema_b,
    } = three_steps(rule, &model);
    assert_eq!(
        module_hash(&a.valid()),
        module_hash(&b.valid()),
        "{rule:?} model"
    );
    assert_eq!(
        per_tensor.state_hash(),
        flat.state_hash(),
        "{rule:?} optimizer"
    );
    assert_eq!(ema_a.state_hash(), ema_b.state_hash(), "{rule:?} EMA");
}

/// MuSGD's flat update on CUDA orthogonalises each matrix shape as one batch, whose matrix
/// products may round otherwise than one matrix's: against the per-tensor update it must agree
/// to TF32's rounding (every parameter within 1e-2 of how far the steps moved it; the same step
/// counts and state present), and two flat runs must give the same bits.
#[test]
#[ignore = "needs a CUDA GPU"]
fn flat_musgd_agrees_with_per_tensor_on_cuda() {
    let model = YoloConfig::new(Scale::N, Task::Pose).init(&cuda().autodiff());
    let one = three_steps(Rule::MuSgd, &model);
    let two = three_steps(Rule::MuSgd, &model);
    assert_eq!(
        one.flat.state_hash(),
        two.flat.state_hash(),
        "flat runs differ"
    );
    assert_eq!(module_hash(&one.b.valid()), module_hash(&two.b.valid()));
    for (s, t) in one.per_tensor.state.iter().zip(&one.flat.state) {
        assert_eq!(
            (s.steps, s.buf.is_some(), s.second.is_some()),
            (t.steps, t.buf.is_some(), t.second.is_some())
        );
    }
    let values = |m: &Yolo| -> Vec<(String, Vec<f32>)> {
        float_tensors(&m.valid())
            .into_iter()
            .map(|(p, t)| (p, t.into_data().convert::<f32>().try_into_vec().unwrap()))
            .collect()
    };
    let (start, per_tensor, flat) = (values(&model), values(&one.a), values(&one.b));
    let mut moved = 0;
    for (((path, x0), (_, x)), (_, y)) in start.iter().zip(&per_tensor).zip(&flat) {
        let worst_of = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max)
        };
        // Against how far the three steps moved the tensor: CubeCL's accelerated f32 matmul
        // stages its operands as TF32 (10-bit mantissa, cubek-matmul `adjust_dtypes`), and a
        // batch may take another kernel than one matrix, so Newton–Schulz's products differ
        // at TF32's rounding (seen: 3.2e-3 of the step); a wrong formula moves it by a share
        // of the step. The CPU tests give both forms the same bits.
        let (worst, step) = (worst_of(x, y), worst_of(x, x0));
        assert!(
            worst <= 1e-2 * step,
            "{path}: {worst} where the step moved it by up to {step}"
        );
        moved += (x != x0) as usize;
    }
    assert!(moved > 100, "only {moved} tensors moved");
}

/// FP16's skip decided on the device (the flat update's mask) against the host's decision (per
/// tensor), on CUDA: a step with an inf gradient leaves both arms where they were, a finite one
/// moves them, to the same bits.
#[test]
#[ignore = "needs a CUDA GPU"]
fn flat_fp16_skip_equals_per_tensor_on_cuda() {
    let d = cuda().autodiff();
    let inner = d.clone().inner();
    let model = YoloConfig::new(Scale::N, Task::Pose).init(&d);
    let mut per_tensor = Optimizer::new(Rule::AdamW, &model);
    let mut flat = per_tensor.clone();
    flat.flat_update = true;
    let (mut a, mut b) = (model.clone(), model);
    let hashes = |a: &Yolo, b: &Yolo, x: &Optimizer, y: &Optimizer| {
        (
            format!("{} {}", module_hash(&a.valid()), x.state_hash()),
            format!("{} {}", module_hash(&b.valid()), y.state_hash()),
        )
    };
    let start = hashes(&a, &b, &per_tensor, &flat);
    for step in 0..4 {
        let scale = 1024.0;
        let g: Vec<Option<Tensor<1>>> = per_tensor
            .table
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let n: usize = p.dims.iter().product();
                let g = Tensor::random([n], Distribution::Uniform(-0.1, 0.1), &inner);
                Some(if i == 7 && step % 2 == 0 {
                    g.slice_assign(0..1, Tensor::from_floats([f32::INFINITY], &inner))
                } else {
                    g
                })
            })
            .collect();
        let h = Hyper {
            lr: [0.01; 3],
            momentum: 0.9,
            weight_decay: 5e-4,
        };
        let before = hashes(&a, &b, &per_tensor, &flat);
        let (next, s) = per_tensor.step_scaled(a, grads_of(&per_tensor, &g), &h, 10.0, Some(scale));
        a = next;
        let finite_a = per_tensor.settle(s);
        let views = as_views(&flat, &g, &inner);
        let (next, s) = flat.step_scaled(b, grads_of(&flat, &views), &h, 10.0, Some(scale));
        b = next;
        let finite_b = flat.settle(s);
        assert_eq!(
            (finite_a, finite_b),
            (step % 2 == 1, step % 2 == 1),
            "step {step}"
        );
        let after = hashes(&a, &b, &per_tensor, &flat);
        assert_eq!(after.0, after.1, "step {step}: the arms differ");
        if step % 2 == 0 {
            assert_eq!(after, before, "step {step} was to be skipped");
        } else {
            assert_ne!(after.0, before.0, "step {step} was to count");
        }
    }
    assert_ne!(hashes(&a, &b, &per_tensor, &flat), start);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn flat_update_equals_per_tensor_on_cuda_adamw() {
    flat_equals_per_tensor_on_cuda(Rule::AdamW);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn flat_update_equals_per_tensor_on_cuda_sgd() {
    flat_equals_per_tensor_on_cuda(Rule::Sgd);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gather_copies_runs_of_views_and_only_those_on_cuda() {
    let d = cuda();
    let sizes = vec![3, 200, 5, 130, 7];
    let layout = Layout::new(sizes.clone());
    let buf = Tensor::<1>::random([layout.len], Distribution::Uniform(-1.0, 1.0), &d);
    let view = |i: usize| Some(layout.view(&buf, i));
    let values = |t: Tensor<1>| t.into_data().try_to_vec::<f32>().unwrap();
    // In order: one run over all five; gathered, every segment is the source's.
    let in_order: Vec<_> = (0..sizes.len()).map(view).collect();
    let (end, whole) = ops::run(&in_order, &layout.offsets, &layout.sizes, 0).expect("a run");
    assert_eq!((end, whole.dims()[0]), (5, layout.offsets[4] + 7));
    let gathered = layout.gather(in_order, &d);
    for i in 0..sizes.len() {
        assert_eq!(
            values(layout.view(&gathered, i)),
            values(layout.view(&buf, i))
        );
    }
    // Swapped, or a gap, or another buffer's view: no run there, and still the right values.
    let swapped = Layout::new(vec![200, 3, 5, 130, 7]);
    let parts = vec![view(1), view(0), view(2), view(3), view(4)];
    assert!(ops::run(&parts, &swapped.offsets, &swapped.sizes, 0).is_none());
    assert_eq!(
        ops::run(&parts, &swapped.offsets, &swapped.sizes, 2).map(|r| r.0),
        Some(5)
    );
    let gathered = swapped.gather(parts, &d);
    assert_eq!(
        values(swapped.view(&gathered, 0)),
        values(layout.view(&buf, 1))
    );
    assert_eq!(
        values(swapped.view(&gathered, 1)),
        values(layout.view(&buf, 0))
    );
    let gap = vec![view(0), None, view(2)];
    let three = Layout::new(vec![3, 200, 5]);
    assert!(ops::run(&gap, &three.offsets, &three.sizes, 0).is_none());
    let other = buf.clone() * 1.0;
    let mixed = vec![view(0), Some(layout.view(&other, 1))];
    assert!(ops::run(&mixed, &three.offsets, &three.sizes, 0).is_none());
}

/// `Layout::gather_into` writes runs and single parts into the fixed buffer itself (a recorded
/// update's inputs), with the runs ending where a part is not a multiple of the alignment: such
/// an end made the destination view a copy, and the write was lost in it. Absent parts'
/// segments keep what they held.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gather_into_writes_every_run_into_the_buffer_on_cuda() {
    let d = cuda();
    let sizes = vec![3, 200, 5, 130, 7];
    let layout = Layout::new(sizes.clone());
    let buf = Tensor::<1>::random([layout.len], Distribution::Uniform(-1.0, 1.0), &d);
    let values = |t: Tensor<1>| t.into_data().try_to_vec::<f32>().unwrap();
    let view = |i: usize| Some(layout.view(&buf, i));
    // One run over all five (ending 7 values into its last segment), then a run of two and two
    // single parts around an absent one.
    let cases: Vec<Vec<Option<Tensor<1>>>> = vec![
        (0..sizes.len()).map(view).collect(),
        vec![view(0), view(1), None, view(3), None],
        vec![None, view(1), None, None, view(4)],
    ];
    for (c, parts) in cases.into_iter().enumerate() {
        let dst = Tensor::<1>::full([layout.len], 9.0, &d);
        layout.gather_into(&parts, &dst);
        for (i, part) in parts.iter().enumerate() {
            let expected = match part {
                Some(_) => values(layout.view(&buf, i)),
                None => vec![9.0; sizes[i]],
            };
            assert_eq!(values(layout.view(&dst, i)), expected, "case {c}, part {i}");
        }
    }
}
