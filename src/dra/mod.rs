//! nvhook as the node side of a Kubernetes DRA driver for GPUs, under NVIDIA's names so that a
//! cluster can swap drivers without rewriting its DeviceClasses and claims: which devices
//! this node offers ([`devices`]), and what preparing a ResourceClaim allocated here means
//! ([`claims`]: a CDI spec for exactly its devices, remembered in a [`checkpoint`]). The
//! kubelet's protocol is the `nvhook-dra` crate's, the API server's the `nvhook-dra` binary's.

pub mod checkpoint;
pub mod claims;
pub mod devices;
pub mod names;
pub mod partitions;

/// NVIDIA's DRA driver name for GPUs (kubernetes-sigs/dra-driver-nvidia-gpu).
pub const DRIVER_NAME: &str = "gpu.nvidia.com";
/// The CDI vendor and class of the per-claim specs: NVIDIA's driver's.
pub const CDI_VENDOR: &str = "k8s.gpu.nvidia.com";
pub const CDI_CLASS: &str = "claim";
