//! The devices this node offers, named as NVIDIA's DRA drivers name them.

use super::names::{gpu_number, mig_name};
use super::partitions::{Partition, partitions};
use crate::inventory::Inventory;
use crate::plan;
use crate::request::DeviceId;
use std::collections::BTreeSet;

/// A device of the node's pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraDevice {
    /// `gpu-<minor>` for a GPU: its `/dev/nvidia<minor>`, not its NVML index. For a MIG device
    /// [`super::names::mig_name`]'s, for an IMEX channel `channel-<number>`.
    pub name: String,
    pub kind: DeviceKind,
}

/// What a device of the pool is, as a claim's CDI spec is made from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceKind {
    /// [`DeviceId::Index`] for a GPU, [`DeviceId::MigIndex`] for a MIG device.
    Gpu(DeviceId),
    /// A place on a GPU in MIG mode where a MIG device is made for the claim that is given
    /// it, unless one is there already (`made`: its MIG index).
    MigPartition {
        partition: Partition,
        made: Option<u32>,
    },
    /// `/dev/nvidia-caps-imex-channels/channel<N>`: a multi-node NVLink workload's channel,
    /// given to the claim that asks for it as the device node alone.
    ImexChannel(u32),
}

/// Every device of `inventory`, as NVIDIA's driver offers them with MIG left static: a GPU
/// with MIG mode off as itself, a GPU in MIG mode through its MIG devices only (the whole GPU
/// is not free to give). A MIG device whose name cannot be made (the inventory lacks its
/// profile, profile id or placement: an older driver, or NVML refused to say) is left out,
/// with a line in the log, rather than offered under a name a claim for NVIDIA's would miss.
/// Then each IMEX channel node the host has, under the name NVIDIA's ComputeDomain driver
/// gives it.
pub fn devices(inventory: &Inventory) -> Vec<DraDevice> {
    offered(inventory, Mig::Static)
}

/// How a GPU in MIG mode is offered.
#[derive(Debug, Clone, Copy)]
pub enum Mig<'a> {
    /// As the MIG devices it has.
    Static,
    /// As every place each MIG profile can take on it ([`partitions`]), where NVML gave the
    /// GPU's profiles; `made_here` names the MIG devices nvhook-dra made for prepared claims.
    Partitionable { made_here: &'a BTreeSet<String> },
}

/// Every device of `inventory`, GPUs in MIG mode offered as `mig` says.
pub fn offered(inventory: &Inventory, mig: Mig<'_>) -> Vec<DraDevice> {
    let mut out = Vec::new();
    for gpu in &inventory.gpus {
        if !gpu.mig_enabled {
            out.push(DraDevice {
                name: format!("gpu-{}", gpu_number(gpu)),
                kind: DeviceKind::Gpu(DeviceId::Index(gpu.index)),
            });
            continue;
        }
        if let Mig::Partitionable { made_here } = mig
            && !gpu.mig_profiles.is_empty()
        {
            out.extend(
                partitions(gpu, made_here)
                    .into_iter()
                    .map(|place| DraDevice {
                        name: place.name,
                        kind: DeviceKind::MigPartition {
                            partition: place.partition,
                            made: place.made,
                        },
                    }),
            );
            continue;
        }
        for mig in &gpu.mig_devices {
            let Some(name) = mig_name(gpu, mig) else {
                tracing::info!(
                    gpu = gpu.index,
                    mig = mig.index,
                    uuid = %mig.uuid,
                    "DRA: MIG device not offered: NVML did not give its profile and placement"
                );
                continue;
            };
            out.push(DraDevice {
                name,
                kind: DeviceKind::Gpu(DeviceId::MigIndex {
                    gpu: gpu.index,
                    mig: mig.index,
                }),
            });
        }
    }
    let mut channels: Vec<u32> = plan::imex_channel_nodes(inventory)
        .into_iter()
        .map(|(channel, _)| channel)
        .collect();
    channels.sort_unstable();
    out.extend(channels.into_iter().map(|channel| DraDevice {
        name: format!("channel-{channel}"),
        kind: DeviceKind::ImexChannel(channel),
    }));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvhook_model::plan::fixtures::{inventory, node};

    #[test]
    fn gpus_are_named_by_their_minor() {
        let mut inv = inventory(3, &[]);
        // Minors need not follow NVML's order.
        inv.gpus[0].minor = Some(2);
        inv.gpus[2].minor = Some(0);
        let names: Vec<(String, DeviceKind)> = devices(&inv)
            .into_iter()
            .map(|d| (d.name, d.kind))
            .collect();
        let gpu = |index| DeviceKind::Gpu(DeviceId::Index(index));
        assert_eq!(
            names,
            [
                ("gpu-2".to_string(), gpu(0)),
                ("gpu-1".to_string(), gpu(1)),
                ("gpu-0".to_string(), gpu(2)),
            ]
        );
    }

    #[test]
    fn a_gpu_in_mig_mode_is_offered_as_its_mig_devices_under_nvidias_names() {
        let mut inv = inventory(3, &[(1, 2)]);
        inv.gpus[1].minor = Some(5);
        let offered = devices(&inv);
        let names: Vec<(&str, DeviceKind)> = offered
            .iter()
            .map(|d| (d.name.as_str(), d.kind.clone()))
            .collect();
        let mig = |mig| DeviceKind::Gpu(DeviceId::MigIndex { gpu: 1, mig });
        assert_eq!(
            names,
            [
                ("gpu-0", DeviceKind::Gpu(DeviceId::Index(0))),
                ("gpu-5-mig-3g40gb-9-0", mig(0)),
                ("gpu-5-mig-3g40gb-9-4", mig(1)),
                ("gpu-2", DeviceKind::Gpu(DeviceId::Index(2))),
            ]
        );
        // NVIDIA's driver parses its names back with this pattern.
        for device in &offered[1..3] {
            let parts: Vec<&str> = device.name.split('-').collect();
            assert_eq!((parts[0], parts[2]), ("gpu", "mig"), "{}", device.name);
            assert!(parts[1].parse::<u32>().is_ok() && parts[4].parse::<u32>().is_ok());
        }
    }

    #[test]
    fn the_hosts_imex_channels_follow_the_gpus() {
        let mut inv = inventory(1, &[]);
        inv.majors.extra = vec![(500, "nvidia-caps-imex-channels".into())];
        // In the order a directory listing gives them, not by number.
        for c in [10, 0, 3] {
            inv.nodes.push(node(
                &format!("/dev/nvidia-caps-imex-channels/channel{c}"),
                500,
                c,
            ));
        }
        // A node under the channels' directory with another major is not a channel.
        inv.nodes
            .push(node("/dev/nvidia-caps-imex-channels/channel9", 501, 9));
        let names: Vec<(String, DeviceKind)> = devices(&inv)
            .into_iter()
            .map(|d| (d.name, d.kind))
            .collect();
        assert_eq!(
            names,
            [
                ("gpu-0".to_string(), DeviceKind::Gpu(DeviceId::Index(0))),
                ("channel-0".to_string(), DeviceKind::ImexChannel(0)),
                ("channel-3".to_string(), DeviceKind::ImexChannel(3)),
                ("channel-10".to_string(), DeviceKind::ImexChannel(10)),
            ]
        );
    }

    #[test]
    fn a_mig_device_nvml_did_not_place_is_left_out() {
        let mut inv = inventory(2, &[(0, 2)]);
        inv.gpus[0].mig_devices[0].placement = None;
        inv.gpus[0].mig_devices[1].gpu_instance_profile_id = None;
        let names: Vec<String> = devices(&inv).into_iter().map(|d| d.name).collect();
        assert_eq!(names, ["gpu-1"]);
        inv.gpus[0].mig_devices[1].gpu_instance_profile_id = Some(9);
        inv.gpus[0].mig_devices[1].profile = None;
        assert_eq!(devices(&inv).len(), 1);
    }
}
