//! nvhook on an emulated arm64 node (issue 29): the aarch64 nvhook, nvhook-runtime and
//! nvhook-nvml that `scripts/build-arm64.sh` cross-builds, on an arm64 simulated node (the
//! driver's libraries and tools aarch64 ELF, an aarch64 mock NVML, a host loader cache written by
//! Debian's arm64 ldconfig), with an arm64 glibc image, run by this machine's own runc and
//! Podman. qemu-aarch64 runs every aarch64 program (binfmt_misc): the hook runc execs, the NVML
//! helper the hook starts, the programs in the container. See support/src/arm64.rs.

use nvhook_test_support as support;

use std::path::Path;
use std::process::Command;

use support::arm64::{Arm64, LIB_DIR};
use support::podman::{CdiSpecFile, Podman};
use support::{
    Bundle, MountNs, Output, RuntimeEnv, SimNode, gpucheck_args, host_mounts_referencing,
    host_snapshot, require_program, require_root, run_in_ns, stdout_of, table_diff,
};

const GPUS: u32 = 4;

/// Reads of the container that only an arm64 GPU container passes: its GPUs, libcuda loaded
/// and initialised (the fake driver's aarch64 libcuda), the driver's files read-only.
fn checks(extra: &[&str]) -> Vec<String> {
    let libcuda = format!("{LIB_DIR}/libcuda.so.1");
    let mut more = vec!["--write", &libcuda, "--write", "/usr/bin/nvidia-smi"];
    more.extend(extra);
    gpucheck_args(GPUS, &more)
}

#[track_caller]
fn assert_gpu_usable(output: &Output, gpu: u32) {
    output.assert_success();
    output.assert_gpus(GPUS, &[gpu]);
    output.assert_control_nodes_allowed();
    output.assert_lines(&[
        "dlopen libcuda.so.1 ok",
        &format!("dlopen libcuda.so.1 path {LIB_DIR}/libcuda.so.1"),
        "cuInit 0",
        &format!("write {LIB_DIR}/libcuda.so.1 EROFS"),
        "write /usr/bin/nvidia-smi EROFS",
    ]);
}

/// The container's loader cache, as the arm64 ldconfig lists it: nvhook wrote aarch64 entries
/// (`libc6,AArch64`) for the driver's libraries beside the image's own.
#[track_caller]
fn assert_cache_has_aarch64_libcuda(arm64: &Arm64, rootfs: &Path) {
    let listing = arm64.ldconfig_listing(&rootfs.join("etc/ld.so.cache"));
    for soname in ["libcuda.so.1", "libnvidia-ml.so.1", "libc.so.6"] {
        let entry = format!("\t{soname} (libc6,AArch64) => {LIB_DIR}/{soname}");
        assert!(
            listing.lines().any(|l| l == entry),
            "no {entry:?} in the container's cache:\n{listing}"
        );
    }
}

/// Runs `bundle` in `ns` with `runtime`, and checks that nothing of the namespace's mount table
/// or of the host's files changed, and that no driver file stays mounted.
fn run_leaving_nothing(
    bundle: &Bundle,
    ns: &MountNs,
    node: &SimNode,
    runtime: &Path,
    vars: &[(&str, &str)],
) -> Output {
    let (table, host) = (ns.table(), host_snapshot());
    let mut output = run_in_ns(bundle, ns, runtime, vars);
    output.hook_log = Some(node.log());
    let changed = table_diff(&table, &ns.table());
    assert!(
        changed.is_empty(),
        "the mount table changed: {changed:#?}\n{output}"
    );
    let diff = host.diff(&host_snapshot());
    assert!(diff.is_empty(), "the host changed: {diff:#?}");
    let leaked = host_mounts_referencing(&[node.root()]);
    assert!(leaked.is_empty(), "driver files still mounted: {leaked:#?}");
    output
}

fn gpucheck_bundle(arm64: &Arm64, extra: &[&str]) -> Bundle {
    let args = checks(extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Bundle::new(arm64.image(), &args)
}

/// Under cgroup v1 the hook writes the container's device rules into its cgroup's files.
#[test]
fn the_aarch64_hook_gives_an_arm64_container_exactly_its_gpu() {
    require_root();
    let arm64 = Arm64::require();
    let node = arm64.node(GPUS, &["--imex-channels", "2"]);
    let ns = arm64.host_ns(RuntimeEnv::CgroupV1);
    let runc = require_program("runc");

    let mut bundle = gpucheck_bundle(arm64, &[]);
    bundle
        .env("NVIDIA_VISIBLE_DEVICES=2")
        .env("NVIDIA_DRIVER_CAPABILITIES=compute,utility")
        .prestart_hook(&node);
    let output = run_leaving_nothing(&bundle, &ns, &node, &runc, &[]);
    assert_gpu_usable(&output, 2);
    assert_cache_has_aarch64_libcuda(arm64, bundle.rootfs());

    // IMEX channels as on x86_64: the channel asked for, no other.
    let channels = "/dev/nvidia-caps-imex-channels";
    let mut bundle = gpucheck_bundle(arm64, &["--ls", channels]);
    bundle
        .env("NVIDIA_VISIBLE_DEVICES=0")
        .env("NVIDIA_IMEX_CHANNELS=1")
        .prestart_hook(&node);
    let output = run_leaving_nothing(&bundle, &ns, &node, &runc, &[]);
    assert_gpu_usable(&output, 0);
    output.assert_lines(&[&format!("ls {channels} channel1")]);
    assert!(
        !output.stdout.contains("channel0"),
        "channel 0 was not asked for:\n{output}"
    );

    // A GPU the node does not have: the start fails with the hook's one line.
    let mut bundle = gpucheck_bundle(arm64, &[]);
    bundle.env("NVIDIA_VISIBLE_DEVICES=7").prestart_hook(&node);
    let output = run_leaving_nothing(&bundle, &ns, &node, &runc, &[]);
    output.assert_refused_by_hook(
        "nvhook: NVIDIA_VISIBLE_DEVICES=7: no such GPU (this node has 0-3)",
    );
}

/// Under cgroup v2 the hook replaces the container's device program with the bpf system call,
/// which qemu-user does not translate (qemu 11.1 included): there the start fails with the
/// hook's one line naming bpf and leaves nothing behind. A qemu that learns bpf makes it pass
/// as under v1. A real arm64 host has bpf; the runtime route (below) needs none.
#[test]
fn the_aarch64_hook_under_cgroup_v2_gives_the_gpu_or_one_line_naming_bpf() {
    require_root();
    let arm64 = Arm64::require();
    let node = arm64.node(GPUS, &[]);
    let ns = arm64.host_ns(RuntimeEnv::CgroupV2);
    let mut bundle = gpucheck_bundle(arm64, &[]);
    bundle
        .env("NVIDIA_VISIBLE_DEVICES=2")
        .env("NVIDIA_DRIVER_CAPABILITIES=compute,utility")
        .prestart_hook(&node);
    let output = run_leaving_nothing(&bundle, &ns, &node, &require_program("runc"), &[]);
    if output.status.success() {
        assert_gpu_usable(&output, 2);
    } else {
        output.assert_refused_by_hook(
            "nvhook: bpf(BPF_PROG_QUERY) failed: Function not implemented (os error 38) \
             (this kernel has no bpf(2): is it built with CONFIG_BPF_SYSCALL?)",
        );
    }
}

#[test]
fn the_aarch64_runtime_gives_an_arm64_container_exactly_its_gpu_cgroup_v1() {
    the_aarch64_runtime_gives_an_arm64_container_exactly_its_gpu(RuntimeEnv::CgroupV1);
}

/// nvhook-runtime hands runc the device rules in the spec: no bpf of its own under v2.
#[test]
fn the_aarch64_runtime_gives_an_arm64_container_exactly_its_gpu_cgroup_v2() {
    the_aarch64_runtime_gives_an_arm64_container_exactly_its_gpu(RuntimeEnv::CgroupV2);
}

fn the_aarch64_runtime_gives_an_arm64_container_exactly_its_gpu(env: RuntimeEnv) {
    require_root();
    let arm64 = Arm64::require();
    let node = arm64.node(GPUS, &[]);
    let ns = arm64.host_ns(env);
    let mut bundle = gpucheck_bundle(arm64, &[]);
    bundle
        .env("NVIDIA_VISIBLE_DEVICES=1")
        .env("NVIDIA_DRIVER_CAPABILITIES=compute,utility");
    let config = node.config().display().to_string();
    let output = run_leaving_nothing(
        &bundle,
        &ns,
        &node,
        &arm64.runtime(),
        &[("NVHOOK_CONFIG", &config)],
    );
    assert_gpu_usable(&output, 1);
    assert_cache_has_aarch64_libcuda(arm64, bundle.rootfs());

    // No GPU asked for: the runtime hands the container to runc untouched.
    let mut bundle = gpucheck_bundle(arm64, &[]);
    let output = run_leaving_nothing(
        bundle.env("NVIDIA_VISIBLE_DEVICES=void"),
        &ns,
        &node,
        &arm64.runtime(),
        &[("NVHOOK_CONFIG", &config)],
    );
    output.assert_success();
    output.assert_no_gpu_given("NVIDIA_VISIBLE_DEVICES=void");
}

#[test]
fn podman_runs_an_arm64_container_from_the_aarch64_cdi_spec() {
    require_root();
    let arm64 = Arm64::require();
    let node = arm64.node(GPUS, &[]);
    let ns = arm64.host_ns(RuntimeEnv::CgroupV1);
    let spec = CdiSpecFile::new("yaml");
    // The aarch64 nvhook asks the aarch64 NVML through nvhook-nvml: on the arm64 host side.
    stdout_of(
        Command::new(ns.nsenter()[0].clone())
            .args(&ns.nsenter()[1..])
            .arg(arm64.nvhook())
            .arg("--config")
            .arg(node.config())
            .args(["cdi", "generate", "--output"])
            .arg(spec.path()),
    );
    let text = std::fs::read_to_string(spec.path()).expect("read the spec");
    // The hook's arguments are in the file the spec names (`- --args-file`, then its path, in
    // YAML): `--bind-files DIR NAME,...`, one a line.
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let args_file = lines
        .windows(2)
        .find(|w| w[0] == "- --args-file")
        .and_then(|w| w[1].strip_prefix("- "))
        .unwrap_or_else(|| panic!("the spec names no argument file:\n{text}"));
    let args = std::fs::read_to_string(args_file).expect("read the hook's argument file");
    let arg_lines: Vec<&str> = args.lines().collect();
    let aarch64_libcuda = arg_lines
        .windows(3)
        .any(|w| w[0] == "--bind-files" && w[1] == LIB_DIR && w[2].contains("libcuda.so."));
    assert!(
        aarch64_libcuda,
        "the spec names no aarch64 libcuda:\n{text}\n{args}"
    );
    assert!(!text.contains("x86_64-linux-gnu"), "{text}");
    assert!(!args.contains("x86_64-linux-gnu"), "{args}");

    let podman = Podman::new();
    let image = format!(
        "localhost/{}:latest",
        support::engines::unique_name("nvhook-arm64")
    );
    podman.import(arm64.image().rootfs(), &image);
    let args = checks(&[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let host = host_snapshot();
    let mut output = podman.run(&["--device", "nvidia.com/gpu=3"], &image, &args);
    output.hook_log = Some(node.log());
    assert_gpu_usable(&output, 3);
    let diff = host.diff(&host_snapshot());
    assert!(diff.is_empty(), "the host changed: {diff:#?}");
    let leaked = host_mounts_referencing(&[node.root()]);
    assert!(leaked.is_empty(), "driver files still mounted: {leaked:#?}");
}

/// What lets the emulated hook enter the container's mount namespace at all: qemu-user keeps a
/// thread of its own in every process it runs, and setns(CLONE_NEWNS) refuses a thread whose
/// filesystem context another thread shares. nvhook's entry unshares it first; here, natively,
/// from a process with a second thread alive.
#[test]
fn entering_a_mount_namespace_works_beside_another_thread() {
    require_root();
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn(move || stopped.recv());
    let own = std::fs::File::open("/proc/self/ns/mnt").expect("open /proc/self/ns/mnt");
    let entered = std::thread::spawn(move || nvhook::rootfs::sys::enter_mount_ns(&own))
        .join()
        .expect("the entering thread");
    stop.send(()).expect("stop the other thread");
    let _ = other.join();
    entered.expect("setns(CLONE_NEWNS) beside another thread");
}
