//! Data-pipeline throughput (images/s) at 640 px with mosaic, with and without the
//! prepared-image cache: `cargo bench --bench data_pipeline [-- WORKERS [EPOCHS [REPEAT]]]`.
//! Uses the 30 real COCO train images of ../shared/data (JPEG decoding included); each epoch
//! is timed separately so the cache's first (filling) and later epochs show apart. An epoch visits
//! every image REPEAT times (default 4), so that there are enough batches to keep many workers busy.

use burnpose::config::Augment;
use burnpose::config::CacheMode;
use burnpose::data::Loader;
use burnpose::data::coco::CocoDataset;
use burnpose::data::source::{Dataset, Source};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let workers: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(2);
    let epochs: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(3);
    let repeat: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(4);
    let root = Path::new("../shared/data/pose-real/pose_minicoco");
    let (coco, _) = CocoDataset::open(root, "train2017", 17, false)
        .unwrap_or_else(|e| panic!("{e} (the bench needs ../shared/data)"));
    let n = coco.len();
    println!("{n} COCO images × {repeat} per epoch, 640 px, mosaic on, batch 4, {workers} workers");
    println!("| cache | epoch | images/s | ms per batch |");
    println!("|---|---|---|---|");
    for mode in [CacheMode::None, CacheMode::Ram] {
        let source = Arc::new(Source::new(Dataset::Coco(coco.clone()), 640, mode));
        let loader = Loader {
            source,
            augment: Augment::default(),
            flip_idx: Some(burnpose::data::COCO_FLIP_IDX.to_vec()),
            batch: 4,
            seed: 0,
            rank: 0,
            world: 1,
            wrap_last: false,
            workers,
            depth: 2,
        };
        let nb = n * repeat / loader.batch;
        for epoch in 0..epochs {
            let order: Vec<usize> = (0..n * repeat).map(|i| i % n).collect();
            let t = Instant::now();
            let mut images = 0;
            for batch in loader.prefetch(epoch, order, 0, nb, true) {
                images += batch.expect("batch").samples.len();
            }
            let s = t.elapsed().as_secs_f64();
            println!(
                "| {mode:?} | {} | {:.1} | {:.1} |",
                epoch + 1,
                images as f64 / s,
                1000.0 * s / nb as f64
            );
        }
    }
}
