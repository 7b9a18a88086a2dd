//! The RealNVP flow's coupling net (`Linear(2, h) → SiLU → Linear(h, h) → SiLU → Linear(h, 2)`
//! on every point of `[G, M, 2]`) as one forward kernel and one backward kernel plus the sum of
//! its cubes' weight-gradient partials, instead of ~20 tensor operations a net each way (matmuls
//! of 2 and 64 columns, bias broadcasts, SiLUs, reductions; docs/kernels.md, "The flow's
//! coupling nets as one operation").
//!
//! A cube takes [`POINTS`] consecutive points with [`LANES`] units each, every weight and bias
//! in shared memory. A unit keeps its point's first hidden layer in registers (`Array`, its
//! loops unrolled) and computes every `LANES`-th output of the second layer: a point's work is
//! spread over `LANES` units, so that the flow's ~9k points keep ~1,100 warps busy rather than
//! ~280 (one unit per point left the GPU waiting on each warp's chains of multiply-adds). The
//! backward recomputes the hidden layers, puts each point's activations and gradients in
//! shared memory, and each cube sums its points' products for every weight and bias in a
//! fixed order into its row of `partial`; `coupling_sums_kernel` adds the rows in a fixed
//! order. No atomics: the same bits every run. With [`choose_tiled`] the layer products go by
//! tiles of [`TILE`] points × [`TILE`] features (the weight gradients by [`TILE`] × [`TILE`]
//! weights) through shared memory, each sum in the same order: the same bits with fewer
//! shared-memory reads.

// `#[cube]` expands to `cubecl::…` paths.
use super::silu_kernels::{sigmoid, silu_slope};
use crate::model::ops::empty_f32;
use burn::cubecl;
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;
use cubecl::{CubeCount, CubeDim};
use std::sync::atomic::{AtomicBool, Ordering};

#[path = "coupling_backward.rs"]
mod backward_kernels;
use backward_kernels::{coupling_backward_kernel, coupling_sums_kernel};
#[path = "coupling_layer.rs"]
pub mod layer_kernels;

/// Points of a cube.
const POINTS: usize = 32;
/// Units of a point: each computes every `LANES`-th output of the second layer (and, in the
/// backward, every `LANES`-th gradient of the first).
const LANES: usize = 4;
/// Side of the tiles the backward computes its layer products by (`TILE` points × `TILE`
/// features, or `TILE` × `TILE` weights): each value read from shared memory serves `TILE`
/// products, where one unit per output read two values a product (the backward was bound by
/// shared-memory reads). The sums keep their order, so the bits are the same.
const TILE: usize = 4;
static TILED: AtomicBool = AtomicBool::new(true);

/// Whether the coupling kernels compute their layer products by tiles ([`TILE`]; `true`, the
/// default) or one unit per value (`false`; `bench-step --tiled-couplings false`). The same sums
/// in the same order either way: the same bits (docs/perf_log.md BO3).
pub fn choose_tiled(on: bool) {
    TILED.store(on, Ordering::Relaxed);
}

/// [`choose_tiled`]'s choice.
fn tiled() -> bool {
    TILED.load(Ordering::Relaxed)
}

/// Row length of the per-point columns in shared memory: one more than [`POINTS`], so that the
/// units of a warp reading one point of 32 different rows hit 32 different banks.
const ROW: usize = POINTS + 1;
/// Reads each unit has in flight while it loads the weights.
const LOADS: usize = 8;
/// Row groups of the partials each column's sum is split into (units of a cube of
/// `coupling_sums_kernel`: 32 columns × `GROUPS`).
const GROUPS: usize = 8;
/// The most shared memory a kernel may declare statically (CUDA's 48 KiB).
const SHARED_LIMIT: usize = 48 * 1024;

/// Offsets of the weights and biases laid end to end, `w2`'s `h` rows `w2_row` apart: `w1`
/// `[2, h]`, `b1` `[h]`, `w2` `[h, h]`, `b2` `[h]`, `w3` `[h, 2]`, `b3` `[2]`, then the total.
const fn offsets(h: usize, w2_row: usize) -> [usize; 7] {
    let w1 = 0;
    let b1 = w1 + 2 * h;
    let w2 = b1 + h;
    let b2 = w2 + h * w2_row;
    let w3 = b2 + h;
    let b3 = w3 + 2 * h;
    [w1, b1, w2, b2, w3, b3, b3 + 2]
}

/// [`offsets`] of the gradients in a row of the partials (dense).
const fn layout(h: usize) -> [usize; 7] {
    offsets(h, h)
}

/// [`offsets`] of the weights in shared memory: `w2`'s rows `h + 1` apart, so that the units
/// of a warp reading one column of consecutive rows hit different banks.
const fn shared_layout(h: usize) -> [usize; 7] {
    offsets(h, h + 1)
}

/// Shared memory of the backward kernel (the larger), in bytes.
const fn backward_shared_bytes(h: usize) -> usize {
    (shared_layout(h)[6] + backward_kernels::work_len(h)) * 4
}

/// `rows × cols` matrix `t` (by its strides) into `s[at..]`, rows `row` apart, the cube's units
/// in turn, each with [`LOADS`] reads in flight before it writes them.
#[cube]
fn load_matrix(
    t: &Tensor<f32>,
    s: &mut Shared<[f32]>,
    at: usize,
    #[comptime] cols: usize,
    #[comptime] row: usize,
) {
    let n = t.shape(0) * cols;
    let step = CUBE_DIM as usize;
    let mut v = Array::<f32>::new(LOADS);
    let mut first = UNIT_POS as usize;
    while first < n {
        #[unroll]
        for k in 0..LOADS {
            let e = first + k * step;
            if e < n {
                v[k] = t[(e / cols) * t.stride(0) + (e % cols) * t.stride(1)];
            }
        }
        #[unroll]
        for k in 0..LOADS {
            let e = first + k * step;
            if e < n {
                s[at + (e / cols) * row + e % cols] = v[k];
            }
        }
        first += LOADS * step;
    }
}

/// Vector `t` (by its stride) into `s[at..]`.
#[cube]
fn load_vector(t: &Tensor<f32>, s: &mut Shared<[f32]>, at: usize) {
    let mut e = UNIT_POS as usize;
    while e < t.shape(0) {
        s[at + e] = t[e * t.stride(0)];
        e += CUBE_DIM as usize;
    }
}

/// Every weight and bias into `s` ([`shared_layout`]).
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_weights(
    w1: &Tensor<f32>,
    b1: &Tensor<f32>,
    w2: &Tensor<f32>,
    b2: &Tensor<f32>,
    w3: &Tensor<f32>,
    b3: &Tensor<f32>,
    s: &mut Shared<[f32]>,
    #[comptime] h: usize,
) {
    let ow1 = comptime!(shared_layout(h)[0]);
    let ob1 = comptime!(shared_layout(h)[1]);
    let ow2 = comptime!(shared_layout(h)[2]);
    let ob2 = comptime!(shared_layout(h)[3]);
    let ow3 = comptime!(shared_layout(h)[4]);
    let ob3 = comptime!(shared_layout(h)[5]);
    load_matrix(w1, s, ow1, h, h);
    load_vector(b1, s, ob1);
    load_matrix(w2, s, ow2, h, comptime!(h + 1));
    load_vector(b2, s, ob2);
    load_matrix(w3, s, ow3, 2usize, 2usize);
    load_vector(b3, s, ob3);
}

/// Coordinate `k` of point `p` of `[G, M, 2]` `t`, by its strides.
#[cube]
fn point(t: &Tensor<f32>, p: usize, k: usize) -> f32 {
    let m = t.shape(1);
    t[(p / m) * t.stride(0) + (p % m) * t.stride(1) + k * t.stride(2)]
}

/// The first layer's pre-activation `i` of point `(x0, x1)` (one expression, so the backward
/// recomputes the forward's bits).
#[cube]
fn first(s: &Shared<[f32]>, x0: f32, x1: f32, i: usize, #[comptime] h: usize) -> f32 {
    let ow1 = comptime!(shared_layout(h)[0]);
    let ob1 = comptime!(shared_layout(h)[1]);
    x0 * s[ow1 + i] + x1 * s[ow1 + h + i] + s[ob1 + i]
}

/// The second layer's pre-activation `j` from the first hidden layer `h1`, in input order.
#[cube]
fn second(s: &Shared<[f32]>, h1: &Array<f32>, j: usize, #[comptime] h: usize) -> f32 {
    let ow2 = comptime!(shared_layout(h)[2]);
    let ob2 = comptime!(shared_layout(h)[3]);
    let mut a = s[ob2 + j];
    #[unroll]
    for i in 0..h {
        a += h1[i] * s[ow2 + i * (h + 1) + j];
    }
    a
}

/// Units `(lane, point)`: the net's output, into contiguous `out` (`[G, M, 2]`). Each unit sums
/// its outputs' share of the last layer; the point's first unit adds the shares in lane order.
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
fn coupling_forward_kernel(
    x: &Tensor<f32>,
    w1: &Tensor<f32>,
    b1: &Tensor<f32>,
    w2: &Tensor<f32>,
    b2: &Tensor<f32>,
    w3: &Tensor<f32>,
    b3: &Tensor<f32>,
    out: &mut Tensor<f32>,
    #[comptime] h: usize,
) {
    let ow3 = comptime!(shared_layout(h)[4]);
    let ob3 = comptime!(shared_layout(h)[5]);
    let mut s = Shared::<[f32]>::new_slice(comptime!(shared_layout(h)[6]));
    let mut ys = Shared::<[f32]>::new_slice(comptime!(2 * LANES * POINTS));
    load_weights(w1, b1, w2, b2, w3, b3, &mut s, h);
    let lane = UNIT_POS_X as usize;
    let pt = UNIT_POS_Y as usize;
    let p = CUBE_POS * POINTS + pt;
    let valid = p < x.shape(0) * x.shape(1);
    let mut x0 = 0.0f32;
    let mut x1 = 0.0f32;
    if valid {
        x0 = point(x, p, 0);
        x1 = point(x, p, 1);
    }
    sync_cube();
    let mut h1 = Array::<f32>::new(h);
    #[unroll]
    for i in 0..h {
        let a = first(&s, x0, x1, i, h);
        h1[i] = a * sigmoid(a);
    }
    let mut y0 = 0.0f32;
    let mut y1 = 0.0f32;
    for jj in 0..comptime!(h / LANES) {
        let j = jj * LANES + lane;
        let a = second(&s, &h1, j, h);
        let v = a * sigmoid(a);
        y0 += v * s[ow3 + 2 * j];
        y1 += v * s[ow3 + 2 * j + 1];
    }
    let at = (pt * LANES + lane) * 2;
    ys[at] = y0;
    ys[at + 1] = y1;
    sync_cube();
    if lane == 0 && valid {
        let mut o0 = s[ob3];
        let mut o1 = s[ob3 + 1];
        #[unroll]
        for l in 0..LANES {
            o0 += ys[at + 2 * l];
            o1 += ys[at + 2 * l + 1];
        }
        out[2 * p] = o0;
        out[2 * p + 1] = o1;
    }
}

/// The hidden width of a net whose FP32 tensors have the shapes these kernels take (`x`
/// `[G, M, 2]` with points, the parameters as [`net_width`] checks) and whose backward fits in
/// shared memory; `None` otherwise (the caller runs the tensor operations).
pub fn supported(x: &CubeTensor, params: &[CubeTensor; 6]) -> Option<usize> {
    let x_dims = x.meta.shape().to_vec();
    let x_fits = x_dims.len() == 3 && x_dims[2] == 2 && x_dims[0] * x_dims[1] > 0;
    let h = net_width(params)?;
    let fits = backward_shared_bytes(h) <= SHARED_LIMIT;
    (x_fits && x.dtype == DType::F32 && fits).then_some(h)
}

/// The hidden width `h` of a net's FP32 parameters `w1` `[2, h]`, `b1` `[h]`, `w2` `[h, h]`,
/// `b2` `[h]`, `w3` `[h, 2]`, `b3` `[2]`, when `h` is a multiple of [`LANES`] and [`TILE`].
fn net_width(params: &[CubeTensor; 6]) -> Option<usize> {
    let h = params[1].meta.shape().to_vec();
    let [h] = h[..] else { return None };
    let expected: [&[usize]; 6] = [&[2, h], &[h], &[h, h], &[h], &[h, 2], &[2]];
    let shapes_fit = params
        .iter()
        .zip(expected)
        .all(|(p, e)| p.meta.shape().to_vec() == e);
    let all_f32 = params.iter().all(|p| p.dtype == DType::F32);
    (shapes_fit && all_f32 && h.is_multiple_of(LANES) && h.is_multiple_of(TILE)).then_some(h)
}

/// The cubes of the points of `[G, M, c]` `t`: their count, [`POINTS`] points × [`LANES`]
/// units each.
fn cubes(t: &CubeTensor) -> (usize, CubeDim) {
    let dims = t.meta.shape();
    let n = dims[0] * dims[1];
    (
        n.div_ceil(POINTS),
        CubeDim::new_2d(LANES as u32, POINTS as u32),
    )
}

/// Each net's gradients (`[dw1, db1, dw2, db2, dw3, db3]`, contiguous, shaped as the
/// parameters) for `params`, summed from the cubes' rows of `partial` ([`layout`]) by
/// `coupling_sums_kernel`.
fn sums(partial: CubeTensor, params: &[CubeTensor; 6], h: usize) -> [CubeTensor; 6] {
    let grads = params.clone().map(|p| empty_f32(&p, p.meta.shape()));
    let [dw1, db1, dw2, db2, dw3, db3] = grads.clone();
    let client = partial.client.clone();
    // SAFETY: the units of value `e < total` read column `e` of `partial`; one writes value
    // `e` of the layout, into the one gradient whose range holds it; each gradient is
    // contiguous of its range's length.
    unsafe {
        coupling_sums_kernel::launch_unchecked(
            &client,
            CubeCount::Static(layout(h)[6].div_ceil(32) as u32, 1, 1),
            CubeDim::new_2d(32, GROUPS as u32),
            partial.into_tensor_arg(),
            dw1.into_tensor_arg(),
            db1.into_tensor_arg(),
            dw2.into_tensor_arg(),
            db2.into_tensor_arg(),
            dw3.into_tensor_arg(),
            db3.into_tensor_arg(),
            h,
        );
    }
    grads
}

/// The net's output for points `x` (`[G, M, 2]`), hidden width `h` from [`supported`].
pub fn forward(x: CubeTensor, [w1, b1, w2, b2, w3, b3]: [CubeTensor; 6], h: usize) -> CubeTensor {
    let out = empty_f32(&x, x.meta.shape());
    let client = x.client.clone();
    let (count, dim) = cubes(&x);
    // SAFETY: `supported` checked every shape and dtype; units past the last point write
    // nothing; `out` is contiguous `[G, M, 2]`.
    unsafe {
        coupling_forward_kernel::launch_unchecked(
            &client,
            CubeCount::Static(count as u32, 1, 1),
            dim,
            x.into_tensor_arg(),
            w1.into_tensor_arg(),
            b1.into_tensor_arg(),
            w2.into_tensor_arg(),
            b2.into_tensor_arg(),
            w3.into_tensor_arg(),
            b3.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            h,
        );
    }
    out
}

/// The gradients of [`forward`] for the incoming `grad` (`[G, M, 2]`, any strides):
/// `(dx, [dw1, db1, dw2, db2, dw3, db3])`, each contiguous and shaped as its input.
pub fn backward(
    x: CubeTensor,
    params: [CubeTensor; 6],
    grad: CubeTensor,
    h: usize,
) -> (CubeTensor, [CubeTensor; 6]) {
    assert!(
        grad.dtype == DType::F32 && grad.meta.shape() == x.meta.shape(),
        "coupling backward: the gradient must be FP32 shaped as the points"
    );
    let (count, dim) = cubes(&x);
    let dx = empty_f32(&x, x.meta.shape());
    let partial = empty_f32(&x, [count, layout(h)[6]]);
    let client = x.client.clone();
    let [w1, b1, w2, b2, w3, b3] = params.clone();
    // SAFETY: `supported` checked every shape and dtype (the caller), the gradient's shape is
    // checked above; cube `c` writes row `c` of `partial` (`count` rows of the layout's
    // length), units past the last point write no `dx`.
    unsafe {
        coupling_backward_kernel::launch_unchecked(
            &client,
            CubeCount::Static(count as u32, 1, 1),
            dim,
            x.into_tensor_arg(),
            w1.into_tensor_arg(),
            b1.into_tensor_arg(),
            w2.into_tensor_arg(),
            b2.into_tensor_arg(),
            w3.into_tensor_arg(),
            b3.into_tensor_arg(),
            grad.into_tensor_arg(),
            dx.clone().into_tensor_arg(),
            partial.clone().into_tensor_arg(),
            h,
            tiled(),
        );
    }
    let grads = sums(partial, &params, h);
    (dx, grads)
}

#[cfg(test)]
mod tests {
    use super::super::compile_check::{compiles, device, tensor};
    use super::*;

    /// The three kernels compile for CUDA on a machine without a GPU, at the flow's width and
    /// a narrow one; the seed's width fits the static shared memory.
    #[test]
    fn coupling_kernels_compile_for_cuda_without_a_device() {
        assert!(backward_shared_bytes(64) <= SHARED_LIMIT);
        let (props, target) = device();
        for h in [64, 8] {
            let x = || tensor(&[3, 11, 2]);
            let p = || {
                [
                    tensor(&[2, h]),
                    tensor(&[h]),
                    tensor(&[h, h]),
                    tensor(&[h]),
                    tensor(&[h, 2]),
                    tensor(&[2]),
                ]
            };
            let cubes = || {
                (
                    CubeCount::Static(2, 1, 1),
                    CubeDim::new_2d(LANES as u32, POINTS as u32),
                )
            };
            let [w1, b1, w2, b2, w3, b3] = p();
            let (count, dim) = cubes();
            let k = coupling_forward_kernel::create_dummy_kernel(
                props.clone(),
                target.clone(),
                count,
                dim,
                x(),
                w1,
                b1,
                w2,
                b2,
                w3,
                b3,
                x(),
                h,
            );
            compiles(k.define());
            for tiled in [false, true] {
                let [w1, b1, w2, b2, w3, b3] = p();
                let (count, dim) = cubes();
                let k = coupling_backward_kernel::create_dummy_kernel(
                    props.clone(),
                    target.clone(),
                    count,
                    dim,
                    x(),
                    w1,
                    b1,
                    w2,
                    b2,
                    w3,
                    b3,
                    x(),
                    x(),
                    tensor(&[2, layout(h)[6]]),
                    h,
                    tiled,
                );
                compiles(k.define());
            }
            let [w1, b1, w2, b2, w3, b3] = p();
            let (count, dim) = cubes();
            let k = coupling_sums_kernel::create_dummy_kernel(
                props.clone(),
                target.clone(),
                count,
                dim,
                tensor(&[2, layout(h)[6]]),
                w1,
                b1,
                w2,
                b2,
                w3,
                b3,
                h,
            );
            compiles(k.define());
        }
    }
}
