//! Each GPU's DRM nodes (`/dev/dri/card*`, `/dev/dri/renderD*`), which the kernel lists under
//! the GPU's PCI device in sysfs. A node is taken only when its number is the one sysfs gives
//! for it: a name alone could point a container at another device.

use super::{DrmNode, Gpu, HostNode};
use crate::config::Config;
use std::os::unix::fs::{FileTypeExt, MetadataExt};

/// The DRM nodes of every GPU, where the host has them (the nvidia-drm module loaded).
pub fn scan(config: &Config, gpus: &[Gpu]) -> Vec<DrmNode> {
    let mut out = Vec::new();
    for gpu in gpus {
        let dir = config.sys_path(&format!("bus/pci/devices/{}/drm", gpu.pci_bus_id));
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut names: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| is_drm_node_name(n))
            .collect();
        names.sort();
        for name in names {
            let Some(number) = std::fs::read_to_string(dir.join(&name).join("dev"))
                .ok()
                .and_then(|t| parse_dev(&t))
            else {
                continue;
            };
            match node(config, &name, number) {
                Some(node) => out.push(DrmNode {
                    pci_bus_id: gpu.pci_bus_id.clone(),
                    node,
                }),
                None => tracing::warn!(
                    gpu = %gpu.pci_bus_id,
                    "no /dev/dri/{name} with {}:{} under the dev root: left out",
                    number.0,
                    number.1
                ),
            }
        }
    }
    out
}

fn is_drm_node_name(name: &str) -> bool {
    ["card", "renderD"].iter().any(|prefix| {
        name.strip_prefix(prefix)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// sysfs's `dev` file: `226:128`.
fn parse_dev(text: &str) -> Option<(u32, u32)> {
    let (major, minor) = text.trim().split_once(':')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

fn node(config: &Config, name: &str, (major, minor): (u32, u32)) -> Option<HostNode> {
    let path = format!("/dev/dri/{name}");
    let host_path = config.dev_path(&path);
    // The node itself, never through a link.
    let meta = std::fs::symlink_metadata(&host_path).ok()?;
    let rdev = meta.rdev();
    let right = meta.file_type().is_char_device()
        && libc::major(rdev) == major
        && libc::minor(rdev) == minor;
    right.then(|| HostNode {
        path,
        host_path,
        major,
        minor,
        mode: meta.mode() & 0o7777,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers() {
        assert!(is_drm_node_name("card0"));
        assert!(is_drm_node_name("renderD128"));
        assert!(!is_drm_node_name("card0-DP-1"));
        assert!(!is_drm_node_name("card"));
        assert!(!is_drm_node_name("controlD64x"));
        assert_eq!(parse_dev("226:128\n"), Some((226, 128)));
        assert_eq!(parse_dev("226"), None);
        assert_eq!(parse_dev("a:1"), None);
    }
}
