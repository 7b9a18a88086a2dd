//! The flat (multi-tensor) optimizer update and EMA against the per-tensor ones on CUDA: the same
//! bits (the CPU tests in `optim::tests` check the same on the flex backend).

use super::cuda;
use burn::module::Module;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::Distribution;
use burnpose::model::{Scale, Task, YoloConfig};
use burnpose::optim::grads::put_flat;
use burnpose::optim::hash::module_hash;
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

fn flat_equals_per_tensor_on_cuda(rule: Rule) {
    let d = cuda().autodiff();
    let model = YoloConfig::new(Scale::N, Task::Pose).init(&d);
    let mut per_tensor = Optimizer::new(rule, &model);
    let mut flat = per_tensor.clone();
    flat.flat_update = true;
    let mut ema_a = Ema::new(&model);
    let mut ema_b = ema_a.clone();
    ema_b.flat_update = true;
    let (mut a, mut b) = (model.clone(), model);
    let inner = d.clone().inner();
    for step in 0..3 {
        // Small enough that the clip multiplies by exactly 1; the point stems are absent in step 1.
        let g: Vec<Option<Tensor<1>>> = per_tensor
            .table
            .iter()
            .map(|p| {
                let n: usize = p.dims.iter().product();
                let absent = step == 1 && p.path.contains("point_stems");
                (!absent).then(|| Tensor::random([n], Distribution::Uniform(-1e-4, 1e-4), &inner))
            })
            .collect();
        let h = Hyper {
            lr: [0.01, 0.02, 0.1 - 0.01 * step as f64],
            momentum: 0.8 + 0.05 * step as f64,
            weight_decay: 5e-4,
        };
        a = per_tensor.step_clipped(a, grads_of(&per_tensor, &g), &h, 10.0);
        b = flat.step_clipped(b, grads_of(&flat, &g), &h, 10.0);
        ema_a.update(&a);
        ema_b.update(&b);
    }
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
