//! A mock `libnvidia-ml.so.1`: the NVML C entry points `nvml-wrapper` uses, answered
//! from `nvml-topology.json` beside the library file instead of from a driver.
//!
//! Semantics follow `nvml.h`: every query before init, or after the shutdown matching
//! the last init, returns `NVML_ERROR_UNINITIALIZED`; null out-pointers and unknown
//! handles are `INVALID_ARGUMENT`; short string buffers are `INSUFFICIENT_SIZE`.
//! MIG device handles answer identity queries (UUID, name, index, GPU/compute
//! instance ids, parent), their memory, and the board properties they share with their
//! GPU (PCI info, brand, architecture, compute capability); the per-GPU queries (minor
//! number, MIG mode, MIG enumeration and GPU instances) need the parent's handle. GPU and
//! compute instances are made and removed too ([`instances`]), and the change kept on the node.
//! GPUs take per-cgroup memory limits (`memory_limits`), unless built without the
//! `memory-limits` feature, as a driver from before CUDA 13.4 lacks the calls.

// Each entry point's `# Safety` doc is its C contract; its unsafe blocks only pass that
// contract on to the pointer writers, so they carry no comment of their own.
#![allow(clippy::undocumented_unsafe_blocks)]

mod device;
mod ffi;
mod handle;
mod instances;
#[cfg(feature = "memory-limits")]
mod memory_limits;
mod pci;
mod state;
mod status;
mod topology;

use std::ffi::{c_char, c_int, c_uint};

use device::Device;
use ffi::{fill_array, guard, read_str, with_device, with_topology, write, write_str};
use handle::{DeviceHandle, GpuInstanceHandle, Handle, InstanceHandle};
use status::Status;
use topology::MAX_MIG_DEVICES;

/// `nvmlPciInfo_t` as `nvmlDeviceGetPciInfo_v3` fills it.
#[repr(C)]
pub struct NvmlPciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct NvmlMemoryV2 {
    version: c_uint,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

/// `nvmlGpuInstancePlacement_t`.
#[repr(C)]
pub struct NvmlGpuInstancePlacement {
    pub(crate) start: c_uint,
    pub(crate) size: c_uint,
}

/// `nvmlGpuInstanceInfo_t`.
#[repr(C)]
pub struct NvmlGpuInstanceInfo {
    device: DeviceHandle,
    id: c_uint,
    profile_id: c_uint,
    placement: NvmlGpuInstancePlacement,
}

/// `NVML_STRUCT_VERSION(Memory, 2)`: the struct's size with the version in the top byte.
const MEMORY_V2_VERSION: c_uint = (std::mem::size_of::<NvmlMemoryV2>() | 2 << 24) as c_uint;

/// `NVML_DEVICE_MIG_ENABLE` / `NVML_DEVICE_MIG_DISABLE`.
const MIG_ENABLE: c_uint = 1;
const MIG_DISABLE: c_uint = 0;

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> Status {
    guard(state::init)
}

/// Flags only tune which GPUs attach; the mock has nothing to attach.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Status {
    guard(state::init)
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit() -> Status {
    guard(state::init)
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> Status {
    guard(state::shutdown)
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: c_uint) -> *const c_char {
    Status(result).description().as_ptr()
}

/// # Safety
/// `version` is null or writable for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> Status {
    guard(|| with_topology(|t| unsafe { write_str(version, length, &t.driver_version) }))
}

/// # Safety
/// `version` is null or writable for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> Status {
    guard(|| with_topology(|t| unsafe { write_str(version, length, &t.nvml_version()) }))
}

/// # Safety
/// `version` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> Status {
    guard(|| with_topology(|t| unsafe { write(version, t.cuda_driver_version) }))
}

/// # Safety
/// `version` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> Status {
    guard(|| with_topology(|t| unsafe { write(version, t.cuda_driver_version) }))
}

/// # Safety
/// `count` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> Status {
    // The topology holds at most MAX_GPUS, so the count always fits.
    guard(|| with_topology(|t| unsafe { write(count, t.gpus.len() as c_uint) }))
}

/// # Safety
/// `device` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut DeviceHandle,
) -> Status {
    guard(|| {
        with_topology(|t| unsafe { write(device, Device::by_index(t, index)?.handle().to_raw()) })
    })
}

/// # Safety
/// `uuid` is null or NUL-terminated; `device` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut DeviceHandle,
) -> Status {
    guard(|| {
        with_topology(|t| unsafe {
            let found = Device::by_uuid(t, read_str(uuid)?)?;
            write(device, found.handle().to_raw())
        })
    })
}

/// # Safety
/// `bus_id` is null or NUL-terminated; `device` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    device: *mut DeviceHandle,
) -> Status {
    guard(|| {
        with_topology(|t| unsafe {
            let found = Device::by_bus_id(t, read_str(bus_id)?)?;
            write(device, found.handle().to_raw())
        })
    })
}

/// # Safety
/// `uuid` is null or writable for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: DeviceHandle,
    uuid: *mut c_char,
    length: c_uint,
) -> Status {
    guard(|| with_device(device, |_, d| unsafe { write_str(uuid, length, d.uuid()) }))
}

/// # Safety
/// `name` is null or writable for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: DeviceHandle,
    name: *mut c_char,
    length: c_uint,
) -> Status {
    guard(|| with_device(device, |_, d| unsafe { write_str(name, length, d.name()) }))
}

/// # Safety
/// `index` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: DeviceHandle, index: *mut c_uint) -> Status {
    guard(|| with_device(device, |_, d| unsafe { write(index, d.index()) }))
}

/// A MIG device has no `/dev/nvidia<minor>` of its own; its GPU's minor is the one. On WSL2
/// no GPU has one, and NVML answers NOT_SUPPORTED.
///
/// # Safety
/// `minor` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: DeviceHandle,
    minor: *mut c_uint,
) -> Status {
    guard(|| {
        with_device(device, |topology, d| unsafe {
            if topology.wsl {
                return Err(Status::NOT_SUPPORTED);
            }
            write(minor, d.physical(Status::NOT_SUPPORTED)?.minor)
        })
    })
}

/// # Safety
/// `brand` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBrand(device: DeviceHandle, brand: *mut c_uint) -> Status {
    guard(|| with_device(device, |_, d| unsafe { write(brand, d.board().brand) }))
}

/// # Safety
/// `arch` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetArchitecture(
    device: DeviceHandle,
    arch: *mut c_uint,
) -> Status {
    guard(|| {
        with_device(device, |_, d| unsafe {
            write(arch, d.board().architecture)
        })
    })
}

/// # Safety
/// `major` and `minor` are null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: DeviceHandle,
    major: *mut c_int,
    minor: *mut c_int,
) -> Status {
    guard(|| {
        with_device(device, |_, d| unsafe {
            let [cc_major, cc_minor] = d.board().cuda_compute_capability;
            if minor.is_null() {
                return Err(Status::INVALID_ARGUMENT);
            }
            write(major, cc_major)?;
            write(minor, cc_minor)
        })
    })
}

/// # Safety
/// `pci` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: DeviceHandle,
    pci: *mut NvmlPciInfo,
) -> Status {
    guard(|| with_device(device, |_, d| unsafe { write(pci, pci_info(d)) }))
}

fn pci_info(device: Device<'_>) -> NvmlPciInfo {
    let gpu = device.board();
    let id = gpu.pci_bus_id;
    let mut info = NvmlPciInfo {
        bus_id_legacy: [0; 16],
        domain: id.domain,
        bus: id.bus,
        device: id.device,
        pci_device_id: gpu.pci_device_id,
        // The topology does not model the subsystem id; 0 is what unknown reads as.
        pci_sub_system_id: 0,
        bus_id: [0; 32],
    };
    fill_array(&mut info.bus_id_legacy, &id.legacy());
    fill_array(&mut info.bus_id, &id.canonical());
    info
}

/// A GPU's or MIG device's framebuffer, all of it free: the mock runs nothing.
///
/// # Safety
/// `memory` is null or valid for reads and writes of an `nvmlMemory_v2_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: DeviceHandle,
    memory: *mut NvmlMemoryV2,
) -> Status {
    guard(|| {
        with_device(device, |_, d| unsafe {
            let total = match d {
                Device::Gpu { gpu, .. } => gpu.memory_total,
                Device::Mig { mig, .. } => mig.memory_total,
            }
            .ok_or(Status::NOT_SUPPORTED)?;
            if memory.is_null() {
                return Err(Status::INVALID_ARGUMENT);
            }
            if (*memory).version != MEMORY_V2_VERSION {
                return Err(Status::ARGUMENT_VERSION_MISMATCH);
            }
            write(
                memory,
                NvmlMemoryV2 {
                    version: MEMORY_V2_VERSION,
                    total,
                    reserved: 0,
                    free: total,
                    used: 0,
                },
            )
        })
    })
}

/// # Safety
/// `mode` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(
    device: DeviceHandle,
    mode: *mut c_uint,
) -> Status {
    guard(|| {
        with_device(device, |_, d| unsafe {
            let enabled = d
                .physical(Status::NOT_SUPPORTED)?
                .persistence_mode
                .ok_or(Status::NOT_SUPPORTED)?;
            write(mode, c_uint::from(enabled))
        })
    })
}

/// # Safety
/// `current` and `pending` are null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: DeviceHandle,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> Status {
    guard(|| {
        with_device(device, |_, d| unsafe {
            let mode = if d.physical(Status::NOT_SUPPORTED)?.mig_enabled() {
                MIG_ENABLE
            } else {
                MIG_DISABLE
            };
            if pending.is_null() {
                return Err(Status::INVALID_ARGUMENT);
            }
            write(current, mode)?;
            write(pending, mode)
        })
    })
}

/// # Safety
/// `count` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: DeviceHandle,
    count: *mut c_uint,
) -> Status {
    guard(|| {
        with_device(device, |_, d| unsafe {
            let max = if d.physical(Status::INVALID_ARGUMENT)?.mig_enabled() {
                MAX_MIG_DEVICES
            } else {
                0
            };
            write(count, max as c_uint)
        })
    })
}

/// # Safety
/// `mig_device` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: DeviceHandle,
    index: c_uint,
    mig_device: *mut DeviceHandle,
) -> Status {
    guard(|| {
        with_device(device, |_, d| unsafe {
            write(mig_device, d.mig_by_index(index)?.handle().to_raw())
        })
    })
}

/// # Safety
/// `device` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig_device: DeviceHandle,
    device: *mut DeviceHandle,
) -> Status {
    guard(|| {
        with_device(mig_device, |t, d| unsafe {
            write(device, d.parent(t)?.handle().to_raw())
        })
    })
}

/// # Safety
/// `is_mig` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: DeviceHandle,
    is_mig: *mut c_uint,
) -> Status {
    guard(|| {
        with_device(device, |_, d| unsafe {
            write(is_mig, c_uint::from(matches!(d, Device::Mig { .. })))
        })
    })
}

/// # Safety
/// `id` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: DeviceHandle,
    id: *mut c_uint,
) -> Status {
    guard(|| {
        with_device(device, |_, d| unsafe {
            write(id, d.mig_device(Status::NOT_SUPPORTED)?.gpu_instance_id)
        })
    })
}

/// # Safety
/// `id` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: DeviceHandle,
    id: *mut c_uint,
) -> Status {
    guard(|| {
        with_device(device, |_, d| unsafe {
            write(id, d.mig_device(Status::NOT_SUPPORTED)?.compute_instance_id)
        })
    })
}

/// Instances a topology does not describe are not found, as for a caller the real library
/// does not let handle GPU instances.
///
/// # Safety
/// `instance` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: DeviceHandle,
    id: c_uint,
    instance: *mut GpuInstanceHandle,
) -> Status {
    guard(|| {
        with_device(device, |_, d| unsafe {
            let Device::Gpu { index, gpu } = d else {
                return Err(Status::INVALID_ARGUMENT);
            };
            if !gpu.mig_enabled() {
                return Err(Status::NOT_SUPPORTED);
            }
            gpu.gpu_instance(id).ok_or(Status::NOT_FOUND)?;
            let handle = InstanceHandle {
                gpu: index,
                id: usize::try_from(id).map_err(|_| Status::INVALID_ARGUMENT)?,
            };
            write(instance, handle.to_raw())
        })
    })
}

/// # Safety
/// `info` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    instance: GpuInstanceHandle,
    info: *mut NvmlGpuInstanceInfo,
) -> Status {
    guard(|| {
        with_topology(|t| unsafe {
            let handle = InstanceHandle::from_raw(instance).ok_or(Status::INVALID_ARGUMENT)?;
            let id = c_uint::try_from(handle.id).map_err(|_| Status::INVALID_ARGUMENT)?;
            // A handle from before a re-init whose topology lost the instance is stale.
            let found = t
                .gpus
                .get(handle.gpu)
                .and_then(|gpu| gpu.gpu_instance(id))
                .ok_or(Status::INVALID_ARGUMENT)?;
            write(
                info,
                NvmlGpuInstanceInfo {
                    device: Handle::Gpu(handle.gpu).to_raw(),
                    id,
                    profile_id: found.profile_id,
                    placement: NvmlGpuInstancePlacement {
                        start: found.placement_start,
                        size: found.placement_size,
                    },
                },
            )
        })
    })
}
