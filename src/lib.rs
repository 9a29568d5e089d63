//! nvhook: give OCI containers NVIDIA GPUs.
//!
//! The model (request, inventory data, config, plan) is its own crate, `nvhook-model`, with no
//! I/O in it; its modules are re-exported here under the names the rest of nvhook uses. This
//! package holds what touches the system: the host readers, the delivery of a plan into a
//! container, and the ways in. docs/architecture.md maps the layers.

pub use nvhook_model::{capability, imex_and_families, plan, proc_view, request, shown, version};

pub mod atomic_file;
pub mod binary_paths;
pub mod cdi;
pub mod config;
pub mod configure;
pub mod delivery;
pub mod dev_char;
pub mod doctor;
pub mod dra;
pub mod elf_machine;
pub mod entry;
mod file_id;
mod glob;
pub mod hook;
pub mod host_plan;
pub mod inventory;
pub mod kept_config;
pub mod labels;
pub mod log_line;
pub mod logging;
pub mod nri;
pub mod nri_handoff;
pub mod nvidia_cli;
pub mod oci;
pub mod plan_file;
pub mod private_file;
pub mod privileges;
pub mod rootfs;
pub mod runtime_create;
mod whole_file;
