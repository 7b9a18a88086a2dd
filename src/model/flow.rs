//! RealNVP flow used by the RLE keypoint loss (yolo_spec §2.5). It has no part in the forward
//! pass of the network; the loss calls [`RealNvp::log_prob`].

use super::ops::silu;
use burn::module::Initializer;
use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;

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

#[derive(Module, Debug)]
pub struct CouplingNet {
    pub fc1: Linear,
    pub fc2: Linear,
    pub fc3: Linear,
}

impl CouplingNet {
    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.fc3
            .forward(silu(self.fc2.forward(silu(self.fc1.forward(x)))))
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
        let device = x.device();
        let [n, _] = x.dims();
        let mut z = x;
        let mut log_det = Tensor::<1>::zeros([n], &device);
        for i in (0..COUPLINGS).rev() {
            let row = 2 * (i % 2);
            let mask = masks.clone().narrow(0, row, 1);
            let inv = masks.clone().narrow(0, row + 1, 1);
            let zm = z.clone() * mask.clone();
            let s = self.scale_nets[i].forward(zm.clone()).tanh() * inv.clone();
            let t = self.shift_nets[i].forward(zm.clone()) * inv.clone();
            z = inv * (z - t) * s.clone().neg().exp() + zm;
            log_det = log_det - s.sum_dim(1).reshape([n]);
        }
        let ln_2pi = (2.0 * std::f64::consts::PI).ln();
        z.powi_scalar(2).sum_dim(1).reshape([n]) * (-0.5) - ln_2pi + log_det
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ParamCount;

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
}
