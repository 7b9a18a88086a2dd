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
        let mut runs = Vec::new();
        self.each_run(&parts, |at, whole| runs.push((at, whole)));
        // Moved, not cloned, into each assignment: a buffer held once is written in place.
        runs.into_iter().fold(
            Tensor::<1>::zeros([self.len], (device, DType::F32)),
            |flat, (at, whole)| flat.slice_assign(at.start..at.start + at.len, whole),
        )
    }

    /// The present `parts` written into their segments of `dst` (a `[len]` buffer), runs as one
    /// copy each as in [`Layout::gather`], by our copy kernel: nothing is allocated and the
    /// absent parts' segments keep what they held. CUDA only (a recording's fixed buffers).
    /// A run already in its place (written there by its producer, `model::ops::grads_into`) is
    /// left as it is. Returns `(runs copied, runs in all)`.
    pub fn gather_into(&self, parts: &[Option<Tensor<1>>], dst: &Tensor<1>) -> (usize, usize) {
        let (mut copied, mut runs) = (0, 0);
        self.each_run(parts, |at, whole| {
            runs += 1;
            let view = at.view_of(dst);
            if storage(&whole).is_some_and(|s| Some(s) == storage(&view)) {
                return;
            }
            let done = super::tensors::write_in_place(&whole, &view);
            assert!(done, "a fixed buffer is written in place on CUDA only");
            copied += 1;
        });
        (copied, runs)
    }

    /// Calls `f` once per run of the present `parts` (consecutive views of one buffer at this
    /// layout's distances, [`crate::model::ops::run`]; a part outside any run is a run of its
    /// own), in order, with where the run lies in a buffer of this layout and the run's values
    /// as one FP32 tensor (a view where the parts are views).
    pub fn each_run(&self, parts: &[Option<Tensor<1>>], mut f: impl FnMut(Span, Tensor<1>)) {
        let mut i = 0;
        while i < parts.len() {
            let start = self.offsets[i];
            if let Some((j, whole)) = run(parts, &self.offsets, &self.sizes, i) {
                // Reaching to the last part's padded end keeps the view's end aligned: an
                // unaligned one is a copy (`segment`), and a write into it would be lost.
                let reach = self.offsets[j - 1] + padded(self.sizes[j - 1]) - start;
                let len = whole.dims()[0];
                f(Span { start, len, reach }, whole);
                i = j;
                continue;
            }
            if let Some(t) = &parts[i] {
                let (len, reach) = (self.sizes[i], padded(self.sizes[i]));
                f(Span { start, len, reach }, f32_of(t.clone()));
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

/// Where a run of segments lies in a flat buffer: `len` values from `start`, its room reaching
/// `reach` values (to the last segment's padded end, an aligned address).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub start: usize,
    pub len: usize,
    pub reach: usize,
}

impl Span {
    /// The span of `buffer` as a view of it (CUDA), checked: a copy would lose what is
    /// written into it.
    pub fn view_of(&self, buffer: &Tensor<1>) -> Tensor<1> {
        let view = segment(buffer.clone(), self.start, self.len, self.reach);
        assert_eq!(
            storage(&view).map(|(id, _)| id),
            storage(buffer).map(|(id, _)| id),
            "a segment of a fixed buffer must be a view of it, not a copy"
        );
        view
    }
}

pub(crate) fn f32_of(t: Tensor<1>) -> Tensor<1> {
    if t.dtype() == DType::F32 {
        t
    } else {
        t.cast(DType::F32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Off CUDA no part is a view of another buffer, so every present part is a run of its own
    /// at its segment, reaching its padded end; absent parts are skipped. `gather` places the
    /// same values there.
    #[test]
    fn each_run_visits_the_present_parts_at_their_segments() {
        let d = Device::flex();
        let layout = Layout::new(vec![3, 130, 5]);
        let part = |v: &[f32]| Some(Tensor::<1>::from_floats(v, &d));
        let parts = vec![part(&[1.0, 2.0, 3.0]), None, part(&[4.0; 5])];
        let mut spans = Vec::new();
        layout.each_run(&parts, |at, values| spans.push((at, values.dims()[0])));
        let span = |start, len, reach| Span { start, len, reach };
        assert_eq!(
            spans,
            vec![(span(0, 3, 128), 3), (span(384, 5, 128), 5)],
            "offsets 0, 128, 384 in a layout of {}",
            layout.len
        );
        let flat = layout
            .gather(parts, &d)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        assert_eq!(flat.len(), 512);
        assert_eq!(&flat[..4], &[1.0, 2.0, 3.0, 0.0]);
        assert!(flat[128..384].iter().all(|&v| v == 0.0));
        assert_eq!(&flat[383..390], &[0.0, 4.0, 4.0, 4.0, 4.0, 4.0, 0.0]);
    }
}
