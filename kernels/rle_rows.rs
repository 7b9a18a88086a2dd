//! The device loss's RLE rows of a pose branch copy (`loss::anchor_terms::rle_rows`) as one
//! launch forward and one backward, where their tensor operations (gathers of the foreground's
//! keypoints, sigmoid, ε, the log terms) and autodiff's backward of them took ~60 launches a
//! copy. Forward, one unit per row `(b, k, j)`: the foreground anchor `picked[b, j]` (rows past
//! the image's `count[b]` positives read anchor `picked`'s value there and are not counted),
//! `ε = clamp((μ − g) / (σ + 1e-9), −100, 100)` per coordinate with `σ = max(sigmoid(raw),
//! MIN_POSITIVE)`, the row's `log σ + log 2σ + |ε|` over both coordinates and whether it counts
//! (labelled and in use): `out[(b·K + k)·R + j, 0..4] = (εx, εy, per, counted)`. Backward, one
//! unit per anchor `(b, a)` writing its keypoints' and sigmas' gradients from its row
//! `place[b, a]` (none, all zeros, at `place ≥ R`), the derivatives as autodiff takes them
//! through the tensor operations (`clamp` passing on `[−100, 100]`, `clamp_min` at and above its
//! bound, `|x|`' slope 0 at zero, the sigmoid's `s · (1 − s)`).
//!
//! The formulas are `loss::anchor_terms::rle`'s (the CPU's loops), operation by operation; NVRTC
//! may fuse a multiply and an add. No sums across units: the same bits every run.

// `#[cube]` expands to `cubecl::…` paths.
use super::kernel::sign_of;
use super::rle::COLUMNS;
use crate::loss::assign::device::PACKED;
use crate::loss::assign::device::kernel_assign::elementwise;
use crate::model::ops::empty_f32;
use burn::cubecl;
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

/// Inputs that carry no gradient, FP32, any strides: the packed object slots `[B, N, 6 + 3K]`,
/// per anchor the slot it learns `slot` `[B, A]` and its row `place` `[B, A]` (`≥ R` off the
/// foreground), per row the anchor `picked` `[B, R]`, per image the positives `count` `[B]`,
/// the anchors' centres and strides (`[1, 1, A]`, grid units).
pub struct Fixed {
    pub objects: CubeTensor,
    pub slot: CubeTensor,
    pub place: CubeTensor,
    pub picked: CubeTensor,
    pub count: CubeTensor,
    pub ax: CubeTensor,
    pub ay: CubeTensor,
    pub st: CubeTensor,
}

/// Burn's sigmoid, `exp(−ln(exp(−x) + 1))`.
#[cube]
fn sigmoid(x: f32) -> f32 {
    f32::exp(-f32::ln(f32::exp(-x) + 1.0f32))
}

/// The truth's offset from anchor `a`'s centre for keypoint `k` of the object at `o` (one
/// coordinate `c`), in grid units.
#[cube]
fn offset(objects: &Tensor<f32>, o: usize, k: usize, c: usize, centre: f32, s: f32) -> f32 {
    let os = objects.stride(2);
    objects[o + (PACKED + 3 * k + c) * os] / s - centre
}

/// Unit `(b, k, j)` (row-major over `[B, K, R]`): the row's four columns.
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
fn forward_kernel(
    kpts: &Tensor<f32>,
    sigma: &Tensor<f32>,
    objects: &Tensor<f32>,
    slot: &Tensor<f32>,
    picked: &Tensor<f32>,
    count: &Tensor<f32>,
    ax: &Tensor<f32>,
    ay: &Tensor<f32>,
    st: &Tensor<f32>,
    out: &mut Tensor<f32>,
    #[comptime] keypoints: usize,
    #[comptime] kd: usize,
) {
    let rows = picked.shape(1);
    let total = kpts.shape(0) * keypoints * rows;
    if ABSOLUTE_POS >= total {
        terminate!();
    }
    let j = ABSOLUTE_POS % rows;
    let k = (ABSOLUTE_POS / rows) % keypoints;
    let b = ABSOLUTE_POS / (rows * keypoints);
    let a = usize::cast_from(picked[b * picked.stride(0) + j * picked.stride(1)]);
    let used = f32::cast_from(j) < count[b * count.stride(0)];
    let n = usize::cast_from(slot[b * slot.stride(0) + a * slot.stride(1)]);
    let o = b * objects.stride(0) + n * objects.stride(1);
    let s = st[a * st.stride(2)];
    let ox = offset(objects, o, k, 0, ax[a * ax.stride(2)], s);
    let oy = offset(objects, o, k, 1, ay[a * ay.stride(2)], s);
    let seen = objects[o + (PACKED + 3 * k + 2) * objects.stride(2)] != 0.0f32;
    let ko = b * kpts.stride(0) + a * kpts.stride(2);
    let rx = kpts[ko + k * kd * kpts.stride(1)];
    let ry = kpts[ko + (k * kd + 1) * kpts.stride(1)];
    let so = b * sigma.stride(0) + a * sigma.stride(2);
    let sx = f32::max(
        sigmoid(sigma[so + 2 * k * sigma.stride(1)]),
        f32::new(f32::MIN_POSITIVE),
    );
    let sy = f32::max(
        sigmoid(sigma[so + (2 * k + 1) * sigma.stride(1)]),
        f32::new(f32::MIN_POSITIVE),
    );
    let ex = f32::clamp((rx - ox) / (sx + 1e-9f32), -100.0f32, 100.0f32);
    let ey = f32::clamp((ry - oy) / (sy + 1e-9f32), -100.0f32, 100.0f32);
    let per = f32::ln(sx)
        + f32::ln(sx * 2.0f32)
        + f32::abs(ex)
        + (f32::ln(sy) + f32::ln(sy * 2.0f32) + f32::abs(ey));
    let mut counted = 0.0f32;
    if seen && used {
        counted = 1.0f32;
    }
    let at = ABSOLUTE_POS * COLUMNS;
    out[at] = ex;
    out[at + 1] = ey;
    out[at + 2] = per;
    out[at + 3] = counted;
}

/// One coordinate's gradients `(d raw keypoint, d raw sigma)` for the row's `ε` and log-term
/// gradients `g_e`, `g_per`.
#[cube]
// CubeCL's frontend expands comparisons, not `RangeInclusive::contains`.
#[allow(clippy::manual_range_contains)]
fn coordinate_grads(r: f32, o: f32, raw: f32, g_e: f32, g_per: f32, d: &mut Array<f32>) {
    let sig = sigmoid(raw);
    let s = f32::max(sig, f32::new(f32::MIN_POSITIVE));
    let den = s + 1e-9f32;
    let q = (r - o) / den;
    let e = f32::clamp(q, -100.0f32, 100.0f32);
    let mut dq = 0.0f32;
    if q >= -100.0f32 && q <= 100.0f32 {
        dq = g_e + g_per * sign_of(e);
    }
    let ds = g_per / s + g_per / (s * 2.0f32) * 2.0f32 - dq * (r - o) / (den * den);
    let mut draw = 0.0f32;
    if sig >= f32::new(f32::MIN_POSITIVE) {
        draw = ds * (sig * (-sig + 1.0f32));
    }
    d[0] = dq / den;
    d[1] = draw;
}

/// Unit `(b, a)`: the anchor's keypoint gradients into `d_kpts` (contiguous `[B, K·kd, A]`,
/// visibility channels zero) and sigma gradients into `d_sigma` (contiguous `[B, 2K, A]`) from
/// its row's gradients in `grad` (`[B·K, R, 4]`, any strides).
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
fn backward_kernel(
    kpts: &Tensor<f32>,
    sigma: &Tensor<f32>,
    objects: &Tensor<f32>,
    slot: &Tensor<f32>,
    place: &Tensor<f32>,
    ax: &Tensor<f32>,
    ay: &Tensor<f32>,
    st: &Tensor<f32>,
    grad: &Tensor<f32>,
    d_kpts: &mut Tensor<f32>,
    d_sigma: &mut Tensor<f32>,
    #[comptime] keypoints: usize,
    #[comptime] kd: usize,
) {
    let anchors = kpts.shape(2);
    let total = kpts.shape(0) * anchors;
    if ABSOLUTE_POS >= total {
        terminate!();
    }
    let a = ABSOLUTE_POS % anchors;
    let b = ABSOLUTE_POS / anchors;
    let rows = grad.shape(1);
    let dk = b * keypoints * kd * anchors + a;
    let ds = b * keypoints * 2 * anchors + a;
    let row = place[b * place.stride(0) + a * place.stride(1)];
    if row >= 0.0f32 && row < f32::cast_from(rows) {
        let j = usize::cast_from(row);
        let n = usize::cast_from(slot[b * slot.stride(0) + a * slot.stride(1)]);
        let o = b * objects.stride(0) + n * objects.stride(1);
        let s = st[a * st.stride(2)];
        let cx = ax[a * ax.stride(2)];
        let cy = ay[a * ay.stride(2)];
        let ko = b * kpts.stride(0) + a * kpts.stride(2);
        let so = b * sigma.stride(0) + a * sigma.stride(2);
        let mut d = Array::<f32>::new(2usize);
        #[unroll]
        for k in 0..keypoints {
            let gi = (b * keypoints + k) * grad.stride(0) + j * grad.stride(1);
            let gs = grad.stride(2);
            let g_per = grad[gi + 2 * gs];
            coordinate_grads(
                kpts[ko + k * kd * kpts.stride(1)],
                offset(objects, o, k, 0, cx, s),
                sigma[so + 2 * k * sigma.stride(1)],
                grad[gi],
                g_per,
                &mut d,
            );
            d_kpts[dk + k * kd * anchors] = d[0];
            d_sigma[ds + 2 * k * anchors] = d[1];
            coordinate_grads(
                kpts[ko + (k * kd + 1) * kpts.stride(1)],
                offset(objects, o, k, 1, cy, s),
                sigma[so + (2 * k + 1) * sigma.stride(1)],
                grad[gi + gs],
                g_per,
                &mut d,
            );
            d_kpts[dk + (k * kd + 1) * anchors] = d[0];
            d_sigma[ds + (2 * k + 1) * anchors] = d[1];
            if comptime!(kd == 3) {
                d_kpts[dk + (k * kd + 2) * anchors] = 0.0f32;
            }
        }
    } else {
        #[unroll]
        for c in 0..comptime!(keypoints * kd) {
            d_kpts[dk + c * anchors] = 0.0f32;
        }
        #[unroll]
        for c in 0..comptime!(keypoints * 2) {
            d_sigma[ds + c * anchors] = 0.0f32;
        }
    }
}

/// `(B, A, K, kd, R)` after checking the shapes: `kpts` `[B, K·kd, A]`, `sigma` `[B, 2K, A]`,
/// `picked` `[B, R]`; every tensor FP32.
fn check(kpts: &CubeTensor, sigma: &CubeTensor, fixed: &Fixed) -> [usize; 5] {
    for t in [
        kpts,
        sigma,
        &fixed.objects,
        &fixed.slot,
        &fixed.place,
        &fixed.picked,
        &fixed.count,
        &fixed.ax,
        &fixed.ay,
        &fixed.st,
    ] {
        assert!(
            t.dtype == DType::F32,
            "RLE rows: f32 only, got {:?}",
            t.dtype
        );
    }
    let (ks, ss, ps) = (
        kpts.meta.shape(),
        sigma.meta.shape(),
        fixed.picked.meta.shape(),
    );
    assert!(
        ks.num_dims() == 3 && ss.num_dims() == 3 && ss[0] == ks[0] && ss[2] == ks[2],
        "RLE rows: keypoints [B, K·kd, A] and sigmas [B, 2K, A], got {ks:?} and {ss:?}"
    );
    let k = ss[1] / 2;
    let kd = ks[1].checked_div(k).unwrap_or(0);
    assert!(
        k > 0 && ss[1] == 2 * k && (kd == 2 || kd == 3) && ks[1] == k * kd,
        "RLE rows: {} keypoint channels for {} sigma channels",
        ks[1],
        ss[1]
    );
    assert!(
        ps.num_dims() == 2 && ps[0] == ks[0] && ps[1] > 0,
        "RLE rows: picked anchors [B, R], got {ps:?}"
    );
    let os = fixed.objects.meta.shape();
    assert!(
        os.num_dims() == 3 && os[0] == ks[0] && os[2] == PACKED + 3 * k,
        "RLE rows: object slots [B, N, 6 + 3K], got {os:?}"
    );
    [ks[0], ks[2], k, kd, ps[1]]
}

/// The forward: `[B·K, R, 4]` (FP32, contiguous).
pub fn forward(kpts: CubeTensor, sigma: CubeTensor, fixed: Fixed) -> CubeTensor {
    let [b, _, k, kd, r] = check(&kpts, &sigma, &fixed);
    let client = kpts.client.clone();
    let out = empty_f32(&kpts, [b * k, r, COLUMNS]);
    let total = b * k * r;
    if total == 0 {
        return out;
    }
    let (count, dim) = elementwise(&kpts, total);
    // SAFETY: units are bounded by B·K·R; every read follows its tensor's strides within the
    // shapes `check` asserted (picked anchors are below A, slots below N).
    unsafe {
        forward_kernel::launch_unchecked(
            &client,
            count,
            dim,
            kpts.into_tensor_arg(),
            sigma.into_tensor_arg(),
            fixed.objects.into_tensor_arg(),
            fixed.slot.into_tensor_arg(),
            fixed.picked.into_tensor_arg(),
            fixed.count.into_tensor_arg(),
            fixed.ax.into_tensor_arg(),
            fixed.ay.into_tensor_arg(),
            fixed.st.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            k,
            kd,
        );
    }
    out
}

/// The backward for the rows' gradients `grad` (`[B·K, R, 4]`, FP32, any strides):
/// `(d_kpts [B, K·kd, A], d_sigma [B, 2K, A])`, contiguous.
pub fn backward(
    kpts: CubeTensor,
    sigma: CubeTensor,
    fixed: Fixed,
    grad: CubeTensor,
) -> (CubeTensor, CubeTensor) {
    let [b, a, k, kd, r] = check(&kpts, &sigma, &fixed);
    assert!(
        grad.dtype == DType::F32 && grad.meta.shape().dims::<3>() == [b * k, r, COLUMNS],
        "RLE rows: gradient [B·K, R, 4] in f32, got {:?}",
        grad.meta.shape()
    );
    let client = kpts.client.clone();
    let (d_kpts, d_sigma) = (
        empty_f32(&kpts, [b, k * kd, a]),
        empty_f32(&kpts, [b, 2 * k, a]),
    );
    let total = b * a;
    if total == 0 {
        return (d_kpts, d_sigma);
    }
    let (count, dim) = elementwise(&kpts, total);
    // SAFETY: units are bounded by B·A; each writes its anchor's K·kd and 2K values of the
    // contiguous outputs; reads follow strides within the checked shapes (a row below R).
    unsafe {
        backward_kernel::launch_unchecked(
            &client,
            count,
            dim,
            kpts.into_tensor_arg(),
            sigma.into_tensor_arg(),
            fixed.objects.into_tensor_arg(),
            fixed.slot.into_tensor_arg(),
            fixed.place.into_tensor_arg(),
            fixed.ax.into_tensor_arg(),
            fixed.ay.into_tensor_arg(),
            fixed.st.into_tensor_arg(),
            grad.into_tensor_arg(),
            d_kpts.clone().into_tensor_arg(),
            d_sigma.clone().into_tensor_arg(),
            k,
            kd,
        );
    }
    (d_kpts, d_sigma)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ops::compile_check::{compiles, device, tensor};
    use cubecl::CubeCount;

    /// Both kernels compile for CUDA on a machine without a GPU, at 17 keypoints of 3 values
    /// and 4 of 2.
    #[test]
    fn rle_rows_kernels_compile_for_cuda_without_a_device() {
        let (props, target) = device();
        let (b, n, a, r) = (2, 3, 300, 30);
        for (k, kd) in [(17, 3), (4, 2)] {
            let kernel = forward_kernel::create_dummy_kernel(
                props.clone(),
                target.clone(),
                CubeCount::Static(3, 1, 1),
                CubeDim::new_1d(256),
                tensor(&[b, k * kd, a]),
                tensor(&[b, 2 * k, a]),
                tensor(&[b, n, PACKED + 3 * k]),
                tensor(&[b, a]),
                tensor(&[b, r]),
                tensor(&[b]),
                tensor(&[1, 1, a]),
                tensor(&[1, 1, a]),
                tensor(&[1, 1, a]),
                tensor(&[b * k, r, COLUMNS]),
                k,
                kd,
            );
            compiles(kernel.define());
            let kernel = backward_kernel::create_dummy_kernel(
                props.clone(),
                target.clone(),
                CubeCount::Static(3, 1, 1),
                CubeDim::new_1d(256),
                tensor(&[b, k * kd, a]),
                tensor(&[b, 2 * k, a]),
                tensor(&[b, n, PACKED + 3 * k]),
                tensor(&[b, a]),
                tensor(&[b, a]),
                tensor(&[1, 1, a]),
                tensor(&[1, 1, a]),
                tensor(&[1, 1, a]),
                tensor(&[b * k, r, COLUMNS]),
                tensor(&[b, k * kd, a]),
                tensor(&[b, 2 * k, a]),
                k,
                kd,
            );
            compiles(kernel.define());
        }
    }
}
