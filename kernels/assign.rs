//! The device assignment (`loss::assign::device::assign_batch`) in five launches a branch copy
//! (seven with a second cut) where its tensor operations take ~260 (docs/kernels.md, "The
//! device assignment as kernels"). The rules and the order of every operation are the tensor
//! operations', rule by rule:
//! - [`metrics_kernel`], unit `(b, n, a)`: the candidate mask (in-box gate widened to the STAL
//!   side; for pose the pyramid-level gate unless no anchor passes it, which each cube finds by
//!   scanning the row's anchors), the overlap (CIoU, or OKS for objects with a labelled
//!   keypoint) clamped at zero, and the alignment `score^α · overlap^β`, both zero off the
//!   candidates;
//! - the top-k mask of the alignments (`top_k.rs`);
//! - [`resolve_kernel`], unit `(b, a)`: an anchor claimed by several objects goes to the first
//!   object of largest overlap; with a second cut, the kept alignments for its top-k;
//! - [`row_max_kernel`], cube `(b, n)`: the largest alignment and overlap among the object's
//!   positives (maxima: exact in any order);
//! - [`targets_kernel`], unit `(b, a)`: foreground, the object it learns, the soft class targets.
//!
//! No atomics and no sums of floats across units: the same bits every run. NVRTC may fuse a
//! multiply and an add, so a value may differ in its last bit from the tensor operations'.

// `a[i] = a[i] + x` on shared memory is the form CubeCL's frontend expands, not clippy's rewrite.
#![allow(clippy::assign_op_pattern)]

// `#[cube]` expands to `cubecl::…` paths.
use crate::model::ops::empty_f32;
use burn::cubecl;
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;
use cubecl::{CubeCount, CubeDim, calculate_cube_count_elemwise};
use std::sync::atomic::{AtomicBool, Ordering};

// Columns of an object slot before its keypoints (`ObjectSlots::pack`).
use super::PACKED;

static CHOSEN: AtomicBool = AtomicBool::new(true);

/// Whether the device assignment runs these kernels on CUDA (`true`, the default since the
/// H100 check of docs/perf_log.md BP1) or its tensor operations (`false`; `bench-step
/// --assign-kernels false`). The same rules; a value may differ in its last bit.
pub fn choose(on: bool) {
    CHOSEN.store(on, Ordering::Relaxed);
}

/// [`choose`]'s choice.
pub fn chosen() -> bool {
    CHOSEN.load(Ordering::Relaxed)
}

/// Units of a cube of [`metrics_kernel`] and [`row_max_kernel`] (a power of two: the tree
/// halves it).
const UNITS: usize = 256;
/// The comparisons' and CIoU's small constants, as the tensor operations write them.
const INSIDE: f32 = 1e-9;
const E: f32 = 1e-7;

/// The rules' numbers ([`super::super::AssignerConfig`] and the geometry's constants).
#[derive(Clone, Copy, Debug)]
pub struct Rules {
    pub alpha: f32,
    pub beta: f32,
    pub stal_min_side: f32,
    /// Pose: the pyramid-level gate.
    pub pose: bool,
    /// The finest and coarsest strides (the level gate's ends).
    pub strides: [f32; 2],
    /// The OKS area's share of the box area.
    pub area_of_box: f32,
    /// The soft targets' denominator's epsilon.
    pub eps: f32,
    /// Candidates per object by alignment, and anchors kept per object at the end.
    pub topk: usize,
    pub topk2: usize,
}

/// The raw keypoint outputs of a pose branch for the OKS overlap.
pub struct Poses {
    /// `[B, K·kd, A]`, FP32, any strides.
    pub raw: CubeTensor,
    /// Values per keypoint in `raw` (2 or 3).
    pub kd: usize,
    /// `[K]`: `8σ²` per keypoint, FP32.
    pub sig: CubeTensor,
}

/// One branch copy's assignment, contiguous FP32: `fg` `[B, A]` (0/1), `gt` `[B, A]` (the
/// object slot each anchor learns, 0 off the foreground), `target` `[B, nc, A]`.
pub struct Assigned {
    pub fg: CubeTensor,
    pub gt: CubeTensor,
    pub target: CubeTensor,
}

/// The tensor operations' `inside`: every side's margin above 1e-9.
#[cube]
fn inside(px: f32, py: f32, x1: f32, y1: f32, x2: f32, y2: f32) -> bool {
    px - x1 > INSIDE && py - y1 > INSIDE && x2 - px > INSIDE && y2 - py > INSIDE
}

/// The low end of `[lo, hi]` widened about its centre to `side` when narrower (STAL).
#[cube]
fn widen_lo(lo: f32, hi: f32, side: f32, half: f32) -> f32 {
    let mut v = lo;
    if hi - lo < side {
        v = (lo + hi) / 2.0f32 - half;
    }
    v
}

/// [`widen_lo`]'s high end.
#[cube]
fn widen_hi(lo: f32, hi: f32, side: f32, half: f32) -> f32 {
    let mut v = hi;
    if hi - lo < side {
        v = (lo + hi) / 2.0f32 + half;
    }
    v
}

/// The pose gate: the anchor's level (stride `s`) suits an object of side `side`.
#[cube]
fn level_fits(s: f32, side: f32, finest: f32, coarsest: f32) -> bool {
    (s == finest || side >= s * 2.0f32) && (s == coarsest || side <= s * 12.0f32)
}

/// CIoU of boxes `a` and `b` (`[x1, y1, x2, y2]`), in `loss::assign::device::ciou`'s order;
/// `v_scale` is `4 / π²` as the host rounds it. The loss's per-anchor terms take it too
/// (`kernels/anchor_terms.rs`, `a` the prediction).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn ciou(
    a0: f32,
    a1: f32,
    a2: f32,
    a3: f32,
    b0: f32,
    b1: f32,
    b2: f32,
    b3: f32,
    v_scale: f32,
) -> f32 {
    let w1 = a2 - a0;
    let h1 = a3 - a1 + E;
    let w2 = b2 - b0;
    let h2 = b3 - b1 + E;
    let iw = f32::max(f32::min(a2, b2) - f32::max(a0, b0), 0.0f32);
    let ih = f32::max(f32::min(a3, b3) - f32::max(a1, b1), 0.0f32);
    let inter = iw * ih;
    let union = w1 * h1 + w2 * h2 - inter + E;
    let iou = inter / union;
    let cw = f32::max(a2, b2) - f32::min(a0, b0);
    let ch = f32::max(a3, b3) - f32::min(a1, b1);
    let c2 = cw * cw + ch * ch + E;
    let dx = b0 + b2 - a0 - a2;
    let dy = b1 + b3 - a1 - a3;
    let rho2 = (dx * dx + dy * dy) / 4.0f32;
    let dv = f32::atan(w2 / h2) - f32::atan(w1 / h1);
    let v = dv * dv * v_scale;
    let alpha = v / (v - iou + (1.0f32 + E));
    iou - (rho2 / c2 + v * alpha)
}

/// Cube `(chunk, b·N + n)`, unit `u`: anchor `a = chunk · UNITS + u` of object slot `n` of image
/// `b`. Writes `overlap`, `align` and `cand` (0/1) at `[b, n, a]` (contiguous `[B, N, A]`).
/// Inputs by their strides: `boxes` `[B, 4, A]` (ltrb, grid units), `scores` `[B, nc, A]`
/// (logits), `kpts` `[B, K·kd, A]` (raw, read when `keypoints > 0`), the anchors' `ax`, `ay`,
/// `st` (`[1, 1, A]`), `objects` `[B, N, 6 + 3K]` (packed slots), `sig` `[K]` (`8σ²`).
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
fn metrics_kernel(
    boxes: &Tensor<f32>,
    scores: &Tensor<f32>,
    kpts: &Tensor<f32>,
    ax: &Tensor<f32>,
    ay: &Tensor<f32>,
    st: &Tensor<f32>,
    objects: &Tensor<f32>,
    sig: &Tensor<f32>,
    overlap: &mut Tensor<f32>,
    align: &mut Tensor<f32>,
    cand: &mut Tensor<f32>,
    alpha: f32,
    beta: f32,
    side: f32,
    half: f32,
    finest: f32,
    coarsest: f32,
    area_of_box: f32,
    v_scale: f32,
    #[comptime] pose: bool,
    #[comptime] keypoints: usize,
    #[comptime] kd: usize,
) {
    let anchors = st.shape(2);
    let slots = objects.shape(1);
    let row = CUBE_POS_Y as usize;
    let b = row / slots;
    let o = b * objects.stride(0) + (row % slots) * objects.stride(1);
    let os = objects.stride(2);
    let class = objects[o];
    let used = objects[o + os] > 0.5f32;
    let x1 = objects[o + 2 * os];
    let y1 = objects[o + 3 * os];
    let x2 = objects[o + 4 * os];
    let y2 = objects[o + 5 * os];
    let gx1 = widen_lo(x1, x2, side, half);
    let gx2 = widen_hi(x1, x2, side, half);
    let gy1 = widen_lo(y1, y2, side, half);
    let gy2 = widen_hi(y1, y2, side, half);
    let size = f32::sqrt(f32::max((x2 - x1) * (y2 - y1), 0.0f32));
    let u = UNIT_POS_X as usize;
    let sa = st.stride(2);
    let sx = ax.stride(2);
    let sy = ay.stride(2);

    // Whether any anchor of the row passes both gates (pose): every cube of the row scans it.
    let mut any = Shared::<[u32]>::new_slice(1usize);
    let mut gated_any = false;
    if pose {
        if u == 0 {
            any[0] = 0u32;
        }
        sync_cube();
        let mut q = u;
        let mut hit = false;
        while q < anchors {
            let s = st[q * sa];
            let in_box = inside(ax[q * sx] * s, ay[q * sy] * s, gx1, gy1, gx2, gy2);
            hit = hit || (in_box && level_fits(s, size, finest, coarsest));
            q += UNITS;
        }
        // Every writer writes the same 1.
        if hit && used {
            any[0] = 1u32;
        }
        sync_cube();
        gated_any = any[0] == 1u32;
    }

    let a = CUBE_POS_X as usize * UNITS + u;
    if a < anchors {
        let s = st[a * sa];
        let cx = ax[a * sx];
        let cy = ay[a * sy];
        let in_box = used && inside(cx * s, cy * s, gx1, gy1, gx2, gy2);
        let mut candidate = in_box;
        if pose && gated_any {
            candidate = in_box && level_fits(s, size, finest, coarsest);
        }
        let bo = b * boxes.stride(0) + a * boxes.stride(2);
        let bs = boxes.stride(1);
        let p0 = (cx - boxes[bo]) * s;
        let p1 = (cy - boxes[bo + bs]) * s;
        let p2 = (cx + boxes[bo + 2 * bs]) * s;
        let p3 = (cy + boxes[bo + 3 * bs]) * s;
        let mut ov = ciou(x1, y1, x2, y2, p0, p1, p2, p3, v_scale);
        if comptime!(keypoints > 0) {
            let scale = (x2 - x1) * (y2 - y1) * area_of_box + E;
            let ko = b * kpts.stride(0) + a * kpts.stride(2);
            let ks = kpts.stride(1);
            let mut sum = 0.0f32;
            let mut visible = 0.0f32;
            #[unroll]
            for k in 0..keypoints {
                let g = o + (PACKED + 3 * k) * os;
                let px = (kpts[ko + k * kd * ks] + cx) * s;
                let py = (kpts[ko + (k * kd + 1) * ks] + cy) * s;
                let dx = px - objects[g];
                let dy = py - objects[g + os];
                let d = dx * dx + dy * dy;
                let term = f32::exp(-d / (scale * sig[k * sig.stride(0)]));
                if objects[g + 2 * os] != 0.0f32 {
                    sum += term;
                    visible += 1.0f32;
                }
            }
            if visible > 0.0f32 {
                ov = sum / (visible + E);
            }
        }
        let mut kept = 0.0f32;
        let mut aligned = 0.0f32;
        let mut c = 0.0f32;
        if candidate {
            kept = f32::max(ov, 0.0f32);
            // A class beyond the scores' (bad labels) reads the last one, not past the row.
            let mut ci = usize::cast_from(class);
            if ci >= scores.shape(1) {
                ci = scores.shape(1) - 1;
            }
            let logit = scores[b * scores.stride(0) + ci * scores.stride(1) + a * scores.stride(2)];
            let prob = 1.0f32 / (f32::exp(-logit) + 1.0f32);
            aligned = f32::powf(prob, alpha) * f32::powf(kept, beta);
            c = 1.0f32;
        }
        let at = row * anchors + a;
        overlap[at] = kept;
        align[at] = aligned;
        cand[at] = c;
    }
}

/// Unit `(b, a)`: the anchor's positives over the object slots (`top` and `cand` both set),
/// given to the first slot of largest `overlap` where more than one claims it, into `pos`
/// (0/1); with `second`, `kept` holds the positives' alignments (else zero) for the second cut.
/// Every tensor contiguous `[B, N, A]`.
#[cube(launch_unchecked, create_dummy_kernel)]
fn resolve_kernel(
    top: &Tensor<f32>,
    cand: &Tensor<f32>,
    overlap: &Tensor<f32>,
    align: &Tensor<f32>,
    pos: &mut Tensor<f32>,
    kept: &mut Tensor<f32>,
    #[comptime] second: bool,
) {
    let slots = pos.shape(1);
    let anchors = pos.shape(2);
    if ABSOLUTE_POS >= pos.shape(0) * anchors {
        terminate!();
    }
    let b = ABSOLUTE_POS / anchors;
    let a = ABSOLUTE_POS % anchors;
    let base = b * slots * anchors + a;
    let mut count = 0u32;
    let mut best = 0usize;
    let mut best_v = overlap[base];
    for n in 0..slots {
        let at = base + n * anchors;
        if top[at] != 0.0f32 && cand[at] != 0.0f32 {
            count += 1u32;
        }
        let v = overlap[at];
        if v > best_v {
            best_v = v;
            best = n;
        }
    }
    for n in 0..slots {
        let at = base + n * anchors;
        let mut p = top[at] != 0.0f32 && cand[at] != 0.0f32;
        if count > 1u32 {
            p = n == best;
        }
        let mut v = 0.0f32;
        if p {
            v = 1.0f32;
        }
        pos[at] = v;
        if second {
            let mut k = 0.0f32;
            if p {
                k = align[at];
            }
            kept[at] = k;
        }
    }
}

/// Whether slot value `at` is a positive: `pos`, and with `second` also the second cut's `top2`.
#[cube]
fn positive(pos: &Tensor<f32>, top2: &Tensor<f32>, at: usize, #[comptime] second: bool) -> bool {
    let mut p = pos[at] != 0.0f32;
    if second {
        p = p && top2[at] != 0.0f32;
    }
    p
}

/// Cube `r = b·N + n`: the largest alignment and overlap over the row's anchors, each zero off
/// the positives, into `max_align[r]` and `max_overlap[r]` (`[B·N]`). Maxima: the same value in
/// any order.
#[cube(launch_unchecked, create_dummy_kernel)]
fn row_max_kernel(
    pos: &Tensor<f32>,
    top2: &Tensor<f32>,
    align: &Tensor<f32>,
    overlap: &Tensor<f32>,
    max_align: &mut Tensor<f32>,
    max_overlap: &mut Tensor<f32>,
    #[comptime] second: bool,
) {
    let anchors = pos.shape(2);
    let row = CUBE_POS_X as usize;
    let u = UNIT_POS_X as usize;
    let none = f32::new(f32::NEG_INFINITY);
    let mut ma = none;
    let mut mo = none;
    let mut q = u;
    while q < anchors {
        let at = row * anchors + q;
        let mut va = 0.0f32;
        let mut vo = 0.0f32;
        if positive(pos, top2, at, second) {
            va = align[at];
            vo = overlap[at];
        }
        ma = f32::max(ma, va);
        mo = f32::max(mo, vo);
        q += UNITS;
    }
    let mut s = Shared::<[f32]>::new_slice(2 * UNITS);
    s[u] = ma;
    s[u + UNITS] = mo;
    sync_cube();
    let mut half = CUBE_DIM_X as usize / 2;
    while half > 0 {
        if u < half {
            s[u] = f32::max(s[u], s[u + half]);
            s[u + UNITS] = f32::max(s[u + UNITS], s[u + half + UNITS]);
        }
        sync_cube();
        half /= 2;
    }
    if u == 0 {
        max_align[row] = s[0];
        max_overlap[row] = s[UNITS];
    }
}

/// Unit `(b, a)`: `fg[b, a]` (0/1), `gt[b, a]` (the last positive slot, else 0, as a float) and
/// the soft targets `target[b, c, a]`: the largest of the positives' `align · max_overlap /
/// (max_align + eps)` at the assigned object's class, zero elsewhere. `[B, N, A]` inputs and
/// the outputs contiguous; `objects` by its strides.
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
fn targets_kernel(
    pos: &Tensor<f32>,
    top2: &Tensor<f32>,
    align: &Tensor<f32>,
    max_align: &Tensor<f32>,
    max_overlap: &Tensor<f32>,
    objects: &Tensor<f32>,
    fg: &mut Tensor<f32>,
    gt: &mut Tensor<f32>,
    target: &mut Tensor<f32>,
    eps: f32,
    #[comptime] second: bool,
) {
    let slots = pos.shape(1);
    let anchors = pos.shape(2);
    if ABSOLUTE_POS >= pos.shape(0) * anchors {
        terminate!();
    }
    let b = ABSOLUTE_POS / anchors;
    let a = ABSOLUTE_POS % anchors;
    let none = f32::new(f32::NEG_INFINITY);
    let mut norm = none;
    let mut any = false;
    let mut last = 0usize;
    for n in 0..slots {
        let r = b * slots + n;
        let at = r * anchors + a;
        let mut v = 0.0f32;
        if positive(pos, top2, at, second) {
            v = align[at] * max_overlap[r] / (max_align[r] + eps);
            any = true;
            last = n;
        }
        norm = f32::max(norm, v);
    }
    let class = objects[b * objects.stride(0) + last * objects.stride(1)];
    let ci = usize::cast_from(class);
    let mut f = 0.0f32;
    if any {
        f = 1.0f32;
    }
    fg[ABSOLUTE_POS] = f;
    gt[ABSOLUTE_POS] = f32::cast_from(last);
    let classes = target.shape(1);
    for c in 0..classes {
        let mut t = 0.0f32;
        if any && c == ci {
            t = norm;
        }
        target[(b * classes + c) * anchors + a] = t;
    }
}

/// Cubes and their units for one unit per value of `total`.
pub(crate) fn elementwise(like: &CubeTensor, total: usize) -> (CubeCount, CubeDim) {
    let dim = CubeDim::new(&like.client, total);
    (calculate_cube_count_elemwise(&like.client, total, dim), dim)
}

/// The assignment of one branch copy: `boxes` `[B, 4, A]` (ltrb in grid units) and `scores`
/// `[B, nc, A]` (logits) of its outputs, `poses` for the OKS overlap (pose objects and
/// outputs, else `None`), the anchors' `[1, 1, A]` centres and strides `[x, y, stride]`, the
/// packed object slots `objects` `[B, N, 6 + 3K]`. Every input FP32, any strides.
pub fn assign(
    boxes: CubeTensor,
    scores: CubeTensor,
    poses: Option<Poses>,
    [ax, ay, st]: [CubeTensor; 3],
    objects: CubeTensor,
    rules: &Rules,
) -> Assigned {
    let inputs = [&boxes, &scores, &ax, &ay, &st, &objects];
    assert!(
        inputs.iter().all(|t| t.dtype == DType::F32),
        "assign: FP32 inputs only"
    );
    let (sd, od) = (scores.meta.shape().to_vec(), objects.meta.shape().to_vec());
    let (b, nc, a, n) = (sd[0], sd[1], sd[2], od[1]);
    assert!(
        boxes.meta.shape().to_vec() == [b, 4, a]
            && st.meta.shape().to_vec() == [1, 1, a]
            && od.len() == 3
            && od[0] == b
            && od[2] >= PACKED
            && nc > 0,
        "assign: shapes disagree (scores {sd:?}, objects {od:?})"
    );
    let client = scores.client.clone();
    let overlap = empty_f32(&scores, [b, n, a]);
    let align = empty_f32(&scores, [b, n, a]);
    let cand = empty_f32(&scores, [b, n, a]);
    let (keypoints, kd) = match &poses {
        Some(p) => (p.sig.meta.shape()[0], p.kd),
        None => (0, 1),
    };
    if let Some(p) = &poses {
        let rd = p.raw.meta.shape().to_vec();
        assert!(
            p.raw.dtype == DType::F32
                && p.sig.dtype == DType::F32
                && rd == [b, keypoints * kd, a]
                && od[2] >= PACKED + 3 * keypoints
                && kd >= 2,
            "assign: keypoint shapes disagree (raw {rd:?}, objects {od:?})"
        );
    }
    // Without poses the kernel reads neither: any FP32 tensors stand in.
    let (raw, sig) = match poses {
        Some(p) => (p.raw, p.sig),
        None => (boxes.clone(), st.clone()),
    };
    let pi = std::f32::consts::PI;
    // SAFETY: cube `(chunk, row)` writes anchors `chunk · UNITS + u < A` of row `row < B·N` of
    // the contiguous `[B, N, A]` outputs; every read is bounded by the shapes checked above
    // (class indices clamped to the scores' rows) and follows its tensor's strides.
    unsafe {
        metrics_kernel::launch_unchecked(
            &client,
            CubeCount::Static(a.div_ceil(UNITS) as u32, (b * n) as u32, 1),
            CubeDim::new_1d(UNITS as u32),
            boxes.into_tensor_arg(),
            scores.clone().into_tensor_arg(),
            raw.into_tensor_arg(),
            ax.into_tensor_arg(),
            ay.into_tensor_arg(),
            st.into_tensor_arg(),
            objects.clone().into_tensor_arg(),
            sig.into_tensor_arg(),
            overlap.clone().into_tensor_arg(),
            align.clone().into_tensor_arg(),
            cand.clone().into_tensor_arg(),
            rules.alpha,
            rules.beta,
            rules.stal_min_side,
            rules.stal_min_side / 2.0,
            rules.strides[0],
            rules.strides[1],
            rules.area_of_box,
            4.0 / (pi * pi),
            rules.pose,
            keypoints,
            kd,
        );
    }
    let top = super::top_k::top_k_mask(align.clone(), rules.topk);
    let second = rules.topk2 != rules.topk;
    let pos = empty_f32(&scores, [b, n, a]);
    // The second cut's top-k reads `kept` as `[B, N, A]`; without one the kernel writes no
    // `kept`, and one value stands in.
    let kept = match second {
        true => empty_f32(&scores, [b, n, a]),
        false => empty_f32(&scores, [1, 1, 1]),
    };
    let (count, dim) = elementwise(&scores, b * a);
    // SAFETY: unit `(b, a)` below `B·A` reads and writes column `a` of image `b` of the
    // contiguous `[B, N, A]` tensors; `kept` is written only with `second` (its own tensor then).
    unsafe {
        resolve_kernel::launch_unchecked(
            &client,
            count.clone(),
            dim,
            top.into_tensor_arg(),
            cand.into_tensor_arg(),
            overlap.clone().into_tensor_arg(),
            align.clone().into_tensor_arg(),
            pos.clone().into_tensor_arg(),
            kept.clone().into_tensor_arg(),
            second,
        );
    }
    let top2 = if second {
        super::top_k::top_k_mask(kept, rules.topk2)
    } else {
        pos.clone()
    };
    let max_align = empty_f32(&scores, [b * n]);
    let max_overlap = empty_f32(&scores, [b * n]);
    // SAFETY: cube `r < B·N` reads row `r` of the contiguous `[B, N, A]` tensors and writes
    // value `r` of each maximum.
    unsafe {
        row_max_kernel::launch_unchecked(
            &client,
            CubeCount::Static((b * n) as u32, 1, 1),
            CubeDim::new_1d(UNITS as u32),
            pos.clone().into_tensor_arg(),
            top2.clone().into_tensor_arg(),
            align.clone().into_tensor_arg(),
            overlap.into_tensor_arg(),
            max_align.clone().into_tensor_arg(),
            max_overlap.clone().into_tensor_arg(),
            second,
        );
    }
    let fg = empty_f32(&scores, [b, a]);
    let gt = empty_f32(&scores, [b, a]);
    let target = empty_f32(&scores, [b, nc, a]);
    // SAFETY: unit `(b, a)` below `B·A` reads column `a` of image `b` (the maxima of its rows,
    // the slot of a positive below N in `objects`) and writes value `(b, a)` of `fg` and `gt`
    // and column `a` of image `b` of the contiguous `[B, nc, A]` targets.
    unsafe {
        targets_kernel::launch_unchecked(
            &client,
            count,
            dim,
            pos.into_tensor_arg(),
            top2.into_tensor_arg(),
            align.into_tensor_arg(),
            max_align.into_tensor_arg(),
            max_overlap.into_tensor_arg(),
            objects.into_tensor_arg(),
            fg.clone().into_tensor_arg(),
            gt.clone().into_tensor_arg(),
            target.clone().into_tensor_arg(),
            rules.eps,
            second,
        );
    }
    Assigned { fg, gt, target }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ops::compile_check::{compiles, device, tensor};

    /// Every kernel compiles for CUDA on a machine without a GPU, pose (with and without OKS)
    /// and detection, with and without a second cut.
    #[test]
    fn assignment_kernels_compile_for_cuda_without_a_device() {
        let (props, target) = device();
        let (b, n, a, nc, k) = (2, 3, 300, 2, 17);
        let one = || CubeDim::new_1d(UNITS as u32);
        for (pose, keypoints, kd) in [(true, k, 3), (true, 0, 1), (false, 0, 1)] {
            let kernel = metrics_kernel::create_dummy_kernel(
                props.clone(),
                target.clone(),
                CubeCount::Static(2, (b * n) as u32, 1),
                one(),
                tensor(&[b, 4, a]),
                tensor(&[b, nc, a]),
                tensor(&[b, k * 3, a]),
                tensor(&[1, 1, a]),
                tensor(&[1, 1, a]),
                tensor(&[1, 1, a]),
                tensor(&[b, n, PACKED + 3 * k]),
                tensor(&[k]),
                tensor(&[b, n, a]),
                tensor(&[b, n, a]),
                tensor(&[b, n, a]),
                0.5,
                6.0,
                16.0,
                8.0,
                8.0,
                32.0,
                0.53,
                0.4,
                pose,
                keypoints,
                kd,
            );
            compiles(kernel.define());
        }
        for second in [false, true] {
            let kernel = resolve_kernel::create_dummy_kernel(
                props.clone(),
                target.clone(),
                CubeCount::Static(3, 1, 1),
                one(),
                tensor(&[b, n, a]),
                tensor(&[b, n, a]),
                tensor(&[b, n, a]),
                tensor(&[b, n, a]),
                tensor(&[b, n, a]),
                tensor(&[b, n, a]),
                second,
            );
            compiles(kernel.define());
            let kernel = row_max_kernel::create_dummy_kernel(
                props.clone(),
                target.clone(),
                CubeCount::Static((b * n) as u32, 1, 1),
                one(),
                tensor(&[b, n, a]),
                tensor(&[b, n, a]),
                tensor(&[b, n, a]),
                tensor(&[b, n, a]),
                tensor(&[b * n]),
                tensor(&[b * n]),
                second,
            );
            compiles(kernel.define());
            let kernel = targets_kernel::create_dummy_kernel(
                props.clone(),
                target.clone(),
                CubeCount::Static(3, 1, 1),
                one(),
                tensor(&[b, n, a]),
                tensor(&[b, n, a]),
                tensor(&[b, n, a]),
                tensor(&[b * n]),
                tensor(&[b * n]),
                tensor(&[b, n, PACKED + 3 * k]),
                tensor(&[b, a]),
                tensor(&[b, a]),
                tensor(&[b, nc, a]),
                1e-9,
                second,
            );
            compiles(kernel.define());
        }
    }
}
