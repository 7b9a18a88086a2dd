//! The device assignment's kernels (`kernels/assign.rs`, `bench-step --assign-kernels`)
//! against its tensor operations on CUDA: random batches at odd input sizes, batches of 1 to 4,
//! padded object slots, tiny objects (STAL), repeated ones (contested anchors), objects with no
//! labelled keypoint (CIoU), pose and detection, both branch copies and a second cut of other
//! sizes; continuous and quantised predictions (exact ties). The foreground and the objects
//! learnt must be equal, the soft targets within a few float steps; two runs the same bits.

use super::{Choice, cuda};
use burn::prelude::*;
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
    let _kernels = Choice::set(kernel_assign::choose, kernels, false);
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
