//! A WSL2 host's driver, read from the host by the rules of [`nvhook_model::inventory::wsl`].
//!
//! A host is taken for a WSL2 GPU host when it has both things a GPU container there needs:
//! `/dev/dxg` (a character device) under the dev root, and an NVIDIA driver store under the
//! driver root (a directory of `/usr/lib/wsl/drivers` holding `libcuda.so.1.1`). NVIDIA's
//! toolkit asks dxcore instead, by loading `libdxcore.so`; nvhook is static and loads no
//! library, and that load fails where the library is elsewhere (NixOS-WSL, NVIDIA's #452),
//! while two file checks do not, and cost a Linux host one failed `lstat`.

use super::{HostNode, WslDriver, WslFile};
use crate::config::Config;
use nvhook_model::inventory::wsl::{
    self, DRIVERS_DIR, DXCORE, DXG, LIB_DIR, NVML, STORE_MARKER, missing_required, takes_from_store,
};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::PathBuf;

/// What makes this host a WSL2 GPU host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub dxg: HostNode,
    /// The store directory in use, as its path in the container.
    pub store: String,
    /// Other NVIDIA store directories, passed over (see [`wsl::pick_store`]).
    pub others: Vec<String>,
}

impl Found {
    /// The store's NVML, which nvhook asks about the GPUs.
    pub fn nvml_library(&self, config: &Config) -> PathBuf {
        config.driver_path(&format!("{}/{NVML}", self.store))
    }
}

/// The WSL2 driver of this host; None on any other host.
pub fn find(config: &Config) -> Option<Found> {
    let dxg = dxg(config)?;
    let drivers = config.driver_path(DRIVERS_DIR);
    let candidates: Vec<String> = std::fs::read_dir(&drivers)
        .ok()?
        .flatten()
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| {
            std::fs::symlink_metadata(drivers.join(name).join(STORE_MARKER))
                .is_ok_and(|m| m.is_file())
        })
        .collect();
    let (name, others) = wsl::pick_store(candidates)?;
    Some(Found {
        dxg,
        store: format!("{DRIVERS_DIR}/{name}"),
        others: others
            .into_iter()
            .map(|o| format!("{DRIVERS_DIR}/{o}"))
            .collect(),
    })
}

/// `/dev/dxg` under the dev root, when it is a character device (taken as it is, never
/// through a link).
fn dxg(config: &Config) -> Option<HostNode> {
    let host_path = config.dev_path(DXG);
    let meta = std::fs::symlink_metadata(&host_path).ok()?;
    if !meta.file_type().is_char_device() {
        return None;
    }
    Some(HostNode {
        path: DXG.into(),
        host_path,
        major: libc::major(meta.rdev()),
        minor: libc::minor(meta.rdev()),
        mode: meta.mode() & 0o7777,
    })
}

/// The driver's files: `libdxcore.so` and what the store holds directly that containers
/// get. A required file the store lacks, or a missing `libdxcore.so`, is logged: NVIDIA's
/// toolkit goes on without them too, and a plan fails only for what its capabilities need.
pub fn read(config: &Config, found: Found) -> WslDriver {
    for other in &found.others {
        tracing::warn!(
            used = %found.store,
            "WSL2: another NVIDIA driver store {other} is passed over"
        );
    }
    let at_host_path = |container_path: String| WslFile {
        host_path: config.driver_path(&container_path),
        container_path,
    };
    let mut files = Vec::new();
    let dxcore = format!("{LIB_DIR}/{DXCORE}");
    if is_file(&config.driver_path(&dxcore)) {
        files.push(at_host_path(dxcore));
    } else {
        tracing::warn!(
            "WSL2: {dxcore} is missing under the driver root: CUDA and NVML in containers will not find the GPUs"
        );
    }
    let dir = config.driver_path(&found.store);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| takes_from_store(name) && is_file(&dir.join(name)))
        .collect();
    names.sort();
    for missing in missing_required(names.iter().map(String::as_str)) {
        tracing::warn!(store = %found.store, "WSL2: the driver store has no {missing}");
    }
    files.extend(
        names
            .iter()
            .map(|name| at_host_path(format!("{}/{name}", found.store))),
    );
    WslDriver {
        dxg: found.dxg,
        store: found.store,
        files,
    }
}

/// A regular file, not a link to one: what a mount source must be.
fn is_file(path: &std::path::Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn host() -> (tempfile::TempDir, Config) {
        let root = tempfile::tempdir().unwrap();
        let config = Config {
            driver_root: root.path().join("driver"),
            dev_root: root.path().to_path_buf(),
            ..Config::default()
        };
        (root, config)
    }

    #[test]
    fn a_linux_host_is_not_wsl() {
        let (_root, config) = host();
        assert_eq!(find(&config), None);
    }

    #[test]
    fn dxg_without_an_nvidia_store_is_not_a_gpu_host() {
        let (root, config) = host();
        std::fs::create_dir_all(root.path().join("dev")).unwrap();
        // A regular file stands in for the node: no mknod without root.
        std::fs::write(root.path().join("dev/dxg"), b"").unwrap();
        let intel = config.driver_path("/usr/lib/wsl/drivers/iigd_dch.inf_amd64_1");
        std::fs::create_dir_all(&intel).unwrap();
        std::fs::write(intel.join("libigd12umd64.so"), b"").unwrap();
        assert_eq!(
            find(&config),
            None,
            "not a character device, and no libcuda"
        );
    }

    #[test]
    fn the_store_gives_its_own_files_and_dxcore_at_their_host_paths() {
        let (_root, config) = host();
        let store = "/usr/lib/wsl/drivers/nv_dispi.inf_amd64_ab";
        let dir = config.driver_path(store);
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        for name in [
            "libcuda.so.1.1",
            "nvcubins.bin",
            "nvapi64.dll",
            "nv_dispi.inf",
        ] {
            std::fs::write(dir.join(name), b"").unwrap();
        }
        std::fs::write(dir.join("sub/libinner.so"), b"").unwrap();
        symlink("libcuda.so.1.1", dir.join("libcuda.so.1")).unwrap();
        let lib = config.driver_path(LIB_DIR);
        std::fs::create_dir_all(&lib).unwrap();
        for name in [DXCORE, "libd3d12.so"] {
            std::fs::write(lib.join(name), b"").unwrap();
        }
        let found = Found {
            dxg: HostNode {
                path: DXG.into(),
                host_path: config.dev_path(DXG),
                major: 10,
                minor: 63,
                mode: 0o666,
            },
            store: store.into(),
            others: Vec::new(),
        };
        let driver = read(&config, found);
        let paths: Vec<&str> = driver
            .files
            .iter()
            .map(|f| f.container_path.as_str())
            .collect();
        assert_eq!(
            paths,
            [
                "/usr/lib/wsl/lib/libdxcore.so".to_string(),
                format!("{store}/libcuda.so.1.1"),
                format!("{store}/nvapi64.dll"),
                format!("{store}/nvcubins.bin"),
            ]
        );
        for f in &driver.files {
            assert_eq!(f.host_path, config.driver_path(&f.container_path));
        }
    }
}
