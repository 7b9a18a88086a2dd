use super::clip::clip_global_norm;
use super::groups::{Group, ParamInfo};
use super::newton_schulz::orthogonalize;
use super::*;
use burn::module::Param;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::TensorData;

#[derive(Module, Debug)]
struct Tiny {
    weight: Param<Tensor<2>>,
    bias: Param<Tensor<1>>,
}

pub(super) fn device() -> Device {
    Device::flex().autodiff()
}

fn tiny(d: &Device) -> Tiny {
    Tiny {
        weight: Param::from_tensor(Tensor::from_floats(
            [[1.0, -2.0, 0.5], [0.25, 3.0, -1.0]],
            d,
        )),
        bias: Param::from_tensor(Tensor::from_floats([0.5, -0.5], d)),
    }
}

fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_into_vec().unwrap()
}

fn grads(m: &Tiny, gw: [[f32; 3]; 2], gb: Option<[f32; 2]>, d: &Device) -> GradientsParams {
    let mut g = GradientsParams::new();
    let inner = d.clone().inner();
    g.register::<2>(m.weight.id, Tensor::from_floats(gw, &inner));
    if let Some(gb) = gb {
        g.register::<1>(m.bias.id, Tensor::from_floats(gb, &inner));
    }
    g
}

fn hyper(lr: f64, momentum: f64, wd: f64) -> Hyper {
    Hyper {
        lr: [lr, lr, lr],
        momentum,
        weight_decay: wd,
    }
}

fn close(a: &[f32], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!((*x as f64 - y).abs() < tol, "{a:?} vs {b:?}");
    }
}

#[test]
fn sgd_nesterov_matches_pytorch_two_steps() {
    let d = device();
    let mut m = tiny(&d);
    let mut opt = Optimizer::new(Rule::Sgd, &m);
    let (lr, mu, wd) = (0.1, 0.9, 0.01);
    let g1 = [[0.1, 0.2, -0.3], [1.0, 0.0, 0.5]];
    let g2 = [[-0.2, 0.1, 0.0], [0.5, 0.5, -0.5]];
    let w0: Vec<f64> = vec![1.0, -2.0, 0.5, 0.25, 3.0, -1.0];
    // PyTorch: d = g + wd·p; buf = mu·buf + d (buf₀ = d); p -= lr·(d + mu·buf).
    let mut p = w0.clone();
    let mut buf = [0.0; 6];
    for (step, g) in [g1, g2].iter().enumerate() {
        let g: Vec<f64> = g.iter().flatten().map(|&v| v as f64).collect();
        for i in 0..6 {
            let dd = g[i] + wd * p[i];
            buf[i] = if step == 0 { dd } else { mu * buf[i] + dd };
            p[i] -= lr * (dd + mu * buf[i]);
        }
    }
    for g in [g1, g2] {
        let grads = grads(&m, g, Some([1.0, -1.0]), &d);
        m = opt.step(m, grads, &hyper(lr, mu, wd));
    }
    close(&values(m.weight.val()), &p, 1e-6);
    // Biases take no weight decay: two steps of g = ±1.
    let b1 = 0.5 - lr * (1.0 + mu * 1.0);
    let b2 = b1 - lr * (1.0 + mu * (mu * 1.0 + 1.0));
    close(&values(m.bias.val()), &[b2, -b2], 1e-6);
    assert_eq!(opt.state[0].steps, 2);
}

#[test]
fn absent_gradient_skips_parameter_and_state() {
    let d = device();
    let m = tiny(&d);
    let mut opt = Optimizer::new(Rule::Sgd, &m);
    let h = hyper(0.1, 0.9, 0.01);
    let g = grads(&m, [[1.0; 3]; 2], Some([1.0, 1.0]), &d);
    let m = opt.step(m, g, &h);
    let bias_idx = opt.table.iter().position(|p| p.path == "bias").unwrap();
    let bias_before = values(m.bias.val());
    let buf_before = values(opt.state[bias_idx].buf.clone().unwrap());
    // Second step: the bias has no gradient (as the point stems on a batch without positives).
    let g = grads(&m, [[1.0; 3]; 2], None, &d);
    let m = opt.step(m, g, &h);
    assert_eq!(
        values(m.bias.val()),
        bias_before,
        "bias moved without a gradient"
    );
    assert_eq!(opt.state[bias_idx].steps, 1);
    assert_eq!(values(opt.state[bias_idx].buf.clone().unwrap()), buf_before);
    assert_eq!(opt.state[0].steps, 2);
}

#[test]
fn musgd_blends_muon_and_sgd() {
    let d = device();
    let m = tiny(&d);
    let mut opt = Optimizer::new(Rule::MuSgd, &m);
    let (lr, mu, wd) = (0.05, 0.9, 0.01);
    let g = [[0.1, 0.2, -0.3], [1.0, 0.0, 0.5]];
    let m2 = opt.step(m, grads(&tiny(&d), g, None, &d), &hyper(lr, mu, wd));
    // The helper registered grads under a different Tiny's ids: nothing may change.
    assert_eq!(opt.state[0].steps, 0);
    let inner = d.clone().inner();
    let gt = Tensor::<2>::from_floats(g, &inner);
    // Expected, from the rule: m = (1−μ)g, u = μm + (1−μ)g, O = NS(uᵀ)ᵀ·√max(1, 3/2) (Burn stores
    // Linear-style [in, out], so the matrix view is transposed), p₁ = p − η·0.2·O,
    // g' = g + λp₁, p₂ = p₁ − η·1.0·(g' + μg').
    let u = gt.clone() * ((1.0 - mu) * mu + (1.0 - mu));
    let o = orthogonalize(u.transpose(), 5).transpose() * (3.0f64 / 2.0).sqrt();
    let p0 = Tensor::<2>::from_floats([[1.0, -2.0, 0.5], [0.25, 3.0, -1.0]], &inner);
    let p1 = p0 - o * (lr * 0.2);
    let gd = gt + p1.clone() * wd;
    let p2 = p1 - gd.clone() * (lr * (1.0 + mu));
    let m3 = opt.step(m2, grads_for(&opt, g, &d), &hyper(lr, mu, wd));
    let want: Vec<f64> = values(p2).iter().map(|&v| v as f64).collect();
    close(&values(m3.weight.val()), &want, 1e-5);
    assert_eq!(opt.table[0].group, Group::Weight);
}

/// Gradients keyed by the optimizer's own table (weight only).
fn grads_for(opt: &Optimizer, gw: [[f32; 3]; 2], d: &Device) -> GradientsParams {
    let mut g = GradientsParams::new();
    g.register::<2>(opt.table[0].id, Tensor::from_floats(gw, &d.clone().inner()));
    g
}

#[test]
fn adamw_first_step() {
    let d = device();
    let m = tiny(&d);
    let mut opt = Optimizer::new(Rule::AdamW, &m);
    let (lr, wd) = (0.01, 0.1);
    let g = [[0.1, 0.2, -0.3], [1.0, 0.0, 0.5]];
    let m = opt.step(m, grads_for(&opt, g, &d), &hyper(lr, 0.9, wd));
    // m̂ = g, v̂ = g² → p·(1 − lr·wd) − lr·g / (|g| + eps).
    let w0 = [1.0, -2.0, 0.5, 0.25, 3.0, -1.0];
    let want: Vec<f64> = w0
        .iter()
        .zip(g.iter().flatten())
        .map(|(&p, &g)| {
            let g = g as f64;
            p * (1.0 - lr * wd) - lr * g / (g.abs() + 1e-8)
        })
        .collect();
    close(&values(m.weight.val()), &want, 1e-5);
}

#[test]
fn global_norm_clipping() {
    let d = device();
    let m = tiny(&d);
    let opt = Optimizer::new(Rule::Sgd, &m);
    let inner = d.clone().inner();
    let mut g = GradientsParams::new();
    g.register::<2>(
        m.weight.id,
        Tensor::from_floats([[12.0, 0.0, 0.0], [0.0, 0.0, 0.0]], &inner),
    );
    g.register::<1>(m.bias.id, Tensor::from_floats([0.0, 16.0], &inner));
    let norm = clip_global_norm(&mut g, &opt.table, 10.0).unwrap();
    assert!((values(norm)[0] - 20.0).abs() < 1e-4);
    let w = values(g.get::<2>(m.weight.id).unwrap());
    let b = values(g.get::<1>(m.bias.id).unwrap());
    assert!((w[0] - 6.0).abs() < 1e-4 && (b[1] - 8.0).abs() < 1e-4);
    // Below the limit nothing changes (up to the 1e-6 guard).
    let mut small = GradientsParams::new();
    small.register::<1>(m.bias.id, Tensor::from_floats([3.0, 4.0], &inner));
    clip_global_norm(&mut small, &opt.table, 10.0);
    close(
        &values(small.get::<1>(m.bias.id).unwrap()),
        &[3.0, 4.0],
        1e-5,
    );
}

#[test]
fn ema_follows_the_decay_formula() {
    let d = device();
    let m = tiny(&d);
    let mut ema = Ema::new(&m);
    assert!((ema.next_decay() - 0.9999 * (1.0 - (-1.0f64 / 2000.0).exp())).abs() < 1e-15);
    let moved = Tiny {
        weight: m.weight.clone().map(|w| w + 1.0),
        bias: m.bias.clone(),
    };
    let dk = ema.next_decay();
    ema.update(&moved);
    let w = values(ema.model.weight.val());
    let want: Vec<f64> = [1.0, -2.0, 0.5, 0.25, 3.0, -1.0]
        .iter()
        .map(|&p| dk * p + (1.0 - dk) * (p + 1.0))
        .collect();
    close(&w, &want, 1e-6);
    assert_eq!(ema.updates, 1);
}

#[test]
fn loss_scaler_unscales_skips_on_overflow_and_grows() {
    let d = device();
    let m = tiny(&d);
    let table = Optimizer::new(Rule::Sgd, &m).table;
    let mut s = LossScaler {
        scale: 4.0,
        growth_interval: 2,
        ..LossScaler::default()
    };
    let mut g = grads(&m, [[4.0, -8.0, 2.0], [0.0, 1.0, -1.0]], None, &d);
    assert!(s.unscale(&mut g, &table));
    let w = grads::get_flat(&g, &table[0]).unwrap();
    close(&values(w), &[1.0, -2.0, 0.5, 0.0, 0.25, -0.25], 1e-12);
    // The absent bias stays absent.
    assert!(grads::get_flat(&g, &table[1]).is_none());
    let h0 = s.state_hash();
    s.update(true);
    assert_eq!((s.scale, s.growth_tracker), (4.0, 1));
    assert_ne!(s.state_hash(), h0);
    s.update(true);
    assert_eq!((s.scale, s.growth_tracker), (8.0, 0));
    for bad in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
        let mut g = grads(&m, [[1.0, bad, 0.0], [0.0; 3]], Some([1.0, 1.0]), &d);
        assert!(!s.unscale(&mut g, &table), "{bad} must be found");
        // In the bias, the last segment of the flat buffer.
        let mut g = grads(&m, [[1.0; 3], [0.0; 3]], Some([1.0, bad]), &d);
        assert!(
            !s.unscale(&mut g, &table),
            "{bad} in the bias must be found"
        );
    }
    // Every value finite, though their sum overflows f32: finite, as PyTorch checks each value.
    let mut g = grads(&m, [[3e38, 3e38, -3e38], [3e38; 3]], None, &d);
    let one = LossScaler {
        scale: 1.0,
        ..LossScaler::default()
    };
    assert!(one.unscale(&mut g, &table));
    s.update(false);
    assert_eq!((s.scale, s.growth_tracker, s.skipped), (4.0, 0, 1));
}

/// One gradient per table parameter (the point stems left out when `skip_stems`), small enough
/// that clipping multiplies by exactly 1, from a seeded generator (the same for both arms).
pub(super) fn model_grads(
    table: &[ParamInfo],
    d: &Device,
    seed: u64,
    scale: f32,
    skip_stems: bool,
) -> Vec<Option<Tensor<1>>> {
    use rand::{Rng, SeedableRng, rngs::StdRng};
    let mut rng = StdRng::seed_from_u64(seed);
    let inner = d.clone().inner();
    table
        .iter()
        .map(|p| {
            let n: usize = p.dims.iter().product();
            let v: Vec<f32> = (0..n).map(|_| rng.random_range(-scale..scale)).collect();
            let absent = skip_stems && p.path.contains("point_stems");
            (!absent).then(|| Tensor::from_data(TensorData::new(v, [n]), &inner))
        })
        .collect()
}

pub(super) fn registered(table: &[ParamInfo], g: &[Option<Tensor<1>>]) -> GradientsParams {
    let mut out = GradientsParams::new();
    for (p, g) in table.iter().zip(g) {
        if let Some(g) = g {
            grads::put_flat(&mut out, p, g.clone());
        }
    }
    out
}

/// Three steps of the nano pose model (the second without point-stem gradients), per tensor and
/// flat: the models and optimizer states must be the same bits. `scale` large enough makes the
/// clip bite, where the two sum the norm in different orders and only agree to rounding.
fn flat_against_per_tensor(rule: Rule, scale: f32) -> (String, String, Vec<f32>, Vec<f32>) {
    use crate::model::{Scale, Task, YoloConfig};
    let d = device();
    let model = YoloConfig::new(Scale::N, Task::Pose).init(&d);
    let mut per_tensor = Optimizer::new(rule, &model);
    let mut flat = per_tensor.clone();
    flat.flat_update = true;
    assert!(flat.flat_active());
    let stems = per_tensor
        .table
        .iter()
        .filter(|p| p.path.contains("point_stems"))
        .count();
    assert!(stems > 0, "the nano pose model has point stems");
    let (mut a, mut b) = (model.clone(), model);
    for step in 0..3u64 {
        let g = model_grads(&per_tensor.table, &d, step, scale, step == 1);
        let h = Hyper {
            lr: [0.01, 0.02, 0.1 - 0.01 * step as f64],
            momentum: 0.8 + 0.05 * step as f64,
            weight_decay: 5e-4,
        };
        a = per_tensor.step_clipped(a, registered(&per_tensor.table, &g), &h, 10.0);
        b = flat.step_clipped(b, registered(&flat.table, &g), &h, 10.0);
    }
    for (s, t) in per_tensor.state.iter().zip(&flat.state) {
        assert_eq!(s.steps, t.steps);
        assert_eq!(s.buf.is_some(), t.buf.is_some());
        assert_eq!(s.second.is_some(), t.second.is_some());
    }
    let stem = per_tensor
        .table
        .iter()
        .position(|p| p.path.contains("point_stems"))
        .unwrap();
    assert_eq!(
        flat.state[stem].steps, 2,
        "a stem without a gradient must not count a step"
    );
    let first = |m: &crate::model::Yolo| {
        let (_, t) = tensors::float_tensors(m).into_iter().next().unwrap();
        values(t)
    };
    (
        format!("{} {}", hash::module_hash(&a), per_tensor.state_hash()),
        format!("{} {}", hash::module_hash(&b), flat.state_hash()),
        first(&a),
        first(&b),
    )
}

#[test]
fn flat_update_equals_per_tensor_adamw() {
    let (a, b, _, _) = flat_against_per_tensor(Rule::AdamW, 1e-4);
    assert_eq!(a, b);
}

/// MuSGD through the flat buffers (the Muon step orthogonalised per matrix, the class branches'
/// boost, the SGD half): the per-tensor update's bits.
#[test]
fn flat_update_equals_per_tensor_musgd() {
    let (a, b, _, _) = flat_against_per_tensor(Rule::MuSgd, 1e-4);
    assert_eq!(a, b);
}

#[test]
fn flat_update_equals_per_tensor_sgd() {
    let (a, b, _, _) = flat_against_per_tensor(Rule::Sgd, 1e-4);
    assert_eq!(a, b);
}

#[test]
fn flat_update_clips_like_per_tensor() {
    let (_, _, a, b) = flat_against_per_tensor(Rule::Sgd, 1.0);
    let worst = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    let size = a.iter().map(|x| x.abs()).fold(0f32, f32::max);
    assert!(
        worst <= 1e-6 * size,
        "largest difference {worst} for values up to {size}"
    );
}

/// The flat EMA against the per-tensor one over three updates (the decay changes with each),
/// on the CPU's loop and on CUDA's tensor path (the decay a device value): the same bits.
#[test]
fn flat_ema_equals_per_tensor() {
    use crate::model::{Scale, Task, YoloConfig};
    let d = device();
    let model = YoloConfig::new(Scale::N, Task::Pose).init(&d);
    let run = || {
        let mut per_tensor = Ema::new(&model);
        let mut flat = Ema::new(&model);
        flat.flat_update = true;
        let mut m = model.clone();
        for k in 0..3 {
            // Move every float tensor, running statistics included, differently per step.
            let mut moved: std::collections::HashMap<String, Tensor<1>> =
                tensors::float_tensors(&m)
                    .into_iter()
                    .map(|(p, t)| (p, t.inner().mul_scalar(0.5).add_scalar(0.1 * k as f64)))
                    .collect();
            m = tensors::replace_float_tensors(m, &mut moved).0;
            per_tensor.update(&m);
            flat.update(&m);
        }
        assert_ne!(per_tensor.state_hash(), Ema::new(&m).state_hash());
        (per_tensor.state_hash(), flat.state_hash())
    };
    let (a, b) = run();
    assert_eq!(a, b, "host loop");
    let (a, b) = super::host::force::with_tensor_path(run);
    assert_eq!(a, b, "tensor path");
}

#[test]
fn flat_update_keeps_frozen_parameters_frozen() {
    let d = device();
    let m = tiny(&d);
    let m = Tiny {
        weight: m.weight,
        bias: m.bias.set_require_grad(false),
    };
    let mut opt = Optimizer::new(Rule::AdamW, &m);
    opt.flat_update = true;
    let bias = values(m.bias.val());
    let g = grads_for(&opt, [[0.1, 0.2, -0.3], [1.0, 0.0, 0.5]], &d);
    let m = opt.step_clipped(m, g, &hyper(0.01, 0.9, 0.1), 10.0);
    assert!(m.weight.val().is_require_grad());
    assert!(
        !m.bias.val().is_require_grad(),
        "the frozen bias was unfrozen"
    );
    assert_eq!(values(m.bias.val()), bias);
}

/// Three micro-batches of the nano pose model whose backbone gradients (and the flow's) come as
/// views of flat buffers (as step replay hands them out): summed as buffers, they must give the
/// per-tensor sums' bits, and a buffer laid out differently must fall back to them, alone.
#[test]
fn flat_accumulation_equals_per_tensor() {
    use crate::model::{Scale, Task, YoloConfig};
    use crate::optim::layout::Layout;
    use grads::{FlatGrads, accumulate, get_flat};
    let d = device();
    let model = YoloConfig::new(Scale::N, Task::Pose).init(&d);
    let table = Optimizer::new(Rule::AdamW, &model).table;
    // A buffer: the parameters under a prefix, less the first few (another layout).
    type Buffer<'a> = (&'a str, usize);
    let set = |(prefix, skip): Buffer| -> Vec<ParamInfo> {
        table
            .iter()
            .filter(|p| p.path.starts_with(prefix))
            .skip(skip)
            .cloned()
            .collect()
    };
    let micro: Vec<Vec<Option<Tensor<1>>>> = (0..3)
        .map(|k| model_grads(&table, &d, 40 + k, 1.0, k == 1))
        .collect();
    // Micro-batch `k`'s gradients, those of each of `sets` as views of one buffer.
    let with_flats = |k: usize, sets: &[Vec<ParamInfo>]| -> (GradientsParams, Vec<FlatGrads>) {
        let mut g = registered(&table, &micro[k]);
        let flats = sets
            .iter()
            .map(|params| {
                let parts = params.iter().map(|p| grads::take_flat(&mut g, p)).collect();
                let layout = Layout::new(params.iter().map(ParamInfo::numel).collect());
                let buf = layout.gather(parts, &d.clone().inner());
                let flat = FlatGrads {
                    params: params.to_vec(),
                    layout,
                    buf,
                    copy: None,
                };
                flat.put_views(&mut g);
                flat
            })
            .collect();
        (g, flats)
    };
    // The pending gradients after three micro-batches, and how many buffers they are views of.
    let run = |buffers: [&[Buffer]; 3]| -> (GradientsParams, usize) {
        let (mut pending, mut pending_flat) = (None, Vec::new());
        for (k, sets) in buffers.iter().enumerate() {
            let sets: Vec<Vec<ParamInfo>> = sets.iter().map(|&b| set(b)).collect();
            let (g, flats) = with_flats(k, &sets);
            accumulate(&mut pending, &mut pending_flat, g, flats, &table, true);
        }
        (pending.unwrap(), pending_flat.len())
    };
    let (reference, _) = run([&[], &[], &[]]);
    let bytes = |g: &GradientsParams| -> Vec<Option<Vec<u8>>> {
        table
            .iter()
            .map(|p| get_flat(g, p).map(|t| t.into_data().as_bytes().to_vec()))
            .collect()
    };
    let (backbone, flow) = (("backbone.", 0), ("head.flow.", 0));
    let (one, two): (&[Buffer], &[Buffer]) = (&[backbone], &[backbone, flow]);
    let cases: [([&[Buffer]; 3], usize, &str); 4] = [
        ([one; 3], 1, "equal layouts must be summed as buffers"),
        (
            [one, &[("backbone.", 1)], one],
            0,
            "a different layout must fall back to per-tensor sums",
        ),
        ([two; 3], 2, "two buffers must be summed apart"),
        (
            [
                &[backbone, flow],
                &[backbone, ("head.flow.", 1)],
                &[backbone, flow],
            ],
            1,
            "only the buffer laid out differently falls back",
        ),
    ];
    for (buffers, summed, what) in cases {
        let (sums, pending) = run(buffers);
        assert_eq!(pending, summed, "{what}");
        assert_eq!(bytes(&sums), bytes(&reference), "{what}: other values");
    }
    assert!(
        micro[1].iter().any(Option::is_none),
        "the test needs a parameter absent from one micro-batch"
    );
}

/// Views of a recorder's buffer (`FlatGrads::copy`) that pending gradients would keep as they are
/// become views of a copy; summed into a buffer of their own, or consumed in the same step, they
/// are not copied. The copy here adds 1000, so the values show which buffer a view reads.
#[test]
fn accumulation_copies_a_recorders_buffer_only_to_keep_it() {
    use crate::optim::layout::Layout;
    use grads::{FlatGrads, accumulate, get_flat};
    let d = device();
    let inner = d.clone().inner();
    let m = tiny(&d);
    let table = Optimizer::new(Rule::AdamW, &m).table;
    let marked: fn(Tensor<1>) -> Tensor<1> = |t| t + 1000.0;
    // Micro-batch gradients of `params`, every value `v`, as views of a recorder's buffer.
    let micro = |v: f32, params: &[ParamInfo]| -> (GradientsParams, Option<FlatGrads>) {
        let layout = Layout::new(params.iter().map(ParamInfo::numel).collect());
        let flat = FlatGrads {
            params: params.to_vec(),
            buf: Tensor::<1>::full([layout.len], v, &inner),
            layout,
            copy: Some(marked),
        };
        let mut g = GradientsParams::new();
        flat.put_views(&mut g);
        (g, Some(flat))
    };
    // (weight, bias) of the pending gradients after each of two micro-batches, and whether
    // the pending flat buffer is a recorder's.
    let step = |kept: [bool; 2], second: &[ParamInfo]| {
        let (mut pending, mut pending_flat) = (None, Vec::new());
        let read = |pending: &Option<GradientsParams>| -> Vec<Vec<f32>> {
            let g = pending.as_ref().unwrap();
            table
                .iter()
                .map(|p| values(get_flat(g, p).unwrap()))
                .collect()
        };
        let (g, f) = micro(1.0, &table);
        accumulate(
            &mut pending,
            &mut pending_flat,
            g,
            f.into_iter().collect(),
            &table,
            kept[0],
        );
        let first = read(&pending);
        let (g, f) = micro(2.0, second);
        accumulate(
            &mut pending,
            &mut pending_flat,
            g,
            f.into_iter().collect(),
            &table,
            kept[1],
        );
        (
            first,
            read(&pending),
            pending_flat.first().map(|f| f.copy.is_some()),
        )
    };
    // Kept: the first micro-batch's views move to a copy; the second is summed into a new buffer.
    let (first, sum, flat) = step([true, true], &table);
    assert_eq!(first, [vec![1001.0; 6], vec![1001.0; 2]]);
    assert_eq!(sum, [vec![1003.0; 6], vec![1003.0; 2]]);
    assert_eq!(flat, Some(false));
    // Consumed in this step: no copy.
    let (first, _, flat) = step([false, false], &table);
    assert_eq!(first, [vec![1.0; 6], vec![1.0; 2]]);
    assert_eq!(flat, Some(false));
    // A different layout falls back to per-tensor sums, which hold a view of the second
    // micro-batch where a parameter had no pending gradient: kept, it is a copy.
    let (_, sum, flat) = step([true, true], &table[1..]);
    assert_eq!(sum, [vec![1001.0; 6], vec![2003.0; 2]]);
    assert_eq!(flat, None);
}

/// CUDA's flat update (tensor operations, the momentum a device value) run on the CPU, where
/// `host_update` runs otherwise: the same bits as the per-tensor update, with the momentum
/// changing every step as in warm-up, for each rule.
#[test]
fn flat_tensor_path_equals_per_tensor() {
    for rule in [Rule::AdamW, Rule::Sgd, Rule::MuSgd] {
        let (a, b, _, _) =
            super::host::force::with_tensor_path(|| flat_against_per_tensor(rule, 1e-4));
        assert_eq!(a, b, "{rule:?}");
    }
}
