//! Copy of a float tensor into an existing buffer: the way feature replay refreshes the static
//! buffers its CUDA graphs read (inputs, parameters, BN statistics, seeds). Writing through our own
//! kernel guarantees the destination address is kept; Burn's ops may allocate a new output.

// `#[cube]` expands to `cubecl::…` paths.
use burn::cubecl;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;
use cubecl::{CubeCount, CubeDim, calculate_cube_count_elemwise};

/// One unit per value. Both sides by their own strides (Burn hands out NHWC-strided conv
/// outputs and views), or (`dense`: both contiguous) at the value's own index, without the
/// divisions that locate a strided value.
#[cube(launch_unchecked)]
fn copy_kernel(src: &Tensor<f32>, dst: &mut Tensor<f32>, #[comptime] dense: bool) {
    let rank = dst.rank();
    let mut numel = 1;
    for d in 0..rank {
        numel *= dst.shape(d);
    }
    if ABSOLUTE_POS >= numel {
        terminate!();
    }
    let mut from = ABSOLUTE_POS;
    let mut to = ABSOLUTE_POS;
    if !dense {
        let mut rest = ABSOLUTE_POS;
        from = 0;
        to = 0;
        for i in 0..rank {
            let d = rank - 1 - i;
            let c = rest % dst.shape(d);
            rest /= dst.shape(d);
            from += c * src.stride(d);
            to += c * dst.stride(d);
        }
    }
    dst[to] = src[from];
}

/// Writes `src` into `dst`'s buffer: same shape, both f32, any strides (`dst` must not overlap
/// itself).
pub fn copy_into(src: CubeTensor, dst: &CubeTensor) {
    let shape = dst.meta.shape().clone();
    assert_eq!(src.meta.shape(), &shape, "copy_into: shapes differ");
    assert!(
        dst.is_nonoverlapping(),
        "copy_into: destination overlaps itself"
    );
    assert!(
        src.dtype == burn::tensor::DType::F32 && dst.dtype == burn::tensor::DType::F32,
        "copy_into: f32 tensors only, got {:?} into {:?}",
        src.dtype,
        dst.dtype
    );
    let n = shape.num_elements();
    let cube_dim = CubeDim::new(&src.client, n);
    let cube_count: CubeCount = calculate_cube_count_elemwise(&src.client, n, cube_dim);
    let dense = src.is_contiguous() && dst.is_contiguous();
    // SAFETY: units are bounded by the shape's length; both sides are read and written through
    // their own strides, or at the value's index where both are contiguous.
    unsafe {
        copy_kernel::launch_unchecked(
            &dst.client,
            cube_count,
            cube_dim,
            src.into_tensor_arg(),
            dst.clone().into_tensor_arg(),
            dense,
        );
    }
}

/// A copy of `src` in a new buffer.
pub fn duplicate(src: CubeTensor) -> CubeTensor {
    // Contiguous, not pitched rows (docs/kernels.md, "Output buffers").
    let out = empty_device_contiguous_dtype(
        src.client.clone(),
        src.device.clone(),
        src.meta.shape().clone(),
        src.dtype,
    );
    copy_into(src, &out);
    out
}
