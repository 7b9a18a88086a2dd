//! `replay.shared_parameters`: the recorded graphs read the stage's parameters where the flat
//! optimizer keeps them (`Optimizer::pin`) instead of private copies. Parity against native as
//! for every replay path, and the recorder's own buffers smaller by exactly those parameters.

use super::replay::{config_for, fit, trainer};
use burnpose::config::Config;
use burnpose::optim::groups::param_table;
use burnpose::replay::recorder::Control;

fn shared(task: &str, precision: &str) -> Config {
    let mut cfg = config_for(task, precision, true);
    cfg.replay.shared_parameters = true;
    cfg
}

fn assert_shared_parity(task: &str, precision: &str) {
    let (native, native_losses, _) = fit(&config_for(task, precision, false), Control::None);
    let (replay, replay_losses, _) = fit(&shared(task, precision), Control::None);
    assert_eq!(
        native_losses, replay_losses,
        "{task} {precision}: per-step losses"
    );
    assert_eq!(native, replay, "{task} {precision}: state hashes");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn shared_parameters_match_native_fp32() {
    assert_shared_parity("pose", "fp32");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn shared_parameters_match_native_fp16() {
    assert_shared_parity("pose", "fp16");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn shared_parameters_match_native_at_the_step_scope_bf16() {
    assert_shared_parity("pose-step", "bf16");
}

/// After one recorded step, the recorder's parameter and statistic buffers are the stage's FP32
/// parameters' bytes fewer with the parameters shared than with private copies: the graphs read
/// the optimizer's values. (Views of one buffer: the bytes are the parameters' own, no padding.)
#[test]
#[ignore = "needs a CUDA GPU"]
fn the_graphs_read_the_pinned_parameters() {
    for task in ["pose", "pose-step"] {
        let sources = |cfg: &Config| {
            let mut t = trainer(cfg, Control::None);
            let order = t.epoch_order(0);
            let batch = t.batch(&order, 0).unwrap();
            t.train_step(&batch);
            let bytes = t.stage.buffer_bytes();
            let (_, b) = bytes
                .iter()
                .find(|(what, _)| *what == "parameters and statistics")
                .copied()
                .expect("a recorded stage");
            let scope = cfg.replay_scope();
            let params: u64 = param_table(&t.model)
                .iter()
                .filter(|p| scope.covers(&p.path))
                .map(|p| 4 * p.numel() as u64)
                .sum();
            (b, params)
        };
        let (copies, params) = sources(&config_for(task, "fp32", true));
        let (shared, _) = sources(&shared(task, "fp32"));
        assert!(params > 1_000_000, "{task}: {params} parameter bytes");
        assert_eq!(copies - shared, params, "{task}: {copies} against {shared}");
        assert!(shared > 0, "{task}: the running statistics stay private");
    }
}
