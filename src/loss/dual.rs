//! Forward-mode derivatives for the host-side loss terms: a value with its partial derivatives
//! with respect to `N` inputs. The box term's CIoU is written once, generic over [`Real`], and
//! gives the assignment its `f32` value and the loss its gradient through [`Dual`].
//!
//! Hand-written rather than a crate: the CIoU needs six operations on four inputs, and the
//! crates that offer dual numbers bring generic numeric towers for far more.

use std::ops::{Add, Div, Mul, Sub};

/// The arithmetic the generic formulas use. For `f32` every method is the plain `f32` one, so a
/// formula gives the same bits as when written for `f32` directly.
pub trait Real:
    Copy + From<f32> + Add<Output = Self> + Sub<Output = Self> + Mul<Output = Self> + Div<Output = Self>
{
    fn min(self, other: Self) -> Self;
    fn max(self, other: Self) -> Self;
    fn atan(self) -> Self;
    fn value(self) -> f32;
    /// The same value, carrying no derivative (autodiff's `detach`).
    fn detach(self) -> Self {
        Self::from(self.value())
    }
}

impl Real for f32 {
    fn min(self, other: Self) -> Self {
        f32::min(self, other)
    }
    fn max(self, other: Self) -> Self {
        f32::max(self, other)
    }
    fn atan(self) -> Self {
        f32::atan(self)
    }
    fn value(self) -> f32 {
        self
    }
}

/// `v` and `∂v/∂input_i` for `N` inputs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dual<const N: usize> {
    pub v: f32,
    pub d: [f32; N],
}

impl<const N: usize> Dual<N> {
    /// Input `i` of `N` with value `v` (∂/∂input_i = 1).
    pub fn input(v: f32, i: usize) -> Self {
        let mut d = [0.0; N];
        d[i] = 1.0;
        Self { v, d }
    }

    fn chain(self, v: f32, slope: f32) -> Self {
        Self {
            v,
            d: self.d.map(|x| x * slope),
        }
    }
}

impl<const N: usize> From<f32> for Dual<N> {
    fn from(v: f32) -> Self {
        Self { v, d: [0.0; N] }
    }
}

impl<const N: usize> Add for Dual<N> {
    type Output = Self;
    fn add(self, o: Self) -> Self {
        Self {
            v: self.v + o.v,
            d: std::array::from_fn(|i| self.d[i] + o.d[i]),
        }
    }
}

impl<const N: usize> Sub for Dual<N> {
    type Output = Self;
    fn sub(self, o: Self) -> Self {
        Self {
            v: self.v - o.v,
            d: std::array::from_fn(|i| self.d[i] - o.d[i]),
        }
    }
}

// The product and quotient rules use + and − inside `Mul` and `Div`.
#[allow(clippy::suspicious_arithmetic_impl)]
impl<const N: usize> Mul for Dual<N> {
    type Output = Self;
    fn mul(self, o: Self) -> Self {
        Self {
            v: self.v * o.v,
            d: std::array::from_fn(|i| self.d[i] * o.v + o.d[i] * self.v),
        }
    }
}

#[allow(clippy::suspicious_arithmetic_impl)]
impl<const N: usize> Div for Dual<N> {
    type Output = Self;
    fn div(self, o: Self) -> Self {
        let q = self.v / o.v;
        Self {
            v: q,
            d: std::array::from_fn(|i| (self.d[i] - q * o.d[i]) / o.v),
        }
    }
}

impl<const N: usize> Real for Dual<N> {
    /// The derivative of the operand taken (the first one on a tie).
    fn min(self, o: Self) -> Self {
        if o.v < self.v { o } else { self }
    }
    fn max(self, o: Self) -> Self {
        if o.v > self.v { o } else { self }
    }
    fn atan(self) -> Self {
        self.chain(self.v.atan(), 1.0 / (1.0 + self.v * self.v))
    }
    fn value(self) -> f32 {
        self.v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each operation's derivative against a central difference in f64 of the same formula.
    #[test]
    fn derivatives_match_central_differences() {
        fn f<T: Real>(x: T, y: T) -> T {
            let two = T::from(2.0);
            (x * y + x / (y + two)).atan() - x.min(y) * two + x.max(T::from(0.25)) / y
                - (x * x).detach()
        }
        fn f64_f(x: f64, y: f64, x_const: f64) -> f64 {
            (x * y + x / (y + 2.0)).atan() - x.min(y) * 2.0 + x.max(0.25) / y - x_const * x_const
        }
        for (x, y) in [(0.3f32, 1.7f32), (-0.8, 0.6), (1.9, 1.2), (0.1, -3.0)] {
            let d = f(Dual::<2>::input(x, 0), Dual::<2>::input(y, 1));
            assert_eq!(d.v, f(x, y), "value equals the f32 formula's");
            let h = 1e-4;
            let (xf, yf) = (x as f64, y as f64);
            let dx = (f64_f(xf + h, yf, xf) - f64_f(xf - h, yf, xf)) / (2.0 * h);
            let dy = (f64_f(xf, yf + h, xf) - f64_f(xf, yf - h, xf)) / (2.0 * h);
            assert!(
                (d.d[0] as f64 - dx).abs() < 1e-3,
                "{x},{y}: {} vs {dx}",
                d.d[0]
            );
            assert!(
                (d.d[1] as f64 - dy).abs() < 1e-3,
                "{x},{y}: {} vs {dy}",
                d.d[1]
            );
        }
    }
}
