//! What the loops of ours that run on the host share (`cpu*.rs`, `wgrad::host_weight_backward`):
//! FP32 values of CPU (burn-flex) tensors as slices and back, fixed-order lane sums, a
//! convolution plane's geometry, and the AVX2 + FMA dispatch of a loop.

use burn::backend::ops::ConvOptions;
use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Flex, Shape, TensorData};
use std::borrow::Cow;

/// A tensor's FP32 values in order: borrowed when they lie contiguous, a copy otherwise. The
/// caller has checked that the tensor is FP32.
pub fn values(t: &FloatTensor<Flex>) -> Cow<'_, [f32]> {
    match t.as_slice::<f32>() {
        Some(v) => Cow::Borrowed(v),
        None => Cow::Owned(t.to_contiguous().as_slice::<f32>().unwrap().to_vec()),
    }
}

/// A CPU tensor of `shape` holding `values`.
pub fn tensor(values: Vec<f32>, shape: impl Into<Shape>) -> FloatTensor<Flex> {
    Flex::float_from_data(TensorData::new(values, shape.into()), &Default::default())
}

/// Partial sums per reduction of our loops: wide enough for 16-lane vectors, summed pairwise at
/// the end ([`total`]).
pub(super) const LANES: usize = 16;

/// The lanes summed pairwise in a fixed tree.
#[inline(always)]
pub(super) fn total<T: Copy + std::ops::AddAssign>(mut acc: [T; LANES]) -> T {
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            acc[i] += acc[i + width];
        }
    }
    acc[0]
}

/// A 2-D convolution's plane sizes for our loops (`cpu_depthwise`, `cpu_few_channels`):
/// input `H × W`, kernel `kh × kw`, output `Ho × Wo`, stride, dilation and the padding before the
/// first row and column (after is implied by the output size).
#[derive(Clone, Copy, Debug)]
pub(super) struct Geometry {
    pub input: [usize; 2],
    pub kernel: [usize; 2],
    pub output: [usize; 2],
    pub stride: [usize; 2],
    pub dilation: [usize; 2],
    pub before: [usize; 2],
}

impl Geometry {
    /// From `[N, C, H, W]` input, `[C_out, C_in, kh, kw]` weight and `[N, C_out, Ho, Wo]` output
    /// shapes.
    pub fn new(input: &Shape, weight: &Shape, output: &Shape, options: &ConvOptions<2>) -> Self {
        let [(top, _), (left, _)] = options.padding;
        Self {
            input: [input[2], input[3]],
            kernel: [weight[2], weight[3]],
            output: [output[2], output[3]],
            stride: options.stride,
            dilation: options.dilation,
            before: [top, left],
        }
    }

    /// A forward convolution's geometry and output shape `[N, C_out, Ho, Wo]` from its input and
    /// weight shapes; `None` where a dilated kernel is wider than the padded input (Burn's error
    /// to report, not ours).
    pub fn forward(
        input: &Shape,
        weight: &Shape,
        options: &ConvOptions<2>,
    ) -> Option<(Self, Shape)> {
        let len = |axis: usize| {
            let (s, d) = (options.stride[axis], options.dilation[axis]);
            super::conv::checked_output_len(
                input[2 + axis],
                weight[2 + axis],
                options.padding[axis],
                s,
                d,
            )
        };
        let output = Shape::new([input[0], weight[0], len(0)?, len(1)?]);
        Some((Self::new(input, weight, &output, options), output))
    }

    /// Values of an input plane, of an output plane, and taps of the kernel.
    pub fn input_plane(&self) -> usize {
        self.input[0] * self.input[1]
    }
    pub fn output_plane(&self) -> usize {
        self.output[0] * self.output[1]
    }
    pub fn taps(&self) -> usize {
        self.kernel[0] * self.kernel[1]
    }

    /// Tap `k` along `axis`: the input index of output `o` is `o · stride + offset`, inside the
    /// input for `o` in the returned range.
    #[inline(always)]
    pub fn tap(&self, axis: usize, k: usize) -> (isize, usize, usize) {
        let offset = (k * self.dilation[axis]) as isize - self.before[axis] as isize;
        let (s, len) = (self.stride[axis], self.input[axis]);
        let first = if offset >= 0 {
            0
        } else {
            offset.unsigned_abs().div_ceil(s)
        };
        let end = if offset >= len as isize {
            0
        } else {
            ((len as isize - offset) as usize).div_ceil(s)
        };
        (offset, first, end.min(self.output[axis]))
    }
}

/// Defines `fn $name` whose body runs compiled for AVX2 + FMA where the machine has them (the
/// body and everything it calls are `#[inline(always)]`, so they take the caller's target
/// features) and as baseline code otherwise.
macro_rules! dispatched {
    ($(#[$meta:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        #[allow(clippy::too_many_arguments)]
        fn $name($($arg: $ty),*) $(-> $ret)? {
            #[allow(clippy::too_many_arguments)]
            #[inline(always)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[allow(clippy::too_many_arguments)]
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                    // SAFETY: the features `avx2` was compiled for are present.
                    return unsafe { avx2($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}
pub(super) use dispatched;

/// The CPU loops' tests: a tensor of `shape` with values uniform in `(−scale, scale)`, and a
/// tensor's values as bits.
#[cfg(test)]
pub(super) mod testing {
    use super::{Flex, FloatTensor, tensor, values};
    use rand::{Rng, rngs::StdRng};

    pub fn random(shape: [usize; 4], scale: f32, rng: &mut StdRng) -> FloatTensor<Flex> {
        let n = shape.iter().product();
        tensor(
            (0..n).map(|_| rng.random_range(-scale..scale)).collect(),
            shape,
        )
    }

    pub fn bits(t: &FloatTensor<Flex>) -> Vec<u32> {
        values(t).iter().map(|v| v.to_bits()).collect()
    }
}
