//! Offline stand-in for `cubecl-llvm` 0.11.3.
//!
//! The real crate's build script downloads a prebuilt LLVM bundle, which fails on offline machines.
//! `cubecl-cuda` always links it, but with its `cpp` feature the CUDA runtime compiles every kernel
//! through NVRTC and only names these types. This crate provides exactly those names; asking it to
//! compile anything returns an error that says why (see `docs/dependencies.md` in burnpose).

use cubecl_core::Compiler;
use cubecl_environment::backtrace::BackTrace;
use cubecl_runtime::compiler::CompilationError;
use cubecl_runtime::kernel::{BufferIOAttr, KernelDefinition};

#[cfg(feature = "nvptx")]
use cubecl_core::ir::nvidia::SmArch;

pub mod nvptx {
    pub mod ptx_version {
        use core::fmt;

        /// A PTX ISA version, as the NVPTX target feature spells it: 8.7 is `87`.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub struct PtxVersion(u32);

        impl PtxVersion {
            /// The newest version a driver of CUDA `driver` loads (12.8 is `12080`); `None` below
            /// CUDA 10.0. Same table as the real crate, so the value cubecl-cuda logs is the same.
            pub fn for_driver(driver: i32) -> Option<Self> {
                DRIVER_PTX
                    .iter()
                    .find(|(first_driver, _)| driver >= *first_driver)
                    .map(|(_, ptx)| Self(*ptx))
            }
        }

        impl fmt::Display for PtxVersion {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "ptx{}", self.0)
            }
        }

        const DRIVER_PTX: &[(i32, u32)] = &[
            (13030, 93),
            (13020, 92),
            (13010, 91),
            (13000, 90),
            (12090, 88),
            (12080, 87),
            (12050, 85),
            (12040, 84),
            (12030, 83),
            (12020, 82),
            (12010, 81),
            (12000, 80),
            (11080, 78),
            (11070, 77),
            (11060, 76),
            (11050, 75),
            (11040, 74),
            (11030, 73),
            (11020, 72),
            (11010, 71),
            (11000, 70),
            (10020, 65),
            (10010, 64),
            (10000, 63),
        ];
    }
}

pub mod shared {
    pub mod lowered_features {
        use cubecl_core::ir::DeviceProperties;

        /// The GPU target a device's features would be narrowed for.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum GpuTarget {
            Nvptx,
        }

        /// cubecl-cuda calls this only when its LLVM backend is selected, which the `cpp` feature
        /// rules out. Leaving the properties untouched is right for the NVRTC path.
        pub fn restrict_features(_props: &mut DeviceProperties, _target: GpuTarget) {}
    }
}

/// LLVM compilation targets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LlvmTarget {
    #[default]
    Cpu,
    Nvptx,
}

/// Options the real crate reads; kept so cubecl-cuda's struct literal compiles.
#[derive(Clone, Debug, Default)]
pub struct PlironOptions {
    pub arch: Option<()>,
    #[cfg(feature = "nvptx")]
    pub sm_arch: Option<SmArch>,
    #[cfg(feature = "nvptx")]
    pub ptx_version: Option<nvptx::ptx_version::PtxVersion>,
    pub grid_constants: bool,
}

/// A compiled PTX module (never produced by this stand-in).
#[derive(Clone, Debug)]
pub struct NvptxModule {
    pub ptx: Vec<core::ffi::c_char>,
    pub entrypoint: String,
    pub ir: String,
    pub shared_memory_size: usize,
    pub io: Vec<BufferIOAttr>,
}

/// Compiled kernel artifact.
#[derive(Clone, Debug)]
pub enum PlironArtifact {
    NvptxCode(NvptxModule),
}

impl core::fmt::Display for PlironArtifact {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PlironArtifact::NvptxCode(module) => f.write_str(&module.ir),
        }
    }
}

/// The LLVM kernel compiler. This stand-in refuses every compilation.
#[derive(Clone, Debug)]
pub struct PlironCompiler {
    pub target: LlvmTarget,
}

/// Why compiling through this crate fails.
pub const OFFLINE_REASON: &str = "cubecl-llvm is replaced by burnpose's offline stand-in \
(crates/cubecl-llvm-offline): the LLVM backend is not available. Build cubecl-cuda with its \
`cpp` feature so kernels compile through NVRTC (see docs/dependencies.md).";

impl Compiler for PlironCompiler {
    type Representation = PlironArtifact;
    type CompilationOptions = PlironOptions;

    fn compile(
        &mut self,
        _kernel: KernelDefinition,
        _options: &Self::CompilationOptions,
    ) -> Result<Self::Representation, CompilationError> {
        Err(CompilationError::Generic {
            reason: OFFLINE_REASON.to_string(),
            backtrace: BackTrace::capture(),
        })
    }

    fn extension(&self) -> &'static str {
        "ll"
    }

    fn lang_tag(&self) -> &'static str {
        "llvm"
    }
}

#[cfg(test)]
mod tests {
    use super::nvptx::ptx_version::PtxVersion;

    #[test]
    fn driver_versions_map_like_the_real_crate() {
        assert_eq!(PtxVersion::for_driver(12080).unwrap().to_string(), "ptx87");
        assert_eq!(PtxVersion::for_driver(13000).unwrap().to_string(), "ptx90");
        assert_eq!(PtxVersion::for_driver(8000), None);
    }
}
