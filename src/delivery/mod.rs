//! Between the plan and the ways in: how a plan becomes what a container gets. The edits
//! ([`edits`]: device nodes, cgroup rules, mounts, hooks) are made once, here, for every way
//! in: the CDI generator, nvhook-runtime's create path, the NRI plugin (and the DRA plugin to
//! come); [`config_json`] applies them to a bundle as an engine applies CDI edits. And the
//! one error of preparing a container: reading what it asks for and planning it on this host.

pub mod args_file;
pub mod cdi_spec;
pub mod config_json;
pub mod edits;
pub mod hook_args;

pub use edits::{HookBinary, container_edits, hook_mode_edits, hookless_edits};

use crate::config::ConfigError;
use crate::host_plan::PlanningError;
use crate::inventory::InventoryError;
use crate::oci::OciError;
use crate::request::RequestError;
use crate::rootfs::RootfsError;

/// What can stop any way in from preparing a GPU container: its config, its spec, its request,
/// the host's inventory, the plan, or its image. Each way in's own error wraps this one and
/// adds what only that way in can meet.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Oci(#[from] OciError),
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(transparent)]
    Inventory(#[from] InventoryError),
    #[error(transparent)]
    Planning(#[from] PlanningError),
    #[error(transparent)]
    Rootfs(#[from] RootfsError),
    #[error("the OCI spec has no root.path")]
    NoRoot,
}

/// Lets `?` turn each source of a [`PrepareError`] into the way in's error `$error`, which
/// holds it as `$error::Prepare`.
macro_rules! prepare_error_sources {
    ($error:ty) => {
        $crate::delivery::prepare_error_sources!(@from $error,
            $crate::config::ConfigError,
            $crate::oci::OciError,
            $crate::request::RequestError,
            $crate::inventory::InventoryError,
            $crate::host_plan::PlanningError,
            $crate::rootfs::RootfsError);
    };
    (@from $error:ty, $($source:ty),+) => {
        $(impl From<$source> for $error {
            fn from(e: $source) -> Self {
                Self::Prepare($crate::delivery::PrepareError::from(e))
            }
        })+
    };
}
pub(crate) use prepare_error_sources;
