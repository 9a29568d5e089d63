//! NVML's answer as nvhook-nvml sends it (JSON on its stdout): the data, not the query,
//! which lives in that program alone (crates/nvml), the only one that loads libnvidia-ml.

pub use nvhook_model::inventory::{Reply, System};
