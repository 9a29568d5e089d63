//! What the host has: GPUs (through NVML), the driver's files, and the device nodes.
//!
//! The data types here are plain and serialisable; the plan is computed from them without
//! touching the system, and tests build them by hand.

pub mod cache;
pub mod change;
pub mod device_numbers;
pub mod devices;
pub mod driver;
pub mod drm;
pub mod gpu_layout;
pub mod graphics;
mod host_file;
pub mod isolated;
pub mod nvml;
mod resolve;

use crate::capability::Capability;
use crate::config::Config;
use nvhook_ldcache::Arch;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

pub use device_numbers::DeviceMajors;
pub use devices::HostNode;
pub use driver::{DriverFiles, Library};
pub use host_file::HostFile;
pub use nvml::System;

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
    pub drm_nodes: Vec<drm::DrmNode>,
    /// The architecture of the driver's libraries and of the containers: the build target's.
    #[serde(default)]
    pub arch: Arch,
}

pub use nvhook_model::inventory::{Gpu, MigDevice};

#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error(transparent)]
    Driver(#[from] driver::DriverError),
    #[error(transparent)]
    Devices(#[from] devices::DevicesError),
    /// The message of an error raised in the isolated NVML process.
    #[error("{0}")]
    Child(String),
    #[error(
        "NVML did not answer within {0} ms (nvml-timeout-ms): enable persistence mode (nvidia-smi -pm 1, or start nvidia-persistenced) or raise nvml-timeout-ms in the nvhook config"
    )]
    Timeout(u128),
}

/// The NVML library to load: `nvml-library`, else `libnvidia-ml.so.1` in the driver root's cache.
pub fn nvml_library(config: &Config, cache: &driver::HostCache) -> Result<PathBuf, InventoryError> {
    Ok(match &config.nvml_library {
        Some(p) => p.clone(),
        None => cache.nvml_library(config)?,
    })
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
    /// Reads everything: NVML (asked now, in [`isolated::HELPER`]), driver files,
    /// `/proc/devices`, device nodes, MIG capabilities.
    pub fn load(config: &Config) -> Result<Inventory, InventoryError> {
        isolated::load_uncached(config, Scope::ALL)
    }

    /// The inventory around what NVML reported: everything else is read from the host now.
    pub fn around(
        config: &Config,
        cache: &driver::HostCache,
        system: nvml::System,
        scope: Scope,
    ) -> Result<Inventory, InventoryError> {
        let caps = devices::MigCapabilities::read(config);
        let mut gpus = system.gpus;
        for gpu in &mut gpus {
            caps.annotate(gpu);
        }
        Ok(Inventory {
            files: DriverFiles::find(config, cache, &system.driver_version, scope),
            cuda_version: system.cuda_version,
            driver_version: system.driver_version,
            drm_nodes: match scope.graphics {
                true => drm::scan(config, &gpus),
                false => Vec::new(),
            },
            gpus,
            majors: DeviceMajors::read(config)?,
            nodes: devices::scan_nodes(config)?,
            mig_config_minor: caps.config_minor,
            mig_monitor_minor: caps.monitor_minor,
            proc_driver: Some(config.proc_path("driver/nvidia")).filter(|p| p.is_dir()),
            arch: cache.arch(),
        })
    }

    /// What NVML reported, as [`Inventory::around`] takes it.
    pub fn system(&self) -> nvml::System {
        nvml::System {
            driver_version: self.driver_version.clone(),
            cuda_version: self.cuda_version.clone(),
            gpus: self.gpus.clone(),
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
