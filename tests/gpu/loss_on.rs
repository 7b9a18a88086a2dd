//! `train.loss_on = "device"` on CUDA: the assignment and loss terms as device operations
//! (docs/training.md) give the host path's losses, repeat exactly, and leave unreached branches
//! alone.

use super::common::empty_batch::{moves_only_classes, point_stem_weight};
use super::cuda;
use burnpose::config::Config;
use burnpose::train::Trainer;
use std::path::Path;

fn coco(loss_on: &str) -> Trainer {
    let root = Path::new("../shared/data/pose-real/pose_minicoco");
    assert!(root.exists(), "{} is missing", root.display());
    let text = format!(
        "[data]\nsource = \"coco\"\npath = \"{}\"\nval_split = \"train2017\"\nimgsz = 416\nworkers = 0\n[train]\nbatch = 3\nnbs = 3\nepochs = 1\nseed = 4\nloss_on = \"{loss_on}\"\n",
        root.display()
    );
    let cfg = Config::parse(&text, Path::new("loss_on.toml")).unwrap();
    Trainer::new(cfg, Path::new("loss_on.toml"), cuda()).unwrap()
}

/// The first step's logged losses on real COCO images equal the host path's (the device's own
/// `exp`, `atan` and `powf`, and other sums: within 1e-3), and two fits on the device path end
/// in the same state with the same per-step losses.
#[test]
#[ignore = "needs a CUDA GPU and ../shared/data/pose-real/pose_minicoco"]
fn device_loss_path_matches_the_host_path_and_repeats_on_cuda() {
    let (mut host, mut device) = (coco("host"), coco("device"));
    let order = host.epoch_order(0);
    let batch = host.batch(&order, 0).unwrap();
    let (a, b) = (host.train_step(&batch), device.train_step(&batch));
    super::common::assert_items_close(&b, &a, 1e-3, "device vs host");
    let run = || {
        let mut t = coco("device");
        super::replay::run_to_end(&mut t);
        assert!(t.step_losses.iter().flatten().all(|v| v.is_finite()));
        (t.state_hashes(), t.step_losses.clone())
    };
    assert_eq!(run(), run(), "two fits on the device path differ");
}

/// A batch without objects on the device path leaves the point stems alone on CUDA too.
#[test]
#[ignore = "needs a CUDA GPU and ../shared/data/pose-real/pose_minicoco"]
fn device_loss_path_leaves_point_stems_alone_on_cuda() {
    moves_only_classes(coco("device"), point_stem_weight, "cuda pose");
}
