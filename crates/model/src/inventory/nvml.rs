//! What NVML reports about the system, as nvhook-nvml writes it (JSON on its stdout) and nvhook
//! reads it.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    pub index: u32,
    pub uuid: String,
    /// The minor of `/dev/nvidia<minor>`; None where the GPU has no device node of its own
    /// (WSL2, whose NVML answers NOT_SUPPORTED: every GPU is reached through `/dev/dxg`).
    pub minor: Option<u32>,
    /// Kernel form, as in /proc/driver/nvidia/gpus: lower case, 4-digit domain.
    pub pci_bus_id: String,
    pub name: String,
    pub brand: String,
    pub architecture: String,
    /// "major.minor", e.g. "8.0".
    pub compute_capability: String,
    /// Total framebuffer memory in MiB, as `nvidia-smi` shows it; None where NVML does not
    /// report it.
    pub memory_mib: Option<u64>,
    /// Whether the driver keeps the GPU initialised with no client; None where NVML does not
    /// report it (it is a Linux-only setting).
    pub persistence_mode: Option<bool>,
    /// Whether the GPU can be split into MIG devices (MIG mode reported at all).
    pub mig_capable: bool,
    pub mig_enabled: bool,
    pub mig_devices: Vec<MigDevice>,
    /// The GPU instance profiles a MIG-enabled GPU offers, each with every placement it can
    /// take whether or not an instance holds it now; empty with MIG off.
    #[serde(default)]
    pub mig_profiles: Vec<MigProfile>,
}

/// A GPU instance profile, as `nvidia-smi mig -lgip` and `-lgipp` list it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigProfile {
    /// NVML's profile id, the ID column of `nvidia-smi mig -lgip`: the number
    /// [`MigDevice::gpu_instance_profile_id`] holds.
    pub id: u32,
    /// As nvidia-smi names it (`1g.10gb`, `1g.10gb+me`): the spelling of [`MigDevice::profile`].
    pub name: String,
    /// Compute slices (the `7` of 7g).
    pub slices: u32,
    pub memory_mib: u64,
    pub multiprocessors: u32,
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpegs: u32,
    pub ofas: u32,
    pub placements: Vec<MigPlacement>,
}

impl MigProfile {
    /// The profile in NVML's name for it (`MIG 1g.10gb`), as nvidia-smi prints it.
    pub fn name_in_nvml(name: &str) -> &str {
        let name = name.trim();
        name.strip_prefix("MIG ").unwrap_or(name).trim()
    }
}

/// What `nvhook-nvml LIBRARY create-mig` made: one compute instance spanning a new GPU
/// instance, which NVML lists as one MIG device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreatedMig {
    pub uuid: String,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
}

/// Why NVML refused an action of `nvhook-nvml` (making a MIG device, setting memory limits):
/// its `nvmlReturn_t` where it gave one, and the whole cause and fix in one line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct NvmlActionFailure {
    pub code: Option<u32>,
    pub message: String,
}

/// `nvmlReturn_t` values an action's caller may act on.
pub mod nvml_return {
    pub const INVALID_ARGUMENT: u32 = 2;
    pub const NOT_SUPPORTED: u32 = 3;
    pub const NO_PERMISSION: u32 = 4;
    pub const NOT_FOUND: u32 = 6;
    /// The library lacks the call: nvhook-nvml answers it for a symbol the driver does not
    /// export, as NVML's own loader does.
    pub const FUNCTION_NOT_FOUND: u32 = 13;
    /// The kernel refused: for memory limits, the cgroup directory cannot be opened.
    pub const OPERATING_SYSTEM: u32 = 17;
    pub const IN_USE: u32 = 19;
    pub const INSUFFICIENT_RESOURCES: u32 = 23;
}

/// What `create-mig` writes on stdout.
pub type CreateMigReply = Result<CreatedMig, NvmlActionFailure>;
/// What `destroy-mig` writes on stdout.
pub type DestroyMigReply = Result<(), NvmlActionFailure>;

/// `NVML_DEVICE_MEMORY_LIMIT_MAX`: a hard limit of this many bytes is no limit.
pub const MEMORY_LIMIT_MAX: u64 = u64::MAX;

/// The memory limits NVML keeps for one GPU and one cgroup (`nvmlGetMemoryLimits_v1_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupLimits {
    /// Guaranteed to the cgroup's processes.
    pub soft_bytes: u64,
    /// The most they may use; [`MEMORY_LIMIT_MAX`] is no limit.
    pub hard_bytes: u64,
    /// What they use now.
    pub used_bytes: u64,
}

/// What `set-memory-limits` writes on stdout.
pub type SetMemoryLimitsReply = Result<(), NvmlActionFailure>;
/// What `get-memory-limits` writes on stdout: None where NVML keeps no limit for the GPU
/// and cgroup.
pub type GetMemoryLimitsReply = Result<Option<CgroupLimits>, NvmlActionFailure>;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MigDevice {
    /// Position under the parent GPU (the `M` of `G:M`).
    pub index: u32,
    pub uuid: String,
    /// NVML's name for it: the board's, then ` MIG ` and the profile (`1g.10gb`).
    pub name: String,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    /// nvidia-caps minors granting access to this GPU instance and compute instance.
    pub gi_cap_minor: Option<u32>,
    pub ci_cap_minor: Option<u32>,
    /// The MIG profile as nvidia-smi names it (`1g.10gb`, `1g.10gb+me`).
    #[serde(default)]
    pub profile: Option<String>,
    /// NVML's id of the GPU instance's profile, the ID column of `nvidia-smi mig -lgip` (19
    /// for 1g.10gb on an A100 or H100). None where the driver does not say: one without
    /// `nvmlGpuInstanceGetInfo`, or a caller NVML does not let manage GPU instances.
    #[serde(default)]
    pub gpu_instance_profile_id: Option<u32>,
    /// The memory slices the GPU instance holds; None as for the profile id.
    #[serde(default)]
    pub placement: Option<MigPlacement>,
    /// The MIG device's own framebuffer in MiB; None where NVML does not report it.
    #[serde(default)]
    pub memory_mib: Option<u64>,
}

/// A GPU instance's place on its GPU: memory slices `start..start + size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigPlacement {
    pub start: u32,
    pub size: u32,
}

impl MigDevice {
    /// The profile in NVML's name for a MIG device (`NVIDIA A100-SXM4-80GB MIG 1g.10gb`).
    pub fn profile_in_name(name: &str) -> Option<&str> {
        let (_, profile) = name.rsplit_once(" MIG ")?;
        let profile = profile.trim();
        (!profile.is_empty()).then_some(profile)
    }
}

/// What NVML reports about the system.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct System {
    pub driver_version: String,
    pub cuda_version: String,
    pub gpus: Vec<Gpu>,
    /// Whether the driver exports `nvmlDeviceSetMemoryLimits_v1` (CUDA 13.4's driver and
    /// later): the node can limit a container's GPU memory. A GPU may still refuse it (a MIG
    /// device, a GPU the driver does not support it on), and it needs cgroup v2.
    #[serde(default)]
    pub memory_limits: bool,
}

/// What nvhook-nvml writes: the answer, or NVML's error in one line.
pub type Reply = Result<System, String>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_is_the_end_of_nvmls_name() {
        let profile = MigDevice::profile_in_name;
        assert_eq!(
            profile("NVIDIA A100-SXM4-80GB MIG 1g.10gb"),
            Some("1g.10gb")
        );
        assert_eq!(
            profile("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me"),
            Some("1g.10gb+me")
        );
        assert_eq!(profile("NVIDIA A100-SXM4-80GB"), None);
        assert_eq!(profile("A100 MIG "), None);
    }

    #[test]
    fn a_profiles_name_drops_nvmls_prefix() {
        assert_eq!(MigProfile::name_in_nvml("MIG 1g.10gb+me"), "1g.10gb+me");
        assert_eq!(MigProfile::name_in_nvml("3g.40gb"), "3g.40gb");
    }

    /// Answers cached by an nvhook that did not read them still parse, the facts absent.
    #[test]
    fn mig_devices_without_the_instance_facts_parse() {
        let old = r#"{"index": 0, "uuid": "MIG-1", "name": "A100 MIG 1g.10gb",
            "gpu_instance_id": 7, "compute_instance_id": 0,
            "gi_cap_minor": null, "ci_cap_minor": null}"#;
        let mig: MigDevice = serde_json::from_str(old).unwrap();
        assert_eq!(
            (
                mig.profile,
                mig.gpu_instance_profile_id,
                mig.placement,
                mig.memory_mib
            ),
            (None, None, None, None)
        );
    }
}
