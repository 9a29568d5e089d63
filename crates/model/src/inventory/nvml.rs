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
