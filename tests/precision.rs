//! FP16 / BF16 training on the CPU: reduced-precision convolutions with FP32 master weights,
//! FP16 loss scaling with skipped steps, determinism and resume of the scaler.

use burn::prelude::*;
use burnpose::config::Config;
use burnpose::train::{Trainer, checkpoint};
use std::path::Path;

fn config(precision: &str, extra: &str) -> Config {
    let text = format!(
        "[data]\nimgsz = 64\ntrain_images = 8\nval_images = 2\n[train]\nbatch = 2\nseed = 5\nprecision = \"{precision}\"\n{extra}"
    );
    Config::parse(&text, Path::new("test.toml")).unwrap()
}

fn trainer(cfg: &Config) -> Trainer {
    Trainer::new(cfg.clone(), Path::new("test.toml"), Device::flex()).unwrap()
}

/// A fit; FP16 starts from a loss scale of 16 instead of 65536, because at initialisation the
/// scaled gradients of this model overflow FP16 until the scaler has backed off to about 512.
fn fit(cfg: &Config) -> Trainer {
    let mut t = trainer(cfg);
    if let Some(s) = &mut t.scaler {
        s.scale = 16.0;
    }
    while !t.finished() {
        t.run_epoch(&mut |_, _, _| {}).unwrap();
    }
    t
}

#[test]
fn reduced_precision_trains_deterministically_and_differs_from_fp32() {
    let fp32 = fit(&config("fp32", "epochs = 2\nnbs = 4\n")).state_hashes();
    assert_eq!(fp32.scaler, "none");
    for precision in ["bf16", "fp16"] {
        let cfg = config(precision, "epochs = 2\nnbs = 4\n");
        let (a, b) = (fit(&cfg), fit(&cfg));
        let (ha, hb) = (a.state_hashes(), b.state_hashes());
        assert_eq!(ha, hb, "{precision}: two runs differ");
        assert_ne!(ha.losses, fp32.losses, "{precision}: same losses as fp32");
        assert!(
            a.step_losses.iter().flatten().all(|v| v.is_finite()),
            "{precision}: {:?}",
            a.step_losses
        );
        // Master weights stay FP32.
        let w = a.model.backbone.l0.conv.weight.val();
        assert_eq!(w.dtype(), burn::tensor::DType::F32, "{precision}");
        assert_eq!(a.scaler.is_some(), precision == "fp16");
        if let Some(s) = &a.scaler {
            assert_eq!(s.skipped, 0, "fp16 steps were skipped: {s:?}");
        }
    }
}

/// An FP16 step whose gradients overflow is skipped: parameters and optimizer state stay, the
/// scale halves, and the scaler state survives a checkpoint.
#[test]
fn fp16_overflow_skips_the_step_and_resumes() {
    let cfg = config(
        "fp16",
        "epochs = 1\nnbs = 2\n[optim]\nwarmup_epochs = 0.0\n",
    );
    let mut t = trainer(&cfg);
    let huge = 2f32.powi(100);
    t.scaler.as_mut().unwrap().scale = huge;
    let weights = |t: &Trainer| t.model.backbone.l0.conv.weight.val().into_data();
    let (w0, opt0) = (weights(&t), t.optimizer.state_hash());
    let order = t.epoch_order(0);
    let batch = t.batch(&order, 0).unwrap();
    t.train_step(&batch);
    let s = t.scaler.clone().unwrap();
    assert_eq!((s.skipped, s.scale), (1, huge / 2.0), "{s:?}");
    assert_eq!(weights(&t), w0, "an overflowing step moved the weights");
    assert_eq!(t.optimizer.state_hash(), opt0);
    assert!(t.optimizer.state.iter().all(|p| p.steps == 0));

    // A small scale lets the next step through.
    t.scaler.as_mut().unwrap().scale = 16.0;
    t.train_step(&t.batch(&order, 1).unwrap());
    assert_eq!(t.scaler.as_ref().unwrap().skipped, 1);
    assert_ne!(weights(&t), w0, "a finite fp16 step must update");

    let dir = std::env::temp_dir().join(format!("burnpose-fp16-{}", std::process::id()));
    let path = dir.join("last.safetensors");
    checkpoint::save(&t, &path).unwrap();
    let mut resumed = trainer(&cfg);
    checkpoint::load_into(&mut resumed, &path).unwrap();
    assert_eq!(resumed.scaler, t.scaler);
    // Per-step losses are a log of this process, not checkpointed; everything else is.
    let (a, b) = (resumed.state_hashes(), t.state_hashes());
    assert_eq!(
        (a.model, a.ema, a.optimizer, a.scheduler, a.scaler),
        (b.model, b.ema, b.optimizer, b.scheduler, b.scaler)
    );

    let mut fp32 = trainer(&config(
        "fp32",
        "epochs = 1\nnbs = 2\n[optim]\nwarmup_epochs = 0.0\n",
    ));
    let e = checkpoint::load_into(&mut fp32, &path)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("last.safetensors") && e.contains("precision"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
