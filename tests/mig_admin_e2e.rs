//! Making and removing MIG devices through nvhook-nvml, as nvhook-dra will at prepare and
//! unprepare time, on a simulated node whose mock NVML keeps what it made: a later inventory
//! and the hook's plan see the new MIG devices. Run as root after `cargo build --workspace`.

use nvhook::config::Config;
use nvhook::inventory::nvml_actions::{NvmlActionError, NvmlActions};
use nvhook::inventory::nvml_return;
use nvhook_test_support as support;
use serde_json::Value;
use std::path::Path;
use support::{SimNode, workspace_bin};

/// GPU 0 in MIG mode with no MIG device; GPU 1 with MIG off.
fn node() -> SimNode {
    SimNode::create_with(2, &["--mig", "0:0"])
}

fn config(node: &SimNode) -> Config {
    nvhook::config::from_file(&node.config()).expect("the node's config")
}

fn admin() -> NvmlActions {
    NvmlActions::at(workspace_bin("nvhook-nvml"))
}

/// `nvhook --config NODE ARGS...`, which must succeed; its stdout as JSON.
fn nvhook(node: &SimNode, args: &[&str]) -> Value {
    serde_json::from_str(&node.nvhook(args)).expect("nvhook prints JSON")
}

fn gpu0(node: &SimNode) -> Value {
    nvhook(node, &["info", "--format", "json"])["gpus"][0].clone()
}

/// (profile, GI profile id, placement start, GI id, CI id, gi cap minor, ci cap minor) of each
/// MIG device of GPU 0.
fn migs(gpu: &Value) -> Vec<(String, u64, u64, u64, u64, u64, u64)> {
    let n = |v: &Value| v.as_u64().expect("a number");
    gpu["mig_devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["profile"].as_str().unwrap().to_owned(),
                n(&m["gpu_instance_profile_id"]),
                n(&m["placement"]["start"]),
                n(&m["gpu_instance_id"]),
                n(&m["compute_instance_id"]),
                n(&m["gi_cap_minor"]),
                n(&m["ci_cap_minor"]),
            )
        })
        .collect()
}

fn cap_node(node: &SimNode, minor: u64) -> std::path::PathBuf {
    node.dev_root()
        .join(format!("dev/nvidia-caps/nvidia-cap{minor}"))
}

/// `nvhook plan` for a container that asks for `visible`: its JSON, as text.
fn plan(node: &SimNode, visible: &str) -> String {
    let bundle = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(bundle.path().join("rootfs/etc")).unwrap();
    let spec = serde_json::json!({
        "ociVersion": "1.0.2",
        "process": {"args": ["sh"], "cwd": "/", "env": [format!("NVIDIA_VISIBLE_DEVICES={visible}")]},
        "root": {"path": "rootfs"},
    });
    std::fs::write(bundle.path().join("config.json"), spec.to_string()).unwrap();
    let dir = bundle.path().to_str().unwrap();
    nvhook(node, &["plan", "--bundle", dir, "--format", "json"]).to_string()
}

#[test]
fn mig_devices_are_made_at_a_placement_seen_by_the_hook_and_removed() {
    let node = node();
    let config = config(&node);
    let gpu = gpu0(&node);
    let uuid = gpu["uuid"].as_str().unwrap().to_owned();

    let profiles = gpu["mig_profiles"].as_array().expect("profiles");
    let listed: Vec<(String, u64, Vec<u64>)> = profiles
        .iter()
        .map(|p| {
            let starts = p["placements"].as_array().unwrap();
            let starts = starts.iter().map(|s| s["start"].as_u64().unwrap());
            (
                p["name"].as_str().unwrap().to_owned(),
                p["id"].as_u64().unwrap(),
                starts.collect(),
            )
        })
        .collect();
    let want = |name: &str, id: u64, starts: &[u64]| (name.to_owned(), id, starts.to_vec());
    assert_eq!(
        listed,
        [
            want("1g.10gb", 19, &[0, 1, 2, 3, 4, 5, 6]),
            want("2g.20gb", 14, &[0, 2, 4]),
            want("3g.40gb", 9, &[0, 4]),
            want("4g.40gb", 5, &[0]),
            want("7g.80gb", 0, &[0]),
            want("1g.10gb+me", 20, &[0, 1, 2, 3, 4, 5, 6]),
            want("1g.20gb", 15, &[0, 2, 4, 6]),
        ]
    );
    let three_g = &profiles[2];
    assert_eq!(
        (
            &three_g["slices"],
            &three_g["memory_mib"],
            &three_g["multiprocessors"]
        ),
        (&Value::from(3), &Value::from(40_192), &Value::from(42))
    );
    assert!(gpu0(&node)["mig_devices"].as_array().unwrap().is_empty());

    let small = admin()
        .create_mig(&config, &uuid, 19, 3)
        .expect("1g.10gb at 3");
    let large = admin()
        .create_mig(&config, &uuid, 9, 4)
        .expect("3g.40gb at 4");
    assert_eq!((small.gpu_instance_id, small.compute_instance_id), (10, 0));
    assert_eq!((large.gpu_instance_id, large.compute_instance_id), (1, 0));

    let gpu = gpu0(&node);
    let made = migs(&gpu);
    assert_eq!(
        made,
        [
            ("3g.40gb".into(), 9, 4, 1, 0, 12, 13),
            ("1g.10gb".into(), 19, 3, 10, 0, 93, 94),
        ]
    );
    let uuids: Vec<&str> = gpu["mig_devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["uuid"].as_str().unwrap())
        .collect();
    assert_eq!(uuids, [large.uuid.as_str(), small.uuid.as_str()]);
    for minor in [12, 13, 93, 94] {
        assert!(cap_node(&node, minor).exists(), "nvidia-cap{minor}");
    }
    let planned = plan(&node, &small.uuid);
    for minor in [93, 94] {
        assert!(
            planned.contains(&format!("/dev/nvidia-caps/nvidia-cap{minor}")),
            "the plan for {} lacks nvidia-cap{minor}: {planned}",
            small.uuid
        );
    }

    let overlap = admin()
        .create_mig(&config, &uuid, 14, 2)
        .expect_err("2g.20gb at 2 overlaps slice 3");
    assert_eq!(
        overlap.nvml_code(),
        Some(nvml_return::INSUFFICIENT_RESOURCES),
        "{overlap}"
    );
    assert!(
        overlap.to_string().contains("INSUFFICIENT_RESOURCES"),
        "{overlap}"
    );
    assert_eq!(migs(&gpu0(&node)), made, "nothing left half made");

    admin()
        .destroy_mig(&config, &small.uuid)
        .expect("destroy the 1g.10gb");
    assert_eq!(migs(&gpu0(&node)), made[..1]);
    for minor in [93, 94] {
        assert!(!cap_node(&node, minor).exists(), "nvidia-cap{minor} stays");
    }
    let caps = node.root().join("proc/driver/nvidia/capabilities/gpu0/mig");
    assert!(!caps.join("gi10").exists());
    assert!(caps.join("gi1/ci0/access").is_file());
}

#[test]
fn a_gpu_with_mig_off_makes_none() {
    let node = node();
    let config = config(&node);
    let info = nvhook(&node, &["info", "--format", "json"]);
    let gpu1 = &info["gpus"][1];
    assert_eq!(gpu1["mig_enabled"], false);
    assert!(gpu1["mig_profiles"].as_array().unwrap().is_empty());
    let refused = admin()
        .create_mig(&config, gpu1["uuid"].as_str().unwrap(), 19, 0)
        .expect_err("MIG is off");
    assert_eq!(
        refused.nvml_code(),
        Some(nvml_return::NOT_SUPPORTED),
        "{refused}"
    );
    let unknown = admin()
        .destroy_mig(&config, "MIG-00000000-0000-0000-0000-000000000000")
        .expect_err("no such MIG device");
    assert!(matches!(unknown, NvmlActionError::Nvml(_)), "{unknown}");
    assert!(!Path::new(&node.root().join("proc/driver/nvidia/capabilities/gpu1")).exists());
}
