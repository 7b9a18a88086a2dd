//! HSV jitter applied to an uploaded batch on its device: our CubeCL kernel (`kernels/hsv.rs`) on
//! CUDA, the CPU reference (`data::hsv`) on other devices. Same arithmetic either way; the GPU may
//! differ from the CPU by one level where float rounding lands on a boundary (tests/gpu.rs).

use super::hsv::HsvTables;
use burn::prelude::*;

#[cfg(feature = "cuda")]
#[path = "../../kernels/hsv.rs"]
mod kernel;

/// `images`: `[B, 3, H, W]` floats holding 0–255 values; `gains[i]`: image `i`'s `[r_h, r_s, r_v]`.
pub fn hsv_jitter(images: Tensor<4>, gains: &[[f32; 3]]) -> Tensor<4> {
    assert_eq!(images.dims()[0], gains.len(), "one gain triple per image");
    #[cfg(feature = "cuda")]
    if let Some(out) = on_cuda(images.clone(), gains) {
        return out;
    }
    on_host(images, gains)
}

/// The CUDA kernel, or `None` when the images are not on a CUDA device. Images on the autodiff
/// device are taken off the tape first (they need no gradient): their dispatch kind is an
/// autodiff wrapper, which the kernel cannot take and which would send training batches down the
/// host path.
#[cfg(feature = "cuda")]
pub fn on_cuda(images: Tensor<4>, gains: &[[f32; 3]]) -> Option<Tensor<4>> {
    use burn::backend::{BackendTensor, DispatchTensor, DispatchTensorKind};
    let taped = images.is_autodiff();
    let images = images.inner();
    let flat: Vec<f32> = gains.iter().flatten().copied().collect();
    let g = Tensor::<2>::from_data(TensorData::new(flat, [gains.len(), 3]), &images.device());
    let x = images.into_dispatch();
    let out = match (x.kind, g.into_dispatch().kind) {
        (
            DispatchTensorKind::Cube(BackendTensor::Float(xc)),
            DispatchTensorKind::Cube(BackendTensor::Float(gc)),
        ) => Tensor::from_dispatch(DispatchTensor {
            kind: DispatchTensorKind::Cube(BackendTensor::Float(kernel::hsv_jitter(xc, gc))),
            autodiff: x.autodiff,
        }),
        _ => return None,
    };
    Some(if taped { Tensor::from_inner(out) } else { out })
}

/// The CPU reference on any device (a round trip through host memory).
pub fn on_host(images: Tensor<4>, gains: &[[f32; 3]]) -> Tensor<4> {
    let device = images.device();
    let [b, c, h, w] = images.dims();
    let plane = h * w;
    let mut data: Vec<f32> = images
        .into_data()
        .convert::<f32>()
        .try_into_vec()
        .expect("f32 images");
    for (i, g) in gains.iter().enumerate() {
        let img = &mut data[i * c * plane..(i + 1) * c * plane];
        let mut rgb = image::RgbImage::new(w as u32, h as u32);
        for (p, px) in rgb.pixels_mut().enumerate() {
            px.0 = [0, 1, 2].map(|ch| img[ch * plane + p] as u8);
        }
        HsvTables::new(*g).apply(&mut rgb);
        for (p, px) in rgb.pixels().enumerate() {
            for ch in 0..3 {
                img[ch * plane + p] = px.0[ch] as f32;
            }
        }
    }
    Tensor::from_data(TensorData::new(data, [b, c, h, w]), &device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn host_path_is_the_per_image_reference() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let (b, h, w) = (3, 5, 7);
        let images: Vec<image::RgbImage> = (0..b)
            .map(|_| image::RgbImage::from_fn(w, h, |_, _| image::Rgb(rng.random())))
            .collect();
        let gains: Vec<[f32; 3]> = (0..b)
            .map(|_| [0.015, 0.7, 0.4].map(|g| rng.random_range(-1.0f32..1.0) * g))
            .collect();
        let plane = (h * w) as usize;
        let mut planar = vec![0f32; b * 3 * plane];
        for (i, img) in images.iter().enumerate() {
            for (p, px) in img.pixels().enumerate() {
                for c in 0..3 {
                    planar[(i * 3 + c) * plane + p] = px.0[c] as f32;
                }
            }
        }
        let t = Tensor::<4>::from_data(
            TensorData::new(planar, [b, 3, h as usize, w as usize]),
            &Device::flex(),
        );
        let out: Vec<f32> = hsv_jitter(t, &gains).into_data().try_into_vec().unwrap();
        for (i, img) in images.into_iter().enumerate() {
            let mut want = img;
            HsvTables::new(gains[i]).apply(&mut want);
            for (p, px) in want.pixels().enumerate() {
                for c in 0..3 {
                    assert_eq!(out[(i * 3 + c) * plane + p], px.0[c] as f32);
                }
            }
        }
    }
}
