//! What nvhook asks NVML to do rather than to tell (make a MIG device, limit a cgroup's GPU
//! memory): through [`HELPER`], which loads NVML as the inventory's query does, with the same
//! NVML library, runs one action and answers JSON.

use super::driver::HostCache;
use super::isolated::{HELPER, helper_command};
use super::{InventoryError, NvmlActionFailure, nvml_library, nvml_return};
use crate::config::Config;
use serde::de::DeserializeOwned;
use std::ffi::OsStr;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum NvmlActionError {
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
    /// NVML refused: its code where it gave one, in [`NvmlActionFailure::code`].
    #[error(transparent)]
    Nvml(#[from] NvmlActionFailure),
}

impl NvmlActionError {
    /// NVML's `nvmlReturn_t` for a refusal (see [`super::nvml_return`]); None for other errors.
    pub fn nvml_code(&self) -> Option<u32> {
        match self {
            NvmlActionError::Nvml(failure) => failure.code,
            _ => None,
        }
    }

    /// Whether NVML cannot do it here at all, rather than failed at it: the driver lacks the
    /// call (FUNCTION_NOT_FOUND), or the GPU or driver does not support it (NOT_SUPPORTED, also
    /// a MIG device's memory limit). A caller's policy may go on without it.
    pub fn is_unsupported(&self) -> bool {
        matches!(
            self.nvml_code(),
            Some(nvml_return::FUNCTION_NOT_FOUND | nvml_return::NOT_SUPPORTED)
        )
    }
}

/// The NVML helper program that runs the actions.
#[derive(Debug, Clone)]
pub struct NvmlActions {
    helper: PathBuf,
}

impl NvmlActions {
    /// [`HELPER`] beside the running program, as nvhook's own binaries are installed.
    pub fn beside_nvhook() -> NvmlActions {
        NvmlActions::at(crate::binary_paths::beside_nvhook(HELPER))
    }

    /// The helper at `helper`: a build directory's, for a program that is not installed beside it.
    pub fn at(helper: PathBuf) -> NvmlActions {
        NvmlActions { helper }
    }

    /// Runs the helper's action `args` and reads its answer. NVML needs no deadline here: this
    /// is no container start, and an action cut short could leave an instance half made.
    pub(super) fn run<T: DeserializeOwned>(
        &self,
        config: &Config,
        args: &[&OsStr],
    ) -> Result<T, NvmlActionError> {
        let host_cache = HostCache::open(config).map_err(InventoryError::from)?;
        let library = nvml_library(config, &host_cache)?;
        let output = helper_command(&self.helper, &library)
            .args(args)
            .output()
            .map_err(|source| NvmlActionError::Run {
                helper: self.helper.clone(),
                source,
            })?;
        let reply: Result<T, NvmlActionFailure> =
            serde_json::from_slice(&output.stdout).map_err(|_| NvmlActionError::NoAnswer {
                helper: self.helper.clone(),
                status: output.status,
            })?;
        Ok(reply?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_call_and_an_unsupported_gpu_are_unsupported() {
        let refused = |code| {
            NvmlActionError::Nvml(NvmlActionFailure {
                code,
                message: String::new(),
            })
        };
        assert!(refused(Some(nvml_return::FUNCTION_NOT_FOUND)).is_unsupported());
        assert!(refused(Some(nvml_return::NOT_SUPPORTED)).is_unsupported());
        for code in [
            Some(nvml_return::INVALID_ARGUMENT),
            Some(nvml_return::OPERATING_SYSTEM),
            None,
        ] {
            assert!(!refused(code).is_unsupported(), "{code:?}");
        }
    }
}
