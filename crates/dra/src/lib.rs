//! Kubernetes DRA (Dynamic Resource Allocation) kubelet plugins in Rust.
//!
//! A DRA driver's node side is a kubelet plugin: the kubelet's plugin watcher finds its
//! registration socket in `/var/lib/kubelet/plugins_registry/`, asks it who it is
//! (`pluginregistration.Registration`), and then calls it on its own socket to prepare the
//! ResourceClaims of the pods it starts and to unprepare them when they end
//! (`k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`, or `v1beta1` for kubelets before 1.34), and
//! may watch the health of its devices (`v1alpha1.DRAResourceHealth`). This crate serves all
//! of that over gRPC ([`start`]) for a [`Driver`], which only says what one claim means on
//! this node. What a claim was allocated, the ResourceSlices and the CDI specs are the
//! driver's: this crate knows nothing of the API server.
//!
//! With the feature `kubelet-double`, [`kubelet`] is the kubelet's side of the same calls, for
//! tests that have no kubelet.

pub mod api;
mod convert;
mod error;
#[cfg(feature = "kubelet-double")]
pub mod kubelet;
mod server;

pub use error::DraError;
pub use server::{KUBELET_PLUGINS_DIR, KUBELET_REGISTRY_DIR, PluginOptions, Server, start};

/// A ResourceClaim as the kubelet names it when it asks for it to be prepared.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Claim {
    pub namespace: String,
    pub uid: String,
    pub name: String,
}

/// A device of a prepared claim: what the kubelet tells the runtime (its CDI ids).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PreparedDevice {
    /// The claim's requests this device serves; empty means all of them.
    pub requests: Vec<String>,
    pub pool: String,
    pub device: String,
    pub cdi_ids: Vec<String>,
}

/// What a device's health is, as the kubelet reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    Unknown,
    Healthy,
    Unhealthy,
}

/// One device's health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceHealth {
    pub pool: String,
    pub device: String,
    pub health: Health,
    /// Why, in a line (the kubelet keeps 1024 characters of it).
    pub message: String,
}

/// What a DRA driver does on its node. Each call is made on a blocking thread of its own, one
/// claim at a time per call from the kubelet.
pub trait Driver: Send + Sync + 'static {
    /// Makes `claim` ready for its pods: its devices, or one line saying why it cannot be.
    /// The kubelet calls it again for a claim that failed, and for one it already prepared
    /// (after its own restart): the same answer must come back.
    fn prepare(&self, claim: &Claim) -> Result<Vec<PreparedDevice>, String>;

    /// Undoes [`Driver::prepare`]; a claim this node never prepared (or already unprepared)
    /// is unprepared already.
    fn unprepare(&self, claim: &Claim) -> Result<(), String>;

    /// The health of every device of the driver now, when [`PluginOptions::health_interval`]
    /// turns the health service on; polled, and sent when it changes.
    fn health(&self) -> Vec<DeviceHealth> {
        Vec::new()
    }
}
