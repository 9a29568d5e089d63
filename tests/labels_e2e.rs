//! `nvhook labels` on a simulated GPU node (run as root, after `cargo build --workspace`): the
//! labels name the node's GPUs as its mock NVML reports them, the NFD file is written whole,
//! and a bad prefix changes nothing.

use nvhook_test_support as support;
use std::collections::BTreeMap;
use std::fs;
use support::{SimNode, run_nvhook};

fn labels(node: &SimNode, extra: &[&str]) -> std::process::Output {
    let config = node.config();
    let mut args = vec!["--config", config.to_str().unwrap(), "labels"];
    args.extend_from_slice(extra);
    run_nvhook(&args)
}

#[test]
fn labels_name_the_nodes_gpus_as_gpu_feature_discovery_does() {
    let node = SimNode::create_with(4, &["--mig", "1:2", "--mig", "2:7", "--mig", "3:2"]);
    let out = labels(&node, &["--format", "json", "--mig-strategy", "mixed"]);
    assert!(out.status.success(), "{out:?}\n{}", node.log());
    let got: BTreeMap<String, String> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got, node.expected_labels(true));
    assert_eq!(got["nvidia.com/mig-3g.40gb.count"], "4");
    assert_eq!(got["nvidia.com/mig-1g.10gb.count"], "7");

    // The default strategy is GPU feature discovery's, none: full GPUs only.
    let text = labels(&node, &["--prefix", "gpu.example.org"]);
    assert!(text.status.success(), "{text:?}");
    let lines: Vec<String> = node
        .expected_labels(false)
        .iter()
        .map(|(k, v)| format!("{}={v}", k.replace("nvidia.com/", "gpu.example.org/")))
        .collect();
    assert_eq!(
        String::from_utf8(text.stdout)
            .unwrap()
            .lines()
            .collect::<Vec<_>>(),
        lines
    );

    // The machine type is GPU feature discovery's gpu.machine: `unknown` without DMI (a VM, a
    // container without /sys/class/dmi). No label names the CPU architecture: on a mixed fleet
    // the kubelet's kubernetes.io/arch does.
    assert!(!got.keys().any(|k| k.contains("arch")), "{got:?}");
    fs::remove_file(node.root().join("sys/class/dmi/id/product_name")).unwrap();
    let out = labels(&node, &["--format", "json"]);
    let got: BTreeMap<String, String> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got["nvidia.com/gpu.machine"], "unknown");
    fs::write(
        node.root().join("sys/class/dmi/id/product_name"),
        "nvhook simulated GPU node\n",
    )
    .unwrap();

    // Split unlike, the node cannot be offered under the single strategy: one line, exit 1.
    let single = labels(&node, &["--mig-strategy", "single"]);
    assert_eq!(single.status.code(), Some(1));
    let err = String::from_utf8(single.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("--mig-strategy single: GPU 0 has MIG off"),
        "{err}"
    );

    // Asked three times: NVML once, its cached answer after.
    assert_eq!(node.nvml_inits(), 1, "{}", node.log());
}

#[test]
fn under_the_single_strategy_the_gpus_are_the_mig_devices() {
    let node = SimNode::create_with(2, &["--mig", "0:7", "--mig", "1:7"]);
    let out = labels(&node, &["--format", "json", "--mig-strategy", "single"]);
    assert!(out.status.success(), "{out:?}\n{}", node.log());
    let got: BTreeMap<String, String> = serde_json::from_slice(&out.stdout).unwrap();
    let mut want = node.expected_labels(false);
    want.remove("nvidia.com/gpu.memory");
    let topology = node.topology();
    let migs: Vec<&str> = topology["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["mig_devices"].as_array().unwrap())
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(migs.len(), 14);
    let product = migs[0].replace(" MIG ", "-MIG-").replace(' ', "-");
    want.insert("nvidia.com/gpu.product".into(), product);
    want.insert("nvidia.com/gpu.count".into(), migs.len().to_string());
    want.insert("nvidia.com/mig.strategy".into(), "single".into());
    assert_eq!(got, want);
}

#[test]
fn the_nfd_file_is_written_whole_and_a_bad_prefix_writes_nothing() {
    let node = SimNode::create(2);
    let file = node
        .root()
        .join("etc/kubernetes/node-feature-discovery/features.d/nvhook");
    let out = labels(
        &node,
        &["--format", "nfd", "--output", file.to_str().unwrap()],
    );
    assert!(out.status.success(), "{out:?}\n{}", node.log());
    assert!(out.stdout.is_empty());
    let written = fs::read_to_string(&file).unwrap();
    let mut lines = written.lines();
    assert!(lines.next().unwrap().starts_with('#'));
    let got: BTreeMap<String, String> = lines
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap();
            (k.to_owned(), v.to_owned())
        })
        .collect();
    assert_eq!(got, node.expected_labels(false));
    let dir: Vec<_> = fs::read_dir(file.parent().unwrap()).unwrap().collect();
    assert_eq!(dir.len(), 1, "no temporary file left: {dir:?}");

    let bad = labels(
        &node,
        &["--prefix", "NVIDIA.com", "--output", file.to_str().unwrap()],
    );
    // A usage error, as the README's exit statuses say.
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8(bad.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--prefix \"NVIDIA.com\""), "{err}");
    assert_eq!(fs::read_to_string(&file).unwrap(), written);
}
