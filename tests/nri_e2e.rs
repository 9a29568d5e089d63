//! NRI plugin mode, end to end: Debian sid's containerd 2.1.9 with its default runtime runc
//! and no nvhook runtime registered, `nvhook nri` connected to its NRI socket, and pods made
//! through the CRI calls the kubelet makes. A pod gets exactly the GPU the kubelet allocated
//! (the device plugin's env or volume mounts, or a CRI CDI device), the driver's files and
//! the loader cache; a pod that was allocated nothing gets
//! nothing, whatever its image or its annotations say; a refusal is one line in the engine's
//! error; the plugin follows the engine across restarts. Run as root after
//! `cargo build --workspace` (and `scripts/sid-engines.sh`): `cargo test --test nri_e2e`.

use nvhook_test_support as support;
use support::{containerd2, cri};

use std::fs;
use std::path::PathBuf;

use containerd2::{Containerd2Cri, DEFAULT_HANDLER, NriPlugin, Pods, stop_engine};
use cri::{ContainerRequest, Cri};
use support::engines::{
    Containerd, EngineDir, ImageConfig, assert_no_mounts_left, sid_runtime_bin, unique_name,
};
use support::{Output, SimNode, glibc_image, host_mounts_referencing, nvhook_bin, require_root};

const GPUS: u32 = 4;
/// The GPU the kubelet allocates to the GPU pods here.
const ALLOCATED: u32 = 2;
const DEVICE_MOUNT_ROOT: &str = "/var/run/nvidia-container-devices";
/// gpucheck: every GPU node, then the nvidia entries of /dev, and libcuda through the loader.
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

#[track_caller]
fn assert_allocated_gpu_only(what: &str, output: &Output) {
    output.assert_allocated_gpu_only(what, GPUS, ALLOCATED);
}

#[track_caller]
fn assert_no_gpu(what: &str, output: &Output) {
    output.assert_no_gpu_given(what);
}

/// Debian sid's containerd 2.1.9 (runc only) with the gpucheck image imported and
/// `nvhook nri` registered with it for `node`, and where its pods run.
struct Connected {
    dir: EngineDir,
    containerd: Containerd,
    image: String,
    plugin: NriPlugin,
    pods: Pods,
}

fn connected(node: &SimNode, name: &str) -> Connected {
    connected_with(node, name, None, &[])
}

/// [`connected`], its pods run by `runc` where one is given (Debian 12's otherwise), the
/// plugin run by `wrapper` where it is not empty ([`NriPlugin::start_under`]).
fn connected_with(
    node: &SimNode,
    name: &str,
    runc: Option<PathBuf>,
    wrapper: &[&str],
) -> Connected {
    let dir = EngineDir::new(name);
    let mut setup = Containerd2Cri::under(dir.path());
    if let Some(runc) = runc {
        setup.runc = runc;
    }
    let containerd = setup.start(dir.path(), &[]);
    let image = containerd.import_gpucheck_image(dir.path());
    let plugin = NriPlugin::start_under(wrapper, &node.config(), &setup.nri.socket, dir.path());
    plugin.wait_registered(&node.log_file(), 1, &containerd);
    // Run by hand or by a unit, the plugin says on stderr that it is attached (its log is a file).
    let attached = format!(
        "nvhook nri: registered with the engine at {} as 10-nvhook",
        setup.nri.socket.display()
    );
    wait_for_stderr(&plugin, &attached);
    let pods = Pods::new(name, dir.path());
    Connected {
        dir,
        containerd,
        image,
        plugin,
        pods,
    }
}

/// Waits (a few seconds at most) until the plugin's stderr has the line `line`.
#[track_caller]
fn wait_for_stderr(plugin: &NriPlugin, line: &str) {
    let start = std::time::Instant::now();
    while !plugin.stderr().lines().any(|l| l == line) {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(5),
            "no {line:?} on the plugin's stderr:\n{}",
            plugin.stderr()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// `nvhook nri` pointed at a socket nobody serves says so on stderr at once, in one line, and
/// keeps trying (a unit started before the engine must not exit); a bad index is a usage error.
#[test]
fn nri_says_on_stderr_when_it_cannot_connect() {
    require_root();
    let node = SimNode::create(1);
    let dir = EngineDir::new("nri-absent");
    let socket = dir.path().join("absent.sock");
    let plugin = NriPlugin::start(&node.config(), &socket, dir.path());
    wait_for_stderr(
        &plugin,
        &format!(
            "nvhook nri: cannot connect to the NRI socket {}: No such file or directory (os error 2) (is the engine running, with NRI enabled?); trying again until it answers",
            socket.display()
        ),
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(plugin.stderr().lines().count(), 1, "{}", plugin.stderr());
    drop(plugin);
    let out = nvhook_test_support::run_nvhook(&["nri", "--index", "7"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "nvhook: bad NRI plugin index \"7\": it is two digits, 00 to 99, and orders the plugins\n"
    );
}

/// A pod with no allocation gets no GPU in nri-mode `mode`; then the engine stops, and no
/// driver file is left mounted on the host.
fn no_allocation_then_stop(
    mode: &str,
    node: &SimNode,
    image: &str,
    pods: &Pods,
    mut cri: Cri,
    containerd: Containerd,
    plugin: NriPlugin,
) {
    let request = ContainerRequest {
        image,
        args: GPUCHECK,
        ..Default::default()
    };
    let output = pods.run(&mut cri, &containerd, node, "nogpu", request);
    assert_no_gpu(&format!("no allocation, nri-mode = {mode}"), &output);
    stop_engine(plugin, cri, containerd);
    let leaked = host_mounts_referencing(&[node.root()]);
    assert!(leaked.is_empty(), "driver files still mounted: {leaked:#?}");
}

#[test]
fn nri_gives_pods_exactly_what_the_kubelet_allocated() {
    require_root();
    let node = SimNode::create(GPUS);
    let dir = EngineDir::new("nri");
    let setup = Containerd2Cri::under(dir.path());
    let uuid = node.gpu_uuid(ALLOCATED as usize);

    // nvhook's own CDI spec, for the kubelet's CDI request: containerd injects it itself.
    setup.write_cdi_spec(&node);

    let mut containerd = setup.start(dir.path(), &[]);
    // An image that asks for every GPU by itself, as CUDA base images do.
    let app = format!("docker.io/nvhook-test/{}:latest", unique_name("cuda-app"));
    let greedy = ImageConfig {
        cmd: &["/gpucheck"],
        env: &["NVIDIA_VISIBLE_DEVICES=all"],
    };
    containerd.import_rootfs(dir.path(), glibc_image().rootfs(), &app, &greedy);
    let log = node.log_file();
    let mut plugin = NriPlugin::start(&node.config(), &setup.nri.socket, dir.path());
    plugin.wait_registered(&log, 1, &containerd);

    let mut cri = Cri::connect(containerd.socket());
    let pods = Pods::new("nri", dir.path());
    let run = |cri: &mut Cri, containerd: &Containerd, name: &str, request| {
        pods.run(cri, containerd, &node, name, request)
    };
    let pod = |env, mounts, cdi_devices, pod_annotations| ContainerRequest {
        image: &app,
        args: GPUCHECK,
        env,
        mounts,
        cdi_devices,
        pod_annotations,
        ..Default::default()
    };
    let env_allocation = [("NVIDIA_VISIBLE_DEVICES", uuid.as_str())];
    let mount_point = format!("{DEVICE_MOUNT_ROOT}/{uuid}");
    let mount_allocation = [(mount_point.as_str(), "/dev/null")];
    let cdi_allocation = [format!("nvidia.com/gpu={ALLOCATED}")];
    let cdi_allocation: Vec<&str> = cdi_allocation.iter().map(String::as_str).collect();
    let annotation = [(
        "nvidia.cdi.k8s.io/container.main",
        &*format!("nvidia.com/gpu={ALLOCATED}"),
    )];
    let annotation = annotation.map(|(k, v)| (k, v.to_string()));
    let annotation: Vec<(&str, &str)> = annotation.iter().map(|(k, v)| (*k, v.as_str())).collect();

    // The device plugin's default deviceListStrategy=envvar, nvhook's default policy.
    let output = run(
        &mut cri,
        &containerd,
        "env",
        pod(&env_allocation, &[], &[], &[]),
    );
    assert_allocated_gpu_only("envvar allocation, default policy", &output);
    // Its hook planned with the inventory the plugin planned with, and took it.
    assert!(
        node.log()
            .contains("the inventory the NRI plugin planned this container with"),
        "{}",
        node.log()
    );
    let handed: Vec<_> = fs::read_dir(node.root().join("run/nri-inventory"))
        .expect("the plugin's directory for the hooks")
        .collect();
    assert!(handed.is_empty(), "{handed:?}");

    // The hardened policy, read for the next container without a restart.
    node.configure("accept-env-when-unprivileged = false");
    let output = run(
        &mut cri,
        &containerd,
        "mounts",
        pod(&[], &mount_allocation, &[], &[]),
    );
    assert_allocated_gpu_only("volume-mount allocation, hardened policy", &output);
    let output = run(
        &mut cri,
        &containerd,
        "envignored",
        pod(&env_allocation, &[], &[], &[]),
    );
    assert_no_gpu("env of a pod, hardened policy", &output);
    let output = run(&mut cri, &containerd, "nogpu", pod(&[], &[], &[], &[]));
    assert_no_gpu("no allocation, image says all, hardened policy", &output);

    // The kubelet's CDI request (cdi-cri strategy, DRA): containerd applies nvhook's spec, and
    // the plugin leaves the container alone (its NVIDIA_VISIBLE_DEVICES says void).
    let output = run(
        &mut cri,
        &containerd,
        "cdi",
        pod(&[], &[], &cdi_allocation, &[]),
    );
    assert_allocated_gpu_only("CRI CDI device", &output);

    // NVIDIA's pod annotation: nothing in a namespace the config does not list...
    let output = run(
        &mut cri,
        &containerd,
        "annotated",
        pod(&[], &[], &[], &annotation),
    );
    assert_no_gpu("pod annotation, namespace not listed", &output);
    // ...and the device it names in one that is.
    node.configure("nri-annotation-namespaces = [\"default\"]");
    let output = run(
        &mut cri,
        &containerd,
        "trusted",
        pod(&[], &[], &[], &annotation),
    );
    assert_allocated_gpu_only("pod annotation, listed namespace", &output);

    // A GPU the node lacks: this container's creation fails with nvhook's one line.
    let missing = format!("{DEVICE_MOUNT_ROOT}/7");
    let missing_gpu = [(missing.as_str(), "/dev/null")];
    let output = run(
        &mut cri,
        &containerd,
        "nosuchgpu",
        pod(&[], &missing_gpu, &[], &[]),
    );
    assert!(!output.status.success(), "{output}");
    let refusal = output
        .stderr
        .lines()
        .find(|l| l.contains("nvhook: "))
        .unwrap_or_else(|| panic!("no nvhook line in the engine's error\n{output}"));
    assert!(refusal.contains('7'), "{refusal}");
    // The next pod is not affected.
    let output = run(
        &mut cri,
        &containerd,
        "after",
        pod(&[], &mount_allocation, &[], &[]),
    );
    assert_allocated_gpu_only("after a refused container", &output);

    // containerd restarts under the running plugin: it connects again by itself.
    drop(cri);
    assert!(
        containerd.shutdown(),
        "containerd ignored SIGTERM:\n{}",
        containerd.log()
    );
    let mut containerd = setup.start(dir.path(), &[]);
    plugin.wait_registered(&log, 2, &containerd);
    let mut cri = Cri::connect(containerd.socket());
    let output = run(
        &mut cri,
        &containerd,
        "restarted",
        pod(&[], &mount_allocation, &[], &[]),
    );
    assert_allocated_gpu_only("after containerd restarted", &output);

    // The plugin stops: pods without a GPU start as before; a GPU pod starts without its GPU
    // (the engine does not know a plugin it never met), which doctor and the docs warn of.
    plugin.kill();
    let output = run(&mut cri, &containerd, "stopped", pod(&[], &[], &[], &[]));
    assert_no_gpu("no plugin, no allocation", &output);
    let output = run(
        &mut cri,
        &containerd,
        "stoppedgpu",
        pod(&[], &mount_allocation, &[], &[]),
    );
    assert_no_gpu("no plugin, GPU allocated", &output);
    eprintln!("plugin stderr:\n{}", plugin.stderr());

    drop(cri);
    assert!(
        containerd.shutdown(),
        "containerd ignored SIGTERM:\n{}",
        containerd.log()
    );
    assert_no_mounts_left(dir.path(), node.root());
}

/// A hundred GPU pods created at once through the CRI on a 50-GPU node, pod `i` allocated GPU
/// `i % 50` by the device plugin's volume mounts: every one gets exactly its GPU, and once
/// all are gone nothing of them is left on the host.
/// The plugin keeps NVML's answer in memory (issue 24 §3): with no file cache and
/// `nri-mode = "cdi"` (no hook process, which would ask NVML itself), three GPU pods cost one
/// NVML initialisation. When a GPU leaves the bus, the next pod is planned from a new answer:
/// the lost GPU is refused, and the pods after it cost nothing more.
#[test]
fn the_plugin_keeps_nvmls_answer_in_memory_and_follows_the_host() {
    require_root();
    let node = SimNode::create(GPUS);
    node.set("nvml-cache-file", "\"\"")
        .set("nri-mode", "\"cdi\"");
    let Connected {
        dir: _dir,
        containerd,
        image,
        plugin,
        pods,
    } = connected(&node, "nri-memory");
    let mut cri = Cri::connect(containerd.socket());
    let allocated = ALLOCATED.to_string();
    let run = |cri: &mut Cri, name: &str, gpu: &str| {
        let request = ContainerRequest {
            image: &image,
            args: GPUCHECK,
            env: &[("NVIDIA_VISIBLE_DEVICES", gpu)],
            ..Default::default()
        };
        pods.run(cri, &containerd, &node, name, request)
    };
    let before = node.nvml_inits();
    for i in 0..3 {
        let output = run(&mut cri, &format!("memory{i}"), &allocated);
        assert_allocated_gpu_only("a pod planned from memory", &output);
    }
    assert_eq!(node.nvml_inits() - before, 1, "{}", node.log());

    // GPU 3 falls off the bus.
    node.change(&["--gpus", &(GPUS - 1).to_string()]);
    let output = run(&mut cri, "lost", "3");
    assert!(!output.status.success(), "{output}");
    assert!(
        output
            .stderr
            .contains("nvhook: NVIDIA_VISIBLE_DEVICES=3: no such GPU"),
        "{output}"
    );
    assert_eq!(node.nvml_inits() - before, 2, "{}", node.log());
    let output = run(&mut cri, "after", &allocated);
    assert_allocated_gpu_only("a pod after the change", &output);
    assert_eq!(node.nvml_inits() - before, 2, "{}", node.log());
    stop_engine(plugin, cri, containerd);
}

#[test]
fn a_hundred_gpu_pods_at_once_each_get_their_allocated_gpu() {
    const NODE_GPUS: usize = 50;
    const PODS: usize = 100;
    require_root();
    let node = SimNode::create(NODE_GPUS as u32);
    node.configure("accept-env-when-unprivileged = false");
    let Connected {
        dir,
        mut containerd,
        image,
        plugin,
        pods,
    } = connected(&node, "nri-load");
    let mount_points: Vec<String> = (0..NODE_GPUS)
        .map(|g| format!("{DEVICE_MOUNT_ROOT}/{}", node.gpu_uuid(g)))
        .collect();
    let mut args = vec!["/gpucheck".to_owned()];
    for g in 0..NODE_GPUS {
        args.extend(["--dev".to_owned(), format!("/dev/nvidia{g}")]);
    }
    args.extend(["--ls".to_owned(), "/dev".to_owned()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();

    let started = std::time::Instant::now();
    let all_ready = std::sync::Barrier::new(PODS);
    let outputs: Vec<Output> = std::thread::scope(|s| {
        let runs: Vec<_> = (0..PODS)
            .map(|i| {
                let (pods, containerd, node, all_ready) = (&pods, &containerd, &node, &all_ready);
                let (image, args, mount_point) = (&image, &args, &mount_points[i % NODE_GPUS]);
                s.spawn(move || {
                    let mut cri = Cri::connect(containerd.socket());
                    let allocation = [(mount_point.as_str(), "/dev/null")];
                    all_ready.wait();
                    let request = ContainerRequest {
                        image,
                        args,
                        mounts: &allocation,
                        ..Default::default()
                    };
                    pods.run(&mut cri, containerd, node, "load", request)
                })
            })
            .collect();
        runs.into_iter()
            .map(|r| r.join().expect("pod thread"))
            .collect()
    });
    eprintln!(
        "{PODS} GPU pods at once through NRI: {:.2} s to the last exit",
        started.elapsed().as_secs_f64()
    );
    let mut broken = Vec::new();
    for (i, output) in outputs.iter().enumerate() {
        let gpu = i % NODE_GPUS;
        let own = format!("nvidia{gpu}");
        if !output.status.success()
            || output.gpu_nodes_in_dev() != [own.as_str()]
            || !output.has_line(&format!("dev /dev/{own} ENXIO"))
        {
            broken.push(format!("pod {i} (GPU {gpu}):\n{output}"));
        }
    }
    broken.truncate(3);
    assert!(broken.is_empty(), "{}", broken.join("\n"));
    drop(plugin);
    assert!(
        containerd.shutdown(),
        "containerd ignored SIGTERM:\n{}",
        containerd.log()
    );
    drop(pods);
    assert_no_mounts_left(dir.path(), node.root());
}

/// The same pod through the RuntimeClass path (nvhook-runtime, the prestart hook) and through
/// NRI, in its hook and cdi modes (runc or nvhook's hook making the driver files' mounts),
/// sees the same thing: the same entries in the driver's directories, the same device nodes
/// with the same numbers, the same nodes reachable, libcuda from the same file.
#[test]
fn nri_and_the_hook_give_a_container_the_same_view() {
    require_root();
    let node = SimNode::create(GPUS);
    let dir = EngineDir::new("nri-same");
    let mut setup = Containerd2Cri::under(dir.path());
    setup
        .handlers
        .push(("nvidia".into(), support::workspace_bin("nvhook-runtime")));
    let containerd = setup.start(dir.path(), &[("NVHOOK_CONFIG", &node.config())]);
    let image = containerd.import_gpucheck_image(dir.path());
    let pods = Pods::new("nri-same", dir.path());
    let mut args = vec!["/gpucheck"];
    let nodes = [
        "/dev/nvidia0",
        "/dev/nvidia1",
        "/dev/nvidia2",
        "/dev/nvidia3",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset",
    ];
    for n in nodes {
        args.extend(["--dev", n, "--stat", n]);
    }
    for d in [
        "/dev",
        "/usr/bin",
        "/usr/lib/x86_64-linux-gnu",
        "/etc/ld.so.conf.d",
        "/lib/firmware/nvidia",
    ] {
        args.extend(["--ls", d]);
    }
    let uuid = node.gpu_uuid(ALLOCATED as usize);
    let mount_point = format!("{DEVICE_MOUNT_ROOT}/{uuid}");
    let allocation = [(mount_point.as_str(), "/dev/null")];
    let request = || ContainerRequest {
        image: &image,
        args: &args,
        mounts: &allocation,
        ..Default::default()
    };
    let mut cri = Cri::connect(containerd.socket());
    let by = |handler: &str, cri: &mut Cri| {
        let mut output = cri
            .run_pod(
                &unique_name("same"),
                handler,
                &pods.cgroups.path(),
                &pods.logs,
                &request(),
            )
            .output;
        output.hook_log = Some(node.log());
        output.assert_success();
        let mut lines: Vec<String> = output.stdout.lines().map(str::to_owned).collect();
        lines.sort();
        lines
    };
    // The hook first, while no plugin is connected to adjust the container as well.
    let hook = by("nvidia", &mut cri);
    let plugin = NriPlugin::start(&node.config(), &setup.nri.socket, dir.path());
    plugin.wait_registered(&node.log_file(), 1, &containerd);
    // nri-mode = "hook" (the default): the nodes and the prestart hook; then "cdi" with every
    // edit for runc (`cdi-mounts = "runtime"`), and the createRuntime hook; then "cdi" with
    // the driver files' mounts made by that hook (the default) instead of runc.
    for mode in ["hook", "cdi, cdi-mounts = runtime", "cdi"] {
        match mode {
            "hook" => &node,
            "cdi" => node.set("cdi-mounts", "\"hook\""),
            _ => node
                .set("nri-mode", "\"cdi\"")
                .set("cdi-mounts", "\"runtime\""),
        };
        let mounted_by_hooks = node.step_us("mounts").len();
        let nri = by(DEFAULT_HANDLER, &mut cri);
        let diff: Vec<String> = hook
            .iter()
            .filter(|l| !nri.contains(l))
            .map(|l| format!("- {l}"))
            .chain(
                nri.iter()
                    .filter(|l| !hook.contains(l))
                    .map(|l| format!("+ {l}")),
            )
            .collect();
        assert!(
            diff.is_empty(),
            "nri-mode = {mode}: the hook's view (-) and NRI's (+) differ:\n{}\n(node log)\n{}",
            diff.join("\n"),
            node.log()
        );
        // Only the prestart hook and a createRuntime hook told to make them log mounts.
        let made = node.step_us("mounts").len() - mounted_by_hooks;
        let expected = usize::from(mode != "cdi, cdi-mounts = runtime");
        assert_eq!(
            made,
            expected,
            "nri-mode = {mode}: mounts made by nvhook\n{}",
            node.log()
        );
    }
    assert!(
        hook.iter().any(|l| l == "dlopen libcuda.so.1 ok"),
        "{hook:#?}"
    );
    // The cdi modes' hooks read their arguments from nvhook's state directory, one file for
    // each mode's: the links alone, and the links with the files to mount.
    let args_dir = node.root().join("run/hook-args");
    let mut texts: Vec<String> = fs::read_dir(&args_dir)
        .unwrap_or_else(|e| panic!("{}: {e}", args_dir.display()))
        .map(|entry| fs::read_to_string(entry.unwrap().path()).unwrap())
        .collect();
    texts.sort_by_key(|text| text.contains("--bind-files"));
    assert_eq!(texts.len(), 2, "{texts:#?}");
    assert!(
        texts[0].contains("--links\n") && !texts[0].contains("--bind-files"),
        "{texts:#?}"
    );
    assert!(texts[1].contains("--bind-files\n"), "{texts:#?}");
    stop_engine(plugin, cri, containerd);
}

/// `nri-mode = "mounts"`: no hook process at all. runc makes the device nodes and every bind
/// mount; the libraries sit under their SONAMEs in the image's multiarch directory, where a
/// Debian-family loader finds them with no cache entry; the image's own loader cache is not
/// touched, and nothing of nvhook runs in the container's start.
#[test]
fn nri_mode_mounts_gives_the_gpu_with_no_hook_process() {
    require_root();
    let node = SimNode::create(GPUS);
    node.configure("nri-mode = \"mounts\"");
    let Connected {
        dir: _dir,
        containerd,
        image,
        plugin,
        pods,
    } = connected(&node, "nri-mounts");
    let libcuda = "/usr/lib/x86_64-linux-gnu/libcuda.so.1";
    let mut args = GPUCHECK.to_vec();
    args.extend([
        "--exec",
        "/usr/bin/nvidia-smi",
        "--write",
        libcuda,
        "--ls",
        "/usr/lib64",
    ]);
    let uuid = node.gpu_uuid(ALLOCATED as usize);
    let mount_point = format!("{DEVICE_MOUNT_ROOT}/{uuid}");
    let allocation = [(mount_point.as_str(), "/dev/null")];
    let mut cri = Cri::connect(containerd.socket());
    let request = ContainerRequest {
        image: &image,
        args: &args,
        mounts: &allocation,
        ..Default::default()
    };
    let output = pods.run(&mut cri, &containerd, &node, "mounts", request);
    assert_allocated_gpu_only("nri-mode = mounts", &output);
    output.assert_lines(&[
        // Found by the loader's own search, whose first directory is /lib/<multiarch> (a link
        // to /usr/lib on a usr-merged image): a cache entry would have named /usr/lib/...
        "dlopen libcuda.so.1 path /lib/x86_64-linux-gnu/libcuda.so.1",
        &format!("dlopen libcuda.so.1 file {libcuda}"),
        "cuInit 0",
        "exec /usr/bin/nvidia-smi rc=0",
        &format!("write {libcuda} EROFS"),
        // The Fedora family's directory has the same libraries under the same names.
        "ls /usr/lib64 libcuda.so.1",
        "ls /usr/lib64 libnvidia-ml.so.1",
    ]);
    let log = node.log();
    assert!(log.contains("NRI: GPU container adjusted"), "{log}");
    assert!(
        !log.contains("nvhook::hook"),
        "a hook ran in nri-mode = mounts:\n{log}"
    );
    no_allocation_then_stop("mounts", &node, &image, &pods, cri, containerd, plugin);
}

/// `nri-mode = "mounts"` for a CUDA image, whose environment searches /usr/local/nvidia/lib,
/// lib64 and bin: the plugin gathers the driver's files of each such directory into one
/// directory on the host, and runc makes one bind mount of it where it made one per file.
/// The image's loader finds libcuda there through its LD_LIBRARY_PATH, the binaries run, and
/// the directory holds the very names the per-file mounts give any other image. Stopped, the
/// plugin leaves nothing mounted on the host.
#[test]
fn nri_mode_mounts_gathers_the_driver_files_where_a_cuda_image_looks() {
    gathered_where_a_cuda_image_looks("nri-gathered", None, &[]);
}

/// The same on sid's runc 1.3.6.
#[test]
fn nri_mode_mounts_gathers_the_driver_files_on_runc_1_3() {
    gathered_where_a_cuda_image_looks("nri-gathered-13", Some(sid_runtime_bin("runc")), &[]);
}

/// The same with the plugin in a mount namespace of its own, its mounts propagating nowhere,
/// as a DaemonSet's container runs it (with the node's PIDs, `hostPID`): it gathers the files
/// in containerd's namespace, the host's here, which the runtime resolves its mounts in; a
/// SIGTERM unmounts them there.
#[test]
fn nri_mode_mounts_from_a_plugin_in_a_mount_namespace_of_its_own_gathers_in_the_engines() {
    gathered_where_a_cuda_image_looks(
        "nri-gathered-apart",
        None,
        &["unshare", "--mount", "--propagation", "slave"],
    );
}

/// A CUDA image's environment with the plugin in a PID namespace of its own, where it cannot
/// tell which process the engine is (a DaemonSet without `hostPID`): the runtime binds each
/// driver file into the directories the image searches, where the loader and PATH find them.
#[test]
fn nri_mode_mounts_binds_each_file_where_the_engines_pid_is_not_visible() {
    require_root();
    let node = SimNode::create(GPUS);
    node.configure("nri-mode = \"mounts\"");
    let engine = connected_with(
        &node,
        "nri-pid-apart",
        None,
        &[
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            "--kill-child=SIGTERM",
        ],
    );
    let cuda = import_cuda_image(&engine);
    let uuid = node.gpu_uuid(ALLOCATED as usize);
    let mount_point = format!("{DEVICE_MOUNT_ROOT}/{uuid}");
    let mut args = GPUCHECK.to_vec();
    args.extend(["--exec", "/usr/local/nvidia/bin/nvidia-smi"]);
    let request = ContainerRequest {
        image: &cuda,
        args: &args,
        mounts: &[(mount_point.as_str(), "/dev/null")],
        ..Default::default()
    };
    let mut cri = Cri::connect(engine.containerd.socket());
    let output = engine
        .pods
        .run(&mut cri, &engine.containerd, &node, "perfile", request);
    assert_allocated_gpu_only("nri-mode = mounts, the engine unseen", &output);
    output.assert_lines(&[
        "dlopen libcuda.so.1 path /usr/local/nvidia/lib64/libcuda.so.1",
        "cuInit 0",
        "exec /usr/local/nvidia/bin/nvidia-smi rc=0",
    ]);
    let log = node.log();
    assert!(
        log.contains("the engine's pid is not visible here"),
        "{log}"
    );
    assert!(!log.contains("driver files gathered"), "{log}");
    stop_engine(engine.plugin, cri, engine.containerd);
    let leaked = host_mounts_referencing(&[node.root()]);
    assert!(leaked.is_empty(), "driver files still mounted: {leaked:#?}");
}

/// A copy of the glibc image with the environment NVIDIA's CUDA base images set, imported
/// into `engine`'s containerd; its name.
fn import_cuda_image(engine: &Connected) -> String {
    let cuda = format!(
        "docker.io/nvhook-test/{}:latest",
        unique_name("cuda-layout")
    );
    let cuda_env = ImageConfig {
        cmd: &["/gpucheck"],
        env: &[
            "PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
        ],
    };
    engine
        .containerd
        .import_rootfs(engine.dir.path(), glibc_image().rootfs(), &cuda, &cuda_env);
    cuda
}

fn gathered_where_a_cuda_image_looks(name: &str, runc: Option<PathBuf>, wrapper: &[&str]) {
    require_root();
    let node = SimNode::create(GPUS);
    node.configure("nri-mode = \"mounts\"");
    let engine = connected_with(&node, name, runc, wrapper);
    let (containerd, pods) = (&engine.containerd, &engine.pods);
    let cuda = import_cuda_image(&engine);
    let uuid = node.gpu_uuid(ALLOCATED as usize);
    let mount_point = format!("{DEVICE_MOUNT_ROOT}/{uuid}");
    let allocation = [(mount_point.as_str(), "/dev/null")];
    let mut cri = Cri::connect(containerd.socket());
    let listed = |output: &Output, dir: &str| -> Vec<String> {
        let prefix = format!("ls {dir} ");
        output
            .stdout
            .lines()
            .filter_map(|l| l.strip_prefix(&prefix))
            .map(str::to_string)
            .collect()
    };
    let adjusted_mounts = |log: &str| -> Vec<String> {
        log.lines()
            .filter(|l| l.contains("NRI: GPU container adjusted"))
            .filter_map(|l| l.split("mounts=").nth(1))
            .map(|v| v.split_whitespace().next().unwrap_or_default().to_string())
            .collect()
    };

    // Any other image: each library at its SONAME in /usr/lib64 (and the multiarch directory).
    let mut args = GPUCHECK.to_vec();
    args.extend(["--ls", "/usr/lib64", "--ls", "/usr/bin"]);
    let request = ContainerRequest {
        image: &engine.image,
        args: &args,
        mounts: &allocation,
        ..Default::default()
    };
    let per_file = pods.run(&mut cri, containerd, &node, "perfile", request);
    assert_allocated_gpu_only("nri-mode = mounts, per file", &per_file);

    let lib64 = "/usr/local/nvidia/lib64";
    let libcuda = format!("{lib64}/libcuda.so.1");
    let mut args = GPUCHECK.to_vec();
    args.extend([
        "--exec",
        "/usr/local/nvidia/bin/nvidia-smi",
        "--write",
        &libcuda,
        "--ls",
        lib64,
        "--ls",
        "/usr/local/nvidia/bin",
        "--ls",
        "/usr/lib64",
    ]);
    let cuda_pod = |cri: &mut Cri, name: &str| {
        let request = ContainerRequest {
            image: &cuda,
            args: &args,
            mounts: &allocation,
            ..Default::default()
        };
        pods.run(cri, containerd, &node, name, request)
    };
    let gathered = cuda_pod(&mut cri, "gathered");
    assert_allocated_gpu_only("nri-mode = mounts, a CUDA image", &gathered);
    gathered.assert_lines(&[
        // Through LD_LIBRARY_PATH, before any cache or default directory.
        &format!("dlopen libcuda.so.1 path {libcuda}"),
        "cuInit 0",
        "exec /usr/local/nvidia/bin/nvidia-smi rc=0",
        &format!("write {libcuda} EROFS"),
    ]);
    // The same libraries under the same names, in one directory instead of two.
    let libraries = listed(&gathered, lib64);
    assert!(
        libraries.contains(&"libnvidia-ml.so.1".to_string()),
        "{gathered}"
    );
    // /usr/lib64 keeps the image's own files (its loader's link), and no driver file.
    let own = listed(&gathered, "/usr/lib64");
    let per_file_libraries: Vec<String> = listed(&per_file, "/usr/lib64")
        .into_iter()
        .filter(|name| !own.contains(name))
        .collect();
    assert_eq!(libraries, per_file_libraries, "{gathered}\n{per_file}");
    assert!(
        !own.iter().any(|name| libraries.contains(name)),
        "{gathered}"
    );
    let binaries = listed(&gathered, "/usr/local/nvidia/bin");
    assert!(binaries.contains(&"nvidia-smi".to_string()), "{gathered}");
    let per_file_bins = listed(&per_file, "/usr/bin");
    assert!(
        binaries.iter().all(|b| per_file_bins.contains(b)),
        "{binaries:?}"
    );

    // The runtime was handed a bind of each gathered directory instead of its files.
    let log = node.log();
    let counts = adjusted_mounts(&log);
    let [per_file_count, gathered_count] = counts.as_slice() else {
        panic!("two adjusted containers in the log:\n{log}");
    };
    let (per_file_count, gathered_count): (usize, usize) = (
        per_file_count.parse().unwrap(),
        gathered_count.parse().unwrap(),
    );
    // Per file: each library twice (the multiarch directory and /usr/lib64) and each binary
    // once; gathered: one bind for the libraries and one for the binaries.
    assert_eq!(
        gathered_count,
        per_file_count - 2 * libraries.len() - binaries.len() + 2,
        "{per_file_count} mounts per file, {gathered_count} gathered"
    );
    assert!(
        log.contains("NRI: driver files gathered into one directory"),
        "{log}"
    );
    let namespace = match wrapper {
        [] => "the engine shares this plugin's mount namespace",
        _ => {
            "the engine is in another mount namespace: driver directories an image searches are gathered in the engine's"
        }
    };
    assert!(log.contains(namespace), "{log}");
    assert!(!log.contains("nvhook::hook"), "a hook ran:\n{log}");
    // The gathered files are mounted on the host while the plugin runs...
    assert!(!host_mounts_referencing(&[node.root()]).is_empty());
    // ...and made again for the next container when someone unmounted them by hand.
    let gathered_dirs = node.root().join("run/driver-dirs");
    let unmounted = std::process::Command::new("umount")
        .arg("--lazy")
        .arg(&gathered_dirs)
        .status()
        .expect("run umount");
    assert!(unmounted.success(), "umount {}", gathered_dirs.display());
    let again = cuda_pod(&mut cri, "again");
    assert_allocated_gpu_only("nri-mode = mounts, a CUDA image, gathered again", &again);
    again.assert_lines(&[&format!("dlopen libcuda.so.1 path {libcuda}"), "cuInit 0"]);
    // ...and not once it stopped (checked there).
    no_allocation_then_stop(
        "mounts",
        &node,
        &engine.image,
        &engine.pods,
        cri,
        engine.containerd,
        engine.plugin,
    );
}

/// `nri-mode = "cdi-devices"`: the adjustment names the allocated GPU in nvhook's CDI spec
/// (the one `nvhook cdi generate` writes into a directory containerd reads) and carries no OCI
/// hook, which containerd's NRI validator can refuse; containerd injects the device from the
/// spec itself, the spec's createRuntime hook included. A pod with no allocation gets nothing.
#[test]
fn nri_mode_cdi_devices_names_the_gpu_for_containerd_to_inject() {
    require_root();
    let node = SimNode::create(GPUS);
    node.configure("nri-mode = \"cdi-devices\"");
    let Connected {
        dir,
        containerd,
        image,
        plugin,
        pods,
    } = connected(&node, "nri-cdi-devices");
    node.generate_cdi_spec(&dir.path().join("cdi/nvidia.yaml"));
    let uuid = node.gpu_uuid(ALLOCATED as usize);
    let mount_point = format!("{DEVICE_MOUNT_ROOT}/{uuid}");
    let allocation = [(mount_point.as_str(), "/dev/null")];
    let mut cri = Cri::connect(containerd.socket());
    let request = ContainerRequest {
        image: &image,
        args: GPUCHECK,
        mounts: &allocation,
        ..Default::default()
    };
    let output = pods.run(&mut cri, &containerd, &node, "cdi-devices", request);
    assert_allocated_gpu_only("nri-mode = cdi-devices", &output);
    let log = node.log();
    containerd2::assert_injected_from_the_cdi_spec(&log);
    no_allocation_then_stop("cdi-devices", &node, &image, &pods, cri, containerd, plugin);
}

/// The pre-registered form: containerd starts `10-nvhook` from its plugin directory at its
/// own start, with the socket passed and nvhook's config from its plugin config directory;
/// a GPU pod gets its GPU, and when containerd stops the plugin ends with it.
#[test]
fn containerd_starts_nvhook_from_its_plugin_directory() {
    require_root();
    let node = SimNode::create(GPUS);
    let dir = EngineDir::new("nri-pre");
    let setup = Containerd2Cri::under(dir.path());
    fs::create_dir_all(&setup.nri.plugin_dir).expect("make the plugin dir");
    fs::create_dir_all(&setup.nri.plugin_config_dir).expect("make the plugin config dir");
    let plugin = setup.nri.plugin_dir.join("10-nvhook");
    std::os::unix::fs::symlink(nvhook_bin(), &plugin).expect("link nvhook as a plugin");
    // The node's config, handed over by the engine: the plugin runs with no arguments and an
    // empty environment.
    fs::copy(
        node.config(),
        setup.nri.plugin_config_dir.join("10-nvhook.conf"),
    )
    .expect("write the plugin's config");
    let mut containerd = setup.start(dir.path(), &[]);
    let image = containerd.import_gpucheck_image(dir.path());
    let started = std::time::Instant::now();
    while !node.log().contains("using the config the engine passed") {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "containerd did not start nvhook as a plugin\n(node log)\n{}\n(containerd log)\n{}",
            node.log(),
            containerd.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let pods = Pods::new("nri-pre", dir.path());
    let mut cri = Cri::connect(containerd.socket());
    let uuid = node.gpu_uuid(ALLOCATED as usize);
    let env = [("NVIDIA_VISIBLE_DEVICES", uuid.as_str())];
    let request = ContainerRequest {
        image: &image,
        args: GPUCHECK,
        env: &env,
        ..Default::default()
    };
    let output = pods.run(&mut cri, &containerd, &node, "pre", request);
    assert_allocated_gpu_only("pre-registered plugin", &output);
    drop(cri);
    assert!(
        containerd.shutdown(),
        "containerd ignored SIGTERM:\n{}",
        containerd.log()
    );
    // The plugin's process ends with the engine's connection.
    let started = std::time::Instant::now();
    while plugin_running(&plugin) {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "nvhook stayed running after containerd stopped\n{}",
            node.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Whether a process runs from `program` (by its argv[0], as containerd starts plugins).
fn plugin_running(program: &std::path::Path) -> bool {
    let Ok(entries) = fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|e| {
        fs::read(e.path().join("cmdline")).is_ok_and(|c| {
            c.split(|b| *b == 0).next() == Some(program.as_os_str().as_encoded_bytes())
        })
    })
}
