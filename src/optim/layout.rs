//! Where each parameter sits in the flat buffers of the multi-tensor update (`flat`), of replay's
//! gradients and of the EMA: one segment per parameter, starting and (padded) ending on 512-byte
//! boundaries so that a segment can be a view of its buffer on CUDA.

use crate::model::ops::{run, segment, storage};
use burn::prelude::*;
use burn::tensor::DType;

/// Segment alignment in f32 elements (512 bytes, CubeCL's CUDA memory alignment).
pub(super) const ALIGN: usize = 128;

/// The room a segment of `n` values takes: `n` rounded up to a multiple of [`ALIGN`].
pub(crate) fn padded(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

/// Where each parameter sits in the flat buffers.
#[derive(Clone, Debug)]
pub struct Layout {
    pub offsets: Vec<usize>,
    pub sizes: Vec<usize>,
    /// Padded length of every flat buffer.
    pub len: usize,
}

impl Layout {
    pub fn new(sizes: Vec<usize>) -> Self {
        let mut offsets = Vec::with_capacity(sizes.len());
        let mut len = 0;
        for n in &sizes {
            offsets.push(len);
            len += padded(*n);
        }
        Self {
            offsets,
            sizes,
            len,
        }
    }

    /// Per element, the index of its segment (`sizes.len()` for padding).
    pub(super) fn segment_of_each(&self) -> Vec<i32> {
        let mut seg = vec![self.sizes.len() as i32; self.len];
        for (i, (&o, &n)) in self.offsets.iter().zip(&self.sizes).enumerate() {
            seg[o..o + n].fill(i as i32);
        }
        seg
    }

    /// `parts` (each `[size]`, or absent → zeros) written into one zeroed `[len]` buffer. Parts
    /// that are consecutive views of another buffer at this layout's distances (a flat buffer of
    /// the same padding rule: the optimizer's values, replay's gradients and statistics) are
    /// copied as one run ([`crate::model::ops::run`]), the padding between them included.
    pub fn gather(&self, parts: Vec<Option<Tensor<1>>>, device: &Device) -> Tensor<1> {
        let mut flat = Tensor::<1>::zeros([self.len], (device, DType::F32));
        let mut i = 0;
        while i < parts.len() {
            let o = self.offsets[i];
            if let Some((j, whole)) = run(&parts, &self.offsets, &self.sizes, i) {
                flat = flat.slice_assign(o..o + whole.dims()[0], whole);
                i = j;
                continue;
            }
            if let Some(t) = &parts[i] {
                flat = flat.slice_assign(o..o + self.sizes[i], f32_of(t.clone()));
            }
            i += 1;
        }
        flat
    }

    /// The present `parts` written into their segments of `dst` (a `[len]` buffer), runs as one
    /// copy each as in [`Layout::gather`], by our copy kernel: nothing is allocated and the
    /// absent parts' segments keep what they held. CUDA only (a recording's fixed buffers).
    pub fn gather_into(&self, parts: &[Option<Tensor<1>>], dst: &Tensor<1>) {
        let mut i = 0;
        while i < parts.len() {
            let o = self.offsets[i];
            if let Some((j, whole)) = run(parts, &self.offsets, &self.sizes, i) {
                let len = whole.dims()[0];
                // Reaching to the last part's padded end keeps the view's end aligned: an
                // unaligned one is a copy (`segment`), and the write would be lost in it.
                let reach = self.offsets[j - 1] + padded(self.sizes[j - 1]) - o;
                written(&whole, &segment(dst.clone(), o, len, reach), dst);
                i = j;
                continue;
            }
            if let Some(t) = &parts[i] {
                written(&f32_of(t.clone()), &self.view(dst, i), dst);
            }
            i += 1;
        }
    }

    /// Segment `i` of `flat`: a view of its buffer on CUDA, whose padded segment reaches an
    /// aligned end ([`crate::model::ops::segment`]).
    pub fn view(&self, flat: &Tensor<1>, i: usize) -> Tensor<1> {
        let n = self.sizes[i];
        segment(flat.clone(), self.offsets[i], n, padded(n))
    }
}

/// `src` copied into `dst` in place (CUDA), `dst` a view of `into`'s allocation.
fn written(src: &Tensor<1>, dst: &Tensor<1>, into: &Tensor<1>) {
    assert_eq!(
        storage(dst).map(|(id, _)| id),
        storage(into).map(|(id, _)| id),
        "a segment of a fixed buffer must be a view of it, not a copy"
    );
    let done = super::tensors::write_in_place(src, dst);
    assert!(done, "a fixed buffer is written in place on CUDA only");
}

pub(crate) fn f32_of(t: Tensor<1>) -> Tensor<1> {
    if t.dtype() == DType::F32 {
        t
    } else {
        t.cast(DType::F32)
    }
}
