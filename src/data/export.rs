//! The built-in dataset written out as an Ultralytics YOLO-pose dataset (lossless PNG images,
//! normalised `.txt` labels, `data.yaml`), so that another trainer — Ultralytics in
//! `benches/peer/` — sees exactly the pixels and labels burnpose trains on.

use super::builtin::BuiltinDataset;
use super::error::DataError;
use super::{COCO_FLIP_IDX, Sample};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DataError + '_ {
    move |error| DataError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// One label row per instance: `0 cx cy w h` and `x y v` per keypoint, normalised.
pub fn label_text(sample: &Sample) -> String {
    let (w, h) = sample.image.dimensions();
    let (w, h) = (w as f32, h as f32);
    let mut s = String::new();
    for inst in &sample.instances {
        let [x1, y1, x2, y2] = inst.bbox;
        let _ = write!(
            s,
            "{} {} {} {} {}",
            inst.class,
            (x1 + x2) / 2.0 / w,
            (y1 + y2) / 2.0 / h,
            (x2 - x1) / w,
            (y2 - y1) / h
        );
        for k in &inst.keypoints {
            let _ = write!(s, " {} {} {}", k[0] / w, k[1] / h, k[2]);
        }
        s.push('\n');
    }
    s
}

/// Writes `train` and `val` under `dir` and returns the path of `dir/data.yaml`.
pub fn write_yolo(
    train: &BuiltinDataset,
    val: &BuiltinDataset,
    dir: &Path,
) -> Result<PathBuf, DataError> {
    for (split, data) in [("train", train), ("val", val)] {
        let images = dir.join("images").join(split);
        let labels = dir.join("labels").join(split);
        std::fs::create_dir_all(&images).map_err(io(&images))?;
        std::fs::create_dir_all(&labels).map_err(io(&labels))?;
        for i in 0..data.len {
            let sample = data.get(i);
            let image = images.join(format!("{i:06}.png"));
            sample.image.save(&image).map_err(|e| DataError::Image {
                path: image.clone(),
                message: e.to_string(),
            })?;
            let label = labels.join(format!("{i:06}.txt"));
            std::fs::write(&label, label_text(&sample)).map_err(io(&label))?;
        }
    }
    let yaml = dir.join("data.yaml");
    let abs = std::path::absolute(dir).map_err(io(dir))?;
    let text = format!(
        "# burnpose built-in dataset (train seed {}, val seed {}), {} px\npath: {}\ntrain: images/train\nval: images/val\nkpt_shape: [17, 3]\nflip_idx: {:?}\nnames:\n  0: person\n",
        train.seed,
        val.seed,
        train.size,
        abs.display(),
        COCO_FLIP_IDX
    );
    std::fs::write(&yaml, text).map_err(io(&yaml))?;
    Ok(yaml)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::yolo::YoloDataset;

    /// Read back through our YOLO reader: identical pixels, labels equal to float rounding.
    #[test]
    fn exported_dataset_reads_back_identically() {
        let dir = std::env::temp_dir().join(format!("burnpose-export-{}", std::process::id()));
        let (train, val) = (BuiltinDataset::new(3, 96, 5), BuiltinDataset::new(2, 96, 6));
        let yaml = write_yolo(&train, &val, &dir).unwrap();
        let (t, v, skipped) = YoloDataset::open_pair(&yaml, 1, [17, 3], false, "val").unwrap();
        assert_eq!((t.len(), v.len(), skipped), (3, 2, 0));
        assert_eq!(t.flip_idx.as_deref(), Some(&COCO_FLIP_IDX[..]));
        for (data, back) in [(&train, &t), (&val, &v)] {
            for i in 0..data.len {
                let (a, b) = (data.get(i), back.get(i).unwrap());
                assert_eq!(a.image, b.image, "pixels of image {i}");
                assert_eq!(a.instances.len(), b.instances.len());
                for (x, y) in a.instances.iter().zip(&b.instances) {
                    for (p, q) in x.bbox.iter().zip(&y.bbox) {
                        assert!((p - q).abs() < 1e-3, "bbox {:?} vs {:?}", x.bbox, y.bbox);
                    }
                    for (p, q) in x.keypoints.iter().zip(&y.keypoints) {
                        assert!((p[0] - q[0]).abs() < 1e-3 && (p[1] - q[1]).abs() < 1e-3);
                        assert_eq!(p[2], q[2]);
                    }
                }
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
