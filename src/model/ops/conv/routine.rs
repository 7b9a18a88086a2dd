//! Which implicit GEMM runs the reduced-precision convolutions of [`super::gemm::forward_in`]
//! and their stride-1 data gradients: our own ([`OWN`], the default) or one of CubeCL's
//! routines (cubek's convolution algorithms, [`ROUTINES`]). Every routine computes the same
//! convolution; they differ in how the operands reach shared memory and tensor cores, hence in
//! speed (`burnpose bench-conv --routines`, docs/kernels.md), and in the order of the
//! additions, hence in the last bits.

use burn::backend::ops::ConvOptions;
use burn::backend::{DType, Shape};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::ops::{permute_nchw_to_nhwc, permute_nchw_to_nhwc_shape, permute_nhwc_to_nchw};
use burn_cubecl::tensor::CubeTensor;
use cubek::convolution::components::ConvSetupError;
use cubek::convolution::{
    AcceleratedTileKind, ConvAlgorithm, ConvolutionArgs, ConvolutionInputs, Strategy, launch_ref,
};
use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems};
use cubek::std::InputBinding;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The routines, by name; the first is the one burn-cubecl 0.22.1 runs.
pub const ROUTINES: [(&str, ConvAlgorithm, AcceleratedTileKind); 12] = {
    use AcceleratedTileKind::{Cmma, Mma};
    use ConvAlgorithm::*;
    [
        ("sync-cyclic-cmma", SimpleSyncCyclic, Cmma),
        ("sync-cyclic-mma", SimpleSyncCyclic, Mma),
        ("sync-strided-cmma", SimpleSyncStrided, Cmma),
        ("sync-strided-mma", SimpleSyncStrided, Mma),
        ("sync-tilewise-cmma", SimpleSyncTilewise, Cmma),
        ("sync-tilewise-mma", SimpleSyncTilewise, Mma),
        ("async-cyclic-cmma", SimpleAsyncCyclic, Cmma),
        ("async-cyclic-mma", SimpleAsyncCyclic, Mma),
        ("async-strided-cmma", SimpleAsyncStrided, Cmma),
        ("async-strided-mma", SimpleAsyncStrided, Mma),
        ("async-tma-cmma", SimpleAsyncTma, Cmma),
        ("async-tma-mma", SimpleAsyncTma, Mma),
    ]
};

/// cubek's routine our convolutions run where [`OWN`] declines them, and the fastest of
/// cubek's: on the H200 it took the 16 heaviest such passes of the seed step from 5.60 to
/// 2.13 ms of GPU time, where the first (burn-cubecl's) was the slowest but two
/// (docs/kernels.md, "Implicit-GEMM routines").
pub const DEFAULT: usize = 3;

static CHOSEN: AtomicUsize = AtomicUsize::new(DEFAULT);

/// Our own BF16 implicit GEMM for the forwards and stride-1 data gradients
/// (`kernels/bf16_conv.cu`), by name: the routine our convolutions run unless another is
/// chosen. On an H100 it took the seed step's 70 heaviest such passes from 5.10 to 4.08 ms
/// of GPU time against [`DEFAULT`], with the same bits (docs/perf_log.md BJ1); what it
/// declines (FP16, layouts it does not read) runs [`DEFAULT`].
pub const OWN: &str = "own-bf16";

static OWN_CHOSEN: AtomicBool = AtomicBool::new(true);

/// Whether our own kernel ([`OWN`]) runs the convolutions it takes.
pub fn own_chosen() -> bool {
    OWN_CHOSEN.load(Ordering::Relaxed)
}

/// Runs every later convolution of this process with the default routine, [`OWN`].
pub fn choose_default() {
    OWN_CHOSEN.store(true, Ordering::Relaxed);
    CHOSEN.store(DEFAULT, Ordering::Relaxed);
}

/// Runs every later convolution of this process with routine `name` (one of [`ROUTINES`],
/// or [`OWN`]).
pub fn choose(name: &str) -> Result<(), String> {
    if name == OWN {
        choose_default();
        return Ok(());
    }
    let i = ROUTINES.iter().position(|r| r.0 == name).ok_or_else(|| {
        let names: Vec<&str> = ROUTINES.iter().map(|r| r.0).collect();
        format!("unknown convolution routine {name:?}: expected {OWN:?} or one of {names:?}")
    })?;
    OWN_CHOSEN.store(false, Ordering::Relaxed);
    CHOSEN.store(i, Ordering::Relaxed);
    Ok(())
}

/// The routine in use, by name.
pub fn chosen() -> &'static str {
    if OWN_CHOSEN.load(Ordering::Relaxed) {
        OWN
    } else {
        ROUTINES[CHOSEN.load(Ordering::Relaxed)].0
    }
}

static STRIDED_BY_GEMM: AtomicBool = AtomicBool::new(true);

/// Runs the BF16 data gradients of strided convolutions (without groups) as the chosen
/// routine's stride-1 data gradient of the zero-dilated output gradient (`true`, the
/// default: it multiplies s² times as many values, most of them zeros, yet took the seed
/// step's backward graph 0.37 ms below Burn's direct kernel, docs/perf_log.md AP2) or as
/// Burn's direct transposed kernel in FP32 (`false`). FP16 always takes the direct kernel:
/// with the GEMM the FP16 step tests' fits never grew their loss scale (AP3).
pub fn choose_strided_by_gemm(gemm: bool) {
    STRIDED_BY_GEMM.store(gemm, Ordering::Relaxed);
}

/// Whether strided data gradients run by GEMM ([`choose_strided_by_gemm`]).
pub fn strided_by_gemm() -> bool {
    STRIDED_BY_GEMM.load(Ordering::Relaxed)
}

fn strategy() -> Strategy {
    let (_, algorithm, tile_kind) = ROUTINES[CHOSEN.load(Ordering::Relaxed)];
    Strategy::Inferred {
        algorithm,
        tile_kind,
    }
}

fn elems(lhs: DType, rhs: DType, out: DType) -> MatmulElems {
    let s = burn::backend::cubecl::dtype_to_storage_type;
    MatmulElems::from_globals(&MatmulGlobalElems {
        lhs: s(lhs),
        rhs: s(rhs),
        out: s(out),
    })
}

fn binding(t: CubeTensor) -> InputBinding {
    let dtype = burn::backend::cubecl::dtype_to_storage_type(t.dtype);
    InputBinding::new(t.binding(), dtype)
}

fn args(options: &ConvOptions<2>) -> ConvolutionArgs<2> {
    ConvolutionArgs {
        stride: options.stride,
        padding: options.padding_begin(),
        dilation: options.dilation,
    }
}

/// The convolution of `[N, C, H, W]` `x` (channels-last strides) by `weight`, without bias
/// or groups, in `x`'s dtype, accumulated in FP32 (reduced dtypes) and written as `out`
/// (`x`'s dtype or FP32), contiguous channels-last.
pub fn forward(
    x: CubeTensor,
    weight: CubeTensor,
    options: &ConvOptions<2>,
    out: DType,
) -> Result<CubeTensor, ConvSetupError> {
    if options.groups != 1 {
        return Err(ConvSetupError::Groups(options.groups));
    }
    if OWN_CHOSEN.load(Ordering::Relaxed)
        && let Some(y) = super::super::bf16_conv::forward(&x, &weight, options, out)
    {
        return Ok(permute_nhwc_to_nchw(y));
    }
    let (x, weight) = (permute_nchw_to_nhwc(x), permute_nchw_to_nhwc(weight));
    let xs = x.meta.shape().clone();
    let ws = weight.meta.shape().clone();
    let [ho, wo] = super::output_size([xs[1], xs[2]], [ws[1], ws[2]], options);
    let dtypes = elems(x.dtype, weight.dtype, out);
    let out = empty_device_contiguous_dtype(
        x.client.clone(),
        x.device.clone(),
        Shape::new([xs[0], ho, wo, ws[0]]),
        out,
    );
    let client = x.client.clone();
    launch_ref::<2>(
        &strategy(),
        &client,
        ConvolutionInputs::Forward {
            input: binding(x),
            weight: binding(weight),
            bias: None,
            out: out.clone().binding(),
        },
        args(options),
        dtypes,
    )?;
    Ok(permute_nhwc_to_nchw(out))
}

/// The data gradient of a stride-1 convolution without groups: `grad` `[N, C_out, H, W]`
/// and `weight` with channels-last strides, the result `in_shape` written as `out` (`grad`'s
/// dtype or FP32), contiguous channels-last.
pub fn data_grad(
    grad: CubeTensor,
    weight: CubeTensor,
    swapped: Option<CubeTensor>,
    in_shape: Shape,
    options: &ConvOptions<2>,
    out: DType,
) -> Result<CubeTensor, ConvSetupError> {
    if options.groups != 1 || options.stride.iter().any(|&s| s != 1) {
        return Err(ConvSetupError::Groups(options.groups));
    }
    if OWN_CHOSEN.load(Ordering::Relaxed) {
        let input = [in_shape[1], in_shape[2], in_shape[3]];
        let swapped = swapped.as_ref();
        if let Some(dx) =
            super::super::bf16_conv::data_grad(&grad, &weight, swapped, input, options, out)
        {
            return Ok(permute_nhwc_to_nchw(dx));
        }
    }
    let (grad, weight) = (permute_nchw_to_nhwc(grad), permute_nchw_to_nhwc(weight));
    let dtypes = elems(grad.dtype, weight.dtype, out);
    let in_grad = empty_device_contiguous_dtype(
        grad.client.clone(),
        grad.device.clone(),
        permute_nchw_to_nhwc_shape(in_shape),
        out,
    );
    let client = grad.client.clone();
    launch_ref::<2>(
        &strategy(),
        &client,
        ConvolutionInputs::BackwardData {
            out_grad: binding(grad),
            weights: binding(weight),
            in_grad: in_grad.clone().binding(),
        },
        args(options),
        dtypes,
    )?;
    Ok(permute_nhwc_to_nchw(in_grad))
}
