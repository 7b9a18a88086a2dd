//! Which convolutions a pass runs, with everything that decides the kernels CubeCL compiles for
//! them (shapes, options, dtype, which gradients), so that those kernels can be compiled before
//! the step that needs them, in other processes (`train::precompile`).

use burn::backend::ops::ConvOptions;
use burn::prelude::*;
use burn::tensor::{Distribution, FloatDType};
use std::cell::RefCell;

/// One convolution as a pass runs it through [`super::conv2d`] or [`super::conv2d_in`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvCall {
    /// `[batch, channels, height, width]` of the input.
    pub input: [usize; 4],
    /// `[c_out, c_in / groups, kernel, kernel]`.
    pub weight: [usize; 4],
    pub stride: [usize; 2],
    pub padding: [(usize, usize); 2],
    pub dilation: [usize; 2],
    pub groups: usize,
    /// The dtype it computes in when called through [`super::conv2d_in`]; `None`: FP32
    /// through [`super::conv2d`].
    pub reduced: Option<FloatDType>,
    /// Whether the pass needs the input's gradient, and the weight's.
    pub input_grad: bool,
    pub weight_grad: bool,
}

thread_local! {
    static TRACE: RefCell<Option<Vec<ConvCall>>> = const { RefCell::new(None) };
}

/// Records a convolution while [`convolutions_of`] runs on this thread; nothing otherwise.
pub(super) fn note(
    x: &Tensor<4>,
    weight: &Tensor<4>,
    options: &ConvOptions<2>,
    dtype: Option<FloatDType>,
) {
    TRACE.with(|trace| {
        if let Some(calls) = trace.borrow_mut().as_mut() {
            calls.push(ConvCall {
                input: x.dims(),
                weight: weight.dims(),
                stride: options.stride,
                padding: options.padding,
                dilation: options.dilation,
                groups: options.groups,
                reduced: dtype,
                input_grad: x.is_require_grad(),
                weight_grad: weight.is_require_grad(),
            })
        }
    });
}

/// Runs `f` and returns, with its result, the distinct convolutions it ran on this thread, in
/// the order they first ran.
pub fn convolutions_of<R>(f: impl FnOnce() -> R) -> (R, Vec<ConvCall>) {
    TRACE.with(|trace| *trace.borrow_mut() = Some(Vec::new()));
    let result = f();
    let calls = TRACE
        .with(|trace| trace.borrow_mut().take())
        .unwrap_or_default();
    let mut seen = std::collections::HashSet::new();
    let distinct = calls
        .into_iter()
        .filter(|c| seen.insert(c.clone()))
        .collect();
    (result, distinct)
}

impl ConvCall {
    /// The same convolution on an input `scale` times as high and wide, in batches of `batch`.
    pub fn resized(&self, batch: usize, scale: usize) -> Self {
        let [_, c, h, w] = self.input;
        Self {
            input: [batch, c, h * scale, w * scale],
            ..self.clone()
        }
    }

    /// Launches the convolution on random values on `device` (a plain, not an autodiff
    /// device), and its backward when it has gradients: every kernel they use gets compiled, or
    /// loaded from the kernel cache. Asynchronous: sync the device before relying on it.
    pub fn run(&self, device: &Device) {
        let grads = self.input_grad || self.weight_grad;
        let device = if grads {
            device.clone().autodiff()
        } else {
            device.clone()
        };
        let random = |dims: [usize; 4]| Tensor::<4>::random(dims, Distribution::Default, &device);
        let tracked = |t: Tensor<4>, grad: bool| if grad { t.require_grad() } else { t };
        let x = tracked(random(self.input), self.input_grad);
        let weight = tracked(random(self.weight), self.weight_grad);
        let options =
            ConvOptions::new_with_padding(self.stride, self.padding, self.dilation, self.groups);
        let y = match self.reduced {
            None => super::conv2d(x, weight, options),
            Some(dtype) => super::conv2d_in(x, weight, options, dtype),
        };
        if grads {
            // A contiguous upstream gradient, as the BatchNorm behind every convolution gives.
            let seed = random(y.dims());
            drop((y * seed).sum().backward());
        }
    }
}
