//! Nested sandboxes in GPU containers (issue 25 §2): bubblewrap, Slurm's containers and
//! `unshare --mount-proc` inside a pod with `procMount: Unmasked` mount a new procfs from a
//! user namespace, which the kernel allows only while the container's procfs is whole (no
//! mount covers part of it). nvhook's `/proc/driver/nvidia` view is such a mount; under
//! `proc-driver-view = "auto"` a container whose spec masks nothing under /proc does not get
//! it. Real runc and Podman on a simulated node, the nested sandbox made by an unprivileged
//! user in the container. The simulated node has no `/proc/driver/nvidia` of the kernel's, so
//! the view itself is proven on a real driver (`scripts/gpu-node-check.sh`); here the kernel's
//! rule is shown with a mount of the runtime's over `/proc/driver`, and nvhook's choice is read
//! from its log. Run as root after `cargo build --workspace`.

use nvhook_test_support as support;

use support::engines::{nvhook_runtime_bin, unique_name};
use support::podman::{CdiSpecFile, Podman};
use support::{Bundle, Output, RuntimeEnv, SimNode, busybox_image, require_root, run_clean};
use support::{run_container, run_container_with};

const GPUS: u32 = 4;
const NESTED_OK: &str = "nested procfs ok";
/// What nvhook logs when it leaves `/proc/driver/nvidia` alone for an unmasked container.
const LEFT_FOR_UNMASKED: &str =
    "/proc/driver/nvidia left as the host's: the container's /proc is unmasked";
/// What it logs when it chose the view and the container's procfs has no driver directory.
const VIEW_CHOSEN: &str = "the container's procfs has no /proc/driver/nvidia";

/// Lists /dev, then makes a sandbox the way bubblewrap does: new user, pid and mount
/// namespaces, a fresh procfs mounted in them.
const SCRIPT: &str = "ls /dev; /bin/busybox unshare -Urpf --mount-proc /bin/busybox true \
                      && echo 'nested procfs ok' || echo 'nested procfs refused'";
const NESTED_REFUSED: &str = "nested procfs refused";

/// A busybox container running [`SCRIPT`] as uid 1000.
fn nested_bundle() -> Bundle {
    let mut bundle = Bundle::new(busybox_image(), &["/bin/sh", "-c", SCRIPT]);
    bundle.user(1000, 1000);
    bundle
}

#[track_caller]
fn assert_nested_sandbox_with_gpu_1(output: &Output) {
    output.assert_success();
    assert!(
        output.has_line(NESTED_OK),
        "the nested procfs failed\n{output}"
    );
    assert!(output.has_line("nvidia1"), "GPU 1 is missing\n{output}");
    for other in ["nvidia0", "nvidia2", "nvidia3"] {
        assert!(!output.has_line(other), "{other} was given\n{output}");
    }
}

#[track_caller]
fn assert_logged(node: &SimNode, left_alone: bool) {
    let log = node.log();
    assert_eq!(log.contains(LEFT_FOR_UNMASKED), left_alone, "{log}");
    assert_eq!(log.contains(VIEW_CHOSEN), !left_alone, "{log}");
}

/// The probe's control: the same sandbox fails under runc's default masked paths, and in an
/// unmasked container as soon as one mount covers a directory of its procfs.
#[test]
fn the_kernel_refuses_a_nested_procfs_while_a_mount_covers_part_of_proc() {
    require_root();
    let masked = run_container(&nested_bundle(), RuntimeEnv::CgroupV1);
    let mut covered = nested_bundle();
    covered.unmask_proc().tmpfs("/proc/driver");
    let covered = run_container(&covered, RuntimeEnv::CgroupV1);
    let mut whole = nested_bundle();
    whole.unmask_proc();
    let whole = run_container(&whole, RuntimeEnv::CgroupV1);
    for output in [&masked, &covered] {
        assert!(output.has_line(NESTED_REFUSED), "{output}");
        assert!(
            output.stderr.contains("Operation not permitted"),
            "{output}"
        );
    }
    assert!(whole.has_line(NESTED_OK), "{whole}");
}

fn hook_leaves_an_unmasked_containers_proc_whole(env: RuntimeEnv) {
    require_root();
    let node = SimNode::create(GPUS);
    let mut bundle = nested_bundle();
    bundle
        .unmask_proc()
        .env("NVIDIA_VISIBLE_DEVICES=1")
        .prestart_hook(&node);
    let output = run_clean(&bundle, Some(&node), env);
    assert_nested_sandbox_with_gpu_1(&output);
    assert_logged(&node, true);
}

#[test]
fn the_hook_leaves_an_unmasked_containers_proc_whole_cgroup_v1() {
    hook_leaves_an_unmasked_containers_proc_whole(RuntimeEnv::CgroupV1);
}

#[test]
fn the_hook_leaves_an_unmasked_containers_proc_whole_cgroup_v2() {
    hook_leaves_an_unmasked_containers_proc_whole(RuntimeEnv::CgroupV2);
}

/// A container with runc's masked paths gets the view (nested procfs fails there anyway,
/// by the runtime's own masks); `always` gives it to unmasked containers too.
#[test]
fn masked_containers_and_always_keep_the_view() {
    require_root();
    let node = SimNode::create(GPUS);
    let mut bundle = nested_bundle();
    bundle.env("NVIDIA_VISIBLE_DEVICES=1").prestart_hook(&node);
    let output = run_clean(&bundle, Some(&node), RuntimeEnv::CgroupV1);
    output.assert_success();
    assert!(output.has_line(NESTED_REFUSED), "{output}");
    assert_logged(&node, false);

    let node = SimNode::create(GPUS);
    node.configure("proc-driver-view = \"always\"");
    let mut bundle = nested_bundle();
    bundle
        .unmask_proc()
        .env("NVIDIA_VISIBLE_DEVICES=1")
        .prestart_hook(&node);
    let output = run_clean(&bundle, Some(&node), RuntimeEnv::CgroupV1);
    output.assert_success();
    assert_logged(&node, false);
}

/// nvhook-runtime in `runtime-mode = "cdi"`: the view is the createRuntime hook's, which
/// reads the container's masked paths from the bundle.
#[test]
fn nvhook_runtimes_cdi_mode_leaves_an_unmasked_containers_proc_whole() {
    require_root();
    let node = SimNode::create(GPUS);
    node.configure("runtime-mode = \"cdi\"");
    let mut bundle = nested_bundle();
    bundle.unmask_proc().env("NVIDIA_VISIBLE_DEVICES=1");
    let config = node.config();
    let mut output = run_container_with(
        &bundle,
        RuntimeEnv::CgroupV2,
        nvhook_runtime_bin(),
        &[("NVHOOK_CONFIG", &config)],
    );
    output.hook_log = Some(node.log());
    assert_nested_sandbox_with_gpu_1(&output);
    assert_logged(&node, true);
}

/// Podman's `--security-opt unmask=ALL` with nvhook's generated CDI spec: nothing of the
/// spec's is mounted under /proc (the spec serves any set of its devices, so it has no one
/// container's view), and the nested sandbox runs beside exactly GPU 1.
#[test]
fn podman_unmask_all_runs_a_nested_sandbox_with_a_cdi_gpu() {
    require_root();
    let node = SimNode::create(GPUS);
    let spec = CdiSpecFile::new("yaml");
    node.generate_cdi_spec(spec.path());
    let podman = Podman::new();
    let image = format!("localhost/{}:latest", unique_name("nvhook-nested"));
    podman.import(busybox_image().rootfs(), &image);
    let flags = [
        "--device",
        "nvidia.com/gpu=1",
        "--user",
        "1000:1000",
        "--security-opt",
        "unmask=ALL",
    ];
    let mut output = podman.run(&flags, &image, &["/bin/sh", "-c", SCRIPT]);
    output.hook_log = Some(node.log());
    assert_nested_sandbox_with_gpu_1(&output);
}
