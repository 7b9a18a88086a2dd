//! Where a fit's images come from: the built-in dataset, a COCO keypoints or a YOLO txt dataset,
//! prepared once (decoded and resized) and served letterboxed or augmented at the training size,
//! with ground truth for COCO-style evaluation.

use super::coco::{CocoAnnotation, CocoDataset};
use super::letterbox::{letterbox, letterbox_into, resize_for_loading};
use super::yolo::YoloDataset;
use super::{BuiltinDataset, DataError, Instance, Sample};
use crate::config::{CacheMode, Config, DataSource};
use crate::eval::GtAnn;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// Maps network-input pixels back to the original image: `x = (x' − pad) / scale`, clipped to
/// the image.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Frame {
    pub scale: f32,
    pub pad: [f32; 2],
    /// The original image's width and height.
    pub size: [f32; 2],
}

impl Frame {
    /// A point in the original image's pixels, clipped to `[0, width] × [0, height]` as
    /// Ultralytics' `scale_boxes`/`scale_coords` clip boxes and keypoints: a box reaching past
    /// the border is scored and drawn as its part inside the image.
    pub fn to_original(&self, x: f32, y: f32) -> (f64, f64) {
        (
            ((x - self.pad[0]) / self.scale).clamp(0.0, self.size[0]) as f64,
            ((y - self.pad[1]) / self.scale).clamp(0.0, self.size[1]) as f64,
        )
    }
}

/// The images a source reads.
#[derive(Clone, Debug)]
pub enum Dataset {
    Builtin(BuiltinDataset),
    Coco(CocoDataset),
    Yolo(YoloDataset),
}

impl Dataset {
    /// How many images it holds.
    pub fn len(&self) -> usize {
        match self {
            Dataset::Builtin(b) => b.len,
            Dataset::Coco(c) => c.len(),
            Dataset::Yolo(y) => y.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A dataset served at one training size, with the prepared-image cache: decoded images resized
/// so the long side is `size` (aspect kept), kept in RAM after first use so later epochs decode
/// nothing. Thread-safe: prefetch workers share one `Source`.
#[derive(Debug)]
pub struct Source {
    pub dataset: Dataset,
    pub size: u32,
    cache: Option<Vec<OnceLock<Arc<Prepared>>>>,
}

/// A decoded image resized to the source's long side, its labels in those pixels, and the
/// factor from original pixels.
#[derive(Debug)]
pub struct Prepared {
    pub sample: Sample,
    /// `[new width / width, new height / height]` of the resize.
    pub scale: [f32; 2],
    /// Width and height of the decoded original.
    pub original: (u32, u32),
}

/// `data.path`: as written when it exists or is absolute, else relative to the config's folder.
fn data_root(cfg: &Config, config_path: &Path) -> PathBuf {
    crate::config::beside_config(&cfg.data.path.clone().unwrap_or_default(), config_path)
}

impl Source {
    pub fn new(dataset: Dataset, size: u32, cache: CacheMode) -> Self {
        let len = dataset.len();
        let cache = (cache == CacheMode::Ram).then(|| (0..len).map(|_| OnceLock::new()).collect());
        Self {
            dataset,
            size,
            cache,
        }
    }

    /// Train and val sources of a config, and how many bad records were skipped.
    pub fn open(cfg: &Config, config_path: &Path) -> Result<(Self, Self, usize), DataError> {
        let d = &cfg.data;
        let size = d.imgsz as u32;
        let k = cfg.model.label_kpt_shape()[0];
        let root = || data_root(cfg, config_path);
        let (train, val, skipped) = match d.source {
            DataSource::Builtin => {
                let (train, val) = BuiltinDataset::splits(cfg);
                (Dataset::Builtin(train), Dataset::Builtin(val), 0)
            }
            DataSource::Coco => {
                let root = root();
                let (train, s1) = CocoDataset::open(&root, &d.train_split, k, d.skip_bad)?;
                let (val, s2) = CocoDataset::open(&root, &d.val_split, k, d.skip_bad)?;
                (Dataset::Coco(train), Dataset::Coco(val), s1 + s2)
            }
            DataSource::Yolo => {
                let (train, val, skipped) = YoloDataset::open_pair(
                    &root(),
                    cfg.model.nc,
                    cfg.model.label_kpt_shape(),
                    d.skip_bad,
                    &d.val_split,
                )?;
                (Dataset::Yolo(train), Dataset::Yolo(val), skipped)
            }
        };
        let cache = match d.cache {
            CacheMode::Ram => {
                let need = cache_bytes(&train, size) + cache_bytes(&val, size);
                ram_or_none(need, available_memory())
            }
            mode => mode,
        };
        Ok((
            Self::new(train, size, cache),
            Self::new(val, size, cache),
            skipped,
        ))
    }

    /// The image files of the config's split `split` (a YOLO yaml's `train`, `val` or `test`; a
    /// COCO split name), found as training finds them; no label is read. `None` for the built-in
    /// dataset, whose images are drawn, not files.
    pub fn split_images(
        cfg: &Config,
        config_path: &Path,
        split: &str,
    ) -> Result<Option<Vec<PathBuf>>, DataError> {
        let root = data_root(cfg, config_path);
        Ok(match cfg.data.source {
            DataSource::Builtin => None,
            DataSource::Coco => Some(CocoDataset::split_images(&root, split)?),
            DataSource::Yolo => Some(super::yolo::split_images(&root, split)?),
        })
    }

    pub fn len(&self) -> usize {
        self.dataset.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Image `i` decoded and resized as Ultralytics loads it (long side = `size`, sides rounded
    /// up), from the cache when it is on.
    pub fn prepared(&self, i: usize) -> Result<Arc<Prepared>, DataError> {
        let Some(cache) = &self.cache else {
            return self.prepare(i).map(Arc::new);
        };
        if let Some(p) = cache[i].get() {
            return Ok(p.clone());
        }
        let p = Arc::new(self.prepare(i)?);
        // Another thread may have filled it meanwhile; both results are identical.
        Ok(cache[i].get_or_init(|| p).clone())
    }

    fn prepare(&self, i: usize) -> Result<Prepared, DataError> {
        let raw = match &self.dataset {
            Dataset::Builtin(b) => b.get(i),
            Dataset::Coco(c) => c.get(i)?,
            Dataset::Yolo(y) => y.get(i)?,
        };
        let original = raw.image.dimensions();
        let (sample, scale) = resize_for_loading(raw, self.size);
        Ok(Prepared {
            sample,
            scale,
            original,
        })
    }

    /// Image `i` letterboxed to the square `size`, and its frame.
    pub fn sample(&self, i: usize) -> Result<(Sample, Frame), DataError> {
        let (s, f, _) = self.load(i, false)?;
        Ok((s, f))
    }

    /// As [`Source::sample`], with the image's ground truth in original pixels, COCO style.
    pub fn sample_with_truth(&self, i: usize) -> Result<(Sample, Frame, Vec<GtAnn>), DataError> {
        self.load(i, true)
    }

    fn load(&self, i: usize, truth: bool) -> Result<(Sample, Frame, Vec<GtAnn>), DataError> {
        self.load_into(i, truth, None)
    }

    /// Ultralytics' rectangular validation batches (`data/base.py::set_rectangle`): the
    /// images in order of aspect ratio (height / width; equal ratios in index order), cut into
    /// batches of `batch`, each with the canvas `[width, height]` its images share: the long
    /// side `size`, the other fitted to the batch's extreme ratio, rounded up to a multiple of
    /// `stride` after adding half a stride.
    pub fn rect_batches(&self, batch: usize, stride: u32) -> Result<Vec<RectBatch>, DataError> {
        let mut ratios = Vec::with_capacity(self.len());
        for i in 0..self.len() {
            let (w, h) = self.original_size(i)?;
            ratios.push(h as f64 / w as f64);
        }
        Ok(rect_plan(&ratios, batch, self.size, stride))
    }

    /// Width and height of image `i` as decoded: from the cache when it holds it, else from
    /// the file's header (no decoding: without a cache, validation would decode every image
    /// twice).
    fn original_size(&self, i: usize) -> Result<(u32, u32), DataError> {
        if let Some(p) = self.cache.as_ref().and_then(|c| c[i].get()) {
            return Ok(p.original);
        }
        match &self.dataset {
            Dataset::Builtin(b) => Ok((b.size, b.size)),
            Dataset::Coco(c) => super::rgb_dimensions(&c.records[i].path),
            Dataset::Yolo(y) => super::rgb_dimensions(&y.items[i].image),
        }
    }

    /// Image `i` letterboxed into a [`Source::rect_batches`] canvas, with its frame and its
    /// ground truth in original pixels, as Ultralytics validates it.
    pub fn sample_rect_with_truth(
        &self,
        i: usize,
        canvas: [u32; 2],
    ) -> Result<(Sample, Frame, Vec<GtAnn>), DataError> {
        self.load_into(i, true, Some(canvas))
    }

    /// Image `i` letterboxed into the square `size` or `canvas`, its frame (Ultralytics maps
    /// predictions back with the height's scale, `scale_boxes`' `ratio_pad[0][0]`) and, when
    /// `truth`, its ground truth.
    fn load_into(
        &self,
        i: usize,
        truth: bool,
        canvas: Option<[u32; 2]>,
    ) -> Result<(Sample, Frame, Vec<GtAnn>), DataError> {
        let image_id = self.image_id(i);
        let prepared = self.prepared(i)?;
        let gts = match (&self.dataset, truth) {
            (_, false) => Vec::new(),
            // From the sample already prepared, not a second rendering of the image.
            (Dataset::Builtin(_), true) => {
                let [sx, sy] = prepared.scale;
                let original: Vec<Instance> = prepared
                    .sample
                    .instances
                    .iter()
                    .map(|inst| Instance {
                        class: inst.class,
                        bbox: [
                            inst.bbox[0] / sx,
                            inst.bbox[1] / sy,
                            inst.bbox[2] / sx,
                            inst.bbox[3] / sy,
                        ],
                        keypoints: inst.mapped_keypoints(|x, y| [x / sx, y / sy]),
                    })
                    .collect();
                builtin_truth(image_id, &original)
            }
            (Dataset::Coco(c), true) => coco_truth(&c.records[i].annotations),
            (Dataset::Yolo(y), true) => builtin_truth(image_id, &y.instances(i, prepared.original)),
        };
        let (s, scale, pad) = match canvas {
            Some(c) => letterbox_into(prepared.sample.clone(), c),
            None => letterbox(prepared.sample.clone(), self.size),
        };
        let frame = Frame {
            scale: prepared.scale[1] * scale,
            pad,
            size: [prepared.original.0 as f32, prepared.original.1 as f32],
        };
        Ok((s, frame, gts))
    }

    /// Class names, where the dataset names its classes (a YOLO yaml's `names`).
    pub fn names(&self) -> Option<&[String]> {
        match &self.dataset {
            Dataset::Yolo(y) => y.names.as_deref(),
            _ => None,
        }
    }

    /// Per-keypoint OKS sigmas, where the dataset gives them (a YOLO yaml's `kpt_oks_sigmas`).
    pub fn kpt_oks_sigmas(&self) -> Option<&[f32]> {
        match &self.dataset {
            Dataset::Yolo(y) => y.kpt_oks_sigmas.as_deref(),
            _ => None,
        }
    }

    /// Image id used for evaluation.
    pub fn image_id(&self, i: usize) -> u64 {
        match &self.dataset {
            Dataset::Coco(c) => c.records[i].image_id,
            _ => i as u64 + 1,
        }
    }
}

/// One of [`Source::rect_batches`]: image indices and the canvas `[width, height]` they share.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RectBatch {
    pub images: Vec<usize>,
    pub canvas: [u32; 2],
}

/// [`Source::rect_batches`] from each image's height / width.
fn rect_plan(ratios: &[f64], batch: usize, size: u32, stride: u32) -> Vec<RectBatch> {
    let mut order: Vec<usize> = (0..ratios.len()).collect();
    order.sort_by(|&a, &b| ratios[a].total_cmp(&ratios[b]));
    let side = |f: f64| ((f * size as f64 / stride as f64 + 0.5).ceil() as u32) * stride;
    order
        .chunks(batch.max(1))
        .map(|part| {
            let (min, max) = (ratios[part[0]], ratios[part[part.len() - 1]]);
            let [fh, fw] = if max < 1.0 {
                [max, 1.0]
            } else if min > 1.0 {
                [1.0, 1.0 / min]
            } else {
                [1.0, 1.0]
            };
            RectBatch {
                images: part.to_vec(),
                canvas: [side(fw), side(fh)],
            }
        })
        .collect()
}

/// Share of its box that a person's segmentation covers on average: the area Ultralytics gives a
/// YOLO label for the keypoint similarity (OKS) scale (`models/yolo/pose/val.py`), where COCO
/// uses the annotation's segmentation area. The full box area made OKS more lenient and pose mAP
/// higher than Ultralytics' on the same detections (docs/weights.md, "Validation").
pub const AREA_OF_BOX: f64 = 0.53;

/// Built-in or YOLO labels as COCO ground truth (0.53 of the box area stands in for the
/// segmentation area, as in Ultralytics' validation).
fn builtin_truth(image_id: u64, instances: &[Instance]) -> Vec<GtAnn> {
    instances
        .iter()
        .map(|inst| {
            let [x1, y1, x2, y2] = inst.bbox.map(|v| v as f64);
            GtAnn {
                image_id,
                // Category ids are class + 1, as the detections' (train::validate).
                category_id: inst.class as u64 + 1,
                bbox: [x1, y1, x2 - x1, y2 - y1],
                area: AREA_OF_BOX * (x2 - x1) * (y2 - y1),
                iscrowd: false,
                keypoints: inst
                    .keypoints
                    .iter()
                    .flat_map(|k| k.map(|v| v as f64))
                    .collect(),
                num_keypoints: inst.keypoints.iter().filter(|k| k[2] > 0.0).count() as u32,
            }
        })
        .collect()
}

/// COCO keypoint annotations are all class 0 (person), category 1.
fn coco_truth(annotations: &[CocoAnnotation]) -> Vec<GtAnn> {
    annotations
        .iter()
        .map(|a| GtAnn {
            image_id: a.image_id,
            category_id: 1,
            bbox: a.bbox,
            area: a.area,
            iscrowd: a.iscrowd == 1,
            keypoints: a.keypoints.clone(),
            num_keypoints: a.num_keypoints,
        })
        .collect()
}

/// Images sampled to estimate the prepared-image cache, at most (Ultralytics samples 30).
const CACHE_SAMPLES: usize = 30;
/// Headroom over the estimate the cache must leave (Ultralytics': 50 %).
const CACHE_MARGIN: f64 = 0.5;

/// Bytes the prepared-image cache would hold for every image of `dataset` at long side `size`:
/// the mean RGB size of up to [`CACHE_SAMPLES`] evenly spaced images, from their headers
/// (unreadable headers are left out of the mean), times the image count.
pub fn cache_bytes(dataset: &Dataset, size: u32) -> u64 {
    let len = dataset.len();
    if len == 0 {
        return 0;
    }
    let prepared = |(w, h): (u32, u32)| {
        let r = size as f64 / w.max(h).max(1) as f64;
        (w as f64 * r).round() * (h as f64 * r).round() * 3.0
    };
    let picks = len.min(CACHE_SAMPLES);
    let sizes: Vec<f64> = (0..picks)
        .filter_map(|k| {
            let i = k * len / picks;
            let dims = match dataset {
                Dataset::Builtin(b) => Some((b.size, b.size)),
                Dataset::Coco(c) => image::image_dimensions(&c.records[i].path).ok(),
                Dataset::Yolo(y) => image::image_dimensions(&y.items[i].image).ok(),
            };
            dims.map(prepared)
        })
        .collect();
    if sizes.is_empty() {
        return 0;
    }
    (sizes.iter().sum::<f64>() / sizes.len() as f64 * len as f64) as u64
}

/// The memory the system says is available (`MemAvailable` of `/proc/meminfo`), or `None` where
/// it cannot tell.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// `CacheMode::Ram` when `need` bytes (plus [`CACHE_MARGIN`]) fit in `available`, or when the
/// available memory is unknown; otherwise `CacheMode::None`, with one warning saying why.
pub fn ram_or_none(need: u64, available: Option<u64>) -> CacheMode {
    let gib = |b: f64| b / (1u64 << 30) as f64;
    match available {
        Some(free) if need as f64 * (1.0 + CACHE_MARGIN) > free as f64 => {
            eprintln!(
                "warning: data.cache = \"ram\" would need ~{:.1} GiB (+{:.0} % headroom) for the \
                 prepared images, but {:.1} GiB are available: images are decoded every epoch \
                 instead (set data.cache = \"none\" to silence this)",
                gib(need as f64),
                CACHE_MARGIN * 100.0,
                gib(free as f64)
            );
            CacheMode::None
        }
        _ => CacheMode::Ram,
    }
}

#[cfg(test)]
mod cache_tests {
    use super::*;

    #[test]
    fn cache_estimate_and_the_fallback_when_it_does_not_fit() {
        let builtin = Dataset::Builtin(BuiltinDataset {
            len: 100,
            size: 640,
            seed: 0,
        });
        // Resized to a long side of 320: 320 × 320 × 3 bytes each.
        let need = cache_bytes(&builtin, 320);
        assert_eq!(need, 100 * 320 * 320 * 3);
        assert_eq!(ram_or_none(need, Some(need * 2)), CacheMode::Ram);
        assert_eq!(
            ram_or_none(need, Some(need)),
            CacheMode::None,
            "no headroom"
        );
        assert_eq!(ram_or_none(need, Some(1 << 20)), CacheMode::None);
        assert_eq!(
            ram_or_none(need, None),
            CacheMode::Ram,
            "unknown: keep the cache"
        );
        assert!(
            available_memory().is_some_and(|b| b > 0),
            "/proc/meminfo read"
        );
    }
}

#[cfg(test)]
mod truth_tests {
    use super::*;

    #[test]
    fn points_map_back_clipped_to_the_image() {
        // A 200 × 100 image letterboxed into 64 px: scale 0.32, padded 16 px above and below.
        let f = Frame {
            scale: 0.32,
            pad: [0.0, 16.0],
            size: [200.0, 100.0],
        };
        let (x, y) = f.to_original(32.0, 32.0);
        assert!(
            (x - 100.0).abs() < 1e-4 && (y - 50.0).abs() < 1e-4,
            "{x} {y}"
        );
        // Past the left and bottom borders (a box reaching out of the image): on the border.
        assert_eq!(f.to_original(-5.0, 60.0), (0.0, 100.0));
        assert_eq!(f.to_original(70.0, 0.0), (200.0, 0.0));
    }

    /// Ultralytics' `set_rectangle` on the same ratios gives these batches and canvases
    /// (computed with its numpy formula): landscape batches shrink the height, portrait ones the
    /// width, mixed ones stay square, and half a stride is added before rounding up.
    #[test]
    fn rect_batches_follow_ultralytics_shapes() {
        let ratios = [0.75, 0.5625, 1.0, 1.5, 4.0 / 3.0, 0.6671875];
        let plan: Vec<(Vec<usize>, [u32; 2])> = rect_plan(&ratios, 2, 640, 32)
            .into_iter()
            .map(|b| (b.images, b.canvas))
            .collect();
        assert_eq!(
            plan,
            vec![
                (vec![1, 5], [672, 448]),
                (vec![0, 2], [672, 672]),
                (vec![4, 3], [512, 672]),
            ]
        );
        // A batch of one, shorter than the batch size.
        let one = RectBatch {
            images: vec![0],
            canvas: [352, 192],
        };
        assert_eq!(rect_plan(&[0.5], 4, 320, 32), vec![one]);
    }

    #[test]
    fn yolo_labels_score_keypoints_at_ultralytics_area() {
        let person = Instance {
            class: 0,
            bbox: [10.0, 20.0, 50.0, 120.0],
            keypoints: vec![[30.0, 40.0, 2.0], [0.0, 0.0, 0.0]],
        };
        let g = &builtin_truth(7, &[person])[0];
        assert_eq!(g.bbox, [10.0, 20.0, 40.0, 100.0]);
        // 0.53 of the box, the segmentation share Ultralytics assumes for the OKS scale.
        assert!((g.area - 0.53 * 4000.0).abs() < 1e-9, "{}", g.area);
        assert_eq!((g.image_id, g.category_id, g.num_keypoints), (7, 1, 1));
    }
}
