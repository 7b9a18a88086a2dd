//! Training augmentation in Ultralytics' order (yolo_spec §5.2): mosaic (or letterbox), random
//! affine, HSV, horizontal flip. Every draw comes from the sample's own RNG, so a sample depends
//! only on (seed, epoch, position), never on which thread made it or when.

use super::affine::{Affine, warp};
use super::hsv::HsvTables;
use super::letterbox::letterbox;
use super::mosaic::mosaic4;
use super::source::Source;
use super::{DataError, Sample};
use crate::config::Augment;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Ultralytics closes mosaic when `epoch == epochs − close_mosaic`, so a run shorter than
/// `close_mosaic` epochs keeps mosaic on throughout; this reproduces that.
pub fn mosaic_active(epoch: usize, epochs: usize, close_mosaic: usize) -> bool {
    !(close_mosaic > 0 && epochs >= close_mosaic && epoch >= epochs - close_mosaic)
}

/// The RNG of the sample at `position` of `epoch`'s order.
pub fn sample_rng(seed: u64, epoch: usize, position: usize) -> StdRng {
    let mix = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add((epoch as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9))
        .wrapping_add((position as u64).wrapping_mul(0x94D0_49BB_1331_11EB));
    StdRng::seed_from_u64(mix)
}

/// Training sample for image `i` of `source`: square, `source.size` pixels, labels in them; and
/// the HSV gains left for the device to apply when `aug.hsv_device` is set.
pub fn train_sample(
    source: &Source,
    aug: &Augment,
    flip_idx: Option<&[usize]>,
    i: usize,
    mosaic: bool,
    rng: &mut StdRng,
) -> Result<(Sample, Option<[f32; 3]>), DataError> {
    let s = source.size;
    let sf = s as f32;
    let use_mosaic = mosaic && aug.mosaic > 0.0 && rng.random::<f64>() < aug.mosaic;
    let (base, centre) = if use_mosaic {
        let partners: [usize; 3] = std::array::from_fn(|_| rng.random_range(0..source.len()));
        let parts = [
            source.prepared(i)?,
            source.prepared(partners[0])?,
            source.prepared(partners[1])?,
            source.prepared(partners[2])?,
        ];
        let xc = rng.random_range(s / 2..s + s / 2);
        let yc = rng.random_range(s / 2..s + s / 2);
        let refs = [
            &parts[0].sample,
            &parts[1].sample,
            &parts[2].sample,
            &parts[3].sample,
        ];
        (mosaic4(refs, s, [xc, yc]), sf)
    } else {
        let (boxed, _, _) = letterbox(source.prepared(i)?.sample.clone(), s);
        (boxed, sf / 2.0)
    };
    let mut out = affine(base, aug, centre, sf, rng);
    let mut deferred = None;
    if aug.hsv_h > 0.0 || aug.hsv_s > 0.0 || aug.hsv_v > 0.0 {
        let gains = [aug.hsv_h, aug.hsv_s, aug.hsv_v];
        let r = gains.map(|g| (rng.random_range(-1.0..1.0) * g) as f32);
        if aug.hsv_device {
            deferred = Some(r);
        } else {
            HsvTables::new(r).apply(&mut out.image);
        }
    }
    if let Some(flip_idx) = flip_idx
        && aug.fliplr > 0.0
        && rng.random::<f64>() < aug.fliplr
    {
        flip_horizontal(&mut out, flip_idx);
    }
    Ok((out, deferred))
}

fn affine(base: Sample, aug: &Augment, centre: f32, size: f32, rng: &mut StdRng) -> Sample {
    if aug.degrees == 0.0 && aug.scale == 0.0 && aug.translate == 0.0 && centre == size / 2.0 {
        return base;
    }
    let deg = if aug.degrees > 0.0 {
        rng.random_range(-aug.degrees..=aug.degrees) as f32
    } else {
        0.0
    };
    let scale = if aug.scale > 0.0 {
        rng.random_range(1.0 - aug.scale..=1.0 + aug.scale) as f32
    } else {
        1.0
    };
    let t = aug.translate;
    let mut shift = || {
        if t > 0.0 {
            rng.random_range(0.5 - t..=0.5 + t) as f32 * size
        } else {
            size / 2.0
        }
    };
    let to = [shift(), shift()];
    let m = Affine::new([centre, centre], deg, scale, to);
    warp(&base, m, scale, size as u32)
}

/// Mirrors image and labels left–right and swaps left/right keypoints by `flip_idx`.
pub fn flip_horizontal(sample: &mut Sample, flip_idx: &[usize]) {
    image::imageops::flip_horizontal_in_place(&mut sample.image);
    let w = sample.image.width() as f32;
    for inst in &mut sample.instances {
        let [x1, y1, x2, y2] = inst.bbox;
        inst.bbox = [w - x2, y1, w - x1, y2];
        let mirrored = inst.mapped_keypoints(|x, y| [w - x, y]);
        inst.keypoints = flip_idx.iter().map(|&j| mirrored[j]).collect();
    }
}

#[cfg(test)]
mod tests;
