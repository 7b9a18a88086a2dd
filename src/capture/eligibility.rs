//! Whether a fit may replay its feature stage, decided before anything is recorded. Every "no"
//! carries the reason, which the trainer logs once and keeps (`Trainer::replay_off`).

use crate::config::device::is_cuda;
use crate::model::{Task, Yolo};
use crate::optim::groups::param_table;
use burn::prelude::*;

/// What eligibility looks at.
#[derive(Clone, Copy)]
pub struct Setup<'a> {
    pub enabled: bool,
    pub device: &'a Device,
    pub multi_device: bool,
    pub task: Task,
    /// What the stage would record (`capture.scope`).
    pub scope: super::Scope,
    pub model: &'a Yolo,
    /// A freshly built model of the configured type: the head certificate.
    pub reference: &'a Yolo,
}

/// `Ok` when the feature stage may be recorded; otherwise why not. The device is checked last so
/// that every other rule can be tested on the CPU.
pub fn check(s: &Setup) -> Result<(), String> {
    if !s.enabled {
        return Err("model.capture_network = false".into());
    }
    if s.multi_device {
        return Err("data-parallel training (multi-device) replays per rank untested".into());
    }
    let frozen: Vec<String> = frozen_params(s.model)
        .into_iter()
        .filter(|p| s.scope.covers(p))
        .collect();
    if !frozen.is_empty() {
        return Err(format!("frozen feature layers: {}", frozen.join(", ")));
    }
    let (got, want) = (head_certificate(s.model), head_certificate(s.reference));
    if got != want {
        let diff = got
            .iter()
            .zip(&want)
            .find(|(a, b)| a != b)
            .map(|(a, b)| format!("{a} instead of {b}"))
            .unwrap_or_else(|| format!("{} head tensors instead of {}", got.len(), want.len()));
        let task = match s.task {
            Task::Pose => "pose",
            Task::Detect => "detection",
        };
        return Err(format!(
            "the head is not the registered {task} head: {diff}"
        ));
    }
    if !cfg!(feature = "cuda") {
        return Err("this build has no CUDA backend".into());
    }
    if !is_cuda(s.device) {
        return Err(format!("device {:?} is not CUDA", s.device));
    }
    Ok(())
}

/// The head's topology: every tensor's path and shape, in order.
pub fn head_certificate(model: &Yolo) -> Vec<String> {
    param_table(model)
        .into_iter()
        .filter(|p| p.path.starts_with("head."))
        .map(|p| format!("{} {:?}", p.path, p.dims))
        .collect()
}

/// Parameters (not BN running statistics) that do not require gradients.
pub fn frozen_params(model: &Yolo) -> Vec<String> {
    crate::optim::tensors::visit_floats(model)
        .into_iter()
        .filter(|(path, _, tracked)| {
            !tracked && !path.ends_with("running_mean") && !path.ends_with("running_var")
        })
        .map(|(path, _, _)| path)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::Scope;
    use crate::model::{Scale, YoloConfig};

    fn pose(nc: usize, kpts: usize) -> Yolo {
        YoloConfig::new(Scale::N, Task::Pose)
            .with_nc(nc)
            .with_kpt_shape([kpts, 3])
            .init(&Device::flex().autodiff())
    }

    #[test]
    fn every_fallback_names_its_reason() {
        let device = Device::flex().autodiff();
        let model = pose(1, 17);
        let reference = pose(1, 17);
        let ok = Setup {
            enabled: true,
            device: &device,
            multi_device: false,
            task: Task::Pose,
            scope: Scope::Features,
            model: &model,
            reference: &reference,
        };
        let why = |s: Setup| check(&s).unwrap_err();
        assert!(
            why(Setup {
                enabled: false,
                ..ok
            })
            .contains("capture_network = false")
        );
        assert!(
            why(Setup {
                multi_device: true,
                ..ok
            })
            .contains("multi-device")
        );
        // Detection records the whole network: the same rules, its own head certificate.
        let detect = YoloConfig::new(Scale::N, Task::Detect).init(&device);
        let detect_ref = YoloConfig::new(Scale::N, Task::Detect).init(&device);
        let d = Setup {
            task: Task::Detect,
            scope: Scope::Network,
            model: &detect,
            reference: &detect_ref,
            ..ok
        };
        assert!(why(d).contains("CUDA"), "{}", why(d));
        let e = why(Setup {
            reference: &reference,
            ..d
        });
        assert!(e.contains("registered detection head"), "{e}");
        let mut frozen_head = YoloConfig::new(Scale::N, Task::Detect).init(&device);
        frozen_head.head.one2many = frozen_head.head.one2many.clone().no_grad();
        let e = why(Setup {
            model: &frozen_head,
            ..d
        });
        assert!(e.contains("frozen") && e.contains("head.one2many."), "{e}");
        let other = pose(1, 5);
        let e = why(Setup {
            model: &other,
            ..ok
        });
        assert!(
            e.contains("registered pose head") && e.contains("instead of"),
            "{e}"
        );
        let mut frozen = pose(1, 17);
        frozen.backbone.l2 = frozen.backbone.l2.clone().no_grad();
        let e = why(Setup {
            model: &frozen,
            ..ok
        });
        assert!(e.contains("frozen") && e.contains("backbone.l2."), "{e}");
        // A frozen head is refused only where the stage records it.
        let mut frozen_stems = pose(1, 17);
        let pose_head = frozen_stems.head.one2many.pose.as_mut().unwrap();
        pose_head.point_stems[0] = pose_head.point_stems[0].clone().no_grad();
        assert!(
            why(Setup {
                model: &frozen_stems,
                ..ok
            })
            .contains("CUDA")
        );
        let e = why(Setup {
            model: &frozen_stems,
            scope: Scope::Network,
            ..ok
        });
        assert!(
            e.contains("frozen") && e.contains("head.one2many.pose.point_stems.0."),
            "{e}"
        );
        // Everything else is fine; the CPU device is what refuses.
        let e = why(ok);
        assert!(e.contains("CUDA"), "{e}");
    }
}
