use super::*;
use crate::loss::assign::device::tests::case;
use crate::loss::assign::device::{AnchorTensors, ObjectSlots, assign_batch};
use crate::loss::assign::{Anchors, AssignerConfig};
use crate::loss::geometry::sigmas;
use crate::loss::reference::branch_terms;
use crate::loss::targets::build_targets;
use crate::model::flow::RealNvpConfig;
use burn::tensor::Distribution;
use rand::{SeedableRng, rngs::StdRng};

fn value(t: Tensor<1>) -> f32 {
    t.into_scalar::<f32>()
}

fn grad_values(t: &Tensor<3>, grads: &burn::tensor::Gradients) -> Vec<f32> {
    t.grad(grads)
        .map(|g| g.into_data().convert::<f32>().try_to_vec::<f32>().unwrap())
        .unwrap_or_default()
}

/// A copy's six terms (unweighted, in the gains' order: box, pose, kobj, cls, l1, rle) as the
/// device loss normalises them, and its labelled keypoints, `[1]` each; `k` keypoints.
fn named(t: &DenseTerms, k: usize) -> [Tensor<1>; 7] {
    let combine = Combine::new(k, [1.0; 6], &t.sums.device());
    let (terms, _) = combine.terms(std::slice::from_ref(t));
    let term = |i: usize| terms.clone().narrow(1, i, 1).reshape([1]);
    let labelled = t.sums.clone().narrow(0, column::LABELLED, 1);
    let [a, b, c, d, e, f] = std::array::from_fn(term);
    [a, b, c, d, e, f, labelled]
}

/// A branch's outputs by name, the optional ones where present.
fn outputs(o: &BranchOutput) -> Vec<(&'static str, &Tensor<3>)> {
    let mut v = vec![("boxes", &o.boxes), ("scores", &o.scores)];
    v.extend(o.kpts.iter().map(|k| ("kpts", k)));
    v.extend(o.kpts_sigma.iter().map(|s| ("kpts_sigma", s)));
    v
}

/// The largest difference between two gradients of one tensor (an absent `theirs` counts as
/// zeros), and the scale it is held to: the largest magnitude of `theirs`, at least 1e-6.
fn difference(ours: &[f32], theirs: &[f32]) -> (f32, f32) {
    let scale = theirs.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    let worst = ours
        .iter()
        .zip(theirs.iter().chain(std::iter::repeat(&0.0)))
        .fold(0.0f32, |m, (p, q)| m.max((p - q).abs()));
    (worst, scale)
}

/// The dense terms from the device assignment equal the row-wise reference terms from the host
/// assignment (`reference::branch_terms`, itself held to the host terms), in value and in the
/// gradients they send to the box, keypoint, keypoint-sigma and score outputs, on random batches
/// with and without foreground, pose (with and without the RLE flow) and detection.
#[test]
fn dense_terms_equal_the_row_wise_terms() {
    let device = Device::flex().autodiff();
    let mut rng = StdRng::seed_from_u64(5);
    let (mut with_fg, mut compared) = (0, 0);
    for i in 0..60 {
        let c = case(&mut rng, i, &device);
        let pose = i % 4 != 3;
        let cfg = if i % 2 == 0 {
            AssignerConfig::one2many(pose)
        } else {
            AssignerConfig::one2one(pose)
        };
        let anchors = Anchors::new(c.h, c.w);
        let a = anchors.len();
        let b = c.labels.len();
        let nk = if pose { c.nk } else { 0 };
        let out = BranchOutput {
            boxes: c.out.boxes.clone().require_grad(),
            scores: c.out.scores.clone().require_grad(),
            kpts: pose.then(|| c.out.kpts.clone().unwrap().require_grad()),
            kpts_sigma: pose.then(|| {
                Tensor::<3>::random([b, c.nk * 2, a], Distribution::Normal(0.0, 1.0), &device)
                    .require_grad()
            }),
        };
        let sig = sigmas(c.nk);
        // Half the cases with the keypoint flow (the RLE term), each with its own weights.
        let flow = (pose && i % 2 == 0).then(|| RealNvpConfig::new().init(&device));
        let imgsz = [c.h, c.w];
        let objects = ObjectSlots::new(&c.labels, 3, nk, &device);
        let asg = assign_batch(
            &cfg,
            &AnchorTensors::new(&anchors, &device),
            &out,
            &objects,
            &sig,
        );
        let rows = KeypointRows::new(&sig, &device);
        let dense = dense_terms(
            &[(&out, &asg)],
            &objects,
            &AnchorTensors::new(&anchors, &device),
            imgsz,
            Some(&rows),
            flow.as_ref(),
        )
        .remove(0);
        let t = build_targets(&cfg, &anchors, &out, &c.labels, &sig);
        let [r_box, r_pose, r_kobj, r_cls, r_l1, r_rle] =
            branch_terms(&out, &t, flow.as_ref(), imgsz, &sig);
        let gains = [7.5, 12.0, 1.0, 0.5, 1.5, 1.0];
        let all = named(&dense, c.nk);
        let ours: [Tensor<1>; 6] = std::array::from_fn(|k| all[k].clone());
        let theirs = [r_box, r_pose, r_kobj, r_cls, r_l1, r_rle];
        let total = |terms: &[Tensor<1>; 6]| {
            terms
                .iter()
                .zip(gains)
                .map(|(t, g)| t.clone() * g)
                .reduce(|x, y| x + y)
                .unwrap()
        };
        let (g_ours, g_theirs) = (total(&ours).backward(), total(&theirs).backward());
        for (name, (x, y)) in ["box", "pose", "kobj", "cls", "l1", "rle"]
            .iter()
            .zip(ours.into_iter().zip(theirs))
        {
            let (x, y) = (value(x), value(y));
            assert!(
                (x - y).abs() <= 1e-5 * y.abs().max(1.0),
                "case {i} {name}: dense {x} vs rows {y}"
            );
        }
        for (name, x) in outputs(&out) {
            let (gx, gy) = (grad_values(x, &g_ours), grad_values(x, &g_theirs));
            let (worst, scale) = difference(&gx, &gy);
            assert!(
                worst <= 1e-4 * scale,
                "case {i} gradient of {name}: worst difference {worst} (largest {scale})"
            );
        }
        compared += 1;
        with_fg += (t.num_fg() > 0) as usize;
    }
    assert_eq!(compared, 60);
    assert!(with_fg > 30, "{with_fg} cases with foreground");
}

/// Both copies through [`E2eLoss::compute_on_device`] give [`E2eLoss::compute`]'s total and
/// logged items, and its gradients, with the flow and the ProgLoss weights.
#[test]
fn the_device_loss_equals_the_host_loss() {
    use crate::loss::E2eLoss;
    use crate::model::{HeadOutput, Task};
    let device = Device::flex().autodiff();
    let mut rng = StdRng::seed_from_u64(9);
    // Outputs with a gradient, and without one (a copy without positives).
    let mut presence = [0, 0];
    for i in 0..24 {
        // Two draws of one shape: the two copies' outputs.
        let (c, d) = (case(&mut rng, i, &device), case(&mut rng, i, &device));
        let pose = i % 3 != 2;
        let branch = |o: &BranchOutput| BranchOutput {
            boxes: o.boxes.clone().require_grad(),
            scores: o.scores.clone().require_grad(),
            kpts: pose.then(|| o.kpts.clone().unwrap().require_grad()),
            kpts_sigma: pose.then(|| {
                let [b, _, a] = o.scores.dims();
                Tensor::<3>::random([b, c.nk * 2, a], Distribution::Normal(0.0, 1.0), &device)
                    .require_grad()
            }),
        };
        let out = HeadOutput {
            one2many: branch(&c.out),
            one2one: branch(&d.out),
        };
        let task = if pose { Task::Pose } else { Task::Detect };
        let mut loss = E2eLoss::new(task, c.nk, [c.h, c.w]);
        loss.update(i % 4, 5);
        let flow = pose.then(|| RealNvpConfig::new().init(&device));
        let host = loss.compute(&out, &loss.targets(&out, &c.labels), flow.as_ref());
        let ours = loss.compute_on_device(&out, &c.labels, flow.as_ref());
        let items = |t: Tensor<1>| t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
        for (k, (x, y)) in items(ours.items).iter().zip(items(host.items)).enumerate() {
            assert!(
                (x - y).abs() <= 1e-5 * y.abs().max(1.0),
                "case {i} item {k}: {x} vs {y}"
            );
        }
        let (x, y) = (value(ours.total.clone()), value(host.total.clone()));
        assert!(
            (x - y).abs() <= 1e-5 * y.abs().max(1.0),
            "case {i} total: {x} vs {y}"
        );
        let reached = ours.reached.expect("the device loss says what it reached");
        let (g_ours, g_host) = (ours.total.backward(), host.total.backward());
        for (copy, o) in [&out.one2many, &out.one2one].into_iter().enumerate() {
            for (j, (name, t)) in outputs(o).into_iter().enumerate() {
                let (gx, gy) = (grad_values(t, &g_ours), grad_values(t, &g_host));
                // Every output is on the device loss's tape; where the host path's gives none,
                // `reached` must say so (the caller then drops the gradients, which would move
                // parameters the host path leaves), and the values must be exact zeros.
                assert_eq!(
                    reached.outputs[copy][j],
                    !gy.is_empty(),
                    "case {i} copy {copy} {name}: presence"
                );
                presence[gy.is_empty() as usize] += 1;
                if gy.is_empty() {
                    assert!(
                        gx.iter().all(|&v| v == 0.0),
                        "case {i} copy {copy} {name}: an unreached output's gradient is not zero"
                    );
                    continue;
                }
                let (worst, scale) = difference(&gx, &gy);
                assert!(
                    worst <= 1e-4 * scale,
                    "case {i} copy {copy} {name}: {worst} of {scale}"
                );
            }
        }
    }
    assert!(presence[0] > 50 && presence[1] > 5, "{presence:?}");
}

/// Two copies whose RLE points share one flow pass (`dense_terms` on both) get the terms and
/// the output gradients each gets alone: the split of the flow's result gives each copy its own
/// points, at different row counts (the one-to-many and one-to-one assignments bound their
/// positives differently).
#[test]
fn copies_sharing_a_flow_pass_get_their_own_terms() {
    let device = Device::flex().autodiff();
    let mut rng = StdRng::seed_from_u64(11);
    let mut rows_differ = 0;
    for i in 0..12 {
        let (c, d) = (case(&mut rng, i, &device), case(&mut rng, i, &device));
        let anchors = Anchors::new(c.h, c.w);
        let a = anchors.len();
        let b = c.labels.len();
        let branch = |o: &BranchOutput| BranchOutput {
            boxes: o.boxes.clone().require_grad(),
            scores: o.scores.clone().require_grad(),
            kpts: Some(o.kpts.clone().unwrap().require_grad()),
            kpts_sigma: Some(
                Tensor::<3>::random([b, c.nk * 2, a], Distribution::Normal(0.0, 1.0), &device)
                    .require_grad(),
            ),
        };
        let outs = [branch(&c.out), branch(&d.out)];
        let sig = sigmas(c.nk);
        let flow = RealNvpConfig::new().init(&device);
        let objects = ObjectSlots::new(&c.labels, 3, c.nk, &device);
        let at = AnchorTensors::new(&anchors, &device);
        let cfgs = [
            AssignerConfig::one2many(true),
            AssignerConfig::one2one(true),
        ];
        let asgs: Vec<_> = cfgs
            .iter()
            .zip(&outs)
            .map(|(cfg, o)| assign_batch(cfg, &at, o, &objects, &sig))
            .collect();
        rows_differ += (asgs[0].max_positives != asgs[1].max_positives) as usize;
        let rows = KeypointRows::new(&sig, &device);
        let terms = |copies: &[(&BranchOutput, &BatchAssignment)]| {
            dense_terms(copies, &objects, &at, [c.h, c.w], Some(&rows), Some(&flow))
        };
        for k in 0..2 {
            // A fresh joint pass per copy: each backward consumes its graph.
            let t = terms(&[(&outs[0], &asgs[0]), (&outs[1], &asgs[1])]).remove(k);
            let alone = terms(&[(&outs[k], &asgs[k])]).remove(0);
            let (x, y) = (value(t.rle.clone()), value(alone.rle.clone()));
            assert!(
                (x - y).abs() <= 1e-5 * y.abs().max(1.0),
                "case {i} copy {k} rle: {x} vs {y}"
            );
            let (g_both, g_alone) = (t.rle.backward(), alone.rle.backward());
            for (name, o) in outputs(&outs[k]) {
                let (gx, gy) = (grad_values(o, &g_both), grad_values(o, &g_alone));
                let (worst, scale) = difference(&gx, &gy);
                assert!(
                    worst <= 1e-4 * scale,
                    "case {i} copy {k} {name}: {worst} of {scale}"
                );
            }
        }
    }
    assert!(rows_differ > 0, "no case had different row counts");
}

/// The per-anchor terms as one operation ([`anchor_terms`], the CPU's loops), and in half the
/// cases the RLE rows too, equal their tensor operations in value and in the gradients every
/// output receives, on random batches with and without foreground and the RLE flow. Control:
/// the same comparison catches the L1 term of a transposed image size on non-square inputs.
#[test]
fn anchor_terms_equal_the_tensor_operations() {
    let device = Device::flex().autodiff();
    let mut rng = StdRng::seed_from_u64(21);
    let (mut with_fg, mut caught, mut rle_rows) = (0, 0, 0);
    for i in 0..32 {
        let c = case(&mut rng, i, &device);
        let cfg = match i % 2 {
            0 => AssignerConfig::one2many(true),
            _ => AssignerConfig::one2one(true),
        };
        let anchors = Anchors::new(c.h, c.w);
        let (a, b) = (anchors.len(), c.labels.len());
        let sigma = Tensor::<3>::random([b, c.nk * 2, a], Distribution::Normal(0.0, 1.0), &device);
        let out = BranchOutput {
            boxes: c.out.boxes.clone().require_grad(),
            scores: c.out.scores.clone().require_grad(),
            kpts: Some(c.out.kpts.clone().unwrap().require_grad()),
            kpts_sigma: Some(sigma.require_grad()),
        };
        let sig = sigmas(c.nk);
        let flow = (i % 3 != 0).then(|| RealNvpConfig::new().init(&device));
        let objects = ObjectSlots::new(&c.labels, 3, c.nk, &device);
        let at = AnchorTensors::new(&anchors, &device);
        let mut asg = assign_batch(&cfg, &at, &out, &objects, &sig);
        // Two backward passes read the assignment: each consumes the tape its tensors are on.
        asg.target_scores = asg.target_scores.detach();
        let rows = KeypointRows::new(&sig, &device);
        let terms = |size: [usize; 2], on: bool| {
            let fused = Fused {
                terms: on,
                rle: on && i % 2 == 0,
            };
            terms_of(
                &[(&out, &asg)],
                &objects,
                &at,
                size,
                Some(&rows),
                flow.as_ref(),
                fused,
            )
            .remove(0)
        };
        let gains = [7.5, 12.0, 1.0, 0.5, 1.5, 1.0];
        // Whether `ours` matches `theirs` in every value and output gradient.
        let matches = |ours: DenseTerms, theirs: DenseTerms, strict: bool| {
            let (x, y) = (named(&ours, c.nk), named(&theirs, c.nk));
            let total = |t: &[Tensor<1>; 7]| {
                (0..6)
                    .map(|k| t[k].clone() * gains[k])
                    .reduce(|p, q| p + q)
                    .unwrap()
            };
            let (gx, gy) = (total(&x).backward(), total(&y).backward());
            let mut ok = true;
            for (k, (p, q)) in x.into_iter().zip(y).enumerate() {
                let (p, q) = (value(p), value(q));
                let close = (p - q).abs() <= 1e-5 * q.abs().max(1.0);
                assert!(
                    close || !strict,
                    "case {i} term {k}: fused {p} vs tensors {q}"
                );
                ok &= close;
            }
            for (name, t) in outputs(&out) {
                let (worst, scale) = difference(&grad_values(t, &gx), &grad_values(t, &gy));
                let close = worst <= 1e-4 * scale;
                assert!(close || !strict, "case {i} {name}: {worst} of {scale}");
                ok &= close;
            }
            ok
        };
        let size = [c.h, c.w];
        assert!(matches(terms(size, true), terms(size, false), true));
        if c.h != c.w {
            caught += !matches(terms([c.w, c.h], true), terms(size, false), false) as usize;
        }
        let positives = terms(size, false).sums.narrow(0, column::POSITIVES, 1);
        with_fg += (value(positives) > 0.0) as usize;
        rle_rows += (flow.is_some() && i % 2 == 0 && value(terms(size, true).rle) > 0.0) as usize;
    }
    assert!(rle_rows >= 4, "{rle_rows} cases compared fused RLE rows");
    assert!(with_fg > 16, "{with_fg} cases with foreground");
    assert!(
        caught >= 8,
        "a transposed size was caught in {caught} cases"
    );
}
