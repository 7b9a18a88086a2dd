//! FP32 values of CPU (burn-flex) tensors as slices and back, for the loops of ours that run
//! on the host (`cpu.rs`, `wgrad::host_weight_backward`).

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
