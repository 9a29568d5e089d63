//! GPU containers in a user namespace (issue 25 §1): uid/gid mappings as runc takes them from
//! Kubernetes `hostUsers: false`, Docker's `userns-remap` and Podman's `--userns=auto`, the
//! container's root being an unprivileged host id. Real runc on a simulated node, nvhook as
//! the prestart hook and as nvhook-runtime. Run as root after `cargo build --workspace`.

use nvhook_test_support as support;

use std::os::unix::fs::MetadataExt;

use support::{
    Bundle, MountNs, Output, RuntimeEnv, SimNode, glibc_image, gpucheck_args,
    host_mounts_referencing, host_snapshot, require_root, run_clean, run_in_ns, table_diff,
};

const GPUS: u32 = 4;
/// The host ids the container's ids 0..65536 are.
const HOST_ID: u32 = 100_000;
const IDS: u32 = 65_536;
const LIBCUDA: &str = "/usr/lib/x86_64-linux-gnu/libcuda.so.1";

fn userns_bundle(extra: &[&str]) -> Bundle {
    let args = gpucheck_args(GPUS, extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut bundle = Bundle::new(glibc_image(), &args);
    bundle.user_namespace(HOST_ID, IDS);
    bundle
}

#[track_caller]
fn assert_gpu_1_only(output: &Output) {
    output.assert_success();
    output.assert_gpus(GPUS, &[1]);
    output.assert_control_nodes_allowed();
    output.assert_lines(&[
        "dlopen libcuda.so.1 ok",
        "cuInit 0",
        // Refused before the read-only mount is even looked at: the host's file is not the
        // container's root's to write.
        &format!("write {LIBCUDA} EACCES"),
    ]);
}

fn hook_gives_a_user_namespaced_container_its_gpu(env: RuntimeEnv) {
    require_root();
    let node = SimNode::create(GPUS);
    let mut bundle = userns_bundle(&["--write", LIBCUDA]);
    bundle
        .env("NVIDIA_VISIBLE_DEVICES=1")
        .env("NVIDIA_DRIVER_CAPABILITIES=compute,utility")
        .prestart_hook(&node);
    let host = host_snapshot();
    let output = run_clean(&bundle, Some(&node), env);
    assert_gpu_1_only(&output);
    // What nvhook wrote in the image is the container root's: its host id.
    let cache = bundle.rootfs().join("etc/ld.so.cache");
    let meta = std::fs::metadata(&cache).expect("the loader cache nvhook wrote");
    assert_eq!(
        (meta.uid(), meta.gid()),
        (HOST_ID, HOST_ID),
        "{}",
        cache.display()
    );
    let diff = host.diff(&host_snapshot());
    assert!(diff.is_empty(), "the host changed: {diff:#?}");
    let leaked = host_mounts_referencing(&[node.root()]);
    assert!(leaked.is_empty(), "driver files still mounted: {leaked:#?}");
}

#[test]
fn the_hook_gives_a_user_namespaced_container_its_gpu_cgroup_v1() {
    hook_gives_a_user_namespaced_container_its_gpu(RuntimeEnv::CgroupV1);
}

#[test]
fn the_hook_gives_a_user_namespaced_container_its_gpu_cgroup_v2() {
    hook_gives_a_user_namespaced_container_its_gpu(RuntimeEnv::CgroupV2);
}

fn runtime_gives_a_user_namespaced_container_its_gpu(env: RuntimeEnv) {
    require_root();
    let node = SimNode::create(GPUS);
    let mut bundle = userns_bundle(&["--write", LIBCUDA]);
    bundle
        .env("NVIDIA_VISIBLE_DEVICES=1")
        .env("NVIDIA_DRIVER_CAPABILITIES=compute,utility");
    let ns = MountNs::new(env);
    let table = ns.table();
    let config = node.config().display().to_string();
    let mut output = run_in_ns(
        &bundle,
        &ns,
        support::engines::nvhook_runtime_bin(),
        &[("NVHOOK_CONFIG", &config)],
    );
    output.hook_log = Some(node.log());
    assert_gpu_1_only(&output);
    let changed = table_diff(&table, &ns.table());
    assert!(changed.is_empty(), "the mount table changed: {changed:#?}");
}

#[test]
fn nvhook_runtime_gives_a_user_namespaced_container_its_gpu_cgroup_v1() {
    runtime_gives_a_user_namespaced_container_its_gpu(RuntimeEnv::CgroupV1);
}

#[test]
fn nvhook_runtime_gives_a_user_namespaced_container_its_gpu_cgroup_v2() {
    runtime_gives_a_user_namespaced_container_its_gpu(RuntimeEnv::CgroupV2);
}
