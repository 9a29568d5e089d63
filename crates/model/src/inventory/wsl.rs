//! A WSL2 host's GPU driver, and where it lives: the one place that knows WSL's layout.
//!
//! In a WSL2 guest the GPUs are paravirtualised: every GPU is reached through one device,
//! `/dev/dxg`, and the user-space driver is not installed in the guest but mapped in from
//! Windows: `libdxcore.so` in [`LIB_DIR`], and NVIDIA's files in its driver store directory
//! under [`DRIVERS_DIR`]. NVIDIA's toolkit gives a container exactly these, at their host
//! paths; so does nvhook. The host readers fill [`WslDriver`] with the rules here, and the
//! planner turns it into device, mounts, links and loader-cache entries.

use super::HostNode;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The one device node of every GPU on WSL2 (a misc device, its minor dynamic).
pub const DXG: &str = "/dev/dxg";
/// Microsoft's libraries mapped into the guest; only [`DXCORE`] of them is a GPU container's.
pub const LIB_DIR: &str = "/usr/lib/wsl/lib";
/// The adapter library CUDA and NVML find the GPUs through.
pub const DXCORE: &str = "libdxcore.so";
/// Windows' driver store, each driver package a directory `<inf>_<arch>_<hash>`.
pub const DRIVERS_DIR: &str = "/usr/lib/wsl/drivers";
/// The file that makes a store directory NVIDIA's: NVIDIA's toolkit takes the first store
/// directory that holds it.
pub const STORE_MARKER: &str = "libcuda.so.1.1";
/// The files NVIDIA's toolkit requires in the store (each missing one is a warning there).
pub const REQUIRED: &[&str] = &[
    "libcuda.so.1.1",
    "libcuda_loader.so",
    "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-ml.so.1",
    "libnvidia-ml_loader.so",
    "libnvdxgdmal.so.1",
    "nvcubins.bin",
    "nvidia-smi",
];
/// The store's NVML, which nvhook loads too.
pub const NVML: &str = "libnvidia-ml.so.1";
/// The store's nvidia-smi, linked at [`SMI_LINK`].
pub const SMI: &str = "nvidia-smi";
pub const SMI_LINK: &str = "/usr/bin/nvidia-smi";

/// A WSL2 host's NVIDIA driver, as found on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WslDriver {
    /// `/dev/dxg` under the dev root.
    pub dxg: HostNode,
    /// The driver store directory, as its path in the container (and on the host, under the
    /// driver root): `/usr/lib/wsl/drivers/nv_dispi.inf_amd64_…`.
    pub store: String,
    /// Every file a GPU container gets, each at its host path: [`DXCORE`] and the store's.
    pub files: Vec<WslFile>,
}

impl WslDriver {
    /// The store's file `name`, when the store has it.
    pub fn store_file(&self, name: &str) -> Option<&WslFile> {
        self.files
            .iter()
            .find(|f| f.dir_and_name() == (self.store.as_str(), name))
    }
}

/// A file of the WSL driver, kept at its host path in the container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WslFile {
    /// On the host (under the driver root).
    pub host_path: PathBuf,
    /// In the container: its host path without the driver root.
    pub container_path: String,
}

impl WslFile {
    /// The directory and file name of its container path.
    pub fn dir_and_name(&self) -> (&str, &str) {
        self.container_path
            .rsplit_once('/')
            .unwrap_or(("", &self.container_path))
    }
}

/// Whether a file directly in the store goes into containers: the required files, and since
/// NVIDIA's toolkit 1.20 every shared library, `.bin` and `.dll` file there too.
pub fn takes_from_store(name: &str) -> bool {
    REQUIRED.contains(&name)
        || name.contains(".so")
        || name.ends_with(".bin")
        || name.ends_with(".dll")
}

/// The name the loader looks a library up by, for a file name like NVIDIA's in the store:
/// `libcuda.so.1.1` is found as `libcuda.so.1`, `libnvidia-ml.so.1` and `libdxcore.so` as
/// themselves. None for what is not a shared library (`nvcubins.bin`, a `.dll`).
pub fn soname_of(file_name: &str) -> Option<&str> {
    let (stem, version) = file_name.split_once(".so")?;
    if !stem.starts_with("lib") {
        return None;
    }
    let at = stem.len() + ".so".len();
    match version {
        "" => Some(file_name),
        v if v.starts_with('.') => {
            let major = v[1..]
                .split('.')
                .next()
                .filter(|m| !m.is_empty() && m.bytes().all(|b| b.is_ascii_digit()))?;
            Some(&file_name[..at + 1 + major.len()])
        }
        _ => None,
    }
}

/// The store directory to use among those under [`DRIVERS_DIR`] that hold [`STORE_MARKER`]
/// (`candidates`, by name), and the others. NVIDIA's toolkit takes the first that dxcore's
/// adapter registry names, which only loading dxcore tells; one NVIDIA driver serves every
/// NVIDIA GPU of the machine, so more than one is an old package left behind, and the first by
/// name is taken, the same on every start, with the others named in the log and by doctor.
pub fn pick_store(mut candidates: Vec<String>) -> Option<(String, Vec<String>)> {
    candidates.sort();
    candidates.dedup();
    let mut it = candidates.into_iter();
    let first = it.next()?;
    Some((first, it.collect()))
}

/// The required files the store lacks.
pub fn missing_required<'a>(names: impl IntoIterator<Item = &'a str> + Clone) -> Vec<&'static str> {
    REQUIRED
        .iter()
        .copied()
        .filter(|r| !names.clone().into_iter().any(|n| n == *r))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_gives_its_libraries_binaries_and_dlls_but_not_the_package_files() {
        for name in REQUIRED {
            assert!(takes_from_store(name), "{name}");
        }
        for name in [
            "libnvwgf2umx.so",
            "nvapi64.dll",
            "nvptxJitCompiler.bin",
            "libfoo.so.3",
        ] {
            assert!(takes_from_store(name), "{name}");
        }
        for name in ["nv_dispi.inf", "nvlddmkm.sys", "nv_disp.cat", "README"] {
            assert!(!takes_from_store(name), "{name}");
        }
    }

    #[test]
    fn libraries_are_found_by_their_first_version_number() {
        assert_eq!(soname_of("libcuda.so.1.1"), Some("libcuda.so.1"));
        assert_eq!(soname_of("libnvidia-ml.so.1"), Some("libnvidia-ml.so.1"));
        assert_eq!(soname_of("libdxcore.so"), Some("libdxcore.so"));
        assert_eq!(soname_of("libcuda_loader.so"), Some("libcuda_loader.so"));
        assert_eq!(soname_of("libnvdxgdmal.so.1"), Some("libnvdxgdmal.so.1"));
        for name in [
            "nvcubins.bin",
            "nvapi64.dll",
            "nvidia-smi",
            "libx.so.",
            "libx.sox",
            "x.so.1",
        ] {
            assert_eq!(soname_of(name), None, "{name}");
        }
    }

    #[test]
    fn of_several_stores_the_first_by_name_is_taken() {
        assert_eq!(pick_store(vec![]), None);
        let stores = vec![
            "nv_dispig.inf_amd64_b".to_string(),
            "nv_dispi.inf_amd64_a".into(),
        ];
        assert_eq!(
            pick_store(stores),
            Some((
                "nv_dispi.inf_amd64_a".into(),
                vec!["nv_dispig.inf_amd64_b".into()]
            ))
        );
    }

    #[test]
    fn missing_required_files_are_named() {
        let present = ["libcuda.so.1.1", "libnvidia-ml.so.1", "nvidia-smi"];
        assert_eq!(
            missing_required(present),
            [
                "libcuda_loader.so",
                "libnvidia-ptxjitcompiler.so.1",
                "libnvidia-ml_loader.so",
                "libnvdxgdmal.so.1",
                "nvcubins.bin"
            ]
        );
    }
}
