//! The host driver's user-space files: libraries found through the driver root's
//! ld.so.cache, and binaries, firmware, IPC sockets and graphics configs found by path.

use super::resolve::Resolver;
use crate::capability::Capability;
use crate::config::Config;
use nvhook_ldcache::{self as ldcache, ElfClass, LdCache};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error(
        "cannot read the driver root's loader cache {path}: {source} (is driver-root right, and has ldconfig run there?)"
    )]
    ReadCache {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("bad loader cache {path}: {source} (run ldconfig in the driver root)")]
    ParseCache {
        path: PathBuf,
        source: ldcache::LdCacheError,
    },
    #[error(
        "libnvidia-ml.so.1 is not in {cache} (is the NVIDIA driver installed? set nvml-library in the nvhook config)"
    )]
    NoNvml { cache: PathBuf },
}

/// The libraries each capability brings, by file-name stem (`<stem>.so.<driver version>`).
const LIBRARIES: &[(Capability, &[&str])] = &[
    (
        Capability::Utility,
        &["libnvidia-ml", "libnvidia-cfg", "libnvidia-nscq"],
    ),
    (
        Capability::Compute,
        &[
            "libcuda",
            "libcudadebugger",
            "libnvidia-opencl",
            "libnvidia-gpucomp",
            "libnvidia-ptxjitcompiler",
            "libnvidia-fatbinaryloader",
            "libnvidia-allocator",
            "libnvidia-compiler",
            "libnvidia-pkcs11",
            "libnvidia-pkcs11-openssl3",
            "libnvidia-nvvm",
        ],
    ),
    (
        Capability::Video,
        &[
            "libvdpau_nvidia",
            "libnvidia-encode",
            "libnvidia-opticalflow",
            "libnvcuvid",
        ],
    ),
    (
        Capability::Graphics,
        &[
            "libnvidia-eglcore",
            "libnvidia-glcore",
            "libnvidia-tls",
            "libnvidia-glsi",
            "libnvidia-fbc",
            "libnvidia-ifr",
            "libnvidia-rtcore",
            "libnvoptix",
            "libGLX_nvidia",
            "libEGL_nvidia",
            "libGLESv2_nvidia",
            "libGLESv1_CM_nvidia",
            "libnvidia-glvkspirv",
            "libnvidia-cbl",
        ],
    ),
    (Capability::Ngx, &["libnvidia-ngx"]),
];

const BINARIES: &[(Capability, &str)] = &[
    (Capability::Utility, "nvidia-smi"),
    (Capability::Utility, "nvidia-debugdump"),
    (Capability::Utility, "nvidia-persistenced"),
    (Capability::Compute, "nvidia-cuda-mps-control"),
    (Capability::Compute, "nvidia-cuda-mps-server"),
];

/// Where driver binaries are looked for, in order. GKE-style installs keep the driver under
/// /usr/local/nvidia and put wrapper scripts in /usr/bin that exec the real binary there by
/// its host path, which a container does not have: only ELF files are taken.
const BINARY_DIRS: &[&str] = &["/usr/bin", "/bin", "/usr/sbin", "/usr/local/nvidia/bin"];

const SOCKETS: &[(Capability, &str)] = &[
    (Capability::Utility, "/run/nvidia-persistenced/socket"),
    (Capability::Utility, "/var/run/nvidia-persistenced/socket"),
    (Capability::Utility, "/run/nvidia-fabricmanager/socket"),
    (Capability::Utility, "/var/run/nvidia-fabricmanager/socket"),
    (Capability::Compute, "/tmp/nvidia-mps"),
];

const GRAPHICS_CONFIGS: &[&str] = &[
    "/etc/vulkan/icd.d/nvidia_icd.json",
    "/usr/share/vulkan/icd.d/nvidia_icd.json",
    "/etc/vulkan/implicit_layer.d/nvidia_layers.json",
    "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
    "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
];

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

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DriverFiles {
    pub libraries: Vec<Library>,
    pub binaries: Vec<HostFile>,
    pub firmware: Vec<HostFile>,
    pub sockets: Vec<HostFile>,
    pub configs: Vec<HostFile>,
}

/// The driver root's ld.so.cache, read once per start.
pub struct HostCache {
    path: PathBuf,
    cache: LdCache,
}

impl HostCache {
    pub fn read(config: &Config) -> Result<HostCache, DriverError> {
        let path = config.driver_path("etc/ld.so.cache");
        let bytes = std::fs::read(&path).map_err(|source| DriverError::ReadCache {
            path: path.clone(),
            source,
        })?;
        let cache = LdCache::parse(&bytes).map_err(|source| DriverError::ParseCache {
            path: path.clone(),
            source,
        })?;
        Ok(HostCache { path, cache })
    }

    /// The host path of `libnvidia-ml.so.1`, where NVML is loaded from by default.
    pub fn nvml_library(&self, config: &Config) -> Result<PathBuf, DriverError> {
        self.cache
            .lookup("libnvidia-ml.so.1", ElfClass::X86_64)
            .map(|e| config.driver_path(&e.path))
            .ok_or_else(|| DriverError::NoNvml {
                cache: self.path.clone(),
            })
    }
}

impl DriverFiles {
    /// Finds every driver file of version `version` under the driver root.
    pub fn find(config: &Config, cache: &HostCache, version: &str) -> DriverFiles {
        let root = DriverRoot::new(&config.driver_root);
        DriverFiles {
            libraries: find_libraries(&root, cache, version),
            binaries: BINARIES
                .iter()
                .filter_map(|&(cap, name)| {
                    BINARY_DIRS.iter().find_map(|dir| {
                        root.existing(&format!("{dir}/{name}"), Some(cap))
                            .filter(|f| is_elf(&f.host_path))
                            .map(|f| HostFile {
                                container_path: format!("/usr/bin/{name}"),
                                ..f
                            })
                    })
                })
                .collect(),
            firmware: find_firmware(&root, version),
            sockets: SOCKETS
                .iter()
                .filter_map(|&(cap, p)| root.existing(p, Some(cap)))
                .collect(),
            configs: GRAPHICS_CONFIGS
                .iter()
                .filter_map(|p| root.existing(p, Some(Capability::Graphics)))
                .collect(),
        }
    }
}

/// The driver root, canonical, and the resolver its files are looked up with.
struct DriverRoot {
    path: PathBuf,
    resolver: Resolver,
}

impl DriverRoot {
    fn new(root: &Path) -> DriverRoot {
        DriverRoot {
            path: std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf()),
            resolver: Resolver::default(),
        }
    }

    /// The host file `path` (absolute, in the driver root's terms) ends at, when it exists
    /// and stays inside the root.
    fn canonical(&self, path: &str) -> Option<PathBuf> {
        let host = self
            .resolver
            .canonical(&self.path.join(path.trim_start_matches('/')))?;
        host.starts_with(&self.path).then_some(host)
    }

    fn existing(&self, path: &str, capability: Option<Capability>) -> Option<HostFile> {
        let host = self.canonical(path)?;
        Some(HostFile {
            capability,
            is_dir: host.is_dir(),
            host_path: host,
            container_path: path.to_string(),
        })
    }
}

fn is_elf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| magic == *b"\x7fELF")
}

fn find_libraries(root: &DriverRoot, cache: &HostCache, version: &str) -> Vec<Library> {
    let suffix = format!(".so.{version}");
    let mut out: Vec<Library> = Vec::new();
    for entry in cache.cache.entries() {
        let Some((stem, cap)) = stem_of(&entry.soname) else {
            continue;
        };
        // Installers that ship the development link (`libcuda.so`, seen in the cache of a
        // real driver in /usr/local/nvidia/lib64) put it in the cache too: it names no
        // SONAME, and the plan makes `libcuda.so` itself.
        if entry.soname.len() == stem.len() + ".so".len() {
            continue;
        }
        let Some(class) = ElfClass::from_flags(entry.flags) else {
            continue;
        };
        // A cache entry names the SONAME link; the versioned file behind it is what we mount.
        let Some(host_path) = root.canonical(&entry.path) else {
            continue;
        };
        let Some(file_name) = host_path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        // Only this driver's files: a stale library of another version would not match the module.
        if file_name != format!("{stem}{suffix}") {
            tracing::debug!(path = %host_path.display(), "skipping library of another driver version");
            continue;
        }
        if out
            .iter()
            .any(|l| l.soname == entry.soname && l.class == class)
        {
            continue;
        }
        out.push(Library {
            capability: cap,
            class,
            soname: entry.soname.clone(),
            file_name: file_name.to_string(),
            host_path,
        });
    }
    out.sort_by(|a, b| (a.capability, &a.soname).cmp(&(b.capability, &b.soname)));
    out
}

/// The library stem and capability of a SONAME such as `libcuda.so.1`.
fn stem_of(soname: &str) -> Option<(&'static str, Capability)> {
    let (stem, _) = soname.split_once(".so")?;
    LIBRARIES
        .iter()
        .find_map(|(cap, stems)| stems.iter().find(|s| **s == stem).map(|s| (*s, *cap)))
}

fn find_firmware(root: &DriverRoot, version: &str) -> Vec<HostFile> {
    let dir = format!("/lib/firmware/nvidia/{version}");
    let Ok(entries) = std::fs::read_dir(root.path.join(dir.trim_start_matches('/'))) else {
        return Vec::new();
    };
    let mut out: Vec<HostFile> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            (name.starts_with("gsp") && name.ends_with(".bin"))
                .then(|| root.existing(&format!("{dir}/{name}"), None))?
        })
        .collect();
    out.sort_by(|a, b| a.container_path.cmp(&b.container_path));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn development_links_in_the_cache_are_not_sonames() {
        // The cache of a real 580 driver in /usr/local/nvidia/lib64 lists `libcuda.so` too.
        let root = tempfile::tempdir().unwrap();
        let lib_dir = root.path().join("usr/local/nvidia/lib64");
        std::fs::create_dir_all(&lib_dir).unwrap();
        let real = "libcuda.so.580.159.04";
        std::fs::write(lib_dir.join(real), b"").unwrap();
        let mut cache = LdCache::default();
        for name in ["libcuda.so", "libcuda.so.1"] {
            std::os::unix::fs::symlink(real, lib_dir.join(name)).unwrap();
            let path = format!("/usr/local/nvidia/lib64/{name}");
            cache.insert(ldcache::Entry::new(name, path, ElfClass::X86_64));
        }
        let cache = HostCache {
            path: root.path().join("etc/ld.so.cache"),
            cache,
        };
        let found = find_libraries(&DriverRoot::new(root.path()), &cache, "580.159.04");
        let names: Vec<&str> = found.iter().map(|l| l.soname.as_str()).collect();
        assert_eq!(names, ["libcuda.so.1"]);
        assert_eq!(found[0].file_name, real);
    }

    #[test]
    fn binaries_are_elf_files_and_wrapper_scripts_are_passed_over() {
        let root = tempfile::tempdir().unwrap();
        for dir in ["usr/bin", "usr/local/nvidia/bin", "etc"] {
            std::fs::create_dir_all(root.path().join(dir)).unwrap();
        }
        let wrapper = b"#!/bin/sh\nexec /usr/local/nvidia/bin/nvidia-smi \"$@\"\n";
        std::fs::write(root.path().join("usr/bin/nvidia-smi"), wrapper).unwrap();
        let real = root.path().join("usr/local/nvidia/bin/nvidia-smi");
        std::fs::write(&real, b"\x7fELF\x02\x01\x01").unwrap();
        std::fs::write(root.path().join("usr/bin/nvidia-debugdump"), b"\x7fELF").unwrap();
        let config = Config {
            driver_root: root.path().to_path_buf(),
            ..Config::default()
        };
        let cache = HostCache {
            path: root.path().join("etc/ld.so.cache"),
            cache: LdCache::default(),
        };
        let files = DriverFiles::find(&config, &cache, "580.159.04");
        let found: Vec<(&str, &Path)> = files
            .binaries
            .iter()
            .map(|f| (f.container_path.as_str(), f.host_path.as_path()))
            .collect();
        let root = std::fs::canonicalize(root.path()).unwrap();
        assert_eq!(
            found,
            [
                (
                    "/usr/bin/nvidia-smi",
                    real.canonicalize().unwrap().as_path()
                ),
                (
                    "/usr/bin/nvidia-debugdump",
                    root.join("usr/bin/nvidia-debugdump").as_path()
                ),
            ]
        );
    }

    #[test]
    fn stems_map_to_capabilities() {
        assert_eq!(
            stem_of("libcuda.so.1"),
            Some(("libcuda", Capability::Compute))
        );
        assert_eq!(
            stem_of("libnvidia-ml.so.1"),
            Some(("libnvidia-ml", Capability::Utility))
        );
        assert_eq!(
            stem_of("libGLX_nvidia.so.0"),
            Some(("libGLX_nvidia", Capability::Graphics))
        );
        // A prefix is not a match: libcudart is the CUDA runtime, not the driver.
        assert_eq!(stem_of("libcudart.so.12"), None);
        assert_eq!(stem_of("libc.so.6"), None);
    }
}
