//! Each optimizer through a whole fit on the CPU: the flat update (`optim.flat_update`, the
//! default) against the per-tensor one. With the global-norm clip out of the way they must give
//! the same bits (the two sum the clip's norm in different orders, so a biting clip differs in
//! the last bits: docs/training.md), and a fit must repeat.

use burn::prelude::*;
use burnpose::config::Config;
use burnpose::train::{StateHashes, Trainer};
use std::path::Path;

fn fit(optimizer: &str, flat: bool, clip: &str) -> StateHashes {
    let text = format!(
        "[data]\nimgsz = 64\ntrain_images = 6\nval_images = 2\n[train]\nbatch = 3\nnbs = 6\nepochs = 2\nseed = 3\n[optim]\noptimizer = \"{optimizer}\"\nflat_update = {flat}\nclip_norm = {clip}\n"
    );
    let cfg = Config::parse(&text, Path::new("optimizers.toml")).unwrap();
    let mut t = Trainer::new(cfg, Path::new("optimizers.toml"), Device::flex()).unwrap();
    while !t.finished() {
        t.run_epoch(&mut |_, _, _| {}).unwrap();
    }
    t.state_hashes()
}

/// Each rule through the flat update (MuSGD: Muon's step from the step table, its Newton–Schulz
/// per matrix on the CPU) equals its per-tensor update over a fit with accumulation and
/// warm-up, and a second fit repeats.
#[test]
fn flat_updates_fit_like_per_tensor() {
    let mut models = Vec::new();
    for rule in ["sgd", "adamw", "musgd"] {
        let flat = fit(rule, true, "1e30");
        assert_eq!(flat, fit(rule, false, "1e30"), "{rule}");
        assert_eq!(
            fit(rule, true, "1e30"),
            flat,
            "{rule}: a second fit differs"
        );
        models.push(flat.model);
    }
    models.dedup();
    assert_eq!(models.len(), 3, "two rules moved alike");
}
