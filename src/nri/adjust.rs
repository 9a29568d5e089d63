//! CDI container edits → an NRI container adjustment: the same edits nvhook-runtime's cdi mode
//! writes into config.json, handed to the engine instead.

use crate::delivery::cdi_spec::{ContainerEdits, DeviceNode, Hook, Mount};
use nvhook_nri::api;

/// `edits` as an adjustment. The engine adds each device's cgroup rule itself, with the
/// access its mode allows (`rw` for a character device).
pub fn adjustment(edits: &ContainerEdits) -> api::ContainerAdjustment {
    let mut hooks = api::Hooks::default();
    for hook in &edits.hooks {
        let stage = match hook.hook_name.as_str() {
            "prestart" => &mut hooks.prestart,
            "createRuntime" => &mut hooks.create_runtime,
            "startContainer" => &mut hooks.start_container,
            "poststart" => &mut hooks.poststart,
            "poststop" => &mut hooks.poststop,
            _ => &mut hooks.create_container,
        };
        stage.push(self::hook(hook));
    }
    api::ContainerAdjustment {
        env: edits
            .env
            .iter()
            .map(|kv| {
                let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
                api::KeyValue {
                    key: key.into(),
                    value: value.into(),
                }
            })
            .collect(),
        mounts: edits.mounts.iter().map(mount).collect(),
        hooks: (!edits.hooks.is_empty()).then_some(hooks),
        linux: (!edits.device_nodes.is_empty()).then(|| api::LinuxContainerAdjustment {
            devices: edits.device_nodes.iter().map(device).collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn mount(m: &Mount) -> api::Mount {
    api::Mount {
        destination: m.container_path.clone(),
        r#type: m.kind.clone().unwrap_or_else(|| "bind".into()),
        source: m.host_path.clone(),
        options: m.options.clone(),
    }
}

fn device(d: &DeviceNode) -> api::LinuxDevice {
    api::LinuxDevice {
        path: d.path.clone(),
        r#type: d.kind.clone().unwrap_or_else(|| "c".into()),
        major: d.major.unwrap_or_default(),
        minor: d.minor.unwrap_or_default(),
        file_mode: d.file_mode.map(|value| api::OptionalFileMode { value }),
        uid: None,
        gid: None,
    }
}

fn hook(h: &Hook) -> api::Hook {
    api::Hook {
        path: h.path.clone(),
        args: h.args.clone(),
        env: h.env.clone(),
        timeout: h.timeout.map(|t| api::OptionalInt { value: t.into() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::delivery::{HookBinary, container_edits};
    use nvhook_model::plan::fixtures::one_gpu_plan;

    #[test]
    fn every_edit_reaches_the_adjustment() {
        let hook = HookBinary::new(&Config::default(), None);
        let mut edits = container_edits(&one_gpu_plan(), &hook);
        edits.mounts.push(Mount {
            host_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.550".into(),
            container_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.550".into(),
            kind: None,
            options: crate::plan::MOUNT_OPTIONS
                .iter()
                .map(|o| o.to_string())
                .collect(),
        });
        edits
            .hooks
            .push(hook.hook("createContainer", vec!["--link".into(), "/a=b".into()]));
        let adjust = adjustment(&edits);
        assert_eq!(adjust.env[0].key, "NVIDIA_VISIBLE_DEVICES");
        assert_eq!(adjust.env[0].value, "void");
        let devices = &adjust.linux.as_ref().unwrap().devices;
        assert_eq!(devices.len(), 1);
        assert_eq!((devices[0].r#type.as_str(), devices[0].major), ("c", 195));
        assert_eq!(devices[0].file_mode.as_ref().unwrap().value, 0o666);
        let m = &adjust.mounts[0];
        assert_eq!(
            (m.r#type.as_str(), m.source.as_str()),
            ("bind", m.destination.as_str())
        );
        assert!(m.options.contains(&"ro".to_string()), "{m:?}");
        let hooks = adjust.hooks.unwrap();
        assert_eq!(hooks.create_container.len(), 1);
        assert_eq!(
            hooks.create_container[0].timeout.as_ref().unwrap().value,
            30
        );
        assert!(hooks.prestart.is_empty());
    }
}
