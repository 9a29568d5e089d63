//! The node's ResourceSlice: every device the node offers, with the attributes and capacity
//! NVIDIA's driver gives them (a DeviceClass or a claim's selector written for NVIDIA's driver
//! selects the same devices here), published for the node's pool and kept current.

use anyhow::{Context, Result};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, PostParams};
use nvhook::dra::DRIVER_NAME;
use nvhook::dra::devices::devices;
use nvhook::inventory::Inventory;
use serde_json::{Value, json};

/// The slice's name: one slice per node holds its whole pool.
pub fn slice_name(node: &str) -> String {
    format!("{node}-{DRIVER_NAME}")
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

/// The devices of the node's pool as the API lists them.
pub fn devices_of(inventory: &Inventory) -> Vec<Value> {
    let version = |text: &str| semver(text).map(|v| json!({"version": v}));
    devices(inventory)
        .into_iter()
        .filter_map(|device| {
            let gpu = inventory
                .gpus
                .iter()
                .find(|g| format!("gpu-{}", g.minor) == device.name)?;
            let mut attributes = json!({
                "type": {"string": "gpu"},
                "uuid": {"string": gpu.uuid},
                "productName": {"string": gpu.name},
                "brand": {"string": gpu.brand},
                "architecture": {"string": gpu.architecture},
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
            let mut out = json!({"name": device.name, "attributes": attributes});
            if let Some(mib) = gpu.memory_mib {
                out["capacity"] = json!({"memory": {"value": format!("{}Mi", mib)}});
            }
            Some(out)
        })
        .collect()
}

/// The node's slice with `devices` at pool generation `generation`.
pub fn slice(node: &str, devices: Vec<Value>, generation: i64) -> Result<ResourceSlice> {
    let slice = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node)},
        "spec": {
            "driver": DRIVER_NAME,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    });
    serde_json::from_value(slice).context("the node's ResourceSlice is not a v1 ResourceSlice")
}

/// Publishes the node's slice: made when missing, replaced (its pool's generation bumped, as
/// the API requires when a pool's devices change) when the devices differ, left alone else.
pub async fn publish(api: &Api<ResourceSlice>, node: &str, inventory: &Inventory) -> Result<()> {
    let devices = devices_of(inventory);
    let name = slice_name(node);
    let current = api
        .get_opt(&name)
        .await
        .with_context(|| format!("cannot read ResourceSlice {name}"))?;
    match current {
        None => {
            api.create(&PostParams::default(), &slice(node, devices, 1)?)
                .await
                .with_context(|| format!("cannot create ResourceSlice {name}"))?;
            tracing::info!(slice = %name, "DRA: ResourceSlice published");
        }
        Some(current) => {
            let now = serde_json::to_value(&current.spec.devices)?;
            if now == Value::Array(devices.clone()) {
                return Ok(());
            }
            let generation = current.spec.pool.generation + 1;
            let mut next = slice(node, devices, generation)?;
            next.metadata.resource_version = current.metadata.resource_version.clone();
            api.replace(&name, &PostParams::default(), &next)
                .await
                .with_context(|| format!("cannot update ResourceSlice {name}"))?;
            tracing::info!(slice = %name, generation, "DRA: ResourceSlice updated");
        }
    }
    Ok(())
}

/// Removes the node's slices of this driver (`nvhook-dra remove-slices`, for an uninstall where
/// no kubelet is left to do it).
pub async fn remove(api: &Api<ResourceSlice>, node: &str) -> Result<()> {
    let selector = format!("spec.nodeName={node},spec.driver={DRIVER_NAME}");
    api.delete_collection(
        &kube::api::DeleteParams::default(),
        &kube::api::ListParams::default().fields(&selector),
    )
    .await
    .with_context(|| format!("cannot delete the ResourceSlices of node {node}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        inventory.gpus[1].minor = 5;
        inventory.gpus[1].memory_mib = Some(81_559);
        let slice = slice("node-a", devices_of(&inventory), 3).unwrap();
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
}
