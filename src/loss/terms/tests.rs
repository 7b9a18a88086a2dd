//! The host terms against the device operations they replaced (`loss::reference`).

use super::*;
use crate::data::Instance;
use crate::loss::reference::branch_terms;
use crate::loss::{DEFAULT_GAINS, E2eLoss};
use crate::model::flow::RealNvpConfig;
use crate::model::{HeadOutput, Task};
use crate::test_util::rel;
use burn::module::Module;
use burn::tensor::TensorData;

/// A small deterministic generator (the cases must not depend on a crate's stream).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 40) as f32 / (1u64 << 24) as f32
    }
    fn range(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.next()
    }
}

/// Two 64×96 images with three objects each (some keypoints unlabelled), random head outputs
/// with `kpt_dim` values per keypoint (`None`: detection).
fn case(d: &Device, kpt_dim: Option<usize>, seed: u64) -> (HeadOutput, Vec<Vec<Instance>>) {
    let (nk, a) = (5, crate::loss::assign::Anchors::new(64, 96).len());
    // From our own stream, not the device's: that one is process-wide, and tests running
    // beside this one draw from it too.
    let outputs = std::cell::RefCell::new(Lcg(seed.wrapping_add(0x9e37_79b9)));
    let rand = |c: usize, lo: f32, hi: f32| {
        let mut rng = outputs.borrow_mut();
        let v: Vec<f32> = (0..2 * c * a).map(|_| rng.range(lo, hi)).collect();
        Tensor::<3>::from_data(TensorData::new(v, [2, c, a]), d)
    };
    let branch = || BranchOutput {
        boxes: rand(4, 0.2, 3.0),
        scores: rand(1, -3.0, 2.0),
        kpts: kpt_dim.map(|kd| rand(nk * kd, -1.5, 1.5)),
        kpts_sigma: kpt_dim.map(|_| rand(nk * 2, -1.0, 1.0)),
    };
    let mut rng = Lcg(seed);
    let labels = (0..2)
        .map(|_| {
            (0..3)
                .map(|_| {
                    let (x1, y1) = (rng.range(0.0, 60.0), rng.range(0.0, 40.0));
                    let (x2, y2) = (x1 + rng.range(10.0, 36.0), y1 + rng.range(10.0, 24.0));
                    let keypoints = (0..if kpt_dim.is_some() { nk } else { 0 })
                        .map(|_| {
                            let v = [0.0, 1.0, 2.0][(rng.next() * 3.0) as usize % 3];
                            [rng.range(x1, x2), rng.range(y1, y2), v]
                        })
                        .collect();
                    Instance {
                        class: 0,
                        bbox: [x1, y1, x2.min(96.0), y2.min(64.0)],
                        keypoints,
                    }
                })
                .collect()
        })
        .collect();
    let out = HeadOutput {
        one2many: branch(),
        one2one: branch(),
    };
    (out, labels)
}

/// Every parameter refilled from our own stream in ±`bound` (see [`case`]).
struct Fill(Lcg, f32);

impl burn::module::ModuleMapper for Fill {
    fn map_float<const D: usize>(
        &mut self,
        param: burn::module::Param<Tensor<D>>,
    ) -> burn::module::Param<Tensor<D>> {
        let old = param.val();
        let shape = old.shape();
        let v: Vec<f32> = (0..shape.num_elements())
            .map(|_| self.0.range(-self.1, self.1))
            .collect();
        let new = Tensor::<D>::from_data(TensorData::new(v, shape), &old.device());
        burn::module::Param::initialized(param.id, new.require_grad())
    }
}

fn leaf(t: &Tensor<3>) -> Tensor<3> {
    t.clone().detach().require_grad()
}

fn values(t: Tensor<1>) -> Vec<f32> {
    t.into_data().try_into_vec::<f32>().unwrap()
}

/// Relative differences of the weighted terms and of the gradients of every head output and of
/// a flow weight, host terms against the reference whose gains are `reference_gains`.
fn compare(kpt_dim: Option<usize>, seed: u64, reference_gains: [f32; 6]) -> (f32, Vec<f32>) {
    let d = Device::flex().autodiff();
    let flow = RealNvpConfig::new()
        .init(&d)
        .map(&mut Fill(Lcg(seed.wrapping_add(7)), 0.3));
    let task = if kpt_dim.is_some() {
        Task::Pose
    } else {
        Task::Detect
    };
    let loss = E2eLoss::new(task, 5, [64, 96]);
    let (out, labels) = case(&d, kpt_dim, seed);
    let targets = loss.targets(&out, &labels);
    assert!(
        targets.one2many.num_fg() >= 6,
        "a case with many foreground rows"
    );
    let mut term_error = 0f32;
    let mut grad_errors = vec![0f32; 5];
    for (o, t) in [
        (&out.one2many, &targets.one2many),
        (&out.one2one, &targets.one2one),
    ] {
        let x = BranchOutput {
            boxes: leaf(&o.boxes),
            scores: leaf(&o.scores),
            kpts: o.kpts.as_ref().map(leaf),
            kpts_sigma: o.kpts_sigma.as_ref().map(leaf),
        };
        let mine = branch_loss(&x, t, Some(&flow), loss.imgsz, &loss.sigmas, DEFAULT_GAINS);
        let terms = branch_terms(&x, t, Some(&flow), loss.imgsz, &loss.sigmas);
        let weighted: Vec<Tensor<1>> = terms
            .into_iter()
            .zip(reference_gains)
            .map(|(t, g)| t * g)
            .collect();
        let reference = Tensor::cat(weighted, 0);
        term_error = term_error.max(rel(
            &values(mine.items.clone()),
            &values(reference.clone().inner()),
        ));
        let (ga, gb) = (mine.sum.backward(), reference.sum().backward());
        let g3 = |t: &Tensor<3>, g: &_| {
            t.grad(g)
                .map(|x| x.into_data().try_into_vec::<f32>().unwrap())
                .unwrap_or_default()
        };
        let fc1 = |g: &_| {
            flow.scale_nets[2]
                .fc1
                .weight
                .grad(g)
                .map(|x| x.into_data().try_into_vec::<f32>().unwrap())
                .unwrap_or_default()
        };
        let pairs = [
            (g3(&x.boxes, &ga), g3(&x.boxes, &gb)),
            (g3(&x.scores, &ga), g3(&x.scores, &gb)),
            (
                x.kpts.as_ref().map(|k| g3(k, &ga)).unwrap_or_default(),
                x.kpts.as_ref().map(|k| g3(k, &gb)).unwrap_or_default(),
            ),
            (
                x.kpts_sigma
                    .as_ref()
                    .map(|k| g3(k, &ga))
                    .unwrap_or_default(),
                x.kpts_sigma
                    .as_ref()
                    .map(|k| g3(k, &gb))
                    .unwrap_or_default(),
            ),
            (fc1(&ga), fc1(&gb)),
        ];
        for (k, (a, b)) in pairs.iter().enumerate() {
            assert_eq!(a.len(), b.len(), "gradient {k} present in one only");
            if !b.is_empty() {
                grad_errors[k] = grad_errors[k].max(rel(a, b));
            }
        }
    }
    (term_error, grad_errors)
}

/// How far the host terms may be from the reference: weighted terms, and gradients.
const TERMS_TOL: f32 = 1e-5;
const GRADS_TOL: f32 = 1e-4;

#[test]
fn host_terms_give_the_device_operations_values_and_gradients() {
    for (kpt_dim, seed) in [(Some(3), 1), (Some(3), 2), (Some(2), 3), (None, 4)] {
        let (terms, grads) = compare(kpt_dim, seed, DEFAULT_GAINS);
        println!("kpt_dim {kpt_dim:?}: terms {terms:e}, gradients {grads:?}");
        assert!(terms < TERMS_TOL, "{kpt_dim:?}: terms differ by {terms}");
        // boxes, scores, keypoints, sigmas, a flow weight
        for (k, e) in grads.iter().enumerate() {
            assert!(*e < GRADS_TOL, "{kpt_dim:?}: gradient {k} differs by {e}");
        }
    }
}

/// The comparison sees a term whose weight differs by 10 % (here l1 and kobj): the differences
/// exceed the tolerances above, so the check above would fail. (kobj reaches only the keypoints'
/// visibility channels, whose gradients are a small part of the keypoint output's largest.)
#[test]
fn host_terms_check_sees_a_changed_gain() {
    let mut gains = DEFAULT_GAINS;
    gains[4] *= 1.1;
    let (_, grads) = compare(Some(3), 1, gains);
    assert!(grads[0] > 10.0 * GRADS_TOL, "boxes: {}", grads[0]);
    let mut gains = DEFAULT_GAINS;
    gains[2] *= 1.1;
    let (terms, grads) = compare(Some(3), 1, gains);
    assert!(
        terms > 100.0 * TERMS_TOL && grads[2] > GRADS_TOL,
        "kobj: {terms} {}",
        grads[2]
    );
}

/// Without foreground rows the host terms are zero and have no gradient rows.
#[test]
fn host_terms_without_foreground_are_zero() {
    let d = Device::flex();
    let loss = E2eLoss::new(Task::Pose, 5, [64, 96]);
    let (out, _) = case(&d, Some(3), 9);
    let targets = loss.targets(&out, &[vec![], vec![]]);
    let h = host_terms(&targets.one2many, loss.imgsz, &loss.sigmas);
    assert_eq!(h, HostTerms::default());
}
