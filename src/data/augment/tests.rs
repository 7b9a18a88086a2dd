use super::*;
use crate::config::CacheMode;
use crate::data::loader::Loader;
use crate::data::source::Dataset;
use crate::data::yolo::YoloDataset;
use crate::data::{BuiltinDataset, COCO_FLIP_IDX, Instance};
use std::path::PathBuf;
use std::sync::Arc;

fn builtin(len: usize, size: u32) -> Arc<Source> {
    Arc::new(Source::new(
        Dataset::Builtin(BuiltinDataset::new(len, size, 5)),
        size,
        CacheMode::Ram,
    ))
}

fn loader(source: Arc<Source>, workers: usize) -> Loader {
    Loader {
        source,
        augment: Augment::default(),
        flip_idx: Some(COCO_FLIP_IDX.to_vec()),
        batch: 3,
        seed: 11,
        rank: 0,
        world: 1,
        wrap_last: false,
        workers,
        depth: 2,
    }
}

#[test]
fn mosaic_closes_like_ultralytics() {
    assert!(
        mosaic_active(4, 5, 10),
        "a 5-epoch run never reaches epochs − close_mosaic"
    );
    assert!(mosaic_active(89, 100, 10));
    assert!(!mosaic_active(90, 100, 10));
    assert!(!mosaic_active(0, 10, 10));
    assert!(mosaic_active(9, 10, 0));
}

#[test]
fn batches_depend_only_on_seed_epoch_and_position() {
    let src = builtin(12, 64);
    let sync = loader(src.clone(), 0);
    let order: Vec<usize> = (0..12).rev().collect();
    let a: Vec<String> = sync
        .prefetch(0, order.clone(), 0, 4, true)
        .map(|b| b.unwrap().hash())
        .collect();
    // Three workers, a fresh cache: same bytes.
    let threaded = loader(builtin(12, 64), 3);
    let b: Vec<String> = threaded
        .prefetch(0, order.clone(), 0, 4, true)
        .map(|b| b.unwrap().hash())
        .collect();
    assert_eq!(a, b);
    // A resumed epoch starting at batch 2 sees the same batches 2 and 3.
    let c: Vec<String> = threaded
        .prefetch(0, order.clone(), 2, 4, true)
        .map(|b| b.unwrap().hash())
        .collect();
    assert_eq!(&a[2..], &c[..]);
    let next_epoch = sync.batch(1, &order, 0, true).unwrap().hash();
    assert_ne!(a[0], next_epoch, "another epoch draws other augmentations");
    let distinct: std::collections::HashSet<_> = a.iter().collect();
    assert_eq!(distinct.len(), 4);
}

#[test]
fn dropping_a_prefetch_early_stops_its_workers() {
    let l = loader(builtin(12, 64), 2);
    let mut p = l.prefetch(0, (0..12).collect(), 0, 4, true);
    assert!(p.next().unwrap().is_ok());
    drop(p); // must not hang
}

#[test]
fn no_augmentation_is_the_letterboxed_image() {
    let src = builtin(2, 64);
    let mut rng = sample_rng(0, 0, 0);
    let (s, _) = train_sample(&src, &Augment::none(), None, 1, true, &mut rng).unwrap();
    let (want, _) = src.sample(1).unwrap();
    assert_eq!(s.image, want.image);
    assert_eq!(s.instances, want.instances);
}

#[test]
fn labels_stay_in_frame() {
    let src = builtin(8, 96);
    let aug = Augment {
        degrees: 10.0,
        ..Augment::default()
    };
    let mut seen = 0;
    for pos in 0..40 {
        let mut rng = sample_rng(3, 0, pos);
        let (s, _) = train_sample(
            &src,
            &aug,
            Some(&COCO_FLIP_IDX),
            pos % 8,
            pos % 2 == 0,
            &mut rng,
        )
        .unwrap();
        assert_eq!(s.image.dimensions(), (96, 96));
        for inst in &s.instances {
            let b = inst.bbox;
            assert!(b.iter().all(|v| (0.0..=96.0).contains(v)) && b[2] > b[0] && b[3] > b[1]);
            for k in inst.keypoints.iter().filter(|k| k[2] > 0.0) {
                assert!((0.0..=96.0).contains(&k[0]) && (0.0..=96.0).contains(&k[1]));
                seen += 1;
            }
        }
    }
    assert!(seen > 50, "only {seen} visible keypoints in 40 samples");
}

#[test]
fn flip_mirrors_boxes_and_swaps_sides() {
    let mut s = Sample {
        image: image::RgbImage::from_fn(10, 4, |x, _| image::Rgb([x as u8; 3])),
        instances: vec![Instance {
            class: 0,
            bbox: [1.0, 0.0, 4.0, 2.0],
            keypoints: vec![[2.0, 1.0, 2.0], [3.0, 1.0, 1.0], [0.0, 0.0, 0.0]],
        }],
    };
    flip_horizontal(&mut s, &[1, 0, 2]);
    assert_eq!(s.image.get_pixel(0, 0).0, [9; 3]);
    assert_eq!(s.instances[0].bbox, [6.0, 0.0, 9.0, 2.0]);
    assert_eq!(
        s.instances[0].keypoints,
        vec![[7.0, 1.0, 1.0], [8.0, 1.0, 2.0], [0.0, 0.0, 0.0]]
    );
}

/// A white square under a labelled keypoint on a black image, as a YOLO dataset on disk.
fn marker_dataset() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("burnpose-marker-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for sub in ["images/train", "labels/train"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    let mut img = image::RgbImage::new(80, 60);
    for y in 24..33 {
        for x in 14..23 {
            img.put_pixel(x, y, image::Rgb([255; 3]));
        }
    }
    img.save(dir.join("images/train/a.png")).unwrap();
    // Box (10..40, 10..50), keypoint 0 at the square's centre (18.5, 28.5), keypoint 1 absent.
    let label = format!(
        "0 {} {} {} {} {} {} 2 0 0 0\n",
        25.0 / 80.0,
        30.0 / 60.0,
        30.0 / 80.0,
        40.0 / 60.0,
        18.5 / 80.0,
        28.5 / 60.0
    );
    std::fs::write(dir.join("labels/train/a.txt"), label).unwrap();
    std::fs::write(
        dir.join("data.yaml"),
        "train: images/train\nval: images/train\nkpt_shape: [2, 3]\nflip_idx: [0, 1]\n",
    )
    .unwrap();
    dir
}

#[test]
fn image_and_labels_move_together() {
    let dir = marker_dataset();
    let (train, _, _) =
        YoloDataset::open_pair(&dir.join("data.yaml"), 1, [2, 3], false, "val").unwrap();
    let src = Source::new(Dataset::Yolo(train), 64, CacheMode::Ram);
    let aug = Augment {
        hsv_h: 0.0,
        hsv_s: 0.0,
        hsv_v: 0.0,
        degrees: 15.0,
        ..Augment::default()
    };
    let mut checked = 0;
    for pos in 0..60 {
        let mut rng = sample_rng(9, 1, pos);
        let (s, _) = train_sample(&src, &aug, Some(&[0, 1]), 0, pos % 3 != 0, &mut rng).unwrap();
        for inst in &s.instances {
            let k = inst.keypoints[0];
            if k[2] == 0.0 {
                continue;
            }
            // Brightest pixel within one pixel: bilinear edges and the half-pixel convention of
            // the warp (as in OpenCV) may move the exact spot by under a pixel.
            let (x, y) = (k[0].round() as i64, k[1].round() as i64);
            let brightest = (-1..=1)
                .flat_map(|dy| (-1..=1).map(move |dx| (x + dx, y + dy)))
                .filter(|&(x, y)| (0..64).contains(&x) && (0..64).contains(&y))
                .map(|(x, y)| s.image.get_pixel(x as u32, y as u32).0[0])
                .max()
                .unwrap();
            assert!(
                brightest > 200,
                "sample {pos}: keypoint {k:?} lands on {brightest}"
            );
            assert_eq!(inst.keypoints[1], [0.0; 3]);
            checked += 1;
        }
    }
    assert!(checked > 40, "only {checked} keypoints checked");
}

#[test]
fn wrapped_last_batch_takes_the_first_images() {
    let mut l = loader(builtin(10, 32), 0);
    l.augment = Augment::none();
    l.batch = 4;
    assert_eq!(l.batches_per_epoch(), 2, "dropped by default");
    l.wrap_last = true;
    assert_eq!(l.batches_per_epoch(), 3);
    let order: Vec<usize> = (0..10).rev().collect();
    let last = l.batch(0, &order, 2, false).unwrap();
    let want: Vec<_> = [order[8], order[9], order[0], order[1]]
        .iter()
        .map(|&i| l.source.sample(i).unwrap().0.image)
        .collect();
    let got: Vec<_> = last.samples.iter().map(|s| s.image.clone()).collect();
    assert_eq!(got, want);
}
