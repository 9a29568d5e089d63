//! The plan for one container on this host: its request, the host's inventory and its
//! image's layout (probed read-only). Shared by the hook, nvhook-runtime and `nvhook plan`.
//!
//! The image is what the container will see: once the runtime has made the container's mount
//! namespace, through it ([`container_view`]), so that a volume covering part of the image
//! counts as the container sees it and as the hook's writes will find it.

use crate::capability::Capability;
use crate::config::{Config, CudaCompatMode};
use crate::inventory::change::HostChange;
use crate::inventory::{self, Inventory, isolated::Source};
use crate::plan::{self, DriverDirs, ImageInfo, Layout, Plan};
use crate::request::Request;
use crate::rootfs::{Rootfs, RootfsError};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum PlanningError {
    #[error(transparent)]
    Inventory(#[from] inventory::InventoryError),
    #[error(transparent)]
    Plan(#[from] plan::PlanError),
    #[error(transparent)]
    Rootfs(#[from] RootfsError),
    /// The request worked on the host as it was, and the host changed under it.
    #[error("{source}; the host changed since the last start: {change}")]
    HostChanged {
        source: Box<PlanningError>,
        change: HostChange,
    },
}

/// What a plan is made for: an image probed already, or any image (a CDI spec, an NRI
/// adjustment), whose hook probes it when it exists.
#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    Image(&'a ImageInfo),
    AnyImage,
    /// Any image, and no nvhook process at all (NRI's hookless mode): libraries under their
    /// SONAMEs in the loaders' default directories, or in the driver directories the image's
    /// environment names ([`Layout::at_sonames`]).
    AnyImageNoHook(DriverDirs),
}

/// Libraries at their host paths, relative to the canonical driver root: the layout of plans
/// made for any image.
pub fn any_image_layout(config: &Config, arch: nvhook_ldcache::Arch) -> Layout {
    // Library paths are canonical, and so must be the root they are made relative to.
    let driver_root =
        std::fs::canonicalize(&config.driver_root).unwrap_or_else(|_| config.driver_root.clone());
    Layout::host_paths(driver_root, arch)
}

/// [`plan_for`] the host's inventory. A plan that fails on NVML's cached answer is made again
/// from a fresh query: a stale cache may cost a query, never a refused start. A request the
/// host can no longer meet says what changed since NVML last answered.
pub fn plan_for_host(
    request: &Request,
    inventory: Inventory,
    source: Source,
    config: &Config,
    target: Target,
) -> Result<Plan, PlanningError> {
    let failed = match plan_for(request, &inventory, config, target) {
        Ok(plan) => return Ok(plan),
        Err(e) => e,
    };
    let (failed, change) = match source {
        Source::Cache => {
            tracing::info!("plan failed on NVML's cached answer ({failed}); asking NVML again");
            let scope = inventory::Scope::for_capabilities(&request.capabilities);
            let fresh = inventory::isolated::load_fresh(config, scope)?;
            match plan_for(request, &fresh, config, target) {
                Ok(plan) => return Ok(plan),
                Err(e) => (e, HostChange::between(&inventory.system(), &fresh.system())),
            }
        }
        Source::Nvml { change } => (failed, change),
    };
    Err(match change {
        Some(change) => PlanningError::HostChanged {
            source: Box::new(failed),
            change,
        },
        None => failed,
    })
}

/// The plan for a container of `target`.
pub fn plan_for(
    request: &Request,
    inventory: &Inventory,
    config: &Config,
    target: Target,
) -> Result<Plan, PlanningError> {
    let dev_root = config.dev_root.display().to_string();
    Ok(match target {
        Target::Image(image) => plan::build(request, inventory, &dev_root, image.clone())?,
        Target::AnyImage => plan::build_with_layout(
            request,
            inventory,
            &dev_root,
            any_image_layout(config, inventory.arch),
        )?,
        Target::AnyImageNoHook(driver_dirs) => plan::build_with_layout(
            request,
            inventory,
            &dev_root,
            Layout::at_sonames(inventory.arch, driver_dirs),
        )?,
    })
}

/// What the plan needs of the image whose rootfs is at `rootfs_path`, read-only.
pub fn probe_image(
    request: &Request,
    config: &Config,
    rootfs_path: &Path,
) -> Result<ImageInfo, PlanningError> {
    Ok(probe(request, config, &Rootfs::open(rootfs_path)?))
}

/// What the plan needs of the image in `rootfs`, read-only.
pub fn probe(request: &Request, config: &Config, rootfs: &Rootfs) -> ImageInfo {
    let mut image = rootfs.probe();
    // Compat libraries replace the driver's compute libraries only.
    if config.cuda_compat == CudaCompatMode::Auto
        && request.capabilities.contains(&Capability::Compute)
    {
        image.cuda_compat = rootfs.cuda_compat(request.cuda_version.as_deref());
    }
    image
}

/// The rootfs at `rootfs_path` as the process `pid` sees it: a path through its root, which
/// leads into its mount namespace (before pivot_root, the namespace's copy of the host's
/// root), so every mount the runtime made there is crossed as the container will cross it.
pub fn container_view(pid: i32, rootfs_path: &Path) -> PathBuf {
    let mut view = PathBuf::from(format!("/proc/{pid}/root"));
    view.push(rootfs_path.strip_prefix("/").unwrap_or(rootfs_path));
    view
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_container_view_goes_through_the_process_root() {
        assert_eq!(
            container_view(42, Path::new("/run/c/b/rootfs")),
            Path::new("/proc/42/root/run/c/b/rootfs")
        );
    }
}
