//! The kubelet's path, end to end on a simulated 4-GPU node: containerd's CRI
//! plugin, configured by `nvhook configure containerd` with runtime handler
//! `nvidia`, driven over its gRPC socket with the calls the kubelet makes
//! (RunPodSandbox with `runtimeClassName: nvidia`, CreateContainer,
//! StartContainer). The GPU a pod gets is the one the device plugin
//! allocated, passed as the plugin passes it: `NVIDIA_VISIBLE_DEVICES=<uuid>`
//! (deviceListStrategy=envvar) or a `/var/run/nvidia-container-devices/<uuid>`
//! mount (volume-mounts, with `--kubernetes`'s hardened policy). Run as root
//! after `cargo build --workspace`: `cargo test --test cri_e2e`.

use nvhook_test_support as support;
use support::cri;

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use cri::{ContainerRequest, Cri, PodRun};
use support::engines::{
    CgroupParent, Containerd, EngineDir, ImageConfig, PAUSE_IMAGE, assert_containerd_handler,
    assert_no_mounts_left, cri_containerd_config, nvhook_runtime_bin, unique_name,
};
use support::{Output, SimNode, busybox_image, glibc_image, nvhook_bin, require_root};

const GPUS: u32 = 4;
/// The RuntimeClass handler (deploy/kubernetes/runtimeclass.yaml says the same).
const HANDLER: &str = nvhook::configure::DEFAULT_RUNTIME_NAME;
/// The device plugin's volume-mounts strategy: one mount of /dev/null per device.
const DEVICE_MOUNT_ROOT: &str = "/var/run/nvidia-container-devices";
/// gpucheck: every GPU node, then the nvidia entries of /dev (as a pod's
/// `args`, which replace the image's Cmd: the image has no Entrypoint).
const GPUCHECK: &[&str] = &[
    "/gpucheck",
    "--dev",
    "/dev/nvidia0",
    "--dev",
    "/dev/nvidia1",
    "--dev",
    "/dev/nvidia2",
    "--dev",
    "/dev/nvidia3",
    "--ls",
    "/dev",
];

/// The GPU the device plugin allocates to every GPU pod here.
const ALLOCATED: u32 = 1;

#[track_caller]
fn assert_allocated_gpu_only(what: &str, output: &Output) {
    output.assert_allocated_gpu_only(what, GPUS, ALLOCATED);
}

#[track_caller]
fn assert_no_gpu(what: &str, output: &Output) {
    output.assert_no_gpu_given(what);
}

/// `nvhook configure containerd [EXTRA...]` on the test's files, as an admin
/// would run it on the node (with the runtime built for this test run).
fn configure(engine_config: &Path, extra: &[&str]) -> String {
    let output = Command::new(nvhook_bin())
        .args(["configure", "containerd", "--engine-config"])
        .arg(engine_config)
        .arg("--runtime-path")
        .arg(nvhook_runtime_bin())
        .args(extra)
        .env_remove("NVHOOK_CONFIG")
        .output()
        .expect("run nvhook configure");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "nvhook configure containerd {extra:?} failed:\n{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

struct Timings(Vec<(&'static str, Duration, Duration)>);

impl Timings {
    fn record(&mut self, what: &'static str, run: &PodRun) {
        self.0.push((what, run.sandbox, run.container_start));
    }
}

impl Drop for Timings {
    fn drop(&mut self) {
        for (what, sandbox, start) in &self.0 {
            eprintln!(
                "timing: {what}: RunPodSandbox {sandbox:.2?}, CreateContainer+StartContainer {start:.2?}"
            );
        }
    }
}

#[test]
fn cri_pods_get_exactly_the_gpu_the_device_plugin_allocated() {
    let started = Instant::now();
    require_root();
    let node = SimNode::create(GPUS);
    let dir = EngineDir::new("cri");
    let uuid = node.gpu_uuid(ALLOCATED as usize);
    let pause = format!("docker.io/nvhook-test/{}:latest", unique_name("pause"));
    let app = format!("docker.io/nvhook-test/{}:latest", unique_name("cuda-app"));

    let engine_config = dir.path().join("containerd.toml");
    fs::write(&engine_config, cri_containerd_config(dir.path(), &pause))
        .expect("write containerd config");
    configure(&engine_config, &[]);
    let runtime = nvhook_runtime_bin().to_str().expect("UTF-8 path");
    assert_containerd_handler(&engine_config, HANDLER, runtime);

    // containerd passes its environment to the runc shim, and nvhook-runtime to
    // nvhook-runtime: that is how the runtime finds this node's config.
    let mut containerd = Containerd::start(
        dir.path(),
        &engine_config,
        &[("NVHOOK_CONFIG", &node.config())],
    );
    containerd.set_namespace("k8s.io");
    containerd.import_rootfs(dir.path(), busybox_image().rootfs(), &pause, &PAUSE_IMAGE);
    // An image that asks for every GPU by itself, as CUDA base images do.
    let greedy = ImageConfig {
        cmd: &["/gpucheck"],
        env: &["NVIDIA_VISIBLE_DEVICES=all"],
    };
    containerd.import_rootfs(dir.path(), glibc_image().rootfs(), &app, &greedy);

    let mut cri = Cri::connect(containerd.socket());
    assert!(cri.has_image(&pause) && cri.has_image(&app));
    let cgroups = CgroupParent::new("nvhook-cri");
    let logs = dir.path().join("pods");
    let mut timings = Timings(vec![]);
    let mut run = |what: &'static str, name: &str, container: ContainerRequest| {
        let pod = cri.run_pod(
            &unique_name(name),
            HANDLER,
            &cgroups.path(),
            &logs,
            &container,
        );
        timings.record(what, &pod);
        let mut output = pod.output;
        output.hook_log = Some(format!(
            "{}\n(containerd log)\n{}",
            node.log(),
            containerd.log()
        ));
        output
    };
    let env_allocation = [("NVIDIA_VISIBLE_DEVICES", uuid.as_str())];
    let mount_point = format!("{DEVICE_MOUNT_ROOT}/{uuid}");
    let mount_allocation = [(mount_point.as_str(), "/dev/null")];

    // nvidia-container-toolkit's default policy and the device plugin's
    // default deviceListStrategy=envvar.
    let output = run(
        "GPU pod, env",
        "env",
        gpucheck_pod(&app, &env_allocation, &[], false),
    );
    assert_allocated_gpu_only("envvar allocation, default policy", &output);

    // The hardened policy; nvhook reads its config per container, so the
    // running containerd needs no restart for it.
    let said = configure(
        &engine_config,
        &["--kubernetes", "--config", path_str(&node.config())],
    );
    assert!(said.contains("set the Kubernetes policy"), "{said}");
    assert!(said.contains("already configured"), "{said}");

    let output = run(
        "GPU pod, volume mounts",
        "mounts",
        gpucheck_pod(&app, &[], &mount_allocation, false),
    );
    assert_allocated_gpu_only("volume-mount allocation, hardened policy", &output);

    let output = run(
        "pod without GPU",
        "nogpu",
        gpucheck_pod(&app, &[], &[], false),
    );
    assert_no_gpu("no allocation, image says all, hardened policy", &output);

    let output = run(
        "unprivileged pod, env",
        "envignored",
        gpucheck_pod(&app, &env_allocation, &[], false),
    );
    assert_no_gpu("env of an unprivileged pod, hardened policy", &output);

    let output = run(
        "privileged pod, env",
        "privileged",
        gpucheck_pod(&app, &env_allocation, &[], true),
    );
    assert_allocated_gpu_only("env of a privileged pod, hardened policy", &output);

    drop(cri);
    assert!(
        containerd.shutdown(),
        "containerd ignored SIGTERM:\n{}",
        containerd.log()
    );
    drop(timings);
    assert_no_mounts_left(dir.path(), node.root());
    eprintln!("timing: cri test took {:.2?}", started.elapsed());
}

/// gpucheck in `image`, with the device plugin's allocation, if any.
fn gpucheck_pod<'a>(
    image: &'a str,
    env: &'a [(&'a str, &'a str)],
    mounts: &'a [(&'a str, &'a str)],
    privileged: bool,
) -> ContainerRequest<'a> {
    ContainerRequest {
        image,
        args: GPUCHECK,
        env,
        mounts,
        privileged,
        ..Default::default()
    }
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("UTF-8 path")
}
