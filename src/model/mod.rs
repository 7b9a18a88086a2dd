//! YOLO26 models as typed Burn modules (yolo_spec §1–2).

pub mod attention;
pub mod backbone;
pub mod blocks;
pub mod conv;
pub mod flow;
pub mod head;
pub mod ops;
pub mod params;
pub mod precision;
pub mod scale;
pub mod summary;
pub mod yolo;

pub use backbone::{Backbone, Features, Neck};
pub use head::{BranchOutput, Head, HeadOutput, STRIDES};
pub use params::{FloatSink, NamedParam, ParamCount, float_shapes, named_params, walk_floats};
pub use scale::Scale;
pub use yolo::{LAYERS, Task, Yolo, YoloConfig};
