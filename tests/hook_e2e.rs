//! End-to-end tests of `nvhook hook prestart`: real runc containers on a
//! simulated 4-GPU node, under cgroup v1 and v2. Run as root after
//! `cargo build --workspace` (for simnode): `cargo test --test hook_e2e`.
//!
//! On the simulated node no driver sits behind the device nodes, so opening a
//! node the cgroup allows gives ENXIO and one it refuses gives EPERM.

use nvhook_test_support as support;
use std::os::unix::fs::PermissionsExt;

use support::{
    Bpffs, Bundle, Image, Output, RuntimeEnv, SimNode, busybox_image, glibc_image,
    glibc_image_with_fake_libcuda, gpucheck_args, host_mounts_referencing, require_root, run_clean,
    tree_listing,
};

const GPUS: u32 = 4;
const NVIDIA_MAJOR: u32 = 195;
const LIBCUDA: &str = "/usr/lib/x86_64-linux-gnu/libcuda.so.1";
const NVIDIA_SMI: &str = "/usr/bin/nvidia-smi";
fn gpucheck_bundle(image: &Image, extra: &[&str]) -> Bundle {
    let args = gpucheck_args(GPUS, extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Bundle::new(image, &args)
}

/// Runs a GPU container with nvhook and prints the hook's log on failure.
#[track_caller]
fn run_with_hook(bundle: &mut Bundle, node: &SimNode, env: RuntimeEnv) -> Output {
    bundle.prestart_hook(node);
    let output = run_clean(bundle, Some(node), env);
    output.assert_success();
    output
}

fn nvidia_entries_in_dev(output: &Output) -> Vec<&str> {
    output
        .stdout
        .lines()
        .filter(|line| line.starts_with("ls /dev nvidia"))
        .collect()
}

// ---- plain runc, no hook, no GPU: these validate the harness itself ----

#[test]
fn smoke_glibc_image_runs_gpucheck_cgroup_v1() {
    smoke_glibc(RuntimeEnv::CgroupV1);
}

#[test]
fn smoke_glibc_image_runs_gpucheck_cgroup_v2() {
    smoke_glibc(RuntimeEnv::CgroupV2);
}

/// A node placed in linux.devices is refused (EPERM) without a cgroup rule and
/// reachable (ENXIO: no driver) with one, under the runtime's own device
/// controller: the contrast the GPU tests rely on.
fn smoke_glibc(env: RuntimeEnv) {
    let mut bundle = Bundle::new(
        glibc_image(),
        &[
            "/gpucheck",
            "--dev",
            "/dev/nvidia0",
            "--dev",
            "/dev/nvidia1",
            "--stat",
            "/dev/nvidia1",
            "--ls",
            "/dev",
            "--ls",
            "/sys/fs/cgroup",
        ],
    );
    bundle
        .extra_device("/dev/nvidia0", NVIDIA_MAJOR, 0)
        .extra_device("/dev/nvidia1", NVIDIA_MAJOR, 1)
        .allow_device(NVIDIA_MAJOR, 1);
    let output = run_clean(&bundle, None, env);
    output.assert_success();
    output.assert_lines(&[
        "dev /dev/nvidia0 EPERM",
        "dev /dev/nvidia1 ENXIO",
        "stat /dev/nvidia1 char 195:1",
        "ls /dev null",
    ]);
    // Proves which hierarchy the container really got.
    let hierarchy_marker = match env {
        RuntimeEnv::CgroupV1 => "ls /sys/fs/cgroup devices",
        RuntimeEnv::CgroupV2 => "ls /sys/fs/cgroup cgroup.controllers",
    };
    output.assert_lines(&[hierarchy_marker]);
    assert!(
        output
            .stdout
            .starts_with("dlopen libcuda.so.1 fail libcuda.so.1: cannot open shared object file"),
        "{output}"
    );
}

#[test]
fn smoke_fake_libcuda_image_loads_its_own_library() {
    let bundle = Bundle::new(glibc_image_with_fake_libcuda(), &["/gpucheck"]);
    let output = run_clean(&bundle, None, RuntimeEnv::CgroupV1);
    output.assert_success();
    output.assert_lines(&["dlopen libcuda.so.1 ok", "cuInit 999"]);
}

#[test]
fn smoke_busybox_image_runs_shell() {
    let bundle = Bundle::new(
        busybox_image(),
        &[
            "sh",
            "-c",
            "ls /dev; test -e /etc/ld.so.cache || echo no-cache",
        ],
    );
    let output = run_clean(&bundle, None, RuntimeEnv::CgroupV1);
    output.assert_success();
    output.assert_lines(&["null", "no-cache"]);
}

#[test]
fn smoke_container_without_hook_leaves_rootfs_unchanged() {
    let bundle = Bundle::new(glibc_image(), &["/gpucheck", "--ls", "/"]);
    let before = tree_listing(bundle.rootfs());
    let output = run_clean(&bundle, None, RuntimeEnv::CgroupV1);
    output.assert_success();
    output.assert_lines(&["ls / gpucheck", "ls / lib64"]);
    assert_eq!(before, tree_listing(bundle.rootfs()));
}

#[test]
fn smoke_host_mount_table_helper_sees_a_bind_mount() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let target = dir.path().join("target");
    std::fs::create_dir(&target).expect("mkdir");
    let mount = |args: &[&str]| {
        let status = std::process::Command::new("mount")
            .args(args)
            .status()
            .expect("spawn mount");
        assert!(status.success(), "mount {args:?} failed");
    };
    let target_str = target.to_str().expect("utf-8 path");
    mount(&["--bind", "/proc/self", target_str]);
    let seen = host_mounts_referencing(&[dir.path()]);
    let status = std::process::Command::new("umount")
        .arg(&target)
        .status()
        .expect("spawn umount");
    assert!(status.success(), "umount failed");
    assert_eq!(seen.len(), 1, "{seen:#?}");
    assert!(host_mounts_referencing(&[dir.path()]).is_empty());
}

// ---- nvhook as the prestart hook on a simulated 4-GPU node ----

#[test]
fn visible_devices_1_3_cgroup_v1() {
    visible_devices_1_3(RuntimeEnv::CgroupV1);
}

#[test]
fn visible_devices_1_3_cgroup_v2() {
    visible_devices_1_3(RuntimeEnv::CgroupV2);
}

fn visible_devices_1_3(env: RuntimeEnv) {
    let node = SimNode::create(GPUS);
    let checks = [
        "--stat",
        "/dev/nvidia1",
        "--stat",
        "/dev/nvidia3",
        "--write",
        LIBCUDA,
        "--write",
        NVIDIA_SMI,
    ];

    let mut bundle = gpucheck_bundle(glibc_image(), &checks);
    bundle.env("NVIDIA_VISIBLE_DEVICES=1,3");
    let output = run_with_hook(&mut bundle, &node, env);
    output.assert_gpus(GPUS, &[1, 3]);
    output.assert_control_nodes_allowed();
    output.assert_lines(&[
        "stat /dev/nvidia1 char 195:1",
        "stat /dev/nvidia3 char 195:3",
        "dlopen libcuda.so.1 ok",
        "cuInit 0",
        &format!("write {LIBCUDA} EROFS"),
        &format!("write {NVIDIA_SMI} EROFS"),
    ]);

    // The runtime creates nvidia0 itself but no rule allows it: the hook's
    // rules must cover the selected GPUs only.
    let mut bundle = gpucheck_bundle(glibc_image(), &checks);
    bundle
        .env("NVIDIA_VISIBLE_DEVICES=1,3")
        .extra_device("/dev/nvidia0", NVIDIA_MAJOR, 0);
    let output = run_with_hook(&mut bundle, &node, env);
    output.assert_lines(&[
        "dev /dev/nvidia0 EPERM",
        "dev /dev/nvidia1 ENXIO",
        "dev /dev/nvidia3 ENXIO",
    ]);
    output.assert_lines(&["dev /dev/nvidia2 absent", "cuInit 0"]);
    assert_hook_kept_only_its_capabilities(&node);
}

/// On a kernel before Linux 6.15, which lacks `open_tree_attr`, the hook clones each driver
/// file and seals it read-only in two calls instead of one: the container still gets its
/// GPU's libraries, loaded, and read-only. Most nodes run such kernels; simnode's `old-kernel`
/// makes the call fail with ENOSYS for the hook, as they do.
#[test]
fn a_kernel_without_open_tree_attr_gets_the_same_read_only_driver_files() {
    let node = SimNode::create(GPUS);
    let checks = ["--write", LIBCUDA, "--write", NVIDIA_SMI];
    let mut bundle = gpucheck_bundle(glibc_image(), &checks);
    bundle.env("NVIDIA_VISIBLE_DEVICES=1");
    let simnode = support::simnode_bin();
    let args = [
        &simnode.display().to_string(),
        "old-kernel",
        &node.hook().display().to_string(),
        "--config",
        &node.config().display().to_string(),
        "hook",
        "prestart",
    ]
    .map(String::from);
    bundle.prestart_command(&simnode, &args);
    let output = run_clean(&bundle, Some(&node), RuntimeEnv::CgroupV2);
    output.assert_only_gpu_with_read_only_driver(GPUS, 1, LIBCUDA);
    // The container's root could write a file the mount left writable.
    output.assert_lines(&[
        &format!("write {LIBCUDA} EROFS"),
        &format!("write {NVIDIA_SMI} EROFS"),
    ]);
}

/// cgroup v2 on a node with a bpffs for `device-program-pins`: the first container's hook
/// loads its device program and keeps it, the next on the same GPU attaches that one, and
/// each reaches GPU 1 and not GPU 0. One on other GPUs gets a program of its own.
#[test]
fn the_next_container_on_the_same_gpus_attaches_the_kept_device_program() {
    let node = SimNode::create(GPUS);
    let bpffs = Bpffs::mount();
    node.set(
        "device-program-pins",
        &format!("{:?}", bpffs.path().join("nvhook")),
    );
    let start = |gpus: &str| {
        let mut bundle = gpucheck_bundle(glibc_image(), &[]);
        bundle
            .env(&format!("NVIDIA_VISIBLE_DEVICES={gpus}"))
            .extra_device("/dev/nvidia0", NVIDIA_MAJOR, 0);
        run_with_hook(&mut bundle, &node, RuntimeEnv::CgroupV2)
    };
    for _ in 0..2 {
        start("1").assert_lines(&["dev /dev/nvidia0 EPERM", "dev /dev/nvidia1 ENXIO"]);
    }
    let reused = |log: &str| -> Vec<bool> {
        log.lines()
            .filter(|l| l.contains("replaced device program"))
            .map(|l| l.contains("reused=true"))
            .collect()
    };
    assert_eq!(reused(&node.log()), [false, true], "{}", node.log());
    assert_eq!(bpffs.entries("nvhook").len(), 1, "one program kept");

    start("2,3").assert_lines(&[
        "dev /dev/nvidia0 EPERM",
        "dev /dev/nvidia1 absent",
        "dev /dev/nvidia2 ENXIO",
        "dev /dev/nvidia3 ENXIO",
    ]);
    assert_eq!(reused(&node.log()), [false, true, false]);
    assert_eq!(bpffs.entries("nvhook").len(), 2);
}

/// The config as parsed is kept between starts once its file has settled, and an edit to the
/// file applies to the very next container all the same.
#[test]
fn an_edited_config_applies_to_the_next_container_after_a_kept_one() {
    let node = SimNode::create(GPUS);
    let start = || {
        let mut bundle = gpucheck_bundle(glibc_image(), &[]);
        bundle.env("NVIDIA_VISIBLE_DEVICES=1");
        run_with_hook(&mut bundle, &node, RuntimeEnv::CgroupV1)
            .assert_lines(&["dev /dev/nvidia1 ENXIO"]);
    };
    // Kept only once the file has not changed for two seconds.
    std::thread::sleep(std::time::Duration::from_millis(2100));
    start();
    let config = node.config();
    let kept = std::fs::read_dir("/run/nvhook/config")
        .expect("a settled config is kept in /run/nvhook/config")
        .flatten()
        .map(|e| e.path())
        .find(|path| {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            serde_json::from_str::<serde_json::Value>(&text)
                .is_ok_and(|v| v["path"] == config.to_str().unwrap())
        })
        .unwrap_or_else(|| panic!("no kept config for {}", config.display()));
    let mode = std::fs::metadata(&kept).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{}", kept.display());
    let mut stored: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&kept).unwrap()).unwrap();
    assert_eq!(
        stored["config"]["log-file"],
        node.log_file().to_str().unwrap()
    );

    // The next start reads what was kept, not the TOML: a kept log level of warn (written here
    // as no nvhook would) leaves its info lines out of the log.
    let finished = || node.log().matches("hook finished").count();
    stored["config"]["log-level"] = "warn".into();
    std::fs::write(&kept, serde_json::to_vec(&stored).unwrap()).unwrap();
    let before = finished();
    start();
    assert_eq!(finished(), before, "{}", node.log());

    // The file edited: the next start parses it.
    node.set("log-level", "\"info\"");
    start();
    assert_eq!(finished(), before + 1, "{}", node.log());
}

/// The capabilities the hook's work needs (capabilities(7) numbers): DAC_OVERRIDE,
/// DAC_READ_SEARCH, FOWNER, IPC_LOCK, SYS_CHROOT, SYS_PTRACE, SYS_ADMIN, SYS_RESOURCE, MKNOD,
/// BPF. Everything else runc handed it (SETUID, SYS_MODULE, NET_ADMIN, ...) is gone.
const HOOK_CAPABILITIES: [u32; 10] = [1, 2, 3, 14, 18, 19, 21, 24, 27, 39];

/// What the kernel said of the hook after it dropped the rest (its debug log line, read from
/// /proc/self/status): those capabilities, effective and bounding, and no_new_privs. Of those,
/// only what this test process may have itself: a sandbox may hold fewer than root's all.
#[track_caller]
fn assert_hook_kept_only_its_capabilities(node: &SimNode) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let own = status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .expect("CapBnd in /proc/self/status");
    let mask = HOOK_CAPABILITIES.iter().fold(0u64, |m, bit| m | 1 << bit) & own;
    let want = format!("CapEff: {mask:016x}, CapBnd: {mask:016x}, NoNewPrivs: 1");
    let log = node.log();
    let kept: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("capabilities kept"))
        .collect();
    assert!(
        !kept.is_empty(),
        "no capability line in the hook's log:\n{log}"
    );
    for line in kept {
        assert!(line.contains(&want), "want {want}, got {line}");
    }
}

#[test]
fn capability_utility_brings_nvidia_smi_but_not_libcuda() {
    let node = SimNode::create(GPUS);
    let mut bundle = gpucheck_bundle(glibc_image(), &["--exec", NVIDIA_SMI]);
    bundle
        .env("NVIDIA_VISIBLE_DEVICES=0")
        .env("NVIDIA_DRIVER_CAPABILITIES=utility");
    let output = run_with_hook(&mut bundle, &node, RuntimeEnv::CgroupV1);
    assert!(output.stdout.contains("NVIDIA-SMI simulated"), "{output}");
    output.assert_lines(&[&format!("exec {NVIDIA_SMI} rc=0")]);
    assert!(
        output.stdout.starts_with("dlopen libcuda.so.1 fail"),
        "{output}"
    );
    output.assert_gpus(GPUS, &[0]);
}

#[test]
fn visible_devices_none_gives_driver_but_no_gpu() {
    let node = SimNode::create(GPUS);
    let mut bundle = gpucheck_bundle(glibc_image(), &[]);
    bundle.env("NVIDIA_VISIBLE_DEVICES=none");
    let output = run_with_hook(&mut bundle, &node, RuntimeEnv::CgroupV1);
    output.assert_gpus(GPUS, &[]);
    output.assert_lines(&[
        "dev /dev/nvidiactl ENXIO",
        "dlopen libcuda.so.1 ok",
        "cuInit 0",
    ]);
}

#[test]
fn visible_devices_all_gives_every_gpu() {
    let node = SimNode::create(GPUS);
    let mut bundle = gpucheck_bundle(glibc_image(), &[]);
    bundle.env("NVIDIA_VISIBLE_DEVICES=all");
    let output = run_with_hook(&mut bundle, &node, RuntimeEnv::CgroupV1);
    output.assert_gpus(GPUS, &[0, 1, 2, 3]);
    output.assert_control_nodes_allowed();
}

#[test]
fn visible_devices_by_uuid_gives_that_gpu() {
    let node = SimNode::create(GPUS);
    let mut bundle = gpucheck_bundle(glibc_image(), &[]);
    // simnode gives GPU i the minor number i.
    bundle.env(&format!("NVIDIA_VISIBLE_DEVICES={}", node.gpu_uuid(2)));
    let output = run_with_hook(&mut bundle, &node, RuntimeEnv::CgroupV1);
    output.assert_gpus(GPUS, &[2]);
}

/// The kernel probe that scripts/gpu-node-check.sh runs on a real GPU, run in a container on
/// the simulated node: it finds the injected driver and names the first driver API entry point
/// the simulated libcuda (cuInit only) lacks, in one line, instead of crashing.
#[test]
fn the_kernel_probe_names_what_the_simulated_driver_lacks() {
    let node = SimNode::create(GPUS);
    let mut bundle = gpucheck_bundle(glibc_image(), &["--kernel", "64"]);
    bundle.env("NVIDIA_VISIBLE_DEVICES=0");
    let output = run_with_hook(&mut bundle, &node, RuntimeEnv::CgroupV1);
    output.assert_lines(&["dlopen libcuda.so.1 ok", "kernel unsupported cuDeviceGet"]);
}

#[test]
fn injected_libcuda_wins_over_the_image_own_copy() {
    let node = SimNode::create(GPUS);
    let mut bundle = gpucheck_bundle(glibc_image_with_fake_libcuda(), &[]);
    bundle.env("NVIDIA_VISIBLE_DEVICES=0");
    let output = run_with_hook(&mut bundle, &node, RuntimeEnv::CgroupV1);
    output.assert_lines(&["dlopen libcuda.so.1 ok", "cuInit 0"]);
}

#[test]
fn busybox_image_gets_nvidia_smi_and_gpu_node() {
    let node = SimNode::create(GPUS);
    let mut bundle = Bundle::new(busybox_image(), &["sh", "-c", "ls /dev; nvidia-smi"]);
    bundle.env("NVIDIA_VISIBLE_DEVICES=0");
    let output = run_with_hook(&mut bundle, &node, RuntimeEnv::CgroupV1);
    output.assert_lines(&["nvidia0"]);
    assert!(output.stdout.contains("NVIDIA-SMI simulated"), "{output}");
}

/// The simulated nvidia-smi, like the real one, lists the GPUs the container can open,
/// numbered from 0 in its own view.
#[test]
fn nvidia_smi_lists_only_the_gpus_the_container_was_given() {
    let node = SimNode::create(GPUS);
    let mut bundle = Bundle::new(busybox_image(), &["nvidia-smi"]);
    bundle.env("NVIDIA_VISIBLE_DEVICES=1,3");
    let output = run_with_hook(&mut bundle, &node, RuntimeEnv::CgroupV2);
    let listed: Vec<&str> = output
        .stdout
        .lines()
        .filter(|l| l.starts_with("GPU "))
        .collect();
    assert_eq!(listed.len(), 2, "{output}");
    assert!(
        listed[0].starts_with("GPU 0: ") && listed[0].contains(&node.gpu_uuid(1)),
        "{output}"
    );
    assert!(
        listed[1].starts_with("GPU 1: ") && listed[1].contains(&node.gpu_uuid(3)),
        "{output}"
    );
}

#[test]
fn container_without_gpu_request_is_untouched() {
    let node = SimNode::create(GPUS);
    let mut bundle = Bundle::new(glibc_image(), &["/gpucheck", "--ls", "/dev"]);
    let before = tree_listing(bundle.rootfs());
    let output = run_with_hook(&mut bundle, &node, RuntimeEnv::CgroupV1);
    assert_eq!(
        nvidia_entries_in_dev(&output),
        Vec::<&str>::new(),
        "{output}"
    );
    assert_eq!(
        before,
        tree_listing(bundle.rootfs()),
        "the hook changed the rootfs"
    );
}

#[test]
fn unknown_gpu_stops_the_container_with_one_clear_line() {
    let node = SimNode::create(GPUS);
    let mut bundle = gpucheck_bundle(glibc_image(), &[]);
    bundle.env("NVIDIA_VISIBLE_DEVICES=7").prestart_hook(&node);
    let output = run_clean(&bundle, Some(&node), RuntimeEnv::CgroupV1);
    assert!(
        !output.status.success(),
        "runc should have failed\n{output}"
    );
    assert!(
        output
            .stderr
            .lines()
            .any(|line| line.contains("nvhook:") && line.contains('7')),
        "no `nvhook:` line naming 7 in runc's stderr\n{output}"
    );
    assert!(
        !output.stdout.contains("dlopen"),
        "the container started\n{output}"
    );
}
