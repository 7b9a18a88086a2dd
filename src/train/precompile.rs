//! A fit's convolution kernels compiled ahead of its first step, shared out over processes.
//!
//! CubeCL compiles a kernel on first use, one at a time on its device thread, and NVRTC takes
//! 0.4–0.6 s for each implicit-GEMM convolution or gradient of it (docs/perf_log.md): on an
//! empty kernel cache those made most of a pose fit's first step. [`convolutions`] finds the
//! distinct convolutions of a training step and of validation on the CPU, at a small size;
//! [`share`] splits them between worker processes, each of which [`compile`]s its share at the
//! fit's shapes into the persistent kernel cache, where the fit then finds them.

use crate::config::Config;
use crate::eval::postprocess::head_outputs;
use crate::model::ops::trace::{ConvCall, convolutions_counted, convolutions_of};
use crate::model::precision::autocast;
use burn::prelude::*;

/// The image size the convolutions are traced at: every feature map of a YOLO input of
/// `32·k` pixels is `k` times that of a 32-pixel input (`data.imgsz` is a multiple of 32).
const TRACE_PX: usize = 32;

/// The distinct convolutions a fit of `cfg` runs: its training step's forward (with the
/// gradients its backward asks for) at `train.batch` and `data.imgsz`, then validation's at
/// twice that batch, on a square canvas of `data.imgsz + 32`. Sets the process's operations to `device.conv_bn_ops`, as a
/// trainer of `cfg` does: only ours are traced (Burn's own, `"stock"`, are not).
pub fn convolutions(cfg: &Config) -> Vec<ConvCall> {
    let (model, train) = traced_step(cfg);
    let mut calls: Vec<ConvCall> = train.into_iter().map(|(c, _)| c).collect();
    // Validation runs the EMA without gradients, in FP32 (`eval::postprocess::detect`), on
    // rectangular batches (`Source::rect_batches`): a batch of square images, or of mixed
    // orientations, is `imgsz + 32` on each side; other shapes compile on first use.
    let eval = model.valid();
    let (_, val) =
        convolutions_of(|| head_outputs(&eval, images(&Device::flex()), cfg.train.val_nms));
    let (batch, scale) = (cfg.train.batch.max(1), cfg.data.imgsz / TRACE_PX);
    for c in val.iter().map(|c| c.resized(2 * batch, scale + 1)) {
        if !calls.contains(&c) {
            calls.push(c);
        }
    }
    calls
}

/// The distinct convolutions of a training step of `cfg` at `train.batch` and `data.imgsz`,
/// each with the number of times the step's forward runs it (as [`convolutions`] sets the
/// operations).
pub fn step_convolutions(cfg: &Config) -> Vec<(ConvCall, usize)> {
    traced_step(cfg).1
}

fn images(device: &Device) -> Tensor<4> {
    Tensor::<4>::zeros([1, 3, TRACE_PX, TRACE_PX], device)
}

/// The model of `cfg` on the CPU and its training forward's convolutions at the fit's shapes.
fn traced_step(cfg: &Config) -> (crate::model::Yolo, Vec<(ConvCall, usize)>) {
    crate::model::ops::set_conv_bn_ops(cfg.device.conv_bn_ops);
    let scale = cfg.data.imgsz / TRACE_PX;
    let device = Device::flex().autodiff();
    let model = cfg
        .model
        .yolo()
        .init(&device)
        .freeze_layers(&cfg.train.freeze.layers());
    let (_, train) = convolutions_counted(|| {
        let _reduced = autocast(cfg.train.precision.compute_dtype());
        model.forward(images(&device))
    });
    let batch = cfg.train.batch.max(1);
    let train = train
        .into_iter()
        .map(|(c, n)| (c.resized(batch, scale), n))
        .collect();
    (model, train)
}

/// A name for compiling `calls` with this build of burnpose (its version and the calls' hash):
/// compiled once, remembered (`config::compile_progress::remember`), skipped after. A new
/// version, or another freezing, precision, batch or size, gives another name.
pub fn work_name(calls: &[ConvCall]) -> String {
    // Each call as its `Debug` text: stable within a version, which the name carries.
    let mut h = crate::optim::hash::StateHasher::new();
    for call in calls {
        h.label(&format!("{call:?}"));
    }
    format!("precompile-{}-{}", env!("CARGO_PKG_VERSION"), h.finish())
}

/// Part `part` of `parts` of `calls`: every `parts`-th call from the `part`-th, so that each
/// part gets the same mix of early and late layers.
pub fn share(calls: &[ConvCall], part: usize, parts: usize) -> Vec<ConvCall> {
    calls
        .iter()
        .skip(part)
        .step_by(parts.max(1))
        .cloned()
        .collect()
}

/// Runs `calls` on `device` and waits for the device: their kernels are then in the kernel
/// cache.
pub fn compile(calls: &[ConvCall], device: &Device) -> Result<(), String> {
    for call in calls {
        call.run(device);
    }
    device
        .sync()
        .map_err(|e| format!("device sync failed: {e:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn config(extra: &str) -> Config {
        let text = format!("[data]\nimgsz = 416\n[train]\nbatch = 3\n{extra}");
        Config::parse(&text, Path::new("cfg.toml")).unwrap()
    }

    /// The trace at 32 px, resized, gives the shapes a step at the fit's size runs: the first
    /// convolution sees the images, and every training call is at the batch, every validation
    /// call at twice it on the square rectangular-batch canvas (416 + 32 px).
    #[test]
    fn convolutions_have_the_fits_shapes() {
        let calls = convolutions(&config(""));
        assert_eq!(calls[0].input, [3, 3, 416, 416]);
        assert!(!calls[0].input_grad && calls[0].weight_grad);
        let (train, val): (Vec<_>, Vec<_>) = calls.iter().partition(|c| c.weight_grad);
        assert!(train.len() > 20 && !val.is_empty(), "{calls:#?}");
        assert!(train.iter().all(|c| c.input[0] == 3));
        assert!(val.iter().all(|c| c.input[0] == 6 && !c.input_grad));
        // The deepest maps of a 416-px input are 13 px, of a 448-px one 14 px.
        assert!(train.iter().any(|c| c.input[2..] == [13, 13]));
        assert!(train.iter().all(|c| c.input[2] % 13 == 0));
        assert!(val.iter().any(|c| c.input[2..] == [14, 14]));
        assert!(val.iter().all(|c| c.input[2] % 14 == 0));
        // Distinct, and shared out whole.
        let unique: std::collections::HashSet<_> = calls.iter().collect();
        assert_eq!(unique.len(), calls.len());
        let mut shared: Vec<ConvCall> = (0..3).flat_map(|p| share(&calls, p, 3)).collect();
        assert_eq!(shared.len(), calls.len());
        shared.retain(|c| !calls.contains(c));
        assert!(shared.is_empty());
    }

    /// The step's convolutions are the training calls of [`convolutions`], counted: repeated
    /// blocks run one shape several times, and every convolution of the forward is counted once.
    #[test]
    fn step_convolutions_count_each_call() {
        let cfg = config("");
        let counted = step_convolutions(&cfg);
        let train: Vec<ConvCall> = convolutions(&cfg)
            .into_iter()
            .filter(|c| c.weight_grad)
            .collect();
        let distinct: Vec<ConvCall> = counted.iter().map(|(c, _)| c.clone()).collect();
        assert_eq!(distinct, train);
        assert!(counted.iter().any(|(_, n)| *n > 1), "{counted:#?}");
        // Every Conv2d of the model runs once per forward (the one-to-many and one-to-one head
        // branches are separate modules).
        let device = Device::flex();
        let model = cfg.model.yolo().init(&device);
        let convs = crate::model::float_shapes(&model)
            .iter()
            .filter(|(path, dims)| dims.len() == 4 && path.ends_with(".weight"))
            .count();
        assert_eq!(counted.iter().map(|(_, n)| n).sum::<usize>(), convs);
    }

    /// The work's name follows what would be compiled: equal for equal configs, another one for
    /// another batch or freezing.
    #[test]
    fn work_names_follow_the_calls() {
        let name = |extra: &str| work_name(&convolutions(&config(extra)));
        assert_eq!(name(""), name(""));
        assert_ne!(name(""), name("freeze = 10\n"));
        assert_ne!(config("").train.batch, 4);
        let b4 = Config::parse(
            "[data]\nimgsz = 416\n[train]\nbatch = 4\n",
            Path::new("c.toml"),
        );
        assert_ne!(name(""), work_name(&convolutions(&b4.unwrap())));
    }

    /// Frozen layers ask for no weight gradient, and BF16 training computes its Conv-BN units
    /// (all the 3×3 ones) in BF16 (the head's biased 1×1 predictors stay FP32).
    #[test]
    fn convolutions_follow_freezing_and_precision() {
        let plain = convolutions(&config(""));
        let frozen = convolutions(&config("freeze = 10\nprecision = \"bf16\"\n"));
        assert!(plain.iter().all(|c| c.reduced.is_none()));
        assert_eq!(frozen[0].input, plain[0].input);
        assert!(!frozen[0].weight_grad, "the first layer is frozen");
        assert!(
            frozen
                .iter()
                .filter(|c| c.weight_grad && c.weight[2] == 3)
                .all(|c| c.reduced.is_some())
        );
    }
}
