//! MuSGD's Muon step in the flat update: which parameters it orthogonalises, and the batches of
//! equal shape its Newton–Schulz runs on (`optim::flat`).

use super::groups::{Group, ParamInfo};
use super::layout::Layout;
use super::newton_schulz::{matrix_shape, muon_scale, orthogonalize_batch};
use super::state::Rule;
use burn::prelude::*;
use burn::tensor::TensorData;
use std::collections::BTreeMap;

/// Whether `rule` updates this parameter with Muon's orthogonalised step (MuSGD's weight
/// matrices and convolution kernels).
pub fn uses_muon(rule: Rule, info: &ParamInfo) -> bool {
    rule == Rule::MuSgd && info.group == Group::Weight && info.muon_eligible()
}

/// Muon's matrices grouped by shape, each group orthogonalised as one batch
/// (`newton_schulz::orthogonalize_batch`): where each group's values lie in the flat buffers,
/// and where each flat value lies among the groups' results.
#[derive(Clone, Debug)]
pub(super) struct MuonBatches {
    /// Per group, its `[k, rows, cols]` and the flat position of each of its values in that
    /// order (each matrix as `newton_schulz::orthogonalized` views its parameter).
    groups: Vec<([usize; 3], Tensor<1, Int>)>,
    /// Per flat position, its value's place in the groups' results one after another; other
    /// parameters and padding point one past them, at a zero.
    back: Tensor<1, Int>,
}

impl MuonBatches {
    pub(super) fn new(rule: Rule, table: &[ParamInfo], layout: &Layout, device: &Device) -> Self {
        let mut by_shape: BTreeMap<(usize, usize), Vec<usize>> = BTreeMap::new();
        for (i, info) in table.iter().enumerate() {
            if uses_muon(rule, info) {
                let (rows, cols, _) = matrix_shape(&info.dims);
                by_shape.entry((rows, cols)).or_default().push(i);
            }
        }
        let total: usize = by_shape.iter().map(|((r, c), m)| r * c * m.len()).sum();
        let mut back = vec![total as i32; layout.len];
        let (mut groups, mut base) = (Vec::new(), 0);
        for ((rows, cols), members) in by_shape {
            let mut idx = Vec::with_capacity(members.len() * rows * cols);
            for i in &members {
                let (o, (_, _, transposed)) = (layout.offsets[*i], matrix_shape(&table[*i].dims));
                for a in 0..rows {
                    for b in 0..cols {
                        // The matrix's (a, b) in the parameter's own layout.
                        let q = if transposed {
                            b * rows + a
                        } else {
                            a * cols + b
                        };
                        back[o + q] = (base + idx.len()) as i32;
                        idx.push((o + q) as i32);
                    }
                }
            }
            base += idx.len();
            let len = idx.len();
            let idx = Tensor::<1, Int>::from_data(TensorData::new(idx, [len]), device);
            groups.push(([members.len(), rows, cols], idx));
        }
        let back = Tensor::<1, Int>::from_data(TensorData::new(back, [layout.len]), device);
        Self { groups, back }
    }

    /// Every Muon matrix of the flat `u` orthogonalised and scaled, at its place in a flat
    /// buffer (zeros elsewhere): per matrix the bits of `newton_schulz::orthogonalized`.
    pub(super) fn orthogonal(&self, u: &Tensor<1>) -> Tensor<1> {
        let mut results: Vec<Tensor<1>> = self
            .groups
            .iter()
            .map(|(shape, idx)| {
                let [k, rows, cols] = *shape;
                let x = u.clone().select(0, idx.clone()).reshape([k, rows, cols]);
                let o = orthogonalize_batch(x, 5) * muon_scale(rows, cols);
                o.reshape([k * rows * cols])
            })
            .collect();
        results.push(Tensor::zeros([1], &u.device()));
        Tensor::cat(results, 0).select(0, self.back.clone())
    }
}
