//! The device loss's per-anchor terms of a pose branch copy (`loss::anchor_terms`) as one launch
//! forward and one backward, where their tensor operations and autodiff's backward of them take
//! ~480 launches a step (docs/kernels.md, "The per-anchor loss terms"). One unit per anchor
//! `(b, a)`:
//! - forward: `out[r, b, a]` (contiguous `[5, B, A]`), zero off the foreground, else row 0 the
//!   box term `(1 − CIoU) · w`, row 1 the L1 term `Σ|·| / 4 · w`, row 2 the OKS term
//!   `Σ_k factor · (1 − e^(−e_k)) · v_k`, row 3 the keypoint-visibility BCE `Σ_k bce(x_k, v_k)`
//!   (zero with two values a keypoint), row 4 the labelled keypoints `Σ_k v_k`;
//! - backward: the box distances' and raw keypoints' gradients for the rows' incoming gradients
//!   (row 4 carries none), the derivatives written out as autodiff takes them through the tensor
//!   operations (ties of `min`/`max` to the prediction, `clamp_min(0)` passing at zero,
//!   `|x|`' slope 0 at zero, the CIoU aspect weight α detached).
//!
//! The formulas are `loss::anchor_terms::host`'s, operation by operation (the CPU's, and the
//! reference the GPU test compares with); NVRTC may fuse a multiply and an add, so the last bit
//! can differ. No sums across units: the same bits every run.

// `#[cube]` expands to `cubecl::…` paths.
use super::ROWS;
use super::host::{AREA_E, E, v_scale};
use crate::loss::assign::device::PACKED;
use crate::loss::assign::device::kernel_assign::{ciou, elementwise};
use crate::model::ops::empty_f32;
use burn::cubecl;
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

/// Inputs of the terms that carry no gradient, FP32, any strides: the packed object slots
/// `[B, N, 6 + 3K]` (pixels), the slot each anchor learns `[B, A]` (as a float), the foreground
/// `[B, A]` (0/1), the alignment weight `[B, A]`, the anchors' centres and strides (`[1, 1, A]`,
/// grid units) and `8σ²` per keypoint `[K]`.
pub struct Fixed {
    pub objects: CubeTensor,
    pub slot: CubeTensor,
    pub fg: CubeTensor,
    pub weight: CubeTensor,
    pub ax: CubeTensor,
    pub ay: CubeTensor,
    pub st: CubeTensor,
    pub sig: CubeTensor,
}

/// The gradient of CIoU(`a`, `b`) with respect to `a`'s four coordinates, into `da` (reverse
/// mode through the tensor operations' order; α held fixed).
#[cube]
#[allow(clippy::too_many_arguments)]
fn ciou_grad(
    a0: f32,
    a1: f32,
    a2: f32,
    a3: f32,
    b0: f32,
    b1: f32,
    b2: f32,
    b3: f32,
    v_scale: f32,
    da: &mut Array<f32>,
) {
    let w1 = a2 - a0;
    let h1 = a3 - a1 + E;
    let w2 = b2 - b0;
    let h2 = b3 - b1 + E;
    let iw = f32::min(a2, b2) - f32::max(a0, b0);
    let ih = f32::min(a3, b3) - f32::max(a1, b1);
    let iwc = f32::max(iw, 0.0f32);
    let ihc = f32::max(ih, 0.0f32);
    let inter = iwc * ihc;
    let union = w1 * h1 + w2 * h2 - inter + E;
    let iou = inter / union;
    let cw = f32::max(a2, b2) - f32::min(a0, b0);
    let ch = f32::max(a3, b3) - f32::min(a1, b1);
    let c2 = cw * cw + ch * ch + E;
    let dxs = b0 + b2 - a0 - a2;
    let dys = b1 + b3 - a1 - a3;
    let rho2 = (dxs * dxs + dys * dys) / 4.0f32;
    let r1 = w1 / h1;
    let t = f32::atan(w2 / h2) - f32::atan(r1);
    let v = t * t * v_scale;
    let alpha = v / (v - iou + (1.0f32 + E));

    let d_rho2 = -1.0f32 / c2;
    let d_c2 = rho2 / (c2 * c2);
    let d_t = -alpha * 2.0f32 * t * v_scale;
    let d_r1 = -d_t / (1.0f32 + r1 * r1);
    let d_union = -inter / (union * union);
    let d_inter = 1.0f32 / union - d_union;
    let d_w1 = d_r1 / h1 + d_union * h1;
    let d_h1 = -d_r1 * w1 / (h1 * h1) + d_union * w1;
    let mut d_iw = 0.0f32;
    if iw >= 0.0f32 {
        d_iw = d_inter * ihc;
    }
    let mut d_ih = 0.0f32;
    if ih >= 0.0f32 {
        d_ih = d_inter * iwc;
    }
    let d_cw = d_c2 * 2.0f32 * cw;
    let d_ch = d_c2 * 2.0f32 * ch;
    let d_dxs = d_rho2 * 2.0f32 * dxs / 4.0f32;
    let d_dys = d_rho2 * 2.0f32 * dys / 4.0f32;
    let mut g0 = -d_w1 - d_dxs;
    let mut g1 = -d_h1 - d_dys;
    let mut g2 = d_w1 - d_dxs;
    let mut g3 = d_h1 - d_dys;
    if a2 <= b2 {
        g2 += d_iw;
    }
    if a0 >= b0 {
        g0 -= d_iw;
    }
    if a3 <= b3 {
        g3 += d_ih;
    }
    if a1 >= b1 {
        g1 -= d_ih;
    }
    if a2 >= b2 {
        g2 += d_cw;
    }
    if a0 <= b0 {
        g0 -= d_cw;
    }
    if a3 >= b3 {
        g3 += d_ch;
    }
    if a1 <= b1 {
        g1 -= d_ch;
    }
    da[0] = g0;
    da[1] = g1;
    da[2] = g2;
    da[3] = g3;
}

/// `bce_with_logits(x, t)` as the tensor operations write it.
#[cube]
fn bce(x: f32, t: f32) -> f32 {
    f32::max(x, 0.0f32) - x * t + f32::log1p(f32::exp(-f32::abs(x)))
}

/// Its derivative in `x`, as autodiff takes it (`clamp_min` passes at zero, `|x|`' slope there
/// is zero).
#[cube]
fn bce_grad(x: f32, t: f32) -> f32 {
    let e = f32::exp(-f32::abs(x));
    let mut step = 0.0f32;
    if x >= 0.0f32 {
        step = 1.0f32;
    }
    step - t - sign_of(x) * e / (1.0f32 + e)
}

/// `x`'s sign, zero at zero (Burn's `sign`).
#[cube]
pub(crate) fn sign_of(x: f32) -> f32 {
    let mut s = 0.0f32;
    if x > 0.0f32 {
        s = 1.0f32;
    }
    if x < 0.0f32 {
        s = -1.0f32;
    }
    s
}

/// The labelled keypoints of the object slot at `o` (values `os` apart).
#[cube]
fn labelled(objects: &Tensor<f32>, o: usize, os: usize, #[comptime] keypoints: usize) -> f32 {
    let mut seen = 0.0f32;
    #[unroll]
    for k in 0..keypoints {
        if objects[o + (PACKED + 3 * k + 2) * os] != 0.0f32 {
            seen += 1.0f32;
        }
    }
    seen
}

/// Unit `(b, a)`: [`ROWS`] values at `out[r · B·A + b · A + a]`.
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
fn forward_kernel(
    boxes: &Tensor<f32>,
    kpts: &Tensor<f32>,
    objects: &Tensor<f32>,
    slot: &Tensor<f32>,
    fg: &Tensor<f32>,
    weight: &Tensor<f32>,
    ax: &Tensor<f32>,
    ay: &Tensor<f32>,
    st: &Tensor<f32>,
    sig: &Tensor<f32>,
    out: &mut Tensor<f32>,
    width: f32,
    height: f32,
    v_scale: f32,
    #[comptime] keypoints: usize,
    #[comptime] kd: usize,
) {
    let anchors = boxes.shape(2);
    let total = boxes.shape(0) * anchors;
    if ABSOLUTE_POS >= total {
        terminate!();
    }
    let a = ABSOLUTE_POS % anchors;
    let b = ABSOLUTE_POS / anchors;
    let mut r0 = 0.0f32;
    let mut r1 = 0.0f32;
    let mut r2 = 0.0f32;
    let mut r3 = 0.0f32;
    let mut r4 = 0.0f32;
    if fg[b * fg.stride(0) + a * fg.stride(1)] != 0.0f32 {
        let w = weight[b * weight.stride(0) + a * weight.stride(1)];
        let n = usize::cast_from(slot[b * slot.stride(0) + a * slot.stride(1)]);
        let o = b * objects.stride(0) + n * objects.stride(1);
        let os = objects.stride(2);
        let s = st[a * st.stride(2)];
        let cx = ax[a * ax.stride(2)];
        let cy = ay[a * ay.stride(2)];
        let g0 = objects[o + 2 * os] / s;
        let g1 = objects[o + 3 * os] / s;
        let g2 = objects[o + 4 * os] / s;
        let g3 = objects[o + 5 * os] / s;
        let bo = b * boxes.stride(0) + a * boxes.stride(2);
        let bs = boxes.stride(1);
        let l0 = boxes[bo];
        let l1 = boxes[bo + bs];
        let l2 = boxes[bo + 2 * bs];
        let l3 = boxes[bo + 3 * bs];
        let iou = ciou(cx - l0, cy - l1, cx + l2, cy + l3, g0, g1, g2, g3, v_scale);
        r0 = (-iou + 1.0f32) * w;
        let sx = s / width;
        let sy = s / height;
        let row = f32::abs((l0 - (cx - g0)) * sx)
            + f32::abs((l1 - (cy - g1)) * sy)
            + f32::abs((l2 - (g2 - cx)) * sx)
            + f32::abs((l3 - (g3 - cy)) * sy);
        r1 = row / 4.0f32 * w;
        let area = (g2 - g0) * (g3 - g1);
        let ko = b * kpts.stride(0) + a * kpts.stride(2);
        let ks = kpts.stride(1);
        let seen = labelled(objects, o, os, keypoints);
        let factor = 1.0f32 / (seen + AREA_E) * f32::new(comptime!(keypoints as f32));
        #[unroll]
        for k in 0..keypoints {
            let gp = o + (PACKED + 3 * k) * os;
            let vis = objects[gp + 2 * os] != 0.0f32;
            let dx = kpts[ko + k * kd * ks] + cx - objects[gp] / s;
            let dy = kpts[ko + (k * kd + 1) * ks] + cy - objects[gp + os] / s;
            let e = (dx * dx + dy * dy) / (sig[k * sig.stride(0)] * (area + AREA_E));
            if vis {
                r2 += factor * (-f32::exp(-e) + 1.0f32);
            }
            if comptime!(kd == 3) {
                let mut t = 0.0f32;
                if vis {
                    t = 1.0f32;
                }
                r3 += bce(kpts[ko + (k * kd + 2) * ks], t);
            }
        }
        r4 = seen;
    }
    out[ABSOLUTE_POS] = r0;
    out[total + ABSOLUTE_POS] = r1;
    out[2 * total + ABSOLUTE_POS] = r2;
    out[3 * total + ABSOLUTE_POS] = r3;
    out[4 * total + ABSOLUTE_POS] = r4;
}

/// Unit `(b, a)`: the gradients of the box distances (`d_boxes`, contiguous `[B, 4, A]`) and of
/// the raw keypoints (`d_kpts`, contiguous `[B, K·kd, A]`) for the rows' gradients `grad`
/// (`[5, B, A]`, any strides; a broadcast row has stride 0), zero off the foreground.
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
fn backward_kernel(
    boxes: &Tensor<f32>,
    kpts: &Tensor<f32>,
    objects: &Tensor<f32>,
    slot: &Tensor<f32>,
    fg: &Tensor<f32>,
    weight: &Tensor<f32>,
    ax: &Tensor<f32>,
    ay: &Tensor<f32>,
    st: &Tensor<f32>,
    sig: &Tensor<f32>,
    grad: &Tensor<f32>,
    d_boxes: &mut Tensor<f32>,
    d_kpts: &mut Tensor<f32>,
    width: f32,
    height: f32,
    v_scale: f32,
    #[comptime] keypoints: usize,
    #[comptime] kd: usize,
) {
    let anchors = boxes.shape(2);
    let total = boxes.shape(0) * anchors;
    if ABSOLUTE_POS >= total {
        terminate!();
    }
    let a = ABSOLUTE_POS % anchors;
    let b = ABSOLUTE_POS / anchors;
    let db = b * 4 * anchors + a;
    let dk = b * keypoints * kd * anchors + a;
    if fg[b * fg.stride(0) + a * fg.stride(1)] != 0.0f32 {
        let gi = b * grad.stride(1) + a * grad.stride(2);
        let gs = grad.stride(0);
        let g_box = grad[gi];
        let g_l1 = grad[gi + gs];
        let g_pose = grad[gi + 2 * gs];
        let g_kobj = grad[gi + 3 * gs];
        let w = weight[b * weight.stride(0) + a * weight.stride(1)];
        let n = usize::cast_from(slot[b * slot.stride(0) + a * slot.stride(1)]);
        let o = b * objects.stride(0) + n * objects.stride(1);
        let os = objects.stride(2);
        let s = st[a * st.stride(2)];
        let cx = ax[a * ax.stride(2)];
        let cy = ay[a * ay.stride(2)];
        let g0 = objects[o + 2 * os] / s;
        let g1 = objects[o + 3 * os] / s;
        let g2 = objects[o + 4 * os] / s;
        let g3 = objects[o + 5 * os] / s;
        let bo = b * boxes.stride(0) + a * boxes.stride(2);
        let bs = boxes.stride(1);
        let l0 = boxes[bo];
        let l1 = boxes[bo + bs];
        let l2 = boxes[bo + 2 * bs];
        let l3 = boxes[bo + 3 * bs];
        let mut da = Array::<f32>::new(4usize);
        ciou_grad(
            cx - l0,
            cy - l1,
            cx + l2,
            cy + l3,
            g0,
            g1,
            g2,
            g3,
            v_scale,
            &mut da,
        );
        // box = (1 − CIoU) · w and the prediction is (cx − l0, cy − l1, cx + l2, cy + l3).
        let gw = g_box * w;
        let sx = s / width;
        let sy = s / height;
        let q = g_l1 * w / 4.0f32;
        d_boxes[db] = gw * da[0] + q * sign_of((l0 - (cx - g0)) * sx) * sx;
        d_boxes[db + anchors] = gw * da[1] + q * sign_of((l1 - (cy - g1)) * sy) * sy;
        d_boxes[db + 2 * anchors] = -gw * da[2] + q * sign_of((l2 - (g2 - cx)) * sx) * sx;
        d_boxes[db + 3 * anchors] = -gw * da[3] + q * sign_of((l3 - (g3 - cy)) * sy) * sy;
        let area = (g2 - g0) * (g3 - g1);
        let ko = b * kpts.stride(0) + a * kpts.stride(2);
        let ks = kpts.stride(1);
        let seen = labelled(objects, o, os, keypoints);
        let factor = 1.0f32 / (seen + AREA_E) * f32::new(comptime!(keypoints as f32));
        #[unroll]
        for k in 0..keypoints {
            let gp = o + (PACKED + 3 * k) * os;
            let vis = objects[gp + 2 * os] != 0.0f32;
            let dx = kpts[ko + k * kd * ks] + cx - objects[gp] / s;
            let dy = kpts[ko + (k * kd + 1) * ks] + cy - objects[gp + os] / s;
            let den = sig[k * sig.stride(0)] * (area + AREA_E);
            let e = (dx * dx + dy * dy) / den;
            let mut gx = 0.0f32;
            let mut gy = 0.0f32;
            if vis {
                let de = g_pose * factor * f32::exp(-e) / den;
                gx = de * 2.0f32 * dx;
                gy = de * 2.0f32 * dy;
            }
            d_kpts[dk + k * kd * anchors] = gx;
            d_kpts[dk + (k * kd + 1) * anchors] = gy;
            if comptime!(kd == 3) {
                let mut t = 0.0f32;
                if vis {
                    t = 1.0f32;
                }
                d_kpts[dk + (k * kd + 2) * anchors] =
                    g_kobj * bce_grad(kpts[ko + (k * kd + 2) * ks], t);
            }
        }
    } else {
        #[unroll]
        for c in 0..4 {
            d_boxes[db + c * anchors] = 0.0f32;
        }
        #[unroll]
        for c in 0..comptime!(keypoints * kd) {
            d_kpts[dk + c * anchors] = 0.0f32;
        }
    }
}

/// The shapes every entry checks: `boxes` `[B, 4, A]`, `kpts` `[B, K·kd, A]` with `kd` 2 or 3
/// and `K` from `fixed.sig`; every tensor FP32. Returns `(B, A, K, kd)`.
fn check(boxes: &CubeTensor, kpts: &CubeTensor, fixed: &Fixed) -> (usize, usize, usize, usize) {
    let all = [
        boxes,
        kpts,
        &fixed.objects,
        &fixed.slot,
        &fixed.fg,
        &fixed.weight,
        &fixed.ax,
        &fixed.ay,
        &fixed.st,
        &fixed.sig,
    ];
    for t in all {
        assert!(
            t.dtype == DType::F32,
            "anchor terms: f32 only, got {:?}",
            t.dtype
        );
    }
    let (bs, ks) = (boxes.meta.shape(), kpts.meta.shape());
    let k = fixed.sig.meta.shape()[0];
    assert!(
        bs.num_dims() == 3 && bs[1] == 4 && ks.num_dims() == 3 && ks[0] == bs[0] && ks[2] == bs[2],
        "anchor terms: boxes [B, 4, A] and keypoints [B, K·kd, A], got {bs:?} and {ks:?}"
    );
    let kd = ks[1].checked_div(k).unwrap_or(0);
    assert!(
        k > 0 && (kd == 2 || kd == 3) && ks[1] == k * kd,
        "anchor terms: {} keypoint channels for {k} keypoints",
        ks[1]
    );
    let os = fixed.objects.meta.shape();
    assert!(
        os.num_dims() == 3 && os[0] == bs[0] && os[2] == PACKED + 3 * k,
        "anchor terms: object slots [B, N, 6 + 3K], got {os:?}"
    );
    (bs[0], bs[2], k, kd)
}

/// The forward: `[5, B, A]` (FP32, contiguous), rows as the module's documentation says, for
/// an image of `size` `[h, w]` pixels.
pub fn forward(boxes: CubeTensor, kpts: CubeTensor, fixed: Fixed, size: [usize; 2]) -> CubeTensor {
    let (b, a, k, kd) = check(&boxes, &kpts, &fixed);
    let client = boxes.client.clone();
    let out = empty_f32(&boxes, [ROWS, b, a]);
    let total = b * a;
    if total == 0 {
        return out;
    }
    let (count, dim) = elementwise(&boxes, total);
    // SAFETY: units are bounded by B·A; every read follows its tensor's strides within the
    // shapes `check` asserted (the slot index is an assignment's, below N).
    unsafe {
        forward_kernel::launch_unchecked(
            &client,
            count,
            dim,
            boxes.into_tensor_arg(),
            kpts.into_tensor_arg(),
            fixed.objects.into_tensor_arg(),
            fixed.slot.into_tensor_arg(),
            fixed.fg.into_tensor_arg(),
            fixed.weight.into_tensor_arg(),
            fixed.ax.into_tensor_arg(),
            fixed.ay.into_tensor_arg(),
            fixed.st.into_tensor_arg(),
            fixed.sig.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            size[1] as f32,
            size[0] as f32,
            v_scale(),
            k,
            kd,
        );
    }
    out
}

/// The backward for the rows' gradients `grad` (`[5, B, A]`, FP32, any strides):
/// `(d_boxes [B, 4, A], d_kpts [B, K·kd, A])`, contiguous.
pub fn backward(
    boxes: CubeTensor,
    kpts: CubeTensor,
    fixed: Fixed,
    grad: CubeTensor,
    size: [usize; 2],
) -> (CubeTensor, CubeTensor) {
    let (b, a, k, kd) = check(&boxes, &kpts, &fixed);
    assert!(
        grad.dtype == DType::F32 && grad.meta.shape().dims::<3>() == [ROWS, b, a],
        "anchor terms: gradient [5, B, A] in f32, got {:?}",
        grad.meta.shape()
    );
    let client = boxes.client.clone();
    let (d_boxes, d_kpts) = (
        empty_f32(&boxes, [b, 4, a]),
        empty_f32(&boxes, [b, k * kd, a]),
    );
    let total = b * a;
    if total == 0 {
        return (d_boxes, d_kpts);
    }
    let (count, dim) = elementwise(&boxes, total);
    // SAFETY: as `forward`; the outputs are contiguous and written at B·A·4 and B·A·K·kd
    // places, one per unit and channel.
    unsafe {
        backward_kernel::launch_unchecked(
            &client,
            count,
            dim,
            boxes.into_tensor_arg(),
            kpts.into_tensor_arg(),
            fixed.objects.into_tensor_arg(),
            fixed.slot.into_tensor_arg(),
            fixed.fg.into_tensor_arg(),
            fixed.weight.into_tensor_arg(),
            fixed.ax.into_tensor_arg(),
            fixed.ay.into_tensor_arg(),
            fixed.st.into_tensor_arg(),
            fixed.sig.into_tensor_arg(),
            grad.into_tensor_arg(),
            d_boxes.clone().into_tensor_arg(),
            d_kpts.clone().into_tensor_arg(),
            size[1] as f32,
            size[0] as f32,
            v_scale(),
            k,
            kd,
        );
    }
    (d_boxes, d_kpts)
}

#[cfg(test)]
#[path = "anchor_terms_tests.rs"]
mod tests;
