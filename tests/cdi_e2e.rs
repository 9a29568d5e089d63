//! End-to-end tests of nvhook's CDI support on a simulated GPU node: `nvhook cdi generate`
//! and `cdi list`, Podman injecting a device from a generated spec (as root, and rootless as
//! an unprivileged user), and nvhook-runtime's cdi mode under runc (cgroup v1 and v2); and
//! scripts/gpu-node-check.sh's CDI check, from a kit of this build. Run as root after `cargo
//! build --workspace` (for simnode): `cargo test --test cdi_e2e`.
//!
//! On the simulated node no driver sits behind the device nodes, so opening a node the
//! cgroup allows gives ENXIO and one it refuses gives EPERM.

use nvhook_test_support as support;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use serde_json::Value;
use support::engines::{
    Dockerd, DockerdBuild, EngineDir, assert_no_mounts_left, mount_points_below,
    nvhook_runtime_bin, unique_name,
};
use support::hook_mounts::assert_same_view_both_ways;
use support::podman::{CdiSpecFile, Podman};
use support::rootless::{RootlessPodman, processes_of};
use support::{
    Bundle, Output, RuntimeEnv, SimNode, WRITTEN_SEEN_INSIDE, busybox_image, glibc_image,
    gpucheck_args, host_mounts_referencing, host_snapshot, nvhook_bin, owner_args, require_root,
    run_container_with,
};

const GPUS: u32 = 4;
/// Where the simulated driver root keeps libcuda, and so where a CDI spec mounts it.
const LIBCUDA: &str = "/usr/lib/x86_64-linux-gnu/libcuda.so.1";
const NVIDIA_SMI: &str = "/usr/bin/nvidia-smi";

fn generate(node: &SimNode, output: &Path) {
    let output = output.to_str().expect("UTF-8 path");
    node.nvhook(&["cdi", "generate", "--output", output]);
}

/// The names a spec should offer, from `nvhook info`'s inventory (not from the CDI code).
fn expected_names(node: &SimNode, index: bool, uuid: bool) -> Vec<String> {
    let info: Value =
        serde_json::from_str(&node.nvhook(&["info", "--format", "json"])).expect("info is JSON");
    let mut names = Vec::new();
    for gpu in info["gpus"].as_array().expect("gpus") {
        let i = gpu["index"].as_u64().expect("index");
        let mut add = |index_name: String, uuid_name: &Value| {
            if index {
                names.push(format!("nvidia.com/gpu={index_name}"));
            }
            if uuid {
                names.push(format!(
                    "nvidia.com/gpu={}",
                    uuid_name.as_str().expect("uuid")
                ));
            }
        };
        add(i.to_string(), &gpu["uuid"]);
        for mig in gpu["mig_devices"].as_array().expect("mig_devices") {
            add(format!("{i}:{}", mig["index"]), &mig["uuid"]);
        }
    }
    names.push("nvidia.com/gpu=all".into());
    names
}

fn lines(text: &str) -> Vec<String> {
    text.lines().map(str::to_owned).collect()
}

#[test]
fn cdi_generate_and_list_name_every_gpu_and_mig_device() {
    require_root();
    let node = SimNode::create_with(2, &["--mig", "1:2"]);
    let yaml = node.root().join("nvidia.yaml");
    generate(&node, &yaml);
    let text = fs::read_to_string(&yaml).expect("read the spec");
    let spec: serde_norway::Value = serde_norway::from_str(&text).expect("the spec is YAML");
    // Index names start with a digit and the node's device nodes live under its dev root.
    assert_eq!(spec["cdiVersion"].as_str(), Some("0.5.0"), "{text}");
    let listed = node.nvhook(&["cdi", "list", yaml.to_str().expect("UTF-8")]);
    assert_eq!(lines(&listed), expected_names(&node, true, true));

    let json = node.nvhook(&[
        "cdi",
        "generate",
        "--format",
        "json",
        "--device-name-strategy",
        "uuid",
    ]);
    let spec: Value = serde_json::from_str(&json).expect("--format json prints JSON");
    let json_file = node.root().join("nvidia.json");
    fs::write(&json_file, &json).expect("write the JSON spec");
    let listed = node.nvhook(&["cdi", "list", json_file.to_str().expect("UTF-8")]);
    assert_eq!(lines(&listed), expected_names(&node, false, true));
    let hook = &spec["containerEdits"]["hooks"][0];
    assert_eq!(hook["hookName"], "createRuntime", "{json}");
    assert!(
        hook["env"].as_array().is_some_and(|e| !e.is_empty()),
        "{json}"
    );
}

/// `nvhook cdi refresh` writes a spec once, leaves it be (without asking NVML) while the node
/// is unchanged, and replaces it when a GPU falls off the bus.
#[test]
fn cdi_refresh_follows_the_host() {
    let node = SimNode::create(GPUS);
    let spec = node.root().join("run/cdi/nvidia.yaml");
    let path = spec.to_str().unwrap();
    let refresh = || node.nvhook(&["cdi", "refresh", "--output", path]);
    assert!(refresh().starts_with("refreshed "), "{}", node.log());
    let listed = |node: &SimNode| lines(&node.nvhook(&["cdi", "list", path]));
    assert_eq!(listed(&node), expected_names(&node, true, true));
    let inits = || node.nvml_inits();
    let (inode, inits_before) = (std::fs::metadata(&spec).unwrap().ino(), inits());
    assert_eq!(refresh(), format!("unchanged: {path}\n"));
    assert_eq!(
        std::fs::metadata(&spec).unwrap().ino(),
        inode,
        "not rewritten"
    );
    assert_eq!(
        inits(),
        inits_before,
        "an unchanged node costs no NVML query"
    );

    // GPU 3 falls off the bus: gone from NVML, from /proc/driver/nvidia and from /dev.
    let topology_path = node
        .driver_root()
        .join("usr/lib/x86_64-linux-gnu/nvml-topology.json");
    let mut topology: Value =
        serde_json::from_str(&std::fs::read_to_string(&topology_path).unwrap()).unwrap();
    let gone = topology["gpus"].as_array_mut().unwrap().pop().unwrap();
    std::fs::write(&topology_path, topology.to_string()).unwrap();
    let bus = gone["pci_bus_id"].as_str().unwrap()[4..].to_lowercase();
    std::fs::remove_dir_all(node.root().join("proc/driver/nvidia/gpus").join(bus)).unwrap();
    std::fs::remove_file(node.root().join("dev/nvidia3")).unwrap();

    assert!(refresh().starts_with("refreshed "), "{}", node.log());
    let names = listed(&node);
    assert_eq!(names, expected_names(&node, true, true));
    let gone_uuid = format!("nvidia.com/gpu={}", gone["uuid"].as_str().unwrap());
    assert!(!names.contains(&gone_uuid) && !names.contains(&"nvidia.com/gpu=3".to_string()));
    assert_ne!(
        std::fs::metadata(&spec).unwrap().ino(),
        inode,
        "replaced by a rename"
    );
}

#[test]
fn cdi_list_refuses_an_invalid_spec_with_one_line() {
    require_root();
    let node = SimNode::create(1);
    let file = node.root().join("bad.yaml");
    fs::write(
        &file,
        "cdiVersion: 0.6.0\nkind: nvidia.com/gpu\ndevices: []\n",
    )
    .expect("write");
    let output = Command::new(nvhook_bin())
        .args(["cdi", "list"])
        .arg(&file)
        .output()
        .expect("spawn nvhook");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("bad.yaml") && stderr.contains("no devices"),
        "{stderr}"
    );
}

/// `nvhook ARGS...` with no config named; its exit status, stdout and stderr.
fn nvhook_status(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(nvhook_bin())
        .args(args)
        .env_remove("NVHOOK_CONFIG")
        .output()
        .expect("spawn nvhook");
    let text = |b: Vec<u8>| String::from_utf8(b).expect("UTF-8");
    (out.status.code(), text(out.stdout), text(out.stderr))
}

/// Issue 36: a file that is no CDI spec (any text file reads as a YAML string) is named in
/// one short line, exit 1, and its content is not dumped into the error; a spec's own long
/// value is cut as every echoed value is.
#[test]
fn cdi_list_of_a_file_that_is_no_spec_is_one_short_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let passwd = dir.path().join("passwd.json");
    let text: String = (0..200)
        .map(|i| format!("user{i}:x:{i}:{i}:User {i}:/home/user{i}:/bin/sh\n"))
        .collect();
    fs::write(&passwd, text).expect("write");
    let (code, out, err) = nvhook_status(&["cdi", "list", passwd.to_str().unwrap()]);
    assert_eq!(
        err,
        format!(
            "nvhook: cannot parse CDI spec {}: not a CDI spec: the file holds text, where a spec is a mapping of cdiVersion, kind and devices\n",
            passwd.display()
        )
    );
    assert_eq!((code, out.as_str()), (Some(1), ""));

    let long = dir.path().join("long.yaml");
    let value = "y".repeat(10_000);
    fs::write(
        &long,
        format!("cdiVersion: 0.6.0\nkind: nvidia.com/gpu\ndevices: \"{value}\"\n"),
    )
    .expect("write");
    let (code, out, err) = nvhook_status(&["cdi", "list", long.to_str().unwrap()]);
    assert_eq!(
        err,
        format!(
            "nvhook: cannot parse CDI spec {}: devices: invalid type: string \"{}…\" (10000 bytes), expected a sequence at line 3 column 10\n",
            long.display(),
            "y".repeat(64)
        )
    );
    assert_eq!((code, out.as_str()), (Some(1), ""));
}

/// `cdi list` with no spec in the engines' directories is no success: exit 1 and one line
/// saying where it looked and how to make a spec, nothing on stdout.
#[test]
fn cdi_list_without_any_spec_fails_saying_where_and_how() {
    require_root();
    // In a mount namespace of its own, with empty spec directories: the host's stay as they are.
    let script = "for d in /etc/cdi /run/cdi; do [ -d $d ] && mount -t tmpfs none $d; done; exec \"$0\" cdi list";
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c", script])
        .arg(nvhook_bin())
        .env_remove("NVHOOK_CONFIG")
        .output()
        .expect("run unshare");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "nvhook: no CDI spec in /etc/cdi or /var/run/cdi: write one with nvhook cdi generate --output /etc/cdi/nvidia.yaml, or nvhook cdi refresh (it writes /var/run/cdi/nvidia.yaml)\n"
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
}

/// GPU 1 only, the control nodes, a loadable libcuda, and read-only injected files.
#[track_caller]
fn assert_gpu_1_usable(output: &Output) {
    output.assert_gpus(GPUS, &[1]);
    output.assert_control_nodes_allowed();
    output.assert_lines(&[
        "dlopen libcuda.so.1 ok",
        "cuInit 0",
        &format!("write {LIBCUDA} EROFS"),
        &format!("write {NVIDIA_SMI} EROFS"),
    ]);
}

/// Podman with the glibc image, and gpucheck probing every GPU and writing two driver files.
struct PodmanProbe {
    podman: Podman,
    image: String,
    checks: Vec<String>,
}

impl PodmanProbe {
    fn new() -> PodmanProbe {
        let podman = Podman::new();
        let image = format!("localhost/{}:latest", unique_name("nvhook-glibc"));
        podman.import(glibc_image().rootfs(), &image);
        PodmanProbe {
            podman,
            image,
            checks: gpucheck_args(GPUS, &["--write", LIBCUDA, "--write", NVIDIA_SMI]),
        }
    }

    /// `podman run --device DEVICE` of the probe, with `node`'s nvhook log attached.
    fn run(&self, node: &SimNode, device: &str) -> Output {
        let checks: Vec<&str> = self.checks.iter().map(String::as_str).collect();
        let mut output = self.podman.run(&["--device", device], &self.image, &checks);
        output.hook_log = Some(node.log());
        output
    }
}

#[test]
fn podman_runs_a_generated_cdi_device_with_only_that_gpu() {
    require_root();
    let node = SimNode::create(GPUS);
    let spec = CdiSpecFile::new("yaml");
    generate(&node, spec.path());
    let probe = PodmanProbe::new();
    let run = |device: &str| -> Output {
        let output = probe.run(&node, device);
        output.assert_success();
        output
    };
    let output = run("nvidia.com/gpu=1");
    assert_gpu_1_usable(&output);
    let output = run(&format!("nvidia.com/gpu={}", node.gpu_uuid(2)));
    output.assert_gpus(GPUS, &[2]);
    output.assert_lines(&["dlopen libcuda.so.1 ok", "cuInit 0"]);

    let left: Vec<_> = mount_points_below(probe.podman.dir());
    assert!(left.is_empty(), "podman left mounts: {left:?}");
    let leaked = host_mounts_referencing(&[node.root()]);
    assert!(leaked.is_empty(), "driver files still mounted: {leaked:#?}");
}

/// A spec written before a MIG reconfiguration names devices that are no longer what they
/// were (Docker 29's `--gpus` asks such a spec too: moby #52704 is about exactly this). A start
/// through it is refused with nvhook's one line naming the fix, whatever device it asked for,
/// and leaves nothing mounted; after `nvhook cdi refresh` the same device starts, and the new
/// MIG device is there.
#[test]
fn a_start_through_a_spec_written_before_a_mig_change_is_refused_until_refreshed() {
    require_root();
    let node = SimNode::create_with(GPUS, &["--mig", "2:2"]);
    let spec = CdiSpecFile::new("yaml");
    let path = spec.path().to_str().expect("UTF-8 path");
    let refresh = || node.nvhook(&["cdi", "refresh", "--output", path]);
    assert!(refresh().starts_with("refreshed "), "{}", node.log());
    let probe = PodmanProbe::new();
    let run = |device: &str| probe.run(&node, device);
    let before = run("nvidia.com/gpu=1");
    before.assert_success();
    assert_gpu_1_usable(&before);
    assert!(
        !lines(&node.nvhook(&["cdi", "list", path])).contains(&"nvidia.com/gpu=2:2".into()),
        "GPU 2 has two MIG devices, 2:0 and 2:1"
    );

    // MIG on GPU 2 made anew, with three devices; the spec is not refreshed.
    node.change(&["--gpus", &GPUS.to_string(), "--mig", "2:3"]);
    let stale = run("nvidia.com/gpu=1");
    assert!(
        !stale.status.success(),
        "a stale spec's start ran:\n{stale}"
    );
    let said = stale
        .hook_stderr()
        .unwrap_or_else(|| panic!("no hook error in podman's message:\n{stale}"));
    let line = said.lines().next().unwrap_or_default();
    assert!(
        line.starts_with(
            "nvhook: the CDI spec that gave this container its GPUs was written for another GPU layout of this host"
        ) && line.ends_with("run `nvhook cdi refresh` (or `nvhook cdi generate` for a spec kept elsewhere) and start the container again"),
        "{stale}"
    );
    let leaked = host_mounts_referencing(&[node.root()]);
    assert!(leaked.is_empty(), "driver files still mounted: {leaked:#?}");
    // doctor says so, and how to mend it.
    let doctor = Command::new(nvhook_bin())
        .arg("--config")
        .arg(node.config())
        .arg("doctor")
        .output()
        .expect("run nvhook doctor");
    let said = String::from_utf8_lossy(&doctor.stdout);
    let check = said
        .lines()
        .find(|l| l.contains(&format!("CDI {path}: ")))
        .unwrap_or_else(|| panic!("doctor has no line for {path}:\n{said}"));
    assert!(
        check.starts_with("FAIL")
            && check.contains("written for another GPU layout")
            && check.contains("cdi refresh"),
        "{check}"
    );

    assert!(refresh().starts_with("refreshed "), "{}", node.log());
    let after = run("nvidia.com/gpu=1");
    after.assert_success();
    assert_gpu_1_usable(&after);
    run("nvidia.com/gpu=2:2").assert_success();
}

/// `podman run --device nvidia.com/gpu=N` by an unprivileged user (see support/rootless.rs):
/// the runtime bind-mounts the device nodes and driver files, and nvhook's createRuntime
/// hook makes the links and the loader cache as the user namespace's root. With no device
/// cgroup, what the container holds decides what it reaches: the nodes it was given open
/// through to the (absent) driver, ENXIO, and the others are not there to open.
#[test]
fn rootless_podman_runs_a_generated_cdi_device_as_an_unprivileged_user() {
    require_root();
    let host_before = host_snapshot();
    let podman = RootlessPodman::new();
    let node = podman.node(GPUS);
    let spec_name = format!("{}.yaml", unique_name("nvhook-rootless"));
    generate(&node, &podman.cdi_spec_path(&spec_name));
    let image = format!("localhost/{}:latest", unique_name("nvhook-glibc"));
    podman.import(glibc_image().rootfs(), &image);
    let checks = gpucheck_args(GPUS, &["--write", LIBCUDA, "--write", NVIDIA_SMI]);
    let checks: Vec<&str> = checks.iter().map(String::as_str).collect();
    let log = node.root().join("nvhook.log");
    let run = |device: &str| -> Output {
        let mut output = podman.run(&["--device", device], &image, &checks);
        output.hook_log = Some(node.log());
        output.assert_success();
        output
    };

    // A log the user may write shows the hook ran, as the namespace's root, and dropped
    // what it does not need of that root's capabilities.
    let (uid, gid) = podman.user_ids();
    std::os::unix::fs::chown(&log, Some(uid), Some(gid)).expect("chown the log");
    let output = run("nvidia.com/gpu=1");
    output.assert_gpus(GPUS, &[1]);
    output.assert_control_nodes_allowed();
    // The host's root owns the driver files and is no one in the user namespace, whose
    // root may then not write them: refused on permissions before the read-only mount.
    output.assert_lines(&[
        "dlopen libcuda.so.1 ok",
        "cuInit 0",
        &format!("write {LIBCUDA} EACCES"),
        &format!("write {NVIDIA_SMI} EACCES"),
    ]);
    let hook_lines = node.log();
    assert!(
        [
            "NoNewPrivs: 1",
            "links and loader cache done",
            "hook finished"
        ]
        .iter()
        .all(|line| hook_lines.contains(line)),
        "{output}"
    );

    // The node's own log, which the user may not write, costs the hook its log, not the start.
    std::os::unix::fs::chown(&log, Some(0), Some(0)).expect("chown the log");
    let output = run(&format!("nvidia.com/gpu={}", node.gpu_uuid(2)));
    output.assert_gpus(GPUS, &[2]);
    output.assert_lines(&["dlopen libcuda.so.1 ok", "cuInit 0"]);
    assert_eq!(node.log(), hook_lines, "the user wrote root's log");

    let host_cdi = Path::new(CdiSpecFile::DIR).join(&spec_name);
    assert!(
        !host_cdi.exists(),
        "the spec reached the host: {host_cdi:?}"
    );
    same_view_both_ways("rootless Podman 4.3", &podman, &node, &spec_name, &[]);
    drop(podman);
    let left = processes_of(uid);
    assert!(
        left.is_empty(),
        "the test user's processes outlived Podman: {left:?}"
    );
    let leaked = host_mounts_referencing(&[node.root()]);
    assert!(leaked.is_empty(), "driver files still mounted: {leaked:#?}");
    let changed = host_before.diff(&host_snapshot());
    assert!(changed.is_empty(), "the host changed: {changed:#?}");
}

/// sid's rootless Podman 5 over its runc 1.3, with `--userns=nomap`: the user's own id is
/// not mapped in the container; nvhook's createRuntime hook runs as the user, from runc's
/// side, and creates what it writes as the container's root. The container gets exactly its
/// GPU, with what the hook wrote owned by its root, and nothing is left.
#[test]
fn rootless_podman_5_with_userns_nomap_runs_a_generated_cdi_device() {
    require_root();
    let host_before = host_snapshot();
    let podman = RootlessPodman::sid();
    let (uid, _) = podman.user_ids();
    let node = podman.node(GPUS);
    let spec_name = format!("{}.yaml", unique_name("nvhook-nomap"));
    generate(&node, &podman.cdi_spec_path(&spec_name));
    let image = format!("localhost/{}:latest", unique_name("nvhook-glibc"));
    podman.import(glibc_image().rootfs(), &image);
    let mut extra = vec!["--write", LIBCUDA];
    extra.extend(owner_args(&WRITTEN_SEEN_INSIDE));
    let checks = gpucheck_args(GPUS, &extra);
    let checks: Vec<&str> = checks.iter().map(String::as_str).collect();
    let mut output = podman.run(
        &["--userns=nomap", "--device", "nvidia.com/gpu=1"],
        &image,
        &checks,
    );
    output.hook_log = Some(node.log());
    output.assert_success();
    output.assert_gpus(GPUS, &[1]);
    output.assert_lines(&["dlopen libcuda.so.1 ok", "cuInit 0"]);
    output.assert_owned_by_root_inside(&WRITTEN_SEEN_INSIDE);
    same_view_both_ways(
        "rootless Podman 5, --userns=nomap",
        &podman,
        &node,
        &spec_name,
        &["--userns=nomap"],
    );
    drop(podman);
    let left = processes_of(uid);
    assert!(
        left.is_empty(),
        "the test user's processes outlived Podman: {left:?}"
    );
    let leaked = host_mounts_referencing(&[node.root()]);
    assert!(leaked.is_empty(), "driver files still mounted: {leaked:#?}");
    let changed = host_before.diff(&host_snapshot());
    assert!(changed.is_empty(), "the host changed: {changed:#?}");
}

/// The driver files' mounts made by nvhook's hook show a rootless container what the runtime's
/// show it, through specs that replace `spec_name`'s in the user's spec directory.
fn same_view_both_ways(
    engine: &str,
    podman: &RootlessPodman,
    node: &SimNode,
    spec_name: &str,
    flags: &[&str],
) {
    fs::remove_file(podman.cdi_spec_path(spec_name)).expect("remove the first spec");
    let image = format!("localhost/{}:latest", unique_name("nvhook-busybox"));
    podman.import(busybox_image().rootfs(), &image);
    let spec = podman.cdi_spec_path(&format!("{}.json", unique_name("nvhook-view")));
    assert_same_view_both_ways(engine, node, &spec, |args| {
        let mut run_flags = flags.to_vec();
        run_flags.extend(["--device", "nvidia.com/gpu=1"]);
        podman.run(&run_flags, &image, args)
    });
    fs::remove_file(&spec).expect("remove the spec");
}

#[test]
fn nvhook_runtime_cdi_mode_gives_gpu_1_only_cgroup_v1() {
    nvhook_runtime_cdi_mode_gives_gpu_1_only(RuntimeEnv::CgroupV1, "hook");
}

#[test]
fn nvhook_runtime_cdi_mode_gives_gpu_1_only_cgroup_v2() {
    nvhook_runtime_cdi_mode_gives_gpu_1_only(RuntimeEnv::CgroupV2, "hook");
}

#[test]
fn nvhook_runtime_cdi_mode_with_the_runtimes_mounts_gives_gpu_1_only() {
    nvhook_runtime_cdi_mode_gives_gpu_1_only(RuntimeEnv::CgroupV1, "runtime");
}

/// nvhook-runtime with `runtime-mode = "cdi"`: runc makes the nodes and the cgroup rules from
/// config.json, and the driver files' mounts where `cdi-mounts` leaves them to the runtime;
/// nvhook's createRuntime hook makes links and the cache, and the mounts where it is told to.
fn nvhook_runtime_cdi_mode_gives_gpu_1_only(env: RuntimeEnv, mounts_by: &str) {
    require_root();
    let node = SimNode::create(GPUS);
    let config = node.root().join("config-cdi.toml");
    let base = fs::read_to_string(node.config()).expect("read the node's config");
    fs::write(
        &config,
        format!("{base}runtime-mode = \"cdi\"\ncdi-mounts = \"{mounts_by}\"\n"),
    )
    .expect("write config");
    let checks = gpucheck_args(GPUS, &["--write", LIBCUDA, "--write", NVIDIA_SMI]);
    let checks: Vec<&str> = checks.iter().map(String::as_str).collect();
    let mut bundle = Bundle::new(glibc_image(), &checks);
    bundle.env("NVIDIA_VISIBLE_DEVICES=1");
    let mut output = run_container_with(
        &bundle,
        env,
        nvhook_runtime_bin(),
        &[("NVHOOK_CONFIG", &config)],
    );
    output.hook_log = Some(node.log());
    output.assert_success();
    assert_gpu_1_usable(&output);

    let text = fs::read_to_string(bundle.dir().join("config.json")).expect("read config.json");
    let spec: Value = serde_json::from_str(&text).expect("config.json is JSON");
    assert!(spec["hooks"]["prestart"].is_null(), "{text}");
    assert!(spec["hooks"]["createContainer"].is_null(), "{text}");
    let hook = &spec["hooks"]["createRuntime"][0]["args"];
    assert_eq!(hook[4], "createRuntime", "{text}");
    // Its arguments in a file of nvhook's state directory, as a written spec's beside it.
    let args_file = hook[6].as_str().map(std::path::Path::new);
    assert_eq!(hook[5], "--args-file", "{text}");
    assert_eq!(
        args_file.and_then(std::path::Path::parent),
        Some(node.root().join("run/hook-args").as_path()),
        "{text}"
    );
    let env_vars = spec["process"]["env"].as_array().expect("env");
    assert!(
        env_vars.contains(&Value::from("NVIDIA_VISIBLE_DEVICES=void")),
        "{text}"
    );
    let libcuda = Value::from("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15");
    let mounted_by_runc = spec["mounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .any(|m| m["destination"] == libcuda);
    let given_to_the_hook = support::hook_mounts::one_entry_each(hook)
        .iter()
        .any(|a| *a == libcuda);
    assert_eq!(
        (mounted_by_runc, given_to_the_hook),
        (mounts_by == "runtime", mounts_by == "hook"),
        "{text}"
    );
    let leaked = host_mounts_referencing(&[bundle.dir(), node.root()]);
    assert!(leaked.is_empty(), "mounts left on the host: {leaked:#?}");
}

/// IMEX channels are CDI devices of their own kind, as NVIDIA's device plugin asks for them
/// (`nvidia.com/imex-channel=N`), device families one device each (`nvidia.com/gdrcopy=all`):
/// Podman injects them from the specs nvhook writes beside the GPU spec.
#[test]
fn podman_runs_imex_channel_and_family_cdi_devices() {
    require_root();
    let node = SimNode::create_with(GPUS, &["--imex-channels", "2", "--gdrcopy"]);
    let spec = CdiSpecFile::new("yaml");
    generate(&node, spec.path());
    let beside = |class: &str| {
        let stem = spec
            .path()
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        spec.path().with_file_name(format!("{stem}-{class}.yaml"))
    };
    let imex_spec = beside("imex-channel");
    let listed = lines(&node.nvhook(&["cdi", "list", imex_spec.to_str().unwrap()]));
    assert_eq!(
        listed,
        [
            "nvidia.com/imex-channel=0",
            "nvidia.com/imex-channel=1",
            "nvidia.com/imex-channel=all"
        ]
    );
    let gdr_spec = beside("gdrcopy");
    assert_eq!(
        lines(&node.nvhook(&["cdi", "list", gdr_spec.to_str().unwrap()])),
        ["nvidia.com/gdrcopy=all"]
    );
    assert!(!beside("gds").exists(), "the node has no GDS");

    let podman = Podman::new();
    let image = format!("localhost/{}:latest", unique_name("nvhook-glibc"));
    podman.import(glibc_image().rootfs(), &image);
    let dir = "/dev/nvidia-caps-imex-channels";
    let checks = [
        "/gpucheck",
        "--ls",
        dir,
        "--dev",
        "/dev/nvidia-caps-imex-channels/channel1",
        "--dev",
        "/dev/gdrdrv",
    ];
    let devices = [
        "--device",
        "nvidia.com/gpu=1",
        "--device",
        "nvidia.com/imex-channel=1",
        "--device",
        "nvidia.com/gdrcopy=all",
    ];
    let mut output = podman.run(&devices, &image, &checks);
    output.hook_log = Some(node.log());
    output.assert_success();
    output.assert_lines(&[
        &format!("ls {dir} channel1"),
        "dev /dev/nvidia-caps-imex-channels/channel1 ENXIO",
        "dev /dev/gdrdrv ENXIO",
    ]);
    assert!(!output.has_line(&format!("ls {dir} channel0")), "{output}");

    // The channels go away: a refresh retires their spec, so engines stop offering them.
    node.change(&["--gpus", &GPUS.to_string(), "--gdrcopy"]);
    let out = node.nvhook(&["cdi", "refresh", "--output", spec.path().to_str().unwrap()]);
    assert!(
        out.contains(&format!("removed {}", imex_spec.display())),
        "{out}"
    );
    assert!(!imex_spec.exists() && gdr_spec.exists());
}

/// A CDI spec in the shape of NVIDIA's toolkit (tests/fixtures/nvidia-toolkit-cdi.yaml: its
/// createContainer hooks run `nvidia-cdi-hook create-symlinks`, `update-ldcache`,
/// `enable-cuda-compat`, `disable-device-node-modification`), with nvhook linked as
/// `nvidia-cdi-hook` the only hook program, run by Debian sid's dockerd 28 from a private spec
/// directory (`docker run --device nvidia.com/gpu=1`): the container gets its GPU, and libcuda
/// loads from a directory glibc does not search, through the SONAME link and loader cache
/// nvhook wrote (no ldconfig runs).
#[test]
fn nvidia_shaped_cdi_spec_runs_with_nvhook_as_nvidia_cdi_hook() {
    require_root();
    let node = SimNode::create(GPUS);
    let dir = EngineDir::new("nvidia-cdi-spec");
    let hook = dir.path().join("nvidia-cdi-hook");
    std::os::unix::fs::symlink(nvhook_bin(), &hook).expect("link nvidia-cdi-hook");
    let spec_dir = dir.path().join("cdi");
    fs::create_dir(&spec_dir).expect("make the CDI spec directory");
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nvidia-toolkit-cdi.yaml");
    let spec = fs::read_to_string(&fixture)
        .expect("read the fixture")
        .replace("@NODE@", &node.root().display().to_string())
        .replace("@DRIVER_VERSION@", &node.driver_version())
        .replace("@HOOK@", &hook.display().to_string())
        .replace("@CONFIG@", &node.config().display().to_string());
    fs::write(spec_dir.join("nvidia.yaml"), spec).expect("write the spec");
    let daemon_json = dir.path().join("daemon.json");
    let config = serde_json::json!({ "cdi-spec-dirs": [spec_dir] });
    fs::write(&daemon_json, config.to_string()).expect("write daemon.json");
    let mut dockerd = Dockerd::start_with(&DockerdBuild::sid(), dir.path(), &daemon_json, &[]);
    let image = dockerd.import_gpucheck_image(dir.path());

    let checks = gpucheck_args(GPUS, &["--write", NVIDIA_SMI]);
    let run = |device: &str| {
        let mut args = vec!["--rm", "--network", "none", "--device", device, &image];
        args.extend(checks.iter().map(String::as_str));
        let mut output = dockerd.run(&args);
        output.hook_log = Some(node.log());
        output
    };
    let output = run("nvidia.com/gpu=1");
    output.assert_success();
    output.assert_gpus(GPUS, &[1]);
    output.assert_control_nodes_allowed();
    output.assert_lines(&[
        "dlopen libcuda.so.1 ok",
        "cuInit 0",
        &format!("write {NVIDIA_SMI} EROFS"),
    ]);
    let log = node.log();
    assert!(
        log.contains("libraries of a folder") && log.contains("/usr/local/nvidia/lib64"),
        "{log}"
    );
    let output = run("nvidia.com/gpu=all");
    output.assert_success();
    output.assert_gpus(GPUS, &[0, 1, 2, 3]);
    output.assert_lines(&["dlopen libcuda.so.1 ok"]);

    assert!(
        dockerd.shutdown(),
        "dockerd ignored SIGTERM:\n{}",
        dockerd.log()
    );
    assert_no_mounts_left(dir.path(), node.root());
}

/// scripts/gpu-node-check.sh's CDI check, run from a kit made of this build against a
/// simulated node whose driver lives where GKE installs it, as on the H200 that found the
/// cache-less image's defect (performance.md, thirty-first round): the kernel probe loads the
/// host's libcuda through nvhook's spec applied as an engine applies it, in an image without a
/// loader cache and in one with, and every timed start ran (the spec's container on each image).
/// An A/B against a second copy of the build prints each round's paired differences, and
/// the costs check times each part of a view's kernel work and leaves nothing behind.
#[test]
fn gpu_node_checks_cdi_check_runs_containers_through_nvhooks_spec() {
    require_root();
    let node = SimNode::create_with(1, &["--lib-dir", "usr/local/nvidia/lib64"]);
    let dir = tempfile::tempdir().expect("temp dir");
    let image = support::build_glibc_image(
        &dir.path().join("image"),
        support::GlibcImageOptions {
            ldcache: support::LoaderCache::Absent,
            ..Default::default()
        },
    );
    // The check times starts of /bin/true (the image's /bin is its /usr/bin).
    fs::copy("/usr/bin/true", image.rootfs().join("usr/bin/true")).expect("copy true");
    let kit = dir.path().join("kit");
    fs::create_dir(&kit).expect("create the kit");
    support::gpu_kit::make(&kit, &image);
    let out = dir.path().join("out");
    let run = support::gpu_kit::run(&kit, "cdi", &out, &node, &[("ROUNDS", "2")]);
    let report = support::gpu_kit::report(&run, &out, &["cdi-spec.log", "hook-all.log"]);
    assert!(run.status.success(), "{report}");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    let libcuda = format!(
        "dlopen libcuda.so.1 file /usr/local/nvidia/lib64/libcuda.so.{}",
        node.driver_version()
    );
    for image in [
        "-- an image without a loader cache",
        "-- an image with a loader cache",
    ] {
        let at = lines.iter().position(|l| *l == image);
        let probe = lines[at.unwrap_or_else(|| panic!("no {image:?}\n{report}")) + 1..]
            .iter()
            .take_while(|l| !l.starts_with("--") && !l.starts_with("=="));
        let probe: Vec<&str> = probe.copied().collect();
        for want in ["dlopen libcuda.so.1 ok", &libcuda, "cuInit 0"] {
            assert!(probe.contains(&want), "{image}: no {want:?}\n{report}");
        }
    }
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("spec: 3 devices, hooks ['createRuntime']")),
        "{report}"
    );
    // Two rounds of each kind, every one timed (a failed start is written FAIL).
    let starts = fs::read_to_string(out.join("cdi-starts.txt")).expect("read cdi-starts.txt");
    for kind in [
        "plain",
        "cdi-floor",
        "cdi-floor-hook",
        "cdi",
        "cdi-cached",
        "hook-all",
    ] {
        let timed = starts
            .lines()
            .filter_map(|l| l.strip_prefix(kind)?.strip_prefix(' '))
            .filter(|us| us.parse::<u64>().is_ok())
            .count();
        assert_eq!(timed, 2, "{kind}\n{starts}\n{report}");
    }
    for hook in [
        "cdi createRuntime: process=",
        "cdi createRuntime, an image with a loader cache: process=",
        "prestart, every capability: process=",
    ] {
        assert!(
            lines.iter().any(|l| l.starts_with(hook)),
            "{hook}\n{report}"
        );
    }
    // An A/B against another build (this one, under a second path): each round's differences
    // come out, over the floor with a hook and step by step, each a number.
    let other = dir.path().join("other-nvhook");
    fs::copy(nvhook_bin(), &other).expect("copy nvhook");
    let other = other.display().to_string();
    let ab_out = dir.path().join("ab");
    let ab = support::gpu_kit::run(
        &kit,
        "cdi",
        &ab_out,
        &node,
        &[("ROUNDS", "2"), ("OTHER_NVHOOK", &other)],
    );
    let report = support::gpu_kit::report(&ab, &ab_out, &["cdi-spec.log"]);
    assert!(ab.status.success(), "{report}");
    let stdout = String::from_utf8_lossy(&ab.stdout);
    let values = |prefix: &str| -> Vec<String> {
        let line = stdout.lines().find_map(|l| l.strip_prefix(prefix));
        let line = line.unwrap_or_else(|| panic!("no {prefix:?}\n{report}"));
        line.split([' ', ',', '='])
            .filter(|v| v.starts_with(['+', '-']))
            .map(String::from)
            .collect()
    };
    let steps = "hook steps, this build - the other: ";
    for (prefix, count) in [
        ("whole start, this build - the other: ", 1),
        ("over the floor with a hook: ", 2),
        // process, sources, state, request, enter, visit, trees, mounts, image,
        // folders+compat, links+ldcache, proc, and their sum.
        (steps, 13),
    ] {
        let found = values(prefix);
        assert_eq!(found.len(), count, "{prefix}{found:?}\n{report}");
        for v in found {
            assert!(v.parse::<f64>().is_ok(), "{prefix}{v}\n{report}");
        }
    }
    // The kit kept its state (the CDI hook's trees) in its own directory, and left none of it.
    let left = support::engines::mount_points_below(&kit);
    assert!(left.is_empty(), "{left:#?}");
    assert!(!kit.join("state").exists());
    // The costs check: each part of a view's kernel work timed, nothing left mounted or made.
    let costs = support::gpu_kit::run(&kit, "costs", &out, &node, &[]);
    let report = support::gpu_kit::report(&costs, &out, &[]);
    assert!(costs.status.success(), "{report}");
    let timed: Vec<(String, f64)> = String::from_utf8_lossy(&costs.stdout)
        .lines()
        .filter_map(|l| {
            let (part, us) = l.rsplit_once(' ')?;
            Some((part.to_string(), us.parse().ok()?))
        })
        .collect();
    for part in [
        "overlay: copy-up of a lower directory (the first create in it)",
        "overlay: mkdir",
        "overlay: create",
        "overlay: symlink",
        "ext4: create",
        "open_tree clone of a file",
        "mount_setattr ro,nosuid,nodev",
        "move_mount onto a file in overlay",
        "new tmpfs (fsopen to fsmount)",
        "move_mount of a tmpfs onto a directory in overlay",
        "tmpfs: create",
        "tmpfs: mkdir",
        "tmpfs: symlink",
        "move_mount onto a file in a tmpfs",
    ] {
        assert!(
            timed.iter().any(|(name, us)| name == part && *us > 0.0),
            "{part}\n{report}"
        );
    }
    assert!(!kit.join("costs").exists(), "{report}");
    assert!(
        support::host_mounts_referencing(&[kit.as_path()]).is_empty(),
        "{report}"
    );
}
