//! Device nodes present on the host.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// A character device node present on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostNode {
    /// Where it appears in a container (`/dev/nvidia0`).
    pub path: String,
    /// Where it is on the host (under the dev root).
    pub host_path: PathBuf,
    pub major: u32,
    pub minor: u32,
    pub mode: u32,
}

/// A DRM node and the GPU it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrmNode {
    pub pci_bus_id: String,
    pub node: HostNode,
}
