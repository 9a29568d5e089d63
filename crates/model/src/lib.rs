//! nvhook's model, kept apart from every reader and effect: what a container asks for (the
//! request, read from its OCI spec), what the host has (the inventory, as data), the config,
//! and the plan that joins them. Nothing here touches the system: the host readers fill these
//! types, the delivery layer and the ways in act on the plan, and tests build them by hand.
//! The NVML helper (`nvhook-nvml`) shares the inventory's types through this crate alone.

pub mod capability;
pub mod config;
pub mod device_rule;
pub mod imex_and_families;
pub mod inventory;
pub mod oci;
pub mod plan;
pub mod proc_view;
pub mod request;
pub mod shown;
pub mod stable_hash;
pub mod version;
