//! Data parallelism on the CPU: ranks as threads of one process (`train::dist::ThreadGroup`).

use burn::prelude::*;
use burnpose::config::Config;
use burnpose::data::Batch;
use burnpose::train::dist::{Collective, ThreadGroup};
use burnpose::train::{StateHashes, Trainer};
use std::path::Path;
use std::sync::Arc;

fn config() -> Config {
    let text = "[data]\nimgsz = 64\ntrain_images = 8\nval_images = 2\nworkers = 0\n[train]\nbatch = 4\nnbs = 4\nepochs = 1\nseed = 9\n[optim]\noptimizer = \"sgd\"\nwarmup_epochs = 0.0\n";
    Config::parse(text, Path::new("dist.toml")).unwrap()
}

fn trainer() -> Trainer {
    Trainer::new(config(), Path::new("dist.toml"), Device::flex()).unwrap()
}

/// Runs one epoch per rank, each on its own thread; `group` false gives unconnected ranks.
fn run_ranks(world: usize, group: bool) -> Vec<(StateHashes, Vec<[f32; 6]>)> {
    let handles: Vec<_> = ThreadGroup::new(world)
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let rank = c.rank();
                let mut t = trainer();
                if group {
                    t = t.join(Arc::new(c)).unwrap();
                } else {
                    t.loader.rank = rank;
                    t.loader.world = world;
                }
                t.run_epoch(&mut |_, _, _| {}).unwrap();
                (t.state_hashes(), t.step_losses.clone())
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn ranks_split_the_global_batch() {
    let single = trainer();
    let order = single.epoch_order(0);
    let whole = single.batch(&order, 1).unwrap();
    let mut parts = Vec::new();
    for c in ThreadGroup::new(2) {
        let t = trainer().join(Arc::new(c)).unwrap();
        parts.extend(t.batch(&order, 1).unwrap().samples);
    }
    assert_eq!(Batch::collate(parts).hash(), whole.hash());
}

#[test]
fn ranks_stay_identical_and_see_different_data() {
    let ranks = run_ranks(2, true);
    let (a, b) = (&ranks[0], &ranks[1]);
    assert_eq!(a.0.model, b.0.model, "models diverged");
    assert_eq!(a.0.ema, b.0.ema, "EMAs diverged");
    assert_eq!(a.0.optimizer, b.0.optimizer, "optimizer states diverged");
    assert_ne!(a.1, b.1, "both ranks computed the same losses: same data?");
}

/// The check above can fail: ranks on different data without the exchange drift apart.
#[test]
fn unconnected_ranks_diverge() {
    let ranks = run_ranks(2, false);
    assert_ne!(ranks[0].0.model, ranks[1].0.model);
}

#[test]
fn batch_must_split_over_ranks() {
    let c = ThreadGroup::new(3).into_iter().next().unwrap();
    let err = trainer().join(Arc::new(c)).err().unwrap().to_string();
    assert!(
        err.contains("train.batch = 4") && err.contains("3 ranks"),
        "{err}"
    );
}
