//! Learning-rate, momentum and accumulation schedule (yolo_spec §4.5): per-epoch linear or
//! cosine decay, and a per-iteration warm-up that interpolates from the warm-up values.

use super::groups::Group;
use super::state::Hyper;

#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    pub lr0: f64,
    pub lrf: f64,
    pub epochs: usize,
    pub cosine: bool,
    pub momentum: f64,
    pub warmup_momentum: f64,
    pub warmup_bias_lr: f64,
    /// Warm-up iterations (0 = none).
    pub warmup_iters: usize,
    pub batch: usize,
    pub nbs: usize,
    pub weight_decay: f64,
}

impl Schedule {
    /// Warm-up length: round(min(warmup_epochs, E − 1) · batches per epoch).
    pub fn warmup_iters(warmup_epochs: f64, epochs: usize, batches_per_epoch: usize) -> usize {
        if warmup_epochs <= 0.0 {
            return 0;
        }
        (warmup_epochs.min(epochs.saturating_sub(1) as f64) * batches_per_epoch as f64).round()
            as usize
    }

    /// LR factor of epoch `e`.
    pub fn lf(&self, e: usize) -> f64 {
        let (e, n) = (e as f64, self.epochs as f64);
        if self.cosine {
            ((1.0 - (std::f64::consts::PI * e / n).cos()) / 2.0) * (self.lrf - 1.0) + 1.0
        } else {
            (1.0 - e / n).max(0.0) * (1.0 - self.lrf) + self.lrf
        }
    }

    /// Nominal accumulation: max(round(nbs / batch), 1).
    pub fn nominal_accumulate(&self) -> usize {
        ((self.nbs as f64 / self.batch as f64).round() as usize).max(1)
    }

    fn warming(&self, ni: usize) -> Option<f64> {
        (self.warmup_iters > 0 && ni <= self.warmup_iters)
            .then(|| ni as f64 / self.warmup_iters as f64)
    }

    /// Micro-batches per optimizer step at global iteration `ni`.
    pub fn accumulate(&self, ni: usize) -> usize {
        let nominal = self.nbs as f64 / self.batch as f64;
        match self.warming(ni) {
            Some(f) => ((1.0 + f * (nominal - 1.0)).round() as usize).max(1),
            None => self.nominal_accumulate(),
        }
    }

    /// Hyper-parameters of iteration `ni` in epoch `epoch`.
    pub fn hyper(&self, epoch: usize, ni: usize) -> Hyper {
        let target = self.lr0 * self.lf(epoch);
        let weight_decay =
            self.weight_decay * (self.batch * self.nominal_accumulate()) as f64 / self.nbs as f64;
        let lerp = |a: f64, b: f64, f: f64| a + (b - a) * f;
        let (lr, momentum) = match self.warming(ni) {
            Some(f) => {
                let mut lr = [0.0; 3];
                for g in [Group::Weight, Group::Norm, Group::Bias] {
                    let start = if g == Group::Bias {
                        self.warmup_bias_lr
                    } else {
                        0.0
                    };
                    lr[g as usize] = lerp(start, target, f);
                }
                (lr, lerp(self.warmup_momentum, self.momentum, f))
            }
            None => ([target; 3], self.momentum),
        };
        Hyper {
            lr,
            momentum,
            weight_decay,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule() -> Schedule {
        Schedule {
            lr0: 0.01,
            lrf: 0.01,
            epochs: 10,
            cosine: false,
            momentum: 0.937,
            warmup_momentum: 0.8,
            warmup_bias_lr: 0.1,
            warmup_iters: 100,
            batch: 16,
            nbs: 64,
            weight_decay: 0.0005,
        }
    }

    #[test]
    fn linear_and_cosine_factors() {
        let mut s = schedule();
        assert!((s.lf(0) - 1.0).abs() < 1e-12);
        assert!((s.lf(5) - (0.5 * 0.99 + 0.01)).abs() < 1e-12);
        s.cosine = true;
        assert!((s.lf(0) - 1.0).abs() < 1e-12);
        assert!((s.lf(5) - (0.5 * (0.01 - 1.0) + 1.0)).abs() < 1e-12);
    }

    #[test]
    fn warmup_interpolates() {
        let s = schedule();
        let h0 = s.hyper(0, 0);
        assert_eq!(h0.lr, [0.0, 0.0, 0.1]);
        assert!((h0.momentum - 0.8).abs() < 1e-12);
        let h = s.hyper(0, 50);
        assert!((h.lr[Group::Bias as usize] - (0.1 + (0.01 - 0.1) * 0.5)).abs() < 1e-12);
        assert!((h.lr[Group::Weight as usize] - 0.005).abs() < 1e-12);
        assert_eq!(s.accumulate(0), 1);
        assert_eq!(s.accumulate(50), 3); // 1 + 0.5·3 = 2.5 rounds to 3
        assert_eq!(s.accumulate(101), 4);
        let after = s.hyper(1, 200);
        assert_eq!(after.lr, [0.01 * s.lf(1); 3]);
        assert!((after.weight_decay - 0.0005).abs() < 1e-12);
        assert_eq!(Schedule::warmup_iters(3.0, 5, 96), 288);
        assert_eq!(Schedule::warmup_iters(3.0, 2, 10), 10);
    }
}
