//! A batch without objects: what it may and may not move.

use super::host_now;
use burn::prelude::*;
use burnpose::data::Batch;
use burnpose::train::Trainer;

/// Batch `b` of the epoch whose order is `order`, its objects removed.
pub fn without_objects(t: &Trainer, order: &[usize], b: usize) -> Batch {
    let mut samples = t.batch(order, b).unwrap().samples;
    for s in &mut samples {
        s.instances.clear();
    }
    Batch::collate(samples)
}

/// One ordinary step on `t`, then a batch without objects: the weight `still` picks must not
/// move (its branch gets no gradient without positives), the class branch must (`what` names
/// the case in a failure).
pub fn moves_only_classes(mut t: Trainer, still: fn(&Trainer) -> TensorData, what: &str) {
    let order = t.epoch_order(0);
    t.train_step(&t.batch(&order, 0).unwrap());
    let empty = without_objects(&t, &order, 1);
    let cls = |t: &Trainer| host_now(t.model.head.one2many.classes[0].out.weight.val());
    let (still_before, cls_before) = (still(&t), cls(&t));
    t.train_step(&empty);
    assert_eq!(
        still(&t),
        still_before,
        "{what}: a branch moved without positives"
    );
    assert_ne!(
        cls(&t),
        cls_before,
        "{what}: the class branch should still train"
    );
}

/// The first box branch's first weight (one-to-many copy): what detection without positives
/// must leave.
pub fn box_branch_weight(t: &Trainer) -> TensorData {
    host_now(t.model.head.one2many.boxes[0].cv1.conv.weight.val())
}

/// The first point stem's first weight (one-to-many copy): what pose without positives must
/// leave.
pub fn point_stem_weight(t: &Trainer) -> TensorData {
    let pose = t.model.head.one2many.pose.as_ref().unwrap();
    host_now(pose.point_stems[0].cv1.conv.weight.val())
}
