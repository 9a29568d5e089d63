//! The nodes of IMEX channels and opt-in device families a request adds.
//!
//! Channels named by number are what the container explicitly asked for: one the host lacks
//! fails the start. `all` and the families are asked for by images whatever node they land
//! on (CUDA images set them by default), so what the host lacks is skipped, logged, and
//! listed in the plan.

use super::{DeviceNode, PlanError, Skipped};
use crate::imex_and_families::{Family, IMEX_CHANNEL, IMEX_DIR, IMEX_MAJOR_NAME};
use crate::inventory::{HostNode, Inventory};
use crate::request::{IMEX_CHANNELS, ImexChannels, Request, channel_ranges};

/// The extra nodes `request` gets on this host, and what was left out and why.
pub(super) fn nodes(
    request: &Request,
    inventory: &Inventory,
) -> Result<(Vec<DeviceNode>, Vec<Skipped>), PlanError> {
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    if let Some(channels) = &request.imex_channels {
        imex(channels, inventory, &mut out, &mut skipped)?;
    }
    for &family in &request.families {
        family_nodes(family, inventory, &mut out, &mut skipped);
    }
    for s in &skipped {
        tracing::info!(what = %s.what, why = %s.why, "skipped");
    }
    Ok((out, skipped))
}

/// Every IMEX channel the host has, as (channel, node): what a CDI spec offers.
pub fn imex_channel_nodes(inventory: &Inventory) -> Vec<(u32, DeviceNode)> {
    host_channels(inventory)
        .into_iter()
        .map(|(c, n)| (c, device_node(n)))
        .collect()
}

/// The nodes of `family` the host has (those whose major /proc/devices confirms).
pub fn family_device_nodes(family: Family, inventory: &Inventory) -> Vec<DeviceNode> {
    let mut out = Vec::new();
    family_nodes(family, inventory, &mut out, &mut Vec::new());
    out
}

/// The host's IMEX channels: `channel<N>` nodes with minor N and the IMEX major.
fn host_channels(inventory: &Inventory) -> Vec<(u32, &HostNode)> {
    let Some(major) = inventory.majors.named(IMEX_MAJOR_NAME) else {
        return Vec::new();
    };
    inventory
        .nodes
        .iter()
        .filter(|n| IMEX_CHANNEL.matches(&n.path) && n.major == major)
        .filter(|n| n.path == channel_path(n.minor))
        .map(|n| (n.minor, n))
        .collect()
}

fn channel_path(channel: u32) -> String {
    format!("{IMEX_DIR}/channel{channel}")
}

fn imex(
    channels: &ImexChannels,
    inventory: &Inventory,
    out: &mut Vec<DeviceNode>,
    skipped: &mut Vec<Skipped>,
) -> Result<(), PlanError> {
    let have = host_channels(inventory);
    let wanted: Vec<u32> = match channels {
        ImexChannels::All => {
            if have.is_empty() {
                skipped.push(Skipped {
                    what: format!("{IMEX_CHANNELS}=all"),
                    why: format!(
                        "this host has no IMEX channel ({IMEX_DIR}/channel* with the {IMEX_MAJOR_NAME} major)"
                    ),
                });
            }
            have.iter().map(|(c, _)| *c).collect()
        }
        ImexChannels::List(list) => {
            if inventory.majors.named(IMEX_MAJOR_NAME).is_none() {
                return Err(PlanError::NoImexMajor {
                    value: channels.to_string().into(),
                });
            }
            list.clone()
        }
    };
    for channel in wanted {
        let node = have
            .iter()
            .find(|(c, _)| *c == channel)
            .map(|(_, n)| *n)
            .ok_or_else(|| PlanError::NoSuchImexChannel {
                channel,
                have: describe(&have),
            })?;
        out.push(device_node(node));
    }
    Ok(())
}

/// The host's channels in numeric order (the nodes come in name order: 0,1,10,100,...).
fn describe(have: &[(u32, &HostNode)]) -> String {
    if have.is_empty() {
        return "no channel".into();
    }
    let mut numbers: Vec<u32> = have.iter().map(|(c, _)| *c).collect();
    numbers.sort_unstable();
    format!("channels {}", channel_ranges(&numbers))
}

fn family_nodes(
    family: Family,
    inventory: &Inventory,
    out: &mut Vec<DeviceNode>,
    skipped: &mut Vec<Skipped>,
) {
    let mut any = false;
    for node in &inventory.nodes {
        let Some(kind) = family.nodes().iter().find(|k| k.matches(&node.path)) else {
            continue;
        };
        any = true;
        if inventory.majors.is_named(node.major, kind.major_names) {
            out.push(device_node(node));
        } else {
            skipped.push(Skipped {
                what: node.path.clone(),
                why: format!(
                    "its major {} is not registered as {} in /proc/devices",
                    node.major,
                    kind.major_names.join(" or ")
                ),
            });
        }
    }
    if !any {
        skipped.push(Skipped {
            what: format!("device family {family} ({})", family.variable()),
            why: format!("{} ({})", family.module_hint(), family.patterns()),
        });
    }
}

fn device_node(node: &HostNode) -> DeviceNode {
    DeviceNode {
        path: node.path.clone(),
        host_path: node.host_path.clone(),
        major: node.major,
        minor: node.minor,
        mode: node.mode,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::device_rule::DeviceRule;
    use crate::plan::fixtures::{DEBIAN, DEV_ROOT, node, spec, standard};
    use crate::plan::{Plan, build};

    const IMEX: u32 = 500;
    const NVSWITCH: u32 = 501;
    const NVLINK: u32 = 502;
    const VERBS: u32 = 231;
    const MISC: u32 = 10;

    /// The standard node with IMEX channels 0-2, NVSwitch and MOFED, no GDS or GDRCopy.
    fn fabric_node() -> Inventory {
        let mut inv = standard();
        inv.majors.extra = vec![
            (MISC, "misc".into()),
            (VERBS, "infiniband_verbs".into()),
            (VERBS, "infiniband_mad".into()),
            (IMEX, IMEX_MAJOR_NAME.into()),
            (NVSWITCH, "nvidia-nvswitch".into()),
            (NVLINK, "nvidia-nvlink".into()),
        ];
        for c in 0..3 {
            inv.nodes.push(node(&channel_path(c), IMEX, c));
        }
        inv.nodes.extend([
            node("/dev/nvidia-nvswitchctl", NVSWITCH, 255),
            node("/dev/nvidia-nvswitch0", NVSWITCH, 0),
            node("/dev/nvidia-nvlink", NVLINK, 0),
            node("/dev/infiniband/uverbs0", VERBS, 192),
            node("/dev/infiniband/umad0", VERBS, 0),
            node("/dev/infiniband/rdma_cm", MISC, 58),
        ]);
        inv
    }

    fn try_plan(inv: &Inventory, env: &[&str]) -> Result<Plan, PlanError> {
        let mut env = env.to_vec();
        env.push("NVIDIA_VISIBLE_DEVICES=0");
        let request = crate::request::Request::from_spec(&spec(&env, &[]), &Config::default())
            .unwrap()
            .unwrap();
        build(&request, inv, DEV_ROOT, DEBIAN)
    }

    /// The extra nodes (beyond GPU 0's own) of a plan, and their rules.
    fn extra_paths(plan: &Plan) -> Vec<&str> {
        let base = try_plan(&standard(), &[]).unwrap();
        let paths: Vec<&str> = plan
            .devices
            .iter()
            .map(|d| d.path.as_str())
            .filter(|p| !base.devices.iter().any(|d| d.path == *p))
            .collect();
        for d in &plan.devices {
            assert!(
                plan.cgroup_rules
                    .contains(&DeviceRule::char_rw(d.major, d.minor)),
                "{} has no rule",
                d.path
            );
        }
        paths
    }

    #[test]
    fn imex_channels_by_number_and_all() {
        let inv = fabric_node();
        let plan = try_plan(&inv, &["NVIDIA_IMEX_CHANNELS=1"]).unwrap();
        assert_eq!(extra_paths(&plan), [channel_path(1)]);
        let one = plan.devices.iter().find(|d| d.path == channel_path(1));
        assert_eq!(one.map(|d| (d.major, d.minor)), Some((IMEX, 1)));
        let all = try_plan(&inv, &["NVIDIA_IMEX_CHANNELS=all"]).unwrap();
        assert_eq!(
            extra_paths(&all),
            (0..3).map(channel_path).collect::<Vec<_>>()
        );
        assert!(all.skipped.is_empty());
    }

    #[test]
    fn a_missing_channel_fails_and_all_on_a_host_without_channels_is_skipped() {
        let inv = fabric_node();
        let e = try_plan(&inv, &["NVIDIA_IMEX_CHANNELS=1,7"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "NVIDIA_IMEX_CHANNELS: IMEX channel 7 does not exist on this host (it has channels 0-2; ask for one it has, or all)"
        );
        let bare = standard();
        let e = try_plan(&bare, &["NVIDIA_IMEX_CHANNELS=0,1,2,5"]).unwrap_err();
        assert_eq!(
            e,
            PlanError::NoImexMajor {
                value: "0-2,5".into()
            }
        );
        let all = try_plan(&bare, &["NVIDIA_IMEX_CHANNELS=all"]).unwrap();
        assert!(extra_paths(&all).is_empty());
        assert_eq!(all.skipped.len(), 1);
        assert_eq!(all.skipped[0].what, "NVIDIA_IMEX_CHANNELS=all");
    }

    #[test]
    fn the_hosts_channels_are_named_in_numeric_runs() {
        let with_channels = |channels: &[u32]| {
            let mut inv = fabric_node();
            inv.nodes.retain(|n| !IMEX_CHANNEL.matches(&n.path));
            // In the order the inventory keeps them: by name, so 10 before 2.
            let mut nodes: Vec<HostNode> = channels
                .iter()
                .map(|&c| node(&channel_path(c), IMEX, c))
                .collect();
            nodes.sort_by(|a, b| a.path.cmp(&b.path));
            inv.nodes.extend(nodes);
            inv
        };
        let thousand: Vec<u32> = (0..1000).collect();
        let e = try_plan(&with_channels(&thousand), &["NVIDIA_IMEX_CHANNELS=5000"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "NVIDIA_IMEX_CHANNELS: IMEX channel 5000 does not exist on this host (it has channels 0-999; ask for one it has, or all)"
        );
        let sparse = [0, 1, 2, 3, 7, 9, 10, 11, 12];
        let e = try_plan(&with_channels(&sparse), &["NVIDIA_IMEX_CHANNELS=8"]).unwrap_err();
        assert!(
            e.to_string().contains("(it has channels 0-3,7,9-12;"),
            "{e}"
        );
    }

    #[test]
    fn a_channel_node_with_another_major_is_not_a_channel() {
        let mut inv = fabric_node();
        inv.majors.extra.retain(|(m, _)| *m != IMEX);
        inv.majors.extra.push((IMEX + 10, IMEX_MAJOR_NAME.into()));
        let e = try_plan(&inv, &["NVIDIA_IMEX_CHANNELS=1"]).unwrap_err();
        assert!(
            matches!(e, PlanError::NoSuchImexChannel { channel: 1, .. }),
            "{e}"
        );
    }

    #[test]
    fn families_get_the_nodes_the_host_has() {
        let inv = fabric_node();
        let plan = try_plan(&inv, &["NVIDIA_NVSWITCH=enabled", "NVIDIA_MOFED=enabled"]).unwrap();
        assert_eq!(
            extra_paths(&plan),
            [
                "/dev/nvidia-nvswitchctl",
                "/dev/nvidia-nvswitch0",
                "/dev/nvidia-nvlink",
                "/dev/infiniband/uverbs0",
                "/dev/infiniband/umad0",
                "/dev/infiniband/rdma_cm"
            ]
        );
        assert!(plan.skipped.is_empty(), "{:?}", plan.skipped);
        let off = try_plan(&inv, &["NVIDIA_NVSWITCH=disabled", "NVIDIA_MOFED="]).unwrap();
        assert!(extra_paths(&off).is_empty());
    }

    #[test]
    fn a_family_the_host_lacks_is_skipped_with_the_reason() {
        let plan = try_plan(
            &fabric_node(),
            &["NVIDIA_GDS=enabled", "NVIDIA_GDRCOPY=enabled"],
        )
        .unwrap();
        assert!(extra_paths(&plan).is_empty());
        let whats: Vec<&str> = plan.skipped.iter().map(|s| s.what.as_str()).collect();
        assert_eq!(
            whats,
            [
                "device family gds (NVIDIA_GDS)",
                "device family gdrcopy (NVIDIA_GDRCOPY)"
            ]
        );
        assert!(
            plan.skipped[0].why.contains("/dev/nvidia-fs*"),
            "{:?}",
            plan.skipped
        );
        let text = crate::plan::text::plan_text(&plan);
        assert!(
            text.contains("Skipped (asked for, not on this host):\n  device family gds"),
            "{text}"
        );
    }

    #[test]
    fn a_family_node_whose_major_is_not_registered_is_left_out() {
        let mut inv = fabric_node();
        inv.majors.extra.retain(|(_, n)| n != "nvidia-nvlink");
        let plan = try_plan(&inv, &["NVIDIA_NVSWITCH=enabled"]).unwrap();
        assert_eq!(
            extra_paths(&plan),
            ["/dev/nvidia-nvswitchctl", "/dev/nvidia-nvswitch0"]
        );
        assert_eq!(plan.skipped[0].what, "/dev/nvidia-nvlink");
        assert!(
            plan.skipped[0]
                .why
                .contains("not registered as nvidia-nvlink")
        );
    }

    #[test]
    fn the_config_default_turns_a_family_on_and_the_variable_off() {
        let inv = fabric_node();
        let config = Config {
            device_families: vec![Family::NvSwitch],
            ..Config::default()
        };
        let plan_with = |env: &[&str]| {
            let request = crate::request::Request::from_spec(&spec(env, &[]), &config)
                .unwrap()
                .unwrap();
            build(&request, &inv, DEV_ROOT, DEBIAN).unwrap()
        };
        let on = plan_with(&["NVIDIA_VISIBLE_DEVICES=0"]);
        assert!(on.devices.iter().any(|d| d.path == "/dev/nvidia-nvlink"));
        let off = plan_with(&["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_NVSWITCH=disabled"]);
        assert!(!off.devices.iter().any(|d| d.path == "/dev/nvidia-nvlink"));
    }
}
