//! `burnpose bench-step`'s options and how they set up the run: the config overrides and the
//! process-wide switches of our operations (each CUDA-only switch refused elsewhere).

use crate::config::{Config, DeviceKind, Precision};

/// A CUDA-only switch: `choose(value)` on CUDA builds; elsewhere the flag's error.
macro_rules! cuda_only {
    ($value:expr, $flag:literal, $why:literal, $choose:path) => {
        if let Some(v) = $value {
            #[cfg(feature = "cuda")]
            $choose(v);
            #[cfg(not(feature = "cuda"))]
            anyhow::bail!("{} {v}: {}", $flag, $why);
        }
    };
}

#[derive(clap::Args, Debug)]
pub struct Options {
    #[arg(long, value_enum)]
    pub device: Option<DeviceKind>,
    /// Override `replay.enabled`.
    #[arg(long)]
    pub replay: Option<bool>,
    /// Override `replay.scope`.
    #[arg(long, value_enum)]
    pub scope: Option<crate::config::Scope>,
    /// Override `train.precision`.
    #[arg(long, value_enum)]
    pub precision: Option<Precision>,
    /// Override `train.loss_on`.
    #[arg(long, value_enum)]
    pub loss_on: Option<crate::config::LossOn>,
    /// Override `replay.shared_parameters`.
    #[arg(long)]
    pub shared_parameters: Option<bool>,
    /// Override `replay.one_graph`.
    #[arg(long)]
    pub one_graph: Option<bool>,
    /// Override `replay.record_update`.
    #[arg(long)]
    pub record_update: Option<bool>,
    /// Override `replay.defer_readback` (it applies to the `--unsynced` steps: the timed ones
    /// read at once).
    #[arg(long)]
    pub defer_readback: Option<bool>,
    /// Override `replay.upload_ahead` (it applies to the `--unsynced` steps: the timed ones
    /// upload their own batch).
    #[arg(long)]
    pub upload_ahead: Option<bool>,
    /// Override `optim.optimizer` (e.g. `musgd`, which `auto` picks for fits of more than
    /// 10,000 iterations).
    #[arg(long, value_enum)]
    pub optimizer: Option<crate::config::OptimizerKind>,
    /// Override `optim.flat_update`.
    #[arg(long)]
    pub flat_update: Option<bool>,
    /// Override `train.batch` (and `train.nbs`, so every step is an optimizer step).
    #[arg(long)]
    pub batch: Option<usize>,
    /// Override `device.conv_bn_ops`.
    #[arg(long, value_enum)]
    pub conv_bn_ops: Option<crate::model::ops::ConvBnOps>,
    /// Run the reduced-precision convolutions with this routine: our `own-bf16` (the default)
    /// or one of CubeCL's (`bench-conv --routines`; CUDA only).
    #[arg(long)]
    pub conv_routine: Option<String>,
    /// Run the weight gradients' matmuls with this routine: one of ours (`own-tf32`, the
    /// default, and its forms) or one of CubeCL's (`bench-conv --matmul-routines`; CUDA only).
    #[arg(long)]
    pub matmul_routine: Option<String>,
    /// Split the weight gradients' im2col products into matmul batches of at least this many
    /// output pixels (default: by the map's size, `model::ops::wgrad::by_size`; see
    /// `model::ops::wgrad::choose_chunk`).
    #[arg(long)]
    pub wgrad_chunk: Option<usize>,
    /// How the RLE flow runs: each coupling as one operation (`couplings`, the default), each
    /// coupling net as one (`nets`), or the module's layers (`layers`); `model::flow::choose`.
    #[arg(long)]
    pub flow: Option<String>,
    /// Pad the reduced-precision convolutions' operands whose channel count is not a multiple
    /// of 8, and is at least this many, to a multiple of this many (8, the default, 16 or 32;
    /// `model::ops::conv::gemm::choose_padding`, CUDA only).
    #[arg(long)]
    pub conv_padding: Option<usize>,
    /// Whether the BF16 data gradients of strided convolutions run by the
    /// routine's stride-1 GEMM on the zero-dilated output gradient (`true`, the default) or by
    /// Burn's direct kernel in FP32 (`false`; CUDA only).
    #[arg(long)]
    pub strided_by_gemm: Option<bool>,
    /// Sum every weight gradient's chunks by our kernel, native and replay alike, and write
    /// the recorded step's weight gradients straight into the flat gradient buffer (`true`, the
    /// default; `model::ops::grads_into`, CUDA only) or by Burn's `sum_dim` with a copy after
    /// (`false`).
    #[arg(long)]
    pub grads_in_place: Option<bool>,
    /// Weight gradients of the convolutions computed in BF16 from BF16 operands, accumulated in
    /// FP32 (`true`; `model::ops::wgrad::choose_reduced`, CUDA only), or from FP32 operands
    /// (`false`, the default).
    #[arg(long)]
    pub reduced_wgrad: Option<bool>,
    /// Lay a recording's BatchNorm running statistics out in one buffer and update them there
    /// in place (`true`, the default; `model::ops::stats_into`, CUDA only), or gather and copy
    /// them after each recorded forward (`false`).
    #[arg(long)]
    pub stats_in_place: Option<bool>,
    /// Run each channels-last BatchNorm sum (statistics, γ/β gradients) in one launch, the last
    /// cube of a channel tile merging its partials (`true`; `kernels/batch_norm_single.rs`,
    /// CUDA only), or in two (`false`, the default: the one launch is slower on the GPU). Both
    /// give the same bits.
    #[arg(long)]
    pub bn_single_pass: Option<bool>,
    /// Have the fused BatchNorm's backward write its input gradient (the convolution's output
    /// gradient) channels-last where its tile kernel runs for a stride-1 convolution without
    /// groups with a multiple of 4 channels (`true`; the weight gradient's matmul then reads it
    /// without a copy; CUDA only; the default), or NCHW (`false`). The same values either way.
    #[arg(long)]
    pub bn_grad_channels_last: Option<bool>,
    /// Keep a recorded loss's flow parameters as segments of one buffer, refreshed from the
    /// trainer's by one copy of their run in the flat optimizer's values (`true`;
    /// `replay::loss::choose_flow_segments`, CUDA only; the default), or each in its own
    /// buffer, one copy per tensor (`false`). The same values either way.
    #[arg(long)]
    pub flow_segments: Option<bool>,
    /// With one graph, run one more warm-up before each step recording that runs the window's
    /// own work eagerly (`true`; `replay::recorder::choose_warm_up_as_captured`, CUDA only), or
    /// only the plain warm-ups (`false`, the default; a window refused for room is then
    /// recorded again with it). The same values either way.
    #[arg(long)]
    pub warm_up_as_captured: Option<bool>,
    /// Have each BatchNorm's backward write its convolution's output gradient as the data
    /// gradient's GEMM takes it (`true`, the default; `model::ops::grad_operands`, CUDA only), or
    /// have the convolution cast it (`false`). Both give the same bits.
    #[arg(long)]
    pub grad_operands: Option<bool>,
    /// Have each BatchNorm whose output a convolution takes write that convolution's input as
    /// its GEMM takes it (`true`, the default; `model::ops::input_operands`, CUDA only), or
    /// have the convolution cast it (`false`). Both give the same bits.
    #[arg(long)]
    pub input_operands: Option<bool>,
    /// Cast NCHW operands channels-last through shared-memory tiles (`true`;
    /// `model::ops::channels::choose_tiled`, CUDA only) or one unit per value (`false`, the
    /// default). Both give the same bits.
    #[arg(long)]
    pub tiled_casts: Option<bool>,
    /// Run the device assignment as our kernels (`true`, the default;
    /// `loss::assign::device::kernel_assign`, CUDA only) or as tensor operations (`false`). The
    /// same rules.
    #[arg(long)]
    pub assign_kernels: Option<bool>,
    /// Compute the device loss's per-anchor box, L1, OKS and visibility terms of a pose copy as
    /// one operation with its own backward (`true`, the default; `loss::anchor_terms`, our
    /// kernels on CUDA, loops on the CPU) or as tensor operations (`false`). The same terms
    /// within rounding.
    #[arg(long)]
    pub anchor_terms: Option<bool>,
    /// Compute the device loss's RLE rows of a pose copy as one operation with its own backward
    /// (`true`, the default; `loss::anchor_terms::rle_rows`, with the per-anchor terms only) or
    /// as tensor operations (`false`). The same rows within rounding.
    #[arg(long)]
    pub rle_rows: Option<bool>,
    /// Compute the attention's softmax as one operation with its own backward (`true`;
    /// `model::ops::softmax`, one kernel each way on CUDA; the default) or as Burn's tensor
    /// operations (`false`). The same values within rounding.
    #[arg(long)]
    pub fused_softmax: Option<bool>,
    /// In a recorded step ending in an optimizer step, walk the model once while the step's
    /// graph runs, for the update's EMA sources and the next step's (`true`;
    /// `replay::update::choose_early`, CUDA only), or walk it in the update after the read and
    /// again in the next step (`false`, the default). The same tensors either way.
    #[arg(long)]
    pub early_walk: Option<bool>,
    /// Have the flow's coupling kernels compute their layer products by tiles (`true`, the
    /// default; `model::ops::coupling_kernels::choose_tiled`, CUDA only) or one unit per value
    /// (`false`). Both give the same bits.
    #[arg(long)]
    pub tiled_couplings: Option<bool>,
    /// Also read the memory pool inside every step (at the ends of loss, backward and optimizer)
    /// and print the largest bytes in use.
    #[arg(long)]
    pub in_step_memory: bool,
    /// Steps run before timing starts.
    #[arg(long, default_value_t = 64)]
    pub skip: usize,
    /// Timed steps.
    #[arg(long, default_value_t = 64)]
    pub steps: usize,
    /// Also break every step down into phases between device syncs (upload, augment, forward,
    /// assign, loss, backward, optimizer, readback); the syncs make the steps themselves slower.
    #[arg(long)]
    pub phases: bool,
    /// Also time every step with the device's own clock (CUDA events on the training stream)
    /// and print its median beside the wall-clock one.
    #[arg(long)]
    pub events: bool,
    /// After the timed steps, run this many more with phase syncs and count, per phase, the
    /// CUDA driver calls, kernel launches, kernels run and GPU busy time (CUPTI; CUDA build).
    /// With `--phases` the table adds host ms and µs per driver call from the timed steps.
    #[arg(long, default_value_t = 0)]
    pub census: usize,
    /// Write the census per (phase, kernel) here as CSV: runs and GPU ms per step.
    #[arg(long, requires = "census")]
    pub census_csv: Option<std::path::PathBuf>,
    /// Write the census's last step here as CSV: every kernel and copy in the order the GPU
    /// started it, with its phase, GPU µs, grid and block.
    #[arg(long, requires = "census")]
    pub census_trace: Option<std::path::PathBuf>,
    /// After the timed steps, run this many more without a device sync between them and print
    /// their mean: the pace of a fit without `--report`, where the host may run ahead of the
    /// GPU (the timed steps sync before and after each step).
    #[arg(long, default_value_t = 0)]
    pub unsynced: usize,
    /// With `--unsynced`: also sum the host's wall time in each part of those steps
    /// (`train::spans`) and print it per step.
    #[arg(long, requires = "unsynced")]
    pub spans: bool,
    /// How batches reach the device: bytes widened there (u8) or on the host (i32).
    #[arg(long, value_enum, default_value = "u8")]
    pub upload: crate::data::batch::Upload,
    /// Sample the host's threads during the timed steps; write a flamegraph SVG here and the
    /// folded stacks beside it (`.folded`).
    #[cfg(feature = "profile")]
    #[arg(long)]
    pub profile: Option<std::path::PathBuf>,
}

/// Applies `o`'s config overrides to `cfg` and its switches to this process.
pub fn apply(o: &Options, cfg: &mut Config) -> anyhow::Result<()> {
    if let Some(r) = o.replay {
        cfg.replay.enabled = r;
    }
    if let Some(s) = o.scope {
        cfg.replay.scope = Some(s);
    }
    if let Some(p) = o.precision {
        cfg.train.precision = p;
    }
    if let Some(l) = o.loss_on {
        cfg.train.loss_on = l;
    }
    if let Some(s) = o.shared_parameters {
        cfg.replay.shared_parameters = s;
    }
    if let Some(g) = o.one_graph {
        cfg.replay.one_graph = Some(g);
    }
    if let Some(u) = o.record_update {
        cfg.replay.record_update = Some(u);
    }
    if let Some(d) = o.defer_readback {
        cfg.replay.defer_readback = Some(d);
    }
    if let Some(u) = o.upload_ahead {
        cfg.replay.upload_ahead = Some(u);
    }
    if let Some(k) = o.optimizer {
        cfg.optim.optimizer = k;
    }
    if let Some(f) = o.flat_update {
        cfg.optim.flat_update = f;
    }
    if let Some(b) = o.batch {
        cfg.train.batch = b;
        cfg.train.nbs = b;
    }
    if let Some(name) = &o.conv_routine {
        #[cfg(feature = "cuda")]
        crate::model::ops::conv::routine::choose(name).map_err(|e| anyhow::anyhow!(e))?;
        #[cfg(not(feature = "cuda"))]
        anyhow::bail!("--conv-routine {name}: CubeCL's routines run on CUDA only");
    }
    if let Some(name) = &o.matmul_routine {
        #[cfg(feature = "cuda")]
        crate::model::ops::matmul::choose(name).map_err(|e| anyhow::anyhow!(e))?;
        #[cfg(not(feature = "cuda"))]
        anyhow::bail!("--matmul-routine {name}: CubeCL's routines run on CUDA only");
    }
    if let Some(pixels) = o.wgrad_chunk {
        crate::model::ops::wgrad::choose_chunk(pixels).map_err(|e| anyhow::anyhow!(e))?;
    }
    if let Some(on) = o.anchor_terms {
        crate::loss::anchor_terms::choose(on);
    }
    if let Some(on) = o.rle_rows {
        crate::loss::anchor_terms::choose_rle(on);
    }
    if let Some(on) = o.fused_softmax {
        crate::model::ops::softmax::choose(on);
    }
    if let Some(way) = &o.flow {
        crate::model::flow::choose(way).map_err(|e| anyhow::anyhow!("--flow: {e}"))?;
    }
    super::choose_conv_padding(o.conv_padding)?;
    cuda_only!(
        o.strided_by_gemm,
        "--strided-by-gemm",
        "CubeCL's routines run on CUDA only",
        crate::model::ops::conv::routine::choose_strided_by_gemm
    );
    cuda_only!(
        o.early_walk,
        "--early-walk",
        "the recorded update runs on CUDA only",
        crate::replay::update::choose_early
    );
    cuda_only!(
        o.grads_in_place,
        "--grads-in-place",
        "the recorded step runs on CUDA only",
        crate::model::ops::grads_into::choose
    );
    cuda_only!(
        o.reduced_wgrad,
        "--reduced-wgrad",
        "reduced operands run on CUDA only",
        crate::model::ops::wgrad::choose_reduced
    );
    cuda_only!(
        o.stats_in_place,
        "--stats-in-place",
        "the recordings run on CUDA only",
        crate::model::ops::stats_into::choose
    );
    cuda_only!(
        o.grad_operands,
        "--grad-operands",
        "the operands are made on CUDA only",
        crate::model::ops::grad_operands::choose
    );
    cuda_only!(
        o.input_operands,
        "--input-operands",
        "the operands are made on CUDA only",
        crate::model::ops::input_operands::choose
    );
    cuda_only!(
        o.tiled_casts,
        "--tiled-casts",
        "the casts run on CUDA only",
        crate::model::ops::channels::choose_tiled
    );
    cuda_only!(
        o.assign_kernels,
        "--assign-kernels",
        "the kernels run on CUDA only",
        crate::loss::assign::device::kernel_assign::choose
    );
    cuda_only!(
        o.tiled_couplings,
        "--tiled-couplings",
        "the coupling kernels run on CUDA only",
        crate::model::ops::coupling_kernels::choose_tiled
    );
    cuda_only!(
        o.bn_single_pass,
        "--bn-single-pass",
        "our BatchNorm kernels run on CUDA only",
        crate::model::ops::fused_bn_single::choose
    );
    cuda_only!(
        o.bn_grad_channels_last,
        "--bn-grad-channels-last",
        "our BatchNorm kernels run on CUDA only",
        crate::model::ops::choose_channels_last_grad
    );
    cuda_only!(
        o.flow_segments,
        "--flow-segments",
        "the loss is recorded on CUDA only",
        crate::replay::loss::choose_flow_segments
    );
    cuda_only!(
        o.warm_up_as_captured,
        "--warm-up-as-captured",
        "the step is recorded on CUDA only",
        crate::replay::recorder::choose_warm_up_as_captured
    );
    if let Some(k) = o.conv_bn_ops {
        cfg.device.conv_bn_ops = k;
    }
    Ok(())
}
