//! Kubernetes `hostUsers: false` pods over the CRI (issue 38 §2): Debian sid's containerd 2.1.9
//! runs them on sid's runc 1.3.6 (`scripts/sid-runtimes.sh`'s wrapper: Debian 12's runc 1.1
//! has no idmapped mounts, which such a pod's rootfs needs), the pod's user namespace mapping
//! its ids 0..65536 to the host's 100000.. as the kubelet's `userns_options` say, in a network
//! namespace of its own (CNI's bridge plugin: containerd refuses such a pod on the host's
//! network). GPU 1 comes through nvhook's RuntimeClass handler (nvhook-runtime), through the
//! kubelet's CDI request for nvhook's spec, and through the NRI plugin in each of its modes
//! (hook, cdi, cdi-devices, mounts); each pod sees exactly GPU 1, loads libcuda, and what
//! nvhook wrote in its image is its root's. Run as root after `cargo build --workspace`,
//! `scripts/sid-engines.sh` and `scripts/sid-runtimes.sh`: `cargo test --test userns_pods_e2e`.

use nvhook_test_support as support;
use support::{containerd2, cri};

use containerd2::{CriNode, DEFAULT_HANDLER, PodNetwork};
use cri::{ContainerRequest, PodUserNamespace};
use support::engines::{nvhook_runtime_bin, sid_runtime_bin};
use support::{Output, WRITTEN_SEEN_INSIDE, gpucheck_args, owner_args};

const GPUS: u32 = 4;
const GPU: u32 = 1;
/// The host ids the pod's ids 0..IDS are, as the kubelet picks them (a multiple of 65536).
const HOST_ID: u32 = 100_000;
const IDS: u32 = 65_536;
const LIBCUDA: &str = "/usr/lib/x86_64-linux-gnu/libcuda.so.1";
/// nvhook's RuntimeClass handler, as `nvhook configure containerd` names it.
const HANDLER: &str = "nvidia";

/// A file of the host's root that every GPU pod with the utility capability gets, bound from
/// the host in each way in.
const HOST_FILE: &str = "/usr/bin/nvidia-smi";

/// gpucheck on every GPU node and /dev, writing the driver's libcuda, then the owners of what
/// nvhook writes and of a host file.
fn gpucheck() -> Vec<String> {
    let mut extra = vec!["--ls", "/dev", "--write", LIBCUDA, "--owner", HOST_FILE];
    extra.extend(owner_args(&WRITTEN_SEEN_INSIDE));
    gpucheck_args(GPUS, &extra)
}

/// GPU 1 alone, libcuda loaded, the driver read-only, and the host's file shown as owned by
/// the overflow id: the pod has a user namespace of its own, where the host's root is no one.
/// What nvhook wrote in the image (`written`) is the pod's root's: 0:0 inside, HOST_ID on the
/// host (a file the host's root made would show as the overflow id too).
#[track_caller]
fn assert_gpu_1_in_the_pods_user_namespace(written: &[&str], output: &Output) {
    output.assert_allocated_gpu_only("hostUsers: false", GPUS, GPU);
    output.assert_only_gpu_with_read_only_driver(GPUS, GPU, LIBCUDA);
    output.assert_owned_by_root_inside(written);
    output.assert_lines(&[&format!("owner {HOST_FILE} 65534:65534")]);
}

/// Debian sid's containerd 2.1.9 with its runtimes on sid's runc, a network for pods of their
/// own, the gpucheck image, nvhook's CDI spec in its CDI directory and nvhook-runtime as the
/// RuntimeClass handler `nvidia`, for a simulated node of GPUS GPUs.
type UsernsNode = CriNode;

/// `nodes_at_dev`: the simulated node's device nodes are shown at their /dev paths to the
/// default runc, as a GPU host has them, for the ways in whose edits list the nodes for runc to
/// bind (CDI, NRI's cdi modes and mounts).
fn start(name: &str, nodes_at_dev: bool) -> UsernsNode {
    CriNode::start(name, GPUS, &[], false, |_, node, setup| {
        let runc = sid_runtime_bin("runc");
        // nvhook-runtime execs sid's runc as it is: in a user namespace it leaves a node that
        // is not at its /dev path on the host (the simulated node's) to the hook, which binds
        // it from where it is.
        node.configure(&format!("runtimes = [{runc:?}]"));
        setup.runc = runc;
        // CDI and NRI's cdi and mounts modes list the nodes for runc, which binds them into a
        // user-namespaced pod from their /dev paths on the host, whatever the edits' host
        // paths. nvhook-runtime and NRI's hook mode leave such nodes to the hook instead, which
        // binds them from where they are: those run without the nodes at /dev.
        if nodes_at_dev {
            setup.runc_dev = Some(node.dev_root().join("dev"));
        }
        setup.pod_network = Some(PodNetwork::new());
        setup
            .handlers
            .push((HANDLER.into(), nvhook_runtime_bin().to_path_buf()));
    })
}

/// A `hostUsers: false` pod of gpucheck on `handler`, with `env` and `cdi_devices`.
fn run(node: &mut UsernsNode, handler: &str, env: &[(&str, &str)], cdi_devices: &[&str]) -> Output {
    let request = ContainerRequest {
        env,
        cdi_devices,
        user_namespace: Some(PodUserNamespace {
            host_id: HOST_ID,
            size: IDS,
        }),
        ..Default::default()
    };
    node.run_gpucheck(handler, "userns", &gpucheck(), request)
        .output
}

/// RuntimeClass `nvidia` (nvhook-runtime, `runtime-mode = "hook"`) on sid's runc: the
/// device plugin's env asks for GPU 1.
#[test]
fn a_host_users_false_pod_gets_its_gpu_through_nvhooks_runtime_class() {
    let mut node = start("userns-pod-rc", false);
    let visible = GPU.to_string();
    let env = [
        ("NVIDIA_VISIBLE_DEVICES", visible.as_str()),
        ("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"),
    ];
    let output = run(&mut node, HANDLER, &env, &[]);
    assert_gpu_1_in_the_pods_user_namespace(&WRITTEN_SEEN_INSIDE, &output);
    node.stop();
}

/// The kubelet's CDI request for nvhook's spec (`nvidia.com/gpu=1`, the device plugin's
/// cdi-cri strategy, DRA) on the default handler: containerd makes the edits, runc binds the
/// nodes, nvhook's createRuntime hook writes the links and the loader cache.
#[test]
fn a_host_users_false_pod_gets_its_gpu_through_a_cdi_request() {
    let mut node = start("userns-pod-cdi", true);
    let device = format!("nvidia.com/gpu={GPU}");
    let output = run(&mut node, DEFAULT_HANDLER, &[], &[&device]);
    assert_gpu_1_in_the_pods_user_namespace(&WRITTEN_SEEN_INSIDE, &output);
    node.stop();
}

/// The NRI plugin in `mode`, the device plugin's env asking for GPU 1, on the default handler.
fn through_the_nri_plugin(mode: &str) -> (UsernsNode, Output) {
    let mut node = start(&format!("userns-pod-nri-{mode}"), mode != "hook");
    node.connect_nri_plugin(mode);
    let visible = GPU.to_string();
    let env = [
        ("NVIDIA_VISIBLE_DEVICES", visible.as_str()),
        ("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"),
    ];
    let output = run(&mut node, DEFAULT_HANDLER, &env, &[]);
    (node, output)
}

/// `nri-mode = "hook"`: the plugin adds the nodes and the prestart hook, which writes the links
/// and the loader cache.
#[test]
fn a_host_users_false_pod_gets_its_gpu_through_nri_hook_mode() {
    let (node, output) = through_the_nri_plugin("hook");
    assert_gpu_1_in_the_pods_user_namespace(&WRITTEN_SEEN_INSIDE, &output);
    node.stop();
}

/// `nri-mode = "cdi"`: the plugin hands containerd the CDI edits and nvhook's createRuntime
/// hook.
#[test]
fn a_host_users_false_pod_gets_its_gpu_through_nri_cdi_mode() {
    let (node, output) = through_the_nri_plugin("cdi");
    assert_gpu_1_in_the_pods_user_namespace(&WRITTEN_SEEN_INSIDE, &output);
    node.stop();
}

/// `nri-mode = "mounts"` for a pod whose environment searches /usr/local/nvidia/lib64, as a
/// CUDA image's does: the plugin gathers the libraries on the host, and runc binds that one
/// directory into the pod's user namespace, where the loader finds libcuda.
#[test]
fn a_host_users_false_pod_of_a_cuda_image_gets_its_gpu_through_nri_mounts_mode() {
    let mut node = start("userns-pod-nri-gathered", true);
    node.connect_nri_plugin("mounts");
    let visible = GPU.to_string();
    let env = [
        ("NVIDIA_VISIBLE_DEVICES", visible.as_str()),
        ("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"),
        (
            "LD_LIBRARY_PATH",
            "/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
        ),
        ("PATH", "/usr/local/nvidia/bin:/usr/bin:/bin"),
    ];
    let libcuda = "/usr/local/nvidia/lib64/libcuda.so.1";
    let smi = "/usr/local/nvidia/bin/nvidia-smi";
    let args = gpucheck_args(
        GPUS,
        &[
            "--ls", "/dev", "--write", libcuda, "--owner", libcuda, "--exec", smi,
        ],
    );
    let request = ContainerRequest {
        env: &env,
        user_namespace: Some(PodUserNamespace {
            host_id: HOST_ID,
            size: IDS,
        }),
        ..Default::default()
    };
    let output = node
        .run_gpucheck(DEFAULT_HANDLER, "userns", &args, request)
        .output;
    output.assert_allocated_gpu_only("hostUsers: false, a CUDA image", GPUS, GPU);
    output.assert_only_gpu_with_read_only_driver(GPUS, GPU, libcuda);
    output.assert_lines(&[
        &format!("dlopen libcuda.so.1 path {libcuda}"),
        // The host's file, seen from the pod's user namespace: no one's.
        &format!("owner {libcuda} 65534:65534"),
        &format!("exec {smi} rc=0"),
    ]);
    let log = node.node.log();
    assert!(
        log.contains("driver files gathered into one directory"),
        "{log}"
    );
    node.stop();
}

/// `nri-mode = "cdi-devices"`: the plugin names GPU 1 in nvhook's CDI spec and containerd
/// injects it, the spec's createRuntime hook included.
#[test]
fn a_host_users_false_pod_gets_its_gpu_through_nri_cdi_devices_mode() {
    let (node, output) = through_the_nri_plugin("cdi-devices");
    assert_gpu_1_in_the_pods_user_namespace(&WRITTEN_SEEN_INSIDE, &output);
    node.stop();
}

/// `nri-mode = "mounts"`: every file a bind mount, no hook: nvhook writes nothing in the image
/// (no ld.so.conf.d file of its own), and libcuda is found by the loader's own search.
#[test]
fn a_host_users_false_pod_gets_its_gpu_through_nri_mounts_mode() {
    let (node, output) = through_the_nri_plugin("mounts");
    assert_gpu_1_in_the_pods_user_namespace(&[], &output);
    output.assert_lines(&[
        "dlopen libcuda.so.1 path /lib/x86_64-linux-gnu/libcuda.so.1",
        "owner /etc/ld.so.conf.d/000-nvhook.conf absent",
    ]);
    let log = node.node.log();
    assert!(
        !log.contains("nvhook::hook"),
        "a hook ran in nri-mode = mounts:\n{log}"
    );
    node.stop();
}
