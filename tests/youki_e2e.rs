//! youki, the Rust OCI runtime, under nvhook (issue 25 §4): youki 0.7.0 from crates.io
//! (`scripts/youki.sh`, which `scripts/test.sh` runs) with cgroup v1 and v2 support, on the
//! simulated node: the prestart hook (cgroup v1 and v2), nvhook-runtime with
//! `runtimes = [youki]` (v1 and v2), Podman with `--runtime` and nvhook's CDI spec, and a
//! container in a user namespace. Each container sees exactly GPU 1 and loads libcuda; a GPU
//! the node lacks is refused in nvhook's line. youki's foreground `run` can miss the exit of a
//! container that ends at once, so these run it `--detach` and read the container's output to
//! its end. Run as root after `cargo build --workspace`.

use nvhook_test_support as support;

use support::engines::{nvhook_runtime_bin, unique_name, youki_bin};
use support::podman::{CdiSpecFile, Podman};
use support::{
    Bundle, Output, RuntimeEnv, SimNode, glibc_image, gpucheck_args, host_mounts_referencing,
    host_snapshot, require_root, run_detached_with,
};

const GPUS: u32 = 4;
const LIBCUDA: &str = "/usr/lib/x86_64-linux-gnu/libcuda.so.1";

fn gpu_bundle(visible: &str) -> Bundle {
    let args = gpucheck_args(GPUS, &["--write", LIBCUDA]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut bundle = Bundle::new(glibc_image(), &args);
    bundle
        .env(&format!("NVIDIA_VISIBLE_DEVICES={visible}"))
        .env("NVIDIA_DRIVER_CAPABILITIES=compute,utility");
    bundle
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

fn the_hook_on_youki(env: RuntimeEnv) {
    require_root();
    let node = SimNode::create(GPUS);
    let mut bundle = gpu_bundle("1");
    bundle.prestart_hook(&node);
    let host = host_snapshot();
    let mut output = run_detached_with(&bundle, env, youki_bin(), &[]);
    output.hook_log = Some(node.log());
    assert_gpu_1_only(&output);
    assert_nothing_left(&node, &bundle);
    let diff = host.diff(&host_snapshot());
    assert!(diff.is_empty(), "the host changed: {diff:#?}");

    // A GPU the node lacks: youki passes the hook's one line on, and starts nothing.
    let mut bundle = gpu_bundle("9");
    bundle.prestart_hook(&node);
    let output = run_detached_with(&bundle, env, youki_bin(), &[]);
    assert!(!output.status.success(), "{output}");
    assert!(
        output
            .stderr
            .contains("nvhook: NVIDIA_VISIBLE_DEVICES=9: no such GPU (this node has 0-3)"),
        "{output}"
    );
    assert!(!output.has_line("cuInit 0"), "{output}");
}

#[test]
fn the_prestart_hook_on_youki_cgroup_v1() {
    the_hook_on_youki(RuntimeEnv::CgroupV1);
}

#[test]
fn the_prestart_hook_on_youki_cgroup_v2() {
    the_hook_on_youki(RuntimeEnv::CgroupV2);
}

fn nvhook_runtime_on_youki(env: RuntimeEnv) {
    require_root();
    let node = SimNode::create(GPUS);
    node.configure(&format!("runtimes = [{:?}]", youki_bin()));
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
}

#[test]
fn nvhook_runtime_runs_youki_cgroup_v1() {
    nvhook_runtime_on_youki(RuntimeEnv::CgroupV1);
}

#[test]
fn nvhook_runtime_runs_youki_cgroup_v2() {
    nvhook_runtime_on_youki(RuntimeEnv::CgroupV2);
}

/// Podman with `--runtime` youki and nvhook's generated CDI spec: youki makes the nodes and
/// mounts the spec lists, and runs nvhook's createContainer hook for the links and the cache.
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

/// A user namespace (ids 0..65536 are the host's 100000..): the hook binds the host's nodes
/// and writes as the container's root, under youki as under runc.
#[test]
fn the_hook_gives_a_user_namespaced_youki_container_its_gpu() {
    require_root();
    let node = SimNode::create(GPUS);
    let mut bundle = gpu_bundle("1");
    bundle.user_namespace(100_000, 65_536).prestart_hook(&node);
    let mut output = run_detached_with(&bundle, RuntimeEnv::CgroupV1, youki_bin(), &[]);
    output.hook_log = Some(node.log());
    assert_gpu_1_only(&output);
    let cache = std::fs::metadata(bundle.rootfs().join("etc/ld.so.cache")).expect("the cache");
    use std::os::unix::fs::MetadataExt;
    assert_eq!((cache.uid(), cache.gid()), (100_000, 100_000));
    assert_nothing_left(&node, &bundle);
}
