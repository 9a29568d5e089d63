//! The plan for one container on this host: its request, the host's inventory and its
//! image's layout (probed read-only). Shared by the hook, the shim and `nvhook plan`.

use crate::config::Config;
use crate::inventory::{self, Inventory, isolated::Source};
use crate::plan::{self, Plan};
use crate::request::Request;
use crate::rootfs::{Rootfs, RootfsError};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum PlanningError {
    #[error(transparent)]
    Inventory(#[from] inventory::InventoryError),
    #[error(transparent)]
    Plan(#[from] plan::PlanError),
    #[error(transparent)]
    Rootfs(#[from] RootfsError),
}

/// [`plan_for`] the host's inventory. A plan that fails on NVML's cached answer is made again
/// from a fresh query: a stale cache may cost a query, never a refused start.
pub fn plan_for_host(
    request: &Request,
    inventory: Inventory,
    source: Source,
    config: &Config,
    rootfs_path: &Path,
) -> Result<Plan, PlanningError> {
    match plan_for(request, &inventory, config, rootfs_path) {
        Err(e) if source == Source::Cache => {
            tracing::info!("plan failed on NVML's cached answer ({e}); asking NVML again");
            let inventory = inventory::isolated::load_fresh(config)?;
            plan_for(request, &inventory, config, rootfs_path)
        }
        planned => planned,
    }
}

/// The plan for a container whose rootfs is at `rootfs_path`.
pub fn plan_for(
    request: &Request,
    inventory: &Inventory,
    config: &Config,
    rootfs_path: &Path,
) -> Result<Plan, PlanningError> {
    let image = Rootfs::open(rootfs_path)?.probe();
    Ok(plan::build(
        request,
        inventory,
        &config.dev_root.display().to_string(),
        image,
    )?)
}
