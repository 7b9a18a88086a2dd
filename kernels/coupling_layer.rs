//! One affine coupling of the RealNVP flow (`FastOps::coupling`: both nets and the update of the
//! point and its log-determinant) as one forward kernel, and one backward kernel plus two sums
//! of its cubes' partials, where the nets as kernels of their own (`coupling.rs`) left ~12
//! element-wise operations a coupling forward and ~25 backward around them.
//!
//! The state is `[G, M, c ≥ 3]` (`z0, z1`, the log-determinant); the result `[G, M, 5]` adds the
//! coupling's `s` and `t`, so the backward reads them instead of running the nets forward again.
//! The cube layout, the weights in shared memory and the fixed order of every sum are the nets'
//! (`coupling.rs`); the nets' input is the point with the transformed coordinate zero, so each
//! net's output on the other coordinate is the one used.

// `#[cube]` expands to `cubecl::…` paths.
use super::backward_kernels::{net_backward, work_len};
use super::{
    LANES, POINTS, ROW, SHARED_LIMIT, TILE, cubes, first, layout, load_weights, net_width, point,
    second, shared_layout, sigmoid, sums, tiled,
};
use crate::model::ops::empty_f32;
use burn::cubecl;
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use cubecl::CubeCount;
use cubecl::prelude::*;

/// Columns of the result: `z0', z1', log_det', s, t` (the tensor-operation body's too).
const OUT: usize = super::super::STATE;

/// This unit's share of output `k` of the net whose weights are in `s`, at point `(x0, x1)`:
/// the sum over every `LANES`-th second-layer output, as `coupling_forward_kernel` computes it,
/// each unit computing its point's whole first layer in registers.
#[cube]
fn net_share_by_lanes(
    s: &Shared<[f32]>,
    x0: f32,
    x1: f32,
    lane: usize,
    #[comptime] k: usize,
    #[comptime] h: usize,
) -> f32 {
    let ow3 = comptime!(shared_layout(h)[4]);
    let mut h1 = Array::<f32>::new(h);
    #[unroll]
    for i in 0..h {
        let a = first(s, x0, x1, i, h);
        h1[i] = a * sigmoid(a);
    }
    let mut y = 0.0f32;
    for jj in 0..comptime!(h / LANES) {
        let j = jj * LANES + lane;
        let a = second(s, &h1, j, h);
        let v = a * sigmoid(a);
        y += v * s[ow3 + 2 * j + k];
    }
    y
}

/// This unit's share of output `k` of the net whose weights are in `s`, at point `(x0, x1)`
/// (this unit's, column `pt` of `table`): the sum over every `LANES`-th second-layer output in
/// order, as `coupling_forward_kernel` computes it. The hidden layers go through `table` (`h`
/// rows of [`ROW`]): each unit computes its lane's share of its point's first layer, then the
/// second layer's pre-activations by tiles of `TILE` points × `TILE` outputs (each a sum over
/// the first layer in order, as `second` sums), so that a value read from shared memory serves
/// `TILE` products. Syncs the cube before it returns: the next call may overwrite `table`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn net_share_by_tiles(
    s: &Shared<[f32]>,
    table: &mut Shared<[f32]>,
    x0: f32,
    x1: f32,
    lane: usize,
    pt: usize,
    #[comptime] k: usize,
    #[comptime] h: usize,
) -> f32 {
    let sw2 = comptime!(shared_layout(h)[2]);
    let ob2 = comptime!(shared_layout(h)[3]);
    let ow3 = comptime!(shared_layout(h)[4]);
    let u = UNIT_POS as usize;
    for ii in 0..comptime!(h / LANES) {
        let i = ii * LANES + lane;
        let a = first(s, x0, x1, i, h);
        table[i * ROW + pt] = a * sigmoid(a);
    }
    sync_cube();
    // At most one tile a unit (`supported` bounds `h`).
    let tiles = comptime!(POINTS / TILE * (h / TILE));
    let p0 = (u / comptime!(h / TILE)) * TILE;
    let j0 = (u % comptime!(h / TILE)) * TILE;
    let mut acc = Array::<f32>::new(comptime!(TILE * TILE));
    if u < tiles {
        #[unroll]
        for p in 0..TILE {
            #[unroll]
            for c in 0..TILE {
                acc[p * TILE + c] = s[ob2 + j0 + c];
            }
        }
        #[unroll]
        for i in 0..h {
            let mut hv = Array::<f32>::new(TILE);
            let mut wv = Array::<f32>::new(TILE);
            #[unroll]
            for c in 0..TILE {
                hv[c] = table[i * ROW + p0 + c];
                wv[c] = s[sw2 + i * (h + 1) + j0 + c];
            }
            #[unroll]
            for p in 0..TILE {
                #[unroll]
                for c in 0..TILE {
                    acc[p * TILE + c] += hv[p] * wv[c];
                }
            }
        }
    }
    // Every unit has read the first layer before the second overwrites it.
    sync_cube();
    if u < tiles {
        #[unroll]
        for p in 0..TILE {
            #[unroll]
            for c in 0..TILE {
                let a = acc[p * TILE + c];
                table[(j0 + c) * ROW + p0 + p] = a * sigmoid(a);
            }
        }
    }
    sync_cube();
    let mut y = 0.0f32;
    for jj in 0..comptime!(h / LANES) {
        let j = jj * LANES + lane;
        y += table[j * ROW + pt] * s[ow3 + 2 * j + k];
    }
    sync_cube();
    y
}

/// Coordinate `k` of the pair that holds `v` at coordinate `at` and zero at the other: the nets'
/// input (the kept coordinate) and their output gradient (the transformed one).
#[cube]
fn coordinate(v: f32, #[comptime] at: usize, #[comptime] k: usize) -> f32 {
    let mut x = 0.0f32;
    if at == k {
        x = v;
    }
    x
}

/// Units `(lane, point)`: the coupling's result into contiguous `out` (`[G, M, 5]`).
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
fn coupling_layer_forward_kernel(
    state: &Tensor<f32>,
    sw1: &Tensor<f32>,
    sb1: &Tensor<f32>,
    sw2: &Tensor<f32>,
    sb2: &Tensor<f32>,
    sw3: &Tensor<f32>,
    sb3: &Tensor<f32>,
    tw1: &Tensor<f32>,
    tb1: &Tensor<f32>,
    tw2: &Tensor<f32>,
    tb2: &Tensor<f32>,
    tw3: &Tensor<f32>,
    tb3: &Tensor<f32>,
    out: &mut Tensor<f32>,
    #[comptime] keep: usize,
    #[comptime] h: usize,
    #[comptime] tiled: bool,
) {
    let other = comptime!(1 - keep);
    let ob3 = comptime!(shared_layout(h)[5]);
    let mut ss = Shared::<[f32]>::new_slice(comptime!(shared_layout(h)[6]));
    let mut st = Shared::<[f32]>::new_slice(comptime!(shared_layout(h)[6]));
    let mut ys = Shared::<[f32]>::new_slice(comptime!(2 * LANES * POINTS));
    let mut table = Shared::<[f32]>::new_slice(comptime!(table_len(h, tiled)));
    load_weights(sw1, sb1, sw2, sb2, sw3, sb3, &mut ss, h);
    load_weights(tw1, tb1, tw2, tb2, tw3, tb3, &mut st, h);
    let lane = UNIT_POS_X as usize;
    let pt = UNIT_POS_Y as usize;
    let p = CUBE_POS * POINTS + pt;
    let valid = p < state.shape(0) * state.shape(1);
    let mut kept = 0.0f32;
    if valid {
        kept = point(state, p, keep);
    }
    let x0 = coordinate(kept, keep, 0usize);
    let x1 = coordinate(kept, keep, 1usize);
    sync_cube();
    let at = (pt * LANES + lane) * 2;
    if tiled {
        ys[at] = net_share_by_tiles(&ss, &mut table, x0, x1, lane, pt, other, h);
        ys[at + 1] = net_share_by_tiles(&st, &mut table, x0, x1, lane, pt, other, h);
    } else {
        ys[at] = net_share_by_lanes(&ss, x0, x1, lane, other, h);
        ys[at + 1] = net_share_by_lanes(&st, x0, x1, lane, other, h);
    }
    sync_cube();
    if lane == 0 && valid {
        let mut a = ss[ob3 + other];
        let mut t = st[ob3 + other];
        #[unroll]
        for l in 0..LANES {
            a += ys[at + 2 * l];
            t += ys[at + 2 * l + 1];
        }
        let s = f32::tanh(a);
        let z = (point(state, p, other) - t) * f32::exp(-s);
        out[OUT * p + keep] = kept;
        out[OUT * p + other] = z;
        out[OUT * p + 2] = point(state, p, 2) - s;
        out[OUT * p + 3] = s;
        out[OUT * p + 4] = t;
    }
}

/// Units `(lane, point)`: the state's gradient into contiguous `d_state` (shaped as the state;
/// columns after the log-determinant zero); cube `c` writes its points' sums of the s-net's
/// gradients into `s_partial[c, ..]` and the t-net's into `t_partial[c, ..]` ([`layout`]). The
/// t-net runs first, then the s-net's weights replace its in shared memory.
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
fn coupling_layer_backward_kernel(
    state: &Tensor<f32>,
    sw1: &Tensor<f32>,
    sb1: &Tensor<f32>,
    sw2: &Tensor<f32>,
    sb2: &Tensor<f32>,
    sw3: &Tensor<f32>,
    sb3: &Tensor<f32>,
    tw1: &Tensor<f32>,
    tb1: &Tensor<f32>,
    tw2: &Tensor<f32>,
    tb2: &Tensor<f32>,
    tw3: &Tensor<f32>,
    tb3: &Tensor<f32>,
    out: &Tensor<f32>,
    grad: &Tensor<f32>,
    d_state: &mut Tensor<f32>,
    s_partial: &mut Tensor<f32>,
    t_partial: &mut Tensor<f32>,
    #[comptime] keep: usize,
    #[comptime] h: usize,
    #[comptime] tiled: bool,
) {
    let other = comptime!(1 - keep);
    let mut w = Shared::<[f32]>::new_slice(comptime!(shared_layout(h)[6]));
    let mut work = Shared::<[f32]>::new_slice(comptime!(work_len(h)));
    load_weights(tw1, tb1, tw2, tb2, tw3, tb3, &mut w, h);
    let lane = UNIT_POS_X as usize;
    let p = CUBE_POS * POINTS + UNIT_POS_Y as usize;
    let valid = p < state.shape(0) * state.shape(1);
    let mut kept = 0.0f32;
    let mut ds_raw = 0.0f32;
    let mut dt = 0.0f32;
    let mut dz = 0.0f32;
    let mut g_kept = 0.0f32;
    let mut g_log_det = 0.0f32;
    if valid {
        kept = point(state, p, keep);
        let s = point(out, p, 3);
        let t = point(out, p, 4);
        g_kept = point(grad, p, keep);
        g_log_det = point(grad, p, 2);
        // z' = (z − t) · exp(−s), log_det' = log_det − s; s and t are outputs too.
        dz = point(grad, p, other) * f32::exp(-s);
        dt = point(grad, p, 4) - dz;
        let ds = (point(grad, p, 3) - dz * (point(state, p, other) - t)) - g_log_det;
        ds_raw = ds * (-(s * s) + 1.0f32);
    }
    let x0 = coordinate(kept, keep, 0usize);
    let x1 = coordinate(kept, keep, 1usize);
    let gt0 = coordinate(dt, other, 0usize);
    let gt1 = coordinate(dt, other, 1usize);
    let gs0 = coordinate(ds_raw, other, 0usize);
    let gs1 = coordinate(ds_raw, other, 1usize);
    let row_t = CUBE_POS * t_partial.stride(0);
    let dx_t = net_backward(&w, &mut work, x0, x1, gt0, gt1, t_partial, row_t, h, tiled);
    sync_cube();
    load_weights(sw1, sb1, sw2, sb2, sw3, sb3, &mut w, h);
    let row_s = CUBE_POS * s_partial.stride(0);
    let dx_s = net_backward(&w, &mut work, x0, x1, gs0, gs1, s_partial, row_s, h, tiled);
    if lane == keep && valid {
        let width = d_state.shape(2);
        let at = p * width;
        d_state[at + keep] = g_kept + (dx_s + dx_t);
        d_state[at + other] = dz;
        d_state[at + 2] = g_log_det;
        for c in 3..width {
            d_state[at + c] = 0.0f32;
        }
    }
}

/// Length of the forward's table of hidden layers: `h` rows of [`ROW`] when `tiled`, else one
/// value (unused).
const fn table_len(h: usize, tiled: bool) -> usize {
    if tiled { h * ROW } else { 1 }
}

/// The hidden width of two nets whose parameters the coupling kernels take (each as
/// `net_width` checks) for an FP32 state `[G, M, c ≥ 3]` with points, when the forward's two
/// weight sets and the backward fit in shared memory; `None` otherwise (the caller runs the
/// tensor operations).
pub fn supported(
    state: &CubeTensor,
    s_net: &[CubeTensor; 6],
    t_net: &[CubeTensor; 6],
) -> Option<usize> {
    let dims = state.meta.shape().to_vec();
    let state_fits = dims.len() == 3 && dims[2] >= 3 && dims[0] * dims[1] > 0;
    let h = net_width(s_net).filter(|&h| net_width(t_net) == Some(h))?;
    let forward_bytes = (2 * shared_layout(h)[6] + 2 * LANES * POINTS + table_len(h, tiled())) * 4;
    // The tiled forward's tiles, at most one a unit (the untiled forward has none).
    let tiles_fit = !tiled() || (POINTS / TILE) * (h / TILE) <= LANES * POINTS;
    let backward_bytes = (shared_layout(h)[6] + work_len(h)) * 4;
    let fits = forward_bytes.max(backward_bytes) <= SHARED_LIMIT;
    (state_fits && state.dtype == DType::F32 && fits && tiles_fit).then_some(h)
}

/// [`FastOps::coupling`](crate::model::ops::FastOps::coupling) on CUDA, hidden width `h` from
/// [`supported`]: `[G, M, 5]`.
pub fn forward(
    state: CubeTensor,
    keep: usize,
    [sw1, sb1, sw2, sb2, sw3, sb3]: [CubeTensor; 6],
    [tw1, tb1, tw2, tb2, tw3, tb3]: [CubeTensor; 6],
    h: usize,
) -> CubeTensor {
    let dims = state.meta.shape().to_vec();
    let out = empty_f32(&state, [dims[0], dims[1], OUT]);
    let client = state.client.clone();
    let (count, dim) = cubes(&state);
    // SAFETY: `supported` checked every shape and dtype; units past the last point write
    // nothing; `out` is contiguous `[G, M, 5]`.
    unsafe {
        coupling_layer_forward_kernel::launch_unchecked(
            &client,
            CubeCount::Static(count as u32, 1, 1),
            dim,
            state.into_tensor_arg(),
            sw1.into_tensor_arg(),
            sb1.into_tensor_arg(),
            sw2.into_tensor_arg(),
            sb2.into_tensor_arg(),
            sw3.into_tensor_arg(),
            sb3.into_tensor_arg(),
            tw1.into_tensor_arg(),
            tb1.into_tensor_arg(),
            tw2.into_tensor_arg(),
            tb2.into_tensor_arg(),
            tw3.into_tensor_arg(),
            tb3.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            keep,
            h,
            tiled(),
        );
    }
    out
}

/// The gradients of [`forward`] (its result `out`) for the incoming `grad` (`[G, M, 5]`, FP32,
/// any strides): `(d state, the s-net's six, the t-net's six)`, each contiguous and shaped as
/// its input.
pub fn backward(
    state: CubeTensor,
    keep: usize,
    s_net: [CubeTensor; 6],
    t_net: [CubeTensor; 6],
    out: CubeTensor,
    grad: CubeTensor,
    h: usize,
) -> (CubeTensor, [CubeTensor; 6], [CubeTensor; 6]) {
    let dims = state.meta.shape().to_vec();
    let expected = [dims[0], dims[1], OUT];
    assert!(
        grad.dtype == DType::F32 && grad.meta.shape().to_vec() == expected,
        "coupling backward: the gradient must be FP32 shaped as the result"
    );
    let (count, dim) = cubes(&state);
    let total = layout(h)[6];
    let d_state = empty_f32(&state, &dims);
    let s_partial = empty_f32(&state, [count, total]);
    let t_partial = empty_f32(&state, [count, total]);
    let client = state.client.clone();
    let [sw1, sb1, sw2, sb2, sw3, sb3] = s_net.clone();
    let [tw1, tb1, tw2, tb2, tw3, tb3] = t_net.clone();
    // SAFETY: `supported` checked every shape and dtype (the caller), the gradient's shape is
    // checked above; cube `c` writes row `c` of each partial (`count` rows of `total`), units
    // past the last point write no `d_state`; `d_state` is contiguous shaped as the state.
    unsafe {
        coupling_layer_backward_kernel::launch_unchecked(
            &client,
            CubeCount::Static(count as u32, 1, 1),
            dim,
            state.into_tensor_arg(),
            sw1.into_tensor_arg(),
            sb1.into_tensor_arg(),
            sw2.into_tensor_arg(),
            sb2.into_tensor_arg(),
            sw3.into_tensor_arg(),
            sb3.into_tensor_arg(),
            tw1.into_tensor_arg(),
            tb1.into_tensor_arg(),
            tw2.into_tensor_arg(),
            tb2.into_tensor_arg(),
            tw3.into_tensor_arg(),
            tb3.into_tensor_arg(),
            out.into_tensor_arg(),
            grad.into_tensor_arg(),
            d_state.clone().into_tensor_arg(),
            s_partial.clone().into_tensor_arg(),
            t_partial.clone().into_tensor_arg(),
            keep,
            h,
            tiled(),
        );
    }
    let s_grads = sums(s_partial, &s_net, h);
    let t_grads = sums(t_partial, &t_net, h);
    (d_state, s_grads, t_grads)
}

#[cfg(test)]
mod tests {
    use super::super::super::compile_check::{compiles, device, tensor};
    use super::*;

    fn net(h: usize) -> [TensorArg; 6] {
        [
            tensor(&[2, h]),
            tensor(&[h]),
            tensor(&[h, h]),
            tensor(&[h]),
            tensor(&[h, 2]),
            tensor(&[2]),
        ]
    }

    /// Both kernels compile for CUDA on a machine without a GPU, with either coordinate kept,
    /// at the flow's width and a narrow one; the seed's width fits the static shared memory.
    #[test]
    fn coupling_layer_kernels_compile_for_cuda_without_a_device() {
        let (props, target) = device();
        for (h, keep, tiled) in [
            (64, 0, false),
            (64, 1, false),
            (8, 1, false),
            (64, 0, true),
            (8, 1, true),
        ] {
            let dims = || CubeDim::new_2d(LANES as u32, POINTS as u32);
            let [sw1, sb1, sw2, sb2, sw3, sb3] = net(h);
            let [tw1, tb1, tw2, tb2, tw3, tb3] = net(h);
            let k = coupling_layer_forward_kernel::create_dummy_kernel(
                props.clone(),
                target.clone(),
                CubeCount::Static(2, 1, 1),
                dims(),
                tensor(&[3, 11, 3]),
                sw1,
                sb1,
                sw2,
                sb2,
                sw3,
                sb3,
                tw1,
                tb1,
                tw2,
                tb2,
                tw3,
                tb3,
                tensor(&[3, 11, OUT]),
                keep,
                h,
                tiled,
            );
            compiles(k.define());
            let [sw1, sb1, sw2, sb2, sw3, sb3] = net(h);
            let [tw1, tb1, tw2, tb2, tw3, tb3] = net(h);
            let k = coupling_layer_backward_kernel::create_dummy_kernel(
                props.clone(),
                target.clone(),
                CubeCount::Static(2, 1, 1),
                dims(),
                tensor(&[3, 11, 3]),
                sw1,
                sb1,
                sw2,
                sb2,
                sw3,
                sb3,
                tw1,
                tb1,
                tw2,
                tb2,
                tw3,
                tb3,
                tensor(&[3, 11, OUT]),
                tensor(&[3, 11, OUT]),
                tensor(&[3, 11, 3]),
                tensor(&[2, layout(h)[6]]),
                tensor(&[2, layout(h)[6]]),
                keep,
                h,
                tiled,
            );
            compiles(k.define());
        }
        let bytes = (2 * shared_layout(64)[6] + 2 * LANES * POINTS) * 4;
        assert!(bytes <= SHARED_LIMIT, "forward: {bytes} bytes");
    }
}
