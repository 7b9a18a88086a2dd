//! What the recorder reads from CubeCL's errors (CUDA build, no device).

use super::record::err;
use super::recorder::RecordError;
use burn::backend::{BackTrace, ExecutionError};
use burn::cubecl::server::IoError;

/// The refusal as `record_step` makes it: CubeCL's error formatted into Burn's (as Burn's
/// `graph_stop_capture` does), then into ours.
fn refusal(io: IoError) -> RecordError {
    let burn = ExecutionError::WithContext {
        reason: format!("{io}"),
    };
    err("step capture", &burn)
}

#[test]
fn a_window_refused_for_room_is_told_from_other_refusals() {
    let room = IoError::PageUpdateForbidden {
        size: 24_822_784,
        backtrace: BackTrace::capture(),
    };
    assert!(refusal(room).wants_room());
    let too_big = IoError::BufferTooBig {
        size: 24_822_784,
        backtrace: BackTrace::capture(),
    };
    assert!(!refusal(too_big).wants_room());
    let other = RecordError("the recorded backward reached other parameters".into());
    assert!(!other.wants_room());
}
