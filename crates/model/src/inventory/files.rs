//! The driver's files as the host readers found them: libraries, files that keep their path,
//! and the paths the graphics configs name.

use crate::capability::Capability;
use nvhook_ldcache::ElfClass;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Library {
    pub capability: Capability,
    pub class: ElfClass,
    /// `libcuda.so.1`
    pub soname: String,
    /// `libcuda.so.550.54.15`: the real file, which is what gets mounted.
    pub file_name: String,
    /// The real file on the host.
    pub host_path: PathBuf,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DriverFiles {
    pub libraries: Vec<Library>,
    pub binaries: Vec<HostFile>,
    pub firmware: Vec<HostFile>,
    pub sockets: Vec<HostFile>,
    /// The graphics loaders' configs (Vulkan, EGL, Xorg, OptiX) and OpenCL's ICD file.
    pub configs: Vec<HostFile>,
    /// Xorg's driver modules, kept at their host paths (an xorg.conf's ModulePath names them).
    #[serde(default)]
    pub xorg_modules: Vec<HostFile>,
    /// Absolute `library_path`s the configs name, which must resolve in the container too.
    #[serde(default)]
    pub config_library_paths: Vec<ConfigLibraryPath>,
}

/// A file that keeps its path: a binary, firmware, a socket or a config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostFile {
    /// None: needed by every GPU container (firmware).
    pub capability: Option<Capability>,
    pub host_path: PathBuf,
    pub container_path: String,
    /// A directory (the MPS pipe directory) rather than a file or socket.
    pub is_dir: bool,
}

/// The name Xorg loads the GLX server module by; the file carries the driver version.
pub const GLX_SERVER: &str = "libglxserver_nvidia.so";

/// A config's `library_path` given as an absolute path: the loader opens it as it is, so the
/// container needs the library there too.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigLibraryPath {
    /// The config, in the container.
    pub config: String,
    pub library_path: String,
}
