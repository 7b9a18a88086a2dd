//! RealNVP flow used by the RLE keypoint loss (yolo_spec §2.5). It has no part in the forward
//! pass of the network; the loss calls [`RealNvp::log_prob`].

use super::ops::{coupling, coupling_net, silu};
use burn::module::Initializer;
use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};

/// How the grouped flow ([`RealNvp::log_prob_grouped`]) runs, by name ([`choose`]): each
/// coupling one operation (`ops::coupling`, the default: on CUDA one kernel forward, three
/// backward, `kernels/coupling_layer.rs`); each coupling net one operation (`ops::coupling_net`,
/// the rest of the coupling tensor operations); or the module's layers.
pub const WAYS: [&str; 3] = ["couplings", "nets", "layers"];

static WAY: AtomicUsize = AtomicUsize::new(0);

/// Runs every later grouped flow of this process the way `name` ([`WAYS`]) says
/// (`bench-step --flow`). The ways compute the same values; they differ in the number of
/// operations, and in the order of the gradients' additions, hence in the last bits.
pub fn choose(name: &str) -> Result<(), String> {
    let i = WAYS
        .iter()
        .position(|w| *w == name)
        .ok_or_else(|| format!("unknown flow way {name:?}: expected one of {WAYS:?}"))?;
    WAY.store(i, Ordering::Relaxed);
    Ok(())
}

/// The way in use ([`choose`]).
pub fn chosen() -> &'static str {
    WAYS[WAY.load(Ordering::Relaxed)]
}

/// Number of affine coupling layers.
pub const COUPLINGS: usize = 6;

#[derive(Config, Debug)]
pub struct RealNvpConfig {
    #[config(default = 64)]
    pub hidden: usize,
}

impl RealNvpConfig {
    pub fn init(&self, device: &Device) -> RealNvp {
        let net = || CouplingNetConfig::new(self.hidden).init(device);
        RealNvp {
            scale_nets: (0..COUPLINGS).map(|_| net()).collect(),
            shift_nets: (0..COUPLINGS).map(|_| net()).collect(),
        }
    }
}

/// Linear(2,h) → SiLU → Linear(h,h) → SiLU → Linear(h,2); Xavier-uniform weights, gain 0.01.
/// The SiLUs are [`super::ops::silu`]: one operation each way (24 per flow pass).
#[derive(Config, Debug)]
pub struct CouplingNetConfig {
    pub hidden: usize,
}

impl CouplingNetConfig {
    pub fn init(&self, device: &Device) -> CouplingNet {
        let lin = |i, o| {
            LinearConfig::new(i, o)
                .with_initializer(Initializer::XavierUniform { gain: 0.01 })
                .init(device)
        };
        CouplingNet {
            fc1: lin(2, self.hidden),
            fc2: lin(self.hidden, self.hidden),
            fc3: lin(self.hidden, 2),
        }
    }
}

/// A coupling net's three weights and three biases ([`coupling_net`]'s operands).
type NetParameters = ([Tensor<2>; 3], [Tensor<1>; 3]);

#[derive(Module, Debug)]
pub struct CouplingNet {
    pub fc1: Linear,
    pub fc2: Linear,
    pub fc3: Linear,
}

impl CouplingNet {
    /// On points in the last dimension, any batch dimensions before it.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        self.fc3
            .forward(silu(self.fc2.forward(silu(self.fc1.forward(x)))))
    }

    /// The three layers' weights and biases, as [`coupling_net`] takes them (`None` when a
    /// layer has no bias).
    fn parameters(&self) -> Option<NetParameters> {
        let layers = [&self.fc1, &self.fc2, &self.fc3];
        let [b1, b2, b3] = layers.map(|l| l.bias.as_ref().map(|b| b.val()));
        Some((layers.map(|l| l.weight.val()), [b1?, b2?, b3?]))
    }

    /// On `[G, M, in]` points in groups: one operation ([`coupling_net`], on CUDA our kernels)
    /// unless the [`chosen`] way is `"layers"` (`layers_grouped`).
    pub fn forward_grouped(&self, x: Tensor<3>) -> Tensor<3> {
        if chosen() != "layers"
            && let Some((weights, biases)) = self.parameters()
        {
            return coupling_net(x, weights, biases);
        }
        self.layers_grouped(x)
    }

    /// [`CouplingNet::forward_grouped`] as the module's layers, each a matmul batched over the
    /// groups. Burn's `Linear` folds the groups into one `[G·M, in]` matrix, and a bias
    /// broadcast over both leading dimensions is reduced in one go too: either way its
    /// gradient is one reduction along all `G·M` points, which runs on a few GPU threads
    /// (0.2 ms for 8,000 points). Here the bias is expanded over the groups first, so its
    /// gradient reduces the points of each group (in parallel), then the groups.
    fn layers_grouped(&self, x: Tensor<3>) -> Tensor<3> {
        let layer = |l: &Linear, x: Tensor<3>| {
            let w = l.weight.val();
            let y = x.matmul(w.unsqueeze::<3>());
            let [g, _, out] = y.dims();
            match &l.bias {
                Some(b) => y + b.val().reshape([1, 1, out]).expand([g, 1, out]),
                None => y,
            }
        };
        let h = silu(layer(&self.fc1, x));
        let h = silu(layer(&self.fc2, h));
        layer(&self.fc3, h)
    }
}

#[derive(Module, Debug)]
pub struct RealNvp {
    /// s_i; their output goes through tanh.
    pub scale_nets: Vec<CouplingNet>,
    /// t_i.
    pub shift_nets: Vec<CouplingNet>,
}

impl RealNvp {
    /// log φ(x) for 2-D points `[N, 2]` → `[N]`: the inverse pass (data → latent) through the
    /// couplings in reverse order, then the standard-normal log density plus the log-determinant.
    pub fn log_prob(&self, x: Tensor<2>) -> Tensor<1> {
        let masks = Self::masks(&x.device());
        self.log_prob_with(x, &masks)
    }

    /// The coupling masks: they alternate [0, 1], [1, 0], … starting with layer 0, each row's
    /// complement following it (one upload; the rows are views).
    pub fn masks(device: &Device) -> Tensor<2> {
        Tensor::<2>::from_floats([[0.0f32, 1.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], device)
    }

    /// [`RealNvp::log_prob`] with the masks given (uploaded once: a recorded loss may not).
    pub fn log_prob_with(&self, x: Tensor<2>, masks: &Tensor<2>) -> Tensor<1> {
        let [n, _] = x.dims();
        self.log_prob_of(x, masks, CouplingNet::forward)
            .reshape([n])
    }

    /// log φ of points `[G, M, 2]` in `G` groups → `[G, M]`: [`RealNvp::log_prob`]'s
    /// arithmetic per point, batched over the groups, which keeps the gradient reductions
    /// parallel: each coupling one operation (`log_prob_coupled`), or the couplings written
    /// out around [`CouplingNet::forward_grouped`], as the [`chosen`] way says.
    pub fn log_prob_grouped(&self, x: Tensor<3>, masks: &Tensor<2>) -> Tensor<2> {
        let [g, m, _] = x.dims();
        if chosen() == "couplings"
            && let Some(nets) = self.nets()
        {
            return Self::log_prob_coupled(x, nets).reshape([g, m]);
        }
        self.log_prob_of(x, masks, CouplingNet::forward_grouped)
            .reshape([g, m])
    }

    /// Each coupling's s- and t-net parameters (`None` when a layer has no bias).
    fn nets(&self) -> Option<Vec<(NetParameters, NetParameters)>> {
        let nets = self.scale_nets.iter().zip(&self.shift_nets);
        nets.map(|(s, t)| Some((s.parameters()?, t.parameters()?)))
            .collect()
    }

    /// [`RealNvp::log_prob_grouped`] with each coupling one operation ([`coupling`]): the state
    /// `[G, M, 5]` (the point, the log-determinant, the coupling's `s` and `t`) goes through the
    /// couplings in reverse order. The same arithmetic per value as [`RealNvp::log_prob_of`]:
    /// there the masked terms are exact zeros and ones. Returns `[G, M, 1]`.
    fn log_prob_coupled(x: Tensor<3>, nets: Vec<(NetParameters, NetParameters)>) -> Tensor<3> {
        let [g, m, _] = x.dims();
        let log_det = Tensor::<3>::zeros([g, m, 1], &x.device());
        let mut state = Tensor::cat(vec![x, log_det], 2);
        for (i, (s, t)) in nets.into_iter().enumerate().rev() {
            // Layer i's mask row is [0, 1] for even i: the second coordinate is kept.
            let keep = 1 - i % 2;
            state = coupling(state, keep, s, t);
        }
        log_density(state.clone().narrow(2, 0, 2), state.narrow(2, 2, 1))
    }

    /// The pass on points in the last dimension, each coupling net applied by `net`; the
    /// result keeps that dimension, of size 1.
    fn log_prob_of<const D: usize>(
        &self,
        x: Tensor<D>,
        masks: &Tensor<2>,
        net: fn(&CouplingNet, Tensor<D>) -> Tensor<D>,
    ) -> Tensor<D> {
        let last = D - 1;
        let mut one = [1usize; D];
        one[last] = 2;
        let mut dims = x.dims();
        dims[last] = 1;
        let mut z = x;
        let mut log_det = Tensor::<D>::zeros(dims, &z.device());
        for i in (0..COUPLINGS).rev() {
            let row = 2 * (i % 2);
            let mask: Tensor<D> = masks.clone().narrow(0, row, 1).reshape(one);
            let inv: Tensor<D> = masks.clone().narrow(0, row + 1, 1).reshape(one);
            let zm = z.clone() * mask.clone();
            let s = net(&self.scale_nets[i], zm.clone()).tanh() * inv.clone();
            let t = net(&self.shift_nets[i], zm.clone()) * inv.clone();
            z = inv * (z - t) * s.clone().neg().exp() + zm;
            log_det = log_det - s.sum_dim(last);
        }
        log_density(z, log_det)
    }
}

/// The standard-normal log density of the latent points `z` (in the last dimension) plus the
/// log-determinant: log φ, the last dimension kept, of size 1.
fn log_density<const D: usize>(z: Tensor<D>, log_det: Tensor<D>) -> Tensor<D> {
    let ln_2pi = (2.0 * std::f64::consts::PI).ln();
    z.powi_scalar(2).sum_dim(D - 1) * (-0.5) - ln_2pi + log_det
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ParamCount;
    use burn::tensor::TensorData;
    use rand::{Rng, SeedableRng, rngs::StdRng};

    /// `shape` drawn from N(0, `std`) by the test's own generator (Box–Muller: rand's normal
    /// sampler is in rand_distr, not a dependency): the device's generator is shared with the
    /// tests running beside it, whose draws would change these.
    fn normal<const D: usize>(
        shape: [usize; D],
        std: f64,
        rng: &mut StdRng,
        d: &Device,
    ) -> Tensor<D> {
        let n = shape.iter().product();
        let draw = |_| {
            let (u, v): (f64, f64) = (rng.random_range(f64::EPSILON..1.0), rng.random());
            (std * (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
        };
        let values: Vec<f32> = (0..n).map(draw).collect();
        Tensor::from_data(TensorData::new(values, shape), d)
    }

    #[test]
    fn flow_params_and_density_integrates_to_one() {
        let d = Device::flex();
        let flow = RealNvpConfig::new().init(&d);
        assert_eq!(flow.param_count(), 53_784);
        // A correct inverse pass and log-determinant give a normalised density: integrate
        // exp(log φ) over a grid wide enough for the near-standard-normal it starts as.
        let (half, step) = (7.0f32, 0.05f32);
        let k = (2.0 * half / step) as usize;
        let pts: Vec<f32> = (0..k * k)
            .flat_map(|i| {
                let (r, c) = (i / k, i % k);
                [
                    -half + (r as f32 + 0.5) * step,
                    -half + (c as f32 + 0.5) * step,
                ]
            })
            .collect();
        let x = Tensor::<1>::from_floats(pts.as_slice(), &d).reshape([k * k, 2]);
        let mass = flow.log_prob(x).exp().sum().into_scalar::<f32>() * step * step;
        assert!((mass - 1.0).abs() < 1e-3, "density integrates to {mass}");
    }

    /// The coupling net as one operation (`ops::coupling_net`, its backward by hand) gives the
    /// module's layers' output and, through autodiff, their gradients for the input and every
    /// parameter, at weights far from the near-identity start.
    #[test]
    fn the_fused_coupling_net_equals_its_layers_with_gradients() {
        let d = Device::flex().autodiff();
        let mut rng = StdRng::seed_from_u64(29);
        let net = CouplingNetConfig::new(16).init(&d);
        let net = scrambled(net, 0.5, &mut rng, &d);
        let x0 = normal([3, 11, 2], 2.0, &mut rng, &d);
        let probe = normal([3, 11, 2], 1.0, &mut rng, &d);
        let run = |fused: bool| {
            let x = x0.clone().detach().require_grad();
            let y = if fused {
                let (w, b) = net.parameters().expect("biased layers");
                coupling_net(x.clone(), w, b)
            } else {
                net.layers_grouped(x.clone())
            };
            let grads = (y.clone() * probe.clone()).sum().backward();
            let mut out = vec![y.inner().reshape([66])];
            out.push(x.grad(&grads).unwrap().reshape([66]));
            for l in [&net.fc1, &net.fc2, &net.fc3] {
                let w = l.weight.val().grad(&grads).unwrap();
                let n = w.dims()[0] * w.dims()[1];
                out.push(w.reshape([n]));
                out.push(l.bias.as_ref().unwrap().val().grad(&grads).unwrap());
            }
            out
        };
        let (layers, fused_op) = (run(false), run(true));
        let names = ["y", "dx", "dw1", "db1", "dw2", "db2", "dw3", "db3"];
        for ((name, a), b) in names.iter().zip(layers).zip(fused_op) {
            let (a, b) = (
                a.into_data().try_to_vec::<f32>().unwrap(),
                b.into_data().try_to_vec::<f32>().unwrap(),
            );
            let err = crate::test_util::rel(&b, &a);
            assert!(err < 1e-5, "{name}: {err}");
            assert!(a.iter().any(|v| *v != 0.0), "{name}: all zero");
        }
    }

    /// `module` with every parameter drawn from N(0, `std`): far from the flow's near-identity
    /// start, so that every layer and coupling matters.
    fn scrambled<M: Module>(module: M, std: f64, rng: &mut StdRng, d: &Device) -> M {
        let mut drawn = crate::optim::tensors::float_tensors(&module)
            .into_iter()
            .map(|(p, t)| (p, normal([t.dims()[0]], std, rng, d)))
            .collect();
        crate::optim::tensors::replace_float_tensors(module, &mut drawn).0
    }

    /// Each coupling as one operation (`ops::coupling`, its backward by hand) gives the
    /// density of the couplings written out over the module's layers and, through autodiff,
    /// their gradients for the points and all 72 parameters, with either coordinate kept.
    #[test]
    fn each_coupling_as_one_operation_equals_the_layers_with_gradients() {
        let d = Device::flex().autodiff();
        let mut rng = StdRng::seed_from_u64(31);
        let flow = RealNvpConfig::new().with_hidden(16).init(&d);
        let flow = scrambled(flow, 0.3, &mut rng, &d);
        let x0 = normal([3, 11, 2], 2.0, &mut rng, &d);
        let probe = normal([3, 11, 1], 1.0, &mut rng, &d);
        let masks = RealNvp::masks(&d);
        let run = |fused: bool| {
            let x = x0.clone().detach().require_grad();
            let y = if fused {
                let nets = flow.nets().expect("biased layers");
                RealNvp::log_prob_coupled(x.clone(), nets)
            } else {
                flow.log_prob_of(x.clone(), &masks, CouplingNet::layers_grouped)
            };
            let grads = (y.clone() * probe.clone()).sum().backward();
            let mut out = vec![
                y.inner().reshape([33]),
                x.grad(&grads).unwrap().reshape([66]),
            ];
            for net in flow.scale_nets.iter().chain(&flow.shift_nets) {
                for l in [&net.fc1, &net.fc2, &net.fc3] {
                    let w = l.weight.val().grad(&grads).unwrap();
                    let n = w.dims()[0] * w.dims()[1];
                    out.push(w.reshape([n]));
                    out.push(l.bias.as_ref().unwrap().val().grad(&grads).unwrap());
                }
            }
            out
        };
        let (layers, coupled) = (run(false), run(true));
        assert_eq!(layers.len(), 2 + 72);
        for (k, (a, b)) in layers.into_iter().zip(coupled).enumerate() {
            let (a, b) = (
                a.into_data().try_to_vec::<f32>().unwrap(),
                b.into_data().try_to_vec::<f32>().unwrap(),
            );
            let err = crate::test_util::rel(&b, &a);
            assert!(err < 1e-5, "output {k}: {err}");
        }
    }

    /// The grouped pass gives every point the density of the plain one.
    #[test]
    fn grouped_density_equals_the_plain_one() {
        let d = Device::flex();
        let mut rng = StdRng::seed_from_u64(37);
        let flow = scrambled(RealNvpConfig::new().init(&d), 0.3, &mut rng, &d);
        let x = normal([5, 7, 2], 2.0, &mut rng, &d);
        let plain = flow.log_prob(x.clone().reshape([35, 2]));
        let grouped = flow.log_prob_grouped(x, &RealNvp::masks(&d)).reshape([35]);
        let (a, b) = (
            plain.into_data().try_to_vec::<f32>().unwrap(),
            grouped.into_data().try_to_vec::<f32>().unwrap(),
        );
        for (p, q) in a.iter().zip(&b) {
            assert!((p - q).abs() <= 1e-5 * p.abs().max(1.0), "{p} vs {q}");
        }
    }
}
