//! nvhook under the OCI runtimes beside Debian 12's runc 1.1 (issues 25 §4 and 38): youki 0.7.0
//! from crates.io (`scripts/youki.sh`), and Debian sid's runc 1.3 and crun 1.28, run from a sid
//! root by the wrappers of `scripts/sid-runtimes.sh` (`scripts/test.sh` runs both scripts).
//! On the simulated node, for each runtime and each cgroup version it supports here: the
//! prestart hook, nvhook-runtime with `runtimes = [RUNTIME]`, and a container in a user
//! namespace; and Podman with nvhook's CDI spec (Debian 12's Podman 4.3 with youki, sid's
//! Podman 5 with sid's runc 1.3). Each container sees exactly GPU 1 and loads libcuda; a GPU
//! the node lacks is refused in nvhook's line (under crun, which sends hooks' output to
//! /dev/null: in nvhook's log, or where `run.oci.hooks.stderr` says). crun refuses this
//! machine's cgroup v1 hierarchy (hybrid: cgroup2 holds a controller) before any hook runs:
//! that row is asserted as crun's refusal, so the README's matrix stays true. The runtimes run
//! `--detach` and the container's output is read to its end (youki's foreground `run` can miss
//! the exit of a container that ends at once). Run as root after `cargo build --workspace`.

use nvhook_test_support as support;

use std::path::{Path, PathBuf};
use support::engines::{nvhook_runtime_bin, sid_runtime_bin, unique_name, youki_bin};
use support::hook_log::{hook_runs, prepared_steps};
use support::podman::{CdiSpecFile, Podman};
use support::{
    Bundle, MountNs, Output, RuntimeEnv, SimNode, compute_bundle, glibc_image, gpucheck_args,
    host_mounts_referencing, host_snapshot, require_root, run_detached_with,
};

const GPUS: u32 = 4;
const LIBCUDA: &str = "/usr/lib/x86_64-linux-gnu/libcuda.so.1";
/// The annotation that names a file for crun to give its hooks as stderr.
const CRUN_HOOKS_STDERR: &str = "run.oci.hooks.stderr";

#[derive(Debug, Clone, Copy)]
enum Runtime {
    Youki,
    SidRunc,
    SidCrun,
}

impl Runtime {
    fn bin(self) -> PathBuf {
        match self {
            Runtime::Youki => youki_bin().to_path_buf(),
            Runtime::SidRunc => sid_runtime_bin("runc"),
            Runtime::SidCrun => sid_runtime_bin("crun"),
        }
    }
}

fn gpu_bundle(visible: &str) -> Bundle {
    compute_bundle(GPUS, visible, &["--write", LIBCUDA])
}

#[track_caller]
fn assert_gpu_1_only(output: &Output) {
    output.assert_only_gpu_with_read_only_driver(GPUS, 1, LIBCUDA);
}

#[track_caller]
fn assert_nothing_left(node: &SimNode, bundle: &Bundle) {
    let leaked = host_mounts_referencing(&[node.root(), bundle.dir()]);
    assert!(leaked.is_empty(), "mounts left on the host: {leaked:#?}");
}

fn the_hook_on(runtime: Runtime, env: RuntimeEnv) {
    require_root();
    let node = SimNode::create(GPUS);
    let mut bundle = gpu_bundle("1");
    bundle.prestart_hook(&node);
    let host = host_snapshot();
    let mut output = run_detached_with(&bundle, env, &runtime.bin(), &[]);
    output.hook_log = Some(node.log());
    assert_gpu_1_only(&output);
    assert_nothing_left(&node, &bundle);
    let diff = host.diff(&host_snapshot());
    assert!(diff.is_empty(), "the host changed: {diff:#?}");

    // A GPU the node lacks: the runtime starts nothing, and the user reads nvhook's one line.
    let refused = |annotate: bool| {
        let mut bundle = gpu_bundle("9");
        bundle.prestart_hook(&node);
        if annotate {
            bundle.annotation(CRUN_HOOKS_STDERR, "/dev/stderr");
        }
        let output = run_detached_with(&bundle, env, &runtime.bin(), &[]);
        assert!(!output.status.success(), "{output}");
        assert!(!output.has_line("cuInit 0"), "{output}");
        output
    };
    const LINE: &str = "nvhook: NVIDIA_VISIBLE_DEVICES=9: no such GPU (this node has 0-3)";
    let output = refused(false);
    match runtime {
        // runc and youki pass a failing hook's stderr on.
        Runtime::Youki | Runtime::SidRunc => assert!(output.stderr.contains(LINE), "{output}"),
        // crun sends hooks' output to /dev/null: its own line names the hook, nvhook's log
        // holds nvhook's, and the container's annotation gets it onto crun's stderr.
        Runtime::SidCrun => {
            assert!(
                output.stderr.contains("error executing hook") && !output.stderr.contains(LINE),
                "{output}"
            );
            assert!(
                node.log().contains(&LINE["nvhook: ".len()..]),
                "{}",
                node.log()
            );
            let output = refused(true);
            assert!(output.stderr.contains(LINE), "{output}");
        }
    }
}

fn nvhook_runtime_on(runtime: Runtime, env: RuntimeEnv) {
    require_root();
    let node = SimNode::create(GPUS);
    node.configure(&format!("runtimes = [{:?}]", runtime.bin()));
    let bundle = gpu_bundle("1");
    let config = node.config();
    let mut output = run_detached_with(
        &bundle,
        env,
        nvhook_runtime_bin(),
        &[("NVHOOK_CONFIG", &config)],
    );
    output.hook_log = Some(node.log());
    assert_gpu_1_only(&output);
    assert_nothing_left(&node, &bundle);
    // Its create's time, step by step, in its own line: what an operator reads to see where
    // a GPU container's create goes, never mistaken for a hook's steps.
    let log = node.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("GPU container prepared"))
        .collect();
    assert_eq!(lines.len(), 1, "{log}");
    let steps: Vec<&str> = prepared_steps(lines[0]).iter().map(|(s, _)| *s).collect();
    assert_eq!(
        steps,
        [
            "config",
            "request",
            "inventory",
            "image",
            "plan",
            "dev-char",
            "edit",
            "write"
        ],
        "{log}"
    );
    assert!(
        hook_runs(&log).iter().all(|run| {
            run.steps
                .iter()
                .all(|(step, _)| !["config", "dev-char", "write"].contains(&step.as_str()))
        }),
        "{log}"
    );
}

/// A user namespace (ids 0..65536 are the host's 100000..): the hook binds the host's nodes
/// and writes as the container's root.
fn a_user_namespaced_container_on(runtime: Runtime, env: RuntimeEnv) {
    require_root();
    let node = SimNode::create(GPUS);
    let mut bundle = gpu_bundle("1");
    bundle.user_namespace(100_000, 65_536).prestart_hook(&node);
    let mut output = run_detached_with(&bundle, env, &runtime.bin(), &[]);
    output.hook_log = Some(node.log());
    assert_gpu_1_only(&output);
    let cache = std::fs::metadata(bundle.rootfs().join("etc/ld.so.cache")).expect("the cache");
    use std::os::unix::fs::MetadataExt;
    assert_eq!((cache.uid(), cache.gid()), (100_000, 100_000));
    assert_nothing_left(&node, &bundle);
}

#[test]
fn the_prestart_hook_on_youki_cgroup_v1() {
    the_hook_on(Runtime::Youki, RuntimeEnv::CgroupV1);
}

#[test]
fn the_prestart_hook_on_youki_cgroup_v2() {
    the_hook_on(Runtime::Youki, RuntimeEnv::CgroupV2);
}

#[test]
fn nvhook_runtime_runs_youki_cgroup_v1() {
    nvhook_runtime_on(Runtime::Youki, RuntimeEnv::CgroupV1);
}

#[test]
fn nvhook_runtime_runs_youki_cgroup_v2() {
    nvhook_runtime_on(Runtime::Youki, RuntimeEnv::CgroupV2);
}

#[test]
fn the_hook_gives_a_user_namespaced_youki_container_its_gpu() {
    a_user_namespaced_container_on(Runtime::Youki, RuntimeEnv::CgroupV1);
}

#[test]
fn the_prestart_hook_on_sid_runc_cgroup_v1() {
    the_hook_on(Runtime::SidRunc, RuntimeEnv::CgroupV1);
}

#[test]
fn the_prestart_hook_on_sid_runc_cgroup_v2() {
    the_hook_on(Runtime::SidRunc, RuntimeEnv::CgroupV2);
}

#[test]
fn nvhook_runtime_runs_sid_runc_cgroup_v1() {
    nvhook_runtime_on(Runtime::SidRunc, RuntimeEnv::CgroupV1);
}

#[test]
fn nvhook_runtime_runs_sid_runc_cgroup_v2() {
    nvhook_runtime_on(Runtime::SidRunc, RuntimeEnv::CgroupV2);
}

#[test]
fn the_hook_gives_a_user_namespaced_sid_runc_container_its_gpu() {
    a_user_namespaced_container_on(Runtime::SidRunc, RuntimeEnv::CgroupV2);
}

#[test]
fn the_prestart_hook_on_sid_crun_cgroup_v2() {
    the_hook_on(Runtime::SidCrun, RuntimeEnv::CgroupV2);
}

#[test]
fn nvhook_runtime_runs_sid_crun_cgroup_v2() {
    nvhook_runtime_on(Runtime::SidCrun, RuntimeEnv::CgroupV2);
}

#[test]
fn the_hook_gives_a_user_namespaced_sid_crun_container_its_gpu() {
    a_user_namespaced_container_on(Runtime::SidCrun, RuntimeEnv::CgroupV2);
}

/// crun (sid's 1.28 as Debian 12's 1.8) refuses this machine's cgroup v1 hierarchy, whose
/// cgroup2 part holds a controller, before it runs any hook: the one row of the matrix that
/// cannot run here. Should crun start to accept it, this fails and the row moves to the others.
#[test]
fn sid_crun_refuses_this_machines_hybrid_cgroup_v1_before_any_hook() {
    require_root();
    let node = SimNode::create(GPUS);
    let mut bundle = gpu_bundle("1");
    bundle.prestart_hook(&node);
    let output = run_detached_with(&bundle, RuntimeEnv::CgroupV1, &Runtime::SidCrun.bin(), &[]);
    assert!(!output.status.success(), "{output}");
    assert!(
        output
            .stderr
            .contains("cgroups in hybrid mode not supported, drop all controllers from cgroupv2"),
        "{output}"
    );
    assert!(!node.log().contains("prestart"), "{}", node.log());
}

/// Podman with `--runtime` youki and nvhook's generated CDI spec: youki makes the nodes and
/// mounts the spec lists, and runs nvhook's createRuntime hook for the links and the cache.
#[test]
fn podman_runs_a_cdi_device_on_youki() {
    require_root();
    let node = SimNode::create(GPUS);
    let spec = CdiSpecFile::new("yaml");
    node.generate_cdi_spec(spec.path());
    let podman = Podman::with_runtime(youki_bin());
    let image = format!("localhost/{}:latest", unique_name("nvhook-youki"));
    podman.import(glibc_image().rootfs(), &image);
    let args = gpucheck_args(GPUS, &["--write", LIBCUDA]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut output = podman.run(&["--device", "nvidia.com/gpu=1"], &image, &args);
    output.hook_log = Some(node.log());
    assert_gpu_1_only(&output);
}

/// Debian sid's Podman 5 and nvhook's generated CDI spec on `runtime_version`'s runtime
/// (the start of what `podman info` says of it), with `flags` added to `podman run`: the
/// runtime makes the nodes and mounts the spec lists, and runs nvhook's createRuntime hook
/// for the links and the cache.
fn podman_5_runs_a_cdi_device(podman: Podman, runtime_version: &str, flags: &[&str]) {
    let node = SimNode::create(GPUS);
    let spec = CdiSpecFile::new("yaml");
    node.generate_cdi_spec(spec.path());
    let info = podman
        .command()
        .args([
            "info",
            "--format",
            "{{.Version.Version}} {{.Host.OCIRuntime.Version}}",
        ])
        .output()
        .expect("run podman info");
    let info = String::from_utf8_lossy(&info.stdout);
    assert!(
        info.starts_with("5.") && info.contains(runtime_version),
        "not Podman 5 with {runtime_version}: {info}"
    );
    let image = format!("localhost/{}:latest", unique_name("nvhook-podman5"));
    podman.import(glibc_image().rootfs(), &image);
    let args = gpucheck_args(GPUS, &["--write", LIBCUDA]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut run_flags = vec!["--device", "nvidia.com/gpu=1"];
    run_flags.extend(flags);
    let mut output = podman.run(&run_flags, &image, &args);
    output.hook_log = Some(node.log());
    assert_gpu_1_only(&output);
    assert!(node.log().contains("stage=CreateRuntime"), "{}", node.log());
}

#[test]
fn podman_5_runs_a_cdi_device_on_sid_runc() {
    require_root();
    podman_5_runs_a_cdi_device(Podman::sid(), "runc version 1.3.", &[]);
}

/// crun under cgroup v2: a cgroup2 hierarchy mounted in a mount namespace of the test's,
/// where no pids controller is delegated, so Podman's default pids limit is turned off.
#[test]
fn podman_5_runs_a_cdi_device_on_sid_crun_cgroup_v2() {
    require_root();
    let ns = MountNs::new(RuntimeEnv::CgroupV2);
    let podman = Podman::sid().within(&ns).running(Path::new("crun"));
    podman_5_runs_a_cdi_device(podman, "crun version 1.28", &["--pids-limit", "0"]);
}
