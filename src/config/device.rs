//! Turning the `[device]` section (or `--device`) into a Burn device.

use super::DeviceKind;
use burn::prelude::*;

/// The device a run uses, and a human description of why.
pub fn resolve(kind: DeviceKind, index: usize) -> Result<(Device, String), String> {
    match kind {
        DeviceKind::Cpu => Ok((Device::flex(), "cpu (flex backend)".into())),
        DeviceKind::Cuda => cuda(index),
        DeviceKind::Auto => match cuda(index) {
            Ok(found) => Ok(found),
            Err(why) => Ok((Device::flex(), format!("cpu (flex backend; {why})"))),
        },
    }
}

#[cfg(feature = "cuda")]
fn cuda(index: usize) -> Result<(Device, String), String> {
    // cudarc panics when the driver library cannot be loaded; that means "no GPU" here.
    let count = std::panic::catch_unwind(cudarc::driver::CudaContext::device_count)
        .map_err(|_| "no CUDA driver library found".to_string())?
        .map_err(|e| format!("CUDA driver error: {e:?}"))?;
    if index >= count.max(0) as usize {
        return Err(format!("CUDA device {index} requested, {count} present"));
    }
    configure_kernel_cache();
    Ok((Device::cuda(index), format!("cuda:{index}")))
}

/// Compiled kernels and autotune results are kept in the per-user cache directory (not the
/// working directory or a `target/` folder), so every run of every checkout reuses them, and the
/// memory pool reuses same-size buffers (`size-match`). Must run
/// before the first CUDA device is created; a `cubecl.toml`/`burn.toml` found from the current
/// directory is still read first; the cache settings are forced, size-match only replaces the
/// default mode.
#[cfg(feature = "cuda")]
fn configure_kernel_cache() {
    use burn::cubecl::config::cache::CacheConfig;
    use burn::cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        use burn::cubecl::config::compilation::CompilationLogLevel;
        let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
        config.compilation.cache = true;
        config.environment.path = CacheConfig::Global;
        // One line per compiled kernel into our own file feeds the progress line
        // (`config::compile_progress`), unless the user configured compilation logging themselves.
        let logger = &mut config.compilation.logger;
        if matches!(logger.level, CompilationLogLevel::Disabled) && logger.file.is_none() {
            logger.level = CompilationLogLevel::Basic;
            logger.file = Some(super::compile_progress::log_path());
            logger.append = false;
        }
        // Serve recurring sizes from exact-size persistent buckets: the dynamic pool's slice
        // search was half of every training step's host time on the H200 (docs/perf_log.md, 2026-11-29:
        // 640 → 320 ms at b4/640, same bits). A `cubecl.toml` choosing another mode is kept.
        use burn::cubecl::config::memory::PersistentMemory;
        if matches!(config.memory.persistent_memory, PersistentMemory::Enabled) {
            config.memory.persistent_memory = PersistentMemory::SizeMatch;
        }
        CubeClRuntimeConfig::try_set(config);
    });
}

#[cfg(not(feature = "cuda"))]
fn cuda(_index: usize) -> Result<(Device, String), String> {
    Err("this build has no CUDA backend; rebuild with `--features cuda`".into())
}

/// Whether `device` is a CUDA device.
pub fn is_cuda(device: &Device) -> bool {
    format!("{:?}", device.clone().inner())
        .to_lowercase()
        .contains("cuda")
}
