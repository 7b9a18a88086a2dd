//! HSV jitter on the GPU (CubeCL): the same arithmetic as `data::hsv` (OpenCV 8-bit HSV, hue
//! shift modulo 180, saturation/value scaling, u8 truncation), one unit per pixel of a
//! `[B, 3, H, W]` float image batch holding 0–255 values, gains `[B, 3]`.

// `#[cube]` expands to `cubecl::…` paths.
use burn::cubecl;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;
use cubecl::{CubeCount, CubeDim, calculate_cube_count_elemwise};

#[cube]
fn round_u8(x: f32) -> f32 {
    f32::floor(f32::clamp(x, 0.0f32, 255.0f32) + 0.5f32)
}

#[cube(launch_unchecked)]
fn hsv_kernel(images: &Tensor<f32>, gains: &Tensor<f32>, output: &mut Tensor<f32>) {
    let width = images.shape(3);
    let plane = images.shape(2) * width;
    let pixels = images.shape(0) * plane;
    if ABSOLUTE_POS >= pixels {
        terminate!();
    }
    let b = ABSOLUTE_POS / plane;
    let p = ABSOLUTE_POS % plane;
    let y = p / width;
    let x = p % width;
    // Both sides by their own strides: CubeCL's optimised allocation pads each row to 512 bytes
    // when a row is not a multiple of that (416 f32 pixels take 512 slots), so a linear index
    // would shift rows and leave the padding's uninitialised memory in the image.
    let src = b * images.stride(0) + y * images.stride(2) + x * images.stride(3);
    let src_c = images.stride(1);
    let r = images[src];
    let g = images[src + src_c];
    let bl = images[src + 2 * src_c];

    // RGB -> HSV (OpenCV 8-bit: H in [0, 180)).
    let v = f32::max(f32::max(r, g), bl);
    let mn = f32::min(f32::min(r, g), bl);
    let diff = v - mn;
    let mut s = 0.0f32;
    if v > 0.0f32 {
        s = f32::floor(255.0f32 * diff * (1.0f32 / v) + 0.5f32);
    }
    let mut h = 0.0f32;
    if diff > 0.0f32 {
        let inv = 1.0f32 / diff;
        if v == r {
            h = 60.0f32 * (g - bl) * inv;
        } else if v == g {
            h = 120.0f32 + 60.0f32 * (bl - r) * inv;
        } else {
            h = 240.0f32 + 60.0f32 * (r - g) * inv;
        }
    }
    if h < 0.0f32 {
        h += 360.0f32;
    }
    h = f32::floor(h * 0.5f32 + 0.5f32);
    if h >= 180.0f32 {
        h -= 180.0f32;
    }

    // The lookup tables, computed per value (truncated as the u8 tables are).
    let gain = b * gains.stride(0);
    let gain_k = gains.stride(1);
    let rh = gains[gain];
    let rs = gains[gain + gain_k];
    let rv = gains[gain + 2 * gain_k];
    let mut hh = h + 180.0f32 * rh;
    hh = hh - 180.0f32 * f32::floor(hh / 180.0f32);
    hh = f32::floor(hh);
    let ss = f32::floor(f32::clamp(s * (1.0f32 + rs), 0.0f32, 255.0f32));
    let vv = f32::floor(f32::clamp(v * (1.0f32 + rv), 0.0f32, 255.0f32));

    // HSV -> RGB.
    let hf = hh * (1.0f32 / 30.0f32);
    let sf = ss * (1.0f32 / 255.0f32);
    let sector = f32::floor(hf);
    let f = hf - sector;
    let pp = vv * (1.0f32 - sf);
    let q = vv * (1.0f32 - sf * f);
    let t = vv * (1.0f32 - sf * (1.0f32 - f));
    let k = u32::cast_from(sector) % 6;
    let mut ro = vv;
    let mut go = t;
    let mut bo = pp;
    if k == 1 {
        ro = q;
        go = vv;
        bo = pp;
    } else if k == 2 {
        ro = pp;
        go = vv;
        bo = t;
    } else if k == 3 {
        ro = pp;
        go = q;
        bo = vv;
    } else if k == 4 {
        ro = t;
        go = pp;
        bo = vv;
    } else if k == 5 {
        ro = vv;
        go = pp;
        bo = q;
    }
    let dst = b * output.stride(0) + y * output.stride(2) + x * output.stride(3);
    let dst_c = output.stride(1);
    output[dst] = round_u8(ro);
    output[dst + dst_c] = round_u8(go);
    output[dst + 2 * dst_c] = round_u8(bo);
}

/// HSV jitter of a `[B, 3, H, W]` f32 batch (values 0–255) with gains `[B, 3]`, both with any
/// strides. The output has CubeCL's optimised (possibly row-padded) layout and is written by its
/// strides.
pub fn hsv_jitter(images: CubeTensor, gains: CubeTensor) -> CubeTensor {
    // The kernel reads and writes f32: any other dtype would be reinterpreted, not converted.
    assert_eq!(
        (images.dtype, gains.dtype),
        (burn::tensor::DType::F32, burn::tensor::DType::F32),
        "device HSV takes f32 images and gains"
    );
    let shape = images.meta.shape().clone();
    assert_eq!(shape[1], 3, "device HSV takes RGB images");
    let pixels = shape[0] * shape[2] * shape[3];
    // Contiguous, not pitched rows (docs/kernels.md, "Output buffers").
    let output = empty_device_contiguous_dtype(
        images.client.clone(),
        images.device.clone(),
        shape,
        images.dtype,
    );
    let cube_dim = CubeDim::new(&images.client, pixels);
    let cube_count: CubeCount = calculate_cube_count_elemwise(&images.client, pixels, cube_dim);
    unsafe {
        hsv_kernel::launch_unchecked(
            &output.client,
            cube_count,
            cube_dim,
            images.into_tensor_arg(),
            gains.into_tensor_arg(),
            output.clone().into_tensor_arg(),
        );
    }
    output
}
