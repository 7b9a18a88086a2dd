//! The sum over the first axis of an FP32 tensor (read by its strides), into a buffer given
//! ahead or a new one: the weight gradient's sum over its chunks (`model::ops::wgrad`), which a
//! recorded backward writes straight into the parameter's segment of the flat gradient buffer
//! (`model::ops::grads_into`) instead of into a buffer of its own that is copied there after.

// `#[cube]` expands to `cubecl::…` paths.
use burn::cubecl;
use burn::tensor::{DType, Shape};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;
use cubecl::{CubeDim, calculate_cube_count_elemwise};

/// One unit per output value `j < m`: `Σ_i x[i, j…]` over `i < rows` (the first axis), in `i`
/// order from zero, `x` read by its strides (`j` in row-major order of the other axes). For a
/// contiguous `x` neighbouring units read neighbouring addresses.
#[cube(launch_unchecked)]
fn leading_sum_kernel(x: &Tensor<f32>, out: &mut Tensor<f32>, m: u32) {
    let m = m as usize;
    if ABSOLUTE_POS >= m {
        terminate!();
    }
    let rank = x.rank();
    let mut rest = ABSOLUTE_POS;
    let mut at = 0;
    for i in 0..rank - 1 {
        let d = rank - 1 - i;
        at += (rest % x.shape(d)) * x.stride(d);
        rest /= x.shape(d);
    }
    let mut acc = 0.0f32;
    for i in 0..x.shape(0) {
        acc += x[at + i * x.stride(0)];
    }
    out[ABSOLUTE_POS] = acc;
}

/// `x` (`[R, …]`, FP32, any strides) summed over its first axis: into `out` (contiguous FP32 of
/// the remaining axes' size, any shape) when given, else into a new contiguous tensor of the
/// remaining axes. Returns the tensor written.
pub fn leading_sum(x: CubeTensor, out: Option<CubeTensor>) -> CubeTensor {
    assert_eq!(x.dtype, DType::F32, "leading_sum: FP32 only");
    let dims = x.meta.shape().to_vec();
    let m: usize = dims[1..].iter().product();
    let out = out.unwrap_or_else(|| {
        empty_device_contiguous_dtype(
            x.client.clone(),
            x.device.clone(),
            Shape::from(dims[1..].to_vec()),
            DType::F32,
        )
    });
    assert!(
        out.dtype == DType::F32 && out.is_contiguous() && out.meta.shape().num_elements() == m,
        "leading_sum: the output must be contiguous FP32 of {m} values"
    );
    let dim = CubeDim::new(&x.client, m);
    let count = calculate_cube_count_elemwise(&x.client, m, dim);
    let client = x.client.clone();
    // SAFETY: every read follows `x`'s own shape and strides; `out` holds `m` contiguous values
    // and unit `j < m` writes the `j`-th.
    unsafe {
        leading_sum_kernel::launch_unchecked(
            &client,
            count,
            dim,
            x.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            m as u32,
        );
    }
    out
}
