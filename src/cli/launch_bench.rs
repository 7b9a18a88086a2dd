//! `burnpose bench-launch`: what one tiny kernel launch costs on each path a training step can
//! take to the GPU (issue "faster", step 2). The same one-element-per-thread kernel on a small
//! buffer, launched N times back to back:
//! - `burn`: `x + 1.0` through Burn's tensor API (dispatch, CubeCL's channel to its device
//!   thread, kernel lookup, memory pool, launch);
//! - `burn autodiff`: the same on an autodiff tensor that tracks gradients (adds the tape);
//! - `cubecl`: our own `#[cube]` copy kernel launched on CubeCL's client directly (no Burn op);
//! - `driver`: an NVRTC-compiled kernel launched with `cuLaunchKernel` on a stream of our own;
//! - `driver+attr+ctx`: the same with the two calls CubeCL 0.11.3 makes around each launch
//!   (`cuCtxSetCurrent`, `cuFuncSetAttribute`), to price them.
//!
//! Each arm reports host µs per launch to enqueue all N (the calling thread's cost; CubeCL
//! launches later on its device thread) and to finish them (enqueue + drain, device synced):
//! when the launch path is the bottleneck the second is the real rate.

use crate::config::DeviceKind;
use burn::prelude::*;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct Options {
    #[arg(long, value_enum)]
    pub device: Option<DeviceKind>,
    /// Launches per arm (after as many warm-up launches, a tenth of these).
    #[arg(long, default_value_t = 20_000)]
    pub launches: usize,
    /// Elements of the buffer each launch touches.
    #[arg(long, default_value_t = 256)]
    pub elements: usize,
    /// Repeat the arms this many times, alternating (report every round).
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
}

/// Host µs per launch: to enqueue, and to finish (device synced).
struct Arm {
    name: &'static str,
    enqueue_us: f64,
    finish_us: f64,
}

pub fn run(o: Options) -> anyhow::Result<()> {
    anyhow::ensure!(
        o.launches > 0 && o.elements > 0,
        "--launches and --elements must be positive"
    );
    let device = match o.device {
        Some(DeviceKind::Cpu) => Device::flex(),
        _ => {
            crate::config::device::resolve(crate::config::DeviceKind::Cuda, 0)
                .map_err(|e| anyhow::anyhow!("bench-launch needs a CUDA device: {e}"))?
                .0
        }
    };
    println!(
        "bench-launch: {} launches per arm, {} f32 elements each, {} rounds",
        o.launches, o.elements, o.rounds
    );
    for round in 0..o.rounds {
        #[cfg_attr(not(feature = "cuda"), allow(unused_mut))]
        let mut arms = vec![burn_arm(&device, &o, false)?, burn_arm(&device, &o, true)?];
        #[cfg(feature = "cuda")]
        if !matches!(o.device, Some(DeviceKind::Cpu)) {
            arms.push(cube::cubecl_arm(&device, &o)?);
            arms.push(cube::driver_arm(&o, false)?);
            arms.push(cube::driver_arm(&o, true)?);
        }
        for a in arms {
            println!(
                "round {round} {:<16} enqueue {:>6.2} µs/launch  finish {:>6.2} µs/launch",
                a.name, a.enqueue_us, a.finish_us
            );
        }
    }
    Ok(())
}

/// Synchronises the Burn device.
fn sync(device: &Device) -> impl FnMut() -> anyhow::Result<()> + '_ {
    || {
        device
            .sync()
            .map_err(|e| anyhow::anyhow!("device sync failed: {e:?}"))
    }
}

/// Times `launch(n)` for `n` launches after a tenth as many warm-up launches, `sync` waiting for
/// the queue they went to.
fn time(
    name: &'static str,
    n: usize,
    mut sync: impl FnMut() -> anyhow::Result<()>,
    mut launch: impl FnMut(usize) -> anyhow::Result<()>,
) -> anyhow::Result<Arm> {
    launch((n / 10).max(1))?;
    sync()?;
    let start = Instant::now();
    launch(n)?;
    let enqueue = start.elapsed();
    sync()?;
    let finish = start.elapsed();
    let per = |d: std::time::Duration| d.as_secs_f64() * 1e6 / n as f64;
    Ok(Arm {
        name,
        enqueue_us: per(enqueue),
        finish_us: per(finish),
    })
}

fn burn_arm(device: &Device, o: &Options, autodiff: bool) -> anyhow::Result<Arm> {
    let d = if autodiff {
        device.clone().autodiff()
    } else {
        device.clone()
    };
    let name = if autodiff { "burn autodiff" } else { "burn" };
    let start = Tensor::<1>::zeros([o.elements], &d);
    let start = if autodiff {
        start.require_grad()
    } else {
        start
    };
    time(name, o.launches, sync(device), |n| {
        let mut x = start.clone();
        for _ in 0..n {
            x = x + 1.0;
        }
        // Keep the chain alive until all of it is enqueued.
        drop(x);
        Ok(())
    })
}

#[cfg(feature = "cuda")]
mod cube {
    use super::{Arm, Options, sync, time};
    use crate::replay::copy::cube;
    use burn::prelude::*;
    use cudarc::driver::{CudaContext, DevicePtr};

    pub fn cubecl_arm(device: &Device, o: &Options) -> anyhow::Result<Arm> {
        let src = cube(Tensor::<1>::ones([o.elements], device));
        let dst = cube(Tensor::<1>::zeros([o.elements], device));
        time("cubecl", o.launches, sync(device), |n| {
            for _ in 0..n {
                crate::replay::copy::copy_into(src.clone(), &dst);
            }
            Ok(())
        })
    }

    const SRC: &str = r#"extern "C" __global__ void add_one(float* x, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) x[i] += 1.0f;
    }"#;

    pub fn driver_arm(o: &Options, as_cubecl: bool) -> anyhow::Result<Arm> {
        let ctx = CudaContext::new(0).map_err(|e| anyhow::anyhow!("CUDA context: {e:?}"))?;
        let ptx = cudarc::nvrtc::compile_ptx(SRC).map_err(|e| anyhow::anyhow!("NVRTC: {e:?}"))?;
        let module = ctx
            .load_module(ptx)
            .map_err(|e| anyhow::anyhow!("module: {e:?}"))?;
        let f = module
            .load_function("add_one")
            .map_err(|e| anyhow::anyhow!("function: {e:?}"))?;
        let stream = ctx
            .new_stream()
            .map_err(|e| anyhow::anyhow!("stream: {e:?}"))?;
        let buf = stream
            .alloc_zeros::<f32>(o.elements)
            .map_err(|e| anyhow::anyhow!("alloc: {e:?}"))?;
        let (mut ptr, _guard) = buf.device_ptr(&stream);
        let mut n_elems = o.elements as i32;
        let blocks = o.elements.div_ceil(256) as u32;
        let (cu_f, cu_s) = (f.cu_function(), stream.cu_stream());
        let cu_ctx = ctx.cu_ctx();
        let name = if as_cubecl {
            "driver+attr+ctx"
        } else {
            "driver"
        };
        // The stream is ours, not Burn's: sync it rather than the Burn device.
        let sync = || {
            stream
                .synchronize()
                .map_err(|e| anyhow::anyhow!("stream sync: {e:?}"))
        };
        time(name, o.launches, sync, |n| {
            for _ in 0..n {
                if as_cubecl {
                    // SAFETY: the context and function are alive for the whole call.
                    unsafe {
                        cudarc::driver::result::ctx::set_current(cu_ctx)
                            .map_err(|e| anyhow::anyhow!("set current: {e:?}"))?;
                        cudarc::driver::result::function::set_function_attribute(
                            cu_f,
                            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                            0,
                        )
                        .map_err(|e| anyhow::anyhow!("attribute: {e:?}"))?;
                    }
                }
                let mut params = [
                    (&mut ptr) as *mut _ as *mut std::ffi::c_void,
                    (&mut n_elems) as *mut _ as *mut std::ffi::c_void,
                ];
                // SAFETY: the kernel takes (float*, int); both live for the whole call and the
                // buffer holds `n_elems` floats.
                unsafe {
                    cudarc::driver::result::launch_kernel(
                        cu_f,
                        (blocks, 1, 1),
                        (256, 1, 1),
                        0,
                        cu_s,
                        &mut params,
                    )
                }
                .map_err(|e| anyhow::anyhow!("launch: {e:?}"))?;
            }
            Ok(())
        })
    }
}
