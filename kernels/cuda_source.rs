//! Our kernels written in CUDA C++ (`*.cu` beside this file), launched through CubeCL: CubeCL
//! compiles a kernel that carries its own source (`CubeKernel::source`) with NVRTC and launches
//! it on its stream like any of its kernels, so CUDA graphs record it as they record those.
//! Each problem renders its source with its shape and strides as constants (one compiled
//! kernel per problem, kept by the kernel caches), which lets the compiler fold every index.

use burn::cubecl;
use burn::tensor::{DType, Shape};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::ir::{UIntKind, metadata::Info};
use cubecl::prelude::*;
use cubecl::server::KernelArguments;
use cubecl::{CubeKernel, PrecompiledSource};
use std::fmt::Debug;
use std::hash::Hash;

/// FNV-1a of `text`, at compile time: a kernel's id must change with its source, since the
/// kernel caches (in memory and on disk) are keyed by the id alone.
pub const fn fnv(text: &str) -> u64 {
    let bytes = text.as_bytes();
    let mut hash = 0xcbf2_9ce4_8422_2325_u64;
    let mut i = 0;
    while i < bytes.len() {
        hash = (hash ^ bytes[i] as u64).wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    hash
}

/// A problem of one of our CUDA C++ kernels: its constants (the kernel's id), its source with
/// them, the entry point's name and the block's threads.
pub trait Problem: Debug + Clone + PartialEq + Eq + Hash + Send + Sync + 'static {
    /// The `extern "C"` entry point of the source.
    const ENTRY: &'static str;
    /// [`fnv`] of the `.cu` text the source is made from.
    const SOURCE_HASH: u64;
    /// The constants, then the kernel's text.
    fn source(&self) -> String;
    /// Threads a block (one dimension).
    fn threads(&self) -> u32;
}

struct Kernel<P>(P);

impl<P: Problem> KernelMetadata for Kernel<P> {
    fn id(&self) -> KernelId {
        KernelId::new::<Self>()
            .info((self.0.clone(), P::SOURCE_HASH))
            .cube_dim(CubeDim::new_1d(self.0.threads()).0)
    }

    fn address_type(&self) -> ElemType {
        UIntKind::U32.into()
    }
}

impl<P: Problem> CubeKernel for Kernel<P> {
    fn define(&self) -> KernelDefinition {
        // Only the settings matter (the block's size); the source is the kernel.
        let settings = KernelSettings::new(
            CubeDim::new_1d(self.0.threads()).0,
            ExecutionMode::Checked,
            AddressType::U32,
        );
        KernelDefinition {
            body: Scope::root(settings.clone()),
            settings,
            info: Info::default(),
        }
    }

    fn source(&self) -> Option<PrecompiledSource> {
        Some(PrecompiledSource {
            source: self.0.source(),
            entrypoint_name: P::ENTRY.to_string(),
            lang: "cuda",
        })
    }
}

/// Launches `problem`'s kernel on `count` blocks, on the stream of the first input's client,
/// with the buffers of `inputs` in order and last that of a new contiguous tensor of `shape`
/// and `dtype` on the first input's device, which it returns.
pub fn launch<P: Problem>(
    problem: P,
    count: CubeCount,
    inputs: &[&CubeTensor],
    shape: Shape,
    dtype: DType,
) -> CubeTensor {
    let first = inputs[0];
    let out =
        empty_device_contiguous_dtype(first.client.clone(), first.device.clone(), shape, dtype);
    let buffers = inputs
        .iter()
        .chain([&&out])
        .map(|t| t.handle.clone().binding())
        .collect();
    let args = KernelArguments::new().with_buffers(buffers);
    first.client.launch(Box::new(Kernel(problem)), count, args);
    out
}
