//! Applying container edits to a bundle's config.json, as engines apply CDI devices: edited
//! as JSON, so fields nvhook does not know survive.

use crate::delivery::cdi_spec::{ContainerEdits, Hook};
use serde_json::{Map, Value, json};
use std::collections::HashSet;

/// Adds `edits` to `spec`: env entries replace same-name ones; device nodes replace nodes at
/// the same path and get an allow rule each; mounts replace mounts at the same destination;
/// a hook is added to its
/// stage unless that stage already runs the same binary.
pub fn apply(spec: &mut Value, edits: &ContainerEdits) {
    let root = object(spec);
    if !edits.env.is_empty() {
        let process = object(root.entry("process").or_insert_with(|| json!({})));
        let env = array(process, "env");
        let name = |kv: &str| kv.split_once('=').map_or(kv, |(n, _)| n).to_owned();
        let replaced: HashSet<String> = edits.env.iter().map(|kv| name(kv)).collect();
        env.retain(|e| e.as_str().is_none_or(|kv| !replaced.contains(&name(kv))));
        env.extend(edits.env.iter().map(|kv| json!(kv)));
    }
    if !edits.hooks.is_empty() {
        let hooks = object(root.entry("hooks").or_insert_with(|| json!({})));
        for hook in &edits.hooks {
            let stage = array(hooks, &hook.hook_name);
            if !stage
                .iter()
                .any(|h| h.get("path").and_then(Value::as_str) == Some(&hook.path))
            {
                stage.push(oci_hook(hook));
            }
        }
    }
    if !edits.mounts.is_empty() {
        let mounts = array(root, "mounts");
        let replaced: HashSet<&str> = edits
            .mounts
            .iter()
            .map(|m| m.container_path.as_str())
            .collect();
        mounts.retain(|x| !field_in(x, "destination", &replaced));
        for m in &edits.mounts {
            let mut entry = json!({"destination": m.container_path});
            if let Some(kind) = &m.kind {
                entry["type"] = json!(kind);
            }
            entry["source"] = json!(m.host_path);
            entry["options"] = json!(m.options);
            mounts.push(entry);
        }
    }
    if edits.device_nodes.is_empty() {
        return;
    }
    let linux = object(root.entry("linux").or_insert_with(|| json!({})));
    let devices = array(linux, "devices");
    let replaced: HashSet<&str> = edits.device_nodes.iter().map(|n| n.path.as_str()).collect();
    devices.retain(|d| !field_in(d, "path", &replaced));
    for n in &edits.device_nodes {
        let mut entry = json!({"path": n.path, "type": n.kind.as_deref().unwrap_or("c")});
        for (key, value) in [("major", n.major), ("minor", n.minor)] {
            if let Some(v) = value {
                entry[key] = json!(v);
            }
        }
        if let Some(mode) = n.file_mode {
            entry["fileMode"] = json!(mode);
        }
        entry["uid"] = json!(0);
        entry["gid"] = json!(0);
        devices.push(entry);
    }
    let resources = object(linux.entry("resources").or_insert_with(|| json!({})));
    let rules = array(resources, "devices");
    for n in &edits.device_nodes {
        let kind = n.kind.as_deref().unwrap_or("c");
        if matches!(kind, "b" | "c") {
            rules.push(json!({
                "allow": true, "type": kind, "major": n.major, "minor": n.minor,
                "access": n.permissions.as_deref().unwrap_or("rwm"),
            }));
        }
    }
}

/// Whether `entry[key]` is a string in `set`; edits replace entries by set lookups, so the
/// cost stays linear in the spec's size plus the edits'.
fn field_in(entry: &Value, key: &str, set: &HashSet<&str>) -> bool {
    entry
        .get(key)
        .and_then(Value::as_str)
        .is_some_and(|v| set.contains(v))
}

fn oci_hook(hook: &Hook) -> Value {
    let mut entry = json!({"path": hook.path});
    if !hook.args.is_empty() {
        entry["args"] = json!(hook.args);
    }
    if !hook.env.is_empty() {
        entry["env"] = json!(hook.env);
    }
    if let Some(t) = hook.timeout {
        entry["timeout"] = json!(t);
    }
    entry
}

/// `v` as an object, replacing a non-object (a malformed spec field) with an empty one.
fn object(v: &mut Value) -> &mut Map<String, Value> {
    if !v.is_object() {
        *v = json!({});
    }
    v.as_object_mut().expect("just made an object")
}

fn array<'a>(obj: &'a mut Map<String, Value>, key: &str) -> &'a mut Vec<Value> {
    let v = obj.entry(key).or_insert_with(|| json!([]));
    if !v.is_array() {
        *v = json!([]);
    }
    v.as_array_mut().expect("just made an array")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::cdi_spec::{DeviceNode, Mount};

    fn edits() -> ContainerEdits {
        ContainerEdits {
            env: vec!["NVIDIA_VISIBLE_DEVICES=void".into()],
            device_nodes: vec![DeviceNode {
                path: "/dev/nvidia1".into(),
                host_path: Some("/node/dev/nvidia1".into()),
                kind: Some("c".into()),
                major: Some(195),
                minor: Some(1),
                file_mode: Some(0o666),
                permissions: Some("rw".into()),
            }],
            mounts: vec![Mount {
                host_path: "/drv/usr/bin/nvidia-smi".into(),
                container_path: "/usr/bin/nvidia-smi".into(),
                kind: None,
                options: vec!["ro".into(), "rbind".into()],
            }],
            hooks: vec![Hook {
                hook_name: "createContainer".into(),
                path: "/usr/bin/nvhook".into(),
                args: vec!["nvhook".into(), "hook".into(), "createContainer".into()],
                env: vec!["PATH=/bin".into()],
                timeout: Some(30),
            }],
        }
    }

    #[test]
    fn edits_land_in_config_json_once_and_keep_unknown_fields() {
        let mut spec = json!({
            "ociVersion": "1.0.2",
            "x-unknown": {"keep": true},
            "process": {"env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=1"]},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
            "linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]}},
        });
        apply(&mut spec, &edits());
        apply(&mut spec, &edits());
        assert_eq!(spec["x-unknown"], json!({"keep": true}));
        assert_eq!(
            spec["process"]["env"],
            json!(["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void"])
        );
        assert_eq!(
            spec["hooks"]["createContainer"].as_array().unwrap().len(),
            1
        );
        assert_eq!(
            spec["hooks"]["createContainer"][0]["args"][2],
            "createContainer"
        );
        assert_eq!(spec["linux"]["devices"].as_array().unwrap().len(), 1);
        assert_eq!(spec["linux"]["devices"][0]["fileMode"], 0o666);
        assert_eq!(spec["linux"]["devices"][0]["minor"], 1);
        // The default deny stays first; the allows come after it.
        let rules = spec["linux"]["resources"]["devices"].as_array().unwrap();
        assert_eq!(rules[0]["allow"], false);
        assert_eq!(rules[1]["access"], "rw");
        assert_eq!(rules[1]["major"], 195);
        assert_eq!(spec["mounts"].as_array().unwrap().len(), 2);
        assert_eq!(spec["mounts"][0]["type"], "proc");
        assert_eq!(spec["mounts"][1]["source"], "/drv/usr/bin/nvidia-smi");
        assert_eq!(spec["mounts"][1]["options"], json!(["ro", "rbind"]));
    }
}
