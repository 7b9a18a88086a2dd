//! FP16's loss scale through the optimizer: the flat update unscales inside its step and, on
//! CUDA's tensor path, decides a skip on the device (masking the whole update); the per-tensor
//! update unscales and decides on the host. All three must give the same bits and skip the
//! same steps. And `Optimizer::pin`, which gathers the flat buffers before a step.

use super::tests::{device, model_grads, registered};
use super::*;
use crate::model::{Scale, Task, Yolo, YoloConfig};
use burn::prelude::*;

/// Five steps of the nano pose model under a loss scale: the first and the fourth with a
/// gradient that is not finite (the first before any state exists), the third without
/// point-stem gradients. Returns the model and optimizer hashes before the first step, then per
/// step whether it counted and the hashes after it.
fn scaled_steps(mut model: Yolo, rule: Rule, flat_update: bool, bad: f32) -> Vec<(bool, String)> {
    let d = device();
    let mut opt = Optimizer::new(rule, &model);
    opt.flat_update = flat_update;
    let hash = |m: &Yolo, o: &Optimizer| format!("{} {}", hash::module_hash(m), o.state_hash());
    let mut out = vec![(true, hash(&model, &opt))];
    for step in 0..5u64 {
        let scale = if step % 2 == 0 { 1024.0 } else { 512.0 };
        let mut g = model_grads(&opt.table, &d, step, 1e-4 * scale, step == 2);
        if step == 0 || step == 3 {
            // The last value of a parameter in the middle of the table.
            let i = opt.table.len() / 2;
            let t = g[i].take().expect("present");
            let (n, inner) = (t.dims()[0], t.device());
            g[i] = Some(t.slice_assign(n - 1..n, Tensor::from_floats([bad], &inner)));
        }
        let h = Hyper {
            lr: [0.01, 0.02, 0.1 - 0.01 * step as f64],
            momentum: 0.8 + 0.03 * step as f64,
            weight_decay: 5e-4,
        };
        let (m, stepped) =
            opt.step_scaled(model, registered(&opt.table, &g), &h, 10.0, Some(scale));
        model = m;
        let counted = opt.settle(stepped);
        out.push((counted, hash(&model, &opt)));
    }
    let stem = opt
        .table
        .iter()
        .position(|p| p.path.contains("point_stems"))
        .unwrap();
    assert_eq!(
        opt.state[stem].steps, 2,
        "{rule:?}: counted steps of a stem"
    );
    let counted = opt.state.iter().map(|s| s.steps).max();
    assert_eq!(counted, Some(3), "{rule:?}: three steps count");
    out
}

fn check(rule: Rule, bad: f32) {
    let model = YoloConfig::new(Scale::N, Task::Pose).init(&device());
    let per_tensor = scaled_steps(model.clone(), rule, false, bad);
    let counted: Vec<bool> = per_tensor[1..].iter().map(|(c, _)| *c).collect();
    assert_eq!(counted, [false, true, true, false, true], "{rule:?} {bad}");
    // A skipped step leaves model and state as they were; a counted one moves them.
    let after = |k: usize| &per_tensor[k + 1].1;
    assert_eq!(
        after(0),
        &per_tensor[0].1,
        "{rule:?}: the first step was skipped"
    );
    assert_eq!(after(3), after(2), "{rule:?}: skipped");
    assert_ne!(after(1), after(0));
    assert_ne!(after(4), after(3));
    let host_loop = scaled_steps(model.clone(), rule, true, bad);
    assert_eq!(host_loop, per_tensor, "{rule:?} {bad}: the CPU's flat loop");
    let on_device = host::force::with_tensor_path(|| scaled_steps(model, rule, true, bad));
    assert_eq!(on_device, per_tensor, "{rule:?} {bad}: CUDA's tensor path");
}

#[test]
fn flat_skips_fp16_overflow_steps_like_per_tensor_adamw() {
    check(Rule::AdamW, f32::INFINITY);
}

#[test]
fn flat_skips_fp16_overflow_steps_like_per_tensor_musgd() {
    check(Rule::MuSgd, f32::INFINITY);
}

#[test]
fn flat_skips_fp16_overflow_steps_like_per_tensor_sgd() {
    check(Rule::Sgd, f32::NAN);
    check(Rule::Sgd, f32::NEG_INFINITY);
}

/// A queued flat step must be settled before the next: its step counts are not applied yet.
#[test]
#[should_panic(expected = "not settled")]
fn a_second_step_before_settling_is_refused() {
    let d = device();
    let model = YoloConfig::new(Scale::N, Task::Pose).init(&d);
    let mut opt = Optimizer::new(Rule::Sgd, &model);
    opt.flat_update = true;
    let g = model_grads(&opt.table, &d, 0, 1e-4, false);
    let h = Hyper {
        lr: [0.01; 3],
        momentum: 0.9,
        weight_decay: 0.0,
    };
    let (model, _queued) = opt.step_scaled(model, registered(&opt.table, &g), &h, 10.0, None);
    let _ = opt.step_scaled(model, registered(&opt.table, &g), &h, 10.0, None);
}

/// `Optimizer::pin` (run here through the tensor path): a model pinned mid-fit — state present,
/// as after a checkpoint load — steps to the same bits as one that is not, for each flat rule,
/// and pinning itself changes no value (a pin that gathered no state fails it). The CPU writes
/// no step in place, so the state views pin makes are re-made after each step here; the GPU
/// tests (`tests/gpu/shared.rs`) run them in place.
#[test]
fn pinning_changes_no_step() {
    let d = device();
    let model = YoloConfig::new(Scale::N, Task::Pose).init(&d);
    for rule in [Rule::AdamW, Rule::Sgd, Rule::MuSgd] {
        let run = |pin: bool| {
            let mut opt = Optimizer::new(rule, &model);
            opt.flat_update = true;
            let mut m = model.clone();
            for step in 0..3u64 {
                if step == 1 {
                    // As a checkpoint load leaves it: state present, no flat buffers.
                    opt.reset_flat();
                    if pin {
                        let before = hash::module_hash(&m);
                        m = opt.pin(m);
                        assert!(opt.pinned().is_some(), "{rule:?}: pinned");
                        assert_eq!(hash::module_hash(&m), before, "{rule:?}: pinning moved");
                    }
                }
                let g = model_grads(&opt.table, &d, step, 1e-4, step == 2);
                let h = Hyper {
                    lr: [0.01, 0.02, 0.05],
                    momentum: 0.9,
                    weight_decay: 5e-4,
                };
                m = opt.step_clipped(m, registered(&opt.table, &g), &h, 10.0);
            }
            format!("{} {}", hash::module_hash(&m), opt.state_hash())
        };
        let (plain, pinned) = host::force::with_tensor_path(|| (run(false), run(true)));
        assert_eq!(plain, pinned, "{rule:?}");
    }
}
