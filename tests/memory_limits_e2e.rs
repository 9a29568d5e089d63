//! Limiting a cgroup's GPU memory through nvhook-nvml (nvmlDeviceSetMemoryLimits_v1), on a
//! simulated node whose mock NVML keeps and records the limits: the exact GPU, cgroup and bytes
//! NVML was given, what it refuses, and drivers without the calls. Run as root after
//! `cargo build --workspace`.

use nvhook::config::Config;
use nvhook::inventory::nvml_actions::{NvmlActionError, NvmlActions};
use nvhook::inventory::{CgroupLimits, MEMORY_LIMIT_MAX, nvml_return};
use nvhook_test_support as support;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use support::{SimNode, workspace_bin};

const GIB: u64 = 1 << 30;

fn config(node: &SimNode) -> Config {
    nvhook::config::from_file(&node.config()).expect("the node's config")
}

fn actions() -> NvmlActions {
    NvmlActions::at(workspace_bin("nvhook-nvml"))
}

/// Whether `nvhook info` says the node's driver can limit GPU memory.
fn node_limits_memory(node: &SimNode) -> bool {
    let info: Value = serde_json::from_str(&node.nvhook(&["info", "--format", "json"])).unwrap();
    info["memory_limits"]
        .as_bool()
        .expect("info has memory_limits")
}

/// A cgroup v2 directory of its own: a child of the cgroup2 hierarchy mounted on a directory
/// of the test's (this machine's /sys/fs/cgroup may be cgroup v1), removed with the mount.
struct Cgroup {
    mount: tempfile::TempDir,
    dir: PathBuf,
}

impl Cgroup {
    fn new() -> Cgroup {
        let mount = tempfile::Builder::new()
            .prefix("nvhook-cgroup2-")
            .tempdir()
            .unwrap();
        nix::mount::mount(
            Some("none"),
            mount.path(),
            Some("cgroup2"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .expect("mount cgroup2 (as root)");
        let dir = mount
            .path()
            .join(format!("nvhook-memory-limits-{}", std::process::id()));
        std::fs::create_dir(&dir).expect("make a cgroup");
        assert!(dir.join("cgroup.procs").is_file(), "a cgroup v2 directory");
        Cgroup { mount, dir }
    }

    /// Removes the cgroup, as the runtime does when its container is gone.
    fn remove(&self) {
        std::fs::remove_dir(&self.dir).expect("remove the cgroup");
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
        let _ = nix::mount::umount2(self.mount.path(), nix::mount::MntFlags::MNT_DETACH);
    }
}

fn set(
    node: &SimNode,
    dir: &Path,
    soft: u64,
    hard: u64,
    gpus: &[&str],
) -> Result<(), NvmlActionError> {
    let gpus: Vec<String> = gpus.iter().map(|g| g.to_string()).collect();
    actions().set_memory_limits(&config(node), dir, soft, hard, &gpus)
}

fn get(node: &SimNode, dir: &Path, gpu: &str) -> Option<CgroupLimits> {
    actions()
        .memory_limits(&config(node), dir, gpu)
        .expect("get-memory-limits")
}

fn limits(soft_bytes: u64, hard_bytes: u64) -> Option<CgroupLimits> {
    Some(CgroupLimits {
        soft_bytes,
        hard_bytes,
        used_bytes: 0,
    })
}

/// The record lines after the first `skip`, less their process ids.
fn calls_after(node: &SimNode, skip: usize) -> Vec<Value> {
    let mut calls = node.memory_limit_calls().split_off(skip);
    for call in &mut calls {
        assert!(call["pid"].as_u64().is_some(), "{call}");
        call.as_object_mut().unwrap().remove("pid");
    }
    calls
}

fn call(gpu: &str, dir: &Path, soft: u64, hard: u64, result: u32) -> Value {
    json!({"gpu": gpu, "path": dir, "soft": soft, "hard": hard, "result": result})
}

#[test]
fn limits_are_set_per_gpu_for_the_cgroup_read_back_and_gone_with_it() {
    // GPU 2 in MIG mode with one MIG device.
    let node = SimNode::create_with(3, &["--mig", "2:1"]);
    assert!(node_limits_memory(&node));
    let cgroup = Cgroup::new();
    let dir = cgroup.dir.as_path();
    let (gpu0, gpu1) = (node.gpu_uuid(0), node.gpu_uuid(1));

    set(&node, dir, GIB, 4 * GIB, &[&gpu0, &gpu1]).expect("set limits");
    assert_eq!(
        calls_after(&node, 0),
        [
            call(&gpu0, dir, GIB, 4 * GIB, 0),
            call(&gpu1, dir, GIB, 4 * GIB, 0)
        ]
    );
    assert_eq!(get(&node, dir, &gpu0), limits(GIB, 4 * GIB));
    assert_eq!(get(&node, dir, &gpu1), limits(GIB, 4 * GIB));
    assert_eq!(
        get(&node, dir, &node.gpu_uuid(2)),
        None,
        "set on GPUs 0 and 1"
    );

    let soft_above_hard = set(&node, dir, 4 * GIB, GIB, &[&gpu0]).expect_err("soft > hard");
    assert_eq!(
        soft_above_hard.nvml_code(),
        Some(nvml_return::INVALID_ARGUMENT),
        "{soft_above_hard}"
    );
    assert!(!soft_above_hard.is_unsupported());
    let text = soft_above_hard.to_string();
    assert!(
        text.contains(&gpu0) && text.contains("NVML_ERROR_INVALID_ARGUMENT"),
        "{text}"
    );
    let above_memory = set(&node, dir, 0, 81 * GIB, &[&gpu1]).expect_err("above 80 GiB");
    assert_eq!(
        above_memory.nvml_code(),
        Some(nvml_return::INVALID_ARGUMENT)
    );
    assert_eq!(
        calls_after(&node, 2),
        [
            call(&gpu0, dir, 4 * GIB, GIB, nvml_return::INVALID_ARGUMENT),
            call(&gpu1, dir, 0, 81 * GIB, nvml_return::INVALID_ARGUMENT)
        ]
    );
    assert_eq!(get(&node, dir, &gpu0), limits(GIB, 4 * GIB), "kept");

    let mig = node.topology()["gpus"][2]["mig_devices"][0]["uuid"]
        .as_str()
        .unwrap()
        .to_owned();
    let on_mig = set(&node, dir, 0, 2 * GIB, &[&gpu0, &mig]).expect_err("a MIG device");
    assert_eq!(
        on_mig.nvml_code(),
        Some(nvml_return::NOT_SUPPORTED),
        "{on_mig}"
    );
    assert!(on_mig.is_unsupported());
    assert!(on_mig.to_string().contains("is a MIG device"), "{on_mig}");
    assert_eq!(
        node.memory_limit_calls().len(),
        4,
        "refused before any call"
    );
    assert_eq!(
        get(&node, dir, &gpu0),
        limits(GIB, 4 * GIB),
        "GPU 0 unchanged"
    );

    let gone = dir.join("no-such-cgroup");
    let no_cgroup = set(&node, &gone, 0, GIB, &[&gpu0]).expect_err("no such cgroup");
    assert_eq!(
        no_cgroup.nvml_code(),
        Some(nvml_return::OPERATING_SYSTEM),
        "{no_cgroup}"
    );

    set(&node, dir, 0, MEMORY_LIMIT_MAX, &[&gpu1]).expect("clear GPU 1's");
    assert_eq!(get(&node, dir, &gpu1), None, "cleared");
    assert_eq!(get(&node, dir, &gpu0), limits(GIB, 4 * GIB));

    cgroup.remove();
    assert_eq!(get(&node, dir, &gpu0), None, "gone with the cgroup");
}

#[test]
fn a_driver_without_the_calls_answers_function_not_found() {
    let node = SimNode::create_with(1, &["--no-memory-limits"]);
    assert!(!node_limits_memory(&node));
    let dir = tempfile::tempdir().unwrap();
    let gpu = node.gpu_uuid(0);
    let missing = set(&node, dir.path(), 0, GIB, &[&gpu]).expect_err("no such call");
    assert_eq!(
        missing.nvml_code(),
        Some(nvml_return::FUNCTION_NOT_FOUND),
        "{missing}"
    );
    assert!(missing.is_unsupported());
    assert!(
        missing.to_string().starts_with(
            "the driver has no nvmlDeviceSetMemoryLimits_v1 (driver too old: it came with CUDA 13.4's driver)"
        ),
        "{missing}"
    );
    let read = actions()
        .memory_limits(&config(&node), dir.path(), &gpu)
        .expect_err("no such call");
    assert_eq!(read.nvml_code(), Some(nvml_return::FUNCTION_NOT_FOUND));
    assert!(node.memory_limit_calls().is_empty());
}

#[test]
fn gpus_the_driver_cannot_limit_answer_not_supported() {
    let node = SimNode::create_with(1, &["--memory-limits-not-supported"]);
    assert!(node_limits_memory(&node), "the driver has the calls");
    let dir = tempfile::tempdir().unwrap();
    let gpu = node.gpu_uuid(0);
    let refused = set(&node, dir.path(), 0, GIB, &[&gpu]).expect_err("not supported");
    assert_eq!(
        refused.nvml_code(),
        Some(nvml_return::NOT_SUPPORTED),
        "{refused}"
    );
    assert!(refused.is_unsupported());
    assert!(
        refused.to_string().contains("NVML_ERROR_NOT_SUPPORTED"),
        "{refused}"
    );
    assert_eq!(
        calls_after(&node, 0),
        [call(&gpu, dir.path(), 0, GIB, nvml_return::NOT_SUPPORTED)]
    );
}
