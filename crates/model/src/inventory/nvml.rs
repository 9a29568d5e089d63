//! What NVML reports about the system, as nvhook-nvml writes it (JSON on its stdout) and nvhook
//! reads it.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    pub index: u32,
    pub uuid: String,
    pub minor: u32,
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
}

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
