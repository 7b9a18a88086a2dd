//! The feature stage of a training step: backbone + neck, run natively in Burn autodiff or
//! replayed from CUDA graphs. Both paths cut the autodiff tape at the features the same way, so
//! every gradient is summed in the same order and the two are byte-identical:
//! the head runs on leaf copies of P3/P4/P5, and the backbone/neck backward is a second,
//! seeded backward of `Σ_i sum(f_i ⊙ s_i)` whose seeds `s_i` are the leaves' gradients.

use crate::model::Yolo;
use crate::model::backbone::Features;
use crate::model::head::{Head, HeadOutput};
use crate::optim::reduce::sum_all;
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::Gradients;

#[cfg(feature = "cuda")]
use super::recorder::Recorder;

/// Where the backbone and neck of a step run.
pub enum FeatureStage {
    Native,
    #[cfg(feature = "cuda")]
    Replay(Box<Recorder>),
}

/// The features of one step: leaves for the head, and what the stage's backward needs.
pub struct StepFeatures {
    pub leaves: Features,
    /// Leaves of the one-to-many point stems' outputs when the stage computed them too (only
    /// the `RecordStems` negative control does).
    pub stems: Option<[Tensor<4>; 3]>,
    /// The stage's own autodiff features (native path only; the replay path keeps them inside
    /// its recorded graphs).
    taped: Option<Features>,
}

impl FeatureStage {
    pub fn is_replay(&self) -> bool {
        !matches!(self, FeatureStage::Native)
    }

    /// Backbone + neck on `images` (autodiff device). The replay path also writes the updated
    /// BatchNorm running statistics into `model`.
    pub fn forward(&mut self, model: &mut Yolo, images: Tensor<4>) -> StepFeatures {
        match self {
            FeatureStage::Native => {
                let taped = model.features(images);
                StepFeatures {
                    leaves: leaves_of(&taped),
                    stems: None,
                    taped: Some(taped),
                }
            }
            #[cfg(feature = "cuda")]
            FeatureStage::Replay(r) => {
                let (leaves, stems) = r.forward(model, images);
                StepFeatures {
                    leaves,
                    stems,
                    taped: None,
                }
            }
        }
    }

    /// The backbone and neck gradients, given the head's backward (`grads`).
    pub fn backward(
        &mut self,
        model: &Yolo,
        features: StepFeatures,
        grads: &Gradients,
    ) -> GradientsParams {
        let mut outputs: Vec<&Tensor<4>> = features.leaves.levels().to_vec();
        outputs.extend(features.stems.iter().flatten());
        let seeds = seeds(&outputs, grads);
        match (self, features.taped) {
            (FeatureStage::Native, Some(taped)) => {
                let root = seeded_root(&taped.levels(), &seeds);
                GradientsParams::from_grads(root.backward(), model)
            }
            #[cfg(feature = "cuda")]
            (FeatureStage::Replay(r), None) => r.backward(seeds),
            _ => unreachable!("features come from the stage's own forward"),
        }
    }
}

/// Fresh leaves sharing the features' buffers, so the head's backward stops at them.
pub fn leaves_of(f: &Features) -> Features {
    let leaf = |t: &Tensor<4>| Tensor::from_inner(t.clone().inner()).require_grad();
    Features {
        p3: leaf(&f.p3),
        p4: leaf(&f.p4),
        p5: leaf(&f.p5),
    }
}

impl StepFeatures {
    /// The complete head on these features (and on the given point-stem outputs, if any).
    pub fn head(&self, head: &Head) -> HeadOutput {
        head.forward_with_stems(&self.leaves, self.stems.clone())
    }
}

/// The head's gradient at each leaf (zeros where the loss did not reach), on the inner device.
pub fn seeds(leaves: &[&Tensor<4>], grads: &Gradients) -> Vec<Tensor<4>> {
    leaves
        .iter()
        .map(|l| {
            l.grad(grads)
                .unwrap_or_else(|| Tensor::zeros(l.dims(), &l.device().inner()))
        })
        .collect()
}

/// `Σ_i sum(f_i ⊙ s_i)`: its backward sends exactly `s_i` into `f_i` (the product's gradient is
/// `1 · s_i`), then on through the backbone and neck.
pub fn seeded_root(outputs: &[&Tensor<4>], seeds: &[Tensor<4>]) -> Tensor<1> {
    assert_eq!(outputs.len(), seeds.len(), "one seed per output");
    let terms: Vec<Tensor<1>> = outputs
        .iter()
        .zip(seeds)
        .map(|(f, s)| sum_all((*f).clone() * Tensor::from_inner(s.clone())))
        .collect();
    sum_all(Tensor::cat(terms, 0))
}

/// Moves every gradient of `from` into `into` (the two cover different parameters).
pub fn merge(
    into: &mut GradientsParams,
    mut from: GradientsParams,
    table: &[crate::optim::groups::ParamInfo],
) {
    use crate::optim::grads::{put_flat, take_flat};
    for p in table {
        if let Some(g) = take_flat(&mut from, p) {
            put_flat(into, p, g);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Scale, Task, YoloConfig};
    use crate::optim::grads::get_flat;
    use crate::optim::groups::param_table;

    /// The cut at the features changes only summation order: gradients of every parameter equal
    /// those of one uncut backward to float rounding.
    #[test]
    fn cut_backward_equals_one_backward() {
        let device = Device::flex().autodiff();
        device.seed(3);
        let mut model = YoloConfig::new(Scale::N, Task::Pose).init(&device);
        let x = Tensor::<4>::random(
            [2, 3, 64, 64],
            burn::tensor::Distribution::Uniform(0.0, 1.0),
            &device,
        );
        let loss = |out: crate::model::head::HeadOutput| {
            let b = out.one2many;
            (b.boxes.powi_scalar(2).sum() + b.scores.sum() + b.kpts.unwrap().tanh().sum()).sum()
        };
        let whole = GradientsParams::from_grads(loss(model.forward(x.clone())).backward(), &model);

        let mut stage = FeatureStage::Native;
        let f = stage.forward(&mut model, x);
        let head = loss(model.head.forward(&f.leaves)).backward();
        let below = stage.backward(&model, f, &head);
        let table = param_table(&model);
        let mut cut = GradientsParams::from_grads(head, &model);
        merge(&mut cut, below, &table);

        // Per tensor relative to its own size, with a floor at the largest gradient's rounding
        // level for tensors whose gradient nearly cancels (e.g. a beta before another BN).
        let pairs: Vec<_> = table
            .iter()
            .map(|p| (p, get_flat(&whole, p), get_flat(&cut, p)))
            .collect();
        let max = |t: &Tensor<1>| t.clone().abs().max().into_scalar::<f32>();
        let global = pairs
            .iter()
            .filter_map(|(_, a, _)| a.as_ref().map(max))
            .fold(0f32, f32::max);
        let mut compared = 0;
        for (p, a, b) in pairs {
            assert_eq!(a.is_some(), b.is_some(), "{}", p.path);
            let (Some(a), Some(b)) = (a, b) else { continue };
            let scale = max(&a);
            let diff = max(&(a - b));
            assert!(
                diff <= 1e-4 * scale + 1e-6 * global,
                "{}: diff {diff} of {scale} (largest gradient {global})",
                p.path
            );
            compared += 1;
        }
        assert!(compared > 200, "only {compared} gradients compared");
    }
}
