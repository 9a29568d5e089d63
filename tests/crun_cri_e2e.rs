//! Kubernetes pods over the CRI on crun: Debian sid's containerd 2.1.9 with Debian sid's crun
//! 1.28 (`scripts/sid-runtimes.sh`'s wrapper) as the runtime of every handler, under cgroup v2.
//! crun refuses this machine's hybrid cgroup v1 layout ("cgroups in hybrid mode not supported,
//! drop all controllers from cgroupv2"), so containerd runs in a mount namespace of the test's
//! with the cgroup2 hierarchy mounted at /sys/fs/cgroup: the daemon, its shims, crun and
//! nvhook's hooks all see cgroup v2, and the pods' cgroup parent is a path of that hierarchy.
//! The CRI client and the NRI plugin stay on the host, talking to containerd's sockets under
//! the test's directory.
//!
//! That hierarchy holds no controller here (each is bound to a v1 hierarchy), and containerd
//! gives every pod sandbox `linux.resources.cpu.shares = 2` whatever the pod asks: crun turns it
//! into `cpu.weight` and refuses every pod with "controller `cpu` is not available under
//! /sys/fs/cgroup/PARENT/ID/cgroup.controllers" before any hook runs. That refusal is asserted
//! (nvhook's RuntimeClass and the NRI plugin alike), so the README's matrix stays true; should
//! crun get a cpu controller (a pure cgroup v2 host), that test fails and the rows below are to
//! be run with crun's cgroups.
//!
//! The rest runs crun with `--cgroup-manager=disabled`, crun's own way of running with no
//! cgroup (no limits, no device cgroup: a pod sees only the nodes the runtime makes): there,
//! nvhook's NRI plugin in each `nri-mode` (hook, cdi, cdi-devices, mounts) gives a pod exactly
//! the GPU the kubelet allocated, and libcuda loads; a pod allocated nothing gets nothing; a
//! GPU the node lacks is refused in nvhook's line; and nvhook's RuntimeClass handler
//! (nvhook-runtime with `runtimes = [crun]`) gives the GPU with no plugin. Once containerd
//! stops, nothing of the pods is left mounted on the host or in containerd's namespace, and no
//! pod cgroup holds a process. Run as root after `cargo build --workspace` (and
//! `scripts/sid-engines.sh`, `scripts/sid-runtimes.sh`): `cargo test --test crun_cri_e2e`.

use nvhook_test_support as support;
use support::{containerd2, cri};

use std::path::{Path, PathBuf};

use containerd2::{CriNode, DEFAULT_HANDLER};
use cri::ContainerRequest;
use nvhook::nri::driver_trees;
use support::engines::{nvhook_runtime_bin, sid_runtime_bin};
use support::{Output, gpucheck_args, host_mounts_referencing, write_script};

const GPUS: u32 = 4;
/// The GPU the kubelet allocates to the GPU pods here.
const ALLOCATED: u32 = 2;
const DEVICE_MOUNT_ROOT: &str = "/var/run/nvidia-container-devices";
/// nvhook's RuntimeClass handler, as `nvhook configure containerd` names it.
const HANDLER: &str = "nvidia";
/// gpucheck: every GPU and control node, the nvidia entries of /dev, libcuda through the
/// loader, and the pod's /sys/fs/cgroup (cgroup v2's files there say which layout crun saw),
/// then `extra`.
fn gpucheck(extra: &[&str]) -> Vec<String> {
    let mut args = vec!["--ls", "/dev", "--ls", "/sys/fs/cgroup"];
    args.extend(extra);
    gpucheck_args(GPUS, &args)
}

/// Exactly the allocated GPU, libcuda loaded, cgroup v2 at the pod's /sys/fs/cgroup.
#[track_caller]
fn assert_allocated_gpu_only(what: &str, output: &Output) {
    output.assert_allocated_gpu_only(what, GPUS, ALLOCATED);
    assert_cgroup_v2(what, output);
}

#[track_caller]
fn assert_no_gpu(what: &str, output: &Output) {
    output.assert_no_gpu_given(what);
    assert_cgroup_v2(what, output);
}

/// A cgroup v1 mount has no `cgroup.controllers`: seeing it shows that crun ran in the
/// namespace's cgroup v2 layout, not in the host's hybrid one (which it refuses).
#[track_caller]
fn assert_cgroup_v2(what: &str, output: &Output) {
    assert!(
        output.has_line("ls /sys/fs/cgroup cgroup.controllers"),
        "{what}: the pod's /sys/fs/cgroup is not cgroup v2\n{output}"
    );
}

/// How every handler runs crun.
#[derive(Clone, Copy, Debug)]
enum CrunCgroups {
    /// As it comes: a cgroup per container under the pod's parent.
    Managed,
    /// `--cgroup-manager=disabled`.
    Disabled,
}

/// containerd 2.1.9 on sid's crun, in a cgroup v2 mount namespace, with the gpucheck image.
type CrunNode = CriNode;

/// Every handler on sid's crun, run as `cgroups` says: the default one runs it directly, and
/// `handlers` run nvhook-runtime, whose config names it.
fn start_crun(name: &str, handlers: &[&str], cgroups: CrunCgroups) -> CrunNode {
    CriNode::start(name, GPUS, &[], true, |dir, node, setup| {
        let crun = match cgroups {
            CrunCgroups::Managed => sid_runtime_bin("crun"),
            CrunCgroups::Disabled => write_crun_without_cgroups(dir),
        };
        node.configure(&format!("runtimes = [{crun:?}]"));
        setup.runc = crun;
        for handler in handlers {
            setup
                .handlers
                .push(((*handler).into(), nvhook_runtime_bin().to_path_buf()));
        }
    })
}

/// A pod of gpucheck (with `extra` arguments) on `handler`, with `env` and `mounts`.
fn run(
    node: &mut CrunNode,
    handler: &str,
    env: &[(&str, &str)],
    mounts: &[(&str, &str)],
    extra: &[&str],
) -> Output {
    let request = ContainerRequest {
        env,
        mounts,
        ..Default::default()
    };
    node.run_gpucheck(handler, "crun", &gpucheck(extra), request)
        .output
}

/// The device plugin's volume-mount allocation of GPU ALLOCATED, on the default handler.
fn run_allocated(node: &mut CrunNode) -> Output {
    let mount_point = format!(
        "{DEVICE_MOUNT_ROOT}/{}",
        node.node.gpu_uuid(ALLOCATED as usize)
    );
    run(
        node,
        DEFAULT_HANDLER,
        &[],
        &[(&mount_point, "/dev/null")],
        &[],
    )
}

/// Writes `DIR/crun-without-cgroups`, sid's crun with `--cgroup-manager=disabled` (the runc
/// shim has no option that passes a runtime flags of a test's choosing); returns its path.
fn write_crun_without_cgroups(dir: &Path) -> PathBuf {
    let wrapper = dir.join("crun-without-cgroups");
    let script = format!(
        "#!/bin/sh\n\
         # sid's crun with no cgroup, written by nvhook's tests (crun_cri_e2e.rs).\n\
         exec {:?} --cgroup-manager=disabled \"$@\"\n",
        sid_runtime_bin("crun")
    );
    write_script(&wrapper, &script);
    wrapper
}

/// The NRI plugin in `mode` on crun with no cgroup: the device plugin's env, then its volume mounts, give the
/// pod exactly its GPU; a pod allocated nothing gets nothing.
fn nri_mode_on_crun(mode: &str, check: impl Fn(&CrunNode, &Output)) {
    let mut node = start_crun(&format!("crun-nri-{mode}"), &[], CrunCgroups::Disabled);
    node.connect_nri_plugin(mode);
    let uuid = node.node.gpu_uuid(ALLOCATED as usize);
    let output = run(
        &mut node,
        DEFAULT_HANDLER,
        &[("NVIDIA_VISIBLE_DEVICES", &uuid)],
        &[],
        &[],
    );
    assert_allocated_gpu_only(&format!("nri-mode = {mode}, envvar allocation"), &output);
    check(&node, &output);
    let output = run_allocated(&mut node);
    assert_allocated_gpu_only(
        &format!("nri-mode = {mode}, volume-mount allocation"),
        &output,
    );
    let output = run(&mut node, DEFAULT_HANDLER, &[], &[], &[]);
    assert_no_gpu(&format!("nri-mode = {mode}, no allocation"), &output);
    let log = node.node.log();
    assert!(log.contains("NRI: GPU container adjusted"), "{log}");
    node.stop();
}

/// `nri-mode = "hook"`: the plugin adds the nodes and nvhook's prestart hook, which crun runs.
#[test]
fn nri_mode_hook_on_crun_without_cgroups_gives_pods_their_allocated_gpu() {
    nri_mode_on_crun("hook", |node, _| {
        let log = node.node.log();
        assert!(log.contains("stage=Prestart"), "{log}");
    });
}

/// `nri-mode = "cdi"`: the plugin hands containerd every edit and nvhook's createRuntime
/// hook, which crun runs.
#[test]
fn nri_mode_cdi_on_crun_without_cgroups_gives_pods_their_allocated_gpu() {
    nri_mode_on_crun("cdi", |node, _| {
        let log = node.node.log();
        assert!(log.contains("stage=CreateRuntime"), "{log}");
    });
}

/// `nri-mode = "cdi-devices"`: the plugin names the GPU in nvhook's CDI spec, and containerd
/// injects it from the spec, its createRuntime hook included.
#[test]
fn nri_mode_cdi_devices_on_crun_without_cgroups_gives_pods_their_allocated_gpu() {
    nri_mode_on_crun("cdi-devices", |node, _| {
        let log = node.node.log();
        containerd2::assert_injected_from_the_cdi_spec(&log);
    });
}

/// `nri-mode = "mounts"`: crun makes the nodes and every bind mount, and no nvhook process
/// runs in the container's start; the loader finds libcuda in the multiarch directory.
#[test]
fn nri_mode_mounts_on_crun_without_cgroups_gives_pods_their_allocated_gpu() {
    nri_mode_on_crun("mounts", |node, output| {
        output.assert_lines(&[
            "dlopen libcuda.so.1 path /lib/x86_64-linux-gnu/libcuda.so.1",
            "cuInit 0",
        ]);
        let log = node.node.log();
        assert!(
            !log.contains("nvhook::hook"),
            "a hook ran in nri-mode = mounts:\n{log}"
        );
    });
}

/// `nri-mode = "mounts"` for a pod whose environment searches /usr/local/nvidia/lib64 and
/// bin, as a CUDA image's does, with containerd in another mount namespace than the plugin's
/// (here, the test's own): the plugin gathers the driver's files in containerd's namespace,
/// where crun binds each gathered directory in one mount and the loader finds libcuda. Nothing
/// of it is mounted in the plugin's own namespace, and nothing is left in containerd's once
/// the plugin stopped (`stop` checks both).
#[test]
fn nri_mode_mounts_on_crun_gathers_in_the_engines_mount_namespace() {
    let mut node = start_crun("crun-nri-mounts-apart", &[], CrunCgroups::Disabled);
    node.connect_nri_plugin("mounts");
    let uuid = node.node.gpu_uuid(ALLOCATED as usize);
    let env = [
        ("NVIDIA_VISIBLE_DEVICES", uuid.as_str()),
        (
            "LD_LIBRARY_PATH",
            "/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
        ),
        ("PATH", "/usr/local/nvidia/bin:/usr/bin:/bin"),
    ];
    let output = run(
        &mut node,
        DEFAULT_HANDLER,
        &env,
        &[],
        &["--exec", "/usr/local/nvidia/bin/nvidia-smi"],
    );
    assert_allocated_gpu_only("nri-mode = mounts, a CUDA image's environment", &output);
    output.assert_lines(&[
        "dlopen libcuda.so.1 path /usr/local/nvidia/lib64/libcuda.so.1",
        "cuInit 0",
        "exec /usr/local/nvidia/bin/nvidia-smi rc=0",
    ]);
    let log = node.node.log();
    assert!(
        log.contains("the engine is in another mount namespace: driver directories an image searches are gathered in the engine's"),
        "{log}"
    );
    assert!(log.contains("driver files gathered"), "{log}");
    let gathered = node.node.root().join("run").join(driver_trees::DIR_NAME);
    let gathered = gathered.display().to_string();
    let in_containerds = node.ns.as_ref().expect("containerd's namespace").table();
    assert!(
        in_containerds.iter().any(|l| l.contains(&gathered)),
        "{in_containerds:#?}"
    );
    let in_ours = host_mounts_referencing(&[node.node.root()]);
    assert!(
        !in_ours.iter().any(|l| l.contains(&gathered)),
        "{in_ours:#?}"
    );
    node.stop();
}

/// A GPU the node lacks is refused by the plugin before crun is asked to create anything: the
/// kubelet reads nvhook's one line in the engine's error, and the next pod is not affected.
#[test]
fn nri_on_crun_without_cgroups_refuses_a_gpu_the_node_lacks_in_one_line() {
    let mut node = start_crun("crun-nri-refusal", &[], CrunCgroups::Disabled);
    node.connect_nri_plugin("hook");
    let missing = format!("{DEVICE_MOUNT_ROOT}/7");
    let output = run(
        &mut node,
        DEFAULT_HANDLER,
        &[],
        &[(&missing, "/dev/null")],
        &[],
    );
    assert!(!output.status.success(), "{output}");
    let refusal = output
        .stderr
        .lines()
        .find(|l| l.contains("nvhook: "))
        .unwrap_or_else(|| panic!("no nvhook line in the engine's error\n{output}"));
    assert!(refusal.contains('7'), "{refusal}");
    let output = run_allocated(&mut node);
    assert_allocated_gpu_only("after a refused container", &output);
    node.stop();
}

/// nvhook's RuntimeClass on crun: the handler `nvidia` runs nvhook-runtime, which adds the
/// prestart hook and execs crun from its config's `runtimes`; the default handler runs crun
/// with no nvhook, and a pod there gets no GPU even when its env asks for one.
#[test]
fn nvhooks_runtime_class_runs_crun_without_cgroups() {
    let mut node = start_crun("crun-rc", &[HANDLER], CrunCgroups::Disabled);
    let uuid = node.node.gpu_uuid(ALLOCATED as usize);
    let env = [
        ("NVIDIA_VISIBLE_DEVICES", uuid.as_str()),
        ("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"),
    ];
    let output = run(
        &mut node,
        HANDLER,
        &env,
        &[],
        &["--exec", "/usr/bin/nvidia-smi"],
    );
    assert_allocated_gpu_only("RuntimeClass nvidia on crun", &output);
    output.assert_lines(&["cuInit 0", "exec /usr/bin/nvidia-smi rc=0"]);
    let log = node.node.log();
    assert!(log.contains("stage=Prestart"), "{log}");
    let output = run(&mut node, DEFAULT_HANDLER, &env, &[], &[]);
    assert_no_gpu("default handler, no nvhook", &output);
    node.stop();
}

/// The rows as they would run, crun with its cgroups: containerd's pod sandbox carries
/// `cpu.shares = 2`, which crun cannot write with no cpu controller in this machine's cgroup2,
/// so crun refuses the sandbox of every pod, on nvhook's RuntimeClass and on the default handler
/// with the NRI plugin connected alike, before any hook runs, and leaves nothing behind.
#[test]
fn crun_with_cgroups_refuses_every_pod_here_for_want_of_a_cpu_controller() {
    let mut node = start_crun("crun-cgroups", &[HANDLER], CrunCgroups::Managed);
    let controllers = node.controllers();
    assert!(
        !controllers.iter().any(|c| c == "cpu"),
        "this machine's cgroup2 has a cpu controller ({controllers:?}): run the tests above with crun's cgroups"
    );
    node.connect_nri_plugin("hook");
    let mount_point = format!(
        "{DEVICE_MOUNT_ROOT}/{}",
        node.node.gpu_uuid(ALLOCATED as usize)
    );
    let allocation = [(mount_point.as_str(), "/dev/null")];
    let refused_by = format!(
        "OCI runtime create failed: controller `cpu` is not available under /sys/fs/cgroup{}/",
        node.pods.cgroups.path()
    );
    for handler in [HANDLER, DEFAULT_HANDLER] {
        let request = ContainerRequest {
            mounts: &allocation,
            ..Default::default()
        };
        let message = node.sandbox_refusal(
            handler,
            &gpucheck(&[]),
            request,
            &format!("crun with its cgroups ran a pod on {handler}: run the tests above with them"),
        );
        assert!(
            message.contains("failed to start sandbox")
                && message.contains(&refused_by)
                && message.ends_with("/cgroup.controllers"),
            "{handler}: {message}"
        );
    }
    let log = node.node.log();
    assert!(
        !log.contains("stage=Prestart")
            && !log.contains("stage=CreateRuntime")
            && !log.contains("stage=CreateContainer"),
        "a hook ran:\n{log}"
    );
    node.stop();
}
