//! Our CUDA kernels compiled to CUDA C++ on a machine without a GPU, for the CUDA build's unit
//! tests (`cargo test --features cuda --lib`): CubeCL's C++ compiler expands a kernel, verifies
//! its IR and emits the source without touching a device, so a kernel that the GPU would reject
//! at its first launch ("Compilation error: verification failed", docs/perf_log.md AZ1) fails
//! here, before any device time is spent. NVRTC's own compilation still needs the GPU machine.

use burn::cubecl;
use cubecl::Compiler;
use cubecl::ir::features::{AtomicUsage, TypeUsage};
use cubecl::ir::{
    AddressType, DeviceIdentity, DeviceProperties, ElemType, FloatKind, HardwareProperties,
    IntKind, MemoryDeviceProperties, TargetProperties, Type, UIntKind, VectorSize,
};
use cubecl::prelude::{KernelDefinition, TensorArg};
use cubecl::profile::TimingMethod;
use cubecl::server::Handle;
use cubecl_common::device::{DeviceId, ServiceId};
use cubecl_cuda::{CudaCompiler, CudaRuntime};
use std::sync::Arc;

/// An H100's properties as CubeCL's CUDA runtime reads them (the ones kernels consult), with
/// the types and atomics its C++ dialect supports.
pub fn device() -> (Arc<DeviceProperties>, Arc<TargetProperties>) {
    let hardware = HardwareProperties {
        load_width: 128,
        vector_register_count: None,
        plane_size_min: 32,
        plane_size_max: 32,
        max_bindings: 1024,
        max_shared_memory_size: 227 * 1024,
        max_cube_count: (u32::MAX, 65535, 65535),
        max_units_per_cube: 1024,
        max_cube_dim: (1024, 1024, 64),
        num_streaming_multiprocessors: Some(132),
        num_cpu_cores: None,
        last_level_cache_size: None,
        num_tensor_cores: Some(4),
        min_tensor_cores_dim: Some(8),
        max_vector_size: VectorSize::MAX,
        cube_mma_reserved_shared_memory: 0,
    };
    let mut p = DeviceProperties::new(
        Default::default(),
        MemoryDeviceProperties::new(1 << 30, 256),
        hardware,
        TimingMethod::Device,
        DeviceIdentity {
            name: "compile check".into(),
            fingerprint: "ptx_sm90".into(),
            physical: None,
        },
    );
    p.register_address_type(AddressType::U32);
    p.register_address_type(AddressType::U64);
    for ty in [
        ElemType::Index,
        ElemType::UInt(UIntKind::U8),
        ElemType::UInt(UIntKind::U32),
        ElemType::UInt(UIntKind::U64),
        ElemType::Int(IntKind::I32),
        ElemType::Int(IntKind::I64),
        ElemType::Float(FloatKind::BF16),
        ElemType::Float(FloatKind::F16),
        ElemType::Float(FloatKind::F32),
        ElemType::Bool,
    ] {
        p.register_type_usage(ty, TypeUsage::all());
    }
    p.register_atomic_type_usage(
        Type::atomic(ElemType::UInt(UIntKind::U32)),
        AtomicUsage::all(),
    );
    let target = <CudaRuntime as cubecl::__private::Runtime>::target_properties();
    (Arc::new(p), Arc::new(target))
}

/// A contiguous `shape` tensor argument whose buffer is never allocated (the kernel is only
/// compiled).
pub fn tensor(shape: &[usize]) -> TensorArg {
    let service = ServiceId {
        device: DeviceId {
            type_id: 0,
            index_id: 0,
        },
        service: std::any::TypeId::of::<()>(),
    };
    // The stream's type is not re-exported; its serialised form names stream 0.
    let stream = serde_json::from_str(r#"{"value":0}"#).expect("a stream id");
    let strides: Vec<usize> = (0..shape.len())
        .map(|i| shape[i + 1..].iter().product())
        .collect();
    let size = shape.iter().product::<usize>() as u64 * 4;
    // SAFETY: the handle is never read or written; the shape and strides describe its size.
    unsafe {
        TensorArg::from_raw_parts(
            Handle::new(service, stream, size),
            strides.into(),
            shape.to_vec().into(),
        )
    }
}

/// Panics with CubeCL's message unless `kernel` compiles to CUDA C++.
pub fn compiles(kernel: KernelDefinition) {
    let name = kernel.settings.kernel_name.clone();
    if let Err(e) = CudaCompiler::default().compile(kernel, &Default::default()) {
        panic!("{name} does not compile for CUDA: {e}");
    }
}
