//! Helpers shared by the unit tests (compiled only for them).

/// Largest |a − b| over the largest |b| (at least 1e-12).
pub(crate) fn rel(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}
