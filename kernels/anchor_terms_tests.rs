//! The per-anchor terms' kernels compiled for CUDA without a device (`kernels/anchor_terms.rs`).
use super::*;
use crate::model::ops::compile_check::{compiles, device, tensor};
use cubecl::CubeCount;

/// Both kernels compile for CUDA on a machine without a GPU, at 17 keypoints of 3 values
/// and 4 of 2.
#[test]
fn anchor_terms_kernels_compile_for_cuda_without_a_device() {
    let (props, target) = device();
    let (b, n, a) = (2, 3, 300);
    for (k, kd) in [(17, 3), (4, 2)] {
        let fixed = || {
            [
                tensor(&[b, n, PACKED + 3 * k]),
                tensor(&[b, a]),
                tensor(&[b, a]),
                tensor(&[b, a]),
                tensor(&[1, 1, a]),
                tensor(&[1, 1, a]),
                tensor(&[1, 1, a]),
                tensor(&[k]),
            ]
        };
        let [objects, slot, fg, weight, ax, ay, st, sig] = fixed();
        let kernel = forward_kernel::create_dummy_kernel(
            props.clone(),
            target.clone(),
            CubeCount::Static(3, 1, 1),
            CubeDim::new_1d(256),
            tensor(&[b, 4, a]),
            tensor(&[b, k * kd, a]),
            objects,
            slot,
            fg,
            weight,
            ax,
            ay,
            st,
            sig,
            tensor(&[ROWS, b, a]),
            640.0,
            480.0,
            v_scale(),
            k,
            kd,
        );
        compiles(kernel.define());
        let [objects, slot, fg, weight, ax, ay, st, sig] = fixed();
        let kernel = backward_kernel::create_dummy_kernel(
            props.clone(),
            target.clone(),
            CubeCount::Static(3, 1, 1),
            CubeDim::new_1d(256),
            tensor(&[b, 4, a]),
            tensor(&[b, k * kd, a]),
            objects,
            slot,
            fg,
            weight,
            ax,
            ay,
            st,
            sig,
            tensor(&[ROWS, b, a]),
            tensor(&[b, 4, a]),
            tensor(&[b, k * kd, a]),
            640.0,
            480.0,
            v_scale(),
            k,
            kd,
        );
        compiles(kernel.define());
    }
}
