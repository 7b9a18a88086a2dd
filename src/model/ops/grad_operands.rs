//! A convolution's output gradient as its data gradient's GEMM takes it, written by the
//! BatchNorm after the convolution in the same kernel as the gradient itself (CUDA).
//!
//! `ConvBn` runs a convolution, then BatchNorm + SiLU on its output. Backward, the BatchNorm's
//! input gradient is the convolution's output gradient; for a stride-1 convolution computed in
//! BF16 or FP16 the data gradient's GEMM takes it channels-last, cast and padded to a multiple
//! of 8 channels, which was a launch of its own (`channels_last`, ~100 a step for the nano pose
//! model, each reading the whole FP32 gradient again). Here the fused BatchNorm's input-gradient
//! kernel writes that operand beside the FP32 gradient (the same cast of the same value, so the
//! same bits), and the convolution's backward takes it.
//!
//! The hand-off goes through the autodiff graph's node ids, on the thread that runs it: the
//! convolution's forward names its output node ([`produced`]); the BatchNorm whose input is that
//! node remembers the dtype ([`wanted_for`]); its backward makes the operand and gives it under
//! the convolution's node ([`give`]); the convolution's backward, the next node to visit, takes
//! it ([`take`]). A backend that makes none (the CPU) gives nothing, and every convolution
//! without one casts as before. On by default ([`choose`]; `bench-step --grad-operands false`
//! turns it off): GPU-run on an H100 on 2026-12-05, the same state hashes with and without,
//! 69 `channels_last` launches and ~0.3 ms of GPU time fewer a seed step (docs/perf_log.md BB1).

use burn::backend::Backend;
use burn::backend::autodiff::NodeId;
use burn::backend::tensor::FloatTensor;
use burn::tensor::FloatDType;
use std::any::Any;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static CHOSEN: AtomicBool = AtomicBool::new(true);
/// Operands taken by convolutions' backwards in this process ([`taken`]).
static TAKEN: AtomicUsize = AtomicUsize::new(0);

/// Whether BatchNorms write their convolutions' output-gradient operands (`true`, the default)
/// or the convolutions cast their output gradients themselves (`false`).
pub fn choose(on: bool) {
    CHOSEN.store(on, Ordering::Relaxed);
}

/// Whether the operands are written by the BatchNorms ([`choose`]).
pub fn chosen() -> bool {
    CHOSEN.load(Ordering::Relaxed)
}

thread_local! {
    /// The output node of the last tracked convolution whose data gradient would take an
    /// output-gradient operand, with its dtype.
    static PRODUCED: Cell<Option<(NodeId, FloatDType)>> = const { Cell::new(None) };
    /// Operands made by BatchNorms' backwards, by the node of the convolution they are for.
    static GIVEN: RefCell<Vec<(NodeId, Box<dyn Any>)>> = const { RefCell::new(Vec::new()) };
}

/// Operands kept for convolutions whose backward has not taken them yet. Each is taken by the
/// node the backward visits next; the bound keeps one never taken (a pass that stops early)
/// from holding memory for long.
const KEPT: usize = 8;

/// Says that the convolution just recorded, with output node `conv`, computes in `dtype` and
/// would take an output-gradient operand (`Some`), or that it would not (`None`).
pub(super) fn produced(conv: Option<(NodeId, FloatDType)>) {
    PRODUCED.set(conv.filter(|_| chosen()));
}

/// The dtype of the operand the convolution that produced `x` (a BatchNorm's input) takes,
/// when it was the last one recorded and takes one.
pub(super) fn wanted_for(x: NodeId) -> Option<FloatDType> {
    PRODUCED.take().filter(|(id, _)| *id == x).map(|(_, d)| d)
}

/// Keeps `operand` for the backward of convolution node `conv`.
pub(super) fn give<B: Backend>(conv: NodeId, operand: FloatTensor<B>) {
    GIVEN.with(|all| {
        let mut all = all.borrow_mut();
        if all.len() == KEPT {
            all.remove(0);
        }
        all.push((conv, Box::new(operand)));
    });
}

/// The operand kept for convolution node `conv`, taken.
pub(super) fn take<B: Backend>(conv: NodeId) -> Option<FloatTensor<B>> {
    let operand = GIVEN.with(|all| {
        let mut all = all.borrow_mut();
        let at = all.iter().position(|(id, _)| *id == conv)?;
        all.remove(at)
            .1
            .downcast::<FloatTensor<B>>()
            .ok()
            .map(|b| *b)
    });
    if operand.is_some() {
        TAKEN.fetch_add(1, Ordering::Relaxed);
    }
    operand
}

/// How many operands convolutions' backwards have taken in this process (`bench-step` prints
/// the count a step; a convolution given one still checks its form before using it).
pub fn taken() -> usize {
    TAKEN.load(Ordering::Relaxed)
}
