//! Our convolution operands on CUDA (`model::ops::channels`, `model::ops::conv::gemm`): the
//! channels-last casts, one unit per value and through tiles, plain and zero-dilated, put every
//! value in its place; the data gradient's swapped weight operand written beside the forward's
//! gives the bits of the one the data gradient copies itself.

use super::{cuda, values};
use burn::prelude::*;
use burn::tensor::{Distribution, FloatDType};
/// The data gradient's weight operand written beside the forward's
/// (`conv::gemm::weight_operand` with `data_grad`) gives the bits of the one the data gradient
/// copies itself, at stride 1 and 2 (by GEMM over the dilated gradient), 1×1, and with padded
/// channels; a wrong swapped operand of the same form changes the result (so it is read), and
/// without `data_grad` none is made.
#[test]
#[ignore = "needs a CUDA GPU"]
fn the_swapped_weight_operand_gives_the_copied_ones_bits_on_cuda() {
    use burn::backend::ops::ConvOptions;
    use burnpose::model::ops::conv::gemm;
    let d = cuda();
    d.seed(29);
    let bf16 = FloatDType::BF16;
    let cube = super::cube::<4>;
    for (ci, co, k, st, hw) in [
        (85, 85, 3, 1, 37),
        (64, 128, 3, 2, 41),
        (16, 32, 3, 2, 37),
        (48, 64, 1, 1, 23),
    ] {
        let what = format!("{ci}->{co} k{k} s{st} {hw}px");
        let options = ConvOptions::new([st, st], [k / 2, k / 2], [1, 1], 1);
        let normal = || Distribution::Normal(0.0, 1.0);
        let x = Tensor::<4>::random([3, ci, hw, hw], normal(), &d);
        let weight = Tensor::<4>::random([co, ci, k, k], normal(), &d);
        let ho = (hw + 2 * (k / 2) - k) / st + 1;
        let grad = Tensor::<4>::random([3, co, ho, ho], normal(), &d);
        let (operand, swapped) = gemm::weight_operand(cube(weight.clone()), &options, bf16, true);
        let swapped = swapped.unwrap_or_else(|| panic!("{what}: no swapped operand made"));
        let (_, wrong) = gemm::weight_operand(cube(weight.clone() * 2.0), &options, bf16, true);
        let dx = |swapped: Option<burn_cubecl::tensor::CubeTensor>| {
            let operands = [Some(operand.clone()), swapped, None];
            let dx = gemm::x_backward_with(
                cube(x.clone()),
                cube(weight.clone()),
                operands,
                cube(grad.clone()),
                options.clone(),
                bf16,
            );
            super::cube_values(dx)
        };
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        let (given, copied) = (dx(Some(swapped)), dx(None));
        assert!(
            given.iter().any(|v| *v != 0.0),
            "{what}: data gradient all zero"
        );
        assert_eq!(bits(given.clone()), bits(copied), "{what}: other bits");
        assert_ne!(
            bits(dx(wrong)),
            bits(given),
            "{what}: the swapped operand is not read"
        );
        let (_, none) = gemm::weight_operand(cube(weight), &options, bf16, false);
        assert!(none.is_none(), "{what}: made without data_grad");
    }
}

/// `channels::channels_last`, one unit per value and (`channels::choose_tiled`) through tiles
/// for inputs whose pixels lie in rows: every value is the input's cast at its channels-last
/// place and every padded channel or image is zero, at pixel and channel counts off the 32 × 32
/// tiles, from FP32 and BF16, into BF16 and FP32, from a channel slice of a wider tensor (rows,
/// not contiguous) and from a channels-last input; and `dilated_channels_last` (a strided
/// convolution's output gradient spread out by its stride) the same way, with its last rows
/// and columns past the input's.
#[test]
#[ignore = "needs a CUDA GPU"]
fn channels_last_casts_put_every_value_in_its_place_on_cuda() {
    use burn::tensor::DType;
    use burnpose::model::ops::channels;
    let d = cuda();
    d.seed(31);
    let cube = super::cube::<4>;
    for ([n, c, h, w], [n2, c2], from, to) in [
        ([3, 85, 37, 29], [3, 88], FloatDType::F32, DType::BF16),
        ([4, 64, 80, 80], [4, 64], FloatDType::F32, DType::BF16),
        ([2, 3, 65, 65], [3, 8], FloatDType::F32, DType::BF16),
        ([1, 130, 5, 7], [1, 136], FloatDType::BF16, DType::F32),
        ([2, 40, 9, 11], [2, 33], FloatDType::F32, DType::F32),
    ] {
        let what = format!("{n}x{c}x{h}x{w} {from:?} -> {n2}x{c2} {to:?}");
        let wide =
            Tensor::<4>::random([n, c + 5, h, w], Distribution::Normal(0.0, 1.0), &d).cast(from);
        let x = wide.clone().slice([0..n, 2..c + 2, 0..h, 0..w]);
        let nhwc = Tensor::<4>::from_data(x.clone().permute([0, 2, 3, 1]).to_data(), &d)
            .permute([0, 3, 1, 2]);
        let expected = {
            // Burn's cast to `to` and back: the value the operand must hold.
            let v = match to {
                DType::BF16 => x.clone().cast(FloatDType::BF16),
                _ => x.clone(),
            };
            let v = values(v.cast(FloatDType::F32));
            let mut e = vec![0f32; n2 * c2 * h * w];
            for i in 0..n.min(n2) {
                for k in 0..c.min(c2) {
                    for p in 0..h * w {
                        e[(i * c2 + k) * h * w + p] = v[(i * c + k) * h * w + p];
                    }
                }
            }
            e
        };
        let inputs = [
            (false, &x, "rows"),
            (true, &x, "rows, tiled"),
            (true, &nhwc, "NHWC"),
        ];
        for (tiled, input, layout) in inputs {
            channels::choose_tiled(tiled);
            let out = channels::channels_last(cube(input.clone()), n2, c2, to);
            channels::choose_tiled(false);
            assert_eq!(out.dtype, to, "{what} {layout}");
            let strides = out.meta.strides().to_vec();
            assert_eq!(strides[1], 1, "{what} {layout}: not channels-last");
            let got = super::cube_values(out);
            let bad = got
                .iter()
                .zip(&expected)
                .filter(|(a, b)| a.to_bits() != b.to_bits());
            assert_eq!(bad.count(), 0, "{what} {layout}: values out of place");
        }
    }
    for ([n, c, h, w], stride, size) in [
        ([3usize, 32, 21, 21], [2usize, 2], [41usize, 41]),
        ([2, 16, 19, 20], [2, 2], [38, 40]),
        ([1, 85, 10, 10], [2, 1], [20, 11]),
    ] {
        let what = format!("{n}x{c}x{h}x{w} by {stride:?} into {size:?}");
        let x = Tensor::<4>::random([n, c, h, w], Distribution::Normal(0.0, 1.0), &d);
        let c2 = c.next_multiple_of(8);
        let v = values(x.clone().cast(FloatDType::BF16).cast(FloatDType::F32));
        let [sh, sw] = size;
        let mut expected = vec![0f32; n * c2 * sh * sw];
        for i in 0..n {
            for k in 0..c {
                for (y, x) in (0..h).flat_map(|y| (0..w).map(move |x| (y, x))) {
                    let (oy, ox) = (y * stride[0], x * stride[1]);
                    if oy < sh && ox < sw {
                        expected[((i * c2 + k) * sh + oy) * sw + ox] =
                            v[((i * c + k) * h + y) * w + x];
                    }
                }
            }
        }
        for tiled in [false, true] {
            channels::choose_tiled(tiled);
            let out =
                channels::dilated_channels_last(cube(x.clone()), n, c2, DType::BF16, stride, size);
            channels::choose_tiled(false);
            let got = super::cube_values(out);
            let bad = got
                .iter()
                .zip(&expected)
                .filter(|(a, b)| a.to_bits() != b.to_bits());
            assert_eq!(bad.count(), 0, "{what} tiled {tiled}: values out of place");
        }
    }
}
