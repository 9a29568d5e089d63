//! What the host has, read from the host: GPUs (through NVML, in an isolated helper), the
//! driver's files, and the device nodes. The data types are the model's
//! ([`nvhook_model::inventory`]); this module holds the readers that fill them.

pub mod cache;
pub mod change;
pub mod devices;
pub mod driver;
pub mod drm;
pub mod gpu_layout;
pub mod graphics;
mod host_file;
pub mod isolated;
pub mod kept_files;
pub mod memory_limits;
pub mod mig_admin;
pub mod nvml_actions;
mod resolve;
pub mod text;
pub mod wsl;

use crate::config::Config;
use std::path::PathBuf;

pub use nvhook_model::inventory::*;

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

/// The NVML library to load: `nvml-library`, else on WSL2 the driver store's, else
/// `libnvidia-ml.so.1` in the driver root's cache.
pub fn nvml_library(config: &Config, cache: &driver::HostCache) -> Result<PathBuf, InventoryError> {
    if let Some(p) = &config.nvml_library {
        return Ok(p.clone());
    }
    match wsl::find(config) {
        Some(found) => Ok(found.nvml_library(config)),
        None => Ok(cache.nvml_library(config)?),
    }
}

/// Reads everything: NVML (asked now, in [`isolated::HELPER`]), driver files,
/// `/proc/devices`, device nodes, MIG capabilities.
pub fn load(config: &Config) -> Result<Inventory, InventoryError> {
    isolated::load_uncached(config, Scope::ALL)
}

/// The inventory around what NVML reported: everything else is read from the host now.
pub fn around(
    config: &Config,
    cache: &driver::HostCache,
    system: System,
    scope: Scope,
) -> Result<Inventory, InventoryError> {
    around_kept(config, cache, system, scope, None)
}

/// [`around`], with the driver's files from `kept` while a search would find the same
/// ([`driver::find_files_kept`]); with no `kept`, the search is not recorded for keeping.
pub fn around_kept(
    config: &Config,
    cache: &driver::HostCache,
    system: System,
    scope: Scope,
    kept: Option<&mut Option<kept_files::Kept>>,
) -> Result<Inventory, InventoryError> {
    if let Some(found) = wsl::find(config) {
        return Ok(around_wsl(config, cache, system, found));
    }
    let caps = devices::MigCapabilities::read(config);
    let mut gpus = system.gpus;
    for gpu in &mut gpus {
        caps.annotate(gpu);
    }
    Ok(Inventory {
        files: driver::find_files_kept(config, cache, &system.driver_version, scope, kept)?,
        cuda_version: system.cuda_version,
        driver_version: system.driver_version,
        drm_nodes: match scope.graphics {
            true => drm::scan(config, &gpus),
            false => Vec::new(),
        },
        gpus,
        majors: devices::read_majors(config)?,
        nodes: devices::scan_nodes(config)?,
        mig_config_minor: caps.config_minor,
        mig_monitor_minor: caps.monitor_minor,
        proc_driver: Some(config.proc_path("driver/nvidia")).filter(|p| p.is_dir()),
        arch: cache.arch(),
        memory_limits: system.memory_limits,
        wsl: None,
    })
}

/// A WSL2 host's inventory: NVML's GPUs, reached through `/dev/dxg`, and the driver store's
/// files; none of a Linux driver's nodes, majors, files or `/proc/driver/nvidia`.
fn around_wsl(
    config: &Config,
    cache: &driver::HostCache,
    system: System,
    found: wsl::Found,
) -> Inventory {
    Inventory {
        driver_version: system.driver_version,
        cuda_version: system.cuda_version,
        gpus: system.gpus,
        files: DriverFiles::default(),
        majors: DeviceMajors::default(),
        nodes: Vec::new(),
        mig_config_minor: None,
        mig_monitor_minor: None,
        proc_driver: None,
        drm_nodes: Vec::new(),
        arch: cache.arch(),
        memory_limits: system.memory_limits,
        wsl: Some(wsl::read(config, found)),
    }
}
