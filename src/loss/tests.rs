use super::reference::{branch_terms, ciou};
use super::terms::{bce_with_logits, branch_loss};
use super::*;
use burn::tensor::Distribution;

fn scalar(t: Tensor<1>) -> f32 {
    t.into_scalar::<f32>()
}

#[test]
fn bce_by_hand() {
    let d = Device::flex();
    let x = Tensor::<1>::from_floats([0.0, 2.0, -3.0], &d);
    let t = Tensor::<1>::from_floats([0.5, 1.0, 0.0], &d);
    let got = bce_with_logits(x, t)
        .into_data()
        .try_into_vec::<f32>()
        .unwrap();
    let want = [
        2f32.ln(),
        (1.0 + (-2f32).exp()).ln(),
        (1.0 + (-3f32).exp()).ln(),
    ];
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-6, "{got:?} vs {want:?}");
    }
}

#[test]
fn tensor_ciou_matches_host_ciou() {
    let d = Device::flex();
    let boxes = [
        ([0.0, 0.0, 2.0, 2.0], [1.0, 0.0, 3.0, 2.0]),
        ([0.5, 1.0, 4.0, 3.0], [1.0, 0.0, 2.5, 5.0]),
        ([0.0, 0.0, 1.0, 1.0], [3.0, 3.0, 4.0, 6.0]),
    ];
    let p: Vec<f32> = boxes.iter().flat_map(|b| b.0).collect();
    let t: Vec<f32> = boxes.iter().flat_map(|b| b.1).collect();
    let got = ciou(
        Tensor::<1>::from_floats(p.as_slice(), &d).reshape([3, 4]),
        Tensor::<1>::from_floats(t.as_slice(), &d).reshape([3, 4]),
    )
    .into_data()
    .try_into_vec::<f32>()
    .unwrap();
    for (g, (a, b)) in got.iter().zip(boxes) {
        assert!((g - geometry::ciou(a, b)).abs() < 1e-5);
    }
}

/// One 32×32 image, nc = 1, two keypoints, one foreground row at anchor 0 (stride 8).
fn tiny_case(d: &Device, with_fg: bool) -> (BranchOutput, BranchTargets) {
    let a = 21;
    let out = BranchOutput {
        boxes: Tensor::full([1, 4, a], 0.5, d),
        scores: Tensor::zeros([1, 1, a], d),
        kpts: Some(Tensor::zeros([1, 6, a], d)),
        kpts_sigma: Some(Tensor::zeros([1, 4, a], d)),
    };
    let mut target_scores = vec![0.0; a];
    let mut t = BranchTargets {
        batch: 1,
        anchors: a,
        nc: 1,
        target_scores: vec![],
        score_sum: 1.0,
        fg_rows: vec![],
        fg_weight: vec![],
        fg_anchor: vec![],
        fg_stride: vec![],
        fg_box: vec![],
        fg_kpts: vec![],
        nk: 2,
        fg_ltrb: vec![],
        fg_raw_kpts: vec![],
        kpt_dim: 3,
    };
    if with_fg {
        target_scores[0] = 0.5;
        t.fg_rows = vec![0];
        t.fg_weight = vec![0.5];
        t.fg_anchor = vec![[0.5, 0.5]];
        t.fg_stride = vec![8.0];
        t.fg_box = vec![[0.0, 0.0, 2.0, 1.0]];
        t.fg_kpts = vec![[0.5, 0.5, 2.0], [1.5, 0.5, 2.0]];
        t.fg_ltrb = vec![[0.5; 4]];
        t.fg_raw_kpts = vec![0.0; 6];
    }
    t.target_scores = target_scores;
    (out, t)
}

use crate::model::BranchOutput;
use crate::model::flow::RealNvpConfig;
use targets::BranchTargets;

#[test]
fn each_term_by_hand() {
    let d = Device::flex();
    let flow = RealNvpConfig::new().init(&d);
    let (out, t) = tiny_case(&d, true);
    let sig = [0.5, 0.5];
    let terms: Vec<f32> = branch_loss(&out, &t, Some(&flow), [32, 32], &sig, [1.0; 6])
        .items
        .into_data()
        .try_into_vec::<f32>()
        .unwrap();
    let reference: Vec<f32> = branch_terms(&out, &t, Some(&flow), [32, 32], &sig)
        .map(scalar)
        .to_vec();
    let ln2 = 2f32.ln();
    // box: prediction [0, 0, 1, 1] vs target [0, 0, 2, 1], weight 0.5, score sum 1.
    let box_loss = (1.0 - geometry::ciou([0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 2.0, 1.0])) * 0.5;
    // pose: keypoint 1 is 1 grid unit off, area 2, σ 0.5 → e = 1 / (8·0.25·2) = 0.25.
    let pose = (1.0 - (-0.25f32).exp()) / 2.0;
    // cls: logits 0 → ln 2 whatever the target, 21 anchors, score sum 1.
    let cls = 21.0 * ln2;
    // l1: target ltrb [.5, .5, 1.5, .5] vs [.5, .5, .5, .5] → |Δ| 1 on one side × 8/32, mean /4, × 0.5.
    let l1 = 0.25 / 4.0 * 0.5;
    // rle: σ = 0.5, ε = (0, 0) and (−2, 0).
    let lp = |x: f32, y: f32| {
        scalar(flow.log_prob(Tensor::<1>::from_floats([x, y], &d).reshape([1, 2])))
    };
    let per = |e: f32, phi: f32| 2.0 * 0.5f32.ln() + 2.0 * 1f32.ln() + e - 2.0 * phi;
    let rle = ((per(0.0, lp(0.0, 0.0)) + per(2.0, lp(-2.0, 0.0))) / 2.0).max(0.0);
    let want = [box_loss, pose, ln2, cls, l1, rle];
    for (i, (g, w)) in terms.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() < 1e-4 * w.abs().max(1.0),
            "{}: {g} vs {w}",
            TERMS[i]
        );
        assert!((reference[i] - w).abs() < 1e-4 * w.abs().max(1.0));
    }
}

#[test]
fn no_positives_leave_keypoint_outputs_without_gradient() {
    let d = Device::flex().autodiff();
    let flow = RealNvpConfig::new().init(&d);
    let (mut out, t) = tiny_case(&d, false);
    out.kpts = out.kpts.map(|k| k.require_grad());
    out.kpts_sigma = out.kpts_sigma.map(|k| k.require_grad());
    out.boxes = out.boxes.require_grad();
    out.scores = out.scores.require_grad();
    let loss = branch_loss(&out, &t, Some(&flow), [32, 32], &[0.5, 0.5], DEFAULT_GAINS);
    let grads = loss.sum.backward();
    assert!(out.kpts.as_ref().unwrap().grad(&grads).is_none());
    assert!(out.kpts_sigma.as_ref().unwrap().grad(&grads).is_none());
    assert!(out.boxes.grad(&grads).is_none());
    assert!(out.scores.grad(&grads).is_some());
    assert!(flow.scale_nets[0].fc1.weight.grad(&grads).is_none());
}

#[test]
fn prog_loss_schedule() {
    let mut loss = E2eLoss::new(Task::Pose, 17, [64, 64]);
    assert!((loss.one2many_weight - 0.8).abs() < 1e-6);
    loss.update(2, 5);
    assert!((loss.one2many_weight - (0.5 * 0.7 + 0.1)).abs() < 1e-6);
    loss.update(4, 5);
    assert!((loss.one2many_weight - 0.1).abs() < 1e-6);
}

/// Finite differences of the full E2E loss w.r.t. every head output, targets held fixed.
#[test]
fn full_loss_gradient_matches_finite_differences() {
    use rand::{Rng, SeedableRng, rngs::StdRng};
    let d = Device::flex().autodiff();
    d.seed(3);
    let flow = RealNvpConfig::new().init(&d);
    let a = 21;
    // The head outputs come from this test's own generator: the device's is shared by tests
    // running in parallel, which made these values (and sometimes the check) vary run to run.
    let rng = std::cell::RefCell::new(StdRng::seed_from_u64(3));
    let rand = |c: usize, lo: f32, hi: f32| {
        let v: Vec<f32> = (0..c * a)
            .map(|_| rng.borrow_mut().random_range(lo..hi))
            .collect();
        Tensor::<1>::from_floats(v.as_slice(), &d).reshape([1, c, a])
    };
    let branch = || BranchOutput {
        boxes: rand(4, 0.3, 1.5),
        scores: rand(1, -2.0, 1.0),
        kpts: Some(rand(6, -0.5, 0.5)),
        kpts_sigma: Some(rand(4, -1.0, 1.0)),
    };
    let out = HeadOutput {
        one2many: branch(),
        one2one: branch(),
    };
    let mut loss = E2eLoss::new(Task::Pose, 2, [32, 32]);
    loss.sigmas = vec![0.3, 0.4];
    let labels = vec![vec![Instance {
        class: 0,
        bbox: [2.0, 3.0, 20.0, 22.0],
        keypoints: vec![[6.0, 8.0, 2.0], [14.0, 12.0, 1.0]],
    }]];
    let targets = loss.targets(&out, &labels);
    assert!(targets.one2many.num_fg() > 0 && targets.one2one.num_fg() == 1);
    // Leaves with gradients.
    let leaf = |t: &Tensor<3>| t.clone().detach().require_grad();
    let branch_leaf = |b: &BranchOutput| BranchOutput {
        boxes: leaf(&b.boxes),
        scores: leaf(&b.scores),
        kpts: b.kpts.as_ref().map(leaf),
        kpts_sigma: b.kpts_sigma.as_ref().map(leaf),
    };
    let x = HeadOutput {
        one2many: branch_leaf(&out.one2many),
        one2one: branch_leaf(&out.one2one),
    };
    let grads = loss.compute(&x, &targets, Some(&flow)).total.backward();
    // The assignment stays fixed; the foreground rows' predictions are those of the probe.
    let value = |h: &HeadOutput| {
        let t = LossTargets {
            one2many: with_predictions(&targets.one2many, &h.one2many),
            one2one: with_predictions(&targets.one2one, &h.one2one),
        };
        scalar(loss.compute(h, &t, Some(&flow)).total.inner())
    };
    type Pick = fn(&mut HeadOutput) -> &mut Tensor<3>;
    let tensors: Vec<(&str, Pick)> = vec![
        ("o2m.boxes", |h| &mut h.one2many.boxes),
        ("o2m.scores", |h| &mut h.one2many.scores),
        ("o2m.kpts", |h| h.one2many.kpts.as_mut().unwrap()),
        ("o2m.sigma", |h| h.one2many.kpts_sigma.as_mut().unwrap()),
        ("o2o.boxes", |h| &mut h.one2one.boxes),
        ("o2o.kpts", |h| h.one2one.kpts.as_mut().unwrap()),
    ];
    let mut checked = 0;
    for (name, get) in tensors {
        let mut probe = x.clone();
        let analytic = get(&mut probe)
            .grad(&grads)
            .expect("gradient")
            .into_data()
            .try_into_vec::<f32>()
            .unwrap();
        let base: Vec<f32> = get(&mut probe)
            .clone()
            .inner()
            .into_data()
            .try_into_vec::<f32>()
            .unwrap();
        let dims = get(&mut probe).dims();
        // Probe the entries with the largest gradients (those that matter) plus a few others.
        let mut order: Vec<usize> = (0..base.len()).collect();
        order.sort_by(|&i, &j| analytic[j].abs().total_cmp(&analytic[i].abs()));
        for &i in order.iter().take(6) {
            let h = 1e-2f32;
            let shifted = |delta: f32| {
                let mut v = base.clone();
                v[i] += delta;
                let mut probe = x.clone();
                *get(&mut probe) = Tensor::<1>::from_floats(v.as_slice(), &d).reshape(dims);
                value(&probe)
            };
            let numeric = (shifted(h) - shifted(-h)) / (2.0 * h);
            let tol = 2e-2 * numeric.abs().max(analytic[i].abs()) + 2e-3;
            assert!(
                (numeric - analytic[i]).abs() <= tol,
                "{name}[{i}]: analytic {} vs numeric {numeric}",
                analytic[i]
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 36);
}

/// `t` with its foreground rows' predictions read from `out` instead.
fn with_predictions(t: &BranchTargets, out: &BranchOutput) -> BranchTargets {
    // Channel `ch` of foreground row `row` (= b · A + a) of a `[B, C, A]` output.
    let rows = |x: &Tensor<3>| -> Vec<Vec<f32>> {
        let (c, v) = (x.dims()[1], targets::host(x.clone()));
        let a_len = t.anchors;
        t.fg_rows
            .iter()
            .map(|&row| {
                let (b, a) = (row as usize / a_len, row as usize % a_len);
                (0..c).map(|ch| v[(b * c + ch) * a_len + a]).collect()
            })
            .collect()
    };
    let mut t = t.clone();
    t.fg_ltrb = rows(&out.boxes)
        .iter()
        .map(|r| [r[0], r[1], r[2], r[3]])
        .collect();
    if let Some(k) = &out.kpts {
        t.fg_raw_kpts = rows(k).concat();
    }
    t
}

/// `build_targets` decodes predictions at candidate anchors only; the assignment must be the one
/// fully decoded predictions give.
#[test]
fn decoding_only_candidates_changes_no_assignment() {
    use super::assign::{Anchors, AssignerConfig, Predicted, Target, assign};
    use super::targets::{build_targets, host};
    let d = Device::flex();
    d.seed(9);
    let (h, w, nk) = (64, 96, 17);
    let anchors = Anchors::new(h, w);
    let a_len = anchors.len();
    let sigmas = geometry::sigmas(nk);
    let t = |c: usize, dist| Tensor::<3>::random([2, c, a_len], dist, &d);
    let out = BranchOutput {
        boxes: t(4, Distribution::Uniform(0.2, 4.0)),
        scores: t(2, Distribution::Normal(-1.0, 2.0)),
        kpts: Some(t(nk * 3, Distribution::Normal(0.0, 2.0))),
        kpts_sigma: Some(t(nk * 2, Distribution::Normal(0.0, 1.0))),
    };
    let inst = |bbox: [f32; 4], class| Instance {
        class,
        bbox,
        keypoints: (0..nk)
            .map(|j| [bbox[0] + j as f32, bbox[1] + 2.0 * j as f32, (j % 3) as f32])
            .collect(),
    };
    let labels = vec![
        vec![
            inst([4.0, 6.0, 60.0, 50.0], 0),
            inst([30.0, 10.0, 90.0, 62.0], 1),
            inst([40.0, 40.0, 41.0, 42.0], 1),
        ],
        vec![inst([0.0, 0.0, 96.0, 64.0], 0)],
    ];
    let (boxes, scores, kpts) = (
        host(out.boxes.clone()),
        host(out.scores.clone()),
        host(out.kpts.clone().unwrap()),
    );
    for cfg in [
        AssignerConfig::one2many(true),
        AssignerConfig::one2one(true),
    ] {
        let built = build_targets(&cfg, &anchors, &out, &labels, &sigmas);
        let mut fg_rows = Vec::new();
        for (b, image) in labels.iter().enumerate() {
            let at = |ch: usize, c: usize, a: usize| b * ch * a_len + c * a_len + a;
            let decode = |a: usize, [x, y]: [f32; 2]| {
                let s = anchors.strides[a];
                [
                    (x + anchors.points[a][0]) * s,
                    (y + anchors.points[a][1]) * s,
                ]
            };
            let pred_boxes: Vec<[f32; 4]> = (0..a_len)
                .map(|a| {
                    let [l, t] = decode(a, [-boxes[at(4, 0, a)], -boxes[at(4, 1, a)]]);
                    let [r, bt] = decode(a, [boxes[at(4, 2, a)], boxes[at(4, 3, a)]]);
                    [l, t, r, bt]
                })
                .collect();
            let probs: Vec<f32> = (0..a_len * 2)
                .map(|i| 1.0 / (1.0 + (-scores[at(2, i % 2, i / 2)]).exp()))
                .collect();
            let pk: Vec<[f32; 2]> = (0..a_len * nk)
                .map(|i| {
                    let (a, j) = (i / nk, i % nk);
                    decode(
                        a,
                        [kpts[at(nk * 3, j * 3, a)], kpts[at(nk * 3, j * 3 + 1, a)]],
                    )
                })
                .collect();
            let targets: Vec<Target> = image.iter().map(|i| Target::of(i, true)).collect();
            let pred = Predicted {
                scores: &probs,
                boxes: &pred_boxes,
                keypoints: Some(&pk),
                nc: 2,
            };
            let asg = assign(&cfg, &anchors, &pred, &targets, &sigmas);
            for a in 0..a_len {
                for c in 0..2 {
                    assert_eq!(
                        built.target_scores[at(2, c, a)],
                        asg.target_scores[a * 2 + c],
                        "{cfg:?} image {b} anchor {a}"
                    );
                }
                if asg.fg[a] {
                    fg_rows.push((b * a_len + a) as i64);
                }
            }
        }
        assert!(!fg_rows.is_empty());
        assert_eq!(built.fg_rows, fg_rows, "{cfg:?}");
    }
}
