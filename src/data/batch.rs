//! Collating samples into a fixed-shape batch of host data.

use super::Sample;
use burn::prelude::*;

/// Images as `[B, 3, S, S]` u8 and per-image labels, ready to upload.
#[derive(Clone, Debug)]
pub struct Batch {
    pub images: TensorData,
    pub samples: Vec<Sample>,
    /// Per-image HSV gains still to apply on the device (`augment.hsv_device`).
    pub hsv_gains: Option<Vec<[f32; 3]>>,
}

impl Batch {
    /// Stacks same-size RGB samples (HWC → CHW).
    pub fn collate(samples: Vec<Sample>) -> Self {
        let (w, h) = samples[0].image.dimensions();
        let plane = (w * h) as usize;
        let mut bytes = vec![0u8; samples.len() * 3 * plane];
        for (i, s) in samples.iter().enumerate() {
            assert_eq!(
                s.image.dimensions(),
                (w, h),
                "batch images must share one size"
            );
            let out = &mut bytes[i * 3 * plane..(i + 1) * 3 * plane];
            for (p, px) in s.image.pixels().enumerate() {
                for c in 0..3 {
                    out[c * plane + p] = px.0[c];
                }
            }
        }
        let shape = [samples.len(), 3, h as usize, w as usize];
        Self {
            images: TensorData::new(bytes, shape),
            samples,
            hsv_gains: None,
        }
    }

    /// What tells this batch value from another without hashing its pixels: where they are,
    /// their length, 64 of them spread evenly, the HSV gains and the objects per image. Made
    /// ahead of its step (`replay.upload_ahead`), a batch's images are taken only by a step of
    /// a batch with the same key.
    pub fn key(&self) -> BatchKey {
        let bytes = self.images.as_bytes();
        let every = (bytes.len() / 64).max(1);
        BatchKey {
            address: bytes.as_ptr() as usize,
            len: bytes.len(),
            sample: bytes.iter().step_by(every).copied().collect(),
            hsv_gains: self.hsv_gains.clone(),
            objects: self.samples.iter().map(|s| s.instances.len()).collect(),
        }
    }

    /// Images on `device` as floats in [0, 1], with any deferred HSV jitter applied there.
    pub fn images_f32(&self, device: &Device) -> Tensor<4> {
        self.augment(self.upload(device, Upload::default()))
    }

    /// The pixels on `device` as floats holding 0–255.
    pub fn upload(&self, device: &Device, how: Upload) -> Tensor<4> {
        match how {
            Upload::U8 => {
                Tensor::<4, Int>::from_data(self.images.clone(), (device, burn::tensor::DType::U8))
                    .float()
            }
            Upload::I32 => {
                Tensor::<4, Int>::from_data(self.images.clone().convert::<i32>(), device).float()
            }
        }
    }

    /// `pixels` (from [`Batch::upload`]) with the deferred HSV jitter, scaled to [0, 1].
    pub fn augment(&self, pixels: Tensor<4>) -> Tensor<4> {
        let x = match &self.hsv_gains {
            Some(gains) => super::device_hsv::hsv_jitter(pixels, gains),
            None => pixels,
        };
        x / 255.0
    }
}

/// [`Batch::key`].
#[derive(Clone, Debug, PartialEq)]
pub struct BatchKey {
    address: usize,
    len: usize,
    sample: Vec<u8>,
    hsv_gains: Option<Vec<[f32; 3]>>,
    objects: Vec<usize>,
}

/// How a batch's bytes reach the device. `U8` sends the bytes as they are and widens them there
/// (a quarter of the transfer, no host conversion); `I32` widens them on the host first (the
/// original path, kept so `bench-step --upload` can compare the two in one sitting).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Upload {
    #[default]
    U8,
    I32,
}

impl Batch {
    /// SHA-256 of the pixels and every label, for determinism checks.
    pub fn hash(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(self.images.as_bytes());
        for g in self.hsv_gains.iter().flatten().flatten() {
            h.update(g.to_bits().to_le_bytes());
        }
        for s in &self.samples {
            h.update((s.instances.len() as u64).to_le_bytes());
            for inst in &s.instances {
                h.update((inst.class as u64).to_le_bytes());
                for v in inst.bbox.iter().chain(inst.keypoints.iter().flatten()) {
                    h.update(v.to_bits().to_le_bytes());
                }
            }
        }
        format!("{:x}", h.finalize())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch keeps its key when moved (as the epoch's loop moves the batch it looked ahead
    /// at), and a copy of it, or another batch, has another.
    #[test]
    fn a_key_follows_the_batch_value() {
        let batch = Batch {
            images: TensorData::new(vec![7u8; 2 * 3 * 4 * 5], [2, 3, 4, 5]),
            samples: Vec::new(),
            hsv_gains: Some(vec![[0.5, 0.25, 0.75]; 2]),
        };
        let key = batch.key();
        let copy = batch.clone();
        assert_ne!(copy.key(), key);
        let moved = vec![batch].pop().expect("one batch");
        assert_eq!(moved.key(), key);
        let mut other = moved.clone();
        let before = other.key();
        other.hsv_gains = None;
        assert_ne!(other.key(), before, "the same bytes, other gains");
    }

    /// Exactly `pixel / 255` in f32 for every byte value (any faster upload must keep this).
    #[test]
    fn upload_is_exact() {
        let device = Device::flex();
        let bytes: Vec<u8> = (0..=255u8).chain([0, 255, 7, 128]).collect();
        let batch = Batch {
            images: TensorData::new(bytes.clone(), [2, 2, 5, 13]),
            samples: Vec::new(),
            hsv_gains: None,
        };
        let want: Vec<f32> = bytes.iter().map(|&b| f32::from(b) / 255.0).collect();
        for how in [Upload::U8, Upload::I32] {
            let x = batch.augment(batch.upload(&device, how));
            let got: Vec<f32> = x.into_data().try_into_vec().unwrap();
            assert_eq!(got.len(), want.len());
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{how:?}"
            );
        }
    }
}
