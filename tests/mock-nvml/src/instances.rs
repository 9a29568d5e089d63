//! MIG instances made and removed: GPU instances at a placement and compute instances in them,
//! with the A100-80GB's profiles and NVML's return codes. Each change is kept in the topology
//! file and shown on the node as the driver shows it (capability files under the proc root,
//! nvidia-caps nodes under the dev root), laid out by the same rules simnode follows
//! ([`simmig`]), so that a later process sees the MIG device as if it had been there all along.

#![allow(clippy::undocumented_unsafe_blocks)]

use std::ffi::{c_char, c_uint};
use std::io;
use std::path::Path;

use simmig::{COMPUTE_PROFILE_SLICES, MULTIPROCESSORS_PER_SLICE, Profile};

use crate::NvmlGpuInstancePlacement;
use crate::device::Device;
use crate::ffi::{fill_array, guard, with_device, with_topology, write};
use crate::handle::{
    ComputeHandle, ComputeInstanceHandle, DeviceHandle, GpuInstanceHandle, Handle, InstanceHandle,
};
use crate::state;
use crate::status::{NvmlResult, Status};
use crate::topology::{
    EmptyGpuInstance, Gpu, GpuInstance, MAX_COMPUTE_INSTANCES, MAX_MIG_DEVICES, MigDevice,
    NodeLayout, Topology,
};

/// `NVML_GPU_INSTANCE_PROFILE_COUNT`: indices from here on are invalid, below it unsupported
/// where the A100 lacks them.
const GPU_INSTANCE_PROFILE_COUNT: c_uint = 0x12;
/// `NVML_COMPUTE_INSTANCE_PROFILE_COUNT`.
const COMPUTE_INSTANCE_PROFILE_COUNT: c_uint = 0x9;
/// `NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED`, the only engine profile.
const ENGINE_PROFILE_SHARED: c_uint = 0;

/// `nvmlGpuInstanceProfileInfo_v2_t`.
#[repr(C)]
pub struct NvmlGpuInstanceProfileInfoV2 {
    version: c_uint,
    id: c_uint,
    is_p2p_supported: c_uint,
    slice_count: c_uint,
    instance_count: c_uint,
    multiprocessor_count: c_uint,
    copy_engine_count: c_uint,
    decoder_count: c_uint,
    encoder_count: c_uint,
    jpeg_count: c_uint,
    ofa_count: c_uint,
    memory_size_mb: u64,
    name: [c_char; 96],
}

/// `NVML_STRUCT_VERSION(GpuInstanceProfileInfo, 2)`.
const PROFILE_INFO_V2: c_uint =
    (std::mem::size_of::<NvmlGpuInstanceProfileInfoV2>() | 2 << 24) as c_uint;

/// `nvmlComputeInstanceProfileInfo_t`.
#[repr(C)]
pub struct NvmlComputeInstanceProfileInfo {
    id: c_uint,
    slice_count: c_uint,
    instance_count: c_uint,
    multiprocessor_count: c_uint,
    shared_copy_engine_count: c_uint,
    shared_decoder_count: c_uint,
    shared_encoder_count: c_uint,
    shared_jpeg_count: c_uint,
    shared_ofa_count: c_uint,
}

/// `nvmlComputeInstanceInfo_t`.
#[repr(C)]
pub struct NvmlComputeInstanceInfo {
    device: DeviceHandle,
    gpu_instance: GpuInstanceHandle,
    id: c_uint,
    profile_id: c_uint,
    placement: NvmlGpuInstancePlacement,
}

/// The NVML index of the physical GPU a handle names; a MIG handle is an invalid argument.
fn gpu_index(raw: DeviceHandle) -> NvmlResult<usize> {
    let mut found = None;
    with_device(raw, |_, device| match device {
        Device::Gpu { index, .. } => {
            found = Some(index);
            Ok(())
        }
        Device::Mig { .. } => Err(Status::INVALID_ARGUMENT),
    })?;
    found.ok_or(Status::INVALID_ARGUMENT)
}

fn gpu_mut(topology: &mut Topology, index: usize) -> NvmlResult<&mut Gpu> {
    topology.gpus.get_mut(index).ok_or(Status::INVALID_ARGUMENT)
}

/// The GPU instance a handle names, with its GPU, as the topology has it now.
fn with_instance<T>(
    raw: GpuInstanceHandle,
    query: impl FnOnce(&Gpu, InstanceHandle, GpuInstance) -> NvmlResult<T>,
) -> NvmlResult<T> {
    let handle = InstanceHandle::from_raw(raw).ok_or(Status::INVALID_ARGUMENT)?;
    let mut answer = None;
    with_topology(|t| {
        let gpu = t.gpus.get(handle.gpu).ok_or(Status::INVALID_ARGUMENT)?;
        let id = c_uint::try_from(handle.id).map_err(|_| Status::INVALID_ARGUMENT)?;
        // A handle to an instance destroyed since is stale.
        let instance = gpu.gpu_instance(id).ok_or(Status::INVALID_ARGUMENT)?;
        answer = Some(query(gpu, handle, instance)?);
        Ok(())
    })?;
    answer.ok_or(Status::UNKNOWN)
}

/// The profile of a GPU instance the topology describes.
fn profile_of(instance: GpuInstance) -> NvmlResult<&'static Profile> {
    Profile::by_id(instance.profile_id).ok_or(Status::UNKNOWN)
}

/// The compute slices of compute instance profile `id` in a GPU instance of `profile`.
fn compute_slices(id: c_uint, profile: &Profile) -> NvmlResult<u32> {
    if id >= COMPUTE_INSTANCE_PROFILE_COUNT {
        return Err(Status::INVALID_ARGUMENT);
    }
    let slices = usize::try_from(id)
        .ok()
        .and_then(|i| COMPUTE_PROFILE_SLICES.get(i).copied());
    slices
        .filter(|&s| s <= profile.slices)
        .ok_or(Status::NOT_SUPPORTED)
}

/// The compute slices MIG device `mig` holds in its GPU instance of `profile`.
fn slices_held(mig: &MigDevice, profile: &Profile) -> u32 {
    mig.compute_profile_id
        .and_then(|id| compute_slices(id, profile).ok())
        .unwrap_or(profile.slices)
}

/// Makes a GPU instance of `profile_id` at `placement` on `gpu`, with no compute instance yet.
fn place_gpu_instance(
    gpu: &mut Gpu,
    profile_id: u32,
    placement: &NvmlGpuInstancePlacement,
) -> NvmlResult<u32> {
    if !gpu.mig_enabled() {
        return Err(Status::NOT_SUPPORTED);
    }
    let profile = Profile::by_id(profile_id).ok_or(Status::INVALID_ARGUMENT)?;
    let (start, size) = (placement.start, placement.size);
    if size != profile.size || !profile.starts.contains(&start) {
        return Err(Status::INVALID_ARGUMENT);
    }
    let mut instances: Vec<(u32, GpuInstance)> = gpu.gpu_instances().collect();
    instances.sort_by_key(|&(id, _)| id);
    instances.dedup_by_key(|&mut (id, _)| id);
    let overlaps = instances.iter().any(|(_, i)| {
        start < i.placement_start + i.placement_size && i.placement_start < start + size
    });
    let of_profile = instances
        .iter()
        .filter(|(_, i)| i.profile_id == profile_id)
        .count();
    if overlaps || of_profile >= profile.instances as usize {
        return Err(Status::INSUFFICIENT_RESOURCES);
    }
    let id = simmig::gpu_instance_id(start, size).ok_or(Status::INVALID_ARGUMENT)?;
    gpu.empty_gpu_instances.push(EmptyGpuInstance {
        id,
        instance: GpuInstance {
            profile_id,
            placement_start: start,
            placement_size: size,
        },
    });
    Ok(id)
}

/// Makes a compute instance of profile `ci_profile` in GPU instance `gi` of `gpu`: a new MIG
/// device, listed in (GI, CI) order as NVML lists them.
fn place_compute_instance(gpu: &mut Gpu, gi: u32, ci_profile: c_uint) -> NvmlResult<u32> {
    let instance = gpu.gpu_instance(gi).ok_or(Status::INVALID_ARGUMENT)?;
    let profile = profile_of(instance)?;
    let slices = compute_slices(ci_profile, profile)?;
    let held: u32 = gpu
        .mig_devices
        .iter()
        .filter(|m| m.gpu_instance_id == gi)
        .map(|m| slices_held(m, profile))
        .sum();
    if held + slices > profile.slices || gpu.mig_devices.len() >= MAX_MIG_DEVICES {
        return Err(Status::INSUFFICIENT_RESOURCES);
    }
    let taken = |ci: u32| {
        gpu.mig_devices
            .iter()
            .any(|m| m.gpu_instance_id == gi && m.compute_instance_id == ci)
    };
    let ci = (0..MAX_COMPUTE_INSTANCES as u32)
        .find(|&ci| !taken(ci))
        .ok_or(Status::INSUFFICIENT_RESOURCES)?;
    let full = slices == profile.slices;
    let name = match full {
        true => profile.name.to_owned(),
        false => format!("{slices}c.{}", profile.name),
    };
    let mig = MigDevice {
        uuid: format!("MIG-{}", simmig::uuid_hex(new_seed(gpu.minor, gi, ci))),
        gpu_instance_id: gi,
        compute_instance_id: ci,
        name: format!("{} MIG {name}", gpu.name),
        gpu_instance: Some(instance),
        memory_total: Some(profile.memory_mib << 20),
        compute_profile_id: (!full).then_some(ci_profile),
    };
    gpu.empty_gpu_instances.retain(|e| e.id != gi);
    let at = gpu
        .mig_devices
        .partition_point(|m| (m.gpu_instance_id, m.compute_instance_id) < (gi, ci));
    gpu.mig_devices.insert(at, mig);
    Ok(ci)
}

/// A seed no earlier MIG device had: a real driver gives each new one a new UUID.
fn new_seed(gpu_minor: u32, gi: u32, ci: u32) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (1 << 62 | u64::from(gpu_minor) << 16 | u64::from(gi) << 8 | u64::from(ci)) ^ nanos << 20
}

/// Removes compute instance `ci` of GPU instance `gi`; the GPU instance stays, empty when it
/// was the last.
fn remove_compute_instance(gpu: &mut Gpu, gi: u32, ci: u32) -> NvmlResult {
    let at = gpu
        .mig_devices
        .iter()
        .position(|m| m.gpu_instance_id == gi && m.compute_instance_id == ci)
        .ok_or(Status::INVALID_ARGUMENT)?;
    let removed = gpu.mig_devices.remove(at);
    let last = !gpu.mig_devices.iter().any(|m| m.gpu_instance_id == gi);
    if let (true, Some(instance)) = (last, removed.gpu_instance) {
        gpu.empty_gpu_instances
            .push(EmptyGpuInstance { id: gi, instance });
    }
    Ok(())
}

/// Removes GPU instance `gi`, which must hold no compute instance.
fn remove_gpu_instance(gpu: &mut Gpu, gi: u32) -> NvmlResult {
    if gpu.mig_devices.iter().any(|m| m.gpu_instance_id == gi) {
        return Err(Status::IN_USE);
    }
    let before = gpu.empty_gpu_instances.len();
    gpu.empty_gpu_instances.retain(|e| e.id != gi);
    match gpu.empty_gpu_instances.len() < before {
        true => Ok(()),
        false => Err(Status::INVALID_ARGUMENT),
    }
}

fn io_status(error: &io::Error) -> Status {
    match error.kind() {
        io::ErrorKind::PermissionDenied => Status::NO_PERMISSION,
        _ => Status::UNKNOWN,
    }
}

/// Shows a new instance's capability: its access file, and its nvidia-caps node.
fn show(node: Option<&NodeLayout>, access: &str, minor: u32) -> NvmlResult {
    let Some(node) = node else { return Ok(()) };
    let file = node.capabilities.join(access);
    let made = file
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(&file, simmig::capability_text(minor, simmig::ACCESS_MODE)))
        .and_then(|()| std::fs::create_dir_all(&node.caps_dev));
    made.map_err(|e| io_status(&e))?;
    let path = node.caps_dev.join(simmig::cap_node_name(minor));
    match simmig::mknod(&path, node.caps_major, minor, simmig::ACCESS_MODE) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(io_status(&e)),
        _ => Ok(()),
    }
}

/// Hides a removed instance: its directory under the capabilities (the access file's), and its
/// nvidia-caps node.
fn hide(node: Option<&NodeLayout>, access: &str, minor: u32) -> NvmlResult {
    let Some(node) = node else { return Ok(()) };
    let dir = Path::new(access).parent().ok_or(Status::UNKNOWN)?;
    let removed = [
        std::fs::remove_dir_all(node.capabilities.join(dir)),
        std::fs::remove_file(node.caps_dev.join(simmig::cap_node_name(minor))),
    ];
    match removed.into_iter().find_map(Result::err) {
        Some(e) if e.kind() != io::ErrorKind::NotFound => Err(io_status(&e)),
        _ => Ok(()),
    }
}

/// # Safety
/// `info` is null or valid for reads and writes of an `nvmlGpuInstanceProfileInfo_v2_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoV(
    device: DeviceHandle,
    profile: c_uint,
    info: *mut NvmlGpuInstanceProfileInfoV2,
) -> Status {
    guard(|| {
        with_device(device, |_, d| unsafe {
            let gpu = d.physical(Status::INVALID_ARGUMENT)?;
            if info.is_null() || (*info).version != PROFILE_INFO_V2 {
                return Err(Status::INVALID_ARGUMENT);
            }
            if profile >= GPU_INSTANCE_PROFILE_COUNT {
                return Err(Status::INVALID_ARGUMENT);
            }
            if !gpu.mig_enabled() {
                return Err(Status::NOT_SUPPORTED);
            }
            let p = Profile::by_index(profile).ok_or(Status::NOT_SUPPORTED)?;
            let mut answer = NvmlGpuInstanceProfileInfoV2 {
                version: PROFILE_INFO_V2,
                id: p.id,
                is_p2p_supported: 0,
                slice_count: p.slices,
                instance_count: p.instances,
                multiprocessor_count: p.multiprocessors,
                copy_engine_count: p.copy_engines,
                decoder_count: p.decoders,
                encoder_count: p.encoders,
                jpeg_count: p.jpegs,
                ofa_count: p.ofas,
                memory_size_mb: p.memory_mib,
                name: [0; 96],
            };
            fill_array(&mut answer.name, &format!("MIG {}", p.name));
            write(info, answer)
        })
    })
}

/// Every placement of a profile, whether MIG is on or not, as NVML documents.
///
/// # Safety
/// `count` is null or valid for reads and writes; `placements` is null or valid for writes of
/// `*count` placements.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    device: DeviceHandle,
    profile_id: c_uint,
    placements: *mut NvmlGpuInstancePlacement,
    count: *mut c_uint,
) -> Status {
    guard(|| {
        with_device(device, |_, d| unsafe {
            d.physical(Status::INVALID_ARGUMENT)?;
            if count.is_null() {
                return Err(Status::INVALID_ARGUMENT);
            }
            let p = Profile::by_id(profile_id).ok_or(Status::NOT_SUPPORTED)?;
            let n = p.starts.len() as c_uint;
            if !placements.is_null() {
                if *count < n {
                    return Err(Status::INSUFFICIENT_SIZE);
                }
                for (i, &start) in p.starts.iter().enumerate() {
                    placements.add(i).write(NvmlGpuInstancePlacement {
                        start,
                        size: p.size,
                    });
                }
            }
            write(count, n)
        })
    })
}

/// # Safety
/// `placement` is null or valid for a read; `instance` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    device: DeviceHandle,
    profile_id: c_uint,
    placement: *const NvmlGpuInstancePlacement,
    instance: *mut GpuInstanceHandle,
) -> Status {
    guard(|| {
        let gpu = gpu_index(device)?;
        if placement.is_null() || instance.is_null() {
            return Err(Status::INVALID_ARGUMENT);
        }
        let placement = unsafe { &*placement };
        let id = state::update(|t| {
            let node = t.node.clone();
            let target = gpu_mut(t, gpu)?;
            let id = place_gpu_instance(target, profile_id, placement)?;
            let minor = target.minor;
            show(
                node.as_ref(),
                &simmig::gi_access_path(minor, id),
                simmig::gi_access_minor(minor, id),
            )?;
            Ok(id)
        })?;
        let handle = InstanceHandle {
            gpu,
            id: id as usize,
        };
        unsafe { write(instance, handle.to_raw()) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlGpuInstanceDestroy(instance: GpuInstanceHandle) -> Status {
    guard(|| {
        let handle = with_instance(instance, |_, handle, _| Ok(handle))?;
        state::update(|t| {
            let node = t.node.clone();
            let gpu = gpu_mut(t, handle.gpu)?;
            let gi = handle.id as u32;
            remove_gpu_instance(gpu, gi)?;
            let minor = gpu.minor;
            hide(
                node.as_ref(),
                &simmig::gi_access_path(minor, gi),
                simmig::gi_access_minor(minor, gi),
            )
        })
    })
}

/// # Safety
/// `info` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    instance: GpuInstanceHandle,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut NvmlComputeInstanceProfileInfo,
) -> Status {
    guard(|| {
        with_instance(instance, |_, _, gi| unsafe {
            if eng_profile != ENGINE_PROFILE_SHARED {
                return Err(Status::INVALID_ARGUMENT);
            }
            let p = profile_of(gi)?;
            let slices = compute_slices(profile, p)?;
            write(
                info,
                NvmlComputeInstanceProfileInfo {
                    id: profile,
                    slice_count: slices,
                    instance_count: p.slices / slices,
                    multiprocessor_count: slices * MULTIPROCESSORS_PER_SLICE,
                    shared_copy_engine_count: p.copy_engines,
                    shared_decoder_count: p.decoders,
                    shared_encoder_count: p.encoders,
                    shared_jpeg_count: p.jpegs,
                    shared_ofa_count: p.ofas,
                },
            )
        })
    })
}

/// # Safety
/// `compute` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    instance: GpuInstanceHandle,
    profile_id: c_uint,
    compute: *mut ComputeInstanceHandle,
) -> Status {
    guard(|| {
        let handle = with_instance(instance, |_, handle, _| Ok(handle))?;
        if compute.is_null() {
            return Err(Status::INVALID_ARGUMENT);
        }
        let gi = handle.id as u32;
        let ci = state::update(|t| {
            let node = t.node.clone();
            let gpu = gpu_mut(t, handle.gpu)?;
            let ci = place_compute_instance(gpu, gi, profile_id)?;
            let minor = gpu.minor;
            show(
                node.as_ref(),
                &simmig::ci_access_path(minor, gi, ci),
                simmig::ci_access_minor(minor, gi, ci),
            )?;
            Ok(ci)
        })?;
        let made = ComputeHandle {
            gpu: handle.gpu,
            gi: handle.id,
            ci: ci as usize,
        };
        unsafe { write(compute, made.to_raw()) }
    })
}

/// The MIG device a compute instance handle names, as the topology has it now.
fn compute_instance(raw: ComputeInstanceHandle) -> NvmlResult<(ComputeHandle, MigDevice)> {
    let handle = ComputeHandle::from_raw(raw).ok_or(Status::INVALID_ARGUMENT)?;
    let mut found = None;
    with_topology(|t| {
        let gpu = t.gpus.get(handle.gpu).ok_or(Status::INVALID_ARGUMENT)?;
        found = gpu
            .mig_devices()
            .iter()
            .find(|m| {
                m.gpu_instance_id as usize == handle.gi
                    && m.compute_instance_id as usize == handle.ci
            })
            .cloned();
        Ok(())
    })?;
    // A handle to an instance destroyed since is stale.
    Ok((handle, found.ok_or(Status::INVALID_ARGUMENT)?))
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlComputeInstanceDestroy(compute: ComputeInstanceHandle) -> Status {
    guard(|| {
        let (handle, _) = compute_instance(compute)?;
        let (gi, ci) = (handle.gi as u32, handle.ci as u32);
        state::update(|t| {
            let node = t.node.clone();
            let gpu = gpu_mut(t, handle.gpu)?;
            remove_compute_instance(gpu, gi, ci)?;
            let minor = gpu.minor;
            hide(
                node.as_ref(),
                &simmig::ci_access_path(minor, gi, ci),
                simmig::ci_access_minor(minor, gi, ci),
            )
        })
    })
}

/// # Safety
/// `compute` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceById(
    instance: GpuInstanceHandle,
    id: c_uint,
    compute: *mut ComputeInstanceHandle,
) -> Status {
    guard(|| {
        with_instance(instance, |gpu, handle, _| unsafe {
            let gi = handle.id as u32;
            let found = gpu
                .mig_devices()
                .iter()
                .any(|m| m.gpu_instance_id == gi && m.compute_instance_id == id);
            if !found {
                return Err(Status::NOT_FOUND);
            }
            let made = ComputeHandle {
                gpu: handle.gpu,
                gi: handle.id,
                ci: id as usize,
            };
            write(compute, made.to_raw())
        })
    })
}

/// # Safety
/// `info` is null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(
    compute: ComputeInstanceHandle,
    info: *mut NvmlComputeInstanceInfo,
) -> Status {
    guard(|| {
        let (handle, mig) = compute_instance(compute)?;
        let instance = mig.gpu_instance.ok_or(Status::INVALID_ARGUMENT)?;
        let profile = profile_of(instance)?;
        let slices = slices_held(&mig, profile);
        let full_profile = COMPUTE_PROFILE_SLICES
            .iter()
            .position(|&s| s == profile.slices)
            .ok_or(Status::UNKNOWN)? as c_uint;
        let gi = InstanceHandle {
            gpu: handle.gpu,
            id: handle.gi,
        };
        unsafe {
            write(
                info,
                NvmlComputeInstanceInfo {
                    device: Handle::Gpu(handle.gpu).to_raw(),
                    gpu_instance: gi.to_raw(),
                    id: mig.compute_instance_id,
                    profile_id: mig.compute_profile_id.unwrap_or(full_profile),
                    // Where in the GPU instance the compute slices sit: the mock keeps no place.
                    placement: NvmlGpuInstancePlacement {
                        start: 0,
                        size: slices,
                    },
                },
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pci::BusId;

    fn gpu(mig_mode: u32) -> Gpu {
        let json = serde_json::json!({
            "uuid": "GPU-0", "minor": 0, "pci_bus_id": "0000:18:00.0", "pci_device_id": 1,
            "name": "NVIDIA A100-SXM4-80GB", "brand": 2, "architecture": 7,
            "cuda_compute_capability": [8, 0], "mig_mode": mig_mode
        });
        let gpu: Gpu = serde_json::from_value(json).unwrap();
        assert_eq!(gpu.pci_bus_id, BusId::parse("0000:18:00.0").unwrap());
        gpu
    }

    fn at(start: u32, size: u32) -> NvmlGpuInstancePlacement {
        NvmlGpuInstancePlacement { start, size }
    }

    /// A GPU instance of `profile` at `start`, filled with one compute instance spanning it.
    fn mig(gpu: &mut Gpu, profile: u32, start: u32) -> NvmlResult<(u32, u32)> {
        let size = Profile::by_id(profile).unwrap().size;
        let gi = place_gpu_instance(gpu, profile, &at(start, size))?;
        let slices = profile_of(gpu.gpu_instance(gi).unwrap())?.slices;
        let full = COMPUTE_PROFILE_SLICES
            .iter()
            .position(|&s| s == slices)
            .unwrap();
        Ok((gi, place_compute_instance(gpu, gi, full as c_uint)?))
    }

    #[test]
    fn instances_take_their_placement_and_overlaps_are_refused() {
        let mut gpu = gpu(1);
        assert_eq!(mig(&mut gpu, 19, 3), Ok((10, 0)), "1g.10gb at 3 is GI 10");
        assert_eq!(mig(&mut gpu, 9, 4), Ok((1, 0)), "3g.40gb at 4 is GI 1");
        assert_eq!(
            mig(&mut gpu, 14, 2),
            Err(Status::INSUFFICIENT_RESOURCES),
            "2g.20gb at 2 overlaps slice 3"
        );
        assert_eq!(gpu.mig_devices.len(), 2);
        assert!(gpu.empty_gpu_instances.is_empty(), "nothing half made");
        let names: Vec<&str> = gpu.mig_devices.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
                "NVIDIA A100-SXM4-80GB MIG 1g.10gb"
            ],
            "in GI order"
        );
    }

    #[test]
    fn bad_profiles_and_placements_are_invalid_and_mig_off_unsupported() {
        let mut on = gpu(1);
        assert_eq!(
            place_gpu_instance(&mut on, 9, &at(2, 4)),
            Err(Status::INVALID_ARGUMENT)
        );
        assert_eq!(
            place_gpu_instance(&mut on, 9, &at(4, 2)),
            Err(Status::INVALID_ARGUMENT)
        );
        assert_eq!(
            place_gpu_instance(&mut on, 42, &at(0, 1)),
            Err(Status::INVALID_ARGUMENT)
        );
        assert_eq!(
            place_gpu_instance(&mut gpu(0), 19, &at(0, 1)),
            Err(Status::NOT_SUPPORTED)
        );
        assert_eq!(mig(&mut on, 20, 0), Ok((13, 0)));
        assert_eq!(
            mig(&mut on, 20, 1),
            Err(Status::INSUFFICIENT_RESOURCES),
            "one 1g.10gb+me per GPU"
        );
    }

    #[test]
    fn destroying_the_compute_instance_leaves_the_gpu_instance_until_it_goes_too() {
        let mut gpu = gpu(1);
        let (gi, ci) = mig(&mut gpu, 9, 0).unwrap();
        assert_eq!(remove_gpu_instance(&mut gpu, gi), Err(Status::IN_USE));
        remove_compute_instance(&mut gpu, gi, ci).unwrap();
        assert!(gpu.mig_devices.is_empty());
        assert!(gpu.gpu_instance(gi).is_some(), "the GPU instance stays");
        remove_gpu_instance(&mut gpu, gi).unwrap();
        assert!(gpu.gpu_instance(gi).is_none());
        assert_eq!(
            mig(&mut gpu, 0, 0),
            Ok((0, 0)),
            "the whole GPU is free again"
        );
    }

    #[test]
    fn compute_instances_share_their_gpu_instances_slices() {
        let mut gpu = gpu(1);
        let gi = place_gpu_instance(&mut gpu, 9, &at(4, 4)).unwrap();
        // Profile 1 is 2 slices, profile 0 one: 3g holds 3.
        assert_eq!(place_compute_instance(&mut gpu, gi, 1), Ok(0));
        assert_eq!(place_compute_instance(&mut gpu, gi, 0), Ok(1));
        assert_eq!(
            place_compute_instance(&mut gpu, gi, 0),
            Err(Status::INSUFFICIENT_RESOURCES)
        );
        assert_eq!(
            place_compute_instance(&mut gpu, gi, 4),
            Err(Status::NOT_SUPPORTED),
            "7 slices do not fit a 3g"
        );
        assert_eq!(
            gpu.mig_devices[0].name,
            "NVIDIA A100-SXM4-80GB MIG 2c.3g.40gb"
        );
    }
}
