//! The per-anchor loss terms' kernels (`kernels/anchor_terms.rs`, `bench-step --anchor-terms`)
//! against the CPU's loops (`loss::anchor_terms::host`, held to the tensor operations in CI):
//! the five rows forward and both gradients backward on random anchors at odd input sizes,
//! 1–4 images, 17 and 4 keypoints of 3 and 2 values, strided predictions, a foreground of
//! about a third. Two runs give the same bits; a transposed image size must be caught. Then the
//! step recorded as one graph against the native loop with the tensor operations instead (the
//! default, the operation, is the one-graph suite's).

use super::{Choice, cuda, values};
use burn::prelude::*;
use burn::tensor::TensorData;
use burnpose::loss::anchor_terms::{self, Fixed, RleFixed, per_anchor, rle_rows};
use burnpose::loss::assign::Anchors;
use burnpose::loss::geometry::sigmas;
use rand::{Rng, SeedableRng, rngs::StdRng};

/// One case's host values: predictions, the fixed inputs, the incoming gradient rows.
struct Case {
    what: String,
    size: [usize; 2],
    dims: [usize; 5],
    boxes: Vec<f32>,
    kpts: Vec<f32>,
    objects: Vec<f32>,
    slot: Vec<f32>,
    fg: Vec<f32>,
    weight: Vec<f32>,
    anchors: [Vec<f32>; 3],
    sig: Vec<f32>,
    grad: Vec<f32>,
}

fn case(rng: &mut StdRng, i: usize) -> Case {
    let sizes = [(352, 288), (96, 160), (64, 64), (640, 640), (200, 136)];
    let (h, w) = sizes[i % sizes.len()];
    let anchors = Anchors::new(h, w);
    let a = anchors.len();
    let b = 1 + i % 4;
    let (nk, kd, n) = ([17, 4][i % 2], [3, 2][(i / 2) % 2], 1 + i % 5);
    let mut objects = Vec::new();
    for _ in 0..b * n {
        let (x, y) = (
            rng.random_range(0.0..w as f32 - 8.0),
            rng.random_range(0.0..h as f32 - 8.0),
        );
        let (bw, bh) = (
            rng.random_range(2.0..150.0f32),
            rng.random_range(2.0..150.0f32),
        );
        objects.extend([0.0, 1.0, x, y, x + bw, y + bh]);
        for _ in 0..nk {
            let v = [0.0, 1.0, 2.0][rng.random_range(0..3)];
            objects.extend([
                x + rng.random_range(0.0..bw),
                y + rng.random_range(0.0..bh),
                v,
            ]);
        }
    }
    let fg: Vec<f32> = (0..b * a)
        .map(|_| (rng.random_range(0..3) == 0) as u8 as f32)
        .collect();
    let mut normal = |len: usize, s: f32| -> Vec<f32> {
        (0..len)
            .map(|_| rng.random_range(-s..s))
            .collect::<Vec<f32>>()
    };
    let boxes: Vec<f32> = normal(b * 4 * a, 1.0)
        .iter()
        .map(|v| 3.0 * (v + 1.1))
        .collect();
    let kpts = normal(b * nk * kd * a, 3.0);
    let weight: Vec<f32> = normal(b * a, 1.0).iter().map(|v| v.abs()).collect();
    let grad = normal(5 * b * a, 1.0);
    let slot = (0..b * a).map(|_| rng.random_range(0..n) as f32).collect();
    Case {
        what: format!("case {i}: {b}×{h}×{w}, {nk} keypoints × {kd}, {n} slots"),
        size: [h, w],
        dims: [b, a, nk, kd, n],
        boxes,
        kpts,
        objects,
        slot,
        fg,
        weight,
        anchors: [
            anchors.points.iter().map(|p| p[0]).collect(),
            anchors.points.iter().map(|p| p[1]).collect(),
            anchors.strides.clone(),
        ],
        sig: sigmas(nk).iter().map(|s| 8.0 * s * s).collect(),
        grad,
    }
}

/// `v` as a `[B, C, A]` tensor on `d`.
fn tensor3(v: &[f32], shape: [usize; 3], d: &Device) -> Tensor<3> {
    Tensor::<3>::from_data(TensorData::new(v.to_vec(), shape), d)
}

/// A prediction `v` of `shape` `[B, C, A]` on `d`: contiguous, or when `strided` a view of a
/// `[B, A, C]` buffer (as a head's outputs can be).
fn prediction(v: &[f32], [b, ch, a]: [usize; 3], d: &Device, strided: bool) -> Tensor<3> {
    if !strided {
        return tensor3(v, [b, ch, a], d);
    }
    let mut t = vec![0.0f32; v.len()];
    for (i, x) in v.iter().enumerate() {
        let (bi, ci, ai) = (i / (ch * a), i / a % ch, i % a);
        t[(bi * a + ai) * ch + ci] = *x;
    }
    tensor3(&t, [b, a, ch], d).swap_dims(1, 2)
}

/// The rows and both gradients (`boxes`, `kpts`) of `c` on device `d`; on CUDA the predictions
/// are strided views (`[B, A, C]` buffers) when `strided`.
fn run(c: &Case, d: &Device, size: [usize; 2], strided: bool) -> [Vec<f32>; 3] {
    let [b, a, nk, kd, n] = c.dims;
    let t3 = |v: &[f32], s: [usize; 3]| tensor3(v, s, d);
    let pred = |v: &[f32], ch: usize| prediction(v, [b, ch, a], d, strided);
    let boxes = pred(&c.boxes, 4).require_grad();
    let kpts = pred(&c.kpts, nk * kd).require_grad();
    let row = |v: &[f32]| t3(v, [1, 1, a]);
    let fixed = Fixed {
        objects: t3(&c.objects, [b, n, 6 + 3 * nk]),
        slot: t3(&c.slot, [1, b, a]).reshape([b, a]),
        fg: t3(&c.fg, [1, b, a]).reshape([b, a]),
        weight: t3(&c.weight, [1, b, a]).reshape([b, a]),
        ax: row(&c.anchors[0]),
        ay: row(&c.anchors[1]),
        st: row(&c.anchors[2]),
        sig: Tensor::<1>::from_floats(c.sig.as_slice(), d),
    };
    let rows = per_anchor(boxes.clone(), kpts.clone(), fixed, size);
    let out = values(rows.clone());
    let grads = (rows * t3(&c.grad, [5, b, a])).sum().backward();
    let g = |t: &Tensor<3>| values(t.grad(&grads).expect("a gradient"));
    [out, g(&boxes), g(&kpts)]
}

/// Whether `got` is within `2e-5` of the largest reference value plus `1e-4` of each one.
fn close(got: &[f32], want: &[f32]) -> Option<(usize, f32, f32)> {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    got.iter()
        .zip(want)
        .enumerate()
        .find(|(_, (x, y))| {
            (*x - *y).abs().is_nan() || (*x - *y).abs() > 2e-5 * scale + 1e-4 * y.abs()
        })
        .map(|(i, (x, y))| (i, *x, *y))
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn anchor_terms_kernels_match_the_cpu_loops_on_cuda() {
    let (gpu, cpu) = (cuda().autodiff(), Device::flex().autodiff());
    let mut rng = StdRng::seed_from_u64(29);
    let (mut fg, mut caught, mut non_square) = (0usize, 0usize, 0usize);
    for i in 0..20 {
        let c = case(&mut rng, i);
        let strided = i % 3 == 1;
        let ours = run(&c, &gpu, c.size, strided);
        let again = run(&c, &gpu, c.size, strided);
        let want = run(&c, &cpu, c.size, false);
        for (k, name) in ["rows", "box gradient", "keypoint gradient"]
            .iter()
            .enumerate()
        {
            assert_eq!(ours[k], again[k], "{}: {name} differ between runs", c.what);
            if let Some((at, x, y)) = close(&ours[k], &want[k]) {
                panic!("{} {name}: {x} at {at}, the CPU's {y}", c.what);
            }
        }
        fg += c.fg.iter().filter(|&&v| v != 0.0).count();
        if c.size[0] != c.size[1] {
            non_square += 1;
            let wrong = run(&c, &gpu, [c.size[1], c.size[0]], strided);
            caught += (0..3).any(|k| close(&wrong[k], &want[k]).is_some()) as usize;
        }
    }
    assert!(fg > 10_000, "{fg} foreground anchors");
    assert_eq!(
        caught, non_square,
        "a transposed size was caught in {caught} of {non_square} cases"
    );
}

/// The RLE rows and both gradients (`kpts`, `sigma`) of `c` on device `d`, a third of the
/// anchors foreground, two rows of padding past the fullest image's positives.
fn run_rle(c: &Case, d: &Device, strided: bool) -> [Vec<f32>; 3] {
    let [b, a, nk, kd, n] = c.dims;
    let t3 = |v: &[f32], s: [usize; 3]| tensor3(v, s, d);
    let counts: Vec<usize> = (0..b)
        .map(|i| {
            c.fg[i * a..(i + 1) * a]
                .iter()
                .filter(|&&v| v != 0.0)
                .count()
        })
        .collect();
    let r = counts.iter().max().unwrap() + 2;
    let (mut picked, mut place) = (vec![0.0f32; b * r], vec![(a + r) as f32; b * a]);
    for i in 0..b {
        let mut j = 0;
        for ai in 0..a {
            if c.fg[i * a + ai] != 0.0 {
                picked[i * r + j] = ai as f32;
                place[i * a + ai] = j as f32;
                j += 1;
            }
        }
    }
    let pred = |v: &[f32], ch: usize| prediction(v, [b, ch, a], d, strided);
    let kpts = pred(&c.kpts, nk * kd).require_grad();
    // Raw sigmas from the box distances' and weights' draws (any values will do).
    let raw: Vec<f32> = (0..b * 2 * nk * a)
        .map(|i| c.boxes[i % c.boxes.len()] - 3.0 + c.weight[i % c.weight.len()])
        .collect();
    let sigma = pred(&raw, 2 * nk).require_grad();
    let row = |v: &[f32]| t3(v, [1, 1, a]);
    let fixed = RleFixed {
        objects: t3(&c.objects, [b, n, 6 + 3 * nk]),
        slot: t3(&c.slot, [1, b, a]).reshape([b, a]),
        place: t3(&place, [1, b, a]).reshape([b, a]),
        picked: t3(&picked, [1, b, r]).reshape([b, r]),
        count: Tensor::<1>::from_floats(
            counts
                .iter()
                .map(|&v| v as f32)
                .collect::<Vec<_>>()
                .as_slice(),
            d,
        ),
        ax: row(&c.anchors[0]),
        ay: row(&c.anchors[1]),
        st: row(&c.anchors[2]),
    };
    let rows = rle_rows(kpts.clone(), sigma.clone(), fixed);
    let out = values(rows.clone());
    let g: Vec<f32> = (0..b * nk * r * 4)
        .map(|i| c.grad[i % c.grad.len()])
        .collect();
    let grads = (rows * t3(&g, [b * nk, r, 4])).sum().backward();
    let grad = |t: &Tensor<3>| values(t.grad(&grads).expect("a gradient"));
    [out, grad(&kpts), grad(&sigma)]
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn rle_rows_kernels_match_the_cpu_loops_on_cuda() {
    let (gpu, cpu) = (cuda().autodiff(), Device::flex().autodiff());
    let mut rng = StdRng::seed_from_u64(31);
    let mut counted = 0usize;
    for i in 0..20 {
        let c = case(&mut rng, i);
        let strided = i % 3 == 1;
        let ours = run_rle(&c, &gpu, strided);
        let again = run_rle(&c, &gpu, strided);
        let want = run_rle(&c, &cpu, false);
        for (k, name) in ["rows", "keypoint gradient", "sigma gradient"]
            .iter()
            .enumerate()
        {
            assert_eq!(ours[k], again[k], "{}: {name} differ between runs", c.what);
            if let Some((at, x, y)) = close(&ours[k], &want[k]) {
                panic!("{} RLE {name}: {x} at {at}, the CPU's {y}", c.what);
            }
        }
        counted += want[0].chunks(4).filter(|r| r[3] != 0.0).count();
    }
    assert!(counted > 20_000, "{counted} rows counted");
}

/// The whole step recorded as one graph with the RLE rows as tensor operations (the operation
/// off; the one-graph suite covers it on, the default): byte-equal to the native loop with them
/// off (BF16).
#[test]
#[ignore = "needs a CUDA GPU"]
fn one_graph_matches_native_with_the_rle_rows_as_tensor_operations_bf16() {
    let _off = Choice::set(anchor_terms::choose_rle, false, true);
    super::replay::assert_parity_of("pose-one-graph", "bf16");
}

/// As above on a batch without objects.
#[test]
#[ignore = "needs a CUDA GPU"]
fn one_graph_matches_native_with_the_rle_rows_as_tensor_operations_on_an_empty_batch() {
    let _off = Choice::set(anchor_terms::choose_rle, false, true);
    super::replay::assert_empty_parity("pose-one-graph");
}

/// The whole step recorded as one graph (device loss) with the per-anchor terms as tensor
/// operations (the operation off; the one-graph suite covers it on, the default): byte-equal
/// to the native loop with them off, state hashes and per-step losses (BF16).
#[test]
#[ignore = "needs a CUDA GPU"]
fn one_graph_matches_native_with_the_anchor_terms_as_tensor_operations_bf16() {
    let _off = Choice::set(anchor_terms::choose, false, true);
    super::replay::assert_parity_of("pose-one-graph", "bf16");
}

/// As above on a batch without objects: no anchor foreground.
#[test]
#[ignore = "needs a CUDA GPU"]
fn one_graph_matches_native_with_the_anchor_terms_as_tensor_operations_on_an_empty_batch() {
    let _off = Choice::set(anchor_terms::choose, false, true);
    super::replay::assert_empty_parity("pose-one-graph");
}
