//! A cube's units summed by a fixed shared-memory tree: the same order, so the same bits, every
//! run (no atomics). Used by the kernels whose sums feed training state (`channels.rs`,
//! `depthwise.rs`).

// `a[i] = a[i] + x` on shared memory is the form CubeCL's frontend expands, not clippy's rewrite.
#![allow(clippy::assign_op_pattern)]

// `#[cube]` expands to `cubecl::…` paths.
use burn::cubecl;
use cubecl::prelude::*;

/// `value` summed over the cube's units (`units`, a power of two, is the cube's size): every
/// unit gets the sum.
#[cube]
pub fn tree_sum(value: f32, #[comptime] units: usize) -> f32 {
    let mut sums = Shared::<[f32]>::new_slice(units);
    let u = UNIT_POS_X as usize;
    sums[u] = value;
    sync_cube();
    // A runtime bound: a comptime one would make the loop condition a constant.
    let mut half = CUBE_DIM_X as usize / 2;
    while half > 0 {
        if u < half {
            sums[u] = sums[u] + sums[u + half];
        }
        sync_cube();
        half /= 2;
    }
    sums[0]
}
