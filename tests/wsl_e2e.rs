//! GPU containers on a simulated WSL2 host (`simnode create --wsl`): one `/dev/dxg` for every
//! GPU, `libdxcore.so` and NVIDIA's driver store under `/usr/lib/wsl`, an NVML without minor
//! numbers, no NVIDIA kernel module. A glibc container loads libcuda through each way in: the
//! prestart hook, nvhook-runtime's hook and cdi modes, Podman with the CDI spec nvhook
//! generates, and NVIDIA's `nvidia-container-runtime-hook` name. Run as root after
//! `cargo build -p nvhook -p simnode -p mock-nvml -p nvhook-nvml`: `cargo test --test wsl_e2e`.
//!
//! `/dev/dxg` is a misc device with no driver behind it here: an open the cgroup allows gives
//! ENODEV, one it refuses EPERM.

use nvhook_test_support as support;

use std::fs;
use std::os::unix::fs::MetadataExt;

use serde_json::{Value, json};
use support::engines::{nvhook_runtime_bin, unique_name};
use support::hook_mounts::{spec_mounts, write_spec};
use support::podman::{CdiSpecFile, Podman};
use support::{
    Bundle, Output, RuntimeEnv, SimNode, glibc_image, link_to_nvhook, require_root, run_clean,
    run_container_with,
};

const GPUS: u32 = 2;
/// The store simnode makes (its name is Windows' `<inf>_<arch>_<hash>`).
const STORE: &str = "/usr/lib/wsl/drivers/nv_dispi.inf_amd64_3a0b4e5d7c9f2e18";
const DXCORE: &str = "/usr/lib/wsl/lib/libdxcore.so";

fn wsl_node() -> SimNode {
    SimNode::create_with(GPUS, &["--wsl"])
}

/// gpucheck's probes of a WSL2 GPU container.
fn probe() -> Vec<String> {
    let libcuda = format!("{STORE}/libcuda.so.1.1");
    [
        "/gpucheck",
        "--dev",
        "/dev/dxg",
        "--stat",
        "/dev/dxg",
        "--ls",
        "/dev",
        "--ls",
        "/usr/lib/wsl/lib",
        "--ls",
        STORE,
        "--ls",
        "/proc/driver/nvidia",
        "--write",
        &libcuda,
        "--write",
        DXCORE,
        "--dlopen",
        "libnvidia-ml.so.1",
        "--exec",
        "/usr/bin/nvidia-smi",
    ]
    .map(String::from)
    .to_vec()
}

fn probe_bundle(visible: &str) -> Bundle {
    support::compute_bundle_running(&probe(), visible)
}

/// `/dev/dxg` there and usable, nothing of a Linux driver, the store and dxcore read-only at
/// their host paths, nvidia-smi at /usr/bin seeing every GPU, libcuda and NVML loaded by name.
#[track_caller]
fn assert_wsl_gpus(output: &Output, node: &SimNode) {
    output.assert_success();
    let rdev = fs::metadata(node.dev_root().join("dev/dxg"))
        .expect("the node's /dev/dxg")
        .rdev();
    output.assert_lines(&[
        "dlopen libcuda.so.1 ok",
        "cuInit 0",
        &format!("dlopen libcuda.so.1 path {STORE}/libcuda.so.1"),
        &format!("dlopen libnvidia-ml.so.1 ok {STORE}/libnvidia-ml.so.1"),
        "dev /dev/dxg ENODEV",
        &format!(
            "stat /dev/dxg char {}:{}",
            libc::major(rdev),
            libc::minor(rdev)
        ),
        "ls /dev dxg",
        "ls /usr/lib/wsl/lib libdxcore.so",
        &format!("ls {STORE} libcuda.so.1.1"),
        &format!("ls {STORE} libcuda.so.1"),
        &format!("ls {STORE} nvcubins.bin"),
        &format!("ls {STORE} nvapi64.dll"),
        "ls /proc/driver/nvidia absent",
        &format!("write {STORE}/libcuda.so.1.1 EROFS"),
        &format!("write {DXCORE} EROFS"),
        "exec /usr/bin/nvidia-smi rc=0",
    ]);
    for gpu in 0..GPUS as usize {
        let uuid = node.gpu_uuid(gpu);
        output.assert_lines(&[&format!("GPU {gpu}: NVIDIA A100-SXM4-80GB (UUID: {uuid})")]);
    }
    for absent in [
        "ls /dev nvidiactl".to_string(),
        "ls /dev nvidia-uvm".into(),
        "ls /usr/lib/wsl/lib libd3d12.so".into(),
        format!("ls {STORE} nv_dispi.inf"),
        format!("ls {STORE} nvlddmkm.sys"),
    ] {
        assert!(!output.has_line(&absent), "{absent}\n{output}");
    }
    assert!(
        !output
            .stdout
            .lines()
            .any(|l| l.starts_with("ls /dev nvidia")),
        "a /dev/nvidia* node in a WSL2 container\n{output}"
    );
}

#[track_caller]
fn run_hooked(bundle: &mut Bundle, node: &SimNode, env: RuntimeEnv) -> Output {
    bundle.prestart_hook(node);
    let mut output = run_clean(bundle, Some(node), env);
    output.hook_log = Some(node.log());
    output
}

#[test]
fn the_prestart_hook_gives_dxg_and_the_driver_store_cgroup_v1() {
    require_root();
    let node = wsl_node();
    let output = run_hooked(&mut probe_bundle("all"), &node, RuntimeEnv::CgroupV1);
    assert_wsl_gpus(&output, &node);
}

#[test]
fn the_prestart_hook_gives_dxg_and_the_driver_store_cgroup_v2() {
    require_root();
    let node = wsl_node();
    let output = run_hooked(&mut probe_bundle("all"), &node, RuntimeEnv::CgroupV2);
    assert_wsl_gpus(&output, &node);
}

/// Without nvhook's rule the runtime's own device program refuses `/dev/dxg`: the ENODEV above
/// is the hook's cgroup rule at work, not an open device policy.
#[test]
fn dxg_without_the_hook_is_refused_by_the_cgroup() {
    require_root();
    let node = wsl_node();
    let rdev = fs::metadata(node.dev_root().join("dev/dxg"))
        .unwrap()
        .rdev();
    let mut bundle = Bundle::new(glibc_image(), &["/gpucheck", "--dev", "/dev/dxg"]);
    bundle.extra_device("/dev/dxg", libc::major(rdev), libc::minor(rdev));
    for env in [RuntimeEnv::CgroupV1, RuntimeEnv::CgroupV2] {
        let output = run_clean(&bundle, None, env);
        output.assert_success();
        output.assert_lines(&["dev /dev/dxg EPERM"]);
    }
}

#[test]
fn some_gpus_are_refused_in_one_line_naming_wsl_and_the_fix() {
    require_root();
    let node = wsl_node();
    let output = run_hooked(&mut probe_bundle("0"), &node, RuntimeEnv::CgroupV1);
    output.assert_refused_by_hook(
        "nvhook: NVIDIA_VISIBLE_DEVICES=0: on WSL2 every GPU is reached through the one /dev/dxg, so a container cannot be given some of them (ask for all: NVIDIA_VISIBLE_DEVICES=all)",
    );
}

#[test]
fn no_gpu_gets_no_dxg() {
    require_root();
    let node = wsl_node();
    let output = run_hooked(&mut probe_bundle("none"), &node, RuntimeEnv::CgroupV1);
    output.assert_success();
    output.assert_lines(&["dev /dev/dxg absent"]);
}

/// nvhook-runtime in `mode` ("hook" or "cdi") with the node's config.
fn through_nvhook_runtime(mode: &str, env: RuntimeEnv) {
    require_root();
    let node = wsl_node();
    let config = node.root().join(format!("config-{mode}.toml"));
    let base = fs::read_to_string(node.config()).expect("read the node's config");
    fs::write(&config, format!("{base}runtime-mode = \"{mode}\"\n")).expect("write config");
    let bundle = probe_bundle("all");
    let mut output = run_container_with(
        &bundle,
        env,
        nvhook_runtime_bin(),
        &[("NVHOOK_CONFIG", &config)],
    );
    output.hook_log = Some(node.log());
    assert_wsl_gpus(&output, &node);
    let text = fs::read_to_string(bundle.dir().join("config.json")).expect("read config.json");
    let spec: Value = serde_json::from_str(&text).expect("config.json is JSON");
    let devices = spec["linux"]["devices"].as_array().expect("linux.devices");
    let paths: Vec<&str> = devices.iter().filter_map(|d| d["path"].as_str()).collect();
    assert_eq!(paths, ["/dev/dxg"], "{text}");
}

#[test]
fn nvhook_runtime_hook_mode_gives_dxg_and_the_driver_store() {
    through_nvhook_runtime("hook", RuntimeEnv::CgroupV1);
}

#[test]
fn nvhook_runtime_cdi_mode_gives_dxg_and_the_driver_store_cgroup_v1() {
    through_nvhook_runtime("cdi", RuntimeEnv::CgroupV1);
}

#[test]
fn nvhook_runtime_cdi_mode_gives_dxg_and_the_driver_store_cgroup_v2() {
    through_nvhook_runtime("cdi", RuntimeEnv::CgroupV2);
}

/// `nvhook cdi generate` on WSL2 names one device, `all` (as NVIDIA's WSL spec), holding
/// `/dev/dxg`; the driver's files and the createRuntime hook are the spec-wide edits, the
/// files as the runtime's mounts or as the hook's (`cdi-mounts`), and Podman runs either.
#[test]
fn the_cdi_spec_names_all_alone_and_podman_runs_it() {
    require_root();
    let node = wsl_node();
    let podman = Podman::new();
    let image = format!("localhost/{}:latest", unique_name("nvhook-glibc"));
    podman.import(glibc_image().rootfs(), &image);
    for mounts_by in ["runtime", "hook"] {
        let spec_file = CdiSpecFile::new("json");
        let spec = write_spec(&node, mounts_by, spec_file.path());
        let text = spec.to_string();
        let devices = spec["devices"].as_array().expect("devices");
        assert_eq!(devices.len(), 1, "{text}");
        assert_eq!(devices[0]["name"], "all", "{text}");
        let nodes = &devices[0]["containerEdits"]["deviceNodes"];
        assert_eq!(nodes.as_array().map(Vec::len), Some(1), "{text}");
        assert_eq!(nodes[0]["path"], "/dev/dxg", "{text}");
        let common = &spec["containerEdits"];
        assert!(common["deviceNodes"].is_null(), "{text}");
        let mounts = spec_mounts(&spec);
        let [hook] = common["hooks"].as_array().expect("hooks").as_slice() else {
            panic!("one hook: {text}")
        };
        let hook_args = support::hook_mounts::one_entry_each(&hook["args"]);
        let hook_args: Vec<&str> = hook_args.iter().map(String::as_str).collect();
        // The files' container paths: the mounts', or each `--bind-*` argument's second path
        // (its groups written out one entry each).
        let files: Vec<&str> = match mounts_by {
            "runtime" => mounts
                .iter()
                .filter_map(|m| m["containerPath"].as_str())
                .collect(),
            _ => hook_args
                .windows(3)
                .filter(|w| w[0].starts_with("--bind-"))
                .map(|w| w[2])
                .collect(),
        };
        assert!(files.contains(&DXCORE), "{text}");
        assert!(
            files.iter().all(|m| m.starts_with("/usr/lib/wsl/")),
            "{text}"
        );
        assert_eq!(mounts.is_empty(), mounts_by == "hook", "{text}");
        for mount in &mounts {
            assert_eq!(
                mount["options"],
                json!(["ro", "nosuid", "nodev", "rbind", "rprivate"]),
                "{text}"
            );
        }

        let args = probe();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut output = podman.run(&["--device", "nvidia.com/gpu=all"], &image, &args);
        output.hook_log = Some(node.log());
        assert_wsl_gpus(&output, &node);
    }
}

/// Docker's `--gpus` runs `nvidia-container-runtime-hook prestart`: the same container through
/// that name, linked to nvhook, with runc.
#[test]
fn nvidia_container_runtime_hook_gives_dxg_and_the_driver_store() {
    require_root();
    let node = wsl_node();
    let bin = tempfile::tempdir().expect("a directory for NVIDIA's names");
    link_to_nvhook(bin.path(), &["nvidia-container-runtime-hook"]);
    let config = node.config();
    let mut bundle = probe_bundle("all");
    bundle.raw_prestart_hook(json!({
        "path": bin.path().join("nvidia-container-runtime-hook"),
        "args": ["nvidia-container-runtime-hook", "prestart"],
        "env": [
            "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
            format!("NVHOOK_CONFIG={}", config.display()),
        ],
        "timeout": 30,
    }));
    let mut output = run_clean(&bundle, Some(&node), RuntimeEnv::CgroupV1);
    output.hook_log = Some(node.log());
    assert_wsl_gpus(&output, &node);

    let mut refused = probe_bundle("1");
    refused.raw_prestart_hook(json!({
        "path": bin.path().join("nvidia-container-runtime-hook"),
        "args": ["nvidia-container-runtime-hook", "prestart"],
        "env": [format!("NVHOOK_CONFIG={}", config.display())],
        "timeout": 30,
    }));
    let output = run_clean(&refused, Some(&node), RuntimeEnv::CgroupV1);
    let stderr = output.hook_stderr().unwrap_or_default();
    assert!(
        stderr.contains("NVIDIA_VISIBLE_DEVICES=1: on WSL2")
            && stderr.contains("(ask for all: NVIDIA_VISIBLE_DEVICES=all)"),
        "{output}"
    );
}

/// `nvhook doctor` and `nvhook labels` on WSL2: no device-node checks that cannot apply.
#[test]
fn doctor_and_labels_say_wsl() {
    require_root();
    let node = wsl_node();
    let labels = node.nvhook(&["labels"]);
    assert!(labels.contains("nvidia.com/gpu.count=2"), "{labels}");
    let doctor = support::run_nvhook(&["--config", node.config().to_str().unwrap(), "doctor"]);
    let text = String::from_utf8_lossy(&doctor.stdout);
    assert!(text.contains("WSL2"), "{text}");
    assert!(!text.contains("/dev/nvidiactl"), "{text}");
    assert!(!text.contains("nvidia-uvm"), "{text}");
}
