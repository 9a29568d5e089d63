//! NVML's answer as nvhook-nvml sends it (JSON on its stdout): the data, not the query,
//! which lives in that program alone (crates/nvml), the only one that loads libnvidia-ml.

use super::Gpu;

/// What NVML reports about the system.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct System {
    pub driver_version: String,
    pub cuda_version: String,
    pub gpus: Vec<Gpu>,
}

/// What nvhook-nvml writes: the answer, or NVML's error in one line.
pub type Reply = Result<System, String>;
