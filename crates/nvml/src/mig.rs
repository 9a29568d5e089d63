//! MIG through NVML: the GPU instance profiles a GPU offers, and making and removing MIG
//! devices. nvml-wrapper has none of the instance calls, its profile query leaves out the
//! profile's name, and its `possible_placements` returns an empty list whatever NVML says, so
//! these go through its sys bindings.

use crate::query::instance_ids;
use nvhook_model::inventory::{
    CreatedMig, MigPlacement, MigProfile, NvmlActionFailure, nvml_return,
};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings as sys;
use std::ffi::{CStr, c_char};

/// `NVML_STRUCT_VERSION(GpuInstanceProfileInfo, 2)`: the struct's size, the version in the top
/// byte.
const PROFILE_INFO_V2: u32 =
    std::mem::size_of::<sys::nvmlGpuInstanceProfileInfo_v2_t>() as u32 | 2 << 24;

const SUCCESS: u32 = sys::nvmlReturn_enum_NVML_SUCCESS;

/// The GPU instance profiles `device` offers, each with every placement it can take. Only
/// Kubernetes DRA needs them, so a driver without these calls gives none, and a profile NVML
/// does not describe (NOT_SUPPORTED or INVALID_ARGUMENT for the indices a GPU lacks; NO_PERMISSION
/// for the placements of an unprivileged caller) is left out rather than failing the answer
/// every container start needs.
pub fn profiles(nvml: &Nvml, device: &Device) -> Vec<MigProfile> {
    let lib = nvml.lib();
    let (Ok(&get_info), Ok(&get_placements)) = (
        lib.nvmlDeviceGetGpuInstanceProfileInfoV.as_ref(),
        lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2.as_ref(),
    ) else {
        return Vec::new();
    };
    // SAFETY: the handle is live for `device`'s lifetime.
    let handle = unsafe { device.handle() };
    (0..sys::NVML_GPU_INSTANCE_PROFILE_COUNT)
        .filter_map(|index| {
            // SAFETY: all-zero is a valid nvmlGpuInstanceProfileInfo_v2_t (numbers and a name).
            let mut info: sys::nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
            info.version = PROFILE_INFO_V2;
            // SAFETY: a live handle and a struct of the version it names.
            (unsafe { get_info(handle, index, &mut info) } == SUCCESS).then_some(())?;
            let placements = possible_placements(get_placements, handle, info.id).ok()?;
            Some(MigProfile {
                id: info.id,
                name: MigProfile::name_in_nvml(&c_text(&info.name)).to_owned(),
                slices: info.sliceCount,
                memory_mib: info.memorySizeMB,
                multiprocessors: info.multiprocessorCount,
                copy_engines: info.copyEngineCount,
                decoders: info.decoderCount,
                encoders: info.encoderCount,
                jpegs: info.jpegCount,
                ofas: info.ofaCount,
                placements,
            })
        })
        .collect()
}

type PlacementsFn = unsafe extern "C" fn(
    sys::nvmlDevice_t,
    u32,
    *mut sys::nvmlGpuInstancePlacement_t,
    *mut u32,
) -> sys::nvmlReturn_t;

/// Every placement profile `profile_id` can take on the GPU, or NVML's return code.
fn possible_placements(
    get: PlacementsFn,
    handle: sys::nvmlDevice_t,
    profile_id: u32,
) -> Result<Vec<MigPlacement>, u32> {
    let mut count = 0;
    // SAFETY: a null buffer asks for the count only, which NVML writes to `count`.
    let rc = unsafe { get(handle, profile_id, std::ptr::null_mut(), &mut count) };
    if rc != SUCCESS {
        return Err(rc);
    }
    let empty = sys::nvmlGpuInstancePlacement_t { start: 0, size: 0 };
    let mut buf = vec![empty; count as usize];
    // SAFETY: the buffer holds `count` placements, as many as NVML said it has.
    let rc = unsafe { get(handle, profile_id, buf.as_mut_ptr(), &mut count) };
    if rc != SUCCESS {
        return Err(rc);
    }
    buf.truncate(count as usize);
    Ok(buf
        .into_iter()
        .map(|p| MigPlacement {
            start: p.start,
            size: p.size,
        })
        .collect())
}

fn c_text(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars.iter().map(|&c| c as u8).collect();
    CStr::from_bytes_until_nul(&bytes)
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The failure of a MIG call for NVML's return code `rc`.
fn failure(nvml: &Nvml, call: &str, rc: u32) -> NvmlActionFailure {
    crate::action::failure(nvml, call, "", rc, fix)
}

/// What to do about NVML's refusal of a MIG call.
fn fix(rc: u32) -> Option<&'static str> {
    Some(match rc {
        nvml_return::INVALID_ARGUMENT => {
            "no such profile or placement on this GPU (nvidia-smi mig -lgip and -lgipp list them)"
        }
        nvml_return::NOT_SUPPORTED => {
            "MIG mode is off on this GPU, or it lacks the profile: turn MIG on (nvidia-smi -i GPU -mig 1)"
        }
        nvml_return::NO_PERMISSION => "making and removing MIG devices needs root: run it as root",
        nvml_return::NOT_FOUND => "no such GPU, MIG device or instance (nvidia-smi -L lists them)",
        nvml_return::IN_USE => "processes still use it: stop them first (nvidia-smi lists them)",
        nvml_return::INSUFFICIENT_RESOURCES => {
            "the placement overlaps a GPU instance already there: pick a free placement (nvidia-smi mig -lgi lists the instances)"
        }
        _ => return None,
    })
}

/// A failure nvml-wrapper reported, with NVML's code where it carries one.
fn wrapper_failure(
    nvml: &Nvml,
    call: &str,
    error: nvml_wrapper::error::NvmlError,
) -> NvmlActionFailure {
    use nvml_wrapper::error::NvmlError;
    match error {
        NvmlError::FailedToLoadSymbol(_) | NvmlError::LibloadingError(_) => NvmlActionFailure {
            code: None,
            message: format!(
                "NVML {call} failed: {error} (the driver is too old for MIG; upgrade it)"
            ),
        },
        error => failure(nvml, call, error.into()),
    }
}

/// A symbol of the instance calls, or the failure of a driver that lacks it.
fn symbol<F: Copy, E: std::fmt::Display>(
    call: &'static str,
    sym: &Result<F, E>,
) -> Result<F, NvmlActionFailure> {
    sym.as_ref().copied().map_err(|e| NvmlActionFailure {
        code: None,
        message: format!(
            "NVML has no {call} ({e}): the driver is too old for MIG management; upgrade it"
        ),
    })
}

/// Makes a GPU instance of profile `profile_id` at placement `start` on GPU `gpu_uuid`, and one
/// compute instance spanning it; a GPU instance whose compute instance cannot be made is
/// destroyed again, so that nothing is left half made.
pub fn create(
    nvml: &Nvml,
    gpu_uuid: &str,
    profile_id: u32,
    start: u32,
) -> Result<CreatedMig, NvmlActionFailure> {
    let lib = nvml.lib();
    let gpu = nvml
        .device_by_uuid(gpu_uuid)
        .map_err(|e| wrapper_failure(nvml, "nvmlDeviceGetHandleByUUID", e))?;
    // SAFETY: the handle is live for `gpu`'s lifetime.
    let handle = unsafe { gpu.handle() };
    let placements_fn = symbol(
        "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
        &lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2,
    )?;
    let placements = possible_placements(placements_fn, handle, profile_id)
        .map_err(|rc| failure(nvml, "nvmlDeviceGetGpuInstancePossiblePlacements_v2", rc))?;
    let Some(placement) = placements.iter().find(|p| p.start == start) else {
        let starts: Vec<String> = placements.iter().map(|p| p.start.to_string()).collect();
        return Err(NvmlActionFailure {
            code: Some(nvml_return::INVALID_ARGUMENT),
            message: format!(
                "GPU instance profile {profile_id} has no placement starting at memory slice {start}: pick one of {}",
                starts.join(", ")
            ),
        });
    };
    let create_gi = symbol(
        "nvmlDeviceCreateGpuInstanceWithPlacement",
        &lib.nvmlDeviceCreateGpuInstanceWithPlacement,
    )?;
    let raw_placement = sys::nvmlGpuInstancePlacement_t {
        start: placement.start,
        size: placement.size,
    };
    let mut gi = std::ptr::null_mut();
    // SAFETY: a live device handle, a placement NVML listed, and a valid out-pointer.
    let rc = unsafe { create_gi(handle, profile_id, &raw_placement, &mut gi) };
    if rc != SUCCESS {
        return Err(failure(
            nvml,
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            rc,
        ));
    }
    let made = compute_instance_in(nvml, &gpu, gi);
    if made.is_err() {
        let destroy = symbol("nvmlGpuInstanceDestroy", &lib.nvmlGpuInstanceDestroy)?;
        // SAFETY: NVML just gave out `gi`, and nothing else holds it.
        let rc = unsafe { destroy(gi) };
        if rc != SUCCESS {
            let left = failure(nvml, "nvmlGpuInstanceDestroy", rc);
            return made.map_err(|e| NvmlActionFailure {
                code: e.code,
                message: format!(
                    "{}; and the GPU instance it made stays: {}",
                    e.message, left.message
                ),
            });
        }
    }
    made
}

/// The compute instance that spans GPU instance `gi` of `gpu` (its largest compute profile),
/// made now, and the MIG device NVML lists for it.
fn compute_instance_in(
    nvml: &Nvml,
    gpu: &Device,
    gi: sys::nvmlGpuInstance_t,
) -> Result<CreatedMig, NvmlActionFailure> {
    let lib = nvml.lib();
    let gi_info_fn = symbol("nvmlGpuInstanceGetInfo", &lib.nvmlGpuInstanceGetInfo)?;
    // SAFETY: all-zero is a valid nvmlGpuInstanceInfo_t: a null device handle and zeros.
    let mut gi_info: sys::nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: NVML gave out `gi`, and `gi_info` is valid for NVML to fill.
    let rc = unsafe { gi_info_fn(gi, &mut gi_info) };
    if rc != SUCCESS {
        return Err(failure(nvml, "nvmlGpuInstanceGetInfo", rc));
    }
    let profile_fn = symbol(
        "nvmlGpuInstanceGetComputeInstanceProfileInfo",
        &lib.nvmlGpuInstanceGetComputeInstanceProfileInfo,
    )?;
    let widest = (0..sys::NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
        .filter_map(|index| {
            // SAFETY: all-zero is a valid nvmlComputeInstanceProfileInfo_t (numbers only).
            let mut info: sys::nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
            let engines = sys::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED;
            // SAFETY: NVML gave out `gi`, and `info` is valid for NVML to fill.
            let rc = unsafe { profile_fn(gi, index, engines, &mut info) };
            (rc == SUCCESS).then_some(info)
        })
        .reduce(|best, info| match info.sliceCount > best.sliceCount {
            true => info,
            false => best,
        })
        .ok_or_else(|| NvmlActionFailure {
            code: None,
            message: format!(
                "NVML describes no compute instance profile for GPU instance {}: the driver cannot fill it; report it with nvidia-smi mig -lcip",
                gi_info.id
            ),
        })?;
    let create_ci = symbol(
        "nvmlGpuInstanceCreateComputeInstance",
        &lib.nvmlGpuInstanceCreateComputeInstance,
    )?;
    let mut ci = std::ptr::null_mut();
    // SAFETY: NVML gave out `gi`, the profile id is one it described, the out-pointer is valid.
    let rc = unsafe { create_ci(gi, widest.id, &mut ci) };
    if rc != SUCCESS {
        return Err(failure(nvml, "nvmlGpuInstanceCreateComputeInstance", rc));
    }
    let ci_info_fn = symbol(
        "nvmlComputeInstanceGetInfo_v2",
        &lib.nvmlComputeInstanceGetInfo_v2,
    )?;
    // SAFETY: all-zero is a valid nvmlComputeInstanceInfo_t: null handles and zeros.
    let mut ci_info: sys::nvmlComputeInstanceInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: NVML just gave out `ci`, and `ci_info` is valid for NVML to fill.
    let rc = unsafe { ci_info_fn(ci, &mut ci_info) };
    let found = match rc {
        SUCCESS => mig_device_of(nvml, gpu, gi_info.id, Some(ci_info.id)),
        rc => Err(failure(nvml, "nvmlComputeInstanceGetInfo_v2", rc)),
    };
    let found = found.and_then(|mig| {
        mig.ok_or_else(|| NvmlActionFailure {
            code: None,
            message: format!(
                "NVML lists no MIG device for the compute instance {} it made in GPU instance {}: report it with nvidia-smi -L",
                ci_info.id, gi_info.id
            ),
        })
    });
    if found.is_err() {
        let destroy = symbol(
            "nvmlComputeInstanceDestroy",
            &lib.nvmlComputeInstanceDestroy,
        )?;
        // SAFETY: NVML just gave out `ci`, and nothing else holds it.
        unsafe { destroy(ci) };
    }
    let uuid = found?;
    Ok(CreatedMig {
        uuid,
        gpu_instance_id: gi_info.id,
        compute_instance_id: ci_info.id,
    })
}

/// The UUID of a MIG device of `gpu` in GPU instance `gi` (and compute instance `ci` when
/// given); None where NVML lists none.
fn mig_device_of(
    nvml: &Nvml,
    gpu: &Device,
    gi: u32,
    ci: Option<u32>,
) -> Result<Option<String>, NvmlActionFailure> {
    let max = gpu
        .mig_device_count()
        .map_err(|e| wrapper_failure(nvml, "nvmlDeviceGetMaxMigDeviceCount", e))?;
    for index in 0..max {
        // Slots without a configured instance answer NOT_FOUND.
        let Ok(mig) = gpu.mig_device_by_index(index) else {
            continue;
        };
        let ids = instance_ids(nvml, &mig).map_err(|e| NvmlActionFailure {
            code: None,
            message: e.to_string(),
        })?;
        if ids.0 == gi && ci.is_none_or(|ci| ids.1 == ci) {
            let uuid = mig
                .uuid()
                .map_err(|e| wrapper_failure(nvml, "nvmlDeviceGetUUID", e))?;
            return Ok(Some(uuid));
        }
    }
    Ok(None)
}

/// Destroys MIG device `mig_uuid`'s compute instance, and its GPU instance once no other
/// compute instance is in it.
pub fn destroy(nvml: &Nvml, mig_uuid: &str) -> Result<(), NvmlActionFailure> {
    let lib = nvml.lib();
    let mig = nvml
        .device_by_uuid(mig_uuid)
        .map_err(|e| wrapper_failure(nvml, "nvmlDeviceGetHandleByUUID", e))?;
    let is_mig = mig
        .mig_is_mig_device_handle()
        .map_err(|e| wrapper_failure(nvml, "nvmlDeviceIsMigDeviceHandle", e))?;
    if !is_mig {
        return Err(NvmlActionFailure {
            code: Some(nvml_return::INVALID_ARGUMENT),
            message: format!("{mig_uuid} is a GPU, not a MIG device: pass a MIG device's UUID"),
        });
    }
    let gpu = mig
        .mig_parent_device()
        .map_err(|e| wrapper_failure(nvml, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", e))?;
    let (gi_id, ci_id) = instance_ids(nvml, &mig).map_err(|e| NvmlActionFailure {
        code: None,
        message: e.to_string(),
    })?;
    let gi_by_id = symbol(
        "nvmlDeviceGetGpuInstanceById",
        &lib.nvmlDeviceGetGpuInstanceById,
    )?;
    let ci_by_id = symbol(
        "nvmlGpuInstanceGetComputeInstanceById",
        &lib.nvmlGpuInstanceGetComputeInstanceById,
    )?;
    let destroy_ci = symbol(
        "nvmlComputeInstanceDestroy",
        &lib.nvmlComputeInstanceDestroy,
    )?;
    let destroy_gi = symbol("nvmlGpuInstanceDestroy", &lib.nvmlGpuInstanceDestroy)?;
    let mut gi = std::ptr::null_mut();
    // SAFETY: the parent's handle is live for `gpu`'s lifetime and the out-pointer is valid.
    let rc = unsafe { gi_by_id(gpu.handle(), gi_id, &mut gi) };
    if rc != SUCCESS {
        return Err(failure(nvml, "nvmlDeviceGetGpuInstanceById", rc));
    }
    let mut ci = std::ptr::null_mut();
    // SAFETY: NVML just gave out `gi`, and the out-pointer is valid.
    let rc = unsafe { ci_by_id(gi, ci_id, &mut ci) };
    if rc != SUCCESS {
        return Err(failure(nvml, "nvmlGpuInstanceGetComputeInstanceById", rc));
    }
    // SAFETY: NVML just gave out `ci`.
    let rc = unsafe { destroy_ci(ci) };
    if rc != SUCCESS {
        return Err(failure(nvml, "nvmlComputeInstanceDestroy", rc));
    }
    if mig_device_of(nvml, &gpu, gi_id, None)?.is_some() {
        return Ok(());
    }
    // SAFETY: NVML gave out `gi`, whose last compute instance is gone.
    let rc = unsafe { destroy_gi(gi) };
    match rc {
        SUCCESS => Ok(()),
        rc => Err(failure(nvml, "nvmlGpuInstanceDestroy", rc)),
    }
}
