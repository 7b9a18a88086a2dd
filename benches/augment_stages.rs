//! Milliseconds per stage of one 640 px training sample (mosaic, affine warp, HSV, flip) and of
//! collating 4 samples, single-threaded: `cargo bench --bench augment_stages`. Uses four real COCO
//! images of ../shared/data.

use burnpose::config::CacheMode;
use burnpose::data::Batch;
use burnpose::data::affine::{Affine, warp};
use burnpose::data::coco::CocoDataset;
use burnpose::data::hsv::HsvTables;
use burnpose::data::mosaic::mosaic4;
use burnpose::data::source::{Dataset, Source};
use std::path::Path;
use std::time::Instant;

fn main() {
    let (coco, _) = CocoDataset::open(
        Path::new("../shared/data/pose-real/pose_minicoco"),
        "train2017",
        17,
        false,
    )
    .unwrap();
    let src = Source::new(Dataset::Coco(coco), 640, CacheMode::Ram);
    let parts: Vec<_> = (0..4).map(|i| src.prepared(i).unwrap()).collect();
    let n = 20;
    let t = Instant::now();
    let mut m = None;
    for _ in 0..n {
        m = Some(mosaic4(
            [
                &parts[0].sample,
                &parts[1].sample,
                &parts[2].sample,
                &parts[3].sample,
            ],
            640,
            [600, 700],
        ));
    }
    println!(
        "mosaic {:.1} ms",
        t.elapsed().as_secs_f64() * 1000.0 / n as f64
    );
    let m = m.unwrap();
    let a = Affine::new([640.0, 640.0], 0.0, 1.2, [330.0, 310.0]);
    let t = Instant::now();
    let mut w = None;
    for _ in 0..n {
        w = Some(warp(&m, a, 1.2, 640));
    }
    println!(
        "warp {:.1} ms",
        t.elapsed().as_secs_f64() * 1000.0 / n as f64
    );
    let mut w = w.unwrap();
    let tables = HsvTables::new([0.01, 0.3, -0.2]);
    let t = Instant::now();
    for _ in 0..n {
        tables.apply(&mut w.image);
    }
    println!(
        "hsv {:.1} ms",
        t.elapsed().as_secs_f64() * 1000.0 / n as f64
    );
    let t = Instant::now();
    for _ in 0..n {
        image::imageops::flip_horizontal_in_place(&mut w.image);
    }
    println!(
        "flip {:.1} ms",
        t.elapsed().as_secs_f64() * 1000.0 / n as f64
    );
    let t = Instant::now();
    for _ in 0..n {
        let _ = Batch::collate(vec![w.clone(), w.clone(), w.clone(), w.clone()]);
    }
    println!(
        "collate(4) {:.1} ms",
        t.elapsed().as_secs_f64() * 1000.0 / n as f64
    );
}
