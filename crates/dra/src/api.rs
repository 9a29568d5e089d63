//! The kubelet's plugin APIs as tonic generates them from the vendored protos, and the names
//! a plugin gives in its registration.

/// `pluginregistration.Registration`: the kubelet's plugin watcher asks a socket in its
/// registry directory who is there.
pub mod registration {
    tonic::include_proto!("pluginregistration");
}

/// `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin` (Kubernetes 1.34 and later).
pub mod v1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// `k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`: the same calls without `share_id`, for
/// kubelets that do not speak v1.
pub mod v1beta1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
}

/// `v1alpha1.DRAResourceHealth`: device health streamed to the kubelet.
pub mod health {
    tonic::include_proto!("v1alpha1");
}

/// `PluginInfo.type` of a DRA plugin.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// What `PluginInfo.supported_versions` names for each service a DRA plugin serves (the
/// kubelet reads that field as the list of services): the constants of k8s.io/kubelet's
/// `pkg/apis/dra/*/types.go`, and the health service's full name.
pub const SERVICE_V1: &str = "v1.DRAPlugin";
pub const SERVICE_V1BETA1: &str = "v1beta1.DRAPlugin";
pub const SERVICE_HEALTH: &str = "v1alpha1.DRAResourceHealth";
