//! Convolution weight gradients as explicit im2col + batched matmul, accumulated in FP32 (on
//! CUDA the matmul rounds its FP32 operands to TF32 on the tensor cores, docs/kernels.md).
//!
//! The weight gradient sums over every output pixel of the batch (up to 409,600 terms per weight
//! at 640 px). On the H200 Burn 0.22.1's direct kernel accumulates that sum in the element type
//! (BF16: 98 % error on the first layer) and CubeCL's implicit-GEMM weight gradient was wrong for a
//! stride-2 3×3 layer even in FP32 (docs/kernels.md). Here the sum is split into chunks of ~1k
//! pixels that run as separate matmul batches (so a 32×144 result still fills the GPU), then the
//! chunks are summed with a non-atomic reduction: deterministic, FP32 throughout.

use super::host::{tensor, values};
use burn::backend::ops::{ConvOptions, FloatTensorOps};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, DType, Flex, FloatDType, Shape, Slice, TensorMetadata};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Output pixels per matmul batch, at least, unless [`choose_chunk`] chose a fixed count: by
/// the map's pixels per image ([`by_size`]).
static CHOSEN_CHUNK: AtomicUsize = AtomicUsize::new(0);

/// Splits every later weight gradient of this process into matmul batches of at least `pixels`
/// output pixels (`bench-step --wgrad-chunk`, `bench-conv --wgrad-chunk`) instead of a count by
/// the map's size: fewer pixels make more batches, hence more of the GPU busy on small layers,
/// and a longer sum of the batches after. The chunks change the order of the additions, hence
/// the last bits.
pub fn choose_chunk(pixels: usize) -> Result<(), String> {
    if pixels == 0 {
        return Err("the weight gradient's chunk must hold at least one pixel".into());
    }
    CHOSEN_CHUNK.store(pixels, Ordering::Relaxed);
    Ok(())
}

/// The fixed chunk in use, if [`choose_chunk`] chose one (else [`by_size`]).
pub fn chunk() -> Option<usize> {
    match CHOSEN_CHUNK.load(Ordering::Relaxed) {
        0 => None,
        c => Some(c),
    }
}

/// The chunk for a map of `pixels` output pixels per image: about 8 of its rows for a square
/// map, in powers of two. `bench-conv` on the H100 (docs/perf_log.md BD7) put the fastest
/// weight gradients of the seed shape's 40×40 maps at 256 pixels (against 1,024: up to 2.6×
/// faster), the 80×80 ones at 512, the 160×160 ones at 1,024 and the 320×320 one at 2,048;
/// 20×20 maps make one batch per image at any of them.
pub fn by_size(pixels: usize) -> usize {
    match pixels {
        0..=2_048 => 256,
        2_049..=8_192 => 512,
        8_193..=32_768 => 1_024,
        _ => 2_048,
    }
}

/// How the columns are made: [`columns`], or one kernel on CUDA (`kernels/im2col.rs`); the
/// `usize` is the number of chunks the output pixels are split into.
pub type Im2col<B> =
    fn(FloatTensor<B>, [usize; 2], [usize; 2], usize, &ConvOptions<2>) -> FloatTensor<B>;

/// How the chunks' product is multiplied: the backend's matmul, or on CUDA the chosen routine
/// (`super::matmul`).
pub type Matmul<B> = fn(FloatTensor<B>, FloatTensor<B>) -> FloatTensor<B>;

/// `[N, C, H, W]` → `[N, S, C·k·k, Ho·Wo / S]` in FP32 for `S = chunks`: for each kernel offset,
/// the input pixel it multiplies at every output position (zero outside the image), the output
/// positions split into `S` runs of consecutive ones, as tensor operations.
pub fn columns<B: Backend>(
    x: FloatTensor<B>,
    k: [usize; 2],
    out: [usize; 2],
    chunks: usize,
    options: &ConvOptions<2>,
) -> FloatTensor<B> {
    let x = B::float_cast(x, FloatDType::F32);
    let s = x.shape();
    let (n, c, h, w) = (s[0], s[1], s[2], s[3]);
    let [(top, bottom), (left, right)] = options.padding;
    let padded = if top + bottom + left + right == 0 {
        x
    } else {
        let zeros = B::float_zeros(
            Shape::new([n, c, h + top + bottom, w + left + right]),
            &x.device(),
            x.dtype().into(),
        );
        let at = [
            Slice::new(0, None, 1),
            Slice::new(0, None, 1),
            Slice::new(top as isize, Some((top + h) as isize), 1),
            Slice::new(left as isize, Some((left + w) as isize), 1),
        ];
        B::float_slice_assign(zeros, &at, x)
    };
    let [sh, sw] = options.stride;
    let [dh, dw] = options.dilation;
    let [ho, wo] = out;
    let mut taps = Vec::with_capacity(k[0] * k[1]);
    for i in 0..k[0] {
        for j in 0..k[1] {
            let (r, q) = (i * dh, j * dw);
            let at = [
                Slice::new(0, None, 1),
                Slice::new(0, None, 1),
                Slice::new(
                    r as isize,
                    Some((r + (ho - 1) * sh + 1) as isize),
                    sh as isize,
                ),
                Slice::new(
                    q as isize,
                    Some((q + (wo - 1) * sw + 1) as isize),
                    sw as isize,
                ),
            ];
            let tap = B::float_slice(padded.clone(), &at);
            taps.push(B::float_reshape(tap, Shape::new([n, c, 1, ho * wo])));
        }
    }
    chunked::<B>(B::float_cat(taps, 2), n, c * k[0] * k[1], chunks)
}

/// `t`, `n · rows · P` values read as `[N, rows, P]`, viewed as `[N, S, rows, P / S]` for
/// `S = chunks`: the positions split into `S` runs of consecutive ones (a view, no launch).
fn chunked<B: Backend>(t: FloatTensor<B>, n: usize, rows: usize, chunks: usize) -> FloatTensor<B> {
    let p = t.shape().num_elements() / (n * rows);
    let t = B::float_reshape(t, Shape::new([n, rows, p]));
    let t = B::float_reshape(t, Shape::new([n, rows, chunks, p / chunks]));
    B::float_permute(t, &[0, 2, 1, 3])
}

/// [`chunked`] for an output gradient `t` (`[N, C, H, W]`) whose memory is channels-last
/// (`[N, H·W, C]`): the same `[N, S, C, P / S]` view, reached through the NHWC permutation,
/// which is that memory read in order, so every step is a view (an NCHW view of it would be a
/// copy). The matmul reads each chunk as a transposed matrix, where the NCHW view's chunks are
/// a layout it copies first.
fn chunked_channels_last<B: Backend>(t: FloatTensor<B>, chunks: usize) -> FloatTensor<B> {
    let s = t.shape();
    let (n, c, p) = (s[0], s[1], s[2] * s[3]);
    let t = B::float_permute(t, &[0, 2, 3, 1]);
    let t = B::float_reshape(t, Shape::new([n, chunks, p / chunks, c]));
    B::float_permute(t, &[0, 1, 3, 2])
}

/// An output gradient `[N, co, H, W]` as the matmul's chunks `[N, S, co, P / S]`: through its
/// NHWC memory where `channels_last` ([`chunked_channels_last`]), else as NCHW ([`chunked`]).
fn grad_chunks<B: Backend>(
    grad: FloatTensor<B>,
    n: usize,
    co: usize,
    chunks: usize,
    channels_last: bool,
) -> FloatTensor<B> {
    if channels_last {
        chunked_channels_last::<B>(grad, chunks)
    } else {
        chunked::<B>(grad, n, co, chunks)
    }
}

/// The number of matmul batches a map of `pixels` output pixels per image is split into
/// ([`split`] by the chunk in use).
fn chunks(pixels: usize) -> usize {
    split(pixels, chunk().unwrap_or_else(|| by_size(pixels)))
}

/// The largest number of chunks ≤ `pixels / chunk` that divides `pixels` evenly.
fn split(pixels: usize, chunk: usize) -> usize {
    (1..=(pixels / chunk).max(1))
        .rev()
        .find(|&s| pixels.is_multiple_of(s))
        .unwrap_or(1)
}

/// Weight gradient of a convolution without groups, or a depthwise one (`groups` = channels),
/// in the weight's dtype, with the columns made by `im2col` and multiplied by `matmul`. Other
/// grouped convolutions return `None`.
pub fn weight_backward<B: Backend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    grad: FloatTensor<B>,
    options: &ConvOptions<2>,
    im2col: Im2col<B>,
    matmul: Matmul<B>,
) -> Option<FloatTensor<B>> {
    let how = (im2col, matmul, FloatDType::F32);
    weight_backward_in::<B>(x, weight, grad, options, how, false, |prod| {
        B::float_sum_dim(prod, 0)
    })
}

/// The operands' dtype of the weight gradients of convolutions computed in reduced precision
/// (on CUDA): FP32 (the default) or that precision itself ([`choose_reduced`]).
static REDUCED: AtomicBool = AtomicBool::new(false);

/// Gives every later weight gradient of a convolution computed in BF16 BF16 operands (`true`:
/// the columns written and the output gradient cast in BF16, products accumulated in FP32, as
/// PyTorch's autocast computes them) or FP32 ones (`false`, the default). Half the bytes and
/// twice the tensor-core rate, and the operands rounded to 8 bits of mantissa.
pub fn choose_reduced(reduced: bool) {
    REDUCED.store(reduced, Ordering::Relaxed);
}

/// Whether weight gradients take reduced operands ([`choose_reduced`]).
pub fn reduced() -> bool {
    REDUCED.load(Ordering::Relaxed)
}

/// How [`weight_backward_in`] makes the weight gradient's product: the columns, the matmul, and
/// the operands' dtype (the columns' and the output gradient's).
pub type How<B> = (Im2col<B>, Matmul<B>, FloatDType);

/// [`weight_backward`] with the matmul's operands in `operands` (the third of `how`): `im2col`
/// writes its columns in that dtype, the output gradient (and a 1×1 convolution's input) is cast
/// to it, and `matmul` multiplies them into FP32. The chunks' products (`[N·S, co, ci·k·k]`,
/// FP32) are summed over their first axis by `sum` (any shape of `co·ci·k·k` values in order;
/// the backend's `sum_dim` in [`weight_backward`]); on CUDA `sum` may write into a buffer given
/// ahead (`super::grads_into`); a depthwise convolution's sums are its own. `grad_channels_last`
/// says that `grad`'s memory is channels-last (`[N, H·W, C]`, as the fused BatchNorm's backward
/// writes it on CUDA), which the caller knows from its strides: the chunks are then views of it
/// ([`chunked_channels_last`]). A cast keeps that memory order.
#[allow(clippy::too_many_arguments)]
pub fn weight_backward_in<B: Backend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    grad: FloatTensor<B>,
    options: &ConvOptions<2>,
    (im2col, matmul, operands): How<B>,
    grad_channels_last: bool,
    sum: impl FnOnce(FloatTensor<B>) -> FloatTensor<B>,
) -> Option<FloatTensor<B>> {
    let ws = weight.shape();
    let (co, ci_g, kh, kw) = (ws[0], ws[1], ws[2], ws[3]);
    let gs = grad.shape();
    let (n, ho, wo) = (gs[0], gs[2], gs[3]);
    let ci = x.shape()[1];
    let depthwise = options.groups == ci && ci == co && ci_g == 1;
    // A depthwise weight gradient is element-wise products and sums, in FP32 only.
    if (options.groups != 1 && !depthwise) || (depthwise && operands != FloatDType::F32) {
        return None;
    }
    let dtype: FloatDType = weight.dtype().into();
    let kk = kh * kw;
    let p = ho * wo;
    let pointwise = kk == 1 && options.stride == [1, 1] && options.padding == [(0, 0), (0, 0)];
    let grad = B::float_cast(grad, operands);
    let dw = if depthwise {
        // dW[c, t] = Σ_n Σ_p dY[n, c, p] · cols[n, c, t, p]
        let cols = B::float_reshape(
            im2col(x, [kh, kw], [ho, wo], 1, options),
            Shape::new([n, ci, kk, p]),
        );
        let g = B::float_reshape(grad, Shape::new([n, co, 1, p]));
        let prod = B::float_mul(cols, g);
        let s = B::float_sum_dim(B::float_sum_dim(prod, 3), 0);
        B::float_reshape(s, Shape::new([co, 1, kh, kw]))
    } else {
        // Chunk the pixel axis: both operands `[N, S, X, L]`, dW = Σ_{N·S} dY · colsᵀ. The
        // columns are written chunk by chunk (`[N, S, ci·kk, L]` memory), so the matmul takes
        // them transposed as they lie; the pixel-major views of an `[N, X, P]` operand are a
        // layout CubeCL's matmul copies first (a chunk's rows are `P` apart, the chunks `L`).
        let s = chunks(p);
        let cols = if pointwise {
            // A 1×1 convolution's columns are its input: a view, no launch (in FP32).
            chunked::<B>(B::float_cast(x, operands), n, ci, s)
        } else {
            im2col(x, [kh, kw], [ho, wo], s, options)
        };
        let g = grad_chunks::<B>(grad, n, co, s, grad_channels_last);
        let prod = matmul(g, B::float_swap_dims(cols, 2, 3)); // [N, S, co, ci·kk]
        let prod = B::float_reshape(prod, Shape::new([n * s, co, ci * kk]));
        B::float_reshape(sum(prod), Shape::new([co, ci, kh, kw]))
    };
    Some(if dtype == FloatDType::F32 {
        dw
    } else {
        B::float_cast(dw, dtype)
    })
}

/// A weight gradient's chunked product with the columns read from the input by the product
/// itself (on CUDA `kernels/tf32_gemm.rs`, `IMPLICIT`): the output gradient's chunks
/// `[N, S, co, L]`, the FP32 input, the kernel's and the output's size → `[N, S, co, ci·kk]`;
/// `None` where it declines.
pub type Implicit<B> = fn(
    FloatTensor<B>,
    FloatTensor<B>,
    [usize; 2],
    [usize; 2],
    &ConvOptions<2>,
) -> Option<FloatTensor<B>>;

/// [`weight_backward_in`] with FP32 operands for a convolution without groups whose columns
/// `product` reads from the input itself (no columns written): the same chunks, the same sum
/// (`sum`), the same result up to the product's order of additions. `None` for grouped
/// convolutions, 1×1 ones whose columns are their input already, and where `product` declines.
pub fn implicit_weight_backward<B: Backend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    grad: FloatTensor<B>,
    options: &ConvOptions<2>,
    product: Implicit<B>,
    grad_channels_last: bool,
    sum: impl FnOnce(FloatTensor<B>) -> FloatTensor<B>,
) -> Option<FloatTensor<B>> {
    let ws = weight.shape();
    let (co, ci, kh, kw) = (ws[0], ws[1], ws[2], ws[3]);
    let gs = grad.shape();
    let (n, ho, wo) = (gs[0], gs[2], gs[3]);
    let pointwise = kh * kw == 1 && options.stride == [1, 1] && options.padding == [(0, 0), (0, 0)];
    if options.groups != 1 || pointwise {
        return None;
    }
    let s = chunks(ho * wo);
    let grad = B::float_cast(grad, FloatDType::F32);
    let g = grad_chunks::<B>(grad, n, co, s, grad_channels_last);
    let prod = product(
        g,
        B::float_cast(x, FloatDType::F32),
        [kh, kw],
        [ho, wo],
        options,
    )?;
    let prod = B::float_reshape(prod, Shape::new([n * s, co, ci * kh * kw]));
    let dw = B::float_reshape(sum(prod), Shape::new([co, ci, kh, kw]));
    Some(match weight.dtype().into() {
        FloatDType::F32 => dw,
        dtype => B::float_cast(dw, dtype),
    })
}

/// The weight gradient of a convolution without groups on the CPU, as one matmul over every
/// output pixel of the batch: `dW[co, ci·kk] = dY[co, N·P] · colsᵀ`, the columns written by one
/// loop straight into `[ci·kk, N·P]` (where [`columns`]' tensor operations took a padded copy,
/// a slice per tap and a concatenation). `None` for grouped convolutions and non-FP32 operands.
pub fn host_weight_backward(
    x: &FloatTensor<Flex>,
    weight: &FloatTensor<Flex>,
    grad: &FloatTensor<Flex>,
    options: &ConvOptions<2>,
) -> Option<FloatTensor<Flex>> {
    let f32s = [x, weight, grad].iter().all(|t| t.dtype() == DType::F32);
    if options.groups != 1 || !f32s {
        return None;
    }
    let ws = weight.shape();
    let (co, ci, kh, kw) = (ws[0], ws[1], ws[2], ws[3]);
    let xs = x.shape();
    let (n, h, w) = (xs[0], xs[2], xs[3]);
    let gs = grad.shape();
    let (ho, wo) = (gs[2], gs[3]);
    let (p, kk) = (ho * wo, kh * kw);
    let (x, grad) = (values(x), values(grad));
    let cols = host_columns(&x, [n, ci, h, w], [kh, kw], [ho, wo], options);
    // dY [N, co, P] → [co, N·P].
    let mut dy = vec![0f32; co * n * p];
    for o in 0..co {
        for b in 0..n {
            let src = &grad[(b * co + o) * p..][..p];
            dy[(o * n + b) * p..][..p].copy_from_slice(src);
        }
    }
    let dy = tensor(dy, [co, n * p]);
    let cols = Flex::float_swap_dims(tensor(cols, [ci * kk, n * p]), 0, 1);
    let dw = Flex::float_matmul(dy, cols);
    Some(Flex::float_reshape(dw, Shape::new([co, ci, kh, kw])))
}

/// `[N, C, H, W]` values → columns `[C·kh·kw, N·Ho·Wo]`: row `(c, i, j)` holds, for every
/// output pixel of every image, the input value tap `(i, j)` multiplies (zero in the padding).
fn host_columns(
    x: &[f32],
    [n, c, h, w]: [usize; 4],
    [kh, kw]: [usize; 2],
    [ho, wo]: [usize; 2],
    options: &ConvOptions<2>,
) -> Vec<f32> {
    let (p, np) = (ho * wo, n * ho * wo);
    let [(top, _), (left, _)] = options.padding;
    let [sh, sw] = options.stride;
    let [dh, dw] = options.dilation;
    let mut cols = vec![0f32; c * kh * kw * np];
    for ch in 0..c {
        for i in 0..kh {
            for j in 0..kw {
                let row = ((ch * kh + i) * kw + j) * np;
                // Input column of output column `ox`: `ox · sw + off`, inside for ox0 ≤ ox < ox1.
                let off = (j * dw) as isize - left as isize;
                let ox0 = if off >= 0 {
                    0
                } else {
                    (off.unsigned_abs()).div_ceil(sw)
                };
                let ox1 = if off >= w as isize {
                    0
                } else {
                    ((w as isize - off) as usize).div_ceil(sw).min(wo)
                };
                if ox0 >= ox1 {
                    continue;
                }
                for b in 0..n {
                    let plane = &x[(b * c + ch) * h * w..][..h * w];
                    for oy in 0..ho {
                        let iy = (oy * sh + i * dh) as isize - top as isize;
                        if iy < 0 || iy >= h as isize {
                            continue;
                        }
                        let src = &plane[iy as usize * w..][..w];
                        let dst = &mut cols[row + b * p + oy * wo..][..wo];
                        let first = (ox0 as isize * sw as isize + off) as usize;
                        if sw == 1 {
                            dst[ox0..ox1].copy_from_slice(&src[first..first + (ox1 - ox0)]);
                        } else {
                            for (k, d) in dst[ox0..ox1].iter_mut().enumerate() {
                                *d = src[first + k * sw];
                            }
                        }
                    }
                }
            }
        }
    }
    cols
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chunks of at least `chunk` pixels that split the positions evenly: by size, 80×80 maps
    /// in ten chunks of 640, 40×40 ones in five of 320, a 20×20 map in one, or in two of 200
    /// with chunks of 128.
    #[test]
    fn chunks_split_the_positions_evenly() {
        assert_eq!(split(6400, by_size(6400)), 10);
        assert_eq!(split(1600, by_size(1600)), 5);
        assert_eq!(split(400, by_size(400)), 1);
        assert_eq!(split(25_600, by_size(25_600)), 25);
        assert_eq!(split(102_400, by_size(102_400)), 50);
        assert_eq!(split(6400, 1024), 5);
        assert_eq!(split(400, 128), 2);
        assert_eq!(split(97, 8), 1, "a prime count stays whole");
        assert!(choose_chunk(0).is_err());
    }
}
