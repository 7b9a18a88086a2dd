//! A convolution's input as its GEMM takes it, written by the BatchNorm before the convolution
//! in the same kernel as the BatchNorm's output (CUDA).
//!
//! A reduced-precision convolution without groups reads its input channels-last, cast and
//! padded to a multiple of 8 channels (`conv::gemm::forward_with`), which was a launch of its
//! own (`channels_last`, reading the whole FP32 input again). Where that input is a fused
//! BatchNorm's output, the BatchNorm's normalising kernel can write the operand beside the FP32
//! output (the same cast of the same value, so the same bits); the FP32 output stays, for the
//! weight gradient and every other reader.
//!
//! Whether a BatchNorm's output feeds such a convolution is learnt, per BatchNorm (its γ's
//! parameter id), the first time it does: the BatchNorm names its output node ([`made`]); a
//! convolution whose input is that node and that found no operand marks the BatchNorm as
//! wanted ([`take`]); from then on that BatchNorm makes the operand ([`wanted`]) and the
//! convolution takes it. So a model's first forward casts as before, and every later one,
//! feature replay's recordings included, takes the operands. A backend that makes none (the
//! CPU) gives nothing, and every convolution without one casts as before. On by default
//! ([`choose`]; `bench-step --input-operands false` turns it off): GPU-run on an H100 on
//! 2026-12-06, the same state hashes with and without, 55 launches and ~0.43 ms of GPU time
//! fewer a recorded seed step (docs/perf_log.md BB4, BC1).

use burn::backend::Backend;
use burn::backend::autodiff::NodeId;
use burn::backend::tensor::FloatTensor;
use burn::module::ParamId;
use burn::tensor::FloatDType;
use std::any::Any;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static CHOSEN: AtomicBool = AtomicBool::new(true);
/// Operands taken by convolutions' forwards in this process ([`taken`]).
static TAKEN: AtomicUsize = AtomicUsize::new(0);

/// Whether BatchNorms write their convolutions' input operands (`true`, the default) or the
/// convolutions cast their inputs themselves (`false`).
pub fn choose(on: bool) {
    CHOSEN.store(on, Ordering::Relaxed);
}

/// Whether the operands are written by the BatchNorms ([`choose`]).
pub fn chosen() -> bool {
    CHOSEN.load(Ordering::Relaxed)
}

/// A BatchNorm output not yet taken by a convolution: its node, its BatchNorm, and the operand
/// made with it, if any.
struct Made {
    node: NodeId,
    key: ParamId,
    operand: Option<(FloatDType, Box<dyn Any>)>,
}

thread_local! {
    /// The BatchNorm about to run ([`next`]), for the backend's operation to read ([`key`]).
    static NEXT: Cell<Option<ParamId>> = const { Cell::new(None) };
    /// The BatchNorms whose output a convolution took as its input, with its dtype.
    static WANTED: RefCell<HashMap<ParamId, FloatDType>> = RefCell::new(HashMap::new());
    /// The last BatchNorm outputs, oldest first.
    static MADE: RefCell<Vec<Made>> = const { RefCell::new(Vec::new()) };
}

/// BatchNorm outputs kept for the convolutions after them. A convolution takes its input's
/// operand within a few operations of the BatchNorm; the bound keeps one never taken from
/// holding memory for long.
const KEPT: usize = 4;

/// Says that the next BatchNorm to run is the one with γ `key`.
pub(super) fn next(key: ParamId) {
    NEXT.set(Some(key).filter(|_| chosen()));
}

/// The BatchNorm named by [`next`], taken.
pub(super) fn key() -> Option<ParamId> {
    NEXT.take()
}

/// The dtype of the input operand BatchNorm `key`'s output is taken in, when a convolution took
/// it before.
pub(super) fn wanted(key: ParamId) -> Option<FloatDType> {
    WANTED.with(|w| w.borrow().get(&key).copied())
}

/// Keeps BatchNorm `key`'s output node `node`, with the operand made with it in `dtype`.
pub(super) fn made<B: Backend>(
    node: NodeId,
    key: ParamId,
    operand: Option<(FloatDType, FloatTensor<B>)>,
) {
    MADE.with(|all| {
        let mut all = all.borrow_mut();
        if all.len() == KEPT {
            all.remove(0);
        }
        let operand = operand.map(|(d, t)| (d, Box::new(t) as Box<dyn Any>));
        all.push(Made { node, key, operand });
    });
}

/// The operand in `dtype` kept for a convolution whose input is node `x`, taken. Where `x` is a
/// kept BatchNorm output without one, that BatchNorm is marked to make it from now on.
pub(super) fn take<B: Backend>(x: NodeId, dtype: FloatDType) -> Option<FloatTensor<B>> {
    if !chosen() {
        return None;
    }
    let found = MADE.with(|all| {
        let mut all = all.borrow_mut();
        let at = all.iter().position(|m| m.node == x)?;
        Some(all.remove(at))
    })?;
    let operand = match found.operand {
        Some((d, t)) if d == dtype => t.downcast::<FloatTensor<B>>().ok().map(|b| *b),
        _ => None,
    };
    match operand {
        Some(_) => {
            TAKEN.fetch_add(1, Ordering::Relaxed);
        }
        None => {
            WANTED.with(|w| w.borrow_mut().insert(found.key, dtype));
        }
    }
    operand
}

/// How many operands convolutions' forwards have taken in this process (`bench-step` prints
/// the count a step; a convolution given one still checks its form before using it).
pub fn taken() -> usize {
    TAKEN.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::conv::ConvBnConfig;
    use crate::model::precision::autocast;
    use burn::prelude::*;

    /// A BatchNorm whose output a convolution takes is learnt as wanted, in the convolution's
    /// dtype; one whose output only an addition reads is not, nor is any without the choice.
    #[test]
    fn the_batch_norms_feeding_convolutions_are_learnt() {
        let device = Device::flex().autodiff();
        device.seed(3);
        let cv1 = ConvBnConfig::new(4, 8).with_kernel(3).init(&device);
        let cv2 = ConvBnConfig::new(8, 8).with_kernel(3).init(&device);
        let x = Tensor::<4>::random([2, 4, 9, 7], burn::tensor::Distribution::Default, &device);
        let forward = |x: Tensor<4>| {
            let _on = autocast(Some(FloatDType::BF16));
            let y = cv1.forward(x);
            cv2.forward(y.clone()) + y
        };
        let (k1, k2) = (cv1.bn.gamma.id, cv2.bn.gamma.id);
        choose(false);
        let _ = forward(x.clone());
        assert_eq!((wanted(k1), wanted(k2)), (None, None), "learnt while off");
        choose(true);
        let _ = forward(x.clone());
        choose(false);
        assert_eq!(wanted(k1), Some(FloatDType::BF16), "the first BatchNorm");
        assert_eq!(wanted(k2), None, "the second feeds an addition only");
    }
}
