//! Gradients by parameter, flattened to `[numel]`. `GradientsParams` is keyed by tensor rank; these
//! read the rank from the parameter table, so callers (clipping, accumulation, checkpoints,
//! data-parallel all-reduce) do not each dispatch on it.

use super::groups::ParamInfo;
use burn::optim::GradientsParams;
use burn::prelude::*;

fn flat<const D: usize>(t: Tensor<D>) -> Tensor<1> {
    let n = t.shape().num_elements();
    t.reshape([n])
}

fn unsupported(p: &ParamInfo) -> ! {
    panic!("parameter {} has unsupported rank {}", p.path, p.dims.len())
}

/// `p`'s gradient, if it has one.
pub fn get_flat(grads: &GradientsParams, p: &ParamInfo) -> Option<Tensor<1>> {
    match p.dims.len() {
        1 => grads.get::<1>(p.id).map(flat),
        2 => grads.get::<2>(p.id).map(flat),
        3 => grads.get::<3>(p.id).map(flat),
        4 => grads.get::<4>(p.id).map(flat),
        _ => unsupported(p),
    }
}

/// `p`'s gradient, removed from `grads`.
pub fn take_flat(grads: &mut GradientsParams, p: &ParamInfo) -> Option<Tensor<1>> {
    match p.dims.len() {
        1 => grads.remove::<1>(p.id).map(flat),
        2 => grads.remove::<2>(p.id).map(flat),
        3 => grads.remove::<3>(p.id).map(flat),
        4 => grads.remove::<4>(p.id).map(flat),
        _ => unsupported(p),
    }
}

/// Registers `g` (`[numel]`) as `p`'s gradient, in `p`'s shape.
pub fn put_flat(grads: &mut GradientsParams, p: &ParamInfo, g: Tensor<1>) {
    let d = &p.dims;
    match d.len() {
        1 => grads.register::<1>(p.id, g.reshape([d[0]])),
        2 => grads.register::<2>(p.id, g.reshape([d[0], d[1]])),
        3 => grads.register::<3>(p.id, g.reshape([d[0], d[1], d[2]])),
        4 => grads.register::<4>(p.id, g.reshape([d[0], d[1], d[2], d[3]])),
        _ => unsupported(p),
    }
}
