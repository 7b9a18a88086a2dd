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
                input_grad: x.is_tracked(),
                weight_grad: weight.is_require_grad(),
            })
        }
    });
}

/// Runs `f` and returns, with its result, the distinct convolutions it ran on this thread, in
/// the order they first ran.
pub fn convolutions_of<R>(f: impl FnOnce() -> R) -> (R, Vec<ConvCall>) {
    let (result, counted) = convolutions_counted(f);
    (result, counted.into_iter().map(|(c, _)| c).collect())
}

/// [`convolutions_of`] with the number of times `f` ran each.
pub fn convolutions_counted<R>(f: impl FnOnce() -> R) -> (R, Vec<(ConvCall, usize)>) {
    TRACE.with(|trace| *trace.borrow_mut() = Some(Vec::new()));
    let result = f();
    let calls = TRACE
        .with(|trace| trace.borrow_mut().take())
        .unwrap_or_default();
    let mut distinct: Vec<(ConvCall, usize)> = Vec::new();
    let mut at: std::collections::HashMap<ConvCall, usize> = std::collections::HashMap::new();
    for c in calls {
        match at.get(&c) {
            Some(&i) => distinct[i].1 += 1,
            None => {
                at.insert(c.clone(), distinct.len());
                distinct.push((c, 1));
            }
        }
    }
    (result, distinct)
}

/// One pass of a convolution, as a training step runs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    Forward,
    /// The input's gradient.
    DataGrad,
    /// The weight's gradient.
    WeightGrad,
}

impl ConvCall {
    /// The passes a training step runs: the forward, and each gradient it asks for.
    pub fn passes(&self) -> Vec<Pass> {
        let mut passes = vec![Pass::Forward];
        if self.input_grad {
            passes.push(Pass::DataGrad);
        }
        if self.weight_grad {
            passes.push(Pass::WeightGrad);
        }
        passes
    }

    /// `[height, width]` of the output.
    pub fn output_size(&self) -> [usize; 2] {
        let dim = |i: usize| {
            super::conv::output_len(
                self.input[2 + i],
                self.weight[2 + i],
                self.padding[i],
                self.stride[i],
                self.dilation[i],
            )
        };
        [dim(0), dim(1)]
    }

    /// `[batch, c_out, height, width]` of the output.
    pub fn output(&self) -> [usize; 4] {
        let [h, w] = self.output_size();
        [self.input[0], self.weight[0], h, w]
    }

    /// Floating-point operations of one pass (each pass is the same number of multiply-adds,
    /// two operations each): `2 · N · Ho · Wo · C_out · C_in/groups · k_h · k_w`.
    pub fn flops(&self) -> f64 {
        let [n, c_out, h, w] = self.output();
        let [_, c_in, kh, kw] = self.weight;
        2.0 * (n * h * w * c_out * c_in * kh * kw) as f64
    }

    /// Bytes one pass must move at least through its FP32 interface: every pass reads two of
    /// input, weight and output and writes the third, once each.
    pub fn min_bytes(&self) -> f64 {
        let count = |d: [usize; 4]| d.iter().product::<usize>();
        4.0 * (count(self.input) + count(self.weight) + count(self.output())) as f64
    }

    /// Launches `pass` on `x` (the input), `weight` and `grad` (the output's gradient) on a
    /// plain device, as the step's backward calls it; asynchronous.
    pub fn launch(
        &self,
        pass: Pass,
        x: &Tensor<4>,
        weight: &Tensor<4>,
        grad: &Tensor<4>,
    ) -> Tensor<4> {
        use super::FastOps;
        use burn::backend::Dispatch;
        let options =
            ConvOptions::new_with_padding(self.stride, self.padding, self.dilation, self.groups);
        let d = |t: &Tensor<4>| t.clone().into_dispatch();
        let out = match (pass, self.reduced) {
            (Pass::Forward, None) => Dispatch::conv(d(x), d(weight), options),
            (Pass::Forward, Some(dtype)) => Dispatch::conv_in(d(x), d(weight), options, dtype),
            (Pass::DataGrad, None) => Dispatch::conv_x_backward(d(x), d(weight), d(grad), options),
            (Pass::DataGrad, Some(dtype)) => {
                Dispatch::conv_in_x_backward(d(x), d(weight), d(grad), options, dtype)
            }
            (Pass::WeightGrad, None) => {
                Dispatch::conv_weight_backward(d(x), d(weight), d(grad), options)
            }
            (Pass::WeightGrad, Some(dtype)) => {
                Dispatch::conv_in_weight_backward(d(x), d(weight), d(grad), options, dtype)
            }
        };
        Tensor::from_dispatch(out)
    }

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
