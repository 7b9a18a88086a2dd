//! A batched FP32 matmul of our own on the tensor cores (TF32 operands, FP32 accumulation):
//! hand-written CUDA C++ (`tf32_gemm.cu`, launched as `cuda_source.rs` says).
//!
//! Deterministic: every output value is one thread's sum over K in order.

use super::cuda_source::{self, fnv};
use burn::cubecl;
use burn::tensor::{DType, Shape};
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

const SOURCE: &str = include_str!("tf32_gemm.cu");
/// The tile of [`matmul`]'s default and of the implicit columns: `[BM, BN, BK]`.
const TILE: [usize; 3] = [64, 64, 32];

/// How [`matmul`] runs a product. Every form adds the K steps of 8 in the same order, so the
/// form changes the speed, not the bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// 64 × 64 × 32 tiles ([`TILE`]), each K tile read through registers into one of two
    /// shared buffers while the other is multiplied.
    Plain,
    /// Tiles of 128 rows or columns where the product has more than 64 (so a weight
    /// gradient's columns, B, are read once for up to 128 output channels), K steps of 16 then
    /// (the shared buffers stay under 48 KiB).
    Wide,
    /// 64 × 64 × 16 tiles copied straight into four shared buffers (`cp.async`), three in
    /// flight while one is multiplied; 16 bytes a copy where the operand allows it
    /// ([`vector`]).
    Async,
}

/// The tile for an `m × n` product in `form`.
fn tile(m: usize, n: usize, form: Form) -> [usize; 3] {
    match form {
        Form::Plain => TILE,
        Form::Async => [64, 64, 16],
        Form::Wide => match (m > 64, n > 64) {
            (false, false) => TILE,
            (rows, cols) => [if rows { 128 } else { 64 }, if cols { 128 } else { 64 }, 16],
        },
    }
}

/// Values an asynchronous copy of an operand moves at once: 4 (16 bytes) where its contiguous
/// axis (`inner`, the stride-1 one of `[rows, k]` strides) can be read 4 at a time from
/// 16-byte aligned addresses (every other stride a multiple of 4, its first value aligned),
/// else 1.
fn vector(strides: [usize; 4], offset_bytes: u64) -> usize {
    let [s0, s1, rows, k] = strides;
    let other = if k == 1 {
        rows
    } else if rows == 1 {
        k
    } else {
        return 1;
    };
    let aligned = [s0, s1, other].iter().all(|s| s.is_multiple_of(4));
    if aligned && offset_bytes.is_multiple_of(16) {
        4
    } else {
        1
    }
}

/// Threads a block of tile `[BM, BN, _]`: a warp per 32 × 32 (`THREADS` in the source).
fn threads([bm, bn, _]: [usize; 3]) -> u32 {
    (32 * (bm / 32) * (bn / 32)) as u32
}

/// One product's constants: `[m, n, k, batches of the second batch axis]`, the strides of `A`
/// (`[batch 0, batch 1, m, k]`) and of `B` (`[batch 0, batch 1, k, n]`), in elements, and
/// where B is a weight gradient's columns read from the convolution's input, that convolution;
/// the tile `[BM, BN, BK]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Problem {
    dims: [usize; 4],
    a: [usize; 4],
    b: [usize; 4],
    conv: Option<Columns>,
    tile: [usize; 3],
    /// With [`Form::Async`], the values a copy moves of A and of B ([`vector`]).
    copies: Option<[usize; 2]>,
}

/// The columns of a weight gradient as B (`IMPLICIT`): the output's width, the kernel's taps
/// and width, stride, dilation, top and left padding, the input's height and width and its
/// channel, row and column strides.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Columns {
    wo: usize,
    kernel: [usize; 2],
    stride: [usize; 2],
    dilation: [usize; 2],
    padding: [usize; 2],
    input: [usize; 2],
    strides: [usize; 3],
}

impl cuda_source::Problem for Problem {
    const ENTRY: &'static str = "burnpose_tf32_gemm";
    const SOURCE_HASH: u64 = fnv(SOURCE);

    fn threads(&self) -> u32 {
        threads(self.tile)
    }

    fn source(&self) -> String {
        let [m, n, k, nb1] = self.dims;
        let [a0, a1, am, ak] = self.a;
        let [b0, b1, bk, bn] = self.b;
        let implicit = match &self.conv {
            None => "#define IMPLICIT 0\n".to_string(),
            Some(c) => {
                let ([kh, kw], [sh, sw], [dh, dw]) = (c.kernel, c.stride, c.dilation);
                let ([pt, pl], [h, w], [sc, sy, sx]) = (c.padding, c.input, c.strides);
                format!(
                    "#define IMPLICIT 1\n#define WO {}\n#define KK {}\n#define KW {kw}\n\
                     #define SH {sh}\n#define SW {sw}\n#define DH {dh}\n#define DW {dw}\n\
                     #define PT {pt}\n#define PL {pl}\n#define XH {h}\n#define XW {w}\n\
                     #define SXC {sc}LL\n#define SXH {sy}LL\n#define SXW {sx}LL\n",
                    c.wo,
                    kh * kw,
                )
            }
        };
        let [tile_m, tile_n, tile_k] = self.tile;
        let copies = match self.copies {
            None => "#define ASYNC 0\n".to_string(),
            Some([va, vb]) => format!("#define ASYNC 1\n#define VA {va}\n#define VB {vb}\n"),
        };
        format!(
            "#define BM {tile_m}\n#define BN {tile_n}\n#define BK {tile_k}\n\
             #define GM {m}\n#define GN {n}\n#define GK {k}\n#define NB1 {nb1}\n\
             #define SA0 {a0}LL\n#define SA1 {a1}LL\n#define SAM {am}LL\n#define SAK {ak}LL\n\
             #define SB0 {b0}LL\n#define SB1 {b1}LL\n#define SBK {bk}LL\n#define SBN {bn}LL\n\
             #define A_K_INNER {}\n#define B_K_INNER {}\n{implicit}{copies}{SOURCE}",
            ak == 1,
            bk == 1 || self.conv.is_some(),
        )
    }
}

/// `lhs · rhs` for FP32 `[.., m, k]` by `[.., k, n]` of rank 3 or 4 with the same batch axes,
/// any strides, into a new contiguous FP32 `[.., m, n]`, as `form` says; `None` for other
/// dtypes, ranks or batch shapes.
pub fn matmul(lhs: &CubeTensor, rhs: &CubeTensor, form: Form) -> Option<CubeTensor> {
    let (ls, rs) = (lhs.meta.shape().to_vec(), rhs.meta.shape().to_vec());
    let rank = ls.len();
    let f32s = lhs.dtype == DType::F32 && rhs.dtype == DType::F32;
    if !f32s || !(3..=4).contains(&rank) || rs.len() != rank || ls[..rank - 2] != rs[..rank - 2] {
        return None;
    }
    let (m, k, n) = (ls[rank - 2], ls[rank - 1], rs[rank - 1]);
    if rs[rank - 2] != k || m == 0 || n == 0 || k == 0 {
        return None;
    }
    // Batch axes as two: `[1, b]` for rank 3.
    let four = |shape: &[usize], strides: &[usize]| -> ([usize; 2], [usize; 4]) {
        if rank == 4 {
            (
                [shape[0], shape[1]],
                [strides[0], strides[1], strides[2], strides[3]],
            )
        } else {
            ([1, shape[0]], [0, strides[0], strides[1], strides[2]])
        }
    };
    let (batch, a) = four(&ls[..], &lhs.meta.strides()[..]);
    let (_, b) = four(&rs[..], &rhs.meta.strides()[..]);
    let batches = batch[0] * batch[1];
    // A grid's z extent is at most 65,535 blocks.
    if batches > 65_535 {
        return None;
    }
    let offset = |t: &CubeTensor| t.handle.offset_start.unwrap_or(0);
    // B's strides as `[.., rows, k]` (its rows are the product's columns).
    let b_rows = [b[0], b[1], b[3], b[2]];
    let problem = Problem {
        dims: [m, n, k, batch[1]],
        a,
        b,
        conv: None,
        tile: tile(m, n, form),
        copies: (form == Form::Async)
            .then(|| [vector(a, offset(lhs)), vector(b_rows, offset(rhs))]),
    };
    let mut shape = ls[..rank - 2].to_vec();
    shape.extend([m, n]);
    Some(launch(problem, lhs, rhs, shape, batches))
}

/// A weight gradient's chunked product with its columns read from the convolution's input
/// instead of written first (`IMPLICIT`): `grad` the output gradient's chunks `[N, S, co, L]`
/// (any strides), `x` the FP32 input `[N, ci, H, W]` (any strides), `kernel` and `out` the
/// kernel's and the output's height and width; `[N, S, co, ci·kh·kw]` in FP32, chunk `s` of
/// image `n` being `Σ_l grad[n, s, o, l] · cols[n, (c, i, j), s·L + l]`. `None` for other
/// dtypes or shapes, and for grouped convolutions.
pub fn weight_grad_implicit(
    grad: &CubeTensor,
    x: &CubeTensor,
    kernel: [usize; 2],
    out: [usize; 2],
    options: &burn::backend::ops::ConvOptions<2>,
) -> Option<CubeTensor> {
    let (gs, xs) = (grad.meta.shape().to_vec(), x.meta.shape().to_vec());
    let f32s = grad.dtype == DType::F32 && x.dtype == DType::F32;
    if !f32s || gs.len() != 4 || xs.len() != 4 || gs[0] != xs[0] || options.groups != 1 {
        return None;
    }
    let (n, s, co, l) = (gs[0], gs[1], gs[2], gs[3]);
    if s * l != out[0] * out[1] || n * s * co * l == 0 || n * s > 65_535 {
        return None;
    }
    let cols = xs[1] * kernel[0] * kernel[1];
    let (gst, xst) = (grad.meta.strides(), x.meta.strides());
    let problem = Problem {
        dims: [co, cols, l, s],
        a: [gst[0], gst[1], gst[2], gst[3]],
        b: [xst[0], 0, 0, 0],
        conv: Some(Columns {
            wo: out[1],
            kernel,
            stride: options.stride,
            dilation: options.dilation,
            padding: [options.padding[0].0, options.padding[1].0],
            input: [xs[2], xs[3]],
            strides: [xst[1], xst[2], xst[3]],
        }),
        tile: TILE,
        copies: None,
    };
    Some(launch(problem, grad, x, vec![n, s, co, cols], n * s))
}

/// Launches `problem` on `a` and `b` into a new contiguous FP32 output of `shape`.
fn launch(
    problem: Problem,
    a: &CubeTensor,
    b: &CubeTensor,
    shape: Vec<usize>,
    batches: usize,
) -> CubeTensor {
    let [m, n, _, _] = problem.dims;
    let [bm, bn, _] = problem.tile;
    let count = CubeCount::Static(n.div_ceil(bn) as u32, m.div_ceil(bm) as u32, batches as u32);
    cuda_source::launch(problem, count, &[a, b], Shape::from(shape), DType::F32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuda_source::Problem as _;

    /// The constants come first, in the names the source reads, and a K-contiguous operand is
    /// marked so.
    #[test]
    fn the_source_starts_with_the_problem() {
        let p = Problem {
            dims: [85, 765, 640, 10],
            a: [544_000, 640, 6_400, 1],
            b: [4_896_000, 489_600, 1, 640],
            conv: None,
            tile: tile(85, 765, Form::Wide),
            copies: None,
        };
        let s = p.source();
        assert!(s.starts_with(
            "#define BM 128\n#define BN 128\n#define BK 16\n\
             #define GM 85\n#define GN 765\n#define GK 640\n#define NB1 10\n"
        ));
        assert!(s.contains("#define SAM 6400LL\n#define SAK 1LL\n"));
        assert!(s.contains(
            "#define A_K_INNER true\n#define B_K_INNER true\n#define IMPLICIT 0\n#define ASYNC 0\n"
        ));
        assert!(s.contains(&format!(
            "extern \"C\" __global__ void __launch_bounds__(THREADS)\n{}(",
            Problem::ENTRY
        )));
        let q = Problem {
            b: [0, 0, 765, 1],
            ..p
        };
        assert!(q.source().contains("#define B_K_INNER false\n"));
    }

    /// Wide tiles only along the axes longer than 64, K steps of 16 with them; a warp per
    /// 32 × 32 of the tile.
    #[test]
    fn wide_tiles_follow_the_product() {
        assert_eq!(tile(85, 765, Form::Plain), TILE);
        assert_eq!(tile(64, 64, Form::Wide), TILE);
        assert_eq!(tile(85, 27, Form::Wide), [128, 64, 16]);
        assert_eq!(tile(16, 765, Form::Wide), [64, 128, 16]);
        assert_eq!(tile(256, 2304, Form::Wide), [128, 128, 16]);
        assert_eq!(tile(256, 2304, Form::Async), [64, 64, 16]);
        assert_eq!(threads(TILE), 128);
        assert_eq!(threads([128, 128, 16]), 512);
    }

    /// 16-byte copies only along a contiguous axis whose other strides keep every chunk of 4
    /// aligned, from an aligned first value.
    #[test]
    fn vector_copies_need_alignment() {
        // K contiguous, rows 640 apart: 4 at a time.
        assert_eq!(vector([0, 40_960, 640, 1], 0), 4);
        // Rows contiguous (a channels-last output gradient of 64 channels).
        assert_eq!(vector([409_600, 40_960, 1, 64], 1_024), 4);
        // 85 channels: a chunk of 4 would straddle rows' alignment.
        assert_eq!(vector([544_000, 54_400, 1, 85], 0), 1);
        // A batch stride off the alignment, an offset off 16 bytes, no contiguous axis.
        assert_eq!(vector([6, 40_960, 640, 1], 0), 1);
        assert_eq!(vector([0, 40_960, 640, 1], 8), 1);
        assert_eq!(vector([0, 40_960, 640, 2], 0), 1);
    }

    /// The asynchronous form says so, with its copies' widths, after the problem's constants.
    #[test]
    fn the_async_form_names_its_copies() {
        let p = Problem {
            dims: [64, 576, 512, 12],
            a: [393_216, 32_768, 1, 64],
            b: [3_538_944, 294_912, 1, 512],
            conv: None,
            tile: tile(64, 576, Form::Async),
            copies: Some([4, 1]),
        };
        let s = p.source();
        assert!(s.starts_with("#define BM 64\n#define BN 64\n#define BK 16\n"));
        assert!(s.contains("#define IMPLICIT 0\n#define ASYNC 1\n#define VA 4\n#define VB 1\n"));
    }
}
