//! Helpers shared by the integration tests (each test file compiles its own copy, hence the
//! allowance for the helpers a file does not use).
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

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
