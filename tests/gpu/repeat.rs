//! Repeatability on the GPU at shapes the other tests do not use: odd batches, image sizes that are
//! not multiples of 64 (whose rows CubeCL pads), device HSV on, real COCO images.

use super::cuda;
use burnpose::config::Config;
use burnpose::train::{StateHashes, Trainer, checkpoint};
use std::path::Path;

/// Built-in data with every augmentation on, HSV on the device, FP32, MuSGD.
fn augmented(batch: usize, imgsz: usize, seed: u64) -> Config {
    let text = format!(
        "[data]\nimgsz = {imgsz}\ntrain_images = {}\nval_images = 3\n[augment]\nhsv_device = true\ndegrees = 5.0\n[train]\nbatch = {batch}\nnbs = {}\nepochs = 2\nclose_mosaic = 1\nseed = {seed}\n[optim]\noptimizer = \"musgd\"\n",
        3 * batch + 1,
        2 * batch
    );
    Config::parse(&text, Path::new("repeat.toml")).unwrap()
}

fn fit(cfg: &Config) -> (StateHashes, Vec<[f32; 6]>) {
    let mut t = Trainer::new(cfg.clone(), Path::new("repeat.toml"), cuda()).unwrap();
    assert!(t.cfg.augment.hsv_device);
    super::replay::run_to_end(&mut t);
    (t.state_hashes(), t.step_losses.clone())
}

/// Two trainers in one process (the second gets memory the first used) give the same state and
/// per-step losses, at batches 1, 3 and 5 and at 160 and 416 px.
#[test]
#[ignore = "needs a CUDA GPU"]
fn device_hsv_fits_repeat_at_odd_shapes() {
    for (batch, imgsz) in [(1, 160), (3, 416), (5, 160)] {
        let cfg = augmented(batch, imgsz, 5);
        let (a, la) = fit(&cfg);
        let (b, lb) = fit(&cfg);
        assert_eq!(la, lb, "batch {batch}, {imgsz} px: per-step losses differ");
        assert_eq!(a, b, "batch {batch}, {imgsz} px: state hashes differ");
        println!("batch {batch}, {imgsz} px: {} steps equal, {a:?}", la.len());
    }
}

/// The check above can fail: another seed gives other hashes.
#[test]
#[ignore = "needs a CUDA GPU"]
fn repeat_check_sees_a_changed_seed() {
    let (a, _) = fit(&augmented(3, 416, 5));
    let (b, _) = fit(&augmented(3, 416, 6));
    assert_ne!(a.model, b.model);
}

/// Feature replay against native at batch 3 on the real COCO train images (416 px, device HSV,
/// BF16), validated on the train split so only it needs to be present.
#[test]
#[ignore = "needs a CUDA GPU and ../shared/data/pose-real/pose_minicoco"]
fn replay_matches_native_at_batch_3_on_coco() {
    coco_b3_parity("", "");
}

/// Native and replayed two-epoch fits at batch 3 on the COCO train images, with more keys of
/// the `[replay]` and `[train]` sections: equal per-step losses and state hashes. Returns the
/// replayed trainer.
pub(super) fn coco_b3_parity(replay_keys: &str, train_keys: &str) -> Trainer {
    let root = Path::new("../shared/data/pose-real/pose_minicoco");
    assert!(
        root.join("annotations/person_keypoints_train2017.json")
            .exists(),
        "{} is missing",
        root.display()
    );
    let config = |capture: bool| {
        let text = format!(
            "[replay]\nenabled = {capture}\n{replay_keys}[data]\nsource = \"coco\"\npath = \"{}\"\nval_split = \"train2017\"\nimgsz = 416\nworkers = 0\n[augment]\nhsv_device = true\n[train]\nbatch = 3\nnbs = 6\nepochs = 2\nclose_mosaic = 1\nseed = 2\nprecision = \"bf16\"\n{train_keys}",
            root.display()
        );
        Config::parse(&text, Path::new("coco_b3.toml")).unwrap()
    };
    let run = |capture: bool| {
        let mut t = Trainer::new(config(capture), Path::new("coco_b3.toml"), cuda()).unwrap();
        assert_eq!(t.stage.is_replay(), capture, "{:?}", t.replay_off);
        super::replay::run_to_end(&mut t);
        t
    };
    let native = run(false);
    let replay = run(true);
    let first = native
        .step_losses
        .iter()
        .zip(&replay.step_losses)
        .position(|(a, b)| a != b);
    assert_eq!(first, None, "per-step losses differ");
    assert_eq!(
        native.state_hashes(),
        replay.state_hashes(),
        "state hashes differ"
    );
    println!(
        "coco b3 {replay_keys:?}: {} steps equal, {:?}",
        native.step_losses.len(),
        native.state_hashes()
    );
    replay
}

/// A checkpoint written on the GPU (its whole state read back in one transaction) resumes
/// exactly: a fresh trainer loaded from the end of epoch 1 finishes with the state of the run
/// that went on, and saving the loaded state gives the same file.
#[test]
#[ignore = "needs a CUDA GPU"]
fn checkpoint_on_the_gpu_resumes_exactly() {
    let cfg = augmented(3, 160, 5);
    let dir = std::env::temp_dir().join(format!("burnpose-gpu-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (path, again) = (dir.join("last.safetensors"), dir.join("again.safetensors"));
    let mut whole = Trainer::new(cfg.clone(), Path::new("repeat.toml"), cuda()).unwrap();
    whole.run_epoch(&mut |_, _, _| {}).unwrap();
    checkpoint::save(&whole, &path).unwrap();
    whole.run_epoch(&mut |_, _, _| {}).unwrap();
    let mut resumed = Trainer::new(cfg, Path::new("repeat.toml"), cuda()).unwrap();
    checkpoint::load_into(&mut resumed, &path).unwrap();
    checkpoint::save(&resumed, &again).unwrap();
    assert!(
        std::fs::read(&path).unwrap() == std::fs::read(&again).unwrap(),
        "saving the loaded state gave another file"
    );
    resumed.run_epoch(&mut |_, _, _| {}).unwrap();
    // The per-step losses of epoch 1 are not in a checkpoint; everything else must be equal.
    let state = |h: StateHashes| (h.model, h.ema, h.optimizer, h.scheduler, h.scaler);
    assert_eq!(state(resumed.state_hashes()), state(whole.state_hashes()));
    std::fs::remove_dir_all(&dir).unwrap();
}
