//! Which of CubeCL's matrix-multiplication routines (cubek-matmul's multi-level strategies) runs
//! the weight gradients' matmuls (`wgrad`, on CUDA). Burn 0.22.1 without autotune runs every
//! matmul with one of them, the synchronous, cyclic, `cmma` one (`Strategy::Auto`), and keeps the
//! choice private; for the convolutions the same family's `mma` routines were 2.2–4.3× faster on
//! the H200 (docs/kernels.md, "Implicit-GEMM routines"). Every routine computes the same product,
//! accumulating in FP32 (FP32 operands are staged as TF32 on the tensor cores); they differ in how
//! the operands reach shared memory and which tensor-core instruction multiplies them, hence in
//! speed, and in the order of the additions, hence in the last bits (native and replay run the
//! same one). `burnpose bench-conv --matmul-routines` compares them (docs/kernels.md, "Matmul
//! routines").

use super::tf32_gemm::Form;
use burn::backend::DType;
use burn_cubecl::kernel::matmul::{MatmulStrategy, init_matmul_output};
use burn_cubecl::tensor::CubeTensor;
use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems, MatmulSetupError};
use cubek::matmul::multi_level::Strategy as Routine;
use cubek::matmul::strategy::Strategy;
use cubek::std::InputBinding;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The routines, by name; the first is the one Burn runs (`Strategy::Auto` on an accelerator),
/// the last four ours (`own-tf32`: `kernels/tf32_gemm.cu`, FP32 operands only;
/// `own-tf32-implicit` the same, and the weight gradients' columns read from the convolution's
/// input by it rather than written first, [`implicit`]; `own-tf32-wide` with tiles of 128 rows
/// or columns where the product has more than 64, `own-tf32-async` with its operands copied
/// into four shared buffers by `cp.async`, both the same bits as `own-tf32`). cubek's three TMA
/// routines are left out: on the H200 they returned wrong weight gradients (errors of 0.87–1.15
/// of the largest value) for stride-2 convolutions without declining them (docs/perf_log.md
/// AW1).
pub const ROUTINES: [&str; 25] = [
    "simple-cyclic-cmma",
    "simple-cyclic-mma",
    "simple-strided-cmma",
    "simple-strided-mma",
    "simple-tilewise-cmma",
    "simple-tilewise-mma",
    "simple-async-cyclic-cmma",
    "simple-async-cyclic-mma",
    "simple-async-strided-cmma",
    "simple-async-strided-mma",
    "double-cyclic-cmma",
    "double-cyclic-mma",
    "double-tilewise-cmma",
    "double-tilewise-mma",
    "double-hybrid-cmma",
    "double-hybrid-mma",
    "double-async-cyclic-mma",
    "double-async-strided-mma",
    "specialized-cyclic-mma",
    "specialized-strided-mma",
    "ordered-double-mma",
    "own-tf32",
    "own-tf32-implicit",
    "own-tf32-wide",
    "own-tf32-async",
];

/// The routine `ROUTINES[i]`, with cubek's inferred blueprint for each problem.
fn routine(i: usize) -> Routine {
    match ROUTINES[i] {
        "simple-cyclic-cmma" => Routine::SimpleCyclicCmma(Default::default()),
        "simple-cyclic-mma" => Routine::SimpleCyclicMma(Default::default()),
        "simple-strided-cmma" => Routine::SimpleStridedCmma(Default::default()),
        "simple-strided-mma" => Routine::SimpleStridedMma(Default::default()),
        "simple-tilewise-cmma" => Routine::SimpleTilewiseCmma(Default::default()),
        "simple-tilewise-mma" => Routine::SimpleTilewiseMma(Default::default()),
        "simple-async-cyclic-cmma" => Routine::SimpleAsyncCyclicCmma(Default::default()),
        "simple-async-cyclic-mma" => Routine::SimpleAsyncCyclicMma(Default::default()),
        "simple-async-strided-cmma" => Routine::SimpleAsyncStridedCmma(Default::default()),
        "simple-async-strided-mma" => Routine::SimpleAsyncStridedMma(Default::default()),
        "double-cyclic-cmma" => Routine::DoubleCyclicCmma(Default::default()),
        "double-cyclic-mma" => Routine::DoubleCyclicMma(Default::default()),
        "double-tilewise-cmma" => Routine::DoubleTilewiseCmma(Default::default()),
        "double-tilewise-mma" => Routine::DoubleTilewiseMma(Default::default()),
        "double-hybrid-cmma" => Routine::DoubleHybridCmma(Default::default()),
        "double-hybrid-mma" => Routine::DoubleHybridMma(Default::default()),
        "double-async-cyclic-mma" => Routine::DoubleAsyncCyclicMma(Default::default()),
        "double-async-strided-mma" => Routine::DoubleAsyncStridedMma(Default::default()),
        "specialized-cyclic-mma" => Routine::SpecializedCyclicMma(Default::default()),
        "specialized-strided-mma" => Routine::SpecializedStridedMma(Default::default()),
        "ordered-double-mma" => Routine::OrderedDoubleMma(Default::default()),
        other => unreachable!("{other} is one of cubek's ROUTINES"),
    }
}

/// Burn's own routine (`ROUTINES[BURN]`), which also runs what a chosen routine declines.
const BURN: usize = 0;

/// Our own kernel (`ROUTINES[OWN]`, `kernels/tf32_gemm.rs`): FP32 operands on the tensor cores
/// as TF32, one block per 64 × 64 tile of a product over its whole K; it declines other dtypes.
/// `ROUTINES[OWN + 1]` is the same kernel with the weight gradients' columns implicit,
/// `ROUTINES[OWN + 2]` with wide tiles, `ROUTINES[OWN + 3]` with asynchronous copies.
const OWN: usize = 21;

/// Whether the weight gradients read their columns from the convolution's input inside our
/// kernel (`own-tf32-implicit`) instead of writing them first (`model::ops::wgrad`).
pub fn implicit() -> bool {
    CHOSEN.load(Ordering::Relaxed) == OWN + 1
}

/// `own-tf32`, our kernel: on an H100 it took the recorded seed step's GPU time from 24.56 to
/// 23.74 ms against cubek's `specialized-cyclic-mma` (which reads these operands only after
/// copying them; docs/perf_log.md BI1, BI2).
pub const DEFAULT: usize = OWN;

static CHOSEN: AtomicUsize = AtomicUsize::new(DEFAULT);

/// Products the chosen routine declined since the process started (Burn's ran them instead).
static DECLINED: AtomicUsize = AtomicUsize::new(0);

/// How many products the chosen routines declined so far (each then ran Burn's routine), for
/// the comparisons that must know which routine they timed.
pub fn declined() -> usize {
    DECLINED.load(Ordering::Relaxed)
}

/// Runs every later weight-gradient matmul of this process with routine `name` (one of
/// [`ROUTINES`]).
pub fn choose(name: &str) -> Result<(), String> {
    let i = ROUTINES
        .iter()
        .position(|r| *r == name)
        .ok_or_else(|| format!("unknown matmul routine {name:?}: expected one of {ROUTINES:?}"))?;
    CHOSEN.store(i, Ordering::Relaxed);
    Ok(())
}

/// The routine in use, by name.
pub fn chosen() -> &'static str {
    ROUTINES[CHOSEN.load(Ordering::Relaxed)]
}

/// `lhs · rhs` (`[.., m, k]` by `[.., k, n]`, any strides, the same batch dimensions) in
/// `lhs`'s dtype, by the chosen routine. Where that routine declines the problem (a shape or
/// layout it does not take), Burn's own matmul runs it instead: the same choice for the same
/// problem every time, so still deterministic.
pub fn matmul(lhs: CubeTensor, rhs: CubeTensor) -> CubeTensor {
    let dtype = lhs.dtype;
    matmul_as(lhs, rhs, dtype)
}

/// [`matmul`] of reduced-precision operands into FP32 (accumulated in FP32).
pub fn matmul_f32(lhs: CubeTensor, rhs: CubeTensor) -> CubeTensor {
    matmul_as(lhs, rhs, DType::F32)
}

fn matmul_as(lhs: CubeTensor, rhs: CubeTensor, dtype: DType) -> CubeTensor {
    let i = CHOSEN.load(Ordering::Relaxed);
    if i >= OWN {
        let own = (dtype == DType::F32)
            .then(|| {
                let form = match i - OWN {
                    2 => Form::Wide,
                    3 => Form::Async,
                    _ => Form::Plain,
                };
                super::tf32_gemm::matmul(&lhs, &rhs, form)
            })
            .flatten();
        if let Some(out) = own {
            return out;
        }
        DECLINED.fetch_add(1, Ordering::Relaxed);
    } else if i != BURN {
        match launch(&Strategy::MultiLevel(routine(i)), &lhs, &rhs, dtype) {
            Ok(out) => return out,
            Err(_) => {
                DECLINED.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    burn_cubecl::kernel::matmul::matmul(lhs, rhs, None, MatmulStrategy::default(), dtype)
        .expect("Burn's matmul")
}

/// One launch of `strategy` into a new output, as burn-cubecl launches its own matmuls.
fn launch(
    strategy: &Strategy,
    lhs: &CubeTensor,
    rhs: &CubeTensor,
    dtype: DType,
) -> Result<CubeTensor, MatmulSetupError> {
    let s = burn::backend::cubecl::dtype_to_storage_type;
    let out = init_matmul_output(lhs, rhs, dtype);
    let mut dtypes = MatmulElems::from_globals(&MatmulGlobalElems {
        lhs: s(lhs.dtype),
        rhs: s(rhs.dtype),
        out: s(dtype),
    });
    cubek::matmul::launch::launch_ref(
        strategy,
        &out.client,
        InputBinding::new(lhs.clone().binding(), s(lhs.dtype)),
        InputBinding::new(rhs.clone().binding(), s(rhs.dtype)),
        out.clone().binding(),
        &mut dtypes,
    )?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name maps to a routine; the first is Burn's, and the default is the one measured.
    #[test]
    fn every_routine_has_a_strategy() {
        for (i, name) in ROUTINES.iter().enumerate().filter(|(i, _)| *i < OWN) {
            let shown = routine(i).to_string();
            let want = format!("matmul_{}", name.replace('-', "_"));
            assert!(shown.starts_with(&want), "{name} shows as {shown}");
        }
        assert_eq!(ROUTINES[BURN], "simple-cyclic-cmma");
        assert_eq!(ROUTINES[DEFAULT], "own-tf32");
        assert_eq!(ROUTINES[OWN], "own-tf32");
        assert_eq!(ROUTINES[OWN + 1], "own-tf32-implicit");
        assert_eq!(ROUTINES[OWN + 2], "own-tf32-wide");
        assert_eq!(ROUTINES[OWN + 3], "own-tf32-async");
        assert!(choose("no-such-routine").is_err());
    }
}
