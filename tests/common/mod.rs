//! Helpers shared by the integration tests (each test file compiles its own copy, hence the
//! allowance for the helpers a file does not use).
#![allow(dead_code)]

pub mod empty_batch;
pub mod fixtures;

use burn::prelude::*;
use burn::tensor::TensorData;
use std::path::PathBuf;
use std::process::Command;

/// The error a trainer built from `cfg` (read from `path`) stops with, as text; panics if it
/// builds.
pub fn refusal(cfg: burnpose::config::Config, path: &str) -> String {
    burnpose::train::Trainer::new(
        cfg,
        std::path::Path::new(path),
        burn::prelude::Device::flex(),
    )
    .err()
    .expect("refused")
    .to_string()
}

/// Runs the burnpose binary from the project root: whether it succeeded, and stdout + stderr.
pub fn burnpose(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_burnpose"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run burnpose");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// `../shared/data/<rel>` beside the project, or `None` with a visible notice when it is absent;
/// under CI (`CI` set) its absence fails the test.
pub fn shared_data(rel: &str) -> Option<PathBuf> {
    // Relative to the working directory: the package root under `cargo test`, and the working
    // tree's copy on the GPU machine, where `.gpu/setup.sh` links `../shared/data`.
    let path = std::path::Path::new("../shared/data").join(rel);
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

/// Damages sample `n` (from 1) of the H.264 track of the MP4 at `path` in place: its first NAL
/// length claims more bytes than the sample holds, so decoding stops there while the container
/// still parses. For tests of a video that breaks off.
pub fn break_sample(path: &std::path::Path, n: u32) {
    let bytes = std::fs::read(path).expect("the video");
    let mut mp4 = mp4::Mp4Reader::read_header(std::io::Cursor::new(&bytes), bytes.len() as u64)
        .expect("a readable MP4");
    let track = *mp4.tracks().keys().next().expect("a track");
    let sample = mp4
        .read_sample(track, n)
        .expect("readable")
        .expect("sample n");
    let at = bytes
        .windows(sample.bytes.len())
        .position(|w| w == &sample.bytes[..])
        .expect("the sample's bytes in the file");
    let mut damaged = bytes.clone();
    damaged[at..at + 4].copy_from_slice(&[0x7f, 0xff, 0xff, 0xff]);
    std::fs::write(path, damaged).expect("writable");
}

/// Two steps' logged loss items agree within `rel` of each (at least 1).
pub fn assert_items_close(ours: &[f32; 6], theirs: &[f32; 6], rel: f32, what: &str) {
    for (k, (x, y)) in ours.iter().zip(theirs).enumerate() {
        assert!(
            (x - y).abs() <= rel * y.abs().max(1.0),
            "{what} item {k}: {x} vs {y}"
        );
    }
}

/// `t`'s values, copied to the host now. On CUDA `into_data` reads lazily: the copy happens at
/// the first access to the bytes, so a snapshot taken before a step and looked at after it shows
/// the values after it wherever the step wrote in place (the flat optimizer's parameters, the
/// EMA). Snapshots compared across a step come from here.
pub fn host_now<const D: usize>(t: Tensor<D>) -> TensorData {
    let d = t.into_data();
    TensorData::from_bytes_vec(d.as_bytes().to_vec(), d.shape().clone(), d.dtype())
}
