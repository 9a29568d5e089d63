//! The CDI specs beside the GPU spec: IMEX channels and the opt-in device families.
//!
//! A CDI spec declares one kind, so each of these is a spec (and a file) of its own, named as
//! NVIDIA's device plugin asks for them: `nvidia.com/imex-channel=<N>` (and `=all`), and
//! `nvidia.com/<family>=all` (`gds`, `mofed`, `nvswitch`, `gdrcopy`). A family is one device,
//! since a workload uses the whole set of its nodes. Only what the host has is offered.

use super::CdiError;
use crate::delivery::cdi_spec::{CdiSpec, ContainerEdits, Device};
use crate::delivery::edits::device_node;
use crate::imex_and_families::Family;
use crate::inventory::Inventory;
use crate::plan::{self, DeviceNode};
use nvhook_cgroup::Access;
use std::path::{Path, PathBuf};

/// The vendor all of nvhook's kinds share.
const VENDOR: &str = "nvidia.com";
pub const IMEX_CLASS: &str = "imex-channel";

/// Every class an extra spec may have, so that a refresh can retire the file of one the host
/// no longer has.
pub fn classes() -> impl Iterator<Item = &'static str> {
    std::iter::once(IMEX_CLASS).chain(Family::ALL.iter().map(|f| f.name()))
}

/// The extra specs for what this host has, by class.
pub fn generate_imex_and_families(
    inventory: &Inventory,
) -> Result<Vec<(&'static str, CdiSpec)>, CdiError> {
    let mut out = Vec::new();
    let channels = plan::imex_channel_nodes(inventory);
    if !channels.is_empty() {
        let mut devices: Vec<Device> = channels
            .iter()
            .map(|(c, node)| device(c.to_string(), std::slice::from_ref(node)))
            .collect();
        let all: Vec<DeviceNode> = channels.into_iter().map(|(_, n)| n).collect();
        devices.push(device("all".into(), &all));
        out.push((IMEX_CLASS, spec(IMEX_CLASS, devices)?));
    }
    for family in Family::ALL {
        let nodes = plan::family_device_nodes(family, inventory);
        if !nodes.is_empty() {
            let devices = vec![device("all".into(), &nodes)];
            out.push((family.name(), spec(family.name(), devices)?));
        }
    }
    Ok(out)
}

fn device(name: String, nodes: &[DeviceNode]) -> Device {
    Device {
        name,
        container_edits: ContainerEdits {
            device_nodes: nodes
                .iter()
                .map(|n| device_node(n, Some(Access::RW.to_string())))
                .collect(),
            ..ContainerEdits::default()
        },
    }
}

fn spec(class: &str, devices: Vec<Device>) -> Result<CdiSpec, CdiError> {
    super::spec_of(
        &format!("{VENDOR}/{class}"),
        devices,
        ContainerEdits::default(),
    )
}

/// A device for each of `wanted` (a name, an IMEX channel number) the host has, carrying its
/// channel's node.
pub fn channel_devices(inventory: &Inventory, wanted: &[(String, u32)]) -> Vec<Device> {
    let nodes = plan::imex_channel_nodes(inventory);
    wanted
        .iter()
        .filter_map(|(name, channel)| {
            let (_, node) = nodes.iter().find(|(c, _)| c == channel)?;
            Some(device(name.clone(), std::slice::from_ref(node)))
        })
        .collect()
}

/// Where the spec of `class` goes beside the GPU spec at `gpu_spec`:
/// `/var/run/cdi/nvidia.yaml` -> `/var/run/cdi/nvidia-imex-channel.yaml`.
pub fn path_beside(gpu_spec: &Path, class: &str) -> PathBuf {
    let stem = gpu_spec
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match gpu_spec.extension() {
        Some(ext) => format!("{stem}-{class}.{}", ext.to_string_lossy()),
        None => format!("{stem}-{class}"),
    };
    gpu_spec.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvhook_model::plan::fixtures::{node, standard};

    fn fabric_inventory() -> Inventory {
        let mut inv = standard();
        inv.majors.extra = vec![
            (500, "nvidia-caps-imex-channels".into()),
            (501, "gdrdrv".into()),
        ];
        for c in [0, 3] {
            inv.nodes.push(node(
                &format!("/dev/nvidia-caps-imex-channels/channel{c}"),
                500,
                c,
            ));
        }
        inv.nodes.push(node("/dev/gdrdrv", 501, 0));
        inv
    }

    #[test]
    fn imex_channels_are_devices_of_their_own_kind_and_families_one_device_each() {
        let specs = generate_imex_and_families(&fabric_inventory()).unwrap();
        let kinds: Vec<&str> = specs.iter().map(|(_, s)| s.kind.as_str()).collect();
        assert_eq!(kinds, ["nvidia.com/imex-channel", "nvidia.com/gdrcopy"]);
        let imex = &specs[0].1;
        let names: Vec<&str> = imex.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["0", "3", "all"]);
        let three = &imex.devices[1].container_edits.device_nodes;
        assert_eq!(three.len(), 1);
        assert_eq!(three[0].path, "/dev/nvidia-caps-imex-channels/channel3");
        assert_eq!((three[0].major, three[0].minor), (Some(500), Some(3)));
        assert_eq!(three[0].permissions.as_deref(), Some("rw"));
        assert_eq!(imex.devices[2].container_edits.device_nodes.len(), 2);
        let gdr = &specs[1].1;
        assert_eq!(gdr.devices.len(), 1);
        assert_eq!(gdr.devices[0].name, "all");
        assert!(generate_imex_and_families(&standard()).unwrap().is_empty());
    }

    #[test]
    fn extra_specs_sit_beside_the_gpu_spec() {
        assert_eq!(
            path_beside(Path::new("/var/run/cdi/nvidia.yaml"), "imex-channel"),
            Path::new("/var/run/cdi/nvidia-imex-channel.yaml")
        );
        assert_eq!(
            path_beside(Path::new("out/spec.json"), "gds"),
            Path::new("out/spec-gds.json")
        );
        let all: Vec<&str> = classes().collect();
        assert_eq!(all, ["imex-channel", "nvswitch", "gds", "mofed", "gdrcopy"]);
    }
}
