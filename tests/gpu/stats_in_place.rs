//! `model::ops::stats_into`: a recording lays the running statistics out in one buffer, and
//! its forward updates them there in place instead of gathering new ones and copying each into
//! the buffer the next replay reads: the same bits as native in both scopes, no copy left, and
//! a negative control. On by default; each test sets the choice it needs and puts the default
//! back.

use super::Choice;
use super::replay::{assert_parity_of, config_for, fit, trainer};
use burnpose::model::ops::stats_into;
use burnpose::replay::recorder::Control;

#[test]
#[ignore = "needs a CUDA GPU"]
fn statistics_updated_in_place_match_native_in_the_features_scope_bf16() {
    let _on = Choice::set(stats_into::choose, true, true);
    assert_parity_of("pose", "bf16");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn statistics_updated_in_place_match_native_in_one_graph_bf16() {
    let _on = Choice::set(stats_into::choose, true, true);
    assert_parity_of("pose-one-graph", "bf16");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn statistics_updated_in_place_match_native_in_one_graph_fp32() {
    let _on = Choice::set(stats_into::choose, true, true);
    assert_parity_of("pose-one-graph", "fp32");
}

/// Every fused BatchNorm of the recorded step writes its new statistics over the old ones: no
/// copy is left, where without it every statistic is copied.
#[test]
#[ignore = "needs a CUDA GPU"]
fn statistics_updated_in_place_need_no_copy() {
    let copies = |on: bool| {
        let _chosen = Choice::set(stats_into::choose, on, true);
        let mut t = trainer(&config_for("pose-one-graph", "bf16", true), Control::None);
        t.run_epoch(&mut |_, _, _| {}).unwrap();
        t.stage.statistics_copies().expect("a recorded step")
    };
    let (before, of_before) = copies(false);
    let (after, of_after) = copies(true);
    println!("statistics copied: {before} of {of_before} without, {after} of {of_after} in place");
    assert!(
        before > 100 && before == of_before,
        "without: {before} of {of_before}"
    );
    assert!(
        of_after > 0 && after == 0,
        "in place: {after} of {of_after} copied"
    );
}

/// Negative control: the window's forward writes its statistics elsewhere and gathers none,
/// so the replays keep the recording's statistics: parity must break.
#[test]
#[ignore = "needs a CUDA GPU"]
fn statistics_left_out_of_place_break_parity() {
    let _on = Choice::set(stats_into::choose, true, true);
    for task in ["pose", "pose-one-graph"] {
        let (native, _, _) = fit(&config_for(task, "bf16", false), Control::None);
        let (broken, _, _) = fit(&config_for(task, "bf16", true), Control::StatsOutOfPlace);
        assert_ne!(
            native.model, broken.model,
            "{task}: the control did not break parity"
        );
    }
}
