//! Prediction from a Burn program: Burn-native weights (`burnpose export CHECKPOINT --format
//! burn`: shaped tensors under the model's module paths) loaded into `Yolo` through burn-store,
//! without a trainer and without the training data, then one image on the CPU.
//!
//! `cargo run --release --example predict_image -- WEIGHTS IMAGE [IMGSZ]`

use burn::prelude::*;
use burnpose::predict::{PredictOptions, Predictor, config_for};
use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (weights, image) = match args.as_slice() {
        [w, i, ..] => (PathBuf::from(w), PathBuf::from(i)),
        _ => anyhow::bail!("usage: predict_image WEIGHTS IMAGE [IMGSZ]"),
    };
    let imgsz = match args.get(2) {
        Some(s) => s.parse()?,
        None => 640,
    };
    let device = Device::flex();
    // The weights file names its model (scale, task, classes, keypoints); `load_burn` builds
    // that model and fills it with `Yolo::load_from(&mut SafetensorsStore::from_file(..))`.
    let (about, model) = burnpose::weights::load_burn(&weights, &device)?;
    let options = PredictOptions {
        imgsz,
        ..PredictOptions::default()
    };
    let predictor = Predictor::new(model, config_for(&about), options, &device);
    let picture = image::open(&image)?.to_rgb8();
    let found = predictor.predict(std::slice::from_ref(&picture));
    println!(
        "{} ({}x{}): {} detections with {:?} {}",
        image.display(),
        picture.width(),
        picture.height(),
        found[0].len(),
        about.task,
        about.name()
    );
    for f in &found[0] {
        println!("  {}", serde_json::to_string(f)?);
    }
    Ok(())
}
