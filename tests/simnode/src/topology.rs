//! nvml-topology.json: the contract with the mock NVML, which reads it from
//! beside its own file (the hook clears its environment, so no env var).

use crate::spec::{GPU_MEMORY_BYTES, Gpu, MigDevice, Params, cuda_driver_version};
use anyhow::Result;
use serde::Serialize;
use std::path::{Path, PathBuf};

pub const FILE_NAME: &str = "nvml-topology.json";

/// The A100's PCI device id 0x20B2 with NVIDIA's vendor id 0x10DE in the low half.
const PCI_DEVICE_ID: u32 = 0x20B2_10DE;
/// nvmlBrandType_t NVML_BRAND_TESLA.
const BRAND_TESLA: u32 = 2;
/// nvmlDeviceArchitecture_t NVML_DEVICE_ARCH_AMPERE.
const ARCH_AMPERE: u32 = 7;
/// NVML_DEVICE_MIG_ENABLE.
const MIG_ENABLED: u32 = 1;
/// A100's compute capability, reported for every simulated GPU.
const COMPUTE_CAPABILITY: [u32; 2] = [8, 0];

#[derive(Serialize)]
struct Topology<'a> {
    driver_version: &'a str,
    cuda_driver_version: u32,
    nvml_version: String,
    init_error: u32,
    init_delay_ms: u64,
    /// The file each init appends its process id to, for tests that count NVML's inits.
    init_record: PathBuf,
    /// Where the mock lays out the MIG devices it makes, as simnode laid out the first ones.
    node: NodeLayout,
    memory_limits: MemoryLimitsLayout,
    /// A WSL2 guest's NVML: no minor numbers.
    wsl: bool,
    gpus: Vec<TopologyGpu<'a>>,
}

/// The memory limits the mock keeps, the record of the calls that set them, and the code both
/// calls answer instead (0: none).
#[derive(Serialize)]
struct MemoryLimitsLayout {
    state: PathBuf,
    record: PathBuf,
    error: u32,
}

/// NVML_ERROR_NOT_SUPPORTED.
const NOT_SUPPORTED: u32 = 3;
/// Where the mock keeps the memory limits set, beside the driver root like `nvml-inits`.
pub const MEMORY_LIMITS_STATE: &str = "nvml-memory-limits.json";
/// Where each memory limit Set call appends a JSON line.
pub const MEMORY_LIMIT_CALLS: &str = "nvml-memory-limit-calls";

/// The node's MIG capability files and nodes: the driver's `capabilities` directory under the
/// proc root, `/dev/nvidia-caps` under the dev root, and the nvidia-caps major.
#[derive(Serialize)]
struct NodeLayout {
    capabilities: PathBuf,
    caps_dev: PathBuf,
    caps_major: u32,
}

#[derive(Serialize)]
struct TopologyGpu<'a> {
    uuid: &'a str,
    minor: u32,
    pci_bus_id: String,
    pci_device_id: u32,
    name: &'a str,
    brand: u32,
    architecture: u32,
    cuda_compute_capability: [u32; 2],
    memory_total: u64,
    persistence_mode: bool,
    mig_mode: u32,
    mig_devices: &'a [MigDevice],
}

/// The topology of the node in `node_dir`, whose nvidia-caps major is `caps_major`.
pub fn render(params: &Params, gpus: &[Gpu], node_dir: &Path, caps_major: u32) -> Result<String> {
    let cuda = cuda_driver_version(&params.cuda_version)?;
    let topology = Topology {
        driver_version: &params.driver_version,
        cuda_driver_version: cuda,
        // NVML's own version is the CUDA major glued to the driver version.
        nvml_version: format!("{}.{}", cuda / 1000, params.driver_version),
        init_error: params.nvml_init_error,
        init_delay_ms: params.nvml_init_delay_ms,
        // Beside the driver root, not in it: nvhook fingerprints the NVML library's directory.
        init_record: node_dir.join("nvml-inits"),
        node: NodeLayout {
            capabilities: node_dir.join("proc/driver/nvidia/capabilities"),
            caps_dev: node_dir.join("dev/nvidia-caps"),
            caps_major,
        },
        memory_limits: MemoryLimitsLayout {
            state: node_dir.join(MEMORY_LIMITS_STATE),
            record: node_dir.join(MEMORY_LIMIT_CALLS),
            error: match params.memory_limits_not_supported {
                true => NOT_SUPPORTED,
                false => 0,
            },
        },
        wsl: params.wsl,
        gpus: gpus
            .iter()
            .map(|gpu| TopologyGpu {
                uuid: &gpu.uuid,
                minor: gpu.minor,
                pci_bus_id: gpu.nvml_bus_id(),
                pci_device_id: PCI_DEVICE_ID,
                name: &gpu.name,
                brand: BRAND_TESLA,
                architecture: ARCH_AMPERE,
                cuda_compute_capability: COMPUTE_CAPABILITY,
                memory_total: GPU_MEMORY_BYTES,
                persistence_mode: gpu.persistence_mode,
                mig_mode: if gpu.mig_enabled { MIG_ENABLED } else { 0 },
                mig_devices: &gpu.mig,
            })
            .collect(),
    };
    Ok(serde_json::to_string_pretty(&topology)? + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_contract_shape() {
        let params = Params {
            gpus: 2,
            mig: vec![(1, 1)],
            driver_version: "550.54.15".into(),
            cuda_version: "12.4".into(),
            nvml_init_error: 3,
            nvml_init_delay_ms: 250,
            lost: vec![],
            fabric: crate::fabric::Fabric::default(),
            persistence_off: vec![],
            memory_limits_not_supported: false,
            wsl: false,
        };
        let json: serde_json::Value = serde_json::from_str(
            &render(&params, &params.gpu_list(), Path::new("/node"), 510).unwrap(),
        )
        .unwrap();
        assert_eq!(json["cuda_driver_version"], 12040);
        assert_eq!(json["nvml_version"], "12.550.54.15");
        assert_eq!(json["init_error"], 3);
        assert_eq!(json["init_delay_ms"], 250);
        assert_eq!(json["init_record"], "/node/nvml-inits");
        assert_eq!(
            json["node"],
            serde_json::json!({"capabilities": "/node/proc/driver/nvidia/capabilities",
                "caps_dev": "/node/dev/nvidia-caps", "caps_major": 510})
        );
        assert_eq!(
            json["memory_limits"],
            serde_json::json!({"state": "/node/nvml-memory-limits.json",
                "record": "/node/nvml-memory-limit-calls", "error": 0})
        );
        assert_eq!(json["gpus"][0]["pci_device_id"], 0x20B2_10DE);
        assert_eq!(json["gpus"][0]["mig_mode"], 0);
        assert_eq!(json["gpus"][0]["memory_total"], 80u64 << 30);
        assert_eq!(json["gpus"][0]["persistence_mode"], true);
        assert_eq!(json["gpus"][1]["mig_mode"], 1);
        let mig = &json["gpus"][1]["mig_devices"][0];
        assert_eq!(mig["gpu_instance_id"], 0);
        assert_eq!(mig["compute_instance_id"], 0);
        assert!(mig["uuid"].as_str().unwrap().starts_with("MIG-"));
        assert_eq!(
            mig["gpu_instance"],
            serde_json::json!({"profile_id": 0, "placement_start": 0, "placement_size": 8})
        );
        assert_eq!(mig["memory_total"], 81_152u64 << 20);
        assert_eq!(mig.as_object().unwrap().len(), 6);
    }
}
