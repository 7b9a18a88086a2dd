//! Datasets and batches. Everything here produces host data; the trainer uploads it.

pub mod affine;
pub mod augment;
pub mod batch;
pub mod builtin;
pub mod coco;
pub mod device_hsv;
pub mod error;
pub mod export;
pub mod hsv;
pub mod letterbox;
pub mod loader;
pub mod mosaic;
pub mod resize;
pub mod source;
pub mod yolo;

pub use batch::Batch;
pub use builtin::BuiltinDataset;
pub use error::DataError;
pub use loader::Loader;
pub use source::{Frame, Source};

/// One labelled object: class, box and (pose) keypoints, in pixels of its image.
#[derive(Clone, Debug, PartialEq)]
pub struct Instance {
    pub class: usize,
    /// `[x1, y1, x2, y2]`.
    pub bbox: [f32; 4],
    /// `(x, y, v)` per keypoint; v = 0 not labelled, 1 occluded, 2 visible.
    pub keypoints: Vec<[f32; 3]>,
}

impl Instance {
    /// Labelled keypoints moved by `f`; unlabelled ones stay `[0, 0, 0]`.
    pub fn mapped_keypoints(&self, f: impl Fn(f32, f32) -> [f32; 2]) -> Vec<[f32; 3]> {
        self.keypoints
            .iter()
            .map(|k| {
                if k[2] == 0.0 {
                    return [0.0; 3];
                }
                let [x, y] = f(k[0], k[1]);
                [x, y, k[2]]
            })
            .collect()
    }

    /// As [`Instance::mapped_keypoints`], and those landing outside `[0, w] × [0, h]` become
    /// unlabelled too.
    pub fn moved_keypoints(
        &self,
        f: impl Fn(f32, f32) -> [f32; 2],
        w: f32,
        h: f32,
    ) -> Vec<[f32; 3]> {
        self.mapped_keypoints(f)
            .into_iter()
            .map(|k| {
                if k[0] < 0.0 || k[1] < 0.0 || k[0] > w || k[1] > h {
                    [0.0; 3]
                } else {
                    k
                }
            })
            .collect()
    }
}

/// Every file below `folder` (subfolders included) that `keep` accepts, sorted by path as text,
/// as Ultralytics' recursive glob lists a folder; an unreadable folder is an error naming it.
pub fn files_below(
    folder: &std::path::Path,
    keep: impl Fn(&std::path::Path) -> bool,
) -> Result<Vec<std::path::PathBuf>, DataError> {
    let io = |path: &std::path::Path, error| DataError::Io {
        path: path.to_path_buf(),
        error,
    };
    let mut found = Vec::new();
    let mut folders = vec![folder.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).map_err(|e| io(&folder, e))? {
            let path = entry.map_err(|e| io(&folder, e))?.path();
            if path.is_dir() {
                folders.push(path);
            } else if keep(&path) {
                found.push(path);
            }
        }
    }
    found.sort_by(|a, b| a.as_os_str().cmp(b.as_os_str()));
    Ok(found)
}

/// The image at `path`, decoded to RGB; an error names the file.
pub fn open_rgb(path: &std::path::Path) -> Result<image::RgbImage, DataError> {
    let (decoder, orientation) = decoder_of(path)?;
    let mut image = image::DynamicImage::from_decoder(decoder).map_err(|e| bad_image(path, e))?;
    image.apply_orientation(orientation);
    Ok(image.to_rgb8())
}

/// Width and height of the image at `path` as [`open_rgb`] returns it (turned by its EXIF
/// orientation), read from its header without decoding the pixels.
pub fn rgb_dimensions(path: &std::path::Path) -> Result<(u32, u32), DataError> {
    use image::ImageDecoder;
    use image::metadata::Orientation;
    let (decoder, orientation) = decoder_of(path)?;
    let (w, h) = decoder.dimensions();
    let turned = matches!(
        orientation,
        Orientation::Rotate90
            | Orientation::Rotate270
            | Orientation::Rotate90FlipH
            | Orientation::Rotate270FlipH
    );
    Ok(if turned { (h, w) } else { (w, h) })
}

/// The decoder of the image at `path` and the EXIF orientation to turn it by: as the labelling
/// tool showed it (and as OpenCV's `imread` in Ultralytics reads it); an unreadable orientation
/// counts as none.
fn decoder_of(
    path: &std::path::Path,
) -> Result<(impl image::ImageDecoder, image::metadata::Orientation), DataError> {
    use image::ImageDecoder;
    let mut decoder = image::ImageReader::open(path)
        .map_err(|e| bad_image(path, image::ImageError::IoError(e)))?
        .into_decoder()
        .map_err(|e| bad_image(path, e))?;
    let orientation = decoder
        .orientation()
        .unwrap_or(image::metadata::Orientation::NoTransforms);
    Ok((decoder, orientation))
}

fn bad_image(path: &std::path::Path, e: image::ImageError) -> DataError {
    DataError::Image {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// An RGB image with its labels.
#[derive(Clone, Debug)]
pub struct Sample {
    pub image: image::RgbImage,
    pub instances: Vec<Instance>,
}

/// COCO's left/right keypoint swap for horizontal flips.
pub const COCO_FLIP_IDX: [usize; 17] = [0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15];

/// `../shared/data/<rel>` beside the project for unit tests, or `None` with a visible notice
/// when it is absent; under CI (`CI` set) its absence fails the test. (The integration tests'
/// twin is `tests/common::shared_data`: they cannot see `cfg(test)` items.)
#[cfg(test)]
pub(crate) fn shared_test_data(rel: &str) -> Option<std::path::PathBuf> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/data")
        .join(rel);
    if path.exists() {
        return Some(path);
    }
    assert!(
        std::env::var("CI").is_err(),
        "{} is missing under CI",
        path.display()
    );
    // Past the test harness's capture, so the skip is seen in a passing run.
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!("NOTICE: skipping, {} is not present\n", path.display()).as_bytes(),
    );
    None
}
