//! Datasets and batches. Everything here produces host data; the trainer uploads it.

pub mod batch;
pub mod builtin;
pub mod coco;
pub mod error;
pub mod letterbox;

pub use batch::Batch;
pub use builtin::BuiltinDataset;
pub use error::DataError;

/// One labelled object: class, box and (pose) keypoints, in pixels of its image.
#[derive(Clone, Debug, PartialEq)]
pub struct Instance {
    pub class: usize,
    /// `[x1, y1, x2, y2]`.
    pub bbox: [f32; 4],
    /// `(x, y, v)` per keypoint; v = 0 not labelled, 1 occluded, 2 visible.
    pub keypoints: Vec<[f32; 3]>,
}

/// An RGB image with its labels.
#[derive(Clone, Debug)]
pub struct Sample {
    pub image: image::RgbImage,
    pub instances: Vec<Instance>,
}

/// COCO's left/right keypoint swap for horizontal flips.
pub const COCO_FLIP_IDX: [usize; 17] = [0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15];
