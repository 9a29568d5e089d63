//! Per-container GPU memory limits (issue 40) through nvhook's NRI plugin, end to end: Debian
//! sid's containerd 2.1.9 and Debian 12's runc 1.1.5 run Kubernetes pods with real cgroups under
//! cgroup v2, the kubelet's CRI calls made by the test, and `nvhook nri` in each `nri-mode`
//! (hook: nvhook's prestart hook sets the limits; cdi and cdi-devices: the createRuntime hook
//! of nvhook's CDI edits; mounts: the createRuntime hook `nvhook hook memoryLimits UUID...`). The simulated
//! node's mock NVML records every `nvmlDeviceSetMemoryLimits_v1` call, so each test proves the
//! GPU, the bytes and the exact cgroup the driver was given: the one runc made for the pod's
//! container, `/sys/fs/cgroup/PARENT/CONTAINER_ID` (containerd's CRI with the cgroupfs driver),
//! never the hierarchy's root nor the pod sandbox's. A pod that asks for no limits makes no
//! call; a node whose driver lacks the call refuses the pod in nvhook's line unless
//! `gpu-memory-limits = "best-effort"`; once containerd stops, nothing is left mounted and no
//! pod cgroup holds a process.
//!
//! The limits are per cgroup v2 directory, so containerd runs as in `tests/crun_cri_e2e.rs`
//! ([`CriNode`]): in a mount namespace of the test's with the cgroup2 hierarchy at
//! /sys/fs/cgroup, this machine's own layout being hybrid v1.
//!
//! The runc wrapper, and why: containerd's CRI gives every pod sandbox
//! `linux.resources.cpu.shares = 2` whatever the pod asks, runc 1.1 turns it into `cpu.weight`,
//! and this machine's cgroup2 hierarchy has no cpu controller (every controller but hugetlb is
//! bound to a v1 hierarchy), so runc fails every pod's sandbox with "openat2
//! /sys/fs/cgroup/PARENT/ID/cpu.weight: no such file or directory" before any hook runs. The
//! default handler therefore runs `runc-without-cpu-resources`, a wrapper the test writes into
//! the engine's directory that deletes `linux.resources.cpu` from the bundle's config.json on
//! `create` and then execs Debian's runc with the same arguments (every other command passes
//! through untouched). Nothing else of the spec changes: runc still makes the container's own
//! cgroup and its device program, which is what the limits and nvhook's device rules need, and
//! nvhook never reads cpu resources. The wrapper is python3 (which `.ci/run` installs). That
//! this is needed is asserted (`runc_without_the_wrapper_refuses_every_pod_here_for_want_of_a_cpu_controller`):
//! the same pod on Debian's runc as it is fails with runc's cpu.weight error, and on a machine
//! whose cgroup2 has a cpu controller that test fails, saying to drop the wrapper.
//!
//! Run as root after `cargo build --workspace` and `scripts/sid-engines.sh`:
//! `cargo test --test nri_memory_limits_e2e`.

use nvhook_test_support as support;
use support::{containerd2, cri};

use std::path::{Path, PathBuf};

use containerd2::{CriNode, DEFAULT_HANDLER};
use cri::{ContainerRequest, PodRun};
use support::{gpucheck_args, require_program, write_script};

const GPUS: u32 = 4;
/// The GPU the kubelet allocates to the GPU pods here.
const ALLOCATED: u32 = 2;
const DEVICE_MOUNT_ROOT: &str = "/var/run/nvidia-container-devices";
const LIMITS: [(&str, &str); 2] = [
    ("NVIDIA_GPU_MEMORY_REQUEST", "512"),
    ("NVIDIA_GPU_MEMORY_LIMIT", "1024"),
];
const MIB: u64 = 1024 * 1024;
/// A handler on Debian's runc as it is, without the wrapper.
const RUNC_AS_IS: &str = "runc-as-is";

/// containerd 2.1.9 in a cgroup v2 mount namespace, its default handler on Debian's runc
/// through the wrapper, [`RUNC_AS_IS`] on Debian's runc directly; a node of [`GPUS`] GPUs made
/// with `simnode_flags`.
fn start(name: &str, simnode_flags: &[&str]) -> CriNode {
    CriNode::start(name, GPUS, simnode_flags, true, |dir, _, setup| {
        setup.handlers.push((RUNC_AS_IS.into(), setup.runc.clone()));
        setup.runc = write_runc_without_cpu_resources(dir, &setup.runc);
    })
}

/// Writes `DIR/runc-without-cpu-resources` (the header says why): on `create`, deletes
/// `linux.resources.cpu` from the bundle's config.json, then execs `runc` with the same
/// arguments. Returns its path.
fn write_runc_without_cpu_resources(dir: &Path, runc: &Path) -> PathBuf {
    let wrapper = dir.join("runc-without-cpu-resources");
    let script = format!(
        "#!{python}\n\
         # {runc} without the spec's linux.resources.cpu on create, written by nvhook's tests\n\
         # (nri_memory_limits_e2e.rs): this machine's cgroup2 has no cpu controller.\n\
         import json, os, sys\n\
         args = sys.argv[1:]\n\
         if 'create' in args:\n\
         \x20   rest = args[args.index('create') + 1:]\n\
         \x20   bundle = '.'\n\
         \x20   for i, arg in enumerate(rest[:-1]):\n\
         \x20       if arg in ('--bundle', '-b'):\n\
         \x20           bundle = rest[i + 1]\n\
         \x20   path = os.path.join(bundle, 'config.json')\n\
         \x20   with open(path) as f:\n\
         \x20       spec = json.load(f)\n\
         \x20   spec.get('linux', {{}}).get('resources', {{}}).pop('cpu', None)\n\
         \x20   with open(path, 'w') as f:\n\
         \x20       json.dump(spec, f)\n\
         os.execv({runc:?}, [{runc:?}] + args)\n",
        python = require_program("python3").display(),
        runc = runc.display().to_string(),
    );
    write_script(&wrapper, &script);
    wrapper
}

/// The device plugin's volume mount for GPU [`ALLOCATED`].
fn allocated_mount(node: &CriNode) -> String {
    format!(
        "{DEVICE_MOUNT_ROOT}/{}",
        node.node.gpu_uuid(ALLOCATED as usize)
    )
}

/// A pod of gpucheck on `handler` that the device plugin allocated GPU [`ALLOCATED`], with
/// `env`.
fn run_allocated(node: &mut CriNode, handler: &str, env: &[(&str, &str)]) -> PodRun {
    let mount_point = allocated_mount(node);
    let request = ContainerRequest {
        env,
        mounts: &[(&mount_point, "/dev/null")],
        ..Default::default()
    };
    let args = gpucheck_args(GPUS, &["--ls", "/dev"]);
    node.run_gpucheck(handler, "limits", &args, request)
}

/// The mock NVML recorded exactly one call, for GPU [`ALLOCATED`], 512 MiB
/// soft and 1024 MiB hard in bytes, answered SUCCESS, for the pod container's own cgroup
/// (`/sys/fs/cgroup/PARENT/CONTAINER_ID`).
#[track_caller]
fn assert_limits_set_once(node: &CriNode, run: &PodRun, what: &str) {
    let output = &run.output;
    let id = run
        .container_id
        .as_deref()
        .unwrap_or_else(|| panic!("{what}: containerd made no container\n{output}"));
    let cgroup = node.pods.cgroup_parent_dir().join(id);
    // Each record also names the process that made the call (nvhook's NVML helper).
    let calls: Vec<serde_json::Value> = node
        .node
        .memory_limit_calls()
        .into_iter()
        .map(|mut call| {
            call.as_object_mut().map(|c| c.remove("pid"));
            call
        })
        .collect();
    let expected = serde_json::json!({
        "gpu": node.node.gpu_uuid(ALLOCATED as usize),
        "path": cgroup.display().to_string(),
        "soft": 512 * MIB,
        "hard": 1024 * MIB,
        "result": 0,
    });
    assert_eq!(calls, [expected], "{what}: the mock NVML's calls\n{output}");
}

/// The NRI plugin in `mode`: a pod allocated GPU [`ALLOCATED`] that asks for limits gets that
/// GPU alone and one call for it and its own cgroup; the same pod without the variables gets
/// the GPU and no call; then containerd stops and nothing of the pods is left. `check` looks
/// at the node's log, as the first pod left it and what the second added: which of nvhook's
/// hooks ran.
fn limits_through_nri(mode: &str, check: impl Fn(&str, &str)) {
    let mut node = start(&format!("nri-limits-{mode}"), &[]);
    node.connect_nri_plugin(mode);
    let what = format!("nri-mode = {mode}, with limits");
    let run = run_allocated(&mut node, DEFAULT_HANDLER, &LIMITS);
    run.output.assert_allocated_gpu_only(&what, GPUS, ALLOCATED);
    assert_limits_set_once(&node, &run, &what);
    let log = node.node.log();
    assert!(
        log.contains("nvhook::hook::memory_limits: GPU memory limits set"),
        "{what}:\n{log}"
    );

    let what = format!("nri-mode = {mode}, no limits");
    let run = run_allocated(&mut node, DEFAULT_HANDLER, &[]);
    run.output.assert_allocated_gpu_only(&what, GPUS, ALLOCATED);
    assert_eq!(
        node.node.memory_limit_calls().len(),
        1,
        "{what}: a pod without limits made an NVML call\n{}",
        run.output
    );
    let added = node.node.log();
    check(&log, &added[log.len()..]);
    node.stop();
}

/// `nri-mode = "hook"`: the plugin adds nvhook's prestart hook, which sets the limits for the
/// cgroup of the container's process as the runtime's namespaces see it.
#[test]
fn nri_mode_hook_limits_the_pods_gpu_for_its_containers_cgroup() {
    limits_through_nri("hook", |log, _| {
        assert!(log.contains("stage=Prestart"), "{log}");
        assert!(!log.contains("stage=CreateRuntime"), "{log}");
    });
}

/// `nri-mode = "cdi"`: the plugin hands containerd every edit and nvhook's createRuntime
/// hook, which sets the limits for the cgroup of the container's process, from runc's side.
#[test]
fn nri_mode_cdi_limits_the_pods_gpu_for_its_containers_cgroup() {
    limits_through_nri("cdi", |log, _| {
        assert!(log.contains("stage=CreateRuntime"), "{log}");
        assert!(!log.contains("stage=Prestart"), "{log}");
    });
}

/// `nri-mode = "cdi-devices"`: containerd injects the GPU from nvhook's CDI spec, whose
/// createRuntime hook sets the limits.
#[test]
fn nri_mode_cdi_devices_limits_the_pods_gpu_for_its_containers_cgroup() {
    limits_through_nri("cdi-devices", |log, _| {
        containerd2::assert_injected_from_the_cdi_spec(log);
    });
}

/// `nri-mode = "mounts"`: runc makes the nodes and the mounts, and the only nvhook process is
/// the createRuntime hook (`nvhook hook memoryLimits UUID`) the plugin adds for a pod that
/// asks for limits: none of the hook stages runs, and a pod without limits runs no nvhook
/// process at all.
#[test]
fn nri_mode_mounts_limits_the_pods_gpu_for_its_containers_cgroup() {
    limits_through_nri("mounts", |log, unlimited| {
        assert!(!log.contains("hook finished"), "{log}");
        assert!(
            !unlimited.contains("nvhook::hook"),
            "a hook ran for a pod without limits:\n{unlimited}"
        );
    });
}

/// A driver without `nvmlDeviceSetMemoryLimits_v1` (simnode `--no-memory-limits`), in
/// `nri-mode = "cdi"`: under the default `gpu-memory-limits = "enforce"` nvhook's
/// createRuntime hook refuses the pod's start, and its one line reaches the kubelet in
/// StartContainer's error; under `"best-effort"` the same pod starts with its GPU, unlimited.
/// The createRuntime hook of the CDI edits is the route picked because it refuses from inside
/// runc's create, for a container that has a cgroup namespace of its own (containerd gives it
/// one): the route nvhook's CDI specs, DRA claims and NRI's `cdi` and `cdi-devices` modes
/// share; the prestart hook's refusal is `gpu_memory_limits_e2e`'s.
#[test]
fn a_driver_without_the_call_refuses_the_pod_unless_best_effort() {
    let mut node = start("nri-limits-refusal", &["--no-memory-limits"]);
    node.connect_nri_plugin("cdi");
    let run = run_allocated(&mut node, DEFAULT_HANDLER, &LIMITS);
    let output = &run.output;
    assert!(!output.status.success(), "started:\n{output}");
    assert!(
        output.stderr.starts_with("CRI StartContainer: "),
        "not refused at the start:\n{output}"
    );
    let line = output
        .hook_stderr()
        .unwrap_or_else(|| panic!("no hook error in the engine's error\n{output}"));
    assert_eq!(line.lines().count(), 1, "{line:?}\n{output}");
    // It names the cgroup the hook found for the container: its own, from the spec.
    let id = run.container_id.as_deref().expect("a container was made");
    let cgroup = node.pods.cgroup_parent_dir().join(id);
    let names = format!(
        "nvhook: cannot set GPU memory limits for cgroup {}: the driver has no nvmlDeviceSetMemoryLimits_v1",
        cgroup.display()
    );
    assert!(
        line.starts_with(&names) && line.contains("best-effort"),
        "{line}\n{output}"
    );

    node.node.set("gpu-memory-limits", "\"best-effort\"");
    let run = run_allocated(&mut node, DEFAULT_HANDLER, &LIMITS);
    run.output
        .assert_allocated_gpu_only("best-effort", GPUS, ALLOCATED);
    let log = node.node.log();
    assert!(log.contains("GPU memory limits not set"), "{log}");
    assert!(node.node.memory_limit_calls().is_empty(), "{log}");
    node.stop();
}

/// Why the default handler runs the wrapper: on Debian's runc as it is, the pod's sandbox
/// fails with runc's cpu.weight error (containerd's `cpu.shares = 2`, no cpu controller in
/// this machine's cgroup2) before any of nvhook's hooks runs, and leaves nothing behind.
#[test]
fn runc_without_the_wrapper_refuses_every_pod_here_for_want_of_a_cpu_controller() {
    let mut node = start("nri-limits-runc-as-is", &[]);
    let controllers = node.controllers();
    assert!(
        !controllers.iter().any(|c| c == "cpu"),
        "this machine's cgroup2 has a cpu controller ({controllers:?}): drop the runc wrapper of nri_memory_limits_e2e.rs and run its pods on Debian's runc as it is"
    );
    node.connect_nri_plugin("hook");
    let mount_point = allocated_mount(&node);
    let request = ContainerRequest {
        env: &LIMITS,
        mounts: &[(&mount_point, "/dev/null")],
        ..Default::default()
    };
    let message = node.sandbox_refusal(
        RUNC_AS_IS,
        &gpucheck_args(GPUS, &[]),
        request,
        "Debian's runc ran a pod here as it is: drop the runc wrapper of nri_memory_limits_e2e.rs",
    );
    let refused_by = format!("{}/", node.pods.cgroup_parent_dir().display());
    assert!(
        message.contains("failed to start sandbox")
            && message.contains(&refused_by)
            && message.ends_with("/cpu.weight: no such file or directory"),
        "{message}\n(containerd log)\n{}",
        node.containerd.log()
    );
    let log = node.node.log();
    assert!(!log.contains("stage="), "a hook ran:\n{log}");
    assert!(node.node.memory_limit_calls().is_empty(), "{log}");
    node.stop();
}
