//! The Ultralytics-weights fixtures (`tests/fixtures/ultralytics`, made by
//! `benches/peer/weights_fixtures.py`): the weights, Ultralytics' outputs, the input rebuilt from
//! the real images, and the comparisons, shared by `tests/ultralytics.rs` and the GPU tests.

use burn::prelude::*;
use burnpose::data::Sample;
use burnpose::data::letterbox::letterbox;
use burnpose::model::{BranchOutput, Scale, Task, Yolo, YoloConfig};
use burnpose::weights::load_ultralytics;
use safetensors::SafeTensors;
use std::path::PathBuf;

/// A file of `tests/fixtures/ultralytics`, relative to the working directory: the package root
/// under `cargo test`, the working tree's copy on the GPU machine.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from("tests/fixtures/ultralytics").join(name)
}

pub struct Outputs {
    bytes: Vec<u8>,
}

impl Outputs {
    pub fn open() -> Self {
        Self {
            bytes: std::fs::read(fixture("outputs.safetensors")).expect("fixture"),
        }
    }

    pub fn get(&self, name: &str) -> (Vec<usize>, Vec<f32>) {
        let st = SafeTensors::deserialize(&self.bytes).unwrap();
        let t = st
            .tensor(name)
            .unwrap_or_else(|_| panic!("{name} in fixture"));
        let values = t
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        (t.shape().to_vec(), values)
    }
}

/// The two images the fixtures were computed on, letterboxed to 160 px (`[2, 3, 160, 160]` in
/// [0, 1]); `None` (with a notice) where `../shared/data` is absent outside CI. The long side is
/// resized here with image-rs's triangle filter (sides rounded), as the fixtures were made:
/// the fixtures test the network, not the resize, which follows OpenCV's since (`data::resize`).
pub fn input_values() -> Option<Vec<f32>> {
    let dir = super::shared_data("pose-real/pose_minicoco/images/train2017")?;
    let mut values = Vec::new();
    for name in ["000000033601.jpg", "000000033909.jpg"] {
        let image = image::open(dir.join(name)).unwrap().to_rgb8();
        let (w, h) = image.dimensions();
        let scale = SIZE as f32 / w.max(h) as f32;
        let side = |v: u32| ((v as f32 * scale).round() as u32).max(1);
        let image = image::imageops::resize(
            &image,
            side(w),
            side(h),
            image::imageops::FilterType::Triangle,
        );
        let sample = Sample {
            image,
            instances: Vec::new(),
        };
        let (boxed, _, _) = letterbox(sample, SIZE as u32);
        let px = boxed.image.as_raw();
        for c in 0..3 {
            values.extend(px.iter().skip(c).step_by(3).map(|&v| v as f32 / 255.0));
        }
    }
    Some(values)
}

pub const SIZE: usize = 160;

pub fn input(device: &Device) -> Option<Tensor<4>> {
    let values = input_values()?;
    Some(Tensor::<1>::from_floats(values.as_slice(), device).reshape([2, 3, SIZE, SIZE]))
}

pub fn model(task: Task, device: &Device) -> Yolo {
    let model = YoloConfig::new(Scale::N, task).init(device);
    let (model, report) = load_ultralytics(model, &fixture("yolo26n-pose.pt")).unwrap();
    assert_eq!(report.fresh_head, None);
    let ours = burnpose::optim::tensors::float_tensors(&model).len();
    assert_eq!(report.loaded, ours, "every tensor of ours loaded");
    match task {
        // All 879 entries: ours, 126 `num_batches_tracked` and the flow's 3 constants.
        Task::Pose => {
            assert_eq!(ours, 879 - 126 - 3);
            assert!(report.unused.is_empty(), "{:?}", report.unused);
        }
        // The pose file's keypoint branches and flow have no place in a detection model.
        Task::Detect => {
            assert!(!report.unused.is_empty());
            for k in &report.unused {
                let head = k.strip_prefix("model.23.").unwrap();
                assert!(
                    ["cv4", "one2one_cv4", "flow_model"]
                        .iter()
                        .any(|p| head.starts_with(p)),
                    "{k}"
                );
            }
        }
    }
    model
}

/// Largest `|ours − theirs| / max(|theirs|, 1)` over the tensor (shapes must be equal).
pub fn worst(ours: Tensor<3>, theirs: &(Vec<usize>, Vec<f32>)) -> f32 {
    assert_eq!(ours.dims().to_vec(), theirs.0);
    let ours: Vec<f32> = ours
        .into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .unwrap();
    ours.iter()
        .zip(&theirs.1)
        .map(|(a, b)| (a - b).abs() / b.abs().max(1.0))
        .fold(0.0, f32::max)
}

pub fn compare(out: &BranchOutput, fx: &Outputs, prefix: &str) -> Vec<(String, f32)> {
    let mut rows = vec![
        (
            format!("{prefix}.boxes"),
            worst(out.boxes.clone(), &fx.get(&format!("{prefix}.boxes"))),
        ),
        (
            format!("{prefix}.scores"),
            worst(out.scores.clone(), &fx.get(&format!("{prefix}.scores"))),
        ),
    ];
    if let Some(k) = &out.kpts {
        rows.push((
            format!("{prefix}.kpts"),
            worst(k.clone(), &fx.get(&format!("{prefix}.kpts"))),
        ));
    }
    if prefix.contains(".train.")
        && let Some(s) = &out.kpts_sigma
    {
        rows.push((
            format!("{prefix}.kpts_sigma"),
            worst(s.clone(), &fx.get(&format!("{prefix}.kpts_sigma"))),
        ));
    }
    rows
}

pub fn assert_close(rows: &[(String, f32)]) {
    for (name, err) in rows {
        eprintln!("{name}: worst relative difference {err:.2e}");
    }
    for (name, err) in rows {
        assert!(*err <= 1e-4, "{name}: {err:.3e} > 1e-4");
    }
}

pub fn eval_rows(m: Yolo, x: Tensor<4>, name: &str) -> Vec<(String, f32)> {
    let fx = Outputs::open();
    let features = m.features(x);
    let mut rows = compare(
        &m.head.one2many.forward(features.clone().into_levels()),
        &fx,
        &format!("{name}.eval.one2many"),
    );
    rows.extend(compare(
        &m.head.forward_one2one(&features),
        &fx,
        &format!("{name}.eval.one2one"),
    ));
    rows
}
