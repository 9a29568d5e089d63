//! The graphics and display stack's files beside the libraries: the loaders' configs
//! (Vulkan ICD and layers, GLVND's EGL vendor, EGL external platforms, Xorg snippets, OptiX's
//! `nvoptix.bin`, OpenCL's ICD) and Xorg's driver modules, read from what the driver
//! installed: the directories are listed, not a fixed list of files probed.

use super::host_file::{DriverRoot, is_elf};
use super::{ConfigLibraryPath, GLX_SERVER, HostFile, Scope};
use crate::capability::Capability;
use nvhook_ldcache::{Arch, ElfClass};

/// Where the graphics loaders read configs from on a host, in their order of precedence.
const SHARE_DIRS: &[&str] = &["/etc", "/usr/local/share", "/usr/share"];
/// GKE-style installs keep the Vulkan files in the driver's own directory.
const VULKAN_DIRS: &[&str] = &[
    "/etc",
    "/usr/local/share",
    "/usr/share",
    "/usr/local/nvidia",
    "/",
];

/// A directory of configs one loader reads, and which of its files are the driver's.
struct ConfigDir {
    /// Relative to each search directory: `vulkan/icd.d`.
    dir: &'static str,
    search: &'static [&'static str],
    /// Where the container gets the files: a directory its loader reads by default.
    container_root: &'static str,
    capability: Capability,
    is_drivers: fn(&str) -> bool,
}

fn nvidia_json(name: &str) -> bool {
    name.contains("nvidia") && name.ends_with(".json")
}

const CONFIG_DIRS: &[ConfigDir] = &[
    ConfigDir {
        dir: "vulkan/icd.d",
        search: VULKAN_DIRS,
        container_root: "/etc",
        capability: Capability::Graphics,
        is_drivers: nvidia_json,
    },
    ConfigDir {
        dir: "vulkan/implicit_layer.d",
        search: VULKAN_DIRS,
        container_root: "/etc",
        capability: Capability::Graphics,
        is_drivers: nvidia_json,
    },
    ConfigDir {
        dir: "glvnd/egl_vendor.d",
        search: SHARE_DIRS,
        container_root: "/usr/share",
        capability: Capability::Graphics,
        is_drivers: nvidia_json,
    },
    ConfigDir {
        dir: "egl/egl_external_platform.d",
        search: SHARE_DIRS,
        container_root: "/usr/share",
        capability: Capability::Graphics,
        is_drivers: nvidia_json,
    },
    ConfigDir {
        dir: "X11/xorg.conf.d",
        search: SHARE_DIRS,
        container_root: "/usr/share",
        capability: Capability::Graphics,
        is_drivers: |name| name.contains("nvidia") && name.ends_with(".conf"),
    },
    ConfigDir {
        dir: "nvidia",
        search: SHARE_DIRS,
        container_root: "/usr/share",
        capability: Capability::Graphics,
        is_drivers: |name| name == "nvoptix.bin",
    },
    ConfigDir {
        dir: "OpenCL/vendors",
        search: &["/etc"],
        container_root: "/etc",
        capability: Capability::Compute,
        is_drivers: |name| name.contains("nvidia") && name.ends_with(".icd"),
    },
];

/// Where Xorg's modules live on the distributions the driver supports, searched in order,
/// after Debian's multiarch directory of the architecture ([`xorg_dirs`]).
const XORG_DIRS: &[&str] = &[
    "/usr/lib/nvidia/xorg",
    "/usr/lib64/nvidia/xorg",
    "/usr/lib/xorg/modules/drivers",
    "/usr/lib/xorg/modules/extensions",
    "/usr/lib/xorg/modules/updates/drivers",
    "/usr/lib/xorg/modules/updates/extensions",
    "/usr/lib64/xorg/modules/drivers",
    "/usr/lib64/xorg/modules/extensions",
    "/usr/lib64/xorg/modules/updates/drivers",
    "/usr/lib64/xorg/modules/updates/extensions",
];

/// The driver's configs, one per name and directory: the first search directory that has it
/// wins, as the loaders' own precedence has it.
pub(super) fn find_configs(root: &DriverRoot, scope: Scope) -> Vec<HostFile> {
    let mut out: Vec<HostFile> = Vec::new();
    let wanted = CONFIG_DIRS
        .iter()
        .filter(|set| scope.graphics || set.capability != Capability::Graphics);
    for set in wanted {
        for base in set.search {
            let dir = format!("{}/{}", base.trim_end_matches('/'), set.dir);
            let Some(entries) = root.list(&dir) else {
                continue;
            };
            let mut names: Vec<String> = entries
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| (set.is_drivers)(n))
                .collect();
            names.sort();
            for name in names {
                let container_path = format!("{}/{}/{name}", set.container_root, set.dir);
                if out.iter().any(|f| f.container_path == container_path) {
                    continue;
                }
                let Some(found) = root.existing(&format!("{dir}/{name}"), Some(set.capability))
                else {
                    continue;
                };
                if found.host_path.is_file() {
                    out.push(HostFile {
                        container_path,
                        ..found
                    });
                }
            }
        }
    }
    out
}

/// `nvidia_drv.so` and the GLX server module of this driver, at their host paths.
/// Xorg's module directories for `arch`: Debian's `/usr/lib/<tuple>/nvidia/xorg` first.
fn xorg_dirs(arch: Arch) -> Vec<String> {
    let debian = format!("/usr/lib/{}/nvidia/xorg", arch.multiarch(ElfClass::Lib64));
    std::iter::once(debian)
        .chain(XORG_DIRS.iter().map(|d| d.to_string()))
        .collect()
}

pub(super) fn find_xorg_modules(root: &DriverRoot, version: &str, arch: Arch) -> Vec<HostFile> {
    let glx_server = format!("{GLX_SERVER}.{version}");
    let dirs = xorg_dirs(arch);
    ["nvidia_drv.so", glx_server.as_str()]
        .iter()
        .filter_map(|name| {
            dirs.iter().find_map(|dir| {
                root.existing(&format!("{dir}/{name}"), Some(Capability::Graphics))
                    .filter(|f| is_elf(&f.host_path))
            })
        })
        .collect()
}

/// Configs larger than this are not the driver's few lines of JSON.
const MAX_CONFIG_LEN: u64 = 64 * 1024;

/// The absolute `library_path`s in the JSON configs (Vulkan's `ICD`, `layer` and `layers`,
/// GLVND's and EGL's `ICD`). A bare name is left to the loader cache nvhook writes.
pub(super) fn absolute_library_paths(configs: &[HostFile]) -> Vec<ConfigLibraryPath> {
    let mut out = Vec::new();
    for config in configs
        .iter()
        .filter(|c| c.container_path.ends_with(".json"))
    {
        let Some(json) = read_json(&config.host_path) else {
            continue;
        };
        for path in library_paths(&json) {
            if path.starts_with('/') {
                out.push(ConfigLibraryPath {
                    config: config.container_path.clone(),
                    library_path: path.to_string(),
                });
            }
        }
    }
    out
}

fn read_json(path: &std::path::Path) -> Option<serde_json::Value> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_CONFIG_LEN)
        .read_to_string(&mut text)
        .ok()?;
    serde_json::from_str(&text)
        .inspect_err(
            |e| tracing::warn!(path = %path.display(), error = %e, "graphics config is not JSON"),
        )
        .ok()
}

fn library_paths(json: &serde_json::Value) -> Vec<&str> {
    let single = ["ICD", "layer"].iter().filter_map(|key| json.get(key));
    let listed = json
        .get("layers")
        .and_then(|l| l.as_array())
        .into_iter()
        .flatten();
    single
        .chain(listed)
        .filter_map(|entry| entry.get("library_path")?.as_str())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn write(root: &Path, path: &str, text: &str) {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn configs_come_from_what_the_driver_installed_to_where_loaders_look() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(root, "usr/share/vulkan/icd.d/nvidia_icd.json", "{}");
        write(
            root,
            "usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
            "{}",
        );
        // /etc wins over /usr/share, as it does for the Vulkan loader.
        write(root, "etc/vulkan/icd.d/nvidia_icd.json", "{}");
        write(root, "usr/share/glvnd/egl_vendor.d/10_nvidia.json", "{}");
        write(root, "usr/share/glvnd/egl_vendor.d/50_mesa.json", "{}");
        write(
            root,
            "usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
            "{}",
        );
        write(
            root,
            "usr/local/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
            "{}",
        );
        write(root, "usr/share/X11/xorg.conf.d/10-nvidia.conf", "");
        write(root, "usr/share/nvidia/nvoptix.bin", "");
        write(root, "usr/share/nvidia/nvidia-application-profiles-rc", "");
        write(
            root,
            "etc/OpenCL/vendors/nvidia.icd",
            "libnvidia-opencl.so.1",
        );
        let found = find_configs(&DriverRoot::new(root, false), Scope::ALL);
        let paths: Vec<(&str, Capability)> = found
            .iter()
            .map(|f| (f.container_path.as_str(), f.capability.unwrap()))
            .collect();
        assert_eq!(
            paths,
            [
                ("/etc/vulkan/icd.d/nvidia_icd.json", Capability::Graphics),
                (
                    "/etc/vulkan/implicit_layer.d/nvidia_layers.json",
                    Capability::Graphics
                ),
                (
                    "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
                    Capability::Graphics
                ),
                (
                    "/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
                    Capability::Graphics
                ),
                (
                    "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
                    Capability::Graphics
                ),
                (
                    "/usr/share/X11/xorg.conf.d/10-nvidia.conf",
                    Capability::Graphics
                ),
                ("/usr/share/nvidia/nvoptix.bin", Capability::Graphics),
                ("/etc/OpenCL/vendors/nvidia.icd", Capability::Compute),
            ]
        );
        let icd = &found[0];
        assert!(icd.host_path.ends_with("etc/vulkan/icd.d/nvidia_icd.json"));
    }

    #[test]
    fn a_start_without_graphics_looks_for_opencl_alone() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(root, "usr/share/vulkan/icd.d/nvidia_icd.json", "{}");
        write(
            root,
            "etc/OpenCL/vendors/nvidia.icd",
            "libnvidia-opencl.so.1",
        );
        let compute = Scope::for_capabilities(&[Capability::Compute, Capability::Utility]);
        assert_eq!(compute, Scope { graphics: false });
        let found = find_configs(&DriverRoot::new(root, false), compute);
        let paths: Vec<&str> = found.iter().map(|f| f.container_path.as_str()).collect();
        assert_eq!(paths, ["/etc/OpenCL/vendors/nvidia.icd"]);
        assert!(Scope::for_capabilities(&[Capability::Display]).graphics);
    }

    #[test]
    fn absolute_library_paths_are_found_in_every_json_shape() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(
            root,
            "etc/vulkan/icd.d/nvidia_icd.json",
            r#"{"ICD": {"library_path": "/usr/local/nvidia/lib64/libGLX_nvidia.so.0"}}"#,
        );
        write(
            root,
            "etc/vulkan/implicit_layer.d/nvidia_layers.json",
            r#"{"layers": [{"library_path": "libnvidia-vulkan-producer.so"},
                           {"library_path": "/opt/nv/libnvidia-present.so.1"}]}"#,
        );
        write(
            root,
            "usr/share/glvnd/egl_vendor.d/10_nvidia.json",
            r#"{"ICD": {"library_path": "libEGL_nvidia.so.0"}}"#,
        );
        write(
            root,
            "usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
            "not json",
        );
        let configs = find_configs(&DriverRoot::new(root, false), Scope::ALL);
        assert_eq!(
            absolute_library_paths(&configs),
            [
                ConfigLibraryPath {
                    config: "/etc/vulkan/icd.d/nvidia_icd.json".into(),
                    library_path: "/usr/local/nvidia/lib64/libGLX_nvidia.so.0".into(),
                },
                ConfigLibraryPath {
                    config: "/etc/vulkan/implicit_layer.d/nvidia_layers.json".into(),
                    library_path: "/opt/nv/libnvidia-present.so.1".into(),
                },
            ]
        );
    }

    #[test]
    fn xorg_modules_are_elf_files_of_this_driver() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(
            root,
            "usr/lib/xorg/modules/drivers/nvidia_drv.so",
            "\x7fELF",
        );
        write(
            root,
            "usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.550.54.15",
            "\x7fELF",
        );
        write(
            root,
            "usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.580.95.05",
            "\x7fELF",
        );
        let found = find_xorg_modules(&DriverRoot::new(root, false), "580.95.05", Arch::X86_64);
        let paths: Vec<&str> = found.iter().map(|f| f.container_path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/usr/lib/xorg/modules/drivers/nvidia_drv.so",
                "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.580.95.05"
            ]
        );
    }

    #[test]
    fn debian_xorg_modules_are_found_in_the_architectures_own_directory() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for tuple in ["x86_64-linux-gnu", "aarch64-linux-gnu"] {
            write(
                root,
                &format!("usr/lib/{tuple}/nvidia/xorg/nvidia_drv.so"),
                "\x7fELF",
            );
        }
        for (arch, tuple) in [
            (Arch::X86_64, "x86_64-linux-gnu"),
            (Arch::Aarch64, "aarch64-linux-gnu"),
        ] {
            let found = find_xorg_modules(&DriverRoot::new(root, false), "580.95.05", arch);
            let paths: Vec<&str> = found.iter().map(|f| f.container_path.as_str()).collect();
            assert_eq!(
                paths,
                [format!("/usr/lib/{tuple}/nvidia/xorg/nvidia_drv.so")]
            );
        }
    }
}
