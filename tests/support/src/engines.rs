//! Container engines started by the tests themselves: a private containerd or
//! dockerd per test (own root, state and sockets under a temporary directory),
//! images made from the harness's rootfs templates, and guards that stop the
//! daemons and remove every container and mount they left, even on failure.

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

use serde_json::json;
use tempfile::TempDir;

use super::bundle::nvhook_bin;
use super::cmd::{require_program, run_checked, stdout_of};
use super::runc::{Output, RuntimeEnv};

/// Seconds any one engine command may take before it is killed.
const COMMAND_TIMEOUT_S: &str = "120";
/// How long a daemon may take to open its socket.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a daemon may take to exit after SIGTERM before it gets SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// nvhook-runtime cargo built for this test run.
pub fn nvhook_runtime_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| super::workspace_bin("nvhook-runtime"))
}

/// youki from `scripts/youki.sh` (`.engines/youki`), run through its wrapper that lets it
/// load its cgroup v2 device program under this machine's memlock limit (the script says why).
/// Panics with the fix when it is missing: the tests never skip.
pub fn youki_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let bin = Path::new(env!("CARGO_MANIFEST_DIR"))
            .ancestors()
            .nth(2)
            .expect("tests/support has a workspace root")
            .join(".engines/youki/bin/youki-memlock");
        assert!(
            bin.is_file(),
            "youki is missing ({}): run scripts/youki.sh",
            bin.display()
        );
        bin
    })
}

/// Debian sid's `runc` or `crun` from `scripts/sid-runtimes.sh`: a wrapper in
/// `.engines/sid-bin` that runs the program of the sid root (`.engines/sid-root`) in a mount
/// namespace of its own (the script says why). Panics with the fix when it is missing: the
/// tests never skip.
pub fn sid_runtime_bin(name: &str) -> PathBuf {
    let bin = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("tests/support has a workspace root")
        .join(".engines/sid-bin")
        .join(name);
    assert!(
        bin.is_file(),
        "sid's {name} is missing ({}): run scripts/sid-runtimes.sh",
        bin.display()
    );
    bin
}

/// The NVML helper cargo built for this test run (nvhook runs it from beside itself).
pub fn nvhook_nvml_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| super::workspace_bin("nvhook-nvml"))
}

/// A name unique to this process and call, for ids, namespaces and images.
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A short temporary directory under /tmp (unix socket paths are limited to
/// 108 bytes, so not under the target directory). On drop it lazily unmounts
/// whatever is still mounted below it (deepest first), then removes it: a
/// failed test must not leave mounts behind. Tests assert the mount table is
/// clean BEFORE this runs.
pub struct EngineDir {
    dir: Option<TempDir>,
}

impl EngineDir {
    pub fn new(prefix: &str) -> EngineDir {
        EngineDir::new_in(Path::new("/tmp"), prefix)
    }

    /// The same under `parent`, for a bench that compares the engine's state on the disk with
    /// the same on a tmpfs.
    pub fn new_in(parent: &Path, prefix: &str) -> EngineDir {
        let dir = tempfile::Builder::new()
            .prefix(&format!("nvhook-{prefix}-"))
            .tempdir_in(parent)
            .expect("create engine dir");
        EngineDir { dir: Some(dir) }
    }

    pub fn path(&self) -> &Path {
        self.dir.as_ref().expect("engine dir alive").path()
    }
}

impl Drop for EngineDir {
    fn drop(&mut self) {
        unmount_below(self.path());
        if let Some(dir) = self.dir.take()
            && let Err(err) = dir.close()
        {
            eprintln!("engine dir cleanup: {err}");
        }
    }
}

/// Nothing of an engine (its directory `dir`) or of a node (`node_root`) may stay mounted
/// once the daemon stopped.
#[track_caller]
pub fn assert_no_mounts_left(dir: &Path, node_root: &Path) {
    let leaked = super::host_mounts_referencing(&[dir, node_root]);
    assert!(leaked.is_empty(), "mounts left on the host: {leaked:#?}");
    assert!(mount_points_below(dir).is_empty());
}

/// Mount points at or below `root`, from the host's mount table.
pub fn mount_points_below(root: &Path) -> Vec<PathBuf> {
    let table = fs::read_to_string("/proc/self/mountinfo").expect("read /proc/self/mountinfo");
    table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(unescape_mount_path)
        .filter(|point| point.starts_with(root))
        .collect()
}

fn unescape_mount_path(field: &str) -> PathBuf {
    PathBuf::from(
        field
            .replace("\\040", " ")
            .replace("\\011", "\t")
            .replace("\\012", "\n")
            .replace("\\134", "\\"),
    )
}

/// Detaches every mount at or below `root`, deepest first, so that the directory can go.
pub(crate) fn unmount_below(root: &Path) {
    let mut points = mount_points_below(root);
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for point in points {
        let Ok(c_path) = std::ffi::CString::new(point.as_os_str().as_encoded_bytes()) else {
            continue;
        };
        // SAFETY: c_path is a valid NUL-terminated string for the whole call.
        let rc = unsafe { libc::umount2(c_path.as_ptr(), libc::MNT_DETACH) };
        if rc != 0 {
            eprintln!(
                "cleanup: umount {}: {}",
                point.display(),
                io::Error::last_os_error()
            );
        }
    }
}

/// Removes the (empty) cgroup `name` and its children from every hierarchy:
/// engines create one per namespace / parent and leave it behind.
pub fn remove_cgroup(name: &str) {
    let base = Path::new("/sys/fs/cgroup");
    let mut candidates = vec![base.join(name)];
    if let Ok(entries) = fs::read_dir(base) {
        candidates.extend(entries.flatten().map(|e| e.path().join(name)));
    }
    for dir in candidates.into_iter().filter(|d| d.is_dir()) {
        let mut dirs = vec![];
        collect_dirs(&dir, &mut dirs);
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for d in dirs {
            if let Err(err) = fs::remove_dir(&d) {
                eprintln!("cleanup: rmdir {}: {err}", d.display());
            }
        }
    }
}

/// A cgroup parent of a unique name for a test's pods (the CRI's cgroup_parent), removed
/// on drop, also when the test failed.
pub struct CgroupParent(String);

impl CgroupParent {
    pub fn new(prefix: &str) -> CgroupParent {
        CgroupParent(unique_name(prefix))
    }

    /// `/NAME`, what RunPodSandbox takes.
    pub fn path(&self) -> String {
        format!("/{}", self.0)
    }
}

impl Drop for CgroupParent {
    fn drop(&mut self) {
        remove_cgroup(&self.0);
    }
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_owned());
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            collect_dirs(&entry.path(), out);
        }
    }
}

/// A daemon started by a test: SIGTERM on drop, SIGKILL if it lingers.
pub struct Daemon {
    name: &'static str,
    child: Option<Child>,
    log: PathBuf,
}

impl Daemon {
    /// Starts `cmd` with stdout and stderr appended to `log`.
    pub fn spawn(name: &'static str, mut cmd: Command, log: PathBuf) -> Daemon {
        let out = File::create(&log).expect("create daemon log");
        let err = out.try_clone().expect("dup daemon log");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({cmd:?}): {e}"));
        Daemon {
            name,
            child: Some(child),
            log,
        }
    }

    /// The daemon's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until `socket` exists and `probe` succeeds, panicking with the
    /// daemon's log if it exits or takes too long.
    pub fn wait_ready(&mut self, socket: &Path, mut probe: impl FnMut() -> bool) {
        let start = Instant::now();
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .expect("daemon running")
                .try_wait()
                .expect("poll daemon")
            {
                panic!("{} exited with {status}:\n{}", self.name, self.log());
            }
            if socket.exists() && probe() {
                return;
            }
            assert!(
                start.elapsed() < START_TIMEOUT,
                "{} did not open {} within {START_TIMEOUT:?}:\n{}",
                self.name,
                socket.display(),
                self.log()
            );
            sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM, then SIGKILL after STOP_TIMEOUT; returns whether it exited
    /// on SIGTERM. Idempotent.
    pub fn stop(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        let pid = child.id() as libc::pid_t;
        // SAFETY: kill(2) on the pid of a child we have not reaped yet.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let start = Instant::now();
        while start.elapsed() < STOP_TIMEOUT {
            if let Ok(Some(_)) = child.try_wait() {
                return true;
            }
            sleep(Duration::from_millis(100));
        }
        eprintln!("{} ignored SIGTERM; killing it", self.name);
        let _ = child.kill();
        let _ = child.wait();
        false
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A command wrapped in `timeout`, so that a hung engine fails the test.
/// `program` run behind `prefix` (`nsenter --mount=... --`), or alone where it is empty; the
/// first program of the two is run by `command` (`Command::new`, [`timed`]).
pub(crate) fn behind(
    prefix: &[std::ffi::OsString],
    program: &Path,
    command: impl FnOnce(&Path) -> Command,
) -> Command {
    match prefix.split_first() {
        None => command(program),
        Some((first, rest)) => {
            let mut cmd = command(Path::new(first));
            cmd.args(rest).arg(program);
            cmd
        }
    }
}

pub fn timed(program: &Path) -> Command {
    let mut cmd = Command::new(require_program("timeout"));
    cmd.args(["--kill-after=5", COMMAND_TIMEOUT_S]).arg(program);
    cmd
}

pub fn output_of(cmd: &mut Command) -> Output {
    let output = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot spawn {cmd:?}: {e}"));
    Output {
        status: output.status,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        hook_log: None,
    }
}

// ---------------------------------------------------------------- nvhook configure

/// `nvhook configure ENGINE --engine-config FILE --runtime-path nvhook-runtime`.
pub fn nvhook_configure(engine: &str, file: &Path) -> Output {
    let output = output_of(
        Command::new(nvhook_bin())
            .args(["configure", engine, "--engine-config"])
            .arg(file)
            .arg("--runtime-path")
            .arg(nvhook_runtime_bin()),
    );
    assert!(
        output.status.success(),
        "`nvhook configure {engine} --engine-config {} --runtime-path {}` failed\n{output}",
        file.display(),
        nvhook_runtime_bin().display()
    );
    output
}

// ---------------------------------------------------------------- images

/// What an image's config says a container runs, and with which environment
/// (PATH is always set).
pub struct ImageConfig<'a> {
    pub cmd: &'a [&'a str],
    pub env: &'a [&'a str],
}

/// A pod sandbox's (pause) image made of busybox_image(): anything that sleeps until the pod
/// is stopped.
pub const PAUSE_IMAGE: ImageConfig = ImageConfig {
    cmd: &["/bin/busybox", "sleep", "2147483647"],
    env: &[],
};

/// glibc_image()'s program.
pub const GPUCHECK_IMAGE: ImageConfig = ImageConfig {
    cmd: &["/gpucheck"],
    env: &[],
};

/// Writes an OCI image-layout tar of `rootfs` (one uncompressed layer, the
/// image named `name` through containerd's `io.containerd.image.name`
/// annotation) to `tar`, the format `ctr image import` takes.
pub fn write_oci_archive(rootfs: &Path, name: &str, image: &ImageConfig, work: &Path, tar: &Path) {
    let layout = work.join("oci-layout-dir");
    let blobs = layout.join("blobs/sha256");
    fs::create_dir_all(&blobs).expect("create OCI blobs dir");
    let layer = work.join("layer.tar");
    write_rootfs_tar(rootfs, &layer);
    let (layer_digest, layer_size) = add_blob(&blobs, &layer);
    let mut env = vec!["PATH=/usr/sbin:/usr/bin:/sbin:/bin"];
    env.extend(image.env);
    let config = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": { "Env": env, "Cmd": image.cmd },
        "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{layer_digest}")] },
    });
    let (config_digest, config_size) = add_json_blob(&blobs, work, "config.json", &config);
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": format!("sha256:{config_digest}"),
            "size": config_size,
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": format!("sha256:{layer_digest}"),
            "size": layer_size,
        }],
    });
    let (manifest_digest, manifest_size) = add_json_blob(&blobs, work, "manifest.json", &manifest);
    let tag = name.rsplit_once(':').map_or("latest", |(_, tag)| tag);
    let index = json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{manifest_digest}"),
            "size": manifest_size,
            "platform": { "architecture": "amd64", "os": "linux" },
            "annotations": {
                "io.containerd.image.name": name,
                "org.opencontainers.image.ref.name": tag,
            },
        }],
    });
    fs::write(layout.join("index.json"), index.to_string()).expect("write index.json");
    fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .expect("write oci-layout");
    run_checked(
        Command::new(require_program("tar"))
            .arg("-C")
            .arg(&layout)
            .arg("-cf")
            .arg(tar)
            .arg("."),
    );
    fs::remove_dir_all(&layout).expect("remove OCI layout dir");
}

/// A plain tar of `rootfs` (numeric owners), what `docker import` takes.
pub fn write_rootfs_tar(rootfs: &Path, tar: &Path) {
    run_checked(
        Command::new(require_program("tar"))
            .arg("--numeric-owner")
            .arg("-C")
            .arg(rootfs)
            .arg("-cf")
            .arg(tar)
            .arg("."),
    );
}

fn add_json_blob(
    blobs: &Path,
    work: &Path,
    name: &str,
    value: &serde_json::Value,
) -> (String, u64) {
    let path = work.join(name);
    fs::write(&path, value.to_string()).expect("write blob");
    add_blob(blobs, &path)
}

/// Moves `file` into `blobs` under its sha256; returns (hex digest, size).
fn add_blob(blobs: &Path, file: &Path) -> (String, u64) {
    let sum = stdout_of(Command::new(require_program("sha256sum")).arg(file));
    let digest = sum
        .split_whitespace()
        .next()
        .expect("sha256sum output")
        .to_owned();
    let size = fs::metadata(file).expect("stat blob").len();
    fs::rename(file, blobs.join(&digest)).expect("move blob into layout");
    (digest, size)
}

// ---------------------------------------------------------------- containerd

/// A containerd build: Debian 12's on PATH (1.6), or Debian sid's containerd 2 that
/// `scripts/sid-engines.sh` unpacked into `.engines/sid` (see [`ContainerdBuild::sid`]).
#[derive(Clone, Debug)]
pub struct ContainerdBuild {
    /// Where the package is unpacked (containerd, ctr and containerd-shim-runc-v2 in its
    /// usr/bin, its Debian version in `version`); None: PATH.
    root: Option<PathBuf>,
}

impl ContainerdBuild {
    /// Debian 12's containerd 1.6 (`apt-get install containerd`), found on PATH.
    pub fn debian() -> ContainerdBuild {
        ContainerdBuild { root: None }
    }

    /// Debian sid's containerd 2 in `.engines/sid`, which `scripts/test.sh` fetches through
    /// `scripts/sid-engines.sh`. Panics with that fix when it is missing: the tests never skip.
    pub fn sid() -> ContainerdBuild {
        ContainerdBuild {
            root: Some(sid_engine("containerd 2", "version", "usr/bin/containerd")),
        }
    }

    /// `name` (containerd, ctr, containerd-shim-runc-v2) of this build.
    pub fn program(&self, name: &str) -> PathBuf {
        match &self.root {
            Some(root) => root.join("usr/bin").join(name),
            None => require_program(name),
        }
    }

    /// The Debian package version (sid's), or `containerd --version`'s words.
    pub fn version(&self) -> String {
        build_version(self.root.as_deref(), "version", &self.program("containerd"))
    }

    /// `containerd` for this build behind `prefix` (see [`behind`]), its shims looked up in
    /// the build's own directory first (the runtime, runc, is Debian 12's on PATH in both
    /// builds).
    fn daemon(&self, prefix: &[std::ffi::OsString]) -> Command {
        let mut cmd = behind(prefix, &self.program("containerd"), |p| Command::new(p));
        if let Some(root) = &self.root {
            let path = std::env::var_os("PATH").unwrap_or_default();
            let dirs = std::iter::once(root.join("usr/bin")).chain(std::env::split_paths(&path));
            cmd.env(
                "PATH",
                std::env::join_paths(dirs).expect("PATH entries join"),
            );
        }
        cmd
    }

    /// `containerd config default` of this build with every host path moved under `dir`.
    pub fn config(&self, dir: &Path) -> toml_edit::DocumentMut {
        let text = stdout_of(Command::new(self.program("containerd")).args(["config", "default"]));
        let mut doc: toml_edit::DocumentMut =
            text.parse().expect("containerd default config is TOML");
        let at = |name: &str| dir.join(name).display().to_string();
        doc["root"] = toml_edit::value(at("root"));
        doc["state"] = toml_edit::value(at("state"));
        doc["grpc"]["address"] = toml_edit::value(at("containerd.sock"));
        doc["ttrpc"]["address"] = toml_edit::value(at("containerd.sock.ttrpc"));
        doc["debug"]["address"] = toml_edit::value("");
        doc["plugins"]["io.containerd.internal.v1.opt"]["path"] = toml_edit::value(at("opt"));
        doc
    }
}

/// `.engines/sid` in the workspace root (this crate is tests/support), checked to hold the
/// `stamp` and `program` of `what`. Panics with the fix when they are missing: the tests
/// never skip.
fn sid_engine(what: &str, stamp: &str, program: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("tests/support has a workspace root")
        .join(".engines/sid");
    assert!(
        root.join(stamp).is_file() && root.join(program).is_file(),
        "{what} from Debian sid is missing ({} has no {stamp} stamp): run scripts/sid-engines.sh",
        root.display()
    );
    root
}

/// The (major, minor) a version starts with (`28.5.2+dfsg4-5`, `2.1.9+unknown`).
fn major_minor(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split(['.', '+', '-', ' ', ',']).map(str::parse);
    match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => Some((major, minor)),
        _ => None,
    }
}

/// The Debian package version in the `stamp` of a sid build in `root`, or what `daemon
/// --version` says.
fn build_version(root: Option<&Path>, stamp: &str, daemon: &Path) -> String {
    match root {
        Some(root) => fs::read_to_string(root.join(stamp))
            .unwrap_or_else(|e| panic!("read the sid engines' {stamp} stamp: {e}")),
        None => stdout_of(Command::new(daemon).arg("--version")),
    }
    .trim()
    .to_owned()
}

/// A dockerd build: Debian 12's on PATH (20.10), or Debian sid's (28 or 29) that
/// `scripts/sid-engines.sh` unpacked into `.engines/sid`, with its own docker client; sid's
/// dockerd starts sid's containerd 2 from the same tree (runc is Debian 12's on PATH).
#[derive(Clone, Debug)]
pub struct DockerdBuild {
    /// Where the packages are unpacked (dockerd in usr/sbin; docker and containerd in usr/bin;
    /// the docker.io version in `docker-version`); None: PATH.
    root: Option<PathBuf>,
}

impl DockerdBuild {
    /// Debian 12's dockerd 20.10 (`apt-get install docker.io`), found on PATH.
    pub fn debian() -> DockerdBuild {
        DockerdBuild { root: None }
    }

    /// Debian sid's dockerd in `.engines/sid`.
    pub fn sid() -> DockerdBuild {
        DockerdBuild {
            root: Some(sid_engine("dockerd", "docker-version", "usr/sbin/dockerd")),
        }
    }

    /// `dockerd` or `docker` of this build.
    pub fn program(&self, name: &str) -> PathBuf {
        match &self.root {
            Some(root) if name == "dockerd" => root.join("usr/sbin").join(name),
            Some(root) => root.join("usr/bin").join(name),
            None => require_program(name),
        }
    }

    /// The Debian package version (sid's), or `dockerd --version`'s words.
    pub fn version(&self) -> String {
        build_version(
            self.root.as_deref(),
            "docker-version",
            &self.program("dockerd"),
        )
    }

    /// The release as (major, minor), read from [`version`](Self::version): sid's package
    /// version (`28.5.2+dfsg4-5`) or `dockerd --version`'s words (`Docker version 20.10.24...`).
    pub fn release(&self) -> (u32, u32) {
        let version = self.version();
        major_minor(version.strip_prefix("Docker version ").unwrap_or(&version)).unwrap_or_else(
            || panic!("dockerd's version {version:?} does not start with MAJOR.MINOR"),
        )
    }

    /// `PATH` for this build's dockerd, given the one the test set (or the inherited one):
    /// sid's containerd and shim first, so that dockerd starts them and not Debian 12's.
    fn path(&self, path: Option<&std::ffi::OsStr>) -> Option<std::ffi::OsString> {
        let root = self.root.as_ref()?;
        let inherited = std::env::var_os("PATH").unwrap_or_default();
        let rest = path.unwrap_or(&inherited);
        let dirs = std::iter::once(root.join("usr/bin")).chain(std::env::split_paths(rest));
        Some(std::env::join_paths(dirs).expect("PATH entries join"))
    }
}

/// `containerd config default` (Debian 12's containerd) with every host path moved under `dir`.
pub fn containerd_config(dir: &Path) -> String {
    ContainerdBuild::debian().config(dir).to_string()
}

/// `containerd_config(dir)` with the CRI plugin set up for a pod sandbox on the
/// host network, as the kubelet would drive it on this machine: no CNI (a
/// private, empty config dir), the test's own pause image, and no negative
/// oom_score_adj (refused here; runc then fails with "can't get final
/// child's PID from pipe").
pub fn cri_containerd_config(dir: &Path, sandbox_image: &str) -> String {
    let mut doc: toml_edit::DocumentMut = containerd_config(dir)
        .parse()
        .expect("containerd config is TOML");
    let cri = &mut doc["plugins"]["io.containerd.grpc.v1.cri"];
    cri["sandbox_image"] = toml_edit::value(sandbox_image);
    cri["restrict_oom_score_adj"] = toml_edit::value(true);
    cri["cni"]["conf_dir"] = toml_edit::value(dir.join("cni").display().to_string());
    doc.to_string()
}

/// The runtime_type and options.BinaryName of the CRI plugin's runtime handler
/// `name`, as containerd itself reads the file back (`containerd config dump`).
#[track_caller]
pub fn assert_containerd_handler(config: &Path, name: &str, binary: &str) {
    let dump = stdout_of(
        Command::new(require_program("containerd"))
            .arg("--config")
            .arg(config)
            .args(["config", "dump"]),
    );
    let doc: toml::Table = toml::from_str(&dump)
        .unwrap_or_else(|e| panic!("containerd cannot read the configured file: {e}\n{dump}"));
    let mut handler = doc.get("plugins");
    for key in ["io.containerd.grpc.v1.cri", "containerd", "runtimes", name] {
        handler = handler.and_then(|table| table.get(key));
    }
    let handler = handler
        .unwrap_or_else(|| panic!("no runtime handler {name} for the CRI plugin in:\n{dump}"));
    assert_eq!(
        handler.get("runtime_type").and_then(|v| v.as_str()),
        Some("io.containerd.runc.v2"),
        "runtime handler {name} in:\n{dump}"
    );
    assert_eq!(
        handler
            .get("options")
            .and_then(|o| o.get("BinaryName"))
            .and_then(|v| v.as_str()),
        Some(binary),
        "BinaryName of runtime handler {name} in:\n{dump}"
    );
}

/// A private containerd: own root, state and sockets under an EngineDir.
pub struct Containerd {
    daemon: Daemon,
    /// This build's ctr.
    ctr: PathBuf,
    socket: PathBuf,
    runc_root: PathBuf,
    fifo_dir: PathBuf,
    namespace: String,
    /// The directory ctr sees as the host's CDI spec directory, if one was set.
    ctr_cdi_dir: Option<PathBuf>,
}

/// Runs `$@` in a private mount namespace where `/var/run/cdi` is the directory `$0` (on an
/// empty tmpfs over /run, so that nothing is made in the host's /run).
const CDI_DIR_WRAPPER: &str = "mount --make-rprivate / && mount -t tmpfs nvhook-test /var/run && \
     mkdir /var/run/cdi && mount --bind \"$0\" /var/run/cdi && exec \"$@\"";

impl Containerd {
    /// Starts `containerd --config CONFIG` with `env` added to its (and so its
    /// shims' and runtimes') environment, and waits until it answers.
    pub fn start(dir: &Path, config: &Path, env: &[(&str, &Path)]) -> Containerd {
        Containerd::start_with(&ContainerdBuild::debian(), dir, config, env)
    }

    /// [`Containerd::start`] of `build`'s containerd (ctr is then that build's too).
    pub fn start_with(
        build: &ContainerdBuild,
        dir: &Path,
        config: &Path,
        env: &[(&str, &Path)],
    ) -> Containerd {
        Containerd::start_behind(build, dir, config, env, &[])
    }

    /// [`Containerd::start_with`] behind `prefix` (a [`super::MountNs::nsenter`]: the daemon,
    /// its shims and runtimes in that mount namespace).
    pub fn start_behind(
        build: &ContainerdBuild,
        dir: &Path,
        config: &Path,
        env: &[(&str, &Path)],
        prefix: &[std::ffi::OsString],
    ) -> Containerd {
        let mut cmd = build.daemon(prefix);
        cmd.arg("--config").arg(config);
        for (key, value) in env {
            cmd.env(key, value);
        }
        let mut daemon = Daemon::spawn("containerd", cmd, dir.join("containerd.log"));
        let socket = dir.join("containerd.sock");
        let ctr = build.program("ctr");
        daemon.wait_ready(&socket, || {
            Command::new(&ctr)
                .arg("--address")
                .arg(&socket)
                .arg("version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        });
        Containerd {
            daemon,
            ctr,
            socket,
            runc_root: dir.join("runc"),
            fifo_dir: dir.join("fifo"),
            namespace: unique_name("nvhook-test"),
            ctr_cdi_dir: None,
        }
    }

    /// ctr's release as (major, minor), from `ctr --version`
    /// (`ctr github.com/containerd/containerd/v2 2.1.9+unknown`).
    pub fn ctr_release(&self) -> (u32, u32) {
        let said = stdout_of(Command::new(&self.ctr).arg("--version"));
        major_minor(said.split_whitespace().last().unwrap_or_default())
            .unwrap_or_else(|| panic!("ctr --version said {said:?}: no MAJOR.MINOR at its end"))
    }

    /// Makes every later ctr command see `dir` as `/var/run/cdi`, the CDI spec directory
    /// ctr reads itself (containerd 2.3's `ctr run --gpus` and `--device` make their CDI
    /// edits on the client side, from /etc/cdi and /var/run/cdi only), and not the host's.
    pub fn set_ctr_cdi_dir(&mut self, dir: &Path) {
        self.ctr_cdi_dir = Some(dir.to_path_buf());
    }

    pub fn log(&self) -> String {
        self.daemon.log()
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Makes ctr (imports, and the clean-up at shutdown) work in `namespace`:
    /// `k8s.io` is where the CRI plugin keeps the kubelet's images and pods.
    pub fn set_namespace(&mut self, namespace: &str) {
        namespace.clone_into(&mut self.namespace);
    }

    /// runc's `--root` for this daemon's containers (instead of the shared
    /// /run/containerd/runc). ctr's stdio fifos go beside it (`--fifo-dir`,
    /// instead of /run/containerd/fifo). Only the shims' sockets land in the
    /// shared /run/containerd/s: containerd 1.6 and 2.1 hard-code that directory.
    pub fn runc_root(&self) -> &Path {
        &self.runc_root
    }

    /// How many files containerd has open now.
    pub fn open_fds(&self) -> usize {
        let pid = self.daemon.pid().expect("containerd runs");
        fs::read_dir(format!("/proc/{pid}/fd"))
            .expect("list containerd's fds")
            .count()
    }

    /// `ctr --address SOCK --namespace NS ARGS...`, with a timeout.
    pub fn ctr(&self) -> Command {
        let mut cmd = match &self.ctr_cdi_dir {
            None => timed(&self.ctr),
            Some(dir) => {
                let mut cmd = timed(&require_program("unshare"));
                cmd.args(["-m", "sh", "-c", CDI_DIR_WRAPPER])
                    .arg(dir)
                    .arg(&self.ctr);
                cmd
            }
        };
        cmd.arg("--address")
            .arg(&self.socket)
            .arg("--namespace")
            .arg(&self.namespace);
        cmd
    }

    pub fn ctr_checked(&self, args: &[&str]) -> String {
        stdout_of(self.ctr().args(args))
    }

    pub fn import(&self, tar: &Path) {
        run_checked(self.ctr().args(["image", "import"]).arg(tar));
    }

    /// Imports the glibc gpucheck image, its archive written in `work`; returns its name.
    pub fn import_gpucheck_image(&self, work: &Path) -> String {
        let image = format!("docker.io/nvhook-test/{}:latest", unique_name("glibc"));
        self.import_rootfs(work, super::glibc_image().rootfs(), &image, &GPUCHECK_IMAGE);
        image
    }

    /// Imports `rootfs` as image `name` (running what `image` says) into the namespace, its
    /// archive written in `work` and removed after.
    pub fn import_rootfs(&self, work: &Path, rootfs: &Path, name: &str, image: &ImageConfig) {
        let tar = work.join(format!("{}.tar", name.replace(['/', ':'], "_")));
        write_oci_archive(rootfs, name, image, work, &tar);
        self.import(&tar);
        fs::remove_file(&tar).expect("remove the image archive");
        let listed = self.ctr_checked(&["image", "ls", "-q"]);
        assert!(
            listed.lines().any(|l| l == name),
            "{name} not in:\n{listed}"
        );
    }

    /// Stops containerd, which must stop on SIGTERM, and checks that nothing under `dir` (its
    /// state, and what its containers had) is left mounted.
    #[track_caller]
    pub fn stop_leaving_nothing(mut self, dir: &Path) {
        assert!(
            self.shutdown(),
            "containerd ignored SIGTERM:\n{}",
            self.log()
        );
        assert_no_mounts_left(dir, dir);
    }

    /// Kills and removes every task and container of the namespace, then
    /// stops the daemon. Returns whether it stopped on SIGTERM.
    pub fn shutdown(&mut self) -> bool {
        if self.daemon.child.is_some() {
            for id in self.list(&["tasks", "ls", "-q"]) {
                let _ = self
                    .ctr()
                    .args(["tasks", "kill", "-s", "SIGKILL", &id])
                    .output();
                let _ = self.ctr().args(["tasks", "delete", "-f", &id]).output();
            }
            for id in self.list(&["containers", "ls", "-q"]) {
                let _ = self.ctr().args(["containers", "delete", &id]).output();
            }
        }
        let stopped = self.daemon.stop();
        // ctr's containers live in the cgroup /NAMESPACE/ID.
        remove_cgroup(&self.namespace);
        stopped
    }

    fn list(&self, args: &[&str]) -> Vec<String> {
        self.ctr()
            .args(args)
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .map(|l| l.trim().to_owned())
                    .filter(|l| !l.is_empty())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `ctr run --rm` of `image` as container `id`, stdio captured.
    pub fn run(&self, extra: &[&str], image: &str, id: &str, args: &[&str]) -> Output {
        self.run_with_env(&[], extra, image, id, args)
    }

    /// [`Containerd::run`] with `env` added to ctr's environment, which `ctr run --gpus`
    /// looks its programs up in and gives its hook.
    pub fn run_with_env(
        &self,
        env: &[(&str, &OsStr)],
        extra: &[&str],
        image: &str,
        id: &str,
        args: &[&str],
    ) -> Output {
        let mut cmd = self.ctr();
        cmd.envs(env.iter().copied());
        // The container's output goes to a file nvhook-runtime writes and closes before it reports
        // the exit: ctr's own copying from its FIFOs can lose the output of a process that
        // exits at once (seen: status 0, nothing on stdout, under load).
        let log = self.fifo_dir.join(format!("{id}.log"));
        cmd.args(["run", "--rm", "--runc-root"])
            .arg(&self.runc_root)
            .arg("--fifo-dir")
            .arg(&self.fifo_dir)
            .arg("--log-uri")
            .arg(format!("file://{}", log.display()))
            .args(extra)
            .arg(image)
            .arg(id)
            .args(args);
        let mut output = output_of(&mut cmd);
        if let Ok(text) = fs::read_to_string(&log) {
            output.stdout.push_str(&text);
            let _ = fs::remove_file(&log);
        }
        output.hook_log = Some(format!("(containerd log)\n{}", self.log()));
        output
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.shutdown();
    }
}

// ---------------------------------------------------------------- dockerd

/// A private dockerd with its own managed containerd, all under an EngineDir.
pub struct Dockerd {
    daemon: Daemon,
    host: String,
    cgroup_parent: String,
    /// The docker client of the same build.
    client: PathBuf,
}

impl Dockerd {
    /// Debian 12's dockerd.
    pub fn start(dir: &Path, daemon_json: &Path, env: &[(&str, &Path)]) -> Dockerd {
        Dockerd::start_with(&DockerdBuild::debian(), dir, daemon_json, env)
    }

    /// [`Dockerd::start`] of `build`'s dockerd (docker is then that build's too); a `PATH`
    /// in `env` is where dockerd looks its programs up, after the build's own directory.
    pub fn start_with(
        build: &DockerdBuild,
        dir: &Path,
        daemon_json: &Path,
        env: &[(&str, &Path)],
    ) -> Dockerd {
        Dockerd::spawn(build, dir, daemon_json, env, &[])
    }

    /// [`Dockerd::start`] inside the mount namespace `ns` (its containerd, shims, runc and
    /// hooks with it).
    pub fn start_in(
        ns: &super::MountNs,
        dir: &Path,
        daemon_json: &Path,
        env: &[(&str, &Path)],
    ) -> Dockerd {
        Dockerd::spawn(
            &DockerdBuild::debian(),
            dir,
            daemon_json,
            env,
            &ns.nsenter(),
        )
    }

    fn spawn(
        build: &DockerdBuild,
        dir: &Path,
        daemon_json: &Path,
        env: &[(&str, &Path)],
        prefix: &[std::ffi::OsString],
    ) -> Dockerd {
        let socket = dir.join("docker.sock");
        let host = format!("unix://{}", socket.display());
        // Not the shared default `docker`, so that it can be removed after.
        let cgroup_parent = unique_name("nvhook-docker");
        let mut cmd = behind(prefix, &build.program("dockerd"), |p| Command::new(p));
        cmd.arg("--config-file")
            .arg(daemon_json)
            .arg("--data-root")
            .arg(dir.join("data"))
            .arg("--exec-root")
            .arg(dir.join("exec"))
            .arg("--pidfile")
            .arg(dir.join("docker.pid"))
            .args(["-H", &host])
            .args(["--iptables=false", "--ip6tables=false", "--bridge=none"])
            .args(["--cgroup-parent", &cgroup_parent]);
        for (key, value) in env {
            cmd.env(key, value);
        }
        let path = env.iter().find(|(key, _)| *key == "PATH");
        if let Some(path) = build.path(path.map(|(_, value)| value.as_os_str())) {
            cmd.env("PATH", path);
        }
        let mut daemon = Daemon::spawn("dockerd", cmd, dir.join("dockerd.log"));
        let docker = build.program("docker");
        daemon.wait_ready(&socket, || {
            Command::new(&docker)
                .args(["-H", &host, "version"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        });
        Dockerd {
            daemon,
            host,
            cgroup_parent,
            client: docker,
        }
    }

    pub fn log(&self) -> String {
        self.daemon.log()
    }

    pub fn pid(&self) -> u32 {
        self.daemon.pid().expect("dockerd runs")
    }

    /// `unix://SOCK`: DOCKER_HOST for programs that run docker themselves.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// `docker -H unix://SOCK ARGS...`, with a timeout.
    pub fn docker(&self) -> Command {
        let mut cmd = timed(&self.client);
        cmd.args(["-H", &self.host]);
        cmd
    }

    pub fn docker_checked(&self, args: &[&str]) -> String {
        stdout_of(self.docker().args(args))
    }

    /// Imports the glibc gpucheck image (`docker import`, its tar written in `work`);
    /// returns its name.
    pub fn import_gpucheck_image(&self, work: &Path) -> String {
        let image = format!("nvhook-test/glibc:{}", unique_name("img"));
        let tar = work.join("glibc-rootfs.tar");
        write_rootfs_tar(super::glibc_image().rootfs(), &tar);
        let imported = self.docker_checked(&["import", tar.to_str().expect("UTF-8 path"), &image]);
        assert!(
            imported.starts_with("sha256:"),
            "docker import said {imported}"
        );
        image
    }

    pub fn run(&self, args: &[&str]) -> Output {
        let mut output = output_of(self.docker().arg("run").args(args));
        output.hook_log = Some(format!("(dockerd log)\n{}", self.log()));
        output
    }

    /// Removes every container, then stops dockerd (which stops its
    /// containerd). Returns whether it stopped on SIGTERM.
    pub fn shutdown(&mut self) -> bool {
        if self.daemon.child.is_some()
            && let Ok(out) = self.docker().args(["ps", "-aq"]).output()
        {
            for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = self.docker().args(["rm", "-f", id]).output();
            }
        }
        let stopped = self.daemon.stop();
        remove_cgroup(&self.cgroup_parent);
        stopped
    }
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        self.shutdown();
    }
}

// ---------------------------------------------------------------- detached runc

/// Mounting cgroup2 in a private namespace gives runc a v2 host without
/// touching the machine's own v1 layout; `$@` is the runtime command line.
/// (The same wrapper as support/runc.rs: the cgroup2 hierarchy is global, so
/// every later runc command sees the container's cgroup through it.)
const CGROUP2_WRAPPER: &str =
    "mount --make-rprivate / && mount -t cgroup2 none /sys/fs/cgroup && exec \"$@\"";

/// A detached container started by `runtime` (runc or nvhook-runtime) with
/// its own `--root`; `delete -f` with plain runc on drop.
pub struct DetachedContainer {
    env: RuntimeEnv,
    root: PathBuf,
    id: String,
    deleted: bool,
}

/// `timeout [unshare -m sh -c WRAPPER sh] program`.
fn in_env(env: RuntimeEnv, program: &Path) -> Command {
    match env {
        RuntimeEnv::CgroupV1 => timed(program),
        RuntimeEnv::CgroupV2 => {
            let mut cmd = timed(&require_program("unshare"));
            cmd.args(["-m", "sh", "-c", CGROUP2_WRAPPER, "sh"])
                .arg(program);
            cmd
        }
    }
}

impl DetachedContainer {
    /// `RUNTIME --root ROOT run -d --bundle BUNDLE ID`; the container's stdio
    /// and the runtime's messages go to `BUNDLE/run-d.log` (a pipe would stay
    /// open as long as the container runs).
    pub fn run(
        env: RuntimeEnv,
        runtime: &Path,
        root: &Path,
        bundle: &Path,
        id: &str,
        vars: &[(&str, &Path)],
    ) -> DetachedContainer {
        let log = bundle.join("run-d.log");
        let out = File::create(&log).expect("create run -d log");
        let mut cmd = in_env(env, runtime);
        cmd.arg("--root")
            .arg(root)
            .args(["run", "-d", "--bundle"])
            .arg(bundle)
            .arg(id)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("dup log"))
            .stderr(out);
        for (key, value) in vars {
            cmd.env(key, value);
        }
        let container = DetachedContainer {
            env,
            root: root.to_owned(),
            id: id.to_owned(),
            deleted: false,
        };
        let status = cmd
            .status()
            .unwrap_or_else(|e| panic!("cannot spawn {cmd:?}: {e}"));
        assert!(
            status.success(),
            "{cmd:?} failed with {status}:\n{}",
            fs::read_to_string(&log).unwrap_or_default()
        );
        container
    }

    /// `runc --root ROOT ARGS...` (plain runc: nvhook-runtime only matters at create).
    pub fn runc(&self) -> Command {
        let mut cmd = in_env(self.env, &require_program("runc"));
        cmd.arg("--root").arg(&self.root);
        cmd
    }

    /// `runc exec ID ARGS...`, output captured.
    pub fn exec(&self, args: &[&str]) -> Output {
        output_of(self.runc().args(["exec", &self.id]).args(args))
    }

    /// The container's init pid, from `runc state`.
    pub fn pid(&self) -> u32 {
        let state = stdout_of(self.runc().args(["state", &self.id]));
        let state: serde_json::Value = serde_json::from_str(&state).expect("runc state is JSON");
        state["pid"].as_u64().expect("runc state has a pid") as u32
    }

    /// cgroup v1 only: the lines of the container's devices.list that name
    /// char major `major` (what the device controller really allows).
    pub fn v1_device_rules(&self, major: u32) -> Vec<String> {
        let cgroups = fs::read_to_string(format!("/proc/{}/cgroup", self.pid()))
            .expect("read the container's /proc/PID/cgroup");
        let path = cgroups
            .lines()
            .find_map(|l| {
                let mut parts = l.splitn(3, ':');
                let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
                controllers
                    .split(',')
                    .any(|c| c == "devices")
                    .then_some(path)
            })
            .expect("the container is in a v1 devices cgroup");
        let list = Path::new("/sys/fs/cgroup/devices")
            .join(path.trim_start_matches('/'))
            .join("devices.list");
        let needle = format!("c {major}:");
        fs::read_to_string(&list)
            .unwrap_or_else(|e| panic!("read {}: {e}", list.display()))
            .lines()
            .filter(|l| l.starts_with(&needle) || l.starts_with("a "))
            .map(str::to_owned)
            .collect()
    }

    pub fn update(&self, flags: &[&str]) {
        run_checked(self.runc().arg("update").args(flags).arg(&self.id));
    }

    pub fn delete(&mut self) {
        if !self.deleted {
            self.deleted = true;
            let _ = self.runc().args(["delete", "-f", &self.id]).output();
        }
    }
}

impl Drop for DetachedContainer {
    fn drop(&mut self) {
        self.delete();
    }
}
