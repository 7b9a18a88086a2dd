//! The device assignment's kernels on CUDA. `kernels/assign.rs` (`bench-step --assign-kernels`)
//! against the tensor operations it replaces: random batches at odd input sizes, batches of 1
//! to 4, padded object slots, tiny objects (STAL), repeated ones (contested anchors), objects
//! with no labelled keypoint (CIoU), pose and detection, both branch copies and a second cut of
//! other sizes; continuous and quantised predictions (exact ties). The foreground and the
//! objects learnt must be equal, the soft targets within a few float steps; two runs the same
//! bits. The step recorded as one graph against the native loop with the tensor operations
//! instead (state hashes, per-step losses; the kernels, the default, are the one-graph suite's).
//! Then the top-k (`kernels/top_k.rs`) and OKS
//! (`kernels/oks.rs`) kernels against the host's rounds and formula.

use super::{Choice, cube, cube_values_of, cuda, values};
use burn::prelude::*;
use burn::tensor::{Distribution, TensorData};
use burnpose::data::Instance;
use burnpose::loss::assign::device::{AnchorTensors, ObjectSlots, assign_batch, kernel_assign};
use burnpose::loss::assign::{Anchors, AssignerConfig};
use burnpose::loss::geometry::sigmas;
use burnpose::model::BranchOutput;
use rand::{Rng, SeedableRng, rngs::StdRng};

/// One batch: outputs, labels and the rules.
struct Case {
    what: String,
    anchors: AnchorTensors,
    out: BranchOutput,
    objects: ObjectSlots,
    cfg: AssignerConfig,
    nk: usize,
}

fn case(rng: &mut StdRng, i: usize, d: &Device) -> Case {
    let sizes = [(352, 288), (96, 160), (64, 64), (640, 640), (200, 136)];
    let (h, w) = sizes[i % sizes.len()];
    let anchors = Anchors::new(h, w);
    let a = anchors.len();
    let b = 1 + i % 4;
    let (nc, nk, kd) = (1 + (i / 2) % 3, [17, 4][i % 2], [3, 2][(i / 3) % 2]);
    let pose = i % 5 != 4;
    let quantised = i.is_multiple_of(3);
    let (wf, hf) = (w as f32, h as f32);
    let labels: Vec<Vec<Instance>> = (0..b)
        .map(|_| {
            let mut objects: Vec<Instance> = Vec::new();
            for _ in 0..rng.random_range(0..7) {
                let bbox = match (rng.random_range(0..6), objects.last()) {
                    // The last object again: every anchor of it is contested.
                    (0, Some(last)) => last.bbox,
                    // Tiny: the in-box gate widens it.
                    (1, _) => {
                        let (x, y) = (
                            rng.random_range(0.0..wf - 6.0),
                            rng.random_range(0.0..hf - 6.0),
                        );
                        [
                            x,
                            y,
                            x + rng.random_range(1.0..6.0),
                            y + rng.random_range(1.0..6.0),
                        ]
                    }
                    _ => {
                        let (x, y) = (rng.random_range(-20.0..wf), rng.random_range(-20.0..hf));
                        let (bw, bh) = (rng.random_range(4.0..wf), rng.random_range(4.0..hf));
                        [x, y, x + bw, y + bh]
                    }
                };
                let labelled = rng.random_range(0..4) != 0;
                let keypoints = (0..nk)
                    .map(|_| {
                        let v = if labelled {
                            rng.random_range(0..3) as f32
                        } else {
                            0.0
                        };
                        [
                            rng.random_range(bbox[0]..bbox[2] + 1.0),
                            rng.random_range(bbox[1]..bbox[3] + 1.0),
                            v,
                        ]
                    })
                    .collect();
                objects.push(Instance {
                    class: rng.random_range(0..nc),
                    bbox,
                    keypoints,
                });
            }
            objects
        })
        .collect();
    let mut draw = |n: usize, lo: f32, hi: f32| -> Vec<f32> {
        (0..n)
            .map(|_| match quantised {
                true => (rng.random_range(lo..hi) * 2.0).round() / 2.0,
                false => rng.random_range(lo..hi),
            })
            .collect()
    };
    let t = |v: Vec<f32>, c: usize| Tensor::<1>::from_floats(v.as_slice(), d).reshape([b, c, a]);
    let out = BranchOutput {
        boxes: t(draw(b * 4 * a, 0.0, 4.0), 4),
        scores: t(draw(b * nc * a, -3.0, 3.0), nc),
        kpts: pose.then(|| t(draw(b * nk * kd * a, -3.0, 3.0), nk * kd)),
        kpts_sigma: None,
    };
    let mut cfg = match i % 3 {
        0 => AssignerConfig::one2many(pose),
        1 => AssignerConfig::one2one(pose),
        _ => AssignerConfig::one2many(pose),
    };
    if i % 3 == 2 {
        (cfg.topk, cfg.topk2) = (13, 4);
    }
    let slots = 2 + i % 5;
    Case {
        what: format!(
            "case {i}: {h}x{w} b{b} nc{nc} nk{nk} kd{kd} pose {pose} quantised {quantised} \
             topk {}/{} slots ≥ {slots}",
            cfg.topk, cfg.topk2
        ),
        anchors: AnchorTensors::new(&anchors, d),
        objects: ObjectSlots::new(&labels, slots, if pose { nk } else { 0 }, d),
        out,
        cfg,
        nk,
    }
}

/// What the assignment gives: foreground, the slots learnt, the soft targets.
#[derive(PartialEq)]
struct Got {
    fg: Vec<bool>,
    gt: Vec<i64>,
    target: Vec<f32>,
}

fn run(c: &Case, cfg: &AssignerConfig, kernels: bool) -> Got {
    let _kernels = Choice::set(kernel_assign::choose, kernels, true);
    let asg = assign_batch(cfg, &c.anchors, &c.out, &c.objects, &sigmas(c.nk));
    Got {
        fg: asg
            .fg
            .into_data()
            .convert::<bool>()
            .try_to_vec::<bool>()
            .unwrap(),
        gt: asg
            .gt_index
            .into_data()
            .convert::<i64>()
            .try_to_vec::<i64>()
            .unwrap(),
        target: asg
            .target_scores
            .into_data()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .unwrap(),
    }
}

/// `None` when `got` is `expected`'s assignment (targets within 1e-5 + 1e-4 of their size),
/// else what differs.
fn differs(got: &Got, expected: &Got) -> Option<String> {
    let fg = got
        .fg
        .iter()
        .zip(&expected.fg)
        .filter(|(a, b)| a != b)
        .count();
    let gt = (0..got.gt.len())
        .filter(|&i| expected.fg[i] && got.gt[i] != expected.gt[i])
        .count();
    let target = got
        .target
        .iter()
        .zip(&expected.target)
        .filter(|(g, e)| g.is_nan() || (*g - *e).abs() > 1e-5 + 1e-4 * e.abs())
        .count();
    (fg + gt + target > 0).then(|| format!("{fg} fg, {gt} slots, {target} targets differ"))
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn assignment_kernels_match_the_tensor_operations_on_cuda() {
    let d = cuda();
    let mut rng = StdRng::seed_from_u64(41);
    let (mut fg, mut failures, mut caught) = (0, Vec::new(), 0);
    for i in 0..30 {
        let c = case(&mut rng, i, &d);
        let expected = run(&c, &c.cfg, false);
        let got = run(&c, &c.cfg, true);
        assert!(got == run(&c, &c.cfg, true), "{}: two runs differ", c.what);
        fg += got.fg.iter().filter(|&&f| f).count();
        if let Some(why) = differs(&got, &expected) {
            failures.push(format!("{}: {why}", c.what));
        }
        // Negative control: another β changes the targets, and the check sees it.
        let mut other = c.cfg.clone();
        other.beta = 5.0;
        if expected.fg.iter().any(|&f| f) && differs(&run(&c, &other, true), &expected).is_some() {
            caught += 1;
        }
        println!(
            "{}: {} foreground",
            c.what,
            got.fg.iter().filter(|&&f| f).count()
        );
    }
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(
        fg > 500,
        "too few foreground anchors to prove anything: {fg}"
    );
    assert!(caught >= 10, "the check caught only {caught} wrong β");
    println!("{fg} foreground anchors equal; a wrong β caught in {caught} cases");
}

/// The whole step recorded as one graph (device loss) with the assignment's tensor operations
/// (the kernels off; the one-graph suite covers them on, the default): byte-equal to the native
/// loop with them off, state hashes and per-step losses (BF16).
#[test]
#[ignore = "needs a CUDA GPU"]
fn one_graph_matches_native_with_the_assignment_tensor_operations_bf16() {
    let _kernels = Choice::set(kernel_assign::choose, false, true);
    super::replay::assert_parity_of("pose-one-graph", "bf16");
}

/// As above on a batch without objects: every slot padding, no anchor foreground.
#[test]
#[ignore = "needs a CUDA GPU"]
fn one_graph_matches_native_with_the_assignment_tensor_operations_on_an_empty_batch() {
    let _kernels = Choice::set(kernel_assign::choose, false, true);
    super::replay::assert_empty_parity("pose-one-graph");
}

/// The device assignment's top-k kernel (`kernels/top_k.rs`) against the rounds it replaces,
/// run on the host: each round picks the largest value not yet picked (picked ones −∞) at its
/// lowest anchor. Ties (values in steps of ¼), −∞ values, a row of −∞ only, `k` above the
/// finite count and above `A`, a transposed input; the mask equal, two runs equal.
#[test]
#[ignore = "needs a CUDA GPU"]
fn top_k_kernel_picks_the_rounds_picks_on_cuda() {
    use burnpose::loss::assign::device::top_k::top_k_mask;
    let d = cuda();
    d.seed(37);
    for (b, n, a, k, transposed) in [
        (4, 12, 8400, 10, false),
        (4, 12, 8400, 7, true),
        (3, 5, 37, 40, false),
        (2, 3, 3, 1, false),
        (1, 2, 300, 13, true),
    ] {
        let x = Tensor::<3>::random([b, n, a], Distribution::Normal(0.0, 2.0), &d);
        let x = (x * 4.0).round() / 4.0;
        // About a quarter −∞; row (0, 0) all −∞.
        let drop =
            Tensor::<3>::random([b, n, a], Distribution::Uniform(0.0, 1.0), &d).lower_elem(0.25);
        let x = x.mask_fill(drop, f32::NEG_INFINITY);
        let x = x.slice_assign(
            [0..1, 0..1, 0..a],
            Tensor::full([1, 1, a], f32::NEG_INFINITY, &d),
        );
        let host = values(x.clone());
        let input = if transposed {
            // The same values through a `[B, A, N]` buffer viewed as `[B, N, A]`.
            let mut t = vec![0.0f32; host.len()];
            for (i, v) in host.iter().enumerate() {
                let (bi, ni, ai) = (i / (n * a), i / a % n, i % a);
                t[(bi * a + ai) * n + ni] = *v;
            }
            Tensor::<3>::from_data(TensorData::new(t, [b, a, n]), &d).swap_dims(1, 2)
        } else {
            x
        };
        let got = cube_values_of::<3>(top_k_mask(cube(input.clone()), k));
        let again = cube_values_of::<3>(top_k_mask(cube(input), k));
        for (r, row) in host.chunks(a).enumerate() {
            let mut vals = row.to_vec();
            let mut want = vec![0.0f32; a];
            for _ in 0..k.min(a) {
                let mut best = 0;
                for i in 1..a {
                    if vals[i] > vals[best] {
                        best = i;
                    }
                }
                want[best] = 1.0;
                vals[best] = f32::NEG_INFINITY;
            }
            assert_eq!(
                &got[r * a..(r + 1) * a],
                want.as_slice(),
                "[{b}, {n}, {a}] k {k} row {r}"
            );
        }
        assert_eq!(got, again, "[{b}, {n}, {a}] k {k}: runs differ");
        println!("top_k [{b}, {n}, {a}] k {k} transposed {transposed}: the rounds' mask");
    }
}

/// The device assignment's OKS kernel (`kernels/oks.rs`) against its formula on the host: every
/// `(b, n, a)` within 2e-6 (CUDA's `exp` and a fused multiply-add against the host's), unlabelled
/// keypoints left out, an object without any labelled keypoint 0, strided poses and areas; two
/// runs bit-equal.
#[test]
#[ignore = "needs a CUDA GPU"]
fn oks_kernel_matches_the_formula_on_cuda() {
    use burnpose::loss::assign::device::kernel_oks::oks;
    let d = cuda();
    d.seed(41);
    let (b, n, k, a) = (3, 5, 17, 1_343);
    let sigmas: Vec<f32> = (0..k).map(|i| 0.025 + 0.005 * (i % 7) as f32).collect();
    let c: Vec<f32> = sigmas.iter().map(|&s| 8.0 * s * s).collect();
    // Poses as a narrow view of a wider tensor (the assignment's are slices of the raw output).
    let wide = Tensor::<3>::random([b, 2 * k, a], Distribution::Uniform(0.0, 64.0), &d);
    let (px, py) = (wide.clone().narrow(1, 0, k), wide.narrow(1, k, k));
    let xy = Tensor::<4>::random([b, n, k, 2], Distribution::Uniform(0.0, 64.0), &d);
    let vis = Tensor::<4>::random([b, n, k, 1], Distribution::Uniform(0.0, 3.0), &d).floor();
    // Object (0, 0) has no labelled keypoint.
    let vis = vis.slice_assign([0..1, 0..1, 0..k, 0..1], Tensor::zeros([1, 1, k, 1], &d));
    let gt = Tensor::cat(vec![xy, vis], 3);
    let area =
        Tensor::<3>::random([b, n, 2], Distribution::Uniform(10.0, 900.0), &d).narrow(2, 1, 1);
    let (hx, hy, ha) = (values(px.clone()), values(py.clone()), values(area.clone()));
    let hg = values(gt.clone());
    let run = || {
        let ct = Tensor::<1>::from_floats(c.as_slice(), &d);
        cube_values_of::<3>(oks(
            cube(px.clone()),
            cube(py.clone()),
            cube(gt.clone()),
            cube(area.clone()),
            cube(ct),
        ))
    };
    let (got, again) = (run(), run());
    assert_eq!(got.len(), b * n * a);
    let mut worst = 0.0f32;
    for bi in 0..b {
        for ni in 0..n {
            let scale = ha[bi * n + ni] + 1e-7;
            for ai in 0..a {
                let (mut sum, mut visible) = (0.0f32, 0.0f32);
                for ki in 0..k {
                    let g = ((bi * n + ni) * k + ki) * 3;
                    let dx = hx[(bi * k + ki) * a + ai] - hg[g];
                    let dy = hy[(bi * k + ki) * a + ai] - hg[g + 1];
                    let term = (-(dx * dx + dy * dy) / (scale * c[ki])).exp();
                    if hg[g + 2] != 0.0 {
                        sum += term;
                        visible += 1.0;
                    }
                }
                let want = sum / (visible + 1e-7);
                let at = (bi * n + ni) * a + ai;
                worst = worst.max((got[at] - want).abs());
                if bi == 0 && ni == 0 {
                    assert_eq!(got[at], 0.0, "no labelled keypoint: OKS 0");
                }
            }
        }
    }
    assert!(worst <= 2e-6, "largest difference from the formula {worst}");
    assert!(
        got.iter()
            .zip(&again)
            .all(|(x, y)| x.to_bits() == y.to_bits()),
        "two runs differ"
    );
    println!("oks [{b}, {n}, {a}] x {k} keypoints: within {worst} of the formula, two runs equal");
}
