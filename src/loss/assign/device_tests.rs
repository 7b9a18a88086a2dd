use super::super::tests::{config_for, random_box, random_keypoints};
use super::super::{Predicted, Target, assign};
use super::*;
use crate::loss::geometry;
use rand::{Rng, SeedableRng, rngs::StdRng};

/// One random batch: raw branch outputs (quantised, so that many alignments tie exactly) and
/// labels, some images without objects, repeated objects (contested anchors), tiny ones (STAL)
/// and ones partly outside the image.
pub(crate) struct Case {
    pub h: usize,
    pub w: usize,
    pub nc: usize,
    pub nk: usize,
    pub out: BranchOutput,
    raw: [Vec<f32>; 3],
    pub labels: Vec<Vec<Instance>>,
}

pub(crate) fn case(rng: &mut StdRng, i: usize, device: &Device) -> Case {
    let sizes = [(32, 32), (64, 96), (100, 72), (128, 128)];
    let (h, w) = sizes[i % sizes.len()];
    let a = Anchors::new(h, w).len();
    let (nc, nk, kd) = (1 + i % 3, [17, 4][i % 2], 3);
    let b = 1 + i % 3;
    let (wf, hf) = (w as f32, h as f32);
    let labels: Vec<Vec<Instance>> = (0..b)
        .map(|_| {
            let mut objects: Vec<Instance> = Vec::new();
            for _ in 0..rng.random_range(0..6) {
                let last = objects.last().map(|o| o.bbox);
                let bbox = random_box(rng, last, wf, hf);
                let keypoints = random_keypoints(rng, bbox, nk);
                let class = rng.random_range(0..nc);
                objects.push(Instance {
                    class,
                    bbox,
                    keypoints,
                });
            }
            objects
        })
        .collect();
    let flat = i.is_multiple_of(7);
    let ltrb: Vec<f32> = (0..b * 4 * a)
        .map(|_| match flat {
            true => 1.0,
            false => rng.random_range(0..6) as f32 * 0.5,
        })
        .collect();
    let logits: Vec<f32> = (0..b * nc * a)
        .map(|_| match flat {
            true => 0.0,
            false => rng.random_range(0..8) as f32 / 2.0 - 2.0,
        })
        .collect();
    let kpts: Vec<f32> = (0..b * nk * kd * a)
        .map(|_| rng.random_range(-3.0..3.0))
        .collect();
    let t = |v: &[f32], c: usize| Tensor::<1>::from_floats(v, device).reshape([b, c, a]);
    let out = BranchOutput {
        boxes: t(&ltrb, 4),
        scores: t(&logits, nc),
        kpts: Some(t(&kpts, nk * kd)),
        kpts_sigma: None,
    };
    Case {
        h,
        w,
        nc,
        nk,
        out,
        raw: [ltrb, logits, kpts],
        labels,
    }
}

/// The host assigner on image `i` of `c`, its predictions decoded as `build_targets` decodes
/// them (every anchor).
fn host(c: &Case, cfg: &AssignerConfig, i: usize) -> super::super::Assignment {
    let anchors = Anchors::new(c.h, c.w);
    let a_len = anchors.len();
    let (nc, nk, kd) = (c.nc, c.nk, 3);
    let [ltrb, logits, kpts] = &c.raw;
    let at = |ch: usize, k: usize, a: usize| (i * ch + k) * a_len + a;
    let mut boxes = vec![[0.0f32; 4]; a_len];
    let mut probs = vec![0.0f32; a_len * nc];
    let mut pk = vec![[0.0f32; 2]; a_len * nk];
    for a in 0..a_len {
        let [ax, ay] = anchors.points[a];
        let s = anchors.strides[a];
        let d = |k| ltrb[at(4, k, a)];
        boxes[a] = [
            (ax - d(0)) * s,
            (ay - d(1)) * s,
            (ax + d(2)) * s,
            (ay + d(3)) * s,
        ];
        for k in 0..nc {
            probs[a * nc + k] = 1.0 / (1.0 + (-logits[at(nc, k, a)]).exp());
        }
        for j in 0..nk {
            pk[a * nk + j] = [
                (kpts[at(nk * kd, j * kd, a)] + ax) * s,
                (kpts[at(nk * kd, j * kd + 1, a)] + ay) * s,
            ];
        }
    }
    let pred = Predicted {
        scores: &probs,
        boxes: &boxes,
        keypoints: Some(&pk),
        nc,
    };
    let targets: Vec<Target> = c.labels[i]
        .iter()
        .map(|o| Target::of(o, cfg.pose))
        .collect();
    assign(cfg, &anchors, &pred, &targets, &geometry::sigmas(nk))
}

fn bools(t: Tensor<2, Bool>) -> Vec<bool> {
    t.into_data()
        .convert::<bool>()
        .try_to_vec::<bool>()
        .unwrap()
}

fn ints(t: Tensor<2, Int>) -> Vec<i64> {
    t.into_data().convert::<i64>().try_to_vec::<i64>().unwrap()
}

fn floats(t: Tensor<3>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
}

/// The batched device assignment equals the host assigner image by image, bit for bit, over
/// random batches with exact ties, contested anchors, tiny and clipped objects, empty images,
/// pose and detection, both branch copies and other top-k settings.
#[test]
fn device_assignment_equals_the_host_assigner() {
    let device = Device::flex();
    let mut rng = StdRng::seed_from_u64(31);
    let (mut images, mut fg_total, mut contested, mut second_cut) = (0, 0, 0, 0);
    for i in 0..240 {
        let c = case(&mut rng, i, &device);
        let pose = i % 4 != 3;
        let cfg = config_for(i, pose);
        let anchors = Anchors::new(c.h, c.w);
        let a_len = anchors.len();
        let slots = 1 + i % 4 + c.labels.iter().map(Vec::len).max().unwrap_or(0);
        let objects = ObjectSlots::new(&c.labels, slots, if pose { c.nk } else { 0 }, &device);
        let got = assign_batch(
            &cfg,
            &AnchorTensors::new(&anchors, &device),
            &c.out,
            &objects,
            &geometry::sigmas(c.nk),
        );
        let (fg, gt, ts) = (bools(got.fg), ints(got.gt_index), floats(got.target_scores));
        for b in 0..c.labels.len() {
            let want = host(&c, &cfg, b);
            let at = |a: usize| b * a_len + a;
            for a in 0..a_len {
                assert_eq!(fg[at(a)], want.fg[a], "case {i} image {b} anchor {a} fg");
                assert_eq!(
                    gt[at(a)] as usize,
                    want.gt_index[a],
                    "case {i} image {b} anchor {a} object"
                );
                for k in 0..c.nc {
                    let got = ts[(b * c.nc + k) * a_len + a];
                    let want = want.target_scores[a * c.nc + k];
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "case {i} image {b} anchor {a} class {k}: {got} vs {want}"
                    );
                }
            }
            images += 1;
            fg_total += want.num_fg();
            let objects = &c.labels[b];
            if objects.windows(2).any(|p| p[0].bbox == p[1].bbox) && want.num_fg() > 0 {
                contested += 1;
            }
            if cfg.topk2 < cfg.topk && want.num_fg() > 0 {
                second_cut += 1;
            }
        }
    }
    // The cases exercised what they were made for.
    assert!(images > 400, "{images} images");
    assert!(fg_total > 2000, "{fg_total} positives");
    assert!(contested > 20, "{contested} images with contested anchors");
    assert!(
        second_cut > 50,
        "{second_cut} images through the second cut"
    );
}

/// Equal alignments: the lower anchors win, on the device as on the host.
#[test]
fn ties_go_to_the_lower_anchors() {
    let device = Device::flex();
    let anchors = Anchors::new(32, 32);
    let a = anchors.len();
    // Every anchor predicts the object's own box with the same score: all 21 tie.
    let bbox = [0.0, 0.0, 32.0, 32.0];
    let mut ltrb = vec![0.0f32; 4 * a];
    for (i, (p, s)) in anchors.points.iter().zip(&anchors.strides).enumerate() {
        let d = [
            p[0] - bbox[0] / s,
            p[1] - bbox[1] / s,
            bbox[2] / s - p[0],
            bbox[3] / s - p[1],
        ];
        for (k, v) in d.into_iter().enumerate() {
            ltrb[k * a + i] = v;
        }
    }
    let out = BranchOutput {
        boxes: Tensor::<1>::from_floats(ltrb.as_slice(), &device).reshape([1, 4, a]),
        scores: Tensor::zeros([1, 1, a], &device),
        kpts: None,
        kpts_sigma: None,
    };
    let object = Instance {
        class: 0,
        bbox,
        keypoints: Vec::new(),
    };
    let objects = ObjectSlots::new(&[vec![object]], 2, 0, &device);
    for (cfg, want) in [
        (AssignerConfig::one2one(false), vec![0]),
        (AssignerConfig::one2many(false), (0..10).collect()),
    ] {
        let got = assign_batch(
            &cfg,
            &AnchorTensors::new(&anchors, &device),
            &out,
            &objects,
            &[],
        );
        let fg = bools(got.fg);
        let on: Vec<usize> = (0..a).filter(|&i| fg[i]).collect();
        assert_eq!(on, want, "{cfg:?}");
        let scores = floats(got.target_scores);
        assert!(
            on.iter()
                .all(|&i| scores[i] == scores[0] && scores[0] > 0.9)
        );
    }
}

/// The two-stage prefix sum gives `cumsum`'s values, for row lengths with a divisor near their
/// square root (8,400: the 640 px anchors), without one (a prime: one stage of everything) and
/// small ones; a stage boundary dropped or counted twice would fail it.
#[test]
fn prefix_sum_last_equals_cumsum() {
    let device = Device::flex();
    let mut rng = StdRng::seed_from_u64(3);
    for a in [1, 2, 7, 12, 97, 441, 8400] {
        let b = 3;
        let values: Vec<i64> = (0..b * a).map(|_| rng.random_range(0..2)).collect();
        let t = Tensor::<1, Int>::from_ints(values.as_slice(), &device).reshape([b, a]);
        let got = prefix_sum_last(t.clone()).into_data();
        assert_eq!(got, t.cumsum(1).into_data(), "{a} values per row");
    }
}
