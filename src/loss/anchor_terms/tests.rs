use super::host::ciou_grad;
use crate::loss::dual::Dual;
use crate::loss::geometry::{ciou, ciou_of};
use rand::{Rng, SeedableRng, rngs::StdRng};

/// A box `[x1, y1, x2, y2]` inside `0..20` with sides of 0.05–8.
fn random_box(rng: &mut StdRng) -> [f32; 4] {
    let (x, y) = (rng.random_range(0.0..12.0), rng.random_range(0.0..12.0));
    let (w, h) = (rng.random_range(0.05..8.0), rng.random_range(0.05..8.0));
    [x, y, x + w, y + h]
}

/// The reverse-mode CIoU gradient (the kernel's formula) equals forward mode through the host's
/// generic CIoU, and its value the host's, on overlapping, nested and disjoint boxes, and on
/// boxes sharing a side (the ties of `min`/`max`, which go to the prediction in both).
#[test]
fn ciou_grad_matches_forward_mode() {
    let mut rng = StdRng::seed_from_u64(3);
    let (mut overlapping, mut disjoint) = (0, 0);
    for i in 0..2000 {
        let b = random_box(&mut rng);
        let mut a = match i % 4 {
            // Near the target: overlapping mostly.
            0 | 1 => b.map(|v| v + rng.random_range(-1.5..1.5)),
            _ => random_box(&mut rng),
        };
        if i % 10 == 0 {
            // A shared side.
            a[i / 10 % 4] = b[i / 10 % 4];
        }
        if a[2] <= a[0] || a[3] <= a[1] {
            continue;
        }
        let d = ciou_of(
            std::array::from_fn::<_, 4, _>(|c| Dual::<4>::input(a[c], c)),
            b.map(Dual::from),
        );
        let v = ciou(a, b);
        assert!((v - d.v).abs() <= 1e-6, "case {i}: {v} vs {}", d.v);
        let g = ciou_grad(a, b);
        for (c, (ours, theirs)) in g.iter().zip(d.d).enumerate() {
            assert!(
                (ours - theirs).abs() <= 1e-5 + 1e-4 * theirs.abs(),
                "case {i} coordinate {c}: {ours} vs forward mode {theirs} (a {a:?}, b {b:?})"
            );
        }
        let inter =
            (a[2].min(b[2]) - a[0].max(b[0])).max(0.0) * (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
        if inter > 0.0 {
            overlapping += 1;
        } else {
            disjoint += 1;
        }
    }
    assert!(
        overlapping > 500 && disjoint > 300,
        "{overlapping} / {disjoint}"
    );
}
