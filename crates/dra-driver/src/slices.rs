//! The node's ResourceSlice: every device the node offers, with the attributes and capacity
//! NVIDIA's driver gives them (a DeviceClass or a claim's selector written for NVIDIA's driver
//! selects the same devices here), published for the node's pool and kept current.

use anyhow::{Context, Result};
use k8s_openapi::api::resource::v1::{ResourceSlice, ResourceSliceSpec};
use kube::api::{Api, PostParams};
use nvhook::dra::DRIVER_NAME;
use nvhook::dra::devices::{DeviceKind, DraDevice};
use nvhook::dra::partitions::{self, Partition};
use nvhook::inventory::{Gpu, Inventory, MigDevice, MigProfile};
use nvhook::request::DeviceId;
use serde_json::{Value, json};
use std::collections::BTreeSet;

/// The most devices one slice may list (the API's `ResourceSliceMaxDevices`).
pub const MAX_DEVICES: usize = 128;

/// The name of slice `index` of the node's pool: the first is `<node>-gpu.nvidia.com`, as a pool
/// that fits one slice has always been named, the others `<node>-gpu.nvidia.com-<index>`.
pub fn slice_name(node: &str, index: usize) -> String {
    match index {
        0 => format!("{node}-{DRIVER_NAME}"),
        _ => format!("{node}-{DRIVER_NAME}-{index}"),
    }
}

/// A version attribute as the API takes it: semantic versioning, three numbers with no
/// leading zero (`8.0` → `8.0.0`, a driver's `580.159.04` → `580.159.4`). None for text that
/// is not dotted numbers.
pub fn semver(text: &str) -> Option<String> {
    let mut parts: Vec<u64> = text
        .split('.')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    if parts.is_empty() || parts.len() > 3 {
        return None;
    }
    parts.resize(3, 0);
    Some(format!("{}.{}.{}", parts[0], parts[1], parts[2]))
}

/// The devices of the node's pool (`offered`, from its `inventory`) as the API lists them.
pub fn devices_of(inventory: &Inventory, offered: &[DraDevice]) -> Vec<Value> {
    offered
        .iter()
        .filter_map(|device| match &device.kind {
            DeviceKind::Gpu(DeviceId::Index(index)) => {
                let gpu = gpu_of(inventory, *index)?;
                Some(gpu_entry(inventory, &device.name, gpu))
            }
            DeviceKind::Gpu(DeviceId::MigIndex { gpu, mig }) => {
                let gpu = gpu_of(inventory, *gpu)?;
                let mig = gpu.mig_devices.iter().find(|m| m.index == *mig)?;
                Some(mig_entry(inventory, &device.name, gpu, mig))
            }
            DeviceKind::Gpu(_) => None,
            DeviceKind::MigPartition { partition, .. } => {
                let gpu = gpu_of(inventory, partition.gpu)?;
                partition_entry(inventory, &device.name, gpu, partition)
            }
            DeviceKind::ImexChannel(channel) => Some(channel_entry(&device.name, *channel)),
        })
        .collect()
}

fn gpu_of(inventory: &Inventory, index: u32) -> Option<&Gpu> {
    inventory.gpus.iter().find(|g| g.index == index)
}

/// What one slice lists: the API lets a slice hold devices or counter sets, not both.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    Devices(Vec<Value>),
    Counters(Vec<Value>),
}

/// The most counter sets one slice may hold, and the most devices a slice may list when one
/// of them consumes counters.
const MAX_COUNTER_SETS: usize = 8;
const MAX_DEVICES_WITH_COUNTERS: usize = 64;

/// Each slice of the node's pool (`offered`, from its `inventory`): the counter sets of the
/// GPUs offered as partitions first, then the devices in as many slices as it takes, and one
/// empty slice for a node with no device (the pool says the node has nothing).
pub fn pool(inventory: &Inventory, offered: &[DraDevice]) -> Vec<Body> {
    let partitioned: BTreeSet<u32> = offered
        .iter()
        .filter_map(|d| match &d.kind {
            DeviceKind::MigPartition { partition, .. } => Some(partition.gpu),
            _ => None,
        })
        .collect();
    let sets: Vec<Value> = partitioned
        .iter()
        .filter_map(|index| gpu_of(inventory, *index))
        .map(|gpu| {
            json!({
                "name": partitions::counter_set(gpu),
                "counters": counters(&partitions::counters(gpu)),
            })
        })
        .collect();
    let mut out: Vec<Body> = sets
        .chunks(MAX_COUNTER_SETS)
        .map(|c| Body::Counters(c.to_vec()))
        .collect();
    let devices = devices_of(inventory, offered);
    let per_slice = match partitioned.is_empty() {
        true => MAX_DEVICES,
        false => MAX_DEVICES_WITH_COUNTERS,
    };
    out.extend(devices.chunks(per_slice).map(|c| Body::Devices(c.to_vec())));
    if devices.is_empty() {
        out.push(Body::Devices(Vec::new()));
    }
    out
}

/// Counters as the API takes them: `memory` a quantity of bytes, the others counts.
fn counters(values: &[(String, u64)]) -> Value {
    values
        .iter()
        .map(|(name, value)| (name.clone(), json!({"value": quantity(name, *value)})))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

fn quantity(name: &str, value: u64) -> String {
    match name {
        "memory" if value.is_multiple_of(1024 * 1024) => format!("{}Mi", value / (1024 * 1024)),
        _ => value.to_string(),
    }
}

/// A place a MIG profile can take, offered as a partition (KEP-4815): a MIG device's
/// attributes less its UUID (it may not be made yet), the profile's capacities, and what it
/// takes of its GPU's counters.
fn partition_entry(
    inventory: &Inventory,
    name: &str,
    gpu: &Gpu,
    partition: &Partition,
) -> Option<Value> {
    let profile = gpu
        .mig_profiles
        .iter()
        .find(|p| p.id == partition.profile_id)?;
    let mut attributes = board_attributes(inventory, gpu);
    attributes["type"] = json!({"string": "mig"});
    attributes["parentUUID"] = json!({"string": gpu.uuid});
    attributes["profile"] = json!({"string": profile.name});
    let consumed = partitions::consumed(profile, &partition.placement);
    Some(json!({
        "name": name,
        "attributes": attributes,
        "capacity": profile_capacity(profile),
        "consumesCounters": [{
            "counterSet": partitions::counter_set(gpu),
            "counters": counters(&consumed),
        }],
    }))
}

/// A MIG profile's capacities under NVIDIA's names: its multiprocessors, engines and memory.
fn profile_capacity(profile: &MigProfile) -> serde_json::Map<String, Value> {
    let count = |n: u32| json!({"value": n.to_string()});
    [
        ("multiprocessors", count(profile.multiprocessors)),
        ("copyEngines", count(profile.copy_engines)),
        ("decoders", count(profile.decoders)),
        ("encoders", count(profile.encoders)),
        ("jpegEngines", count(profile.jpegs)),
        ("ofaEngines", count(profile.ofas)),
        (
            "memory",
            json!({"value": format!("{}Mi", profile.memory_mib)}),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// An IMEX channel as NVIDIA's ComputeDomain driver lists one: `type` channel and its number.
fn channel_entry(name: &str, channel: u32) -> Value {
    json!({
        "name": name,
        "attributes": {"type": {"string": "channel"}, "id": {"int": channel}},
    })
}

/// A whole GPU: `type` gpu, its UUID, and its memory.
fn gpu_entry(inventory: &Inventory, name: &str, gpu: &Gpu) -> Value {
    let mut attributes = board_attributes(inventory, gpu);
    attributes["type"] = json!({"string": "gpu"});
    attributes["uuid"] = json!({"string": gpu.uuid});
    let mut out = json!({"name": name, "attributes": attributes});
    if let Some(mib) = gpu.memory_mib {
        out["capacity"] = json!({"memory": {"value": format!("{mib}Mi")}});
    }
    out
}

/// A MIG device: `type` mig, its UUID and its GPU's, its profile, its GPU's board facts; its
/// profile's multiprocessors and engines, its memory and, as NVIDIA's driver gives them, one `memorySlice<i>` of 1 for each memory slice
/// its GPU instance holds (what keeps two overlapping MIG devices from one claim).
fn mig_entry(inventory: &Inventory, name: &str, gpu: &Gpu, mig: &MigDevice) -> Value {
    let mut attributes = board_attributes(inventory, gpu);
    attributes["type"] = json!({"string": "mig"});
    attributes["uuid"] = json!({"string": mig.uuid});
    attributes["parentUUID"] = json!({"string": gpu.uuid});
    if let Some(profile) = &mig.profile {
        attributes["profile"] = json!({"string": profile});
    }
    let profile = gpu
        .mig_profiles
        .iter()
        .find(|p| Some(p.id) == mig.gpu_instance_profile_id);
    let mut capacity = profile.map(profile_capacity).unwrap_or_default();
    if let Some(mib) = mig.memory_mib {
        capacity.insert("memory".into(), json!({"value": format!("{mib}Mi")}));
    }
    if let Some(placement) = mig.placement {
        for slice in placement.start..placement.start.saturating_add(placement.size) {
            capacity.insert(format!("memorySlice{slice}"), json!({"value": "1"}));
        }
    }
    let mut out = json!({"name": name, "attributes": attributes});
    if !capacity.is_empty() {
        out["capacity"] = Value::Object(capacity);
    }
    out
}

/// The brands as NVIDIA's driver spells them (go-nvlib's names of NVML's brand enum); the
/// inventory keeps them in lower case.
const BRANDS: [&str; 17] = [
    "Unknown",
    "Quadro",
    "Tesla",
    "NVS",
    "Grid",
    "GeForce",
    "Titan",
    "NvidiaVApps",
    "NvidiaVPC",
    "NvidiaVCS",
    "NvidiaVWS",
    "NvidiaCloudGaming",
    "QuadroRTX",
    "NvidiaRTX",
    "Nvidia",
    "GeForceRTX",
    "TitanRTX",
];

/// `brand` as NVIDIA's driver gives it, so that a selector written for it matches.
fn nvidia_brand(lower: &str) -> String {
    BRANDS
        .iter()
        .find(|b| b.eq_ignore_ascii_case(lower))
        .map_or_else(|| lower.to_string(), |b| b.to_string())
}

/// `architecture` as NVIDIA's driver gives it: NVML's names, Ada as "Ada Lovelace".
fn nvidia_architecture(lower: &str) -> String {
    match lower {
        "ada" => "Ada Lovelace".to_string(),
        _ => {
            let mut chars = lower.chars();
            chars.next().map_or_else(String::new, |first| {
                first.to_uppercase().chain(chars).collect()
            })
        }
    }
}

/// What a GPU and its MIG devices share: the board, its bus, the driver's versions.
fn board_attributes(inventory: &Inventory, gpu: &Gpu) -> Value {
    let version = |text: &str| semver(text).map(|v| json!({"version": v}));
    let mut attributes = json!({
        "productName": {"string": gpu.name},
        "brand": {"string": nvidia_brand(&gpu.brand)},
        "architecture": {"string": nvidia_architecture(&gpu.architecture)},
        "resource.kubernetes.io/pciBusID": {"string": gpu.pci_bus_id},
    });
    for (name, value) in [
        ("cudaComputeCapability", version(&gpu.compute_capability)),
        ("driverVersion", version(&inventory.driver_version)),
        ("cudaDriverVersion", version(&inventory.cuda_version)),
    ] {
        if let Some(value) = value {
            attributes[name] = value;
        }
    }
    attributes
}

/// Slice `index` of the node's pool of `count` slices, listing `body`, at pool generation
/// `generation`.
pub fn slice(
    node: &str,
    (index, count): (usize, usize),
    body: Body,
    generation: i64,
) -> Result<ResourceSlice> {
    let mut spec = json!({
        "driver": DRIVER_NAME,
        "nodeName": node,
        "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
    });
    match body {
        Body::Devices(devices) => spec["devices"] = Value::Array(devices),
        Body::Counters(sets) => spec["sharedCounters"] = Value::Array(sets),
    }
    let slice = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node, index)},
        "spec": spec,
    });
    serde_json::from_value(slice).context("the node's ResourceSlice is not a v1 ResourceSlice")
}

/// Whether `current` lists what `wanted` does (an empty list and none are the same).
fn lists_the_same(current: &ResourceSliceSpec, wanted: &ResourceSliceSpec) -> bool {
    current.devices.clone().unwrap_or_default() == wanted.devices.clone().unwrap_or_default()
        && current.shared_counters.clone().unwrap_or_default()
            == wanted.shared_counters.clone().unwrap_or_default()
}

/// Publishes the node's pool: its slices made when missing and, when any device differs or the
/// pool needs another number of slices, every slice replaced at the next pool generation (the
/// API requires one generation across a pool's slices, bumped on every change) and a slice no
/// longer needed deleted. A pool that has not changed is left alone.
pub async fn publish(
    api: &Api<ResourceSlice>,
    node: &str,
    inventory: &Inventory,
    offered: &[DraDevice],
) -> Result<()> {
    let count = pool(inventory, offered).len();
    let wanted: Vec<ResourceSlice> = pool(inventory, offered)
        .into_iter()
        .enumerate()
        .map(|(index, body)| slice(node, (index, count), body, 0))
        .collect::<Result<_>>()?;
    let current = of_node(api, node).await?;
    let unchanged = current.len() == count
        && wanted.iter().all(|w| {
            current
                .iter()
                .any(|c| c.metadata.name == w.metadata.name && lists_the_same(&c.spec, &w.spec))
        });
    if unchanged {
        return Ok(());
    }
    let generation = current
        .iter()
        .map(|slice| slice.spec.pool.generation + 1)
        .max()
        .unwrap_or(1);
    for mut next in wanted {
        next.spec.pool.generation = generation;
        let name = next.metadata.name.clone().unwrap_or_default();
        match current
            .iter()
            .find(|c| c.metadata.name == next.metadata.name)
        {
            None => {
                api.create(&PostParams::default(), &next)
                    .await
                    .with_context(|| format!("cannot create ResourceSlice {name}"))?;
            }
            Some(existing) => {
                next.metadata.resource_version = existing.metadata.resource_version.clone();
                api.replace(&name, &PostParams::default(), &next)
                    .await
                    .with_context(|| format!("cannot update ResourceSlice {name}"))?;
            }
        }
    }
    let kept: Vec<String> = (0..count).map(|i| slice_name(node, i)).collect();
    for stale in &current {
        let name = stale.metadata.name.clone().unwrap_or_default();
        if !kept.contains(&name) {
            delete(api, &name).await?;
        }
    }
    tracing::info!(
        node,
        slices = count,
        generation,
        "DRA: ResourceSlices published"
    );
    Ok(())
}

/// The node's slices of this driver.
async fn of_node(api: &Api<ResourceSlice>, node: &str) -> Result<Vec<ResourceSlice>> {
    let selector = format!("spec.nodeName={node},spec.driver={DRIVER_NAME}");
    let slices = api
        .list(&kube::api::ListParams::default().fields(&selector))
        .await
        .with_context(|| format!("cannot list the ResourceSlices of node {node}"))?;
    Ok(slices.items)
}

async fn delete(api: &Api<ResourceSlice>, name: &str) -> Result<()> {
    api.delete(name, &kube::api::DeleteParams::default())
        .await
        .with_context(|| format!("cannot delete ResourceSlice {name}"))?;
    Ok(())
}

/// Removes the node's slices of this driver (`nvhook-dra remove-slices`, for an uninstall where
/// no kubelet is left to do it), one by one: the plugin's role may list and delete slices, not
/// delete a collection.
pub async fn remove(api: &Api<ResourceSlice>, node: &str) -> Result<()> {
    for slice in of_node(api, node).await? {
        delete(api, &slice.metadata.name.unwrap_or_default()).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvhook::dra::devices::devices;

    fn static_devices(inventory: &Inventory) -> Vec<Value> {
        devices_of(inventory, &devices(inventory))
    }

    #[test]
    fn brand_and_architecture_are_spelled_as_nvidias_driver_spells_them() {
        assert_eq!(nvidia_brand("tesla"), "Tesla");
        assert_eq!(nvidia_brand("geforcertx"), "GeForceRTX");
        assert_eq!(nvidia_brand("nvs"), "NVS");
        assert_eq!(nvidia_architecture("hopper"), "Hopper");
        assert_eq!(nvidia_architecture("ada"), "Ada Lovelace");
        assert_eq!(nvidia_architecture("blackwell"), "Blackwell");
    }

    #[test]
    fn versions_are_given_as_the_api_reads_them() {
        assert_eq!(semver("8.0").as_deref(), Some("8.0.0"));
        assert_eq!(semver("580.159.04").as_deref(), Some("580.159.4"));
        assert_eq!(semver("12.4").as_deref(), Some("12.4.0"));
        assert_eq!(semver("550.54.15").as_deref(), Some("550.54.15"));
        assert_eq!(semver("N/A"), None);
        assert_eq!(semver("1.2.3.4"), None);
    }

    #[test]
    fn the_slice_names_each_gpu_by_its_minor_with_nvidias_attributes() {
        let mut inventory = nvhook_model::plan::fixtures::inventory(2, &[]);
        inventory.gpus[1].minor = Some(5);
        inventory.gpus[1].memory_mib = Some(81_559);
        let slice = slice(
            "node-a",
            (0, 1),
            Body::Devices(static_devices(&inventory)),
            3,
        )
        .unwrap();
        assert_eq!(
            slice.metadata.name.as_deref(),
            Some("node-a-gpu.nvidia.com")
        );
        assert_eq!(slice.spec.driver, "gpu.nvidia.com");
        assert_eq!(slice.spec.node_name.as_deref(), Some("node-a"));
        assert_eq!(slice.spec.pool.name, "node-a");
        assert_eq!(slice.spec.pool.generation, 3);
        let devices = slice.spec.devices.unwrap();
        assert_eq!(devices[1].name, "gpu-5");
        let attributes = devices[1].attributes.as_ref().unwrap();
        assert_eq!(attributes["type"].string.as_deref(), Some("gpu"));
        assert_eq!(
            attributes["uuid"].string.as_deref(),
            Some(inventory.gpus[1].uuid.as_str())
        );
        assert!(attributes["driverVersion"].version.is_some());
        let capacity = devices[1].capacity.as_ref().unwrap();
        assert_eq!(capacity["memory"].value.0, "81559Mi");
    }

    #[test]
    fn a_gpu_in_mig_mode_is_listed_as_its_mig_devices_with_nvidias_attributes() {
        let mut inventory = nvhook_model::plan::fixtures::inventory(2, &[(1, 2)]);
        inventory.gpus[1].minor = Some(3);
        let slice = slice(
            "node-a",
            (0, 1),
            Body::Devices(static_devices(&inventory)),
            1,
        )
        .unwrap();
        let devices = slice.spec.devices.unwrap();
        let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            ["gpu-0", "gpu-3-mig-3g40gb-9-0", "gpu-3-mig-3g40gb-9-4"]
        );
        let (gpu, mig) = (&inventory.gpus[1], &inventory.gpus[1].mig_devices[1]);
        let attributes = devices[2].attributes.as_ref().unwrap();
        let string = |name: &str| attributes[name].string.as_deref();
        assert_eq!(string("type"), Some("mig"));
        assert_eq!(string("uuid"), Some(mig.uuid.as_str()));
        assert_eq!(string("parentUUID"), Some(gpu.uuid.as_str()));
        assert_eq!(string("profile"), Some("3g.40gb"));
        assert_eq!(string("productName"), Some(gpu.name.as_str()));
        assert_eq!(string("brand"), Some("Tesla"));
        assert_eq!(string("architecture"), Some("Ampere"));
        assert_eq!(
            string("resource.kubernetes.io/pciBusID"),
            Some(gpu.pci_bus_id.as_str())
        );
        let version = |name: &str| attributes[name].version.as_deref();
        assert_eq!(version("cudaComputeCapability"), Some("8.0.0"));
        assert_eq!(
            version("driverVersion"),
            semver(&inventory.driver_version).as_deref()
        );
        assert_eq!(
            version("cudaDriverVersion"),
            semver(&inventory.cuda_version).as_deref()
        );
        let capacity = devices[2].capacity.as_ref().unwrap();
        let mut keys: Vec<&str> = capacity.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "memory",
                "memorySlice4",
                "memorySlice5",
                "memorySlice6",
                "memorySlice7"
            ]
        );
        assert_eq!(capacity["memory"].value.0, "40192Mi");
        assert_eq!(capacity["memorySlice5"].value.0, "1");
        // The other MIG device holds the other slices.
        let other = devices[1].capacity.as_ref().unwrap();
        assert!(other.contains_key("memorySlice0") && !other.contains_key("memorySlice4"));
    }

    #[test]
    fn imex_channels_are_listed_as_nvidias_and_a_pool_past_one_slice_takes_more() {
        let mut inventory = nvhook_model::plan::fixtures::inventory(8, &[]);
        inventory.majors.extra = vec![(500, "nvidia-caps-imex-channels".into())];
        for c in 0..130 {
            inventory.nodes.push(nvhook_model::plan::fixtures::node(
                &format!("/dev/nvidia-caps-imex-channels/channel{c}"),
                500,
                c,
            ));
        }
        let pool = pool(&inventory, &devices(&inventory));
        let sizes: Vec<usize> = pool
            .iter()
            .map(|body| match body {
                Body::Devices(devices) => devices.len(),
                Body::Counters(_) => panic!("no counter set without partitions"),
            })
            .collect();
        assert_eq!(sizes, [MAX_DEVICES, 138 - MAX_DEVICES]);
        let slices: Vec<ResourceSlice> = pool
            .into_iter()
            .enumerate()
            .map(|(i, body)| slice("node-a", (i, 2), body, 4).unwrap())
            .collect();
        let names: Vec<&str> = slices
            .iter()
            .map(|s| s.metadata.name.as_deref().unwrap())
            .collect();
        assert_eq!(names, ["node-a-gpu.nvidia.com", "node-a-gpu.nvidia.com-1"]);
        assert!(
            slices
                .iter()
                .all(|s| s.spec.pool.resource_slice_count == 2 && s.spec.pool.generation == 4)
        );
        let first = &slices[0].spec.devices.as_ref().unwrap()[8];
        assert_eq!(first.name, "channel-0");
        let attributes = first.attributes.as_ref().unwrap();
        assert_eq!(attributes["type"].string.as_deref(), Some("channel"));
        assert_eq!(attributes["id"].int, Some(0));
        let last = slices[1].spec.devices.as_ref().unwrap().last().unwrap();
        assert_eq!(last.name, "channel-129");
        // A node with no device still says so, in one empty slice.
        let none = nvhook_model::plan::fixtures::inventory(0, &[]);
        assert_eq!(super::pool(&none, &[]), [Body::Devices(Vec::new())]);
    }
}
