//! Whether a fit may replay its stage, decided before anything is recorded. Every "no"
//! carries the reason, which the trainer logs once and keeps (`Trainer::replay_off`).

use crate::config::device::is_cuda;
use crate::model::Yolo;
use burn::prelude::*;

/// What eligibility looks at.
#[derive(Clone, Copy)]
pub struct Setup<'a> {
    pub enabled: bool,
    pub device: &'a Device,
    pub multi_device: bool,
    /// What the stage would record (`replay.scope`).
    pub scope: super::Scope,
    pub model: &'a Yolo,
}

/// `Ok` when the stage may be recorded; otherwise why not. The device is checked last so
/// that every other rule can be tested on the CPU.
pub fn check(s: &Setup) -> Result<(), String> {
    if !s.enabled {
        return Err("replay.enabled = false".into());
    }
    if s.multi_device {
        return Err("data-parallel training (multi-device) replays per rank untested".into());
    }
    let frozen: Vec<String> = frozen_params(s.model)
        .into_iter()
        .filter(|p| s.scope.covers(p))
        .collect();
    if !frozen.is_empty() {
        // By layer (`backbone.l0`; in the head, by unit), not by tensor: a frozen layer has
        // several.
        let mut layers: Vec<String> = Vec::new();
        for p in &frozen {
            let parts: Vec<&str> = p.split('.').collect();
            let keep = match parts[0] {
                "backbone" | "neck" => 2,
                _ => parts.len().saturating_sub(2).max(1),
            };
            let layer = parts[..keep].join(".");
            if !layers.contains(&layer) {
                layers.push(layer);
            }
        }
        return Err(format!(
            "frozen feature layers (train.freeze): {} ({} parameters)",
            layers.join(", "),
            frozen.len()
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
    use crate::model::{Scale, Task, YoloConfig};
    use crate::replay::Scope;

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
        let ok = Setup {
            enabled: true,
            device: &device,
            multi_device: false,
            scope: Scope::Features,
            model: &model,
        };
        let why = |s: Setup| check(&s).unwrap_err();
        assert!(
            why(Setup {
                enabled: false,
                ..ok
            })
            .contains("replay.enabled = false")
        );
        assert!(
            why(Setup {
                multi_device: true,
                ..ok
            })
            .contains("multi-device")
        );
        // Detection records the whole network: the same rules.
        let detect = YoloConfig::new(Scale::N, Task::Detect).init(&device);
        let d = Setup {
            scope: Scope::Network,
            model: &detect,
            ..ok
        };
        assert!(why(d).contains("CUDA"), "{}", why(d));
        let mut frozen_head = YoloConfig::new(Scale::N, Task::Detect).init(&device);
        frozen_head.head.one2many = frozen_head.head.one2many.clone().no_grad();
        let e = why(Setup {
            model: &frozen_head,
            ..d
        });
        assert!(e.contains("frozen") && e.contains("head.one2many."), "{e}");
        let mut frozen = pose(1, 17);
        frozen.backbone.l2 = frozen.backbone.l2.clone().no_grad();
        let e = why(Setup {
            model: &frozen,
            ..ok
        });
        assert!(
            e.contains("frozen feature layers (train.freeze): backbone.l2 (")
                && !e.contains("weight"),
            "{e}"
        );
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
