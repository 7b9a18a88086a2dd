//! The device assignment's top-k mask (`loss::assign::device::top_mask`) as one launch: for every
//! row of `[B, N, A]` values, the `k` anchors with the largest values, ties to the lower anchor.
//! The tensor operations take `k` rounds of a staged maximum, a staged minimum of indices and
//! four masks (~150 launches a step for the two branches of the pose loss); here one cube per
//! row runs the same `k` rounds: each round's pick is the maximum of the values not yet picked
//! (picked ones count as −∞, as the tensor rounds overwrite them) at its lowest anchor. Only
//! comparisons, so the mask is exactly the tensor operations' on any values without NaN.

// `a[i] = a[i] + x` on shared memory is the form CubeCL's frontend expands, not clippy's rewrite.
#![allow(clippy::assign_op_pattern)]

// `#[cube]` expands to `cubecl::…` paths.
use burn::cubecl;
use burn::tensor::DType;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

/// Units per row's cube (a power of two: the tree halves it).
const UNITS: usize = 256;

/// Cube `r` is row `r = b·N + n`: `out[b, n, a]` (contiguous) is 1 for the picks, else 0.
///
/// While values other than −∞ are left, the rounds pick a prefix of the order (value
/// descending, anchor ascending), so each round takes the best value *after* the last pick in
/// that order and never reads what it wrote. Once only −∞ is left, the tensor rounds pick the
/// lowest anchor holding −∞, picked anchors included (they were overwritten with −∞): that is
/// one more anchor when it is below every pick, and the same anchor again in every later round.
#[cube(launch_unchecked)]
fn top_k_kernel(values: &Tensor<f32>, out: &mut Tensor<f32>, k: u32, #[comptime] units: usize) {
    let row = CUBE_POS_X as usize;
    let n = values.shape(1);
    let a = values.shape(2);
    let base = (row / n) * values.stride(0) + (row % n) * values.stride(1);
    let step = values.stride(2);
    let dst = row * a;
    let u = UNIT_POS_X as usize;
    let none = f32::new(f32::NEG_INFINITY);
    // Anchors as f32 (exact below 2^24); `end`: no anchor.
    let end = f32::cast_from(a);
    let mut z = u;
    while z < a {
        out[dst + z] = 0.0f32;
        z += units;
    }
    // Unit `u`'s best: value `s[u]`, anchor `s[u + units]`.
    let mut s = Shared::<[f32]>::new_slice(2 * units);
    let mut last_v = none;
    let mut last_i = end;
    let mut lowest = end;
    let mut done = 0u32;
    let mut round = 0u32;
    while round < k {
        let mut best_v = none;
        let mut best_i = end;
        let mut q = u;
        while q < a {
            let v = values[base + q * step];
            let qf = f32::cast_from(q);
            let after = last_i == end || v < last_v || (v == last_v && qf > last_i);
            let better = best_i == end || v > best_v || (v == best_v && qf < best_i);
            if after && better {
                best_v = v;
                best_i = qf;
            }
            q += units;
        }
        s[u] = best_v;
        s[u + units] = best_i;
        sync_cube();
        // A runtime bound: a comptime one would make the loop condition a constant.
        let mut half = CUBE_DIM_X as usize / 2;
        while half > 0 {
            if u < half {
                let other_v = s[u + half];
                let other_i = s[u + half + units];
                let mine_v = s[u];
                let mine_i = s[u + units];
                let wins = other_i != end
                    && (mine_i == end
                        || other_v > mine_v
                        || (other_v == mine_v && other_i < mine_i));
                if wins {
                    s[u] = other_v;
                    s[u + units] = other_i;
                }
            }
            sync_cube();
            half /= 2;
        }
        let pick_v = s[0];
        let pick_i = s[units];
        // Every unit has read the pick before the next round writes `s`.
        sync_cube();
        if done == 0u32 && pick_i != end {
            let mut take = 1u32;
            if pick_v == none {
                // Only −∞ left: this anchor if it is below every pick, then no other.
                done = 1u32;
                if pick_i > lowest {
                    take = 0u32;
                }
            }
            if take == 1u32 {
                if u == 0 {
                    out[dst + usize::cast_from(pick_i)] = 1.0f32;
                }
                last_v = pick_v;
                last_i = pick_i;
                if pick_i < lowest {
                    lowest = pick_i;
                }
            }
        }
        round += 1u32;
    }
}

/// The `[B, N, A]` mask (FP32 0/1, contiguous) of the `min(k, A)` top anchors of every row of
/// FP32 `values` (any strides, no NaN), ties to the lower anchor.
pub fn top_k_mask(values: CubeTensor, k: usize) -> CubeTensor {
    assert!(
        values.dtype == DType::F32,
        "top_k_mask: f32 only, got {:?}",
        values.dtype
    );
    let shape = values.meta.shape().clone();
    assert_eq!(shape.num_dims(), 3, "top_k_mask: [B, N, A] values");
    let (rows, a) = (shape[0] * shape[1], shape[2]);
    let out = empty_device_contiguous_dtype(
        values.client.clone(),
        values.device.clone(),
        shape,
        DType::F32,
    );
    if rows == 0 || a == 0 {
        return out;
    }
    let client = values.client.clone();
    // SAFETY: one cube per row; every read is bounded by the values' shape and follows their
    // strides, every write lands in the contiguous output's row; the pick is an anchor below A
    // (any value beats the start, −∞ at anchor A).
    unsafe {
        top_k_kernel::launch_unchecked(
            &client,
            CubeCount::Static(rows as u32, 1, 1),
            CubeDim::new_1d(UNITS as u32),
            values.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            k.min(a) as u32,
            UNITS,
        );
    }
    out
}
