//! The RealNVP flow's coupling net (`Linear(2, h) → SiLU → Linear(h, h) → SiLU → Linear(h, 2)`
//! on every point of `[G, M, 2]`) as one forward kernel and one backward kernel plus the sum of
//! its cubes' weight-gradient partials, instead of ~20 tensor operations a net each way (matmuls
//! of 2 and 64 columns, bias broadcasts, SiLUs, reductions; docs/kernels.md, "The flow's
//! coupling nets as one operation").
//!
//! A cube of [`POINTS`] units (one warp) takes `POINTS` consecutive points, one a unit, with
//! every weight and bias in shared memory (a broadcast read: all units read the same weight at
//! once). A unit keeps its first hidden layer in registers (`Array`, its loops unrolled) and
//! walks the second layer one output at a time. The backward recomputes the hidden layers, puts
//! each point's activations and gradients in shared memory, and each cube sums its points'
//! products for every weight and bias in a fixed order into its row of `partial`;
//! `coupling_sums_kernel` adds the rows in cube order. No atomics: the same bits every run.

// `#[cube]` expands to `cubecl::…` paths.
use burn::cubecl;
use burn::tensor::{DType, Shape};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;
use cubecl::{CubeCount, CubeDim, calculate_cube_count_elemwise};

/// Points (units) of a cube.
const POINTS: usize = 32;
/// Row length of the per-point columns in shared memory: one more than [`POINTS`], so that the
/// units of a warp reading one point of 32 different rows hit 32 different banks.
const ROW: usize = POINTS + 1;
/// The most shared memory a kernel may declare statically (CUDA's 48 KiB).
const SHARED_LIMIT: usize = 48 * 1024;

/// Offsets of the weights and biases in the shared weight buffer, and in a row of the
/// gradient partials (the same layout): `w1` `[2, h]`, `b1` `[h]`, `w2` `[h, h]`, `b2` `[h]`,
/// `w3` `[h, 2]`, `b3` `[2]`, then the total.
const fn layout(h: usize) -> [usize; 7] {
    let w1 = 0;
    let b1 = w1 + 2 * h;
    let w2 = b1 + h;
    let b2 = w2 + h * h;
    let w3 = b2 + h;
    let b3 = w3 + 2 * h;
    [w1, b1, w2, b2, w3, b3, b3 + 2]
}

/// Shared memory of the backward kernel (the larger), in bytes.
const fn backward_shared_bytes(h: usize) -> usize {
    (layout(h)[6] + 3 * h * ROW + 4 * POINTS) * 4
}

#[cube]
fn sigmoid(x: f32) -> f32 {
    1.0f32 / (1.0f32 + f32::exp(-x))
}

/// `rows × cols` matrix `t` (by its strides) into `s[at..]` row-major, the cube's units in turn.
#[cube]
fn load_matrix(t: &Tensor<f32>, s: &mut Shared<[f32]>, at: usize, #[comptime] cols: usize) {
    let n = t.shape(0) * cols;
    let mut e = UNIT_POS as usize;
    while e < n {
        let r = e / cols;
        let c = e % cols;
        s[at + e] = t[r * t.stride(0) + c * t.stride(1)];
        e += CUBE_DIM as usize;
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

/// Every weight and bias into `s` ([`layout`]).
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
    let ow1 = comptime!(layout(h)[0]);
    let ob1 = comptime!(layout(h)[1]);
    let ow2 = comptime!(layout(h)[2]);
    let ob2 = comptime!(layout(h)[3]);
    let ow3 = comptime!(layout(h)[4]);
    let ob3 = comptime!(layout(h)[5]);
    load_matrix(w1, s, ow1, h);
    load_vector(b1, s, ob1);
    load_matrix(w2, s, ow2, h);
    load_vector(b2, s, ob2);
    load_matrix(w3, s, ow3, 2usize);
    load_vector(b3, s, ob3);
}

/// Coordinate `k` of point `p` of `[G, M, 2]` `t`, by its strides.
#[cube]
fn point(t: &Tensor<f32>, p: usize, k: usize) -> f32 {
    let m = t.shape(1);
    t[(p / m) * t.stride(0) + (p % m) * t.stride(1) + k * t.stride(2)]
}

/// Unit per point: the net's output, into contiguous `out` (`[G, M, 2]`).
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
    let ow1 = comptime!(layout(h)[0]);
    let ob1 = comptime!(layout(h)[1]);
    let ow2 = comptime!(layout(h)[2]);
    let ob2 = comptime!(layout(h)[3]);
    let ow3 = comptime!(layout(h)[4]);
    let ob3 = comptime!(layout(h)[5]);
    let total = comptime!(layout(h)[6]);
    let mut s = Shared::<[f32]>::new_slice(total);
    load_weights(w1, b1, w2, b2, w3, b3, &mut s, h);
    sync_cube();
    let p = ABSOLUTE_POS;
    if p < x.shape(0) * x.shape(1) {
        let x0 = point(x, p, 0);
        let x1 = point(x, p, 1);
        let mut h1 = Array::<f32>::new(h);
        #[unroll]
        for i in 0..h {
            let a = x0 * s[ow1 + i] + x1 * s[ow1 + h + i] + s[ob1 + i];
            h1[i] = a * sigmoid(a);
        }
        let mut y0 = s[ob3];
        let mut y1 = s[ob3 + 1];
        for j in 0..h {
            let mut a = s[ob2 + j];
            #[unroll]
            for i in 0..h {
                a += h1[i] * s[ow2 + i * h + j];
            }
            let v = a * sigmoid(a);
            y0 += v * s[ow3 + 2 * j];
            y1 += v * s[ow3 + 2 * j + 1];
        }
        out[2 * p] = y0;
        out[2 * p + 1] = y1;
    }
}

/// `Σ_u a[ia·ROW + u] · b[ib·stride + u]` over the cube's points `u`, in order.
#[cube]
fn column_dot(
    a: &Shared<[f32]>,
    ia: usize,
    b: &Shared<[f32]>,
    ib: usize,
    #[comptime] stride: usize,
) -> f32 {
    let mut acc = 0.0f32;
    #[unroll]
    for u in 0..POINTS {
        acc += a[ia * ROW + u] * b[ib * stride + u];
    }
    acc
}

/// `Σ_u a[ia·stride + u]` over the cube's points `u`, in order.
#[cube]
fn column_sum(a: &Shared<[f32]>, ia: usize, #[comptime] stride: usize) -> f32 {
    let mut acc = 0.0f32;
    #[unroll]
    for u in 0..POINTS {
        acc += a[ia * stride + u];
    }
    acc
}

/// Unit per point: the data gradient into contiguous `dx` (`[G, M, 2]`); cube `c` writes its
/// points' sums of every weight's and bias's gradient into `partial[c, ..]` ([`layout`]). A
/// unit past the last point takes a zero point with a zero gradient, which adds nothing.
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
fn coupling_backward_kernel(
    x: &Tensor<f32>,
    w1: &Tensor<f32>,
    b1: &Tensor<f32>,
    w2: &Tensor<f32>,
    b2: &Tensor<f32>,
    w3: &Tensor<f32>,
    b3: &Tensor<f32>,
    grad: &Tensor<f32>,
    dx: &mut Tensor<f32>,
    partial: &mut Tensor<f32>,
    #[comptime] h: usize,
) {
    let ow1 = comptime!(layout(h)[0]);
    let ob1 = comptime!(layout(h)[1]);
    let ow2 = comptime!(layout(h)[2]);
    let ob2 = comptime!(layout(h)[3]);
    let ow3 = comptime!(layout(h)[4]);
    let ob3 = comptime!(layout(h)[5]);
    let total = comptime!(layout(h)[6]);
    let mut s = Shared::<[f32]>::new_slice(total);
    // Per point (column `u` of row `i`): the first hidden layer, the second layer's
    // pre-activation gradient, and the second hidden layer (then the first layer's
    // pre-activation gradient).
    let mut h1s = Shared::<[f32]>::new_slice(comptime!(h * ROW));
    let mut d2s = Shared::<[f32]>::new_slice(comptime!(h * ROW));
    let mut h2s = Shared::<[f32]>::new_slice(comptime!(h * ROW));
    // x0, x1, g0, g1 of each point, `POINTS` apart.
    let mut ps = Shared::<[f32]>::new_slice(comptime!(4 * POINTS));
    load_weights(w1, b1, w2, b2, w3, b3, &mut s, h);
    let t = UNIT_POS as usize;
    let p = ABSOLUTE_POS;
    let valid = p < x.shape(0) * x.shape(1);
    let mut x0 = 0.0f32;
    let mut x1 = 0.0f32;
    let mut g0 = 0.0f32;
    let mut g1 = 0.0f32;
    if valid {
        x0 = point(x, p, 0);
        x1 = point(x, p, 1);
        g0 = point(grad, p, 0);
        g1 = point(grad, p, 1);
    }
    ps[t] = x0;
    ps[POINTS + t] = x1;
    ps[2 * POINTS + t] = g0;
    ps[3 * POINTS + t] = g1;
    sync_cube();

    let mut h1 = Array::<f32>::new(h);
    let mut dh1 = Array::<f32>::new(h);
    #[unroll]
    for i in 0..h {
        let a = x0 * s[ow1 + i] + x1 * s[ow1 + h + i] + s[ob1 + i];
        h1[i] = a * sigmoid(a);
        h1s[i * ROW + t] = h1[i];
        dh1[i] = 0.0f32;
    }
    for j in 0..h {
        // The forward's pre-activation, in the forward's order.
        let mut a = s[ob2 + j];
        #[unroll]
        for i in 0..h {
            a += h1[i] * s[ow2 + i * h + j];
        }
        let sg = sigmoid(a);
        let d =
            (g0 * s[ow3 + 2 * j] + g1 * s[ow3 + 2 * j + 1]) * (sg * (1.0f32 + a * (1.0f32 - sg)));
        h2s[j * ROW + t] = a * sg;
        d2s[j * ROW + t] = d;
        #[unroll]
        for i in 0..h {
            dh1[i] += d * s[ow2 + i * h + j];
        }
    }
    let mut dx0 = 0.0f32;
    let mut dx1 = 0.0f32;
    #[unroll]
    for i in 0..h {
        let a = x0 * s[ow1 + i] + x1 * s[ow1 + h + i] + s[ob1 + i];
        let sg = sigmoid(a);
        let d = dh1[i] * (sg * (1.0f32 + a * (1.0f32 - sg)));
        dh1[i] = d;
        dx0 += d * s[ow1 + i];
        dx1 += d * s[ow1 + h + i];
    }
    if valid {
        dx[2 * p] = dx0;
        dx[2 * p + 1] = dx1;
    }
    sync_cube();

    let row = CUBE_POS * partial.stride(0);
    let mut e = t;
    while e < comptime!(h * h) {
        let v = column_dot(&h1s, e / h, &d2s, e % h, ROW);
        partial[row + ow2 + e] = v;
        e += POINTS;
    }
    e = t;
    while e < h {
        partial[row + ob2 + e] = column_sum(&d2s, e, ROW);
        e += POINTS;
    }
    e = t;
    while e < comptime!(2 * h) {
        let v = column_dot(&h2s, e / 2, &ps, 2 + e % 2, POINTS);
        partial[row + ow3 + e] = v;
        e += POINTS;
    }
    if t < 2 {
        partial[row + ob3 + t] = column_sum(&ps, 2 + t, POINTS);
    }
    sync_cube();
    #[unroll]
    for i in 0..h {
        h2s[i * ROW + t] = dh1[i];
    }
    sync_cube();
    e = t;
    while e < comptime!(2 * h) {
        let v = column_dot(&h2s, e % h, &ps, e / h, POINTS);
        partial[row + ow1 + e] = v;
        e += POINTS;
    }
    e = t;
    while e < h {
        partial[row + ob1 + e] = column_sum(&h2s, e, ROW);
        e += POINTS;
    }
}

/// Unit per gradient value `e` ([`layout`]): `Σ_c partial[c, e]` in cube order, into the
/// gradient it belongs to (each contiguous, shaped as its parameter).
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
fn coupling_sums_kernel(
    partial: &Tensor<f32>,
    dw1: &mut Tensor<f32>,
    db1: &mut Tensor<f32>,
    dw2: &mut Tensor<f32>,
    db2: &mut Tensor<f32>,
    dw3: &mut Tensor<f32>,
    db3: &mut Tensor<f32>,
    #[comptime] h: usize,
) {
    let ob1 = comptime!(layout(h)[1]);
    let ow2 = comptime!(layout(h)[2]);
    let ob2 = comptime!(layout(h)[3]);
    let ow3 = comptime!(layout(h)[4]);
    let ob3 = comptime!(layout(h)[5]);
    let total = comptime!(layout(h)[6]);
    let e = ABSOLUTE_POS;
    if e >= total {
        terminate!();
    }
    let mut acc = 0.0f32;
    for c in 0..partial.shape(0) {
        acc += partial[c * partial.stride(0) + e];
    }
    if e < ob1 {
        dw1[e] = acc;
    } else if e < ow2 {
        db1[e - ob1] = acc;
    } else if e < ob2 {
        dw2[e - ow2] = acc;
    } else if e < ow3 {
        db2[e - ob2] = acc;
    } else if e < ob3 {
        dw3[e - ow3] = acc;
    } else {
        db3[e - ob3] = acc;
    }
}

/// The hidden width of a net whose FP32 tensors have the shapes these kernels take (`x`
/// `[G, M, 2]` with points, `w1` `[2, h]`, `b1` `[h]`, `w2` `[h, h]`, `b2` `[h]`, `w3` `[h, 2]`,
/// `b3` `[2]`) and whose backward fits in shared memory; `None` otherwise (the caller runs the
/// tensor operations).
pub fn supported(x: &CubeTensor, params: &[CubeTensor; 6]) -> Option<usize> {
    let x_dims = x.meta.shape().to_vec();
    let h = params[1].meta.shape().to_vec();
    let [h] = h[..] else { return None };
    let expected: [&[usize]; 6] = [&[2, h], &[h], &[h, h], &[h], &[h, 2], &[2]];
    let shapes_fit = x_dims.len() == 3
        && x_dims[2] == 2
        && x_dims[0] * x_dims[1] > 0
        && params
            .iter()
            .zip(expected)
            .all(|(p, e)| p.meta.shape().to_vec() == e);
    let all_f32 = x.dtype == DType::F32 && params.iter().all(|p| p.dtype == DType::F32);
    (shapes_fit && all_f32 && backward_shared_bytes(h) <= SHARED_LIMIT).then_some(h)
}

/// A new contiguous FP32 tensor of `dims` on `like`'s device.
fn empty(like: &CubeTensor, dims: &[usize]) -> CubeTensor {
    empty_device_contiguous_dtype(
        like.client.clone(),
        like.device.clone(),
        Shape::from(dims.to_vec()),
        DType::F32,
    )
}

/// The net's output for points `x` (`[G, M, 2]`), hidden width `h` from [`supported`].
pub fn forward(x: CubeTensor, [w1, b1, w2, b2, w3, b3]: [CubeTensor; 6], h: usize) -> CubeTensor {
    let dims = x.meta.shape().to_vec();
    let n = dims[0] * dims[1];
    let out = empty(&x, &dims);
    let client = x.client.clone();
    let cubes = CubeCount::Static(n.div_ceil(POINTS) as u32, 1, 1);
    // SAFETY: `supported` checked every shape and dtype; units past the last point write
    // nothing; `out` is contiguous `[G, M, 2]`.
    unsafe {
        coupling_forward_kernel::launch_unchecked(
            &client,
            cubes,
            CubeDim::new_1d(POINTS as u32),
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
    let dims = x.meta.shape().to_vec();
    let n = dims[0] * dims[1];
    let cubes = n.div_ceil(POINTS);
    let total = layout(h)[6];
    let dx = empty(&x, &dims);
    let partial = empty(&x, &[cubes, total]);
    let grads = params.clone().map(|p| empty(&p, &p.meta.shape().to_vec()));
    let client = x.client.clone();
    let [w1, b1, w2, b2, w3, b3] = params;
    // SAFETY: `supported` checked every shape and dtype (the caller), the gradient's shape is
    // checked above; cube `c` writes row `c` of `partial` (`cubes` rows of `total`), units past
    // the last point write no `dx`.
    unsafe {
        coupling_backward_kernel::launch_unchecked(
            &client,
            CubeCount::Static(cubes as u32, 1, 1),
            CubeDim::new_1d(POINTS as u32),
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
        );
    }
    let dim = CubeDim::new(&client, total);
    let count = calculate_cube_count_elemwise(&client, total, dim);
    let [dw1, db1, dw2, db2, dw3, db3] = grads.clone();
    // SAFETY: unit `e < total` writes value `e` of the layout, into the one gradient whose
    // range holds it; each gradient is contiguous of its range's length.
    unsafe {
        coupling_sums_kernel::launch_unchecked(
            &client,
            count,
            dim,
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
    (dx, grads)
}

#[cfg(test)]
mod tests {
    use super::super::compile_check::{compiles, device, tensor};
    use super::*;

    /// The three kernels compile for CUDA on a machine without a GPU, at the flow's width and
    /// an odd one; the seed's width fits the static shared memory.
    #[test]
    fn coupling_kernels_compile_for_cuda_without_a_device() {
        assert!(backward_shared_bytes(64) <= SHARED_LIMIT);
        let (props, target) = device();
        for h in [64, 5] {
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
            let cubes = || (CubeCount::Static(2, 1, 1), CubeDim::new_1d(POINTS as u32));
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
            );
            compiles(k.define());
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
