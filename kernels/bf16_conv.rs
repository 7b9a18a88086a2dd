//! A convolution without groups as an implicit GEMM of our own on the tensor cores: BF16
//! operands channels-last, FP32 accumulators, the result in FP32 or BF16 (`bf16_conv.cu`,
//! launched as `cuda_source.rs` says), and the data gradient of a stride-1 one the same way.
//! `model::ops::conv::gemm`'s forwards and data gradients take it where chosen
//! (`conv::routine::choose("own-bf16")`) and it takes the problem; cubek's routine runs the
//! rest.
//!
//! Deterministic: every output value is one thread's sum over K in order.

use super::cuda_source::{self, fnv};
use burn::backend::ops::ConvOptions;
use burn::cubecl::prelude::CubeCount;
use burn::tensor::{DType, Shape};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::permute;
use burn_cubecl::tensor::CubeTensor;

const SOURCE: &str = include_str!("bf16_conv.cu");
/// A block's output pixels and channels (`BM`, `BN` in the source).
const TILE: [usize; 2] = [128, 64];

/// One convolution's constants: `[N, H, W, C]` of the input, `[Ho, Wo]`, `[kh, kw]`, the
/// output channels, stride, dilation, top and left padding, the input's image, row and pixel
/// strides and the weight's channel, row and tap strides (elements), and the output's dtype.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Problem {
    input: [usize; 4],
    out: [usize; 2],
    kernel: [usize; 2],
    channels: usize,
    stride: [usize; 2],
    dilation: [usize; 2],
    padding: [usize; 2],
    x: [usize; 3],
    w: [usize; 3],
    out_bf16: bool,
    dgrad: bool,
}

impl cuda_source::Problem for Problem {
    const ENTRY: &'static str = "burnpose_bf16_conv";
    const SOURCE_HASH: u64 = fnv(SOURCE);

    fn threads(&self) -> u32 {
        256
    }

    fn source(&self) -> String {
        let [nb, xh, xw, cp] = self.input;
        let ([ho, wo], [kh, kw], gn) = (self.out, self.kernel, self.channels);
        let ([sh, sw], [dh, dw], [pt, pl]) = (self.stride, self.dilation, self.padding);
        let ([sxn, sxh, sxw], [swo, swi, swj]) = (self.x, self.w);
        format!(
            "#define NB {nb}\n#define XH {xh}\n#define XW {xw}\n#define CP {cp}\n\
             #define HO {ho}\n#define WO {wo}\n#define KH {kh}\n#define KW {kw}\n#define GN {gn}\n\
             #define SH {sh}\n#define SW {sw}\n#define DH {dh}\n#define DW {dw}\n\
             #define PT {pt}\n#define PL {pl}\n\
             #define SXN {sxn}LL\n#define SXH {sxh}LL\n#define SXW {sxw}LL\n\
             #define SWO {swo}LL\n#define SWI {swi}LL\n#define SWJ {swj}LL\n\
             #define OUT_BF16 {}\n#define DGRAD {}\n{SOURCE}",
            u8::from(self.out_bf16),
            u8::from(self.dgrad),
        )
    }
}

/// Whether `t` can be read 8 values (16 bytes) at a time along its channels: BF16, channels
/// contiguous and a multiple of 8, every other stride a multiple of 8, its offset 16-byte
/// aligned.
fn vectorised(t: &CubeTensor) -> bool {
    let (s, st) = (t.meta.shape(), t.meta.strides());
    t.dtype == DType::BF16
        && s.len() == 4
        && st[1] == 1
        && s[1].is_multiple_of(8)
        && [0, 2, 3].iter().all(|&i| st[i].is_multiple_of(8))
        && t.handle.offset_start.unwrap_or(0).is_multiple_of(16)
}

/// Whether an output of `pixels` × `channels` fits the kernel: its indices are 32-bit, and a
/// grid's y extent (the pixel tiles) is at most 65,535 blocks.
fn fits(pixels: usize, channels: usize) -> bool {
    pixels > 0
        && channels > 0
        && pixels
            .checked_mul(channels)
            .is_some_and(|v| v < i32::MAX as usize)
        && pixels.div_ceil(TILE[0]) <= 65_535
}

/// The convolution of `x` (`[N, C, H, W]`, channels-last memory, BF16, `C` a multiple of 8) by
/// `weight` (`[O, C, kh, kw]`, channels-last memory, BF16) without bias or groups, accumulated
/// in FP32 and written as `out` (FP32 or BF16) into a new dense `[N, Ho, Wo, O]` tensor; `None`
/// where it declines (other dtypes, layouts, groups, an output too large for its 32-bit indices
/// or its grid).
pub fn forward(
    x: &CubeTensor,
    weight: &CubeTensor,
    options: &ConvOptions<2>,
    out: DType,
) -> Option<CubeTensor> {
    let (xs, ws) = (x.meta.shape(), weight.meta.shape());
    let takes = vectorised(x)
        && vectorised(weight)
        && options.groups == 1
        && ws[1] == xs[1]
        && matches!(out, DType::F32 | DType::BF16);
    if !takes {
        return None;
    }
    let (n, c, h, w) = (xs[0], xs[1], xs[2], xs[3]);
    let (o, kh, kw) = (ws[0], ws[2], ws[3]);
    let len = |i: usize| {
        let (input, k) = (xs[2 + i], ws[2 + i]);
        let (padding, stride, dilation) =
            (options.padding[i], options.stride[i], options.dilation[i]);
        super::conv::checked_output_len(input, k, padding, stride, dilation)
    };
    let (ho, wo) = (len(0)?, len(1)?);
    if !fits(n * ho * wo, o) {
        return None;
    }
    let (xt, wt) = (x.meta.strides(), weight.meta.strides());
    let problem = Problem {
        input: [n, h, w, c],
        out: [ho, wo],
        kernel: [kh, kw],
        channels: o,
        stride: options.stride,
        dilation: options.dilation,
        padding: [options.padding[0].0, options.padding[1].0],
        x: [xt[0], xt[2], xt[3]],
        w: [wt[0], wt[2], wt[3]],
        out_bf16: out == DType::BF16,
        dgrad: false,
    };
    Some(run(problem, x, weight, out))
}

/// The data gradient of a stride-1 convolution without groups: `grad` (`[N, O, Ho, Wo]`,
/// channels-last memory, BF16, `O` a multiple of 8) and `weight` (`[O, C, kh, kw]`,
/// channels-last memory, BF16) → a new dense `[N, H, W, C]` in `out` (FP32 or BF16) for an input
/// `[C, H, W]` (`input`); `None` where it declines, before launching anything. It reads the
/// weight with its channels swapped (`[C, kh, kw, O]` memory seen as `[C, O, kh, kw]`, so that
/// K, the output channels, is its contiguous axis): `swapped` where given in that form
/// (`channels::weight_operands` writes it beside the forward's operand), else copied here.
pub fn data_grad(
    grad: &CubeTensor,
    weight: &CubeTensor,
    swapped: Option<&CubeTensor>,
    input: [usize; 3],
    options: &ConvOptions<2>,
    out: DType,
) -> Option<CubeTensor> {
    let (gs, ws) = (grad.meta.shape(), weight.meta.shape());
    let [c, h, w] = input;
    let takes = vectorised(grad)
        && vectorised(weight)
        && options.groups == 1
        && options.stride == [1, 1]
        && ws[0] == gs[1]
        && ws[1] == c
        && c.is_multiple_of(8)
        && matches!(out, DType::F32 | DType::BF16);
    if !takes || !fits(gs[0] * h * w, c) {
        return None;
    }
    let (n, o, ho, wo) = (gs[0], gs[1], gs[2], gs[3]);
    let (kh, kw) = (ws[2], ws[3]);
    // `[C, kh, kw, O]` memory, seen as `[C, O, kh, kw]`.
    let of_weight = |t: &&CubeTensor| {
        let st = t.meta.strides();
        t.dtype == weight.dtype
            && t.meta.shape().dims::<4>() == [ws[1], ws[0], kh, kw]
            && [st[0], st[1], st[2], st[3]] == [kh * kw * o, 1, kw * o, o]
    };
    let swapped = match swapped.filter(of_weight) {
        Some(s) => s.clone(),
        None => permute(
            into_contiguous(permute(weight.clone(), &[1, 2, 3, 0])),
            &[0, 3, 1, 2],
        ),
    };
    if !vectorised(&swapped) {
        return None;
    }
    let (gt, wt) = (grad.meta.strides(), swapped.meta.strides());
    let problem = Problem {
        input: [n, ho, wo, o],
        out: [h, w],
        kernel: [kh, kw],
        channels: c,
        stride: [1, 1],
        dilation: options.dilation,
        padding: [options.padding[0].0, options.padding[1].0],
        x: [gt[0], gt[2], gt[3]],
        w: [wt[0], wt[2], wt[3]],
        out_bf16: out == DType::BF16,
        dgrad: true,
    };
    Some(run(problem, grad, &swapped, out))
}

/// Launches `problem` on `x` and `weight` into a new dense `[N, rows, cols, channels]` of
/// `out`'s dtype.
fn run(problem: Problem, x: &CubeTensor, weight: &CubeTensor, out: DType) -> CubeTensor {
    let [n, _, _, _] = problem.input;
    let [h, w] = problem.out;
    let o = problem.channels;
    let count = CubeCount::Static(
        o.div_ceil(TILE[1]) as u32,
        (n * h * w).div_ceil(TILE[0]) as u32,
        1,
    );
    cuda_source::launch(problem, count, &[x, weight], Shape::new([n, h, w, o]), out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuda_source::Problem as _;

    /// The constants come first, in the names the source reads.
    #[test]
    fn the_source_starts_with_the_convolution() {
        let p = Problem {
            input: [4, 80, 80, 64],
            out: [80, 80],
            kernel: [3, 3],
            channels: 88,
            stride: [1, 1],
            dilation: [1, 1],
            padding: [1, 1],
            x: [409_600, 5_120, 64],
            w: [576, 192, 64],
            out_bf16: true,
            dgrad: false,
        };
        let s = p.source();
        assert!(s.starts_with("#define NB 4\n#define XH 80\n#define XW 80\n#define CP 64\n"));
        assert!(s.contains("#define GN 88\n"));
        assert!(s.contains("#define SWO 576LL\n#define SWI 192LL\n#define SWJ 64LL\n"));
        assert!(s.contains("#define OUT_BF16 1\n#define DGRAD 0\n"));
        assert!(s.contains(&format!("{}(", Problem::ENTRY)));
    }
}
