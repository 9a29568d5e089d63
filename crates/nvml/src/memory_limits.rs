//! Per-container GPU memory limits: `nvmlDeviceSetMemoryLimits_v1` and
//! `nvmlDeviceGetMemoryLimits_v1`, which came with CUDA 13.4's driver. nvml-wrapper binds
//! neither, and a driver from before them must get a clean answer rather than a library that
//! fails to load, so both are looked up in the loaded library when they are called.

use crate::action;
use nvhook_model::inventory::{CgroupLimits, NvmlActionFailure, nvml_return};
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings as sys;
use std::ffi::{CStr, CString, c_char, c_ulonglong, c_void};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

const SET: &CStr = c"nvmlDeviceSetMemoryLimits_v1";
const GET: &CStr = c"nvmlDeviceGetMemoryLimits_v1";

/// `nvmlSetMemoryLimits_v1_t`.
#[repr(C)]
struct SetLimitsV1 {
    name_space: *const c_char,
    soft_limit: c_ulonglong,
    hard_limit: c_ulonglong,
}

/// `nvmlGetMemoryLimits_v1_t`.
#[repr(C)]
struct GetLimitsV1 {
    name_space: *const c_char,
    soft_limit: c_ulonglong,
    hard_limit: c_ulonglong,
    current_used: c_ulonglong,
}

type SetFn = unsafe extern "C" fn(sys::nvmlDevice_t, *mut SetLimitsV1) -> sys::nvmlReturn_t;
type GetFn = unsafe extern "C" fn(sys::nvmlDevice_t, *mut GetLimitsV1) -> sys::nvmlReturn_t;

/// Whether the NVML library loaded from `library` exports the calls.
pub fn supported(library: &Path) -> bool {
    Loaded::open(library).is_some_and(|lib| lib.symbol(SET).is_some())
}

/// Sets the limits of cgroup `cgroup_dir` on each GPU of `gpu_uuids`, in turn, up to the first
/// NVML refuses. Every GPU is looked up first: an unknown one, or a MIG device (NVML limits
/// whole GPUs only), leaves every GPU as it was.
pub fn set(
    nvml: &Nvml,
    library: &Path,
    cgroup_dir: &Path,
    soft_bytes: u64,
    hard_bytes: u64,
    gpu_uuids: &[&str],
) -> Result<(), NvmlActionFailure> {
    let name_space = name_space(cgroup_dir)?;
    let lib = Loaded::open(library).ok_or_else(|| missing(library, SET))?;
    let set = lib.symbol(SET).ok_or_else(|| missing(library, SET))?;
    // SAFETY: the symbol is nvml.h's nvmlDeviceSetMemoryLimits_v1, of this signature.
    let set: SetFn = unsafe { std::mem::transmute::<*mut c_void, SetFn>(set) };
    let handles = gpu_uuids
        .iter()
        .map(|&uuid| whole_gpu(nvml, uuid))
        .collect::<Result<Vec<_>, _>>()?;
    for (done, (&uuid, handle)) in gpu_uuids.iter().zip(handles).enumerate() {
        let mut limits = SetLimitsV1 {
            name_space: name_space.as_ptr(),
            soft_limit: soft_bytes,
            hard_limit: hard_bytes,
        };
        // SAFETY: a live handle, and a struct whose path outlives the call.
        let rc = unsafe { set(handle, &mut limits) };
        if rc != sys::nvmlReturn_enum_NVML_SUCCESS {
            let failed = action::failure(nvml, "nvmlDeviceSetMemoryLimits_v1", uuid, rc, fix);
            return Err(match &gpu_uuids[..done] {
                [] => failed,
                set => NvmlActionFailure {
                    code: failed.code,
                    message: format!(
                        "{} (the limits set on {} stay)",
                        failed.message,
                        set.join(", ")
                    ),
                },
            });
        }
    }
    Ok(())
}

/// The limits of cgroup `cgroup_dir` on GPU `gpu_uuid`; None where NVML keeps none.
pub fn get(
    nvml: &Nvml,
    library: &Path,
    cgroup_dir: &Path,
    gpu_uuid: &str,
) -> Result<Option<CgroupLimits>, NvmlActionFailure> {
    let name_space = name_space(cgroup_dir)?;
    let lib = Loaded::open(library).ok_or_else(|| missing(library, GET))?;
    let get = lib.symbol(GET).ok_or_else(|| missing(library, GET))?;
    // SAFETY: the symbol is nvml.h's nvmlDeviceGetMemoryLimits_v1, of this signature.
    let get: GetFn = unsafe { std::mem::transmute::<*mut c_void, GetFn>(get) };
    let handle = whole_gpu(nvml, gpu_uuid)?;
    let mut limits = GetLimitsV1 {
        name_space: name_space.as_ptr(),
        soft_limit: 0,
        hard_limit: 0,
        current_used: 0,
    };
    // SAFETY: a live handle, and a struct whose path outlives the call.
    match unsafe { get(handle, &mut limits) } {
        sys::nvmlReturn_enum_NVML_SUCCESS => Ok(Some(CgroupLimits {
            soft_bytes: limits.soft_limit,
            hard_bytes: limits.hard_limit,
            used_bytes: limits.current_used,
        })),
        nvml_return::NOT_FOUND => Ok(None),
        rc => Err(action::failure(
            nvml,
            "nvmlDeviceGetMemoryLimits_v1",
            gpu_uuid,
            rc,
            fix,
        )),
    }
}

/// What NVML takes for the cgroup: its directory's whole path, NUL-terminated.
fn name_space(cgroup_dir: &Path) -> Result<CString, NvmlActionFailure> {
    let refused = |why: &str| NvmlActionFailure {
        code: Some(nvml_return::INVALID_ARGUMENT),
        message: format!(
            "the cgroup directory {} {why}: pass the container's cgroup v2 directory, such as /sys/fs/cgroup/kubepods.slice/.../cri-containerd-<id>.scope",
            cgroup_dir.display()
        ),
    };
    if !cgroup_dir.is_absolute() {
        return Err(refused("is not an absolute path"));
    }
    CString::new(cgroup_dir.as_os_str().as_bytes()).map_err(|_| refused("holds a NUL byte"))
}

/// GPU `uuid`'s handle; a MIG device's is refused, as NVML refuses it.
fn whole_gpu(nvml: &Nvml, uuid: &str) -> Result<sys::nvmlDevice_t, NvmlActionFailure> {
    let lookup = |call, error| action::wrapper_failure(nvml, call, uuid, error, fix);
    let device = nvml
        .device_by_uuid(uuid)
        .map_err(|e| lookup("nvmlDeviceGetHandleByUUID", e))?;
    // A driver without MIG (or a GPU without it) answers NOT_SUPPORTED: a whole GPU.
    if device.mig_is_mig_device_handle().unwrap_or(false) {
        return Err(NvmlActionFailure {
            code: Some(nvml_return::NOT_SUPPORTED),
            message: format!(
                "{uuid} is a MIG device, and NVML limits the memory of whole GPUs only: pass a GPU's UUID, or leave MIG devices unlimited"
            ),
        });
    }
    // SAFETY: NVML's handles stay valid while `nvml` keeps it initialised, beyond `device`.
    Ok(unsafe { device.handle() })
}

/// The failure of a driver that lacks `call`.
fn missing(library: &Path, call: &CStr) -> NvmlActionFailure {
    NvmlActionFailure {
        code: Some(nvml_return::FUNCTION_NOT_FOUND),
        message: format!(
            "the driver has no {} (driver too old: it came with CUDA 13.4's driver): {} cannot limit GPU memory; upgrade the driver",
            call.to_string_lossy(),
            library.display()
        ),
    }
}

/// What to do about NVML's refusal of a memory limit call.
fn fix(rc: u32) -> Option<&'static str> {
    Some(match rc {
        nvml_return::INVALID_ARGUMENT => {
            "the soft limit is above the hard one, or a limit is above the GPU's memory: pass soft <= hard <= the GPU's memory (nvidia-smi --query-gpu=memory.total), hard 18446744073709551615 for none"
        }
        nvml_return::NOT_SUPPORTED => {
            "this GPU or its driver does not limit memory per cgroup (it needs cgroup v2): leave its memory unlimited"
        }
        nvml_return::NO_PERMISSION => "memory limits are set by root only: run it as root",
        nvml_return::NOT_FOUND => "no such GPU (nvidia-smi -L lists them)",
        nvml_return::OPERATING_SYSTEM => {
            "the cgroup directory cannot be opened: pass an existing cgroup v2 directory (memory limits need cgroup v2)"
        }
        _ => return None,
    })
}

/// Another reference to the NVML library this process loaded, for calls nvml-wrapper does
/// not bind.
struct Loaded(*mut c_void);

impl Loaded {
    /// The library loaded from `library`; None where it is not loaded.
    fn open(library: &Path) -> Option<Loaded> {
        let path = CString::new(library.as_os_str().as_bytes()).ok()?;
        // SAFETY: a NUL-terminated path; RTLD_NOLOAD loads nothing, so no initialiser runs.
        let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        // Built only when open: a Loaded drops into dlclose, which a null handle crashes.
        (!handle.is_null()).then(|| Loaded(handle))
    }

    /// `name`'s address in the library itself (not in the libraries it needs).
    fn symbol(&self, name: &CStr) -> Option<*mut c_void> {
        // SAFETY: a handle dlopen gave out and a NUL-terminated name.
        let found = unsafe { libc::dlsym(self.0, name.as_ptr()) };
        (!found.is_null()).then_some(found)
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        // SAFETY: a handle dlopen gave out, closed once; nvml-wrapper keeps its own open.
        unsafe { libc::dlclose(self.0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_structs_are_nvml_hs() {
        assert_eq!(std::mem::size_of::<SetLimitsV1>(), 24);
        assert_eq!(std::mem::size_of::<GetLimitsV1>(), 32);
    }

    #[test]
    fn the_cgroup_is_a_whole_path() {
        let path = Path::new("/sys/fs/cgroup/kubepods.slice/cri-containerd-1.scope");
        assert_eq!(
            name_space(path).unwrap().as_bytes(),
            path.as_os_str().as_bytes()
        );
        for bad in ["kubepods.slice/x.scope", "/sys/fs/cgroup/a\0b"] {
            let refused = name_space(Path::new(bad)).unwrap_err();
            assert_eq!(refused.code, Some(nvml_return::INVALID_ARGUMENT), "{bad:?}");
        }
    }

    #[test]
    fn a_library_not_loaded_has_no_calls() {
        assert!(!supported(Path::new("/nonexistent/libnvidia-ml.so.1")));
        let refused = missing(Path::new("/drv/libnvidia-ml.so.1"), SET);
        assert_eq!(refused.code, Some(nvml_return::FUNCTION_NOT_FOUND));
        assert!(refused.message.starts_with(
            "the driver has no nvmlDeviceSetMemoryLimits_v1 (driver too old: it came with CUDA 13.4's driver)"
        ));
    }
}
