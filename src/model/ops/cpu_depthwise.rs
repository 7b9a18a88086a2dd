//! A depthwise convolution and both its gradients on the CPU as loops of ours over each
//! channel's plane. burn-flex runs the data gradient as a transposed convolution with one matrix
//! product per image and channel (taps × 1 by 1 × pixels) and a scatter of its columns, and the
//! weight gradient through Burn's generic route; at `configs/pose_nano.toml` the two took 17 ms
//! of a ~295 ms CPU step for a few thousand multiply-adds per channel (`bench-conv`,
//! docs/perf_log.md). At stride 1 (every depthwise layer of YOLO26) each tap is one long run
//! over a padded frame ([`Frames`]); other strides go row by row (the gradients) or stay
//! burn-flex's (the forward).
//!
//! Every value is a fixed-order sum (taps in row-major order; the weight gradient's products in
//! [`LANES`] partial sums added pairwise), so results do not depend on the machine or on threads.

use super::conv::is_depthwise;
use super::host::{Geometry, LANES, dispatched, tensor, total, values};
use burn::backend::ops::ConvOptions;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Flex, Shape, TensorMetadata};
use burn::tensor::DType;

/// A stride-1 depthwise convolution of FP32 `x` `[N, C, H, W]` by `weight` `[C, 1, kh, kw]`,
/// without bias. `None` for other convolutions, strides and dtypes.
pub fn forward(
    x: &FloatTensor<Flex>,
    weight: &FloatTensor<Flex>,
    options: &ConvOptions<2>,
) -> Option<FloatTensor<Flex>> {
    let fp32 = x.dtype() == DType::F32 && weight.dtype() == DType::F32;
    let (xs, ws) = (x.shape(), weight.shape());
    if !fp32 || options.stride != [1, 1] || !is_depthwise(xs[1], &ws, options) {
        return None;
    }
    let (g, shape) = Geometry::forward(&xs, &ws, options)?;
    let (xv, w) = (values(x), values(weight));
    let (plane_in, plane_out, taps) = (g.input_plane(), g.output_plane(), g.taps());
    let mut y = vec![0f32; shape.num_elements()];
    let mut frames = Frames::new(g)?;
    for (p, (y, x)) in y
        .chunks_exact_mut(plane_out)
        .zip(xv.chunks_exact(plane_in))
        .enumerate()
    {
        frames.forward(x, &w[(p % xs[1]) * taps..][..taps], y);
    }
    Some(tensor(y, shape))
}

/// The data gradient `[N, C, H, W]` (the input's `shape`) of a depthwise convolution from FP32
/// `weight` and `grad`. `None` for other convolutions and dtypes.
pub fn data_grad(
    shape: &Shape,
    weight: &FloatTensor<Flex>,
    grad: &FloatTensor<Flex>,
    options: &ConvOptions<2>,
) -> Option<FloatTensor<Flex>> {
    let fp32 = weight.dtype() == DType::F32 && grad.dtype() == DType::F32;
    if !fp32 || !is_depthwise(shape[1], &weight.shape(), options) {
        return None;
    }
    let g = Geometry::new(shape, &weight.shape(), &grad.shape(), options);
    let (w, dy) = (values(weight), values(grad));
    let (plane_in, plane_out, taps) = (g.input_plane(), g.output_plane(), g.taps());
    let mut dx = vec![0f32; shape.num_elements()];
    let mut frames = Frames::new(g);
    for (p, (dx, dy)) in dx
        .chunks_exact_mut(plane_in)
        .zip(dy.chunks_exact(plane_out))
        .enumerate()
    {
        let w = &w[(p % shape[1]) * taps..][..taps];
        match frames.as_mut() {
            Some(frames) => frames.data_grad(dy, w, dx),
            None => data_grad_plane(dy, w, dx, g),
        }
    }
    Some(tensor(dx, shape.clone()))
}

/// The weight gradient `[C, 1, kh, kw]` of a depthwise convolution of FP32 `x` by `weight`,
/// given `grad`. `None` for other convolutions and dtypes.
pub fn weight_grad(
    x: &FloatTensor<Flex>,
    weight: &FloatTensor<Flex>,
    grad: &FloatTensor<Flex>,
    options: &ConvOptions<2>,
) -> Option<FloatTensor<Flex>> {
    let fp32 = [x, weight, grad].iter().all(|t| t.dtype() == DType::F32);
    let (xs, ws) = (x.shape(), weight.shape());
    if !fp32 || !is_depthwise(xs[1], &ws, options) {
        return None;
    }
    let g = Geometry::new(&xs, &ws, &grad.shape(), options);
    let (xv, dy) = (values(x), values(grad));
    let (n, c) = (xs[0], xs[1]);
    let (plane_in, plane_out, taps) = (g.input_plane(), g.output_plane(), g.taps());
    let mut dw = vec![0f32; c * taps];
    let mut frames = Frames::new(g);
    for (ch, dw) in dw.chunks_exact_mut(taps).enumerate() {
        let mut acc = vec![[0f32; LANES]; taps];
        for b in 0..n {
            let p = b * c + ch;
            let x = &xv[p * plane_in..][..plane_in];
            let dy = &dy[p * plane_out..][..plane_out];
            match frames.as_mut() {
                Some(frames) => frames.weight_grad(x, dy, &mut acc),
                None => weight_grad_plane(x, dy, &mut acc, g),
            }
        }
        for (d, acc) in dw.iter_mut().zip(acc) {
            *d = total(acc);
        }
    }
    Some(tensor(dw, ws))
}

/// Stride 1: each plane in a zero-padded frame `Wp` wide, so that tap `(i, j)` of every output
/// is one run: output `q = oy · Wp + ox` reads frame value `q + i · dh · Wp + j · dw`. The
/// gradient is laid out `Wp` wide too, zero past `Wo` in each row, so the columns a run wraps
/// over add nothing; a tap is then one multiply-add or dot product over `(Ho − 1) · Wp + Wo`
/// values instead of `Ho` runs of `Wo` (24 values at most at the step's widths).
struct Frames {
    g: Geometry,
    width: usize,
    /// The padded plane: the input (forward, weight gradient) or its gradient (data gradient).
    plane: Vec<f32>,
    /// The output or its gradient, `Wp` wide (zero past `Wo` when it is the gradient).
    out: Vec<f32>,
}

impl Frames {
    /// `None` unless the stride is 1.
    fn new(g: Geometry) -> Option<Self> {
        if g.stride != [1, 1] {
            return None;
        }
        let width = g.output[1] + (g.kernel[1] - 1) * g.dilation[1];
        let height = g.output[0] + (g.kernel[0] - 1) * g.dilation[0];
        Some(Self {
            g,
            width,
            plane: vec![0.0; height * width],
            out: vec![0.0; g.output[0] * width],
        })
    }

    /// The run every tap covers.
    fn run(&self) -> usize {
        (self.g.output[0] - 1) * self.width + self.g.output[1]
    }

    /// Each tap `(i, j)` in row-major order: its index `i · kw + j` and its offset
    /// `i · dh · Wp + j · dw` into the frame.
    fn taps(&self) -> impl Iterator<Item = (usize, usize)> + use<> {
        let ([kh, kw], [dh, dw], width) = (self.g.kernel, self.g.dilation, self.width);
        (0..kh).flat_map(move |i| (0..kw).map(move |j| (i * kw + j, i * dh * width + j * dw)))
    }

    /// Copies `dy` (`Ho × Wo`) into the `Wp`-wide gradient, zero in the other columns.
    fn load_grad(&mut self, dy: &[f32]) {
        let wo = self.g.output[1];
        for (row, src) in self
            .out
            .chunks_exact_mut(self.width)
            .zip(dy.chunks_exact(wo))
        {
            row[..wo].copy_from_slice(src);
            row[wo..].fill(0.0);
        }
    }

    /// The frame's rows and columns that hold the plane (the rest is padding).
    fn inside(&self) -> impl Iterator<Item = (usize, usize)> + use<> {
        let ([h, w], [top, left], width) = (self.g.input, self.g.before, self.width);
        (0..h).map(move |r| ((top + r) * width + left, r * w))
    }

    /// Copies the plane `x` into the frame's inside (the padding stays zero).
    fn load_input(&mut self, x: &[f32]) {
        let w = self.g.input[1];
        for (frame, plane) in self.inside() {
            self.plane[frame..frame + w].copy_from_slice(&x[plane..plane + w]);
        }
    }

    fn forward(&mut self, x: &[f32], w: &[f32], y: &mut [f32]) {
        self.load_input(x);
        self.out.fill(0.0);
        let run = self.run();
        for (t, at) in self.taps() {
            axpy(w[t], &self.plane[at..at + run], &mut self.out[..run]);
        }
        let wo = self.g.output[1];
        for (row, dst) in self
            .out
            .chunks_exact(self.width)
            .zip(y.chunks_exact_mut(wo))
        {
            dst.copy_from_slice(&row[..wo]);
        }
    }

    fn data_grad(&mut self, dy: &[f32], w: &[f32], dx: &mut [f32]) {
        self.load_grad(dy);
        self.plane.fill(0.0);
        let run = self.run();
        for (t, at) in self.taps() {
            axpy(w[t], &self.out[..run], &mut self.plane[at..at + run]);
        }
        let w = self.g.input[1];
        for (frame, plane) in self.inside() {
            dx[plane..plane + w].copy_from_slice(&self.plane[frame..frame + w]);
        }
    }

    fn weight_grad(&mut self, x: &[f32], dy: &[f32], acc: &mut [[f32; LANES]]) {
        self.load_grad(dy);
        self.load_input(x);
        let run = self.run();
        for (t, at) in self.taps() {
            dot_into(&self.out[..run], &self.plane[at..at + run], &mut acc[t]);
        }
    }
}

dispatched! {
    /// `dst[k] += w · src[k]`.
    fn axpy(w: f32, src: &[f32], dst: &mut [f32]) {
        for (d, &v) in dst.iter_mut().zip(src) {
            *d = v.mul_add(w, *d);
        }
    }
}

dispatched! {
    /// Adds `a[k] · b[k]` into lane `k mod LANES`.
    fn dot_into(a: &[f32], b: &[f32], acc: &mut [f32; LANES]) {
        let (ab, ar) = a.as_chunks::<LANES>();
        let (bb, br) = b.as_chunks::<LANES>();
        for (ab, bb) in ab.iter().zip(bb) {
            for l in 0..LANES {
                acc[l] = ab[l].mul_add(bb[l], acc[l]);
            }
        }
        for (l, (&av, &bv)) in ar.iter().zip(br).enumerate() {
            acc[l] = av.mul_add(bv, acc[l]);
        }
    }
}

/// Other strides: adds one plane's data gradient into `dx` (zeros), tap by tap and row by row,
/// `dx[o · s + offset] += w[tap] · dy[o]` over the outputs whose input lies inside the plane.
fn data_grad_plane(dy: &[f32], w: &[f32], dx: &mut [f32], g: Geometry) {
    let ([_, width], [_, wo]) = (g.input, g.output);
    let sw = g.stride[1];
    for i in 0..g.kernel[0] {
        let (dy_off, oy0, oy1) = g.tap(0, i);
        for j in 0..g.kernel[1] {
            let (dx_off, ox0, ox1) = g.tap(1, j);
            if ox0 >= ox1 {
                continue;
            }
            let wt = w[i * g.kernel[1] + j];
            let first = ((ox0 * sw) as isize + dx_off) as usize;
            for oy in oy0..oy1 {
                let iy = ((oy * g.stride[0]) as isize + dy_off) as usize;
                let src = &dy[oy * wo + ox0..oy * wo + ox1];
                let row = &mut dx[iy * width..][..width];
                if sw == 1 {
                    axpy(wt, src, &mut row[first..first + src.len()]);
                } else {
                    for (k, &v) in src.iter().enumerate() {
                        let d = &mut row[first + k * sw];
                        *d = v.mul_add(wt, *d);
                    }
                }
            }
        }
    }
}

/// Other strides: adds one plane's products `dy[o] · x[o · s + offset]` into each tap's partial
/// sums, row by row (product `k` of a row into lane `k mod LANES`).
fn weight_grad_plane(x: &[f32], dy: &[f32], acc: &mut [[f32; LANES]], g: Geometry) {
    let ([_, width], [_, wo]) = (g.input, g.output);
    let sw = g.stride[1];
    for i in 0..g.kernel[0] {
        let (y_off, oy0, oy1) = g.tap(0, i);
        for j in 0..g.kernel[1] {
            let (x_off, ox0, ox1) = g.tap(1, j);
            if ox0 >= ox1 {
                continue;
            }
            let acc = &mut acc[i * g.kernel[1] + j];
            let first = ((ox0 * sw) as isize + x_off) as usize;
            for oy in oy0..oy1 {
                let iy = ((oy * g.stride[0]) as isize + y_off) as usize;
                let grad = &dy[oy * wo + ox0..oy * wo + ox1];
                let row = &x[iy * width..][..width];
                if sw == 1 {
                    dot_into(grad, &row[first..first + grad.len()], acc);
                } else {
                    for (k, &gv) in grad.iter().enumerate() {
                        let l = k % LANES;
                        acc[l] = gv.mul_add(row[first + k * sw], acc[l]);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::host::testing::random;
    use super::*;
    use burn::backend::ops::ModuleOps;
    use burn::backend::tensor::FloatTensor;
    use rand::{SeedableRng, rngs::StdRng};

    /// The output and both gradients in `f64` by the definition, with each value's sum of
    /// absolute terms: `y[b, c, o] = Σ_t w[c, t] · x[b, c, o · s + t · d − pad]`.
    fn reference(
        x: &[f32],
        w: &[f32],
        dy: &[f32],
        [n, c, h, wd]: [usize; 4],
        [ho, wo]: [usize; 2],
        (k, [sh, sw], [(top, _), (left, _)], d): (usize, [usize; 2], [(usize, usize); 2], usize),
    ) -> [Vec<(f64, f64)>; 3] {
        let mut y = vec![(0f64, 0f64); n * c * ho * wo];
        let mut dx = vec![(0f64, 0f64); n * c * h * wd];
        let mut dw = vec![(0f64, 0f64); c * k * k];
        for b in 0..n {
            for ch in 0..c {
                for oy in 0..ho {
                    for ox in 0..wo {
                        let out = ((b * c + ch) * ho + oy) * wo + ox;
                        let g = dy[out] as f64;
                        for i in 0..k {
                            for j in 0..k {
                                let iy = (oy * sh + i * d) as isize - top as isize;
                                let ix = (ox * sw + j * d) as isize - left as isize;
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                                    continue;
                                }
                                let at = ((b * c + ch) * h + iy as usize) * wd + ix as usize;
                                let tap = (ch * k + i) * k + j;
                                let (xv, wv) = (x[at] as f64, w[tap] as f64);
                                y[out].0 += xv * wv;
                                y[out].1 += (xv * wv).abs();
                                dx[at].0 += g * wv;
                                dx[at].1 += (g * wv).abs();
                                dw[tap].0 += g * xv;
                                dw[tap].1 += (g * xv).abs();
                            }
                        }
                    }
                }
            }
        }
        [y, dx, dw]
    }

    /// Within 6e-7 of the terms' magnitude (five FP32 ulps of it) of the exact value: a sum of
    /// nine rounded terms may be off by that much in the worst case.
    fn close(got: &FloatTensor<Flex>, want: &[(f64, f64)], what: &str) {
        let got = values(got);
        assert_eq!(got.len(), want.len(), "{what}: length");
        for (i, (&g, &(exact, scale))) in got.iter().zip(want).enumerate() {
            let err = (g as f64 - exact).abs();
            assert!(
                err <= 6e-7 * scale + 1e-30,
                "{what}: value {i} is {g}, exact {exact} (terms' magnitude {scale})"
            );
        }
    }

    /// The forward and both gradients against the definition at odd sizes, strides 1, 2 and
    /// (2, 1), kernels 3 and 5, no, equal, larger-than-kernel and asymmetric padding, and
    /// dilation 2; and Burn's own results held to the same bound, so the bound is one Burn meets
    /// too.
    #[test]
    fn gradients_match_the_definition() {
        let mut rng = StdRng::seed_from_u64(7);
        // (batch, channels, h, w, k, stride, padding, dilation)
        type Case = (
            usize,
            usize,
            usize,
            usize,
            usize,
            [usize; 2],
            [(usize, usize); 2],
            usize,
        );
        let cases: [Case; 10] = [
            (4, 64, 24, 24, 3, [1, 1], [(1, 1), (1, 1)], 1),
            (3, 5, 7, 5, 3, [1, 1], [(1, 1), (1, 1)], 1),
            (2, 3, 9, 11, 3, [2, 2], [(1, 1), (1, 1)], 1),
            (1, 4, 13, 10, 5, [1, 1], [(2, 2), (2, 2)], 1),
            (2, 2, 8, 9, 5, [2, 2], [(2, 2), (2, 2)], 1),
            (3, 3, 6, 7, 3, [1, 1], [(0, 0), (0, 0)], 1),
            (2, 4, 11, 9, 3, [1, 1], [(2, 2), (2, 2)], 2),
            (1, 3, 8, 7, 3, [2, 2], [(0, 1), (1, 0)], 1),
            (2, 3, 9, 8, 3, [2, 1], [(1, 1), (1, 1)], 1),
            (1, 2, 7, 9, 3, [1, 1], [(0, 2), (1, 0)], 1),
        ];
        for (n, c, h, w, k, s, pad, d) in cases {
            let what = format!("n{n} c{c} {h}×{w} k{k} s{s:?} pad{pad:?} d{d}");
            let options = ConvOptions::new_with_padding(s, pad, [d, d], c);
            let x = random([n, c, h, w], 1.0, &mut rng);
            let weight = random([c, 1, k, k], 1.0, &mut rng);
            let y = Flex::conv2d(x.clone(), weight.clone(), None, options.clone());
            let ys = y.shape();
            let grad = random([ys[0], ys[1], ys[2], ys[3]], 1.0, &mut rng);
            let [want_y, want_dx, want_dw] = reference(
                &values(&x),
                &values(&weight),
                &values(&grad),
                [n, c, h, w],
                [ys[2], ys[3]],
                (k, s, pad, d),
            );
            let ours = forward(&x, &weight, &options);
            assert_eq!(
                ours.is_some(),
                s == [1, 1],
                "forward taken at stride 1 only, {what}"
            );
            if let Some(ours) = ours {
                close(&ours, &want_y, &format!("forward, {what}"));
            }
            close(&y, &want_y, &format!("Burn's forward, {what}"));
            let dx = data_grad(&x.shape(), &weight, &grad, &options).expect("depthwise");
            close(&dx, &want_dx, &format!("data gradient, {what}"));
            let dw = weight_grad(&x, &weight, &grad, &options).expect("depthwise");
            close(&dw, &want_dw, &format!("weight gradient, {what}"));
            let burns =
                Flex::conv2d_x_backward(x.clone(), weight.clone(), grad.clone(), options.clone());
            close(&burns, &want_dx, &format!("Burn's data gradient, {what}"));
            let burns = Flex::conv2d_weight_backward(x, weight, grad, options);
            close(&burns, &want_dw, &format!("Burn's weight gradient, {what}"));
        }
    }

    /// Convolutions with groups other than one per channel, and other dtypes, are left to Burn.
    #[test]
    fn other_convolutions_are_declined() {
        let mut rng = StdRng::seed_from_u64(8);
        let x = random([1, 4, 6, 6], 1.0, &mut rng);
        let grad = random([1, 4, 6, 6], 1.0, &mut rng);
        let full = ConvOptions::new([1, 1], [1, 1], [1, 1], 1);
        let weight = random([4, 4, 3, 3], 1.0, &mut rng);
        assert!(forward(&x, &weight, &full).is_none());
        assert!(data_grad(&x.shape(), &weight, &grad, &full).is_none());
        assert!(weight_grad(&x, &weight, &grad, &full).is_none());
        let paired = ConvOptions::new([1, 1], [1, 1], [1, 1], 2);
        let weight = random([4, 2, 3, 3], 1.0, &mut rng);
        assert!(weight_grad(&x, &weight, &grad, &paired).is_none());
        let depthwise = ConvOptions::new([1, 1], [1, 1], [1, 1], 4);
        let weight = random([4, 1, 3, 3], 1.0, &mut rng);
        let half = <Flex as burn::backend::ops::FloatTensorOps<Flex>>::float_cast(
            grad.clone(),
            burn::tensor::FloatDType::F16,
        );
        assert!(data_grad(&x.shape(), &weight, &half, &depthwise).is_none());
        assert!(weight_grad(&x, &weight, &grad, &depthwise).is_some());
    }
}
