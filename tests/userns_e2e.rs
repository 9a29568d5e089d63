//! GPU containers in a user namespace (issue 25 §1): uid/gid mappings as runc takes them from
//! Kubernetes `hostUsers: false`, Docker's `userns-remap` and Podman's `--userns=auto`, the
//! container's root being an unprivileged host id. Real runc on a simulated node, nvhook as
//! the prestart hook and as nvhook-runtime. Run as root after `cargo build --workspace`.

use nvhook_test_support as support;

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nvhook::nvidia_cli::RUNTIME_HOOK_NAME;
use support::engines::{Dockerd, EngineDir, unique_name};
use support::podman::{CdiSpecFile, Podman};
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
    output.assert_only_gpu_with_read_only_driver(GPUS, 1, LIBCUDA);
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

/// Rootful Podman with `--userns=auto` (the container's ids mapped into the `containers`
/// user's range in /etc/subuid, 100000..) and nvhook's CDI spec: runc binds the nodes
/// from their host paths (so Podman runs where the node's are at /dev, as on a GPU host), and
/// nvhook's createContainer hook makes the links and the cache.
#[test]
fn podman_runs_a_cdi_device_in_a_user_namespace() {
    require_root();
    let node = SimNode::create(GPUS);
    let scratch = tempfile::tempdir().expect("a scratch directory");
    // `--userns=auto` takes its ranges from the `containers` user's in /etc/subuid and
    // /etc/subgid: the test's, bound over the host's in the namespace.
    let ids = scratch.path().join("subids");
    std::fs::write(&ids, format!("containers:{HOST_ID}:{IDS}\n")).expect("write the id ranges");
    let dev = scratch.path().join("dev");
    std::fs::create_dir(&dev).expect("a directory for the host's /dev");
    let ns = node.dev_at_host_paths_and(
        RuntimeEnv::CgroupV1,
        &dev,
        &format!(
            "mount --bind {ids} /etc/subuid && mount --bind {ids} /etc/subgid",
            ids = ids.display()
        ),
    );
    let spec = CdiSpecFile::new("yaml");
    node.generate_cdi_spec(spec.path());
    let podman = Podman::inside(&ns);
    let image = format!("localhost/{}:latest", unique_name("nvhook-userns"));
    podman.import(glibc_image().rootfs(), &image);
    let driver_libcuda = format!(
        "/usr/lib/x86_64-linux-gnu/libcuda.so.{}",
        node.driver_version()
    );
    let args = gpucheck_args(
        GPUS,
        &[
            "--write",
            LIBCUDA,
            "--owner",
            "/etc/ld.so.cache",
            "--owner",
            LIBCUDA,
            "--owner",
            &driver_libcuda,
        ],
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let host = host_snapshot();
    let mut output = podman.run(
        &["--userns=auto", "--device", "nvidia.com/gpu=1"],
        &image,
        &args,
    );
    output.hook_log = Some(node.log());
    assert_gpu_1_only(&output);
    // The cache and the SONAME link nvhook's createContainer hook wrote are the container's
    // root's (a file of the host's root would show as 65534, the overflow id).
    output.assert_lines(&[
        "owner /etc/ld.so.cache 0:0",
        &format!("owner {LIBCUDA} 0:0"),
        // The driver's own file, the host root's: proof that the container has a user
        // namespace (the id it cannot map shows as the overflow id).
        &format!("owner {driver_libcuda} 65534:65534"),
    ]);
    let diff = host.diff(&host_snapshot());
    assert!(diff.is_empty(), "the host changed: {diff:#?}");
    let leaked = host_mounts_referencing(&[node.root()]);
    assert!(leaked.is_empty(), "driver files still mounted: {leaked:#?}");
}

/// Docker's `userns-remap` (Debian's dockerd 20.10, root's ids remapped to 100000..): `docker
/// run --gpus device=1` through nvhook under NVIDIA's hook name. dockerd reads the remapping
/// from /etc/subuid and /etc/subgid: it runs in a mount namespace where those two files are
/// the test's (the host's are not touched).
#[test]
fn docker_userns_remap_runs_gpus_through_the_hook() {
    require_root();
    let node = SimNode::create(GPUS);
    let dir = EngineDir::new("userns-remap");
    let ids = dir.path().join("subids");
    std::fs::write(&ids, format!("root:{HOST_ID}:{IDS}\n")).expect("write the id ranges");
    let setup = format!(
        "mount --bind {ids} /etc/subuid && mount --bind {ids} /etc/subgid",
        ids = ids.display()
    );
    let ns = MountNs::with_setup(RuntimeEnv::CgroupV1, &setup);
    let bin = dir.path().join("nvidia-names");
    std::fs::create_dir(&bin).expect("make the links' directory");
    std::os::unix::fs::symlink(support::nvhook_bin(), bin.join(RUNTIME_HOOK_NAME))
        .expect("link nvidia-container-runtime-hook");
    let path = format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", bin.display());
    let daemon_json = dir.path().join("daemon.json");
    std::fs::write(&daemon_json, r#"{"userns-remap": "root"}"#).expect("write daemon.json");
    let config = node.config();
    let env = [
        ("PATH", Path::new(&path)),
        ("NVHOOK_CONFIG", config.as_path()),
    ];
    let mut dockerd = Dockerd::start_in(&ns, dir.path(), &daemon_json, &env);
    let image = dockerd.import_gpucheck_image(dir.path());
    let args = gpucheck_args(GPUS, &["--write", LIBCUDA, "--owner", "/etc/ld.so.cache"]);
    let mut run = vec!["--rm", "--network", "none", "--gpus", "device=1", &image];
    run.extend(args.iter().map(String::as_str));
    let mut output = dockerd.run(&run);
    output.hook_log = Some(node.log());
    assert_gpu_1_only(&output);
    output.assert_lines(&["owner /etc/ld.so.cache 0:0"]);
    assert!(
        dockerd.shutdown(),
        "dockerd ignored SIGTERM:\n{}",
        dockerd.log()
    );
    let leaked = host_mounts_referencing(&[node.root()]);
    assert!(leaked.is_empty(), "driver files still mounted: {leaked:#?}");
}
