//! The sum over the first axis of a contiguous FP32 tensor, into a buffer given ahead or a new
//! one: the weight gradient's sum over its chunks (`model::ops::wgrad`), which a recorded
//! backward writes straight into the parameter's segment of the flat gradient buffer
//! (`model::ops::grads_into`) instead of into a buffer of its own that is copied there after.

// `#[cube]` expands to `cubecl::…` paths.
use burn::cubecl;
use burn::tensor::{DType, Shape};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;
use cubecl::{CubeDim, calculate_cube_count_elemwise};

/// One unit per output value `j < m`: `Σ_i x[i·m + j]` over `i < rows`, in `i` order from zero.
/// Neighbouring units read neighbouring addresses.
#[cube(launch_unchecked)]
fn leading_sum_kernel(x: &Tensor<f32>, out: &mut Tensor<f32>, rows: u32, m: u32) {
    let m = m as usize;
    let rows = rows as usize;
    if ABSOLUTE_POS >= m {
        terminate!();
    }
    let mut acc = 0.0f32;
    for i in 0..rows {
        acc += x[i * m + ABSOLUTE_POS];
    }
    out[ABSOLUTE_POS] = acc;
}

/// `x` (`[R, …]`, FP32) summed over its first axis: into `out` (contiguous FP32 of the remaining
/// axes' size, any shape) when given, else into a new contiguous tensor of the remaining axes.
/// Returns the tensor written.
pub fn leading_sum(x: CubeTensor, out: Option<CubeTensor>) -> CubeTensor {
    assert_eq!(x.dtype, DType::F32, "leading_sum: FP32 only");
    let x = if x.is_contiguous() {
        x
    } else {
        burn_cubecl::kernel::into_contiguous(x)
    };
    let dims = x.meta.shape().to_vec();
    let rows = dims[0];
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
    // SAFETY: `x` holds `rows · m` contiguous values and `out` `m`; every index is below them.
    unsafe {
        leading_sum_kernel::launch_unchecked(
            &client,
            count,
            dim,
            x.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            rows as u32,
            m as u32,
        );
    }
    out
}
