//! Faults on a GPU node, end to end with real runc and nvhook as the prestart hook: each
//! stops a GPU container before it runs, with one exact line from the hook (what runc shows
//! the user), leaves nothing mounted on the host, and lets a container that asks for no GPU
//! start normally on the same node with the same hook.
//!
//! Run as root after `cargo build --workspace`: `cargo test --test faults_e2e`.

use nvhook_test_support as support;

use std::fs;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use support::{
    Bundle, RuntimeEnv, SimNode, glibc_image, host_mounts_referencing, nvhook_bin, require_program,
    run_clean,
};

const GPUS: u32 = 2;
const DRIVER_VERSION: &str = "550.54.15";
const LIB_DIR: &str = "usr/lib/x86_64-linux-gnu";

/// A container that asks for GPU 0 and, if it ever runs, says what it sees.
fn gpu_bundle() -> Bundle {
    let mut bundle = Bundle::new(glibc_image(), &["/gpucheck", "--dev", "/dev/nvidia0"]);
    bundle.env("NVIDIA_VISIBLE_DEVICES=0");
    bundle
}

/// A container that asks for no GPU.
fn plain_bundle() -> Bundle {
    Bundle::new(glibc_image(), &["/gpucheck", "--ls", "/dev"])
}

/// The GPU container stops with exactly `message`; the plain one runs, untouched.
#[track_caller]
fn assert_fault(node: &SimNode, mut gpu: Bundle, message: &str) {
    gpu.prestart_hook(node);
    let refused = run_clean(&gpu, Some(node), RuntimeEnv::CgroupV1);
    refused.assert_refused_by_hook(message);
    assert_plain_container_runs(node);
}

#[track_caller]
fn assert_plain_container_runs(node: &SimNode) {
    let mut plain = plain_bundle();
    plain.prestart_hook(node);
    let output = run_clean(&plain, Some(node), RuntimeEnv::CgroupV1);
    output.assert_success();
    output.assert_lines(&["ls /dev null", "dlopen libcuda.so.1 fail libcuda.so.1: cannot open shared object file: No such file or directory"]);
    assert!(!output.stdout.contains("nvidia"), "{output}");
}

fn driver_lib(node: &SimNode, name: &str) -> PathBuf {
    node.driver_root().join(LIB_DIR).join(name)
}

#[test]
fn fault_nvml_library_missing() {
    let node = SimNode::create(GPUS);
    fs::remove_file(driver_lib(
        &node,
        &format!("libnvidia-ml.so.{DRIVER_VERSION}"),
    ))
    .expect("remove the node's libnvidia-ml");
    let nvml = driver_lib(&node, "libnvidia-ml.so.1");
    assert_fault(
        &node,
        gpu_bundle(),
        &format!(
            "nvhook: the NVML library {} is missing (is the NVIDIA driver installed completely? run ldconfig in the driver root, or set nvml-library in the nvhook config)",
            nvml.display()
        ),
    );
}

#[test]
fn fault_nvml_init_error() {
    // 9 is NVML_ERROR_DRIVER_NOT_LOADED.
    let node = SimNode::create_with(GPUS, &["--nvml-init-error", "9"]);
    let nvml = driver_lib(&node, "libnvidia-ml.so.1");
    assert_fault(
        &node,
        gpu_bundle(),
        &format!(
            "nvhook: cannot initialise NVML from {}: NVIDIA driver is not loaded (is the NVIDIA driver installed and loaded?)",
            nvml.display()
        ),
    );
}

#[test]
fn fault_nvml_init_slower_than_the_hook_timeout() {
    let delay = Duration::from_secs(5);
    let node = SimNode::create_with(
        GPUS,
        &["--nvml-init-delay-ms", &delay.as_millis().to_string()],
    );
    node.configure("nvml-timeout-ms = 300");
    let started = Instant::now();
    assert_fault(
        &node,
        gpu_bundle(),
        "nvhook: NVML did not answer within 300 ms (nvml-timeout-ms): enable persistence mode (nvidia-smi -pm 1, or start nvidia-persistenced) or raise nvml-timeout-ms in the nvhook config",
    );
    // Both containers together took less than NVML alone would have: the hook gave up on
    // its own, long before the runtime's 30 s hook timeout, and the plain container never
    // waited for NVML at all.
    assert!(started.elapsed() < delay, "took {:?}", started.elapsed());
}

#[test]
fn fault_device_node_missing_from_dev_root() {
    let node = SimNode::create(GPUS);
    fs::remove_file(node.dev_root().join("dev/nvidia0")).expect("remove dev/nvidia0");
    assert_fault(
        &node,
        gpu_bundle(),
        &format!(
            "nvhook: device node /dev/nvidia0 is missing under dev-root {} or is not 195:0 (is the NVIDIA driver loaded? run nvidia-modprobe)",
            node.dev_root().display()
        ),
    );
}

#[test]
fn fault_driver_library_missing_for_a_requested_capability() {
    let node = SimNode::create(GPUS);
    fs::remove_file(driver_lib(&node, &format!("libcuda.so.{DRIVER_VERSION}")))
        .expect("remove the node's libcuda");
    let mut bundle = gpu_bundle();
    bundle.env("NVIDIA_DRIVER_CAPABILITIES=compute,utility");
    assert_fault(
        &node,
        bundle,
        "nvhook: capability compute needs libcuda.so.1, which the driver root does not have (is the driver installed completely? run ldconfig in the driver root)",
    );
}

/// The hook runs where no cgroup filesystem is mounted (as when a runtime runs inside a
/// container without /sys/fs/cgroup): here, in a private mount namespace that unmounted it.
#[test]
fn fault_cgroup_not_found() {
    let node = SimNode::create(GPUS);
    let mut bundle = gpu_bundle();
    bundle.raw_prestart_hook(json!({
        "path": require_program("unshare"),
        "args": [
            "unshare", "--mount", "--propagation", "private",
            "sh", "-c", "umount -R /sys/fs/cgroup && exec \"$0\" \"$@\"",
            nvhook_bin(), "--config", node.config(), "hook", "prestart",
        ],
        "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"],
        "timeout": 30,
    }));
    let output = run_clean(&bundle, Some(&node), RuntimeEnv::CgroupV1);
    // The container's pid is runc's to choose: read it from the message, then match exactly.
    let message = output.hook_stderr().unwrap_or_default();
    let pid: String = message
        .split("pid ")
        .nth(1)
        .unwrap_or_default()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    output.assert_refused_by_hook(&format!(
        "nvhook: cannot find the devices cgroup of pid {pid} (/proc/{pid}/cgroup, /proc/thread-self/mountinfo): its cgroup /{} is under no cgroup v1 devices mount visible here (mount the cgroup filesystem, or run in the host mount namespace)",
        bundle.id()
    ));
    assert_plain_container_runs(&node);
}

/// The container's process is gone by the time the hook looks at its rootfs.
#[test]
fn fault_container_process_gone() {
    let node = SimNode::create(GPUS);
    let bundle = gpu_bundle();
    bundle.write_config();
    let mut exited = Command::new(require_program("true"))
        .spawn()
        .expect("spawn true");
    let pid = exited.id();
    exited.wait().expect("reap true");
    let state = json!({"ociVersion": "1.0.2", "id": bundle.id(), "status": "created",
        "pid": pid, "bundle": bundle.dir()});
    let mut hook = Command::new(nvhook_bin())
        .arg("--config")
        .arg(node.config())
        .args(["hook", "prestart"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn nvhook");
    hook.stdin
        .take()
        .expect("stdin")
        .write_all(state.to_string().as_bytes())
        .expect("write state");
    let out = hook.wait_with_output().expect("wait nvhook");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "nvhook: cannot see the container's rootfs through /proc/{pid}/root: No such file or directory (os error 2) (is the container still running?)\n"
        )
    );
    assert_plain_container_runs(&node);
}

/// `root.readonly`: runc makes the rootfs read-only after the prestart hooks, so the GPU
/// container gets its GPU and driver and still cannot write to its rootfs.
#[test]
fn fault_read_only_rootfs_flag_still_gets_the_gpu() {
    let node = SimNode::create(GPUS);
    let mut bundle = Bundle::new(
        glibc_image(),
        &[
            "/gpucheck",
            "--dev",
            "/dev/nvidia0",
            "--write",
            "/etc/ld.so.cache",
        ],
    );
    bundle
        .env("NVIDIA_VISIBLE_DEVICES=0")
        .readonly_root()
        .prestart_hook(&node);
    let output = run_clean(&bundle, Some(&node), RuntimeEnv::CgroupV1);
    output.assert_success();
    output.assert_lines(&[
        "dev /dev/nvidia0 ENXIO",
        "dlopen libcuda.so.1 ok",
        "cuInit 0",
        "write /etc/ld.so.cache EROFS",
    ]);
    let mut plain = plain_bundle();
    plain.readonly_root().prestart_hook(&node);
    run_clean(&plain, Some(&node), RuntimeEnv::CgroupV1).assert_success();
}

/// A mount point on the host for a test's rootfs, unmounted (lazily) and removed on drop.
struct HostMount {
    dir: tempfile::TempDir,
}

impl HostMount {
    fn new() -> HostMount {
        let mount = HostMount {
            dir: tempfile::Builder::new()
                .prefix("nvhook-faults-")
                .tempdir()
                .expect("tempdir"),
        };
        fs::create_dir(mount.path()).expect("mkdir mount point");
        mount
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("rootfs")
    }

    fn mount(&self, args: &[&str]) {
        let status = Command::new(require_program("mount"))
            .args(args)
            .arg(self.path())
            .status()
            .expect("spawn mount");
        assert!(status.success(), "mount {args:?} failed");
    }

    fn copy_image(&self) {
        let status = Command::new(require_program("cp"))
            .arg("-a")
            .arg(glibc_image().rootfs().join("."))
            .arg(self.path())
            .status()
            .expect("spawn cp");
        assert!(status.success(), "cp -a of the image failed");
    }

    /// Host mount-table lines under this mount point other than its own.
    #[track_caller]
    fn assert_only_itself_mounted(&self) {
        let lines = host_mounts_referencing(&[&self.path()]);
        assert_eq!(lines.len(), 1, "mounts left on the host: {lines:#?}");
    }
}

impl Drop for HostMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.path()).status();
    }
}

/// The image's rootfs on its own tmpfs with only `spare` inodes left: the hook's
/// `spare + 1`-th new file in it fails with ENOSPC, half-way through the mounts.
fn rootfs_on_small_tmpfs(spare: u64) -> HostMount {
    let host = HostMount::new();
    host.mount(&["-t", "tmpfs", "-o", "size=64m,mode=755", "tmpfs"]);
    host.copy_image();
    let st = nix::sys::statvfs::statvfs(&host.path()).expect("statvfs");
    let used = st.files() - st.files_free();
    host.mount(&["-o", &format!("remount,nr_inodes={}", used + spare)]);
    host
}

#[test]
fn fault_half_way_through_mounting() {
    let node = SimNode::create(GPUS);
    let spare = 3;
    let rootfs = rootfs_on_small_tmpfs(spare);
    let mut bundle = gpu_bundle();
    bundle.use_rootfs(&rootfs.path());
    // Which mount point the hook creates in position `spare` (the first `spare` fit).
    bundle.write_config();
    let plan = Command::new(nvhook_bin())
        .arg("--config")
        .arg(node.config())
        .args(["plan", "--format", "json", "--bundle"])
        .arg(bundle.dir())
        .output()
        .expect("run nvhook plan");
    assert!(plan.status.success(), "{plan:?}");
    let plan: serde_json::Value = serde_json::from_slice(&plan.stdout).expect("plan JSON");
    let mounts = plan["plan"]["mounts"].as_array().expect("mounts");
    assert!(
        mounts.len() > 2 * spare as usize,
        "too few mounts to fail half-way"
    );
    for m in &mounts[..=spare as usize] {
        // Each of these takes exactly one new inode: a file in a directory the image has.
        let dest = m["destination"].as_str().expect("destination");
        assert!(dest.starts_with(&format!("/{LIB_DIR}/")), "{m}");
    }
    let failing = mounts[spare as usize]["destination"].as_str().unwrap();
    assert_fault(
        &node,
        bundle,
        &format!(
            "nvhook: cannot create mount point {failing} in the container: No space left on device (os error 28)"
        ),
    );
    rootfs.assert_only_itself_mounted();
}

/// A rootfs that is read-only before the hooks run (a read-only bind mount): nvhook cannot
/// make mount points in it and says so.
#[test]
fn fault_read_only_rootfs_mount() {
    let node = SimNode::create(GPUS);
    let rootfs = HostMount::new();
    rootfs.copy_image();
    let source = rootfs.path();
    let source = source.to_str().expect("utf-8 path");
    rootfs.mount(&["--bind", source]);
    rootfs.mount(&["-o", "remount,bind,ro"]);
    let mut bundle = gpu_bundle();
    bundle.use_rootfs(&rootfs.path());
    assert_fault(
        &node,
        bundle,
        &format!(
            "nvhook: cannot create mount point /{LIB_DIR}/libcuda.so.{DRIVER_VERSION} in the container: Read-only file system (os error 30)"
        ),
    );
    let mut plain = plain_bundle();
    plain.use_rootfs(&rootfs.path()).prestart_hook(&node);
    run_clean(&plain, Some(&node), RuntimeEnv::CgroupV1).assert_success();
    rootfs.assert_only_itself_mounted();
}

// ---- issue 20 §6: faults under load ----

/// Processes whose command line names `needle` (a node's driver root): a helper left behind.
fn processes_naming(needle: &std::path::Path) -> Vec<String> {
    let needle = needle.to_string_lossy().into_owned();
    fs::read_dir("/proc")
        .expect("list /proc")
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&needle))
        .collect()
}

/// Waits up to `limit` for no process to name the node's driver root.
#[track_caller]
fn assert_no_helper_left(node: &SimNode, limit: Duration) {
    let started = Instant::now();
    loop {
        let left = processes_naming(&node.driver_root());
        if left.is_empty() {
            return;
        }
        assert!(
            started.elapsed() < limit,
            "processes left behind: {left:#?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A hung NVML (nvmlInit never returns within any sensible time): the start gives up at
/// `nvml-timeout-ms` with one line, the stuck helper is killed, not left behind, and a
/// container that asks for no GPU never waits for NVML.
#[test]
fn fault_nvml_hangs() {
    let node = SimNode::create_with(GPUS, &["--nvml-init-delay-ms", "3600000"]);
    node.configure("nvml-timeout-ms = 300");
    let started = Instant::now();
    assert_fault(
        &node,
        gpu_bundle(),
        "nvhook: NVML did not answer within 300 ms (nvml-timeout-ms): enable persistence mode (nvidia-smi -pm 1, or start nvidia-persistenced) or raise nvml-timeout-ms in the nvhook config",
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );
    assert_no_helper_left(&node, Duration::from_secs(2));
}

/// The engine kills the hook at the hook entry's `timeout` while NVML hangs: the container
/// never runs, nothing stays mounted, the NVML helper dies with the hook, and the next start
/// is not held up by anything the killed one left (its query lock is the kernel's to free).
#[test]
fn fault_the_engine_kills_the_hook_at_its_timeout() {
    let node = SimNode::create_with(GPUS, &["--nvml-init-delay-ms", "3600000"]);
    // The hook would wait longer than the runtime lets it.
    node.configure("nvml-timeout-ms = 25000");
    let mut bundle = gpu_bundle();
    bundle.raw_prestart_hook(json!({
        "path": node.hook(),
        "args": ["nvhook", "--config", node.config(), "hook", "prestart"],
        "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"],
        "timeout": 1,
    }));
    let started = Instant::now();
    let killed = run_clean(&bundle, Some(&node), RuntimeEnv::CgroupV1);
    assert!(!killed.status.success(), "{killed}");
    assert!(killed.stdout.is_empty(), "the container ran\n{killed}");
    assert!(
        killed.stderr.contains("timeout"),
        "runc's message: {killed}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );
    assert_no_helper_left(&node, Duration::from_secs(2));

    // NVML answers again (the same node, its hang over): the next start gets its GPU at
    // once, the lock of the killed start long gone.
    node.change(&["--gpus", &GPUS.to_string()]);
    let mut next = gpu_bundle();
    next.prestart_hook(&node);
    let started = Instant::now();
    let output = run_clean(&next, Some(&node), RuntimeEnv::CgroupV1);
    output.assert_success();
    output.assert_lines(&["dev /dev/nvidia0 ENXIO"]);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
}

/// NVML's cached answer on a filesystem with no space left (a full /run): every start still
/// gets its GPU (the cache is best effort), asking NVML itself, and no half-written file is
/// left in the cache's directory.
#[test]
fn fault_the_cache_directory_is_on_a_full_filesystem() {
    let node = SimNode::create(GPUS);
    let run = HostMount::new();
    run.mount(&["-t", "tmpfs", "-o", "size=64k,mode=700", "tmpfs"]);
    let filler = run.path().join("filler");
    let mut file = fs::File::create(&filler).expect("create filler");
    let block = [0u8; 4096];
    while file.write_all(&block).is_ok() {}
    drop(file);
    let config = fs::read_to_string(node.config()).expect("read the node's config");
    let moved: Vec<String> = config
        .lines()
        .map(|l| match l.starts_with("nvml-cache-file") {
            true => format!(
                "nvml-cache-file = {:?}",
                run.path()
                    .join("nvhook/nvml-inventory.json")
                    .display()
                    .to_string()
            ),
            false => l.to_owned(),
        })
        .collect();
    fs::write(node.config(), moved.join("\n") + "\n").expect("write the node's config");
    for gpu in ["0", "1"] {
        let mut bundle = Bundle::new(
            glibc_image(),
            &["/gpucheck", "--dev", &format!("/dev/nvidia{gpu}")],
        );
        bundle.env(&format!("NVIDIA_VISIBLE_DEVICES={gpu}"));
        bundle.prestart_hook(&node);
        let output = run_clean(&bundle, Some(&node), RuntimeEnv::CgroupV1);
        output.assert_success();
        output.assert_lines(&[&format!("dev /dev/nvidia{gpu} ENXIO")]);
    }
    assert_eq!(node.nvml_inits(), 2, "each start asked NVML itself");
    let mut left: Vec<String> = walk_names(&run.path());
    left.sort();
    let allowed = ["filler", "nvhook", "nvhook/nvml-inventory.json.lock"];
    assert!(
        left.iter().all(|n| allowed.contains(&n.as_str())),
        "files left in the full filesystem: {left:?}"
    );
}

/// Every path under `dir`, relative to it.
fn walk_names(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            out.push(path.strip_prefix(dir).unwrap().display().to_string());
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                pending.push(path);
            }
        }
    }
    out
}
