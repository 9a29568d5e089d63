//! Making and removing MIG devices, for a DRA driver that makes the one a claim was given,
//! through nvhook-nvml ([`NvmlActions`]). After either, the NVML answer cached for container
//! starts is dropped, so that the next inventory asks NVML again.

use super::CreatedMig;
use super::cache::NvmlCache;
use super::nvml_actions::{NvmlActionError, NvmlActions};
use crate::config::Config;
use std::ffi::OsStr;

/// Makes a MIG device on GPU `gpu_uuid`: a GPU instance of profile `profile_id` (a
/// [`super::MigProfile::id`]) at the placement starting at memory slice `start`, and one
/// compute instance spanning it. Through the helper beside nvhook.
pub fn create_mig(
    config: &Config,
    gpu_uuid: &str,
    profile_id: u32,
    start: u32,
) -> Result<CreatedMig, NvmlActionError> {
    NvmlActions::beside_nvhook().create_mig(config, gpu_uuid, profile_id, start)
}

/// Removes MIG device `mig_uuid`: its compute instance, and its GPU instance once empty.
/// Through the helper beside nvhook.
pub fn destroy_mig(config: &Config, mig_uuid: &str) -> Result<(), NvmlActionError> {
    NvmlActions::beside_nvhook().destroy_mig(config, mig_uuid)
}

impl NvmlActions {
    /// [`create_mig`] through this helper.
    pub fn create_mig(
        &self,
        config: &Config,
        gpu_uuid: &str,
        profile_id: u32,
        start: u32,
    ) -> Result<CreatedMig, NvmlActionError> {
        let (profile_id, start) = (profile_id.to_string(), start.to_string());
        let args = ["create-mig", gpu_uuid, &profile_id, &start].map(OsStr::new);
        let made = self.run(config, &args);
        // Whatever the answer, the helper may have changed the GPUs' MIG devices.
        NvmlCache::forget(config);
        made
    }

    /// [`destroy_mig`] through this helper.
    pub fn destroy_mig(&self, config: &Config, mig_uuid: &str) -> Result<(), NvmlActionError> {
        let destroyed = self.run(config, &["destroy-mig", mig_uuid].map(OsStr::new));
        NvmlCache::forget(config);
        destroyed
    }
}
