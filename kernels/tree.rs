//! Deterministic reductions over cubes, for the kernels whose sums feed training state
//! (`batch_norm.rs`, `channels.rs`, `depthwise.rs`): a sum of `m` values is split into [`parts`]
//! cubes of [`UNITS`] units, a number that depends on the shape only, and each cube's units are
//! summed by a fixed shared-memory tree ([`tree_sum`]). The same order every run, so the same
//! bits (no atomics).

// `a[i] = a[i] + x` on shared memory is the form CubeCL's frontend expands, not clippy's rewrite.
#![allow(clippy::assign_op_pattern)]

// `#[cube]` expands to `cubecl::…` paths.
use burn::cubecl;
use cubecl::prelude::*;

/// Units per reduction cube (a power of two: the tree halves it).
pub const UNITS: usize = 256;
/// Values one reduction cube takes at least, and the most cubes per sum.
const PER_CUBE: usize = 4096;
const MAX_PARTS: usize = 64;

/// Cubes for a sum of `m` values: a function of the shape only, so the summation order is.
pub fn parts(m: usize) -> usize {
    m.div_ceil(PER_CUBE).clamp(1, MAX_PARTS)
}

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
