//! Validation: post-processing and COCO-style box and keypoint (OKS) mAP.

pub mod cocoeval;
pub mod postprocess;
pub mod ultralytics;

pub use cocoeval::{DtAnn, GtAnn, IouKind, Summary, evaluate};
pub use postprocess::{Detection, Select, detect, one2many_nms, one2one};
