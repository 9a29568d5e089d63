//! Making and removing MIG devices, for a DRA driver that makes the one a claim was given:
//! through [`HELPER`], which loads NVML as the inventory's query does, with the same NVML
//! library. After either, the NVML answer cached for container starts is dropped, so that the
//! next inventory asks NVML again.

use super::cache::NvmlCache;
use super::driver::HostCache;
use super::isolated::{HELPER, helper_command};
use super::{CreatedMig, InventoryError, MigActionFailure, nvml_library};
use crate::config::Config;
use serde::de::DeserializeOwned;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum MigAdminError {
    /// The NVML library to load cannot be found.
    #[error(transparent)]
    Library(#[from] InventoryError),
    #[error("cannot run {helper}: {source} (it is installed beside nvhook; reinstall nvhook)")]
    Run {
        helper: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{helper} gave no answer ({status}): it crashed, most likely in libnvidia-ml (see the driver's log, dmesg)"
    )]
    NoAnswer {
        helper: PathBuf,
        status: std::process::ExitStatus,
    },
    /// NVML refused: its code where it gave one, in [`MigActionFailure::code`].
    #[error(transparent)]
    Nvml(#[from] MigActionFailure),
}

impl MigAdminError {
    /// NVML's `nvmlReturn_t` for a refusal (see [`super::nvml_return`]); None for other errors.
    pub fn nvml_code(&self) -> Option<u32> {
        match self {
            MigAdminError::Nvml(failure) => failure.code,
            _ => None,
        }
    }
}

/// Makes a MIG device on GPU `gpu_uuid`: a GPU instance of profile `profile_id` (a
/// [`super::MigProfile::id`]) at the placement starting at memory slice `start`, and one
/// compute instance spanning it. Through [`HELPER`] beside nvhook.
pub fn create_mig(
    config: &Config,
    gpu_uuid: &str,
    profile_id: u32,
    start: u32,
) -> Result<CreatedMig, MigAdminError> {
    MigAdmin::beside_nvhook().create_mig(config, gpu_uuid, profile_id, start)
}

/// Removes MIG device `mig_uuid`: its compute instance, and its GPU instance once empty.
/// Through [`HELPER`] beside nvhook.
pub fn destroy_mig(config: &Config, mig_uuid: &str) -> Result<(), MigAdminError> {
    MigAdmin::beside_nvhook().destroy_mig(config, mig_uuid)
}

/// The NVML helper program that makes and removes MIG devices.
#[derive(Debug, Clone)]
pub struct MigAdmin {
    helper: PathBuf,
}

impl MigAdmin {
    /// [`HELPER`] beside the running program, as nvhook's own binaries are installed.
    pub fn beside_nvhook() -> MigAdmin {
        MigAdmin::at(crate::binary_paths::beside_nvhook(HELPER))
    }

    /// The helper at `helper`: a build directory's, for a program that is not installed beside it.
    pub fn at(helper: PathBuf) -> MigAdmin {
        MigAdmin { helper }
    }

    /// [`create_mig`] through this helper.
    pub fn create_mig(
        &self,
        config: &Config,
        gpu_uuid: &str,
        profile_id: u32,
        start: u32,
    ) -> Result<CreatedMig, MigAdminError> {
        let (profile_id, start) = (profile_id.to_string(), start.to_string());
        self.run(config, &["create-mig", gpu_uuid, &profile_id, &start])
    }

    /// [`destroy_mig`] through this helper.
    pub fn destroy_mig(&self, config: &Config, mig_uuid: &str) -> Result<(), MigAdminError> {
        self.run(config, &["destroy-mig", mig_uuid])
    }

    /// Runs the helper's action `args` and reads its answer. NVML needs no deadline here: this
    /// is no container start, and an action cut short could leave an instance half made.
    fn run<T: DeserializeOwned>(&self, config: &Config, args: &[&str]) -> Result<T, MigAdminError> {
        let host_cache = HostCache::read(config).map_err(InventoryError::from)?;
        let library = nvml_library(config, &host_cache)?;
        let output = helper_command(&self.helper, &library)
            .args(args)
            .output()
            .map_err(|source| MigAdminError::Run {
                helper: self.helper.clone(),
                source,
            })?;
        // Whatever the answer, the helper may have changed the GPUs' MIG devices.
        NvmlCache::forget(config);
        let reply: Result<T, MigActionFailure> =
            serde_json::from_slice(&output.stdout).map_err(|_| MigAdminError::NoAnswer {
                helper: self.helper.clone(),
                status: output.status,
            })?;
        Ok(reply?)
    }
}
