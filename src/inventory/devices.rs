//! Device majors from `<proc-root>/devices`, device nodes under the dev root, and MIG
//! capability minors from `<proc-root>/driver/nvidia/capabilities`, as the host has them now.

use super::device_numbers::{parse_cap_minor, parse_proc_devices};
use super::{DeviceMajors, Gpu, HostNode};
use crate::config::Config;
use crate::imex_and_families;
use crate::whole_file::read_kernel_text;

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum DevicesError {
    #[error("cannot read {path}: {source} (is proc-root right in the nvhook config?)")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path} lists no `nvidia` or `nvidia-frontend` character device: the NVIDIA kernel module is not loaded"
    )]
    NoDriver { path: PathBuf },
}

/// The device majors the host's `/proc/devices` lists now.
pub fn read_majors(config: &Config) -> Result<DeviceMajors, DevicesError> {
    let path = config.proc_path("devices");
    let text = read_kernel_text(&path).map_err(|source| DevicesError::Read {
        path: path.clone(),
        source,
    })?;
    parse_proc_devices(&text).ok_or(DevicesError::NoDriver { path })
}

/// Every `nvidia*` character device in `<dev-root>/dev` and `<dev-root>/dev/nvidia-caps`,
/// and the nodes of IMEX channels and of the opt-in device families
/// ([`crate::imex_and_families`]).
pub fn scan_nodes(config: &Config) -> Result<Vec<HostNode>, DevicesError> {
    let mut dirs = vec!["/dev", "/dev/nvidia-caps"];
    dirs.extend(imex_and_families::all_kinds().map(|k| k.dir));
    dirs.sort();
    dirs.dedup();
    let mut nodes = Vec::new();
    for dir in dirs {
        let nvidia_dir = matches!(dir, "/dev" | "/dev/nvidia-caps");
        scan_dir(&config.dev_path(dir), dir, &mut nodes, |name| {
            (nvidia_dir && name.starts_with("nvidia"))
                || imex_and_families::all_kinds().any(|k| k.matches_entry(dir, name))
        })?;
    }
    nodes.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(nodes)
}

fn scan_dir(
    host_dir: &Path,
    container_dir: &str,
    out: &mut Vec<HostNode>,
    wanted: impl Fn(&str) -> bool,
) -> Result<(), DevicesError> {
    let entries = match std::fs::read_dir(host_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(DevicesError::Read {
                path: host_dir.to_path_buf(),
                source,
            });
        }
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str().filter(|n| wanted(n)) else {
            continue;
        };
        // The entry itself, never what a link leads to: its type from the listing, so that a
        // directory (nvidia-caps) costs no lookup, then its numbers, relative to the directory.
        if !entry.file_type().is_ok_and(|t| t.is_char_device()) {
            continue;
        }
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        if !meta.file_type().is_char_device() {
            continue;
        }
        let rdev = meta.rdev();
        out.push(HostNode {
            path: format!("{container_dir}/{name}"),
            host_path: entry.path(),
            major: libc::major(rdev),
            minor: libc::minor(rdev),
            mode: meta.mode() & 0o7777,
        });
    }
    Ok(())
}

/// nvidia-caps minors read from the driver's capability files.
#[derive(Debug, Default)]
pub struct MigCapabilities {
    root: PathBuf,
    pub config_minor: Option<u32>,
    pub monitor_minor: Option<u32>,
}

impl MigCapabilities {
    pub fn read(config: &Config) -> MigCapabilities {
        let root = config.proc_path("driver/nvidia/capabilities");
        MigCapabilities {
            config_minor: read_cap_minor(&root.join("mig/config")),
            monitor_minor: read_cap_minor(&root.join("mig/monitor")),
            root,
        }
    }

    /// Fills in the GI and CI capability minors of each MIG device of `gpu`.
    pub fn annotate(&self, gpu: &mut Gpu) {
        // A GPU without a minor (WSL2's) has no capability files, and no MIG devices.
        let Some(minor) = gpu.minor else {
            return;
        };
        let gpu_dir = self.root.join(format!("gpu{minor}/mig"));
        for mig in &mut gpu.mig_devices {
            let gi = gpu_dir.join(format!("gi{}", mig.gpu_instance_id));
            mig.gi_cap_minor = read_cap_minor(&gi.join("access"));
            mig.ci_cap_minor =
                read_cap_minor(&gi.join(format!("ci{}/access", mig.compute_instance_id)));
        }
    }
}

fn read_cap_minor(path: &Path) -> Option<u32> {
    parse_cap_minor(&read_kernel_text(path).ok()?)
}
