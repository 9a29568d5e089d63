//! Inventory → CDI spec, through the same plans the hook and nvhook-runtime use.
//!
//! One plan per device (and one for `all`) is built with libraries at their host paths; the
//! nodes every GPU container needs (`nvidiactl`, `nvidia-uvm`, ...) and all driver files go
//! into the spec-wide edits, which engines apply once however many devices are asked for,
//! and each device keeps only its own nodes.

use super::{CdiError, imex_and_families};
use crate::capability::Capability;
use crate::config::Config;
use crate::delivery::cdi_spec::{CdiSpec, ContainerEdits, Device, KIND};
use crate::delivery::edits::{HookBinary, container_edits_with, device_nodes};
use crate::delivery::hook_args::LinkArgs;
use crate::inventory::Inventory;
use crate::inventory::gpu_layout::GpuLayout;
use crate::plan::{self, Plan};
use crate::request::{DeviceId, DeviceSelection, Request, Requirements, SelectionSource};
use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::str::FromStr;

/// How devices are named: `0`, `1:0` (index) and `GPU-…`, `MIG-…` (uuid).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameStrategy {
    Index,
    Uuid,
}

impl FromStr for NameStrategy {
    type Err = String;

    fn from_str(s: &str) -> Result<NameStrategy, String> {
        match s {
            "index" => Ok(NameStrategy::Index),
            "uuid" => Ok(NameStrategy::Uuid),
            _ => Err(format!(
                "unknown device name strategy {s:?} (use index, uuid)"
            )),
        }
    }
}

/// A request for `devices` with every capability in `capabilities` and no requirement.
pub fn request(devices: DeviceSelection, capabilities: Vec<Capability>) -> Request {
    Request {
        devices,
        capabilities: capabilities.into_iter().collect(),
        requirements: Requirements::default(),
        mig_config: None,
        mig_monitor: None,
        privileged: false,
        source: SelectionSource::Env,
        cuda_version: None,
        imex_channels: None,
        families: BTreeSet::new(),
        memory_limits: None,
    }
}

/// What every spec of this node is made from: its devices' plans with the libraries at their
/// host paths, and the nodes every GPU container needs, which go into the spec-wide edits.
struct Specs<'a> {
    inventory: &'a Inventory,
    dev_root: String,
    layout: plan::Layout,
    capabilities: Vec<Capability>,
    hook: HookBinary,
    /// The nodes of a plan with no device: every device's container needs them.
    shared: HashSet<String>,
}

impl<'a> Specs<'a> {
    fn new(
        config: &Config,
        config_path: Option<&Path>,
        inventory: &'a Inventory,
    ) -> Result<Specs<'a>, CdiError> {
        if inventory.gpus.is_empty() {
            return Err(CdiError::NoGpu);
        }
        let mut specs = Specs {
            inventory,
            dev_root: config.dev_root.display().to_string(),
            layout: crate::host_plan::any_image_layout(config, inventory.arch),
            capabilities: capabilities(config, inventory),
            hook: HookBinary::new(config, config_path),
            shared: HashSet::new(),
        };
        specs.shared = specs
            .plan(DeviceSelection::NoDevices)?
            .devices
            .into_iter()
            .map(|d| d.path)
            .collect();
        Ok(specs)
    }

    fn plan(&self, devices: DeviceSelection) -> Result<Plan, CdiError> {
        let request = request(devices, self.capabilities.clone());
        Ok(plan::build_with_layout(
            &request,
            self.inventory,
            &self.dev_root,
            self.layout.clone(),
        )?)
    }

    /// A device's own edits: its nodes that not every container has.
    fn own_edits(&self, plan: &Plan) -> ContainerEdits {
        let mut nodes = device_nodes(plan);
        nodes.retain(|n| !self.shared.contains(&n.path));
        ContainerEdits {
            device_nodes: nodes,
            ..ContainerEdits::default()
        }
    }

    /// The spec-wide edits for containers given any of the devices of `plan`: the shared
    /// nodes, every driver file and the createRuntime hook, with no one container's
    /// /proc/driver/nvidia view, and stamped with the GPU layout its names stand for.
    fn common_edits(&self, config: &Config, mut plan: Plan) -> ContainerEdits {
        plan.proc_overlay = None;
        let mut links = LinkArgs::from_plan(&plan);
        let layout = GpuLayout::read(config);
        links.gpu_layout = layout.has_gpus().then(|| layout.stamp());
        let mut common = container_edits_with(&plan, &self.hook, links);
        common
            .device_nodes
            .retain(|n| self.shared.contains(&n.path));
        common
    }
}

/// The spec for every GPU and MIG device of `inventory`, named by each of `names`, plus `all`
/// (on WSL2, `all` alone).
pub fn generate(
    config: &Config,
    config_path: Option<&Path>,
    inventory: &Inventory,
    names: &[NameStrategy],
) -> Result<CdiSpec, CdiError> {
    let specs = Specs::new(config, config_path, inventory)?;
    let all = specs.plan(DeviceSelection::All)?;
    let mut devices = Vec::new();
    // WSL2's GPUs share one /dev/dxg: no device gives one of them alone, and NVIDIA's WSL
    // spec names `all` only.
    let singles = match inventory.wsl {
        None => device_ids(inventory),
        Some(_) => Vec::new(),
    };
    for (id, uuid) in singles {
        let edits = specs.own_edits(&specs.plan(DeviceSelection::List(vec![id.clone()]))?);
        for strategy in names {
            let name = match strategy {
                NameStrategy::Index => id.to_string(),
                NameStrategy::Uuid => uuid.clone(),
            };
            devices.push(Device {
                name,
                container_edits: edits.clone(),
            });
        }
    }
    devices.push(Device {
        name: "all".into(),
        container_edits: specs.own_edits(&all),
    });
    super::spec_of(KIND, devices, specs.common_edits(config, all))
}

/// A spec of `kind` for one ResourceClaim (a DRA driver writes one per claim): each of `gpus`
/// under its name with spec-wide edits for exactly those GPUs, and each of `channels` (IMEX
/// channel numbers) under its name as its device node alone. A claim for channels only gets
/// no driver file: the pod's GPU claim brings those.
pub fn claim_spec(
    config: &Config,
    config_path: Option<&Path>,
    inventory: &Inventory,
    kind: &str,
    gpus: &[(String, DeviceId)],
    channels: &[(String, u32)],
) -> Result<CdiSpec, CdiError> {
    let mut own = Vec::new();
    let mut common = ContainerEdits::default();
    if !gpus.is_empty() {
        let specs = Specs::new(config, config_path, inventory)?;
        let ids = gpus.iter().map(|(_, id)| id.clone()).collect();
        let claimed = specs.plan(DeviceSelection::List(ids))?;
        for (name, id) in gpus {
            let plan = specs.plan(DeviceSelection::List(vec![id.clone()]))?;
            own.push(Device {
                name: name.clone(),
                container_edits: specs.own_edits(&plan),
            });
        }
        common = specs.common_edits(config, claimed);
    }
    own.extend(imex_and_families::channel_devices(inventory, channels));
    super::spec_of(kind, own, common)
}

/// Each GPU, then its MIG devices: (index id, UUID).
pub fn device_ids(inventory: &Inventory) -> Vec<(DeviceId, String)> {
    let mut out = Vec::new();
    for gpu in &inventory.gpus {
        out.push((DeviceId::Index(gpu.index), gpu.uuid.clone()));
        for mig in &gpu.mig_devices {
            out.push((
                DeviceId::MigIndex {
                    gpu: gpu.index,
                    mig: mig.index,
                },
                mig.uuid.clone(),
            ));
        }
    }
    out
}

/// Everything the node serves: a spec is written once for all containers. `display` needs
/// `/dev/nvidia-modeset`, which headless hosts do not have; there it is left out rather
/// than failing the whole spec.
fn capabilities(config: &Config, inventory: &Inventory) -> Vec<Capability> {
    let has_modeset = inventory
        .nodes
        .iter()
        .any(|n| n.path == "/dev/nvidia-modeset");
    let caps: BTreeSet<Capability> = config
        .supported_capabilities
        .iter()
        .copied()
        .filter(|c| *c != Capability::Display || has_modeset)
        .collect();
    if !has_modeset && config.supported_capabilities.contains(&Capability::Display) {
        tracing::info!("no /dev/nvidia-modeset on this host: capability display left out");
    }
    caps.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::cdi_spec::CdiVersion;
    use nvhook_model::plan::fixtures::{inventory, standard};

    fn config() -> Config {
        Config {
            driver_root: "/drv".into(),
            dev_root: "/node".into(),
            ..Config::default()
        }
    }

    fn names(spec: &CdiSpec) -> Vec<&str> {
        spec.devices.iter().map(|d| d.name.as_str()).collect()
    }

    fn device<'a>(spec: &'a CdiSpec, name: &str) -> &'a Device {
        spec.devices
            .iter()
            .find(|d| d.name == name)
            .unwrap_or_else(|| panic!("no device {name} in {:?}", names(spec)))
    }

    fn node_paths(device: &Device) -> Vec<&str> {
        device
            .container_edits
            .device_nodes
            .iter()
            .map(|n| n.path.as_str())
            .collect()
    }

    #[test]
    fn one_device_per_gpu_and_mig_device_by_index_and_uuid_plus_all() {
        let inv = standard();
        let spec = generate(
            &config(),
            Some(Path::new("/etc/nvhook/config.toml")),
            &inv,
            &[NameStrategy::Index, NameStrategy::Uuid],
        )
        .unwrap();
        assert_eq!(spec.kind, "nvidia.com/gpu");
        let mut expected: Vec<String> = Vec::new();
        for gpu in &inv.gpus {
            expected.extend([gpu.index.to_string(), gpu.uuid.clone()]);
            for mig in &gpu.mig_devices {
                expected.extend([format!("{}:{}", gpu.index, mig.index), mig.uuid.clone()]);
            }
        }
        expected.push("all".into());
        assert_eq!(names(&spec), expected);
        // Index names start with a digit and nodes carry host paths: 0.5.0.
        assert_eq!(spec.cdi_version, "0.5.0");

        assert_eq!(node_paths(device(&spec, "1")), ["/dev/nvidia1"]);
        assert_eq!(
            device(&spec, "1").container_edits,
            device(&spec, &inv.gpus[1].uuid).container_edits
        );
        let (gi, ci) = (
            inv.gpus[3].mig_devices[1].gi_cap_minor.unwrap(),
            inv.gpus[3].mig_devices[1].ci_cap_minor.unwrap(),
        );
        assert_eq!(
            node_paths(device(&spec, "3:1")),
            [
                "/dev/nvidia3".to_string(),
                format!("/dev/nvidia-caps/nvidia-cap{gi}"),
                format!("/dev/nvidia-caps/nvidia-cap{ci}")
            ]
        );
        let all = node_paths(device(&spec, "all"));
        for i in 0..4 {
            assert!(all.contains(&format!("/dev/nvidia{i}").as_str()), "{all:?}");
        }
        // Devices carry nodes only; everything else is spec-wide, once.
        for d in &spec.devices {
            let e = &d.container_edits;
            assert!(e.mounts.is_empty() && e.hooks.is_empty() && e.env.is_empty());
        }
        let common = &spec.container_edits;
        let common_nodes: Vec<&str> = common
            .device_nodes
            .iter()
            .map(|n| n.path.as_str())
            .collect();
        for control in ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"] {
            assert!(common_nodes.contains(&control), "{common_nodes:?}");
        }
        assert!(!common_nodes.iter().any(|p| p.starts_with("/dev/nvidia0")));
        let [hook] = common.hooks.as_slice() else {
            panic!("{:?}", common.hooks)
        };
        assert_eq!(hook.hook_name, "createRuntime");
        let links = crate::delivery::hook_args::LinkArgs::parse(&hook.args[5..]).unwrap();
        // The driver's files are the hook's to mount (`cdi-mounts = "hook"`, the default), not
        // the runtime's; libraries stay at their host paths relative to the driver root, and
        // firmware comes along.
        assert!(common.mounts.is_empty(), "{:?}", common.mounts);
        let destinations: Vec<&str> = links
            .mounts
            .iter()
            .map(|m| m.destination.as_str())
            .collect();
        assert!(destinations.contains(&"/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"));
        assert!(destinations.contains(&"/usr/lib/i386-linux-gnu/libcuda.so.550.54.15"));
        assert!(destinations.contains(&"/usr/bin/nvidia-smi"));
        assert!(destinations.contains(&"/lib/firmware/nvidia/550.54.15/gsp_ga10x.bin"));
        let runtime_mounts = Config {
            cdi_mounts: crate::config::CdiMounts::Runtime,
            ..config()
        };
        let listed = generate(
            &runtime_mounts,
            Some(Path::new("/etc/nvhook/config.toml")),
            &inv,
            &[NameStrategy::Index],
        )
        .unwrap();
        let mut listed: Vec<&str> = listed
            .container_edits
            .mounts
            .iter()
            .map(|m| m.container_path.as_str())
            .collect();
        let mut destinations = destinations;
        listed.sort_unstable();
        destinations.sort_unstable();
        assert_eq!(
            listed, destinations,
            "the runtime gets the same files to mount"
        );
        assert!(links.symlinks.iter().any(|l| {
            l.path == "/usr/lib/x86_64-linux-gnu/libcuda.so.1" && l.target == "libcuda.so.550.54.15"
        }));
        assert!(
            links
                .symlinks
                .iter()
                .any(|l| l.path == "/usr/lib/x86_64-linux-gnu/libcuda.so")
        );
        assert!(
            links
                .ldcache
                .iter()
                .any(|e| e.path == "/usr/lib/x86_64-linux-gnu/libcuda.so.1")
        );
        let [conf] = &links.ld_so_confs[..] else {
            panic!("{:?}", links.ld_so_confs)
        };
        assert!(conf.dirs.contains(&"/usr/lib/x86_64-linux-gnu".to_string()));
        crate::delivery::cdi_spec::validate(&spec).unwrap();
    }

    #[test]
    fn uuid_names_on_a_host_dev_root_need_only_0_3_0() {
        let mut inv = inventory(2, &[]);
        for node in &mut inv.nodes {
            node.host_path = node.path.clone().into();
        }
        let spec = generate(&config(), None, &inv, &[NameStrategy::Uuid]).unwrap();
        assert_eq!(spec.cdi_version, CdiVersion::V0_3_0.to_string());
        assert_eq!(
            names(&spec),
            [inv.gpus[0].uuid.as_str(), &inv.gpus[1].uuid, "all"]
        );
        // No --config given: the hook reads the default config.
        assert_eq!(
            spec.container_edits.hooks[0].args[..3],
            ["nvhook", "hook", "createRuntime"]
        );
    }

    #[test]
    fn display_is_left_out_without_a_modeset_node() {
        let mut inv = standard();
        inv.nodes.retain(|n| n.path != "/dev/nvidia-modeset");
        let spec = generate(&config(), None, &inv, &[NameStrategy::Index]).unwrap();
        assert!(
            !spec
                .container_edits
                .device_nodes
                .iter()
                .any(|n| n.path == "/dev/nvidia-modeset")
        );
        let with = generate(&config(), None, &standard(), &[NameStrategy::Index]).unwrap();
        assert!(
            with.container_edits
                .device_nodes
                .iter()
                .any(|n| n.path == "/dev/nvidia-modeset")
        );
    }

    #[test]
    fn a_node_without_gpus_is_an_error() {
        let e = generate(&config(), None, &inventory(0, &[]), &[NameStrategy::Index]).unwrap_err();
        assert!(e.to_string().contains("no GPU"), "{e}");
    }

    #[test]
    fn strategies_parse() {
        assert_eq!("uuid".parse(), Ok(NameStrategy::Uuid));
        assert!(
            "name"
                .parse::<NameStrategy>()
                .unwrap_err()
                .contains("index")
        );
    }
}
