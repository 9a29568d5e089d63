//! nvhook: give OCI containers NVIDIA GPUs.
//!
//! The pure model (request, inventory data, plan) is separate from everything that touches
//! the system (NVML loading, mounts, cgroups), so the former is tested without root.

pub mod atomic_file;
pub mod capability;
pub mod cdi;
pub mod config;
pub mod configure;
pub mod dev_char;
pub mod doctor;
pub mod echo;
pub mod elf_machine;
pub mod entry;
pub mod extra_devices;
mod file_id;
mod glob;
pub mod host_plan;
pub mod inject;
pub mod install;
pub mod inventory;
pub mod labels;
pub mod logging;
pub mod nri;
pub mod nvidia_cli;
pub mod oci;
pub mod plan;
pub mod plan_file;
pub mod privileges;
pub mod proc_view;
pub mod report;
pub mod request;
pub mod rootfs;
pub mod shim;
pub mod version;
