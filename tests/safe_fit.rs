//! A fit never destroys work: earlier runs are kept, a diverged model is never saved, a checkpoint
//! is only resumed or evaluated with what it was trained on, and a killed fit resumes exactly.

mod common;

use common::burnpose;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A fresh folder with a tiny CPU config (`extra` appended) whose runs go under `runs/`.
fn setup(tag: &str, extra: &str) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("burnpose-safe-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("tiny.toml");
    std::fs::write(
        &cfg,
        format!(
            "[data]\nimgsz = 64\ntrain_images = 4\nval_images = 2\nworkers = 0\n[train]\nepochs = 1\nbatch = 2\nnbs = 2\n[device]\nkind = \"cpu\"\n[output]\ndir = {:?}\nname = \"run\"\n{extra}",
            dir.join("runs").to_str().unwrap()
        ),
    )
    .unwrap();
    (dir, cfg)
}

/// The `state hashes:` line a fit prints last.
fn hashes(text: &str) -> String {
    text.lines()
        .find(|l| l.starts_with("state hashes:"))
        .unwrap_or_else(|| panic!("no state hashes in: {text}"))
        .to_string()
}

#[test]
fn a_second_fit_gets_a_new_run_folder() {
    let (dir, cfg) = setup("folders", "");
    let cfg = cfg.to_str().unwrap();
    let (ok, text) = burnpose(&["fit", cfg]);
    assert!(ok, "{text}");
    let first = std::fs::read(dir.join("runs/run/last.safetensors")).unwrap();
    let (ok, text) = burnpose(&["fit", cfg]);
    assert!(ok && text.contains("runs/run2"), "{text}");
    assert_eq!(
        std::fs::read(dir.join("runs/run/last.safetensors")).unwrap(),
        first,
        "the first run's checkpoint was overwritten"
    );
    assert!(dir.join("runs/run2/last.safetensors").is_file());
    // --exist-ok writes into the named folder.
    let (ok, text) = burnpose(&["fit", cfg, "--exist-ok"]);
    assert!(ok && !text.contains("runs/run3"), "{text}");
    assert!(!dir.join("runs/run3").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_diverging_fit_stops_and_saves_nothing() {
    // SGD at an absurd learning rate, no clipping: the loss is NaN within a few steps.
    let (dir, cfg) = setup(
        "nan",
        "[optim]\noptimizer = \"sgd\"\nlr0 = 1e30\nwarmup_epochs = 0.0\nclip_norm = 1e38\n",
    );
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("epochs = 1", "epochs = 3")
        .replace("train_images = 4", "train_images = 8");
    std::fs::write(&cfg, text).unwrap();
    let (ok, text) = burnpose(&["fit", cfg.to_str().unwrap()]);
    assert!(!ok, "{text}");
    assert!(
        text.contains("the loss became") && text.contains("at epoch 1, iteration "),
        "{text}"
    );
    assert!(!text.contains("panicked"), "{text}");
    assert!(
        !dir.join("runs/run/last.safetensors").exists(),
        "a diverged model was saved"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn resume_with_another_config_says_so() {
    let (dir, cfg) = setup("differs", "");
    let (ok, text) = burnpose(&["fit", cfg.to_str().unwrap()]);
    assert!(ok, "{text}");
    let ckpt = dir.join("runs/run/last.safetensors");
    let other = dir.join("other.toml");
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&other, text.replace("epochs = 1", "epochs = 4")).unwrap();
    let (ok, out) = burnpose(&[
        "fit",
        other.to_str().unwrap(),
        "--resume",
        ckpt.to_str().unwrap(),
    ]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("other.toml differs") && out.contains("train.epochs: checkpoint 1, config 4"),
        "{out}"
    );
    // `--scope` on resume must be the checkpoint's scope (here the pose default, "features").
    let own = dir.join("runs/run/config.toml");
    let resume_with = |scope: &str| {
        burnpose(&[
            "fit",
            own.to_str().unwrap(),
            "--resume",
            ckpt.to_str().unwrap(),
            "--scope",
            scope,
        ])
    };
    let (ok, out) = resume_with("network");
    assert!(!ok, "{out}");
    assert!(
        out.contains("--scope network differs") && out.contains("(features)"),
        "{out}"
    );
    let (ok, out) = resume_with("features");
    assert!(ok && out.contains("resumed"), "{out}");
    // A fresh fit takes the override and records it in its config.toml.
    let (ok, out) = burnpose(&[
        "fit",
        cfg.to_str().unwrap(),
        "--name",
        "net",
        "--scope",
        "network",
    ]);
    assert!(ok, "{out}");
    let written = std::fs::read_to_string(dir.join("runs/net/config.toml")).unwrap();
    assert!(written.contains("scope = \"network\""), "{written}");
    // The run's own config.toml resumes (here: the fit is already complete).
    let (ok, out) = burnpose(&[
        "fit",
        own.to_str().unwrap(),
        "--resume",
        ckpt.to_str().unwrap(),
    ]);
    assert!(ok && out.contains("resumed"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn checkpoints_are_checked_against_model_and_data() {
    let (dir, cfg) = setup("mismatch", "");
    let (ok, text) = burnpose(&["fit", cfg.to_str().unwrap()]);
    assert!(ok, "{text}");
    let ckpt = dir.join("runs/run/last.safetensors");
    let ckpt = ckpt.to_str().unwrap();
    // Another model: two classes.
    let two = dir.join("two.toml");
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&two, format!("[model]\nnc = 2\n{text}")).unwrap();
    let (ok, out) = burnpose(&["val", two.to_str().unwrap(), "--checkpoint", ckpt]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("does not fit this run") && out.contains("nc 1") && out.contains("nc 2"),
        "{out}"
    );
    assert!(!out.contains("panicked"), "{out}");
    // Other data is fine for val ...
    let more = dir.join("more.toml");
    std::fs::write(&more, text.replace("train_images = 4", "train_images = 6")).unwrap();
    let (ok, out) = burnpose(&["val", more.to_str().unwrap(), "--checkpoint", ckpt]);
    assert!(ok, "{out}");
    // ... but not for resuming, whose epochs were counted over 4 images.
    let mut trainer = burnpose::train::Trainer::new(
        burnpose::config::Config::load(&more).unwrap(),
        &more,
        burn::prelude::Device::flex(),
    )
    .unwrap();
    let err = burnpose::train::checkpoint::load_into(&mut trainer, Path::new(ckpt))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("trained on 4 training images, the data now has 6"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// kill -9 a fit just after its first checkpoint, resume it in a new process: the final state
/// equals an uninterrupted fit's.
#[test]
fn a_killed_fit_resumes_exactly() {
    let (dir, cfg) = setup("kill", "");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("epochs = 1", "epochs = 3")
        .replace("train_images = 4", "train_images = 12");
    std::fs::write(&cfg, text).unwrap();
    let cfg = cfg.to_str().unwrap();
    let (ok, whole) = burnpose(&["fit", cfg, "--name", "whole"]);
    assert!(ok, "{whole}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_burnpose"))
        .args(["fit", cfg, "--name", "killed"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let last = dir.join("runs/killed/last.safetensors");
    let start = std::time::Instant::now();
    while !last.exists() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the fit ended before its first checkpoint"
        );
        assert!(
            start.elapsed().as_secs() < 600,
            "no checkpoint after 10 min"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // Into the second epoch.
    std::thread::sleep(std::time::Duration::from_millis(300));
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert!(!status.success(), "the fit finished before it was killed");
    let (ok, resumed) = burnpose(&["fit", cfg, "--resume", last.to_str().unwrap()]);
    assert!(ok && resumed.contains("resumed"), "{resumed}");
    assert!(resumed.contains("done: 3 epochs"), "{resumed}");
    assert_eq!(hashes(&resumed), hashes(&whole));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `train.patience` stops a fit once fitness has not improved for that many epochs, and
/// `train.save_period` keeps every N-th epoch's checkpoint.
#[test]
fn patience_and_save_period() {
    let (dir, cfg) = setup("patience", "");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("epochs = 1", "epochs = 6\npatience = 1\nsave_period = 2");
    std::fs::write(&cfg, text).unwrap();
    let (ok, out) = burnpose(&["fit", cfg.to_str().unwrap()]);
    assert!(ok, "{out}");
    let run = dir.join("runs/run");
    let last = run.join("last.safetensors");
    let stored = burnpose::train::checkpoint::read_config(&last).unwrap();
    let mut t = burnpose::train::Trainer::new(stored, &cfg, burn::prelude::Device::flex()).unwrap();
    burnpose::train::checkpoint::load_into(&mut t, &last).unwrap();
    let fitness: Vec<f64> = t.history.iter().map(|r| r.fitness()).collect();
    // With patience 1 the fit goes on exactly while every epoch beats the best before it.
    let mut best = f64::MIN;
    let mut want = fitness.len();
    for (e, f) in fitness.iter().enumerate() {
        if *f > best {
            best = *f;
        } else {
            want = e + 1;
            break;
        }
    }
    assert_eq!(fitness.len(), want, "{fitness:?}");
    if want < 6 {
        assert!(
            out.contains("stopping early: no improvement in 1 epochs"),
            "{out}"
        );
    }
    for e in 1..=6 {
        let kept = run.join(format!("epoch{e}.safetensors")).exists();
        assert_eq!(kept, e % 2 == 0 && e <= want, "epoch{e}.safetensors");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
