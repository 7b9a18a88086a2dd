//! The forward of a convolution with few input channels (the stem: 3 → 16, stride 2) on the CPU.
//! burn-flex takes these (≤ 4 input and ≤ 16 output channels, no groups) to its small-channel
//! path, which accumulates whole planes tap by tap; at stride 2 its inner loop strides through
//! the input and does not vectorise: 4.8 ms of a `pose_nano` step's forward and ~7 % of a CPU
//! `predict` at 640 px (docs/perf_log.md BA6). This computes the same sums in the same order
//! (per output value: input channels, then kernel rows, then kernel columns, each term `w · x`
//! rounded, then added; padding taps skipped), so **the same bits**, but first splits each input
//! row into its `stride` column phases, so that every tap of an output row is one contiguous,
//! vectorised run.

use super::host::{Geometry, dispatched, tensor, values};
use burn::backend::ops::ConvOptions;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Flex, TensorMetadata};
use burn::tensor::DType;

/// burn-flex's small-channel limits (`SMALL_CHANNEL_IN_THRESHOLD`, `..._OUT_THRESHOLD`): the
/// convolutions whose order of sums this reproduces.
const MAX_IN: usize = 4;
const MAX_OUT: usize = 16;

/// A convolution of FP32 `x` `[N, C, H, W]` by `weight` `[C_out, C, kh, kw]` that burn-flex
/// runs on its small-channel path, with its bits. `None` for others (its 1×1 and depthwise paths
/// come first), for asymmetric padding and for non-finite weights (where burn-flex marks padded
/// outputs NaN afterwards).
pub fn forward(
    x: &FloatTensor<Flex>,
    weight: &FloatTensor<Flex>,
    options: &ConvOptions<2>,
) -> Option<FloatTensor<Flex>> {
    let (xs, ws) = (x.shape(), weight.shape());
    let f32s = x.dtype() == DType::F32 && weight.dtype() == DType::F32;
    let [(top, bottom), (left, right)] = options.padding;
    // burn-flex checks its 1×1 path (stride 1, no padding) and its depthwise path (one input
    // and one output channel here) before the small-channel one.
    let pointwise = ws[2] == 1 && ws[3] == 1 && options.stride == [1, 1] && top == 0 && left == 0;
    let depthwise = xs[1] == 1 && ws[0] == 1;
    let takes = f32s
        && options.groups == 1
        && (1..=MAX_IN).contains(&xs[1])
        && (1..=MAX_OUT).contains(&ws[0])
        && !pointwise
        && !depthwise
        && top == bottom
        && left == right;
    if !takes {
        return None;
    }
    let w = values(weight);
    if w.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let (g, shape) = Geometry::forward(&xs, &ws, options)?;
    let (c, co) = (xs[1], ws[0]);
    let (plane, out_plane, taps) = (g.input_plane(), g.output_plane(), g.taps());
    let columns = column_runs(&g);
    let xv = values(x);
    let mut y = vec![0f32; shape.num_elements()];
    let mut phases = Phases::new(g, c);
    for (b, y) in y.chunks_exact_mut(co * out_plane).enumerate() {
        phases.load(&xv[b * c * plane..][..c * plane]);
        for (o, y) in y.chunks_exact_mut(out_plane).enumerate() {
            let w = &w[o * c * taps..][..c * taps];
            plane_sums(&phases.values, w, c, &columns, y, g);
        }
    }
    Some(tensor(y, shape))
}

/// For each kernel column `j`: the outputs `first..end` whose input column `ow · s + offset`
/// lies in the row, and where output `first`'s input sits in a row of [`Phases`] (its column
/// phase's start plus its place in the phase); `None` where no output reads inside the row.
fn column_runs(g: &Geometry) -> Vec<Option<(usize, usize, usize)>> {
    let s = g.stride[1];
    (0..g.kernel[1])
        .map(|j| {
            let (offset, first, end) = g.tap(1, j);
            if first >= end {
                return None;
            }
            let phase = offset.rem_euclid(s as isize) as usize;
            let before: usize = (0..phase).map(|r| (g.input[1] + s - 1 - r) / s).sum();
            let start = before + (first as isize + offset.div_euclid(s as isize)) as usize;
            Some((start, first, end))
        })
        .collect()
}

/// Each input channel's rows with their columns regrouped by phase: row `ih` of channel `ci`
/// holds phase 0, then phase 1, … (`W` values in all).
struct Phases {
    g: Geometry,
    values: Vec<f32>,
}

impl Phases {
    fn new(g: Geometry, channels: usize) -> Self {
        let values = vec![0f32; channels * g.input[0] * g.input[1]];
        Self { g, values }
    }

    fn load(&mut self, x: &[f32]) {
        let (s, w) = (self.g.stride[1], self.g.input[1]);
        for (dst, src) in self.values.chunks_exact_mut(w).zip(x.chunks_exact(w)) {
            let mut at = 0;
            for r in 0..s {
                for v in src.iter().skip(r).step_by(s) {
                    dst[at] = *v;
                    at += 1;
                }
            }
        }
    }
}

dispatched! {
    /// One output plane `y` (zeros): for each input channel, output row, kernel row and kernel
    /// column, `y[ow] = y[ow] + w · x[ow · s + kw · d − pad]` over the outputs whose input lies
    /// inside the row ([`column_runs`]), read from the tap's column phase as a contiguous run.
    fn plane_sums(
        phases: &[f32],
        w: &[f32],
        channels: usize,
        columns: &[Option<(usize, usize, usize)>],
        y: &mut [f32],
        g: Geometry,
    ) {
        let ([h, width], [kh, kw], [_, wo]) = (g.input, g.kernel, g.output);
        for ci in 0..channels {
            for (oh, row) in y.chunks_exact_mut(wo).enumerate() {
                for i in 0..kh {
                    let (offset, oh0, oh1) = g.tap(0, i);
                    if oh < oh0 || oh >= oh1 {
                        continue;
                    }
                    let ih = ((oh * g.stride[0]) as isize + offset) as usize;
                    let line = &phases[(ci * h + ih) * width..][..width];
                    for (j, run) in columns.iter().enumerate() {
                        let Some((start, first, end)) = *run else {
                            continue;
                        };
                        let wt = w[(ci * kh + i) * kw + j];
                        let src = &line[start..start + (end - first)];
                        for (o, &v) in row[first..end].iter_mut().zip(src) {
                            *o += wt * v;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::host::testing::{bits, random};
    use super::*;
    use burn::backend::ops::ModuleOps;
    use rand::{SeedableRng, rngs::StdRng};

    /// burn-flex's bits, value for value, at 1 to 4 input and up to 16 output channels, strides
    /// 1, 2, 3 and (2, 1), odd sizes, kernels 1 (strided), 3 and 5, padding 0 to 2 and dilation 2.
    #[test]
    fn equals_burn_flex_bit_for_bit() {
        let mut rng = StdRng::seed_from_u64(5);
        // (batch, c_in, c_out, h, w, k, stride, padding, dilation)
        type Case = (
            usize,
            usize,
            usize,
            usize,
            usize,
            usize,
            [usize; 2],
            usize,
            usize,
        );
        let cases: [Case; 8] = [
            (2, 3, 16, 19, 13, 3, [2, 2], 1, 1),
            (4, 3, 16, 64, 64, 3, [2, 2], 1, 1),
            (1, 1, 5, 9, 8, 3, [1, 1], 1, 1),
            (3, 4, 7, 10, 11, 5, [2, 2], 2, 1),
            (2, 2, 3, 12, 9, 3, [1, 1], 2, 2),
            (1, 3, 4, 6, 7, 1, [2, 2], 0, 1),
            (1, 3, 8, 11, 10, 3, [3, 3], 1, 1),
            (2, 3, 6, 9, 12, 3, [2, 1], 1, 1),
        ];
        for (n, c, co, h, w, k, s, p, d) in cases {
            let what = format!("n{n} c{c}→{co} {h}×{w} k{k} s{s:?} p{p} d{d}");
            let options = ConvOptions::new(s, [p, p], [d, d], 1);
            let x = random([n, c, h, w], 1.0, &mut rng);
            let weight = random([co, c, k, k], 1.0, &mut rng);
            let ours = forward(&x, &weight, &options).expect(&what);
            let theirs = Flex::conv2d(x, weight, None, options);
            assert_eq!(ours.shape(), theirs.shape(), "{what}: shape");
            assert_eq!(bits(&ours), bits(&theirs), "{what}: bits");
        }
    }

    /// Declined: more channels than burn-flex's small-channel path takes, asymmetric padding,
    /// non-finite weights, other dtypes.
    #[test]
    fn other_convolutions_are_declined() {
        let mut rng = StdRng::seed_from_u64(6);
        let options = ConvOptions::new([1, 1], [1, 1], [1, 1], 1);
        let x = random([1, 3, 6, 6], 1.0, &mut rng);
        assert!(
            forward(
                &random([1, 5, 6, 6], 1.0, &mut rng),
                &random([4, 5, 3, 3], 1.0, &mut rng),
                &options
            )
            .is_none()
        );
        assert!(forward(&x, &random([17, 3, 3, 3], 1.0, &mut rng), &options).is_none());
        let pointwise = ConvOptions::new([1, 1], [0, 0], [1, 1], 1);
        assert!(forward(&x, &random([4, 3, 1, 1], 1.0, &mut rng), &pointwise).is_none());
        let single = random([1, 1, 6, 6], 1.0, &mut rng);
        assert!(forward(&single, &random([1, 1, 3, 3], 1.0, &mut rng), &options).is_none());
        let lopsided = ConvOptions::new_with_padding([1, 1], [(1, 0), (1, 1)], [1, 1], 1);
        assert!(forward(&x, &random([4, 3, 3, 3], 1.0, &mut rng), &lopsided).is_none());
        let mut w = values(&random([4, 3, 3, 3], 1.0, &mut rng)).to_vec();
        w[7] = f32::INFINITY;
        assert!(forward(&x, &tensor(w, [4, 3, 3, 3]), &options).is_none());
        let half = <Flex as burn::backend::ops::FloatTensorOps<Flex>>::float_cast(
            x.clone(),
            burn::tensor::FloatDType::F16,
        );
        assert!(forward(&half, &random([4, 3, 3, 3], 1.0, &mut rng), &options).is_none());
        assert!(forward(&x, &random([4, 3, 3, 3], 1.0, &mut rng), &options).is_some());
    }
}
