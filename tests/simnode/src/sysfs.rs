//! The node's sysfs: what the kernel publishes there that nvhook reads, the DRM nodes under
//! each GPU's PCI device, the custom firmware path and the machine's DMI product name.

use crate::devices::{DRM_MAJOR, drm_nodes};
use crate::procfs::put;
use crate::spec::Gpu;
use anyhow::Result;
use std::path::Path;

/// The simulated machine's DMI product name (`/sys/class/dmi/id/product_name`).
pub const PRODUCT_NAME: &str = "nvhook simulated GPU node";

pub fn write(sys_root: &Path, gpus: &[Gpu], drm: bool, firmware_path: Option<&str>) -> Result<()> {
    if drm {
        for gpu in gpus {
            let dir = sys_root.join(format!("bus/pci/devices/{}/drm", gpu.kernel_bus_id()));
            for (name, minor, _) in drm_nodes(gpu) {
                put(
                    &dir.join(name).join("dev"),
                    &format!("{DRM_MAJOR}:{minor}\n"),
                )?;
            }
        }
    }
    // What `nvhook labels` (as GPU feature discovery) gives as nvidia.com/gpu.machine.
    put(
        &sys_root.join("class/dmi/id/product_name"),
        &format!("{PRODUCT_NAME}\n"),
    )?;
    // The kernel's parameter file exists whether or not a path is set: empty by default.
    put(
        &sys_root.join("module/firmware_class/parameters/path"),
        &format!("{}\n", firmware_path.unwrap_or_default()),
    )
}
