//! GPUs and driver versions through NVML (nvml-wrapper), loaded from an explicit path.

use nvhook_model::inventory::{Gpu, MigDevice, MigPlacement, System};
use nvml_wrapper::error::nvml_try;
use nvml_wrapper::{Device, Nvml};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    #[error(
        "the NVML library {0} is missing (is the NVIDIA driver installed completely? run ldconfig in the driver root, or set nvml-library in the nvhook config)"
    )]
    Missing(PathBuf),
    #[error(
        "cannot initialise NVML from {path}: {source} (is the NVIDIA driver installed and loaded?)"
    )]
    Init {
        path: PathBuf,
        source: nvml_wrapper::error::NvmlError,
    },
    #[error("NVML {call} failed: {source}")]
    Query {
        call: &'static str,
        source: nvml_wrapper::error::NvmlError,
    },
}

fn q<T>(call: &'static str, r: Result<T, nvml_wrapper::error::NvmlError>) -> Result<T, NvmlError> {
    r.map_err(|source| NvmlError::Query { call, source })
}

/// Initialises NVML from `library` and reads every GPU and MIG device. NVML stays
/// initialised until the returned handle is dropped: a real driver takes a while to shut it
/// down, which a process about to exit need not wait for.
pub fn query(library: &Path) -> Result<(System, Nvml), NvmlError> {
    let nvml = init(library)?;
    let driver_version = q("nvmlSystemGetDriverVersion", nvml.sys_driver_version())?;
    let cuda = q(
        "nvmlSystemGetCudaDriverVersion",
        nvml.sys_cuda_driver_version(),
    )?;
    let count = q("nvmlDeviceGetCount", nvml.device_count())?;
    let gpus = (0..count)
        .map(|index| {
            let device = q("nvmlDeviceGetHandleByIndex", nvml.device_by_index(index))?;
            read_gpu(&nvml, index, &device)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let system = System {
        driver_version,
        cuda_version: format!("{}.{}", cuda / 1000, (cuda % 1000) / 10),
        gpus,
        memory_limits: crate::memory_limits::supported(library),
    };
    Ok((system, nvml))
}

/// NVML initialised from `library`.
pub fn init(library: &Path) -> Result<Nvml, NvmlError> {
    // dlopen's own message for this names the path twice and blames nothing.
    if !library.exists() {
        return Err(NvmlError::Missing(library.to_path_buf()));
    }
    Nvml::builder()
        .lib_path(library.as_os_str())
        .init()
        .map_err(|source| NvmlError::Init {
            path: library.to_path_buf(),
            source,
        })
}

const MIB: u64 = 1024 * 1024;

fn read_gpu(nvml: &Nvml, index: u32, device: &Device) -> Result<Gpu, NvmlError> {
    let cc = q(
        "nvmlDeviceGetCudaComputeCapability",
        device.cuda_compute_capability(),
    )?;
    // MIG queries are unsupported on pre-Ampere GPUs: that means "no MIG", not an error.
    let mig_mode = device.mig_mode();
    let mig_enabled = mig_mode.as_ref().is_ok_and(|m| m.current == 1);
    let (mig_devices, mig_profiles) = if mig_enabled {
        (
            read_mig_devices(nvml, device)?,
            crate::mig::profiles(nvml, device),
        )
    } else {
        (Vec::new(), Vec::new())
    };
    Ok(Gpu {
        index,
        uuid: q("nvmlDeviceGetUUID", device.uuid())?,
        // WSL2's NVML has no minor numbers: its GPUs have no device node of their own.
        minor: match device.minor_number() {
            Err(nvml_wrapper::error::NvmlError::NotSupported) => None,
            minor => Some(q("nvmlDeviceGetMinorNumber", minor)?),
        },
        pci_bus_id: kernel_bus_id(&q("nvmlDeviceGetPciInfo", device.pci_info())?.bus_id),
        name: q("nvmlDeviceGetName", device.name())?,
        brand: device
            .brand()
            .map(|b| format!("{b:?}").to_lowercase())
            .unwrap_or_else(|_| "unknown".into()),
        architecture: device
            .architecture()
            .map(|a| a.to_string().to_lowercase())
            .unwrap_or_else(|_| "unknown".into()),
        compute_capability: format!("{}.{}", cc.major, cc.minor),
        // Facts for labels and doctor, which some GPUs (and drivers) do not report: absent,
        // not an error that would fail a container start.
        memory_mib: device.memory_info().ok().map(|m| m.total / MIB),
        persistence_mode: device.is_in_persistent_mode().ok(),
        mig_capable: mig_mode.is_ok(),
        mig_enabled,
        mig_devices,
        mig_profiles,
    })
}

fn read_mig_devices(nvml: &Nvml, parent: &Device) -> Result<Vec<MigDevice>, NvmlError> {
    let max = q("nvmlDeviceGetMaxMigDeviceCount", parent.mig_device_count())?;
    let mut out = Vec::new();
    for index in 0..max {
        // Slots without a configured instance answer NOT_FOUND.
        let Ok(mig) = parent.mig_device_by_index(index) else {
            continue;
        };
        let (gi, ci) = instance_ids(nvml, &mig)?;
        let name = q("nvmlDeviceGetName", mig.name())?;
        let instance = gpu_instance(nvml, parent, gi);
        out.push(MigDevice {
            index,
            uuid: q("nvmlDeviceGetUUID", mig.uuid())?,
            profile: MigDevice::profile_in_name(&name).map(str::to_owned),
            name,
            gpu_instance_id: gi,
            compute_instance_id: ci,
            gi_cap_minor: None,
            ci_cap_minor: None,
            gpu_instance_profile_id: instance.map(|(profile, _)| profile),
            placement: instance.map(|(_, placement)| placement),
            memory_mib: mig.memory_info().ok().map(|m| m.total / MIB),
        });
    }
    Ok(out)
}

/// nvml-wrapper does not wrap the instance-id getters; call them through the loaded library.
pub(crate) fn instance_ids(nvml: &Nvml, mig: &Device) -> Result<(u32, u32), NvmlError> {
    let lib = nvml.lib();
    let get_gi = symbol(
        "nvmlDeviceGetGpuInstanceId",
        lib.nvmlDeviceGetGpuInstanceId.as_ref(),
    )?;
    let get_ci = symbol(
        "nvmlDeviceGetComputeInstanceId",
        lib.nvmlDeviceGetComputeInstanceId.as_ref(),
    )?;
    let (mut gi, mut ci) = (0, 0);
    // SAFETY: the handle is live for `mig`'s lifetime and the out-pointers are valid.
    let (rc_gi, rc_ci) = unsafe {
        let handle = mig.handle();
        (get_gi(handle, &mut gi), get_ci(handle, &mut ci))
    };
    q("nvmlDeviceGetGpuInstanceId", nvml_try(rc_gi))?;
    q("nvmlDeviceGetComputeInstanceId", nvml_try(rc_ci))?;
    Ok((gi, ci))
}

/// GPU instance `gi` of `parent`: its profile id and placement, which name a MIG device in
/// Kubernetes DRA. Only those names need them, so a driver without these calls, or one that
/// refuses them (NVML may keep GPU instances to privileged callers), leaves them absent
/// rather than failing the answer every container start needs.
fn gpu_instance(nvml: &Nvml, parent: &Device, gi: u32) -> Option<(u32, MigPlacement)> {
    let lib = nvml.lib();
    let by_id = *lib.nvmlDeviceGetGpuInstanceById.as_ref().ok()?;
    let get_info = *lib.nvmlGpuInstanceGetInfo.as_ref().ok()?;
    let mut instance = std::ptr::null_mut();
    // SAFETY: the parent's handle is live for `parent`'s lifetime and the out-pointer is valid.
    nvml_try(unsafe { by_id(parent.handle(), gi, &mut instance) }).ok()?;
    // SAFETY: all-zero is a valid nvmlGpuInstanceInfo_t: a null device handle and zeros.
    let mut info = unsafe { std::mem::zeroed() };
    // SAFETY: NVML just gave out `instance`, and `info` is valid for NVML to fill.
    nvml_try(unsafe { get_info(instance, &mut info) }).ok()?;
    let placement = MigPlacement {
        start: info.placement.start,
        size: info.placement.size,
    };
    Some((info.profileId, placement))
}

/// A symbol the library lacks is reported like nvml-wrapper reports its own missing symbols.
fn symbol<F: Copy, E: std::fmt::Display>(
    call: &'static str,
    sym: Result<&F, &E>,
) -> Result<F, NvmlError> {
    sym.copied().map_err(|e| NvmlError::Query {
        call,
        source: nvml_wrapper::error::NvmlError::FailedToLoadSymbol(e.to_string()),
    })
}

/// NVML writes `00000000:3B:00.0`; the kernel's /proc and sysfs use `0000:3b:00.0`.
pub fn kernel_bus_id(nvml_bus_id: &str) -> String {
    let lower = nvml_bus_id.to_ascii_lowercase();
    match lower.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 => {
            format!("{}:{rest}", &domain[domain.len() - 4..])
        }
        _ => lower,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_id_forms() {
        assert_eq!(kernel_bus_id("00000000:3B:00.0"), "0000:3b:00.0");
        assert_eq!(kernel_bus_id("0000:3b:00.0"), "0000:3b:00.0");
    }
}
