//! The device assignment's OKS (`loss::assign::device::oks`) as one launch: every predicted pose
//! (`[B, K, A]` coordinates) against every object's keypoints (`[B, N, K, 3]`), one unit per
//! `(b, n, a)` looping over the keypoints in order. The tensor operations take ~14 launches per
//! keypoint (~240 per branch for 17 keypoints) and a `[B, N, A]` intermediate for each; the
//! formula is theirs, operation by operation: `d = dx² + dy²`, `exp(−d / ((area + 1e-7) · c_k))`
//! summed over the labelled keypoints, divided by their count + 1e-7, with `c_k = 8·σ_k²` as the
//! host computes it. NVRTC may fuse `dx² + dy²` into one multiply-add, so the last bit can differ
//! from the tensor operations'; the kernel gives the same bits every run.

// `#[cube]` expands to `cubecl::…` paths.
use burn::cubecl;
use burn::tensor::DType;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;
use cubecl::{CubeDim, calculate_cube_count_elemwise};

/// Unit `(b, n, a)` (row-major): `out[b, n, a]` (contiguous); every input by its strides.
#[cube(launch_unchecked)]
fn oks_kernel(
    px: &Tensor<f32>,
    py: &Tensor<f32>,
    gt: &Tensor<f32>,
    area: &Tensor<f32>,
    c: &Tensor<f32>,
    out: &mut Tensor<f32>,
) {
    let objects = gt.shape(1);
    let keypoints = gt.shape(2);
    let anchors = px.shape(2);
    if ABSOLUTE_POS >= px.shape(0) * objects * anchors {
        terminate!();
    }
    let a = ABSOLUTE_POS % anchors;
    let n = (ABSOLUTE_POS / anchors) % objects;
    let b = ABSOLUTE_POS / (anchors * objects);
    let scale = area[b * area.stride(0) + n * area.stride(1)] + 1e-7f32;
    let mut sum = 0.0f32;
    let mut visible = 0.0f32;
    for k in 0..keypoints {
        let g = b * gt.stride(0) + n * gt.stride(1) + k * gt.stride(2);
        let gx = gt[g];
        let gy = gt[g + gt.stride(3)];
        let seen = gt[g + 2 * gt.stride(3)];
        let dx = px[b * px.stride(0) + k * px.stride(1) + a * px.stride(2)] - gx;
        let dy = py[b * py.stride(0) + k * py.stride(1) + a * py.stride(2)] - gy;
        let d = dx * dx + dy * dy;
        let term = f32::exp(-d / (scale * c[k * c.stride(0)]));
        if seen != 0.0f32 {
            sum += term;
            visible += 1.0f32;
        }
    }
    out[ABSOLUTE_POS] = sum / (visible + 1e-7f32);
}

/// OKS `[B, N, A]` (FP32, contiguous) of poses `px`, `py` (`[B, K, A]`) against keypoints `gt`
/// (`[B, N, K, 3]`: x, y, visibility) with object areas `area` (`[B, N, 1]`) and per-keypoint
/// constants `c` (`[K]`, `8·σ²`); all FP32, any strides.
pub fn oks(
    px: CubeTensor,
    py: CubeTensor,
    gt: CubeTensor,
    area: CubeTensor,
    c: CubeTensor,
) -> CubeTensor {
    for t in [&px, &py, &gt, &area, &c] {
        assert!(t.dtype == DType::F32, "oks: f32 only, got {:?}", t.dtype);
    }
    let (ps, gs) = (px.meta.shape().clone(), gt.meta.shape().clone());
    assert!(
        ps.num_dims() == 3 && gs.num_dims() == 4 && gs[3] == 3,
        "oks: poses [B, K, A] and keypoints [B, N, K, 3], got {ps:?} and {gs:?}"
    );
    assert!(
        py.meta.shape() == &ps && gs[0] == ps[0] && gs[2] == ps[1] && c.meta.shape()[0] == ps[1],
        "oks: shapes disagree"
    );
    let shape = burn::backend::Shape::new([ps[0], gs[1], ps[2]]);
    let total = shape.num_elements();
    let out =
        empty_device_contiguous_dtype(px.client.clone(), px.device.clone(), shape, DType::F32);
    if total == 0 {
        return out;
    }
    let client = px.client.clone();
    let dim = CubeDim::new(&client, total);
    let count = calculate_cube_count_elemwise(&client, total, dim);
    // SAFETY: units are bounded by the output's length; every read is bounded by its tensor's
    // shape (checked above) and follows its strides.
    unsafe {
        oks_kernel::launch_unchecked(
            &client,
            count,
            dim,
            px.into_tensor_arg(),
            py.into_tensor_arg(),
            gt.into_tensor_arg(),
            area.into_tensor_arg(),
            c.into_tensor_arg(),
            out.clone().into_tensor_arg(),
        );
    }
    out
}
