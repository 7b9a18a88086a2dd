//! The binary as a user runs it (CPU build).

use std::process::Command;

fn burnpose(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_burnpose"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run burnpose");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn info_prints_reference_totals() {
    let (ok, text) = burnpose(&["info"]);
    assert!(ok, "{text}");
    assert!(
        text.contains("3679464 parameters (2262624 backbone+neck)"),
        "{text}"
    );
    assert!(text.contains("Pose26"), "{text}");
    assert!(text.contains("56x8400 anchors"), "{text}");
    let (ok, text) = burnpose(&["info", "--task", "detect", "--nc", "80", "--imgsz", "320"]);
    assert!(ok, "{text}");
    assert!(
        text.contains("yolo26n (Detect)") && text.contains("84x2100 anchors"),
        "{text}"
    );
}

#[test]
fn info_rejects_bad_flags() {
    let (ok, text) = burnpose(&["info", "--scale", "q"]);
    assert!(!ok && text.contains("--scale"), "{text}");
    let (ok, text) = burnpose(&["info", "--imgsz", "100"]);
    assert!(!ok && text.contains("--imgsz"), "{text}");
}

#[test]
fn fit_builds_model_and_batch_then_says_it_stops() {
    let (ok, text) = burnpose(&["fit", "configs/pose_nano.toml", "--device", "cpu"]);
    assert!(ok, "{text}");
    assert!(
        text.contains("batch: [4, 3, 320, 320]") && text.contains("2100 anchors"),
        "{text}"
    );
    assert!(
        text.contains("STOPPING HERE") && text.contains("Nothing was trained"),
        "{text}"
    );
}

#[test]
fn fit_with_bad_config_names_file_and_key() {
    let dir = std::env::temp_dir().join(format!("burnpose-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.toml");
    std::fs::write(&path, "[train]\nbatchsize = 4\n").unwrap();
    let (ok, text) = burnpose(&["fit", path.to_str().unwrap()]);
    assert!(!ok, "{text}");
    assert!(
        text.contains("bad.toml") && text.contains("batchsize"),
        "{text}"
    );
    let (ok, text) = burnpose(&["fit", "configs/does_not_exist.toml"]);
    assert!(!ok && text.contains("does_not_exist.toml"), "{text}");
}
