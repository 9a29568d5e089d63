//! The topology file, the contract between `simnode` (which writes it) and this mock (which
//! reads it, and writes it back with the MIG devices it made or removed).

use std::{fs, io, path::Path};

use serde::{Deserialize, Serialize};

use crate::pci::BusId;
use crate::status::Status;

/// Where the mock looks for its topology, beside the library file itself.
pub const TOPOLOGY_FILE: &str = "nvml-topology.json";
/// The most GPUs the mock models, as the brief and NVIDIA's own tooling assume.
pub const MAX_GPUS: usize = 64;
/// `nvmlDeviceGetMaxMigDeviceCount` on an A100/H100 with MIG enabled.
pub const MAX_MIG_DEVICES: usize = 7;
/// GPU instance ids run 0..=14 on an A100/H100 (7g is 0, 1g instances 7 to 14).
pub const MAX_GPU_INSTANCES: usize = simmig::MAX_GPU_INSTANCES as usize;
/// Compute instance ids run 0..=7 in a GPU instance.
pub const MAX_COMPUTE_INSTANCES: usize = simmig::MAX_COMPUTE_INSTANCES as usize;

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Topology {
    pub driver_version: String,
    /// `1000 * major + 10 * minor`, as `nvmlSystemGetCudaDriverVersion` reports it.
    pub cuda_driver_version: i32,
    #[serde(default)]
    nvml_version: Option<String>,
    /// Fault injection: the `nvmlReturn_t` every init returns; 0 lets init succeed.
    #[serde(default)]
    pub init_error: u32,
    /// Fault injection: how long init takes, to exercise callers' timeouts.
    #[serde(default)]
    pub init_delay_ms: u64,
    /// Where each init appends its process id (the simulated node's `nvml-inits`).
    #[serde(default)]
    pub init_record: Option<std::path::PathBuf>,
    /// Where MIG instances made or removed show on the node; absent, only this file changes.
    #[serde(default)]
    pub node: Option<NodeLayout>,
    /// Where the memory limits set are kept and recorded; absent: the calls answer
    /// NOT_SUPPORTED.
    #[serde(default)]
    #[cfg_attr(not(feature = "memory-limits"), allow(dead_code))]
    pub memory_limits: Option<MemoryLimitsLayout>,
    /// The driver of a WSL2 guest: its GPUs have no device node of their own (all go through
    /// `/dev/dxg`), so NVML has no minor number for them.
    #[serde(default)]
    pub wsl: bool,
    pub gpus: Vec<Gpu>,
}

/// The node's files for `nvmlDeviceSetMemoryLimits_v1`, outside the driver's directories (whose
/// state nvhook's cache fingerprints).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[cfg_attr(not(feature = "memory-limits"), allow(dead_code))]
pub struct MemoryLimitsLayout {
    /// The limits set, by GPU and cgroup directory.
    pub state: std::path::PathBuf,
    /// Where each Set call appends one JSON line: `pid`, `gpu` (UUID), `path`, `soft`, `hard`
    /// (bytes; null where NVML could not read them) and `result` (the `nvmlReturn_t`).
    pub record: std::path::PathBuf,
    /// Fault injection: the `nvmlReturn_t` both calls return for a valid GPU; 0 lets them work.
    #[serde(default)]
    pub error: u32,
}

/// The node's MIG capability files and nodes, as simnode laid them out.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct NodeLayout {
    /// The driver's `capabilities` directory under the node's proc root.
    pub capabilities: std::path::PathBuf,
    /// `/dev/nvidia-caps` under the node's dev root.
    pub caps_dev: std::path::PathBuf,
    pub caps_major: u32,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Gpu {
    pub uuid: String,
    pub minor: u32,
    pub pci_bus_id: BusId,
    pub pci_device_id: u32,
    pub name: String,
    pub brand: u32,
    pub architecture: u32,
    pub cuda_compute_capability: [i32; 2],
    /// Total framebuffer memory in bytes; absent: `nvmlDeviceGetMemoryInfo_v2` is not
    /// supported.
    #[serde(default)]
    pub memory_total: Option<u64>,
    /// Persistence mode; absent: not supported, as on a driver that lacks the setting.
    #[serde(default)]
    pub persistence_mode: Option<bool>,
    /// Current and pending MIG mode; 1 means enabled.
    pub mig_mode: u32,
    /// Visible only while `mig_mode` is 1, as real MIG devices exist only then.
    #[serde(default)]
    pub mig_devices: Vec<MigDevice>,
    /// GPU instances without a compute instance, so without a MIG device: made, not yet filled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub empty_gpu_instances: Vec<EmptyGpuInstance>,
}

/// A GPU instance no compute instance is in.
#[derive(Debug, Clone, Copy, Deserialize, Serialize)]
pub struct EmptyGpuInstance {
    pub id: u32,
    #[serde(flatten)]
    pub instance: GpuInstance,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct MigDevice {
    pub uuid: String,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    pub name: String,
    /// Its GPU instance's profile id and placement, as `nvmlGpuInstanceGetInfo` reports
    /// them; absent: the GPU instance is not found, as for a caller NVML refuses them.
    #[serde(default)]
    pub gpu_instance: Option<GpuInstance>,
    /// The MIG device's framebuffer in bytes; absent: its memory query is not supported.
    #[serde(default)]
    pub memory_total: Option<u64>,
    /// Its compute instance's profile id; absent: the one spanning its GPU instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_profile_id: Option<u32>,
}

/// `nvmlGpuInstanceInfo_t` less its parent handle and id, which the topology already has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub struct GpuInstance {
    pub profile_id: u32,
    pub placement_start: u32,
    pub placement_size: u32,
}

/// Why no topology could be loaded; each maps to the status init returns.
#[derive(Debug, PartialEq, Eq)]
pub enum TopologyError {
    /// No topology file: the mock's stand-in for a host whose driver is not loaded.
    Missing,
    /// Unreadable, malformed, or describing what NVML could not report.
    Invalid,
}

impl From<TopologyError> for Status {
    fn from(error: TopologyError) -> Self {
        match error {
            TopologyError::Missing => Status::DRIVER_NOT_LOADED,
            TopologyError::Invalid => Status::UNKNOWN,
        }
    }
}

impl Topology {
    pub fn load(dir: &Path) -> Result<Self, TopologyError> {
        let text = fs::read(dir.join(TOPOLOGY_FILE)).map_err(|error| match error.kind() {
            io::ErrorKind::NotFound => TopologyError::Missing,
            _ => TopologyError::Invalid,
        })?;
        Self::parse(&text)
    }

    pub fn parse(text: &[u8]) -> Result<Self, TopologyError> {
        let topology: Self = serde_json::from_slice(text).map_err(|_| TopologyError::Invalid)?;
        topology.validate()?;
        Ok(topology)
    }

    /// Rejects what the C side could not express: too many devices for the handle
    /// table, and NUL bytes that would silently truncate strings copied out.
    fn validate(&self) -> Result<(), TopologyError> {
        let too_many_migs = self
            .gpus
            .iter()
            .any(|gpu| gpu.mig_devices.len() > MAX_MIG_DEVICES);
        let bad_instance = self.gpus.iter().any(|gpu| {
            let empty = gpu.empty_gpu_instances.iter().map(|gi| gi.id);
            let ids = gpu.mig_devices.iter().map(|mig| mig.gpu_instance_id);
            let bad_ci = gpu
                .mig_devices
                .iter()
                .any(|mig| mig.compute_instance_id as usize >= MAX_COMPUTE_INSTANCES);
            bad_ci || ids.chain(empty).any(|id| id as usize >= MAX_GPU_INSTANCES)
        });
        let has_nul = self.strings().any(|text| text.contains('\0'));
        if self.gpus.len() > MAX_GPUS || too_many_migs || bad_instance || has_nul {
            return Err(TopologyError::Invalid);
        }
        Ok(())
    }

    fn strings(&self) -> impl Iterator<Item = &str> {
        let system = [
            self.driver_version.as_str(),
            self.nvml_version.as_deref().unwrap_or(""),
        ];
        let gpus = self.gpus.iter().flat_map(|gpu| {
            let migs = gpu
                .mig_devices
                .iter()
                .flat_map(|mig| [mig.uuid.as_str(), &mig.name]);
            [gpu.uuid.as_str(), &gpu.name].into_iter().chain(migs)
        });
        system.into_iter().chain(gpus)
    }

    /// The NVML version, `<CUDA major>.<driver version>` unless the topology names one.
    pub fn nvml_version(&self) -> String {
        match &self.nvml_version {
            Some(version) => version.clone(),
            None => format!(
                "{}.{}",
                self.cuda_driver_version / 1000,
                self.driver_version
            ),
        }
    }
}

impl Gpu {
    pub fn mig_enabled(&self) -> bool {
        self.mig_mode == 1
    }

    /// The MIG devices NVML would enumerate: none while MIG is disabled.
    pub fn mig_devices(&self) -> &[MigDevice] {
        if self.mig_enabled() {
            &self.mig_devices
        } else {
            &[]
        }
    }

    /// GPU instance `id` as its MIG devices describe it (every compute instance of one GPU
    /// instance lists the same), or as made with none in it; None where there is none or no
    /// MIG device describes it.
    pub fn gpu_instance(&self, id: u32) -> Option<GpuInstance> {
        self.gpu_instances()
            .find(|&(gi, _)| gi == id)
            .map(|(_, instance)| instance)
    }

    /// Every GPU instance that NVML would describe, by id, with MIG enabled.
    pub fn gpu_instances(&self) -> impl Iterator<Item = (u32, GpuInstance)> + '_ {
        let filled = self
            .mig_devices()
            .iter()
            .filter_map(|mig| Some((mig.gpu_instance_id, mig.gpu_instance?)));
        let empty = self
            .empty_gpu_instances
            .iter()
            .filter(|_| self.mig_enabled())
            .map(|gi| (gi.id, gi.instance));
        filled.chain(empty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn gpu(mig_devices: usize) -> serde_json::Value {
        let migs: Vec<_> = (0..mig_devices)
            .map(|i| json!({"uuid": format!("MIG-{i}"), "gpu_instance_id": i, "compute_instance_id": 0, "name": "m"}))
            .collect();
        json!({
            "uuid": "GPU-0", "minor": 0, "pci_bus_id": "0000:18:00.0", "pci_device_id": 1,
            "name": "n", "brand": 2, "architecture": 7, "cuda_compute_capability": [8, 0],
            "mig_mode": 1, "mig_devices": migs
        })
    }

    fn parse(gpus: Vec<serde_json::Value>) -> Result<Topology, TopologyError> {
        let doc =
            json!({"driver_version": "550.54.15", "cuda_driver_version": 12040, "gpus": gpus});
        Topology::parse(doc.to_string().as_bytes())
    }

    #[test]
    fn optional_fields_default() {
        let topology = parse(vec![gpu(0)]).unwrap();
        assert_eq!((topology.init_error, topology.init_delay_ms), (0, 0));
        assert_eq!(topology.nvml_version(), "12.550.54.15");
        assert_eq!(
            topology.gpus[0].pci_bus_id,
            BusId::parse("00000000:18:00.0").unwrap()
        );
    }

    #[test]
    fn rejects_what_nvml_cannot_report() {
        assert_eq!(
            parse(vec![gpu(MAX_MIG_DEVICES + 1)]).err(),
            Some(TopologyError::Invalid)
        );
        assert_eq!(
            parse(vec![gpu(0); MAX_GPUS + 1]).err(),
            Some(TopologyError::Invalid)
        );
        assert!(parse(vec![gpu(MAX_MIG_DEVICES); MAX_GPUS]).is_ok());
        let mut bad_bus = gpu(0);
        bad_bus["pci_bus_id"] = json!("not-a-bus");
        assert_eq!(parse(vec![bad_bus]).err(), Some(TopologyError::Invalid));
        let mut nul = gpu(0);
        nul["name"] = json!("a\u{0}b");
        assert_eq!(parse(vec![nul]).err(), Some(TopologyError::Invalid));
    }

    #[test]
    fn requires_gpu_fields() {
        let mut no_minor = gpu(0);
        no_minor.as_object_mut().unwrap().remove("minor");
        assert_eq!(parse(vec![no_minor]).err(), Some(TopologyError::Invalid));
    }

    #[test]
    fn gpu_instances_are_found_by_their_id() {
        let mut with = gpu(2);
        with["mig_devices"][1]["gpu_instance"] =
            json!({"profile_id": 9, "placement_start": 0, "placement_size": 4});
        let topology = parse(vec![with]).unwrap();
        let first = &topology.gpus[0];
        let instance = first.gpu_instance(1).unwrap();
        assert_eq!(
            (
                instance.profile_id,
                instance.placement_start,
                instance.placement_size
            ),
            (9, 0, 4)
        );
        assert!(first.gpu_instance(0).is_none(), "no facts given for it");
        assert!(first.gpu_instance(5).is_none(), "no such instance");
        let mut bad = gpu(1);
        bad["mig_devices"][0]["gpu_instance_id"] = json!(MAX_GPU_INSTANCES);
        assert_eq!(parse(vec![bad]).err(), Some(TopologyError::Invalid));
    }

    #[test]
    fn mig_devices_hidden_while_mig_disabled() {
        let mut disabled = gpu(2);
        disabled["mig_mode"] = json!(0);
        let topology = parse(vec![disabled, gpu(2)]).unwrap();
        assert!(topology.gpus[0].mig_devices().is_empty());
        assert_eq!(topology.gpus[1].mig_devices().len(), 2);
    }

    #[test]
    fn missing_file_is_driver_not_loaded() {
        let dir = std::env::temp_dir().join("mock-nvml-no-such-dir");
        assert_eq!(Topology::load(&dir).err(), Some(TopologyError::Missing));
        assert_eq!(
            Status::from(TopologyError::Missing),
            Status::DRIVER_NOT_LOADED
        );
    }
}
