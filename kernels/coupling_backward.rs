//! The backward kernels of the coupling net (`coupling.rs`): the data gradient and each
//! cube's weight and bias sums, then the cubes' sums added.

// `#[cube]` expands to `cubecl::…` paths.
use super::{
    GROUPS, LANES, POINTS, ROW, TILE, first, layout, load_weights, point, second, shared_layout,
    sigmoid, silu_slope,
};
use burn::cubecl;
use cubecl::prelude::*;

/// `Σ_u a[ia + u] · a[ib + u]` over the cube's points `u`, in order.
#[cube]
fn column_dot(a: &mut Shared<[f32]>, ia: usize, ib: usize) -> f32 {
    let mut acc = 0.0f32;
    #[unroll]
    for u in 0..POINTS {
        acc += a[ia + u] * a[ib + u];
    }
    acc
}

/// `Σ_u a[ia + u]` over the cube's points `u`, in order.
#[cube]
fn column_sum(a: &mut Shared<[f32]>, ia: usize) -> f32 {
    let mut acc = 0.0f32;
    #[unroll]
    for u in 0..POINTS {
        acc += a[ia + u];
    }
    acc
}

/// Units `(lane, point)`: the data gradient into contiguous `dx` (`[G, M, 2]`); cube `c` writes
/// its points' sums of every weight's and bias's gradient into `partial[c, ..]` ([`layout`]).
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
pub(super) fn coupling_backward_kernel(
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
    #[comptime] tiled: bool,
) {
    let mut s = Shared::<[f32]>::new_slice(comptime!(shared_layout(h)[6]));
    let mut work = Shared::<[f32]>::new_slice(comptime!(work_len(h)));
    load_weights(w1, b1, w2, b2, w3, b3, &mut s, h);
    let lane = UNIT_POS_X as usize;
    let p = CUBE_POS * POINTS + UNIT_POS_Y as usize;
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
    let row = CUBE_POS * partial.stride(0);
    let d = net_backward(&s, &mut work, x0, x1, g0, g1, partial, row, h, tiled);
    if lane < 2 && valid {
        dx[2 * p + lane] = d;
    }
}

/// Length of [`net_backward`]'s shared work space: per point (column `pt` of row `i`) the first
/// hidden layer, the second layer's pre-activation gradient and the second hidden layer (then
/// the first layer's pre-activation gradient), `h` rows of [`ROW`] each; then `x0, x1, g0, g1`
/// of each point, [`POINTS`] apart.
pub(super) const fn work_len(h: usize) -> usize {
    3 * h * ROW + 4 * POINTS
}

/// The backward of the net whose weights are in `s` ([`shared_layout`]) at the cube's points
/// (this unit's point `(x0, x1)`, its output gradient `(g0, g1)`; a unit past the last point
/// takes zeros, which add nothing): every weight's and bias's gradient summed over the cube's
/// points in order, written into `partial` at `row` ([`layout`]), all the cube's units sharing
/// the sums. Returns, for units of lane 0 and 1, that coordinate of the point's data gradient.
/// Syncs the cube before it reads `s`, not after its last write of `work`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn net_backward(
    s: &Shared<[f32]>,
    work: &mut Shared<[f32]>,
    x0: f32,
    x1: f32,
    g0: f32,
    g1: f32,
    partial: &mut Tensor<f32>,
    row: usize,
    #[comptime] h: usize,
    #[comptime] tiled: bool,
) -> f32 {
    let ow1 = comptime!(layout(h)[0]);
    let ob1 = comptime!(layout(h)[1]);
    let ow2 = comptime!(layout(h)[2]);
    let ob2 = comptime!(layout(h)[3]);
    let ow3 = comptime!(layout(h)[4]);
    let ob3 = comptime!(layout(h)[5]);
    let sw1 = comptime!(shared_layout(h)[0]);
    let sw2 = comptime!(shared_layout(h)[2]);
    let sw3 = comptime!(shared_layout(h)[4]);
    let ob2s = comptime!(shared_layout(h)[3]);
    // The three per-point tables and the points' values within `work` (`work_len`).
    let h1o = 0usize;
    let d2o = comptime!(h * ROW);
    let h2o = comptime!(2 * h * ROW);
    let pso = comptime!(3 * h * ROW);
    let tiles = comptime!(POINTS / TILE * (h / TILE));
    let lane = UNIT_POS_X as usize;
    let pt = UNIT_POS_Y as usize;
    let u = UNIT_POS as usize;
    let units = CUBE_DIM as usize;
    if lane == 0 {
        work[pso + pt] = x0;
        work[pso + POINTS + pt] = x1;
        work[pso + 2 * POINTS + pt] = g0;
        work[pso + 3 * POINTS + pt] = g1;
    }
    sync_cube();

    if tiled {
        // The first hidden layer: this unit's point, every `LANES`-th unit (the others' share).
        for ii in 0..comptime!(h / LANES) {
            let i = ii * LANES + lane;
            let a = first(s, x0, x1, i, h);
            work[h1o + i * ROW + pt] = a * sigmoid(a);
        }
        sync_cube();

        // The second layer's pre-activations of `TILE` points × `TILE` outputs a tile (each a sum
        // over the first layer in order, as `second` sums), its activation and gradient.
        let mut t = u;
        while t < tiles {
            let p0 = (t / comptime!(h / TILE)) * TILE;
            let j0 = (t % comptime!(h / TILE)) * TILE;
            let mut acc = Array::<f32>::new(comptime!(TILE * TILE));
            #[unroll]
            for p in 0..TILE {
                #[unroll]
                for k in 0..TILE {
                    acc[p * TILE + k] = s[ob2s + j0 + k];
                }
            }
            #[unroll]
            for i in 0..h {
                let mut hv = Array::<f32>::new(TILE);
                let mut wv = Array::<f32>::new(TILE);
                #[unroll]
                for k in 0..TILE {
                    hv[k] = work[h1o + i * ROW + p0 + k];
                    wv[k] = s[sw2 + i * (h + 1) + j0 + k];
                }
                #[unroll]
                for p in 0..TILE {
                    #[unroll]
                    for k in 0..TILE {
                        acc[p * TILE + k] += hv[p] * wv[k];
                    }
                }
            }
            #[unroll]
            for p in 0..TILE {
                let g0p = work[pso + 2 * POINTS + p0 + p];
                let g1p = work[pso + 3 * POINTS + p0 + p];
                #[unroll]
                for k in 0..TILE {
                    let j = j0 + k;
                    let a = acc[p * TILE + k];
                    let sg = sigmoid(a);
                    let d = (g0p * s[sw3 + 2 * j] + g1p * s[sw3 + 2 * j + 1]) * silu_slope(a, sg);
                    work[h2o + j * ROW + p0 + p] = a * sg;
                    work[d2o + j * ROW + p0 + p] = d;
                }
            }
            t += units;
        }
    } else {
        // The point's hidden layers; this unit's share of the second layer and its gradient.
        let mut h1 = Array::<f32>::new(h);
        #[unroll]
        for i in 0..h {
            let a = first(s, x0, x1, i, h);
            h1[i] = a * sigmoid(a);
            if lane == comptime!(i % LANES) {
                work[h1o + i * ROW + pt] = h1[i];
            }
        }
        for jj in 0..comptime!(h / LANES) {
            let j = jj * LANES + lane;
            let a = second(s, &h1, j, h);
            let sg = sigmoid(a);
            let d = (g0 * s[sw3 + 2 * j] + g1 * s[sw3 + 2 * j + 1]) * silu_slope(a, sg);
            work[h2o + j * ROW + pt] = a * sg;
            work[d2o + j * ROW + pt] = d;
        }
    }
    sync_cube();

    if tiled {
        // `w2`'s gradient by tiles of `TILE` × `TILE` weights, each summed over the points in
        // order (`column_dot`'s sums, with each value read once a tile).
        let wtiles = comptime!((h / TILE) * (h / TILE));
        let mut t = u;
        while t < wtiles {
            let i0 = (t / comptime!(h / TILE)) * TILE;
            let j0 = (t % comptime!(h / TILE)) * TILE;
            let mut acc = Array::<f32>::new(comptime!(TILE * TILE));
            #[unroll]
            for k in 0..comptime!(TILE * TILE) {
                acc[k] = 0.0f32;
            }
            #[unroll]
            for q in 0..POINTS {
                let mut hv = Array::<f32>::new(TILE);
                let mut dv = Array::<f32>::new(TILE);
                #[unroll]
                for k in 0..TILE {
                    hv[k] = work[h1o + (i0 + k) * ROW + q];
                    dv[k] = work[d2o + (j0 + k) * ROW + q];
                }
                #[unroll]
                for a in 0..TILE {
                    #[unroll]
                    for b in 0..TILE {
                        acc[a * TILE + b] += hv[a] * dv[b];
                    }
                }
            }
            #[unroll]
            for a in 0..TILE {
                #[unroll]
                for b in 0..TILE {
                    partial[row + ow2 + (i0 + a) * h + j0 + b] = acc[a * TILE + b];
                }
            }
            t += units;
        }
    } else {
        let mut e = u;
        while e < comptime!(h * h) {
            partial[row + ow2 + e] = column_dot(work, h1o + (e / h) * ROW, d2o + (e % h) * ROW);
            e += units;
        }
    }
    if u < h {
        partial[row + ob2 + u] = column_sum(work, d2o + u * ROW);
    }
    let mut e = u;
    while e < comptime!(2 * h) {
        partial[row + ow3 + e] = column_dot(work, h2o + (e / 2) * ROW, pso + (2 + e % 2) * POINTS);
        e += units;
    }
    if u < 2 {
        partial[row + ob3 + u] = column_sum(work, pso + (2 + u) * POINTS);
    }
    sync_cube();

    if tiled {
        // The first layer's pre-activation gradient by tiles of `TILE` points × `TILE` inputs,
        // each a sum over the second layer's outputs in order, into the second hidden layer's
        // table (read above, now free).
        let mut t = u;
        while t < tiles {
            let p0 = (t / comptime!(h / TILE)) * TILE;
            let i0 = (t % comptime!(h / TILE)) * TILE;
            let mut acc = Array::<f32>::new(comptime!(TILE * TILE));
            #[unroll]
            for k in 0..comptime!(TILE * TILE) {
                acc[k] = 0.0f32;
            }
            #[unroll]
            for j in 0..h {
                let mut dv = Array::<f32>::new(TILE);
                let mut wv = Array::<f32>::new(TILE);
                #[unroll]
                for k in 0..TILE {
                    dv[k] = work[d2o + j * ROW + p0 + k];
                    wv[k] = s[sw2 + (i0 + k) * (h + 1) + j];
                }
                #[unroll]
                for p in 0..TILE {
                    #[unroll]
                    for k in 0..TILE {
                        acc[p * TILE + k] += dv[p] * wv[k];
                    }
                }
            }
            #[unroll]
            for p in 0..TILE {
                let xp0 = work[pso + p0 + p];
                let xp1 = work[pso + POINTS + p0 + p];
                #[unroll]
                for k in 0..TILE {
                    let i = i0 + k;
                    let a = first(s, xp0, xp1, i, h);
                    let sg = sigmoid(a);
                    work[h2o + i * ROW + p0 + p] = acc[p * TILE + k] * silu_slope(a, sg);
                }
            }
            t += units;
        }
    } else {
        // This unit's share of the first layer's pre-activation gradient, over the second
        // layer's outputs in order, into the second hidden layer's table (read above, now free).
        for ii in 0..comptime!(h / LANES) {
            let i = ii * LANES + lane;
            let mut dh = 0.0f32;
            #[unroll]
            for j in 0..h {
                dh += work[d2o + j * ROW + pt] * s[sw2 + i * (h + 1) + j];
            }
            let a = first(s, x0, x1, i, h);
            let sg = sigmoid(a);
            work[h2o + i * ROW + pt] = dh * silu_slope(a, sg);
        }
    }
    sync_cube();

    let mut d = 0.0f32;
    if lane < 2 {
        #[unroll]
        for i in 0..h {
            d += work[h2o + i * ROW + pt] * s[sw1 + lane * h + i];
        }
    }
    e = u;
    while e < comptime!(2 * h) {
        partial[row + ow1 + e] = column_dot(work, h2o + (e % h) * ROW, pso + (e / h) * POINTS);
        e += units;
    }
    if u < h {
        partial[row + ob1 + u] = column_sum(work, h2o + u * ROW);
    }
    d
}

/// Cube of 32 gradient values ([`layout`]) × [`GROUPS`] row groups: unit `(x, g)` sums rows
/// `g, g + GROUPS, …` of its value's column of `partial`, in order; the groups' sums are then
/// added in group order into the gradient the value belongs to (each contiguous, shaped as its
/// parameter). One unit walking all the rows of a column left the sum on 18 cubes.
#[cube(launch_unchecked, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
pub(super) fn coupling_sums_kernel(
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
    let mut sums = Shared::<[f32]>::new_slice(comptime!(32 * GROUPS));
    let x = UNIT_POS_X as usize;
    let g = UNIT_POS_Y as usize;
    let e = CUBE_POS_X as usize * 32 + x;
    let mut acc = 0.0f32;
    if e < total {
        let mut r = g;
        while r < partial.shape(0) {
            acc += partial[r * partial.stride(0) + e];
            r += GROUPS;
        }
    }
    sums[g * 32 + x] = acc;
    sync_cube();
    if g == 0 && e < total {
        let mut v = sums[x];
        #[unroll]
        for k in 1..GROUPS {
            v += sums[k * 32 + x];
        }
        if e < ob1 {
            dw1[e] = v;
        } else if e < ow2 {
            db1[e - ob1] = v;
        } else if e < ob2 {
            dw2[e - ow2] = v;
        } else if e < ow3 {
            db2[e - ob2] = v;
        } else if e < ob3 {
            dw3[e - ow3] = v;
        } else {
            db3[e - ob3] = v;
        }
    }
}
