//! An NRI container as the OCI spec fields the request is read from, so that the NRI plugin
//! reads a GPU request with the same code as the hook and nvhook-runtime.
//!
//! NRI v0.8.0 does not carry the container's capabilities: the plugin cannot tell a
//! privileged container, and treats every container as unprivileged (the environment counts
//! only where `accept-env-when-unprivileged` lets it).

use crate::delivery::cdi_spec::Mount;
use crate::oci::{self, Spec};
use crate::request::DEVICE_MOUNT_ROOT;
use nvhook_nri::api::{Container, PodSandbox};

/// The pod annotation NVIDIA's NRI plugin reads for a container's CDI devices:
/// `nvidia.cdi.k8s.io/container.<name>: nvidia.com/gpu=0,nvidia.com/gpu=1`.
pub const ANNOTATION_PREFIX: &str = "nvidia.cdi.k8s.io/container.";

/// Whether the engine gives `container` a user namespace of its own (`hostUsers: false`).
pub fn has_user_namespace(container: &Container) -> bool {
    container
        .linux
        .as_ref()
        .is_some_and(|l| l.namespaces.iter().any(|ns| ns.r#type == "user"))
}

/// The fields of `container` that a request is read from.
pub fn spec_of(container: &Container) -> Spec {
    let linux = container.linux.as_ref();
    Spec {
        process: Some(oci::Process {
            env: container.env.clone(),
            capabilities: None,
        }),
        root: None,
        mounts: container
            .mounts
            .iter()
            .map(|m| oci::Mount {
                destination: m.destination.clone().into(),
                source: Some(m.source.clone().into())
                    .filter(|s: &std::path::PathBuf| !s.as_os_str().is_empty()),
                kind: Some(m.r#type.clone()).filter(|t| !t.is_empty()),
                options: m.options.clone(),
            })
            .collect(),
        linux: Some(oci::Linux {
            devices: linux
                .map(|l| {
                    l.devices
                        .iter()
                        .map(|d| oci::LinuxDevice {
                            path: d.path.clone().into(),
                            kind: d.r#type.clone(),
                            major: Some(d.major),
                            minor: Some(d.minor),
                        })
                        .collect()
                })
                .unwrap_or_default(),
            rootfs_propagation: None,
            // Not in NRI's view; the /proc view's choice, which needs them, is the
            // spec's hook's, made from the bundle's config.json.
            masked_paths: Vec::new(),
            readonly_paths: Vec::new(),
            // The cgroup is the spec's hook's to find, from the container's process.
            cgroups_path: None,
        }),
        annotations: container.annotations.clone().into_iter().collect(),
    }
}

/// The devices of nvhook's CDI kind that `pod` annotates `container` with, if its namespace
/// is one the config trusts with annotations. Any pod can annotate itself, so a namespace
/// not listed gets nothing from an annotation (NVIDIA's plugin honours them everywhere).
pub fn annotated_devices(
    pod: &PodSandbox,
    container: &Container,
    trusted_namespaces: &[String],
) -> Vec<String> {
    if !trusted_namespaces.contains(&pod.namespace) {
        return Vec::new();
    }
    let key = format!("{ANNOTATION_PREFIX}{}", container.name);
    let Some(value) = pod.annotations.get(&key) else {
        return Vec::new();
    };
    value
        .split(',')
        .filter_map(|name| {
            name.trim()
                .strip_prefix(crate::cdi::KIND)?
                .strip_prefix('=')
        })
        .map(str::to_string)
        .collect()
}

/// The devices of nvhook's CDI kind among the CDI devices the engine says `container` asked
/// for (NRI v0.10 and later; containerd 2.2 fills them in, 2.1 never does). The engine
/// injects those itself from nvhook's spec, whatever the image's environment asks for.
pub fn engine_cdi_devices(container: &Container) -> Vec<&str> {
    container
        .cdi_devices
        .iter()
        .filter_map(|d| d.name.strip_prefix(crate::cdi::KIND)?.strip_prefix('='))
        .collect()
}

/// `spec` with `devices` asked for the way the device plugin asks: a host `/dev/null` mounted
/// at `/var/run/nvidia-container-devices/<id>`, the form only the node's own agents can write.
pub fn with_device_mounts(mut spec: Spec, devices: &[String]) -> Spec {
    spec.mounts.extend(devices.iter().map(|id| {
        let m = device_mount(id);
        oci::Mount {
            destination: m.container_path.into(),
            source: Some(m.host_path.into()),
            kind: m.kind,
            options: m.options,
        }
    }));
    spec
}

/// The device plugin's mount for device `id`.
pub fn device_mount(id: &str) -> Mount {
    Mount {
        host_path: "/dev/null".into(),
        container_path: format!("{DEVICE_MOUNT_ROOT}/{id}"),
        kind: Some("bind".into()),
        options: vec!["bind".into(), "ro".into()],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvhook_nri::api;
    use std::collections::HashMap;

    fn pod(namespace: &str, annotations: &[(&str, &str)]) -> PodSandbox {
        PodSandbox {
            namespace: namespace.into(),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<HashMap<_, _>>(),
            ..Default::default()
        }
    }

    #[test]
    fn the_spec_carries_env_mounts_and_devices() {
        let container = Container {
            env: vec!["NVIDIA_VISIBLE_DEVICES=2".into()],
            mounts: vec![api::Mount {
                destination: "/var/run/nvidia-container-devices/1".into(),
                r#type: "bind".into(),
                source: "/dev/null".into(),
                options: vec!["rbind".into()],
            }],
            linux: Some(api::LinuxContainer {
                devices: vec![api::LinuxDevice {
                    path: "/dev/fuse".into(),
                    r#type: "c".into(),
                    major: 10,
                    minor: 229,
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let spec = spec_of(&container);
        assert_eq!(spec.env("NVIDIA_VISIBLE_DEVICES"), Some("2"));
        assert!(!spec.privileged());
        assert!(spec.mounts[0].is_bind());
        assert_eq!(spec.devices()[0].minor, Some(229));
    }

    #[test]
    fn annotations_count_only_in_trusted_namespaces_and_for_nvhooks_kind() {
        let container = Container {
            name: "train".into(),
            ..Default::default()
        };
        let ann = [(
            "nvidia.cdi.k8s.io/container.train",
            "nvidia.com/gpu=1, nvidia.com/gpu=GPU-abc,management.nvidia.com/gpu=all,vendor.com/x=0",
        )];
        let trusted = vec!["gpu-system".to_string()];
        assert!(annotated_devices(&pod("default", &ann), &container, &trusted).is_empty());
        assert_eq!(
            annotated_devices(&pod("gpu-system", &ann), &container, &trusted),
            vec!["1", "GPU-abc"]
        );
        let other = [("nvidia.cdi.k8s.io/container.other", "nvidia.com/gpu=0")];
        assert!(annotated_devices(&pod("gpu-system", &other), &container, &trusted).is_empty());
    }

    #[test]
    fn the_engine_s_cdi_devices_of_nvhooks_kind_are_named() {
        let container = Container {
            cdi_devices: [
                "nvidia.com/gpu=1",
                "nvidia.com/gpu=GPU-abc",
                "nvidia.com/gpus=0",
                "vendor.com/x=0",
            ]
            .map(|name| api::CdiDevice { name: name.into() })
            .to_vec(),
            ..Default::default()
        };
        assert_eq!(engine_cdi_devices(&container), vec!["1", "GPU-abc"]);
        assert!(engine_cdi_devices(&Container::default()).is_empty());
    }
}
