//! Per-container GPU memory limits end to end (issue 40): real runc containers on a simulated
//! node whose mock NVML records every `nvmlDeviceSetMemoryLimits_v1` call, so that each test
//! proves the exact cgroup, bytes and GPUs the driver was given. cgroup v2 is a cgroup2 mount
//! over /sys/fs/cgroup in a private mount namespace (this machine's own hierarchy is v1).
//!
//! Podman 5 with a CDI spec runs sid's Podman, runc and crun (`scripts/sid-engines.sh`,
//! `scripts/sid-runtimes.sh`).
//!
//! Run as root after `cargo build --workspace`: `cargo test --test gpu_memory_limits_e2e`.

use nvhook_test_support as support;

use serde_json::{Value, json};
use std::path::Path;
use support::engines::{nvhook_runtime_bin, unique_name};
use support::podman::{CdiSpecFile, Podman};
use support::{
    Bundle, MountNs, Output, RuntimeEnv, SimNode, glibc_image, gpucheck_args, require_root,
    run_clean, run_container_with,
};

const GPUS: u32 = 2;
const LIMITS: [&str; 2] = [
    "NVIDIA_GPU_MEMORY_REQUEST=512",
    "NVIDIA_GPU_MEMORY_LIMIT=1024",
];
const MIB: u64 = 1024 * 1024;

/// gpucheck asking for `devices` with `env`, nvhook as its prestart hook.
fn bundle(node: &SimNode, devices: &str, env: &[&str]) -> Bundle {
    let args = gpucheck_args(GPUS, &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut bundle = Bundle::new(glibc_image(), &args);
    bundle.env(&format!("NVIDIA_VISIBLE_DEVICES={devices}"));
    for var in env {
        bundle.env(var);
    }
    bundle.prestart_hook(node);
    bundle
}

/// The GPUs (UUIDs) and (soft, hard) bytes of the node's recorded calls, each asserted to have
/// succeeded for the cgroup `cgroup` under /sys/fs/cgroup (runc makes `/<container id>` for a
/// bundle that names no cgroupsPath).
fn calls_for(node: &SimNode, cgroup: &str, output: &Output) -> Vec<(String, u64, u64)> {
    node.memory_limit_calls()
        .iter()
        .map(|call| {
            assert_eq!(call["result"], 0, "{call}\n{output}");
            let path = call["path"].as_str().expect("a path");
            assert_eq!(path, format!("/sys/fs/cgroup/{cgroup}"), "{call}\n{output}");
            (
                call["gpu"].as_str().expect("a GPU").to_string(),
                call["soft"].as_u64().unwrap(),
                call["hard"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The limits reach the driver once per GPU, in bytes, for the cgroup runc made for the
/// container, before it runs; a container that asks for none makes no call at all.
#[test]
fn the_prestart_hook_limits_each_gpu_for_the_containers_cgroup() {
    require_root();
    let node = SimNode::create(GPUS);
    let b = bundle(&node, "0,1", &LIMITS);
    let output = run_clean(&b, Some(&node), RuntimeEnv::CgroupV2);
    output.assert_success();
    output.assert_gpus(GPUS, &[0, 1]);
    assert_eq!(
        calls_for(&node, b.id(), &output),
        [
            (node.gpu_uuid(0), 512 * MIB, 1024 * MIB),
            (node.gpu_uuid(1), 512 * MIB, 1024 * MIB),
        ]
    );

    let plain = SimNode::create(GPUS);
    let b = bundle(&plain, "1", &[]);
    let output = run_clean(&b, Some(&plain), RuntimeEnv::CgroupV2);
    output.assert_success();
    assert!(
        plain.memory_limit_calls().is_empty(),
        "a container without limits made NVML calls:\n{output}"
    );
}

/// What the node cannot do refuses the start in one line under `enforce` (the default) and is
/// logged and skipped under `best-effort`: a driver without the call, a MIG device, cgroup v1.
/// A value that cannot be meant is refused whatever the policy.
#[test]
fn what_the_node_cannot_enforce_refuses_the_start_unless_best_effort() {
    require_root();
    let old_driver = SimNode::create_with(GPUS, &["--no-memory-limits"]);
    let mig = SimNode::create_with(GPUS, &["--mig", "1:1"]);
    let v2 = SimNode::create(GPUS);
    let cases = [
        (
            &old_driver,
            "0",
            RuntimeEnv::CgroupV2,
            "the driver has no nvmlDeviceSetMemoryLimits_v1",
        ),
        (
            &mig,
            "1:0",
            RuntimeEnv::CgroupV2,
            "cannot be set on MIG device MIG-",
        ),
        (
            &v2,
            "0",
            RuntimeEnv::CgroupV1,
            "GPU memory limits need cgroup v2",
        ),
    ];
    for (node, devices, env, needle) in cases {
        let b = bundle(node, devices, &LIMITS);
        let output = run_clean(&b, Some(node), env);
        assert!(!output.status.success(), "{needle}: started\n{output}");
        let line = output.hook_stderr().unwrap_or_default();
        assert!(
            line.contains(needle) && line.contains("best-effort"),
            "{needle}: {line}\n{output}"
        );
        node.set("gpu-memory-limits", "\"best-effort\"");
        let output = run_clean(&b, Some(node), env);
        output.assert_success();
        assert!(
            node.log().contains("GPU memory limits not set"),
            "{}",
            node.log()
        );
    }
    assert!(mig.memory_limit_calls().is_empty());

    let b = bundle(
        &v2,
        "0",
        &[
            "NVIDIA_GPU_MEMORY_REQUEST=2048",
            "NVIDIA_GPU_MEMORY_LIMIT=1024",
        ],
    );
    let output = run_clean(&b, Some(&v2), RuntimeEnv::CgroupV2);
    assert!(!output.status.success());
    let line = output.hook_stderr().unwrap_or_default();
    assert!(
        line.contains("request 2048 MiB is more than the limit 1024 MiB"),
        "{line}"
    );
}

/// nvhook-runtime: in `hook` mode the prestart hook sets the limits; in `cdi` mode, where runc
/// makes everything else, nvhook's createRuntime hook does, from runc's side, for the cgroup
/// of the container's process, whether or not the container has a cgroup namespace of its
/// own. Never the hierarchy's root.
#[test]
fn nvhook_runtime_sets_the_limits_in_both_modes() {
    require_root();
    for (mode, cgroupns) in [("hook", false), ("cdi", false), ("cdi", true)] {
        let node = SimNode::create(GPUS);
        node.set("runtime-mode", &format!("\"{mode}\""));
        let args = gpucheck_args(GPUS, &[]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut b = Bundle::new(glibc_image(), &args);
        b.env("NVIDIA_VISIBLE_DEVICES=1");
        for var in LIMITS {
            b.env(var);
        }
        let cgroup = match cgroupns {
            true => format!("nvhook-limits/{}", b.id()),
            false => b.id().to_string(),
        };
        if cgroupns {
            b.cgroup_namespace(&format!("/{cgroup}"));
        }
        let mut output = run_container_with(
            &b,
            RuntimeEnv::CgroupV2,
            nvhook_runtime_bin(),
            &[("NVHOOK_CONFIG", &node.config())],
        );
        output.hook_log = Some(node.log());
        output.assert_success();
        output.assert_gpus(GPUS, &[1]);
        assert_eq!(
            calls_for(&node, &cgroup, &output),
            [(node.gpu_uuid(1), 512 * MIB, 1024 * MIB)],
            "{mode}"
        );
        if mode == "cdi" {
            let text = std::fs::read_to_string(b.dir().join("config.json")).unwrap();
            let spec: Value = serde_json::from_str(&text).unwrap();
            // The spec's one hook sets them: no memoryLimits hook of its own.
            let hooks = spec["hooks"]["createRuntime"].as_array().expect("a hook");
            assert_eq!(hooks.len(), 1, "{text}");
            assert_eq!(hooks[0]["args"][4], "createRuntime", "{text}");
            assert!(
                node.log().contains("GPU memory limits set"),
                "{}",
                node.log()
            );
        }
    }
}

/// Debian sid's Podman 5 with nvhook's CDI spec under cgroup v2 (a mount namespace's cgroup2,
/// which has no pids controller here, so Podman's default pids limit is off), on sid's runc
/// and on sid's crun: the spec's createRuntime hook sets the limits for the container's
/// cgroup, which Podman's cgroupfs manager makes as `<cgroup parent>/libpod-<container id>`.
/// Podman gives the container a cgroup namespace of its own on v2; the hook, run from the
/// runtime's side, takes the cgroup of the container's process.
#[test]
fn podman_5_with_nvhooks_cdi_spec_sets_the_limits() {
    require_root();
    for runtime in ["runc", "crun"] {
        let node = SimNode::create(GPUS);
        let spec = CdiSpecFile::new("yaml");
        node.generate_cdi_spec(spec.path());
        let ns = MountNs::new(RuntimeEnv::CgroupV2);
        let podman = Podman::sid().within(&ns).running(Path::new(runtime));
        let image = format!("localhost/{}:latest", unique_name("nvhook-limits"));
        podman.import(glibc_image().rootfs(), &image);
        let mut flags = vec!["--device", "nvidia.com/gpu=1", "--pids-limit", "0"];
        for var in LIMITS {
            flags.extend(["--env", var]);
        }
        let args = gpucheck_args(GPUS, &[]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut output = podman.run(&flags, &image, &args);
        output.hook_log = Some(node.log());
        output.assert_success();
        output.assert_gpus(GPUS, &[1]);
        // `--rm` takes a cidfile with the container; Podman's event log keeps the id.
        let events = podman
            .command()
            .args(["events", "--stream=false", "--filter", "event=start"])
            .args(["--format", "{{.ID}}"])
            .output()
            .expect("run podman events");
        let id = String::from_utf8_lossy(&events.stdout).trim().to_string();
        assert_eq!(id.len(), 64, "one started container: {events:?}");
        let cgroup = format!("{}/libpod-{id}", podman.cgroup_parent());
        assert_eq!(
            calls_for(&node, &cgroup, &output),
            [(node.gpu_uuid(1), 512 * MIB, 1024 * MIB)],
            "{runtime}"
        );
    }
}

/// NVIDIA's createRuntime hook as its CDI specs carry it for each GPU
/// (`nvidia-cdi-hook apply-cuda-memory-limits --driver-root / --gpu-id UUID`), answered by
/// nvhook under NVIDIA's name: the limits are set for the container's cgroup.
#[test]
fn nvidias_apply_cuda_memory_limits_hook_sets_them() {
    require_root();
    let node = SimNode::create(GPUS);
    let mut b = Bundle::new(glibc_image(), &["/gpucheck"]);
    for var in LIMITS {
        b.env(var);
    }
    let uuid = node.gpu_uuid(0);
    b.raw_hook(
        "createRuntime",
        json!({
            "path": node.hook(),
            "args": [
                "nvidia-cdi-hook", "apply-cuda-memory-limits",
                "--driver-root", "/", "--gpu-id", uuid,
            ],
            "env": [format!("NVHOOK_CONFIG={}", node.config().display())],
        }),
    );
    let output = run_clean(&b, Some(&node), RuntimeEnv::CgroupV2);
    output.assert_success();
    assert_eq!(
        calls_for(&node, b.id(), &output),
        [(uuid, 512 * MIB, 1024 * MIB)]
    );
}
