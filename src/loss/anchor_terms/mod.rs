//! The device loss's per-anchor terms of a pose branch copy as one operation with a backward
//! written out ([`LossOps::anchor_terms`]): box (CIoU), L1, OKS and keypoint-visibility BCE, and
//! the labelled keypoints, for every anchor at once, zero off the foreground. As tensor
//! operations ([`super::dense`]) these are ~240 launches forward and as many in autodiff's
//! backward a copy; here one each (CUDA, `kernels/anchor_terms.rs`) or one loop each (CPU,
//! [`host`]). The sums over the anchors stay outside, deterministic
//! ([`crate::optim::reduce::sum_each_row`], with the copy's other sums: `super::dense`); the OKS
//! and BCE terms sum each anchor's keypoints first, as the tensor operations do. The RLE rows
//! the flow evaluates are a second operation ([`LossOps::rle_rows`]; `kernels/rle_rows.rs`,
//! [`rle`]). Docs: docs/kernels.md, "The device loss's per-anchor terms" and "The device loss's
//! RLE rows".

mod autodiff;
pub mod host;
pub mod rle;
#[cfg(test)]
mod tests;

use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, Dispatch, Flex, backend_extension};
use burn::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};

static CHOSEN: AtomicBool = AtomicBool::new(true);

/// Whether the device loss computes the per-anchor terms of a pose copy by
/// [`LossOps::anchor_terms`] (`true`, the default since the H100 check of docs/perf_log.md BP1)
/// or by its tensor operations (`false`; `bench-step --anchor-terms false`). The same terms
/// within rounding.
pub fn choose(on: bool) {
    CHOSEN.store(on, Ordering::Relaxed);
}

/// [`choose`]'s choice.
pub fn chosen() -> bool {
    CHOSEN.load(Ordering::Relaxed)
}

static RLE_CHOSEN: AtomicBool = AtomicBool::new(true);

/// Whether the device loss's RLE rows of a pose copy are [`LossOps::rle_rows`] (`true`, the
/// default since the H100 check of docs/perf_log.md BP2) or their tensor operations (`false`;
/// `bench-step --rle-rows false`). The same rows within rounding.
pub fn choose_rle(on: bool) {
    RLE_CHOSEN.store(on, Ordering::Relaxed);
}

/// [`choose_rle`]'s choice.
pub fn rle_chosen() -> bool {
    RLE_CHOSEN.load(Ordering::Relaxed)
}

/// Rows of [`LossOps::anchor_terms`]' result: box, L1, OKS, visibility BCE, labelled keypoints.
pub const ROWS: usize = 5;

/// The per-anchor terms as backend operations. Tensors without a gradient: the packed object
/// slots `objects` (`[B, N, 6 + 3K]`, pixels), per anchor the slot it learns `slot`, the
/// foreground `fg` (0/1) and the alignment weight `weight` (each `[B, A]`), the anchors' `ax`,
/// `ay`, `st` (`[1, 1, A]`, grid units) and `sig` (`[K]`, `8σ²`); the image is `height ×
/// width` pixels.
#[backend_extension(Flex, Cube: cfg(feature = "cuda"), Autodiff)]
pub trait LossOps: Backend {
    /// `[5, B, A]`: for each foreground anchor of box distances `boxes` (`[B, 4, A]`, ltrb, grid
    /// units) and raw keypoints `kpts` (`[B, K·kd, A]`, kd 2 or 3), `(1 − CIoU) · w`,
    /// `Σ|scaled ltrb error| / 4 · w`, `Σ_k factor · (1 − e^(−e_k)) · v_k`, `Σ_k bce(x_k, v_k)`
    /// (zero for kd 2) and `Σ_k v_k`; zero elsewhere (`host::anchor` says how).
    #[allow(clippy::too_many_arguments)]
    fn anchor_terms(
        boxes: FloatTensor<Self>,
        kpts: FloatTensor<Self>,
        objects: FloatTensor<Self>,
        slot: FloatTensor<Self>,
        fg: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        ax: FloatTensor<Self>,
        ay: FloatTensor<Self>,
        st: FloatTensor<Self>,
        sig: FloatTensor<Self>,
        height: usize,
        width: usize,
    ) -> FloatTensor<Self>;
    /// The gradients of `boxes` and `kpts` for the incoming `grad` (`[5, B, A]`; the last row's
    /// is ignored: a count).
    #[allow(clippy::too_many_arguments)]
    fn anchor_terms_backward(
        boxes: FloatTensor<Self>,
        kpts: FloatTensor<Self>,
        objects: FloatTensor<Self>,
        slot: FloatTensor<Self>,
        fg: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        ax: FloatTensor<Self>,
        ay: FloatTensor<Self>,
        st: FloatTensor<Self>,
        sig: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        height: usize,
        width: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);
    /// `[B·K, R, 4]`: the RLE rows of the raw keypoints `kpts` (`[B, K·kd, A]`) and raw sigmas
    /// `sigma` (`[B, 2K, A]`), row `j` of image `b` the foreground anchor `picked[b, j]`
    /// (`[B, R]`): `ε` per coordinate, `log σ + log 2σ + |ε|` over both, and whether it counts
    /// (labelled, `j` below the image's positives `count` `[B]`). `place` (`[B, A]`) is each
    /// anchor's row (`≥ R` off the foreground), for the backward (`rle::forward` says how).
    #[allow(clippy::too_many_arguments)]
    fn rle_rows(
        kpts: FloatTensor<Self>,
        sigma: FloatTensor<Self>,
        objects: FloatTensor<Self>,
        slot: FloatTensor<Self>,
        place: FloatTensor<Self>,
        picked: FloatTensor<Self>,
        count: FloatTensor<Self>,
        ax: FloatTensor<Self>,
        ay: FloatTensor<Self>,
        st: FloatTensor<Self>,
    ) -> FloatTensor<Self>;
    /// The gradients of `kpts` and `sigma` for the incoming `grad` (`[B·K, R, 4]`; the last
    /// column's is ignored: a mask).
    #[allow(clippy::too_many_arguments)]
    fn rle_rows_backward(
        kpts: FloatTensor<Self>,
        sigma: FloatTensor<Self>,
        objects: FloatTensor<Self>,
        slot: FloatTensor<Self>,
        place: FloatTensor<Self>,
        picked: FloatTensor<Self>,
        count: FloatTensor<Self>,
        ax: FloatTensor<Self>,
        ay: FloatTensor<Self>,
        st: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);
}

/// What the terms read besides the predictions, none with a gradient (see [`LossOps`]).
#[derive(Clone, Debug)]
pub struct Fixed {
    pub objects: Tensor<3>,
    pub slot: Tensor<2>,
    pub fg: Tensor<2>,
    pub weight: Tensor<2>,
    pub ax: Tensor<3>,
    pub ay: Tensor<3>,
    pub st: Tensor<3>,
    pub sig: Tensor<1>,
}

/// What the RLE rows read besides the predictions, none with a gradient (see
/// [`LossOps::rle_rows`]).
#[derive(Clone, Debug)]
pub struct RleFixed {
    pub objects: Tensor<3>,
    pub slot: Tensor<2>,
    pub place: Tensor<2>,
    pub picked: Tensor<2>,
    pub count: Tensor<1>,
    pub ax: Tensor<3>,
    pub ay: Tensor<3>,
    pub st: Tensor<3>,
}

/// [`LossOps::rle_rows`] on tensors: `[B·K, R, 4]`.
pub fn rle_rows(kpts: Tensor<3>, sigma: Tensor<3>, fixed: RleFixed) -> Tensor<3> {
    Tensor::from_dispatch(Dispatch::rle_rows(
        kpts.into_dispatch(),
        sigma.into_dispatch(),
        fixed.objects.into_dispatch(),
        fixed.slot.into_dispatch(),
        fixed.place.into_dispatch(),
        fixed.picked.into_dispatch(),
        fixed.count.into_dispatch(),
        fixed.ax.into_dispatch(),
        fixed.ay.into_dispatch(),
        fixed.st.into_dispatch(),
    ))
}

/// [`LossOps::anchor_terms`] on tensors: `[5, B, A]`.
pub fn per_anchor(boxes: Tensor<3>, kpts: Tensor<3>, fixed: Fixed, size: [usize; 2]) -> Tensor<3> {
    Tensor::from_dispatch(Dispatch::anchor_terms(
        boxes.into_dispatch(),
        kpts.into_dispatch(),
        fixed.objects.into_dispatch(),
        fixed.slot.into_dispatch(),
        fixed.fg.into_dispatch(),
        fixed.weight.into_dispatch(),
        fixed.ax.into_dispatch(),
        fixed.ay.into_dispatch(),
        fixed.st.into_dispatch(),
        fixed.sig.into_dispatch(),
        size[0],
        size[1],
    ))
}

impl LossOps for Flex {
    fn anchor_terms(
        boxes: FloatTensor<Self>,
        kpts: FloatTensor<Self>,
        objects: FloatTensor<Self>,
        slot: FloatTensor<Self>,
        fg: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        ax: FloatTensor<Self>,
        ay: FloatTensor<Self>,
        st: FloatTensor<Self>,
        sig: FloatTensor<Self>,
        height: usize,
        width: usize,
    ) -> FloatTensor<Self> {
        let fixed = [objects, slot, fg, weight, ax, ay, st, sig];
        host::forward(&boxes, &kpts, &fixed, [height, width])
    }
    fn anchor_terms_backward(
        boxes: FloatTensor<Self>,
        kpts: FloatTensor<Self>,
        objects: FloatTensor<Self>,
        slot: FloatTensor<Self>,
        fg: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        ax: FloatTensor<Self>,
        ay: FloatTensor<Self>,
        st: FloatTensor<Self>,
        sig: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        height: usize,
        width: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let fixed = [objects, slot, fg, weight, ax, ay, st, sig];
        host::backward(&boxes, &kpts, &fixed, &grad, [height, width])
    }
    fn rle_rows(
        kpts: FloatTensor<Self>,
        sigma: FloatTensor<Self>,
        objects: FloatTensor<Self>,
        slot: FloatTensor<Self>,
        place: FloatTensor<Self>,
        picked: FloatTensor<Self>,
        count: FloatTensor<Self>,
        ax: FloatTensor<Self>,
        ay: FloatTensor<Self>,
        st: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let fixed = [objects, slot, place, picked, count, ax, ay, st];
        rle::forward(&kpts, &sigma, &fixed)
    }
    fn rle_rows_backward(
        kpts: FloatTensor<Self>,
        sigma: FloatTensor<Self>,
        objects: FloatTensor<Self>,
        slot: FloatTensor<Self>,
        place: FloatTensor<Self>,
        picked: FloatTensor<Self>,
        count: FloatTensor<Self>,
        ax: FloatTensor<Self>,
        ay: FloatTensor<Self>,
        st: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let fixed = [objects, slot, place, picked, count, ax, ay, st];
        rle::backward(&kpts, &sigma, &fixed, &grad)
    }
}

#[cfg(feature = "cuda")]
#[path = "../../../kernels/anchor_terms.rs"]
pub mod kernel;
#[cfg(feature = "cuda")]
#[path = "../../../kernels/rle_rows.rs"]
pub mod rle_kernel;

#[cfg(feature = "cuda")]
impl LossOps for burn_cubecl::CubeBackend {
    fn anchor_terms(
        boxes: FloatTensor<Self>,
        kpts: FloatTensor<Self>,
        objects: FloatTensor<Self>,
        slot: FloatTensor<Self>,
        fg: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        ax: FloatTensor<Self>,
        ay: FloatTensor<Self>,
        st: FloatTensor<Self>,
        sig: FloatTensor<Self>,
        height: usize,
        width: usize,
    ) -> FloatTensor<Self> {
        let fixed = kernel::Fixed {
            objects,
            slot,
            fg,
            weight,
            ax,
            ay,
            st,
            sig,
        };
        kernel::forward(boxes, kpts, fixed, [height, width])
    }
    fn anchor_terms_backward(
        boxes: FloatTensor<Self>,
        kpts: FloatTensor<Self>,
        objects: FloatTensor<Self>,
        slot: FloatTensor<Self>,
        fg: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        ax: FloatTensor<Self>,
        ay: FloatTensor<Self>,
        st: FloatTensor<Self>,
        sig: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        height: usize,
        width: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let fixed = kernel::Fixed {
            objects,
            slot,
            fg,
            weight,
            ax,
            ay,
            st,
            sig,
        };
        kernel::backward(boxes, kpts, fixed, grad, [height, width])
    }
    fn rle_rows(
        kpts: FloatTensor<Self>,
        sigma: FloatTensor<Self>,
        objects: FloatTensor<Self>,
        slot: FloatTensor<Self>,
        place: FloatTensor<Self>,
        picked: FloatTensor<Self>,
        count: FloatTensor<Self>,
        ax: FloatTensor<Self>,
        ay: FloatTensor<Self>,
        st: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let fixed = rle_kernel::Fixed {
            objects,
            slot,
            place,
            picked,
            count,
            ax,
            ay,
            st,
        };
        rle_kernel::forward(kpts, sigma, fixed)
    }
    fn rle_rows_backward(
        kpts: FloatTensor<Self>,
        sigma: FloatTensor<Self>,
        objects: FloatTensor<Self>,
        slot: FloatTensor<Self>,
        place: FloatTensor<Self>,
        picked: FloatTensor<Self>,
        count: FloatTensor<Self>,
        ax: FloatTensor<Self>,
        ay: FloatTensor<Self>,
        st: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let fixed = rle_kernel::Fixed {
            objects,
            slot,
            place,
            picked,
            count,
            ax,
            ay,
            st,
        };
        rle_kernel::backward(kpts, sigma, fixed, grad)
    }
}
