//! Per-container GPU memory limits, which NVML keeps per GPU and cgroup v2 directory
//! (`nvmlDeviceSetMemoryLimits_v1`, CUDA 13.4's driver and later), through nvhook-nvml
//! ([`NvmlActions`]). Removing the cgroup clears its limits.

use super::nvml_actions::{NvmlActionError, NvmlActions};
use super::{CgroupLimits, InventoryError, Scope};
use crate::config::Config;
use std::ffi::OsStr;
use std::path::Path;

/// Limits the GPU memory of cgroup `cgroup_dir` (the container's cgroup v2 directory, whole)
/// on each GPU of `gpu_uuids`: `soft_bytes` guaranteed, `hard_bytes` at most
/// ([`super::MEMORY_LIMIT_MAX`]: none). Soft 0 and hard MAX clear them. GPUs are set in turn up
/// to the first NVML refuses; an unknown GPU or a MIG device sets none. Through the helper
/// beside nvhook.
pub fn set_memory_limits(
    config: &Config,
    cgroup_dir: &Path,
    soft_bytes: u64,
    hard_bytes: u64,
    gpu_uuids: &[String],
) -> Result<(), NvmlActionError> {
    NvmlActions::beside_nvhook()
        .set_memory_limits(config, cgroup_dir, soft_bytes, hard_bytes, gpu_uuids)
}

/// The GPU memory limits of cgroup `cgroup_dir` on GPU `gpu_uuid`; None where it has none.
/// Through the helper beside nvhook.
pub fn memory_limits(
    config: &Config,
    cgroup_dir: &Path,
    gpu_uuid: &str,
) -> Result<Option<CgroupLimits>, NvmlActionError> {
    NvmlActions::beside_nvhook().memory_limits(config, cgroup_dir, gpu_uuid)
}

/// Whether the node's driver can limit GPU memory per cgroup (it exports
/// `nvmlDeviceSetMemoryLimits_v1`), from NVML's answer cached for container starts when the
/// host is as it was. A GPU may still refuse it (a MIG device), and it needs cgroup v2.
pub fn supports_memory_limits(config: &Config) -> Result<bool, InventoryError> {
    let scope = Scope { graphics: false };
    let (inventory, _) = super::isolated::load(config, scope)?;
    Ok(inventory.memory_limits)
}

impl NvmlActions {
    /// [`set_memory_limits`] through this helper.
    pub fn set_memory_limits(
        &self,
        config: &Config,
        cgroup_dir: &Path,
        soft_bytes: u64,
        hard_bytes: u64,
        gpu_uuids: &[String],
    ) -> Result<(), NvmlActionError> {
        let (soft, hard) = (soft_bytes.to_string(), hard_bytes.to_string());
        let mut args = vec![
            OsStr::new("set-memory-limits"),
            cgroup_dir.as_os_str(),
            OsStr::new(&soft),
            OsStr::new(&hard),
        ];
        args.extend(gpu_uuids.iter().map(OsStr::new));
        self.run(config, &args)
    }

    /// [`memory_limits`] through this helper.
    pub fn memory_limits(
        &self,
        config: &Config,
        cgroup_dir: &Path,
        gpu_uuid: &str,
    ) -> Result<Option<CgroupLimits>, NvmlActionError> {
        let args = [
            OsStr::new("get-memory-limits"),
            cgroup_dir.as_os_str(),
            OsStr::new(gpu_uuid),
        ];
        self.run(config, &args)
    }
}
