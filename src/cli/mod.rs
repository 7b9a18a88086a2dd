//! Command-line interface: argument types and the commands behind them.

mod bench;
mod conv_bench;
mod fit;
mod info;
mod launch_bench;
mod peer;
mod precompile;
mod predict;
#[cfg(feature = "profile")]
mod profile;
mod smoke;
mod step_bench;
mod step_options;
mod step_report;
mod val;
mod warmup;

use crate::config::DeviceKind;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "burnpose",
    version,
    about = "YOLO26 pose/detect trainer on Burn"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// What `export` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// A safetensors state dict under Ultralytics' names and shapes.
    Ultralytics,
    /// Burn-native weights: shaped tensors under our module paths (burn-store's safetensors),
    /// the model's scale, task, classes and keypoints in the metadata.
    Burn,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Train a model from a TOML config.
    Fit {
        config: PathBuf,
        /// Run folder name under the output dir (default: output.name).
        #[arg(long)]
        name: Option<String>,
        /// Continue from a checkpoint.
        #[arg(long)]
        resume: Option<PathBuf>,
        /// Start from Ultralytics YOLO26 weights (overrides `model.weights`; docs/weights.md).
        #[arg(long, conflicts_with = "resume")]
        weights: Option<PathBuf>,
        /// Override the config's device.
        #[arg(long, value_enum)]
        device: Option<DeviceKind>,
        /// Override `replay.enabled` (feature replay).
        #[arg(long)]
        replay: Option<bool>,
        /// Override `replay.scope` (what replay records and where the tape is cut).
        #[arg(long, value_enum)]
        scope: Option<crate::config::Scope>,
        /// Write a benchmark report (JSON) to this file; every step is then timed between
        /// device syncs.
        #[arg(long)]
        report: Option<PathBuf>,
        /// Time every step between device syncs and print, per epoch, the median step and the
        /// median of each phase (the syncs make the steps slower: a breakdown, not a speed).
        #[arg(long)]
        phases: bool,
        /// Also time every step with the device's clock (CUDA events; not yet verified on a
        /// GPU, so off by default) into the report's `event_ms` and `steps.csv`.
        #[arg(long)]
        events: bool,
        /// Time every step by the host's clock alone, with no device sync around it (the pace
        /// of a fit without timing: the report's steps are then averaged, not a median; no
        /// reads of memory inside a step).
        #[arg(long, conflicts_with_all = ["phases", "events"])]
        unsynced: bool,
        /// Write into the run folder even if it holds an earlier run (default: a fresh
        /// `<name>2`, `<name>3`, … so nothing is overwritten).
        #[arg(long)]
        exist_ok: bool,
    },
    /// Print the model summary: layers, parameters, GFLOPs.
    Info {
        /// Take model and image size from this config (flags below override it).
        config: Option<PathBuf>,
        #[arg(long)]
        scale: Option<String>,
        #[arg(long)]
        task: Option<String>,
        #[arg(long)]
        nc: Option<usize>,
        #[arg(long)]
        imgsz: Option<usize>,
    },
    /// Box and pose mAP of a checkpoint's EMA on the config's val split.
    Val {
        config: PathBuf,
        /// Checkpoint to evaluate, or Ultralytics weights (`.pt`; default: the freshly
        /// initialised model).
        #[arg(long)]
        checkpoint: Option<PathBuf>,
        #[arg(long, value_enum)]
        device: Option<DeviceKind>,
        /// Write the detections as a COCO results file (predictions.json) and the ground truth
        /// they were scored against (ground_truth.json) into this folder.
        #[arg(long)]
        save_json: Option<PathBuf>,
        /// Split to validate on instead of the config's `data.val_split`: for a YOLO dataset
        /// `test` (the yaml's `test:`) or `val`; for COCO an annotation split such as `val2017`.
        #[arg(long)]
        split: Option<String>,
    },
    /// Compile every kernel a fit of the config needs into the per-user kernel cache, ahead of
    /// the fit (one training step, one optimizer step, one validation; nothing is saved).
    Warmup {
        config: PathBuf,
        #[arg(long, value_enum)]
        device: Option<DeviceKind>,
    },
    /// One worker process of `device.compile_workers` (started by `fit` and `warmup`): compiles
    /// its share of a fit's convolution kernels into the kernel cache.
    #[command(hide = true)]
    PrecompilePart {
        /// The fit's config as the fit reads it (written by the parent).
        config: PathBuf,
        #[arg(long)]
        part: usize,
        #[arg(long)]
        of: usize,
    },
    /// Print every config key with its default and what it means (commented TOML); with a
    /// CONFIG, that config with every key filled in as a run reads it.
    Config { config: Option<PathBuf> },
    /// Write the config's built-in train/val images as a YOLO-pose dataset (PNG + labels +
    /// data.yaml), e.g. for training Ultralytics on the same images (benches/peer/).
    ExportYolo { config: PathBuf, dir: PathBuf },
    /// Write a checkpoint's EMA model for another tool: `--format ultralytics` is a safetensors
    /// state dict under Ultralytics' names and shapes, which their `load_state_dict(strict=True)`
    /// takes (docs/weights.md has the lines that make a `.pt` of it); `--format burn` shaped
    /// tensors under our module paths for a Burn program (`weights::load_burn`).
    Export {
        /// A checkpoint written by `fit`.
        checkpoint: PathBuf,
        #[arg(long, value_enum)]
        format: ExportFormat,
        /// File to write (default: the checkpoint's name with `.ultralytics.safetensors` or
        /// `.burn.safetensors`).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Run a checkpoint's EMA model on images: annotated copies (boxes, keypoints, skeleton) and
    /// predictions.json (boxes, scores, classes, keypoints in each image's pixels).
    Predict {
        /// A checkpoint written by `fit` (last.safetensors or best.safetensors), or Ultralytics
        /// YOLO26 weights (`.pt`, or a state dict in `.safetensors`).
        checkpoint: PathBuf,
        /// Image files, folders of images, and `.txt` lists of those.
        #[arg(required_unless_present = "split")]
        sources: Vec<PathBuf>,
        /// Also predict on this split of the dataset the checkpoint was trained on (a YOLO
        /// yaml's `train`, `val` or `test`; a COCO split name such as `val2017`).
        #[arg(long)]
        split: Option<String>,
        /// With --split: take the dataset from this config's `[data]` (a relative `data.path`
        /// beside it) instead of the checkpoint's (a relative `data.path` from the working
        /// directory).
        #[arg(long, requires = "split")]
        config: Option<PathBuf>,
        /// Folder to write into (default: a new runs/predict/predict<N>).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Keep detections scoring above this.
        #[arg(long, default_value_t = 0.25)]
        conf: f32,
        /// NMS IoU threshold (only with --nms: the default one-to-one head needs no NMS).
        #[arg(long, default_value_t = 0.7)]
        iou: f32,
        /// At most this many detections per image.
        #[arg(long, default_value_t = 300)]
        max_det: usize,
        /// Network input size (default: the checkpoint's training size).
        #[arg(long)]
        imgsz: Option<usize>,
        /// Use the one-to-many head with NMS instead of the one-to-one (NMS-free) head.
        #[arg(long)]
        nms: bool,
        #[arg(long, value_enum)]
        device: Option<DeviceKind>,
        /// Images per forward pass.
        #[arg(long, default_value_t = 8)]
        batch: usize,
        /// Also write one YOLO label file per image with detections, `labels/<name>.txt`
        /// (Ultralytics' `save_txt`): `fit` reads them back as a dataset.
        #[arg(long)]
        save_txt: bool,
        /// With --save-txt, end each row with the detection's score (Ultralytics' `save_conf`).
        #[arg(long, requires = "save_txt")]
        save_conf: bool,
    },
    /// Complete-fit benchmark: fresh `fit` processes, native and replay alternately, for N
    /// pairs; prints and writes (CSV + markdown) the comparison table.
    Bench {
        /// Default: the seed benchmark's shape (384 train / 32 val images, 5 epochs, batch 4,
        /// 640 px, BF16).
        #[arg(default_value = "configs/bench_seed.toml")]
        config: PathBuf,
        #[command(flatten)]
        plan: bench::Plan,
    },
    /// Post-warm-up training step time of a config (native or replayed stage).
    BenchStep {
        config: PathBuf,
        #[command(flatten)]
        options: step_options::Options,
    },
    /// Every convolution of a config's training step, each pass timed on its own (GPU busy
    /// time on CUDA), with its TFLOP/s and GB/s: the worst first.
    BenchConv {
        config: PathBuf,
        #[command(flatten)]
        options: conv_bench::Options,
    },
    /// Host cost of one tiny kernel launch through Burn, Burn with autodiff, CubeCL and the
    /// CUDA driver (docs/bench.md).
    BenchLaunch {
        #[command(flatten)]
        options: launch_bench::Options,
    },
    /// Time forward+backward passes of the full model on random images (device check).
    Smoke {
        #[arg(long, value_enum, default_value = "auto")]
        device: DeviceKind,
        #[arg(long, default_value_t = 4)]
        batch: usize,
        #[arg(long, default_value_t = 640)]
        imgsz: usize,
        #[arg(long, default_value_t = 3)]
        steps: usize,
    },
}

/// `--conv-padding` of `bench-step` and `bench-conv`: the GEMM operands' channel padding
/// (`model::ops::conv::gemm::choose_padding`), refused without CUDA.
fn choose_conv_padding(multiple: Option<usize>) -> anyhow::Result<()> {
    let Some(multiple) = multiple else {
        return Ok(());
    };
    #[cfg(feature = "cuda")]
    return crate::model::ops::conv::gemm::choose_padding(multiple).map_err(|e| anyhow::anyhow!(e));
    #[cfg(not(feature = "cuda"))]
    anyhow::bail!("--conv-padding {multiple}: the GEMM's operands are padded on CUDA only");
}

/// The config at `path` with `--device` applied, and the device it resolves to (with its
/// description).
fn config_and_device(
    path: &std::path::Path,
    device_arg: Option<DeviceKind>,
) -> anyhow::Result<(crate::config::Config, burn::prelude::Device, String)> {
    let mut cfg = crate::config::Config::load(path)?;
    let (device, what) = device_for(&mut cfg, path, device_arg)?;
    Ok((cfg, device, what))
}

/// Applies `--device` to `cfg` and resolves its device; errors name `path` and the key.
fn device_for(
    cfg: &mut crate::config::Config,
    path: &std::path::Path,
    device_arg: Option<DeviceKind>,
) -> anyhow::Result<(burn::prelude::Device, String)> {
    use anyhow::Context;
    if let Some(d) = device_arg {
        cfg.device.kind = d;
    }
    // `val` and `warmup` run the model without a trainer; they honour `device.conv_bn_ops` too.
    crate::model::ops::set_conv_bn_ops(cfg.device.conv_bn_ops);
    crate::config::device::resolve(cfg.device.kind, cfg.device.index)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("{}: key `device.kind`", path.display()))
}

pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Fit {
            config,
            name,
            resume,
            weights,
            device,
            replay,
            scope,
            report,
            phases,
            events,
            unsynced,
            exist_ok,
        } => fit::run(
            &config,
            fit::FitOptions {
                name,
                resume,
                weights,
                device,
                replay,
                scope,
                report,
                phases,
                events,
                unsynced,
                exist_ok,
            },
        ),
        Command::Bench { config, plan } => bench::run(&config, plan),
        Command::Info {
            config,
            scale,
            task,
            nc,
            imgsz,
        } => info::run(config.as_deref(), scale, task, nc, imgsz),
        Command::Smoke {
            device,
            batch,
            imgsz,
            steps,
        } => smoke::run(device, batch, imgsz, steps),
        Command::BenchStep { config, options } => step_bench::run(&config, options),
        Command::BenchLaunch { options } => launch_bench::run(options),
        Command::BenchConv { config, options } => conv_bench::run(&config, options),
        Command::Val {
            config,
            checkpoint,
            device,
            save_json,
            split,
        } => val::run(&config, checkpoint, device, save_json, split),
        Command::Warmup { config, device } => warmup::run(&config, device),
        Command::PrecompilePart { config, part, of } => precompile::part(&config, part, of),
        Command::Config { config } => {
            match config {
                None => print!("{}", crate::config::DEFAULTS),
                Some(path) => print!("{}", crate::config::Config::load(&path)?.to_toml()),
            }
            Ok(())
        }
        Command::Export {
            checkpoint,
            format,
            out,
        } => {
            let (cfg, model) =
                crate::train::checkpoint::load_model(&checkpoint, &burn::prelude::Device::flex())?;
            let suffix = match format {
                ExportFormat::Ultralytics => "ultralytics.safetensors",
                ExportFormat::Burn => "burn.safetensors",
            };
            let out = out.unwrap_or_else(|| checkpoint.with_extension(suffix));
            match format {
                ExportFormat::Ultralytics => {
                    let n = crate::weights::export_ultralytics(&model, &out)?;
                    println!(
                        "wrote {} ({n} tensors under Ultralytics' names; docs/weights.md makes a \
                         .pt of it)",
                        out.display()
                    );
                }
                ExportFormat::Burn => {
                    crate::weights::save_burn(&model, &cfg.model.yolo(), &out)?;
                    println!(
                        "wrote {} (Burn-native weights: examples/predict_image.rs loads them)",
                        out.display()
                    );
                }
            }
            Ok(())
        }
        Command::ExportYolo { config, dir } => {
            use anyhow::Context;
            let cfg = crate::config::Config::load(&config)?;
            anyhow::ensure!(
                cfg.data.source == crate::config::DataSource::Builtin,
                "{}: key `data.source`: export-yolo writes the built-in dataset; this config reads files already",
                config.display()
            );
            let (train, val) = crate::data::builtin::BuiltinDataset::splits(&cfg);
            let yaml = crate::data::export::write_yolo(&train, &val, &dir)
                .with_context(|| format!("exporting to {}", dir.display()))?;
            println!(
                "wrote {} train and {} val images; dataset yaml {}",
                train.len,
                val.len,
                yaml.display()
            );
            Ok(())
        }
        Command::Predict {
            checkpoint,
            sources,
            split,
            config,
            out,
            conf,
            iou,
            max_det,
            imgsz,
            nms,
            device,
            batch,
            save_txt,
            save_conf,
        } => predict::run(
            &checkpoint,
            predict::PredictArgs {
                sources,
                split: split.map(|name| predict::Split { name, config }),
                out,
                options: crate::predict::PredictOptions {
                    conf,
                    iou,
                    max_det,
                    imgsz: imgsz.unwrap_or(0),
                    nms,
                },
                device,
                batch,
                labels: save_txt.then_some(predict::Labels { score: save_conf }),
            },
        ),
    }
}
