//! What the host has: GPUs (as NVML reports them), the driver's files, and the device nodes.
//!
//! Plain, serialisable data: nvhook's host readers fill it, the planner reads it, and tests
//! build it by hand.

pub mod device_numbers;
mod files;
mod nodes;
pub mod nvml;
pub mod wsl;

use crate::capability::Capability;
use nvhook_ldcache::Arch;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

pub use device_numbers::{DeviceMajors, MODESET_MINOR, NVIDIACTL_MINOR};
pub use files::{ConfigLibraryPath, DriverFiles, GLX_SERVER, HostFile, Library};
pub use nodes::{DrmNode, HostNode};
pub use nvml::{
    CgroupLimits, CreateMigReply, CreatedMig, DestroyMigReply, GetMemoryLimitsReply, Gpu,
    MEMORY_LIMIT_MAX, MigDevice, MigPlacement, MigProfile, NvmlActionFailure, Reply,
    SetMemoryLimitsReply, System, nvml_return,
};
pub use wsl::{WslDriver, WslFile};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Inventory {
    pub driver_version: String,
    /// The CUDA version the driver supports, "major.minor".
    pub cuda_version: String,
    pub gpus: Vec<Gpu>,
    pub files: DriverFiles,
    pub majors: DeviceMajors,
    /// Device nodes present under the dev root, by container path (`/dev/nvidia0`).
    pub nodes: Vec<HostNode>,
    /// nvidia-caps minors for MIG management (`mig/config`, `mig/monitor`), when present.
    pub mig_config_minor: Option<u32>,
    pub mig_monitor_minor: Option<u32>,
    /// `<proc-root>/driver/nvidia` on the host, when the kernel module is loaded.
    pub proc_driver: Option<PathBuf>,
    /// Each GPU's DRM nodes, where nvidia-drm is loaded.
    #[serde(default)]
    pub drm_nodes: Vec<DrmNode>,
    /// The architecture of the driver's libraries and of the containers: the build target's.
    #[serde(default)]
    pub arch: Arch,
    /// [`System::memory_limits`]: the driver can limit a container's GPU memory.
    #[serde(default)]
    pub memory_limits: bool,
    /// A WSL2 host's driver: its GPUs are given from this alone (`/dev/dxg` and the driver
    /// store), and the Linux driver's fields above stay empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wsl: Option<WslDriver>,
}

/// How much of the driver's files a caller needs. A start that asks for no graphics or
/// display skips their discovery (the configs' directories, Xorg's modules, the GPUs' DRM
/// nodes): most containers ask for compute alone, and every start pays for what is looked up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scope {
    pub graphics: bool,
}

impl Scope {
    /// Everything: for the commands that describe the host (`info`, `cdi`, `doctor`).
    pub const ALL: Scope = Scope { graphics: true };

    /// What `capabilities` need.
    pub fn for_capabilities<'a>(capabilities: impl IntoIterator<Item = &'a Capability>) -> Scope {
        Scope {
            graphics: capabilities
                .into_iter()
                .any(|c| matches!(c, Capability::Graphics | Capability::Display)),
        }
    }
}

impl Inventory {
    /// What NVML reported, as the host readers' `around` takes it.
    pub fn system(&self) -> System {
        System {
            driver_version: self.driver_version.clone(),
            cuda_version: self.cuda_version.clone(),
            gpus: self.gpus.clone(),
            memory_limits: self.memory_limits,
        }
    }

    /// The libraries of one capability.
    pub fn libraries(&self, cap: Capability) -> impl Iterator<Item = &Library> {
        self.files
            .libraries
            .iter()
            .filter(move |l| l.capability == cap)
    }
}
