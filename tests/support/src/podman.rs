//! Podman kept off the host's own storage and config: its root, run root, tmpdir, hooks
//! and network config dirs live under a private EngineDir, its containers under a cgroup of
//! their own. Podman 4.3 reads CDI specs only from /etc/cdi and /var/run/cdi, so a spec is
//! installed there under a unique name by [`CdiSpecFile`] and removed when it drops.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::cmd::{require_program, run_checked};
use super::engines::{
    EngineDir, behind, output_of, remove_cgroup, timed, unique_name, write_rootfs_tar,
};
use super::runc::Output;

/// Flags every `podman run` of these tests needs on this machine: runc (Debian's default
/// crun is not what the tests exercise), limits the sandbox allows, no network.
pub(crate) const RUN_FLAGS: &[&str] = &[
    "--rm",
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=1024:1024",
    "--network",
    "none",
];

pub struct Podman {
    dir: EngineDir,
    cgroup_parent: String,
    /// A command line prefix every podman runs behind (`nsenter` into a mount namespace).
    prefix: Vec<OsString>,
    /// The OCI runtime in runc's place (`--runtime`).
    runtime: Option<PathBuf>,
    /// The podman program: Debian 12's (4.3), or sid's (5.x) through its wrapper.
    program: PathBuf,
}

impl Default for Podman {
    fn default() -> Podman {
        Podman::new()
    }
}

impl Podman {
    /// Podman's config and storage in a directory of its own, and a cgroup parent.
    pub fn new() -> Podman {
        let dir = EngineDir::new("podman");
        for sub in ["hooks.d", "networks"] {
            fs::create_dir_all(dir.path().join(sub)).expect("create podman config dir");
        }
        Podman {
            dir,
            cgroup_parent: unique_name("nvhook-podman"),
            prefix: Vec::new(),
            runtime: None,
            program: require_program("podman"),
        }
    }

    /// Like `new`, Debian sid's Podman 5 (`scripts/sid-runtimes.sh`), whose `runc` is sid's
    /// runc 1.3 (its wrapper's namespace has the sid root's /usr).
    pub fn sid() -> Podman {
        let mut podman = Podman::new();
        podman.program = super::engines::sid_runtime_bin("podman");
        podman
    }

    /// Like `new`, every podman run inside the mount namespace `ns`.
    pub fn inside(ns: &super::MountNs) -> Podman {
        Podman::new().within(ns)
    }

    /// This podman, every run inside the mount namespace `ns` (a cgroup2 one, say).
    pub fn within(mut self, ns: &super::MountNs) -> Podman {
        self.prefix = ns.nsenter();
        self
    }

    /// Like `new`, with `runtime` (a path: youki) in runc's place.
    pub fn with_runtime(runtime: &Path) -> Podman {
        Podman::new().running(runtime)
    }

    /// This podman with `runtime` (a path, or a name Podman looks up: `crun`) in runc's place.
    pub fn running(mut self, runtime: &Path) -> Podman {
        self.runtime = Some(runtime.to_path_buf());
        self
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The cgroup every container of this instance is made under (`--cgroup-parent`), relative
    /// to the hierarchy's root.
    pub fn cgroup_parent(&self) -> &str {
        &self.cgroup_parent
    }

    /// `podman` with every global path private, wrapped in a timeout.
    pub fn command(&self) -> Command {
        let mut cmd = behind(&self.prefix, &self.program, timed);
        cmd.args(global_flags(self.dir()));
        // The last --runtime wins.
        if let Some(runtime) = &self.runtime {
            cmd.arg("--runtime").arg(runtime);
        }
        cmd
    }

    /// Imports `rootfs` as image `name` (`podman import` of a plain tar).
    pub fn import(&self, rootfs: &Path, name: &str) {
        let tar = self.dir().join("rootfs.tar");
        write_rootfs_tar(rootfs, &tar);
        run_checked(self.command().arg("import").arg(&tar).arg(name));
        fs::remove_file(&tar).expect("remove rootfs tar");
    }

    /// `podman run --rm ... EXTRA IMAGE ARGS...` in this instance's own cgroup parent.
    pub fn run(&self, extra: &[&str], image: &str, args: &[&str]) -> Output {
        output_of(
            self.command()
                .arg("run")
                .args(RUN_FLAGS)
                .args(["--cgroup-parent", &format!("/{}", self.cgroup_parent)])
                .args(extra)
                .arg(image)
                .args(args),
        )
    }
}

/// Podman's global flags that keep its storage, state, hooks and networks under `dir`
/// (whose `hooks.d` and `networks` must exist), with runc, cgroupfs and file events.
pub(crate) fn global_flags(dir: &Path) -> Vec<OsString> {
    let mut flags: Vec<OsString> = Vec::new();
    for (flag, name) in [
        ("--root", "root"),
        ("--runroot", "runroot"),
        ("--tmpdir", "tmp"),
        ("--volumepath", "volumes"),
        ("--hooks-dir", "hooks.d"),
        ("--network-config-dir", "networks"),
    ] {
        flags.push(flag.into());
        flags.push(dir.join(name).into());
    }
    for arg in [
        "--cgroup-manager",
        "cgroupfs",
        "--events-backend",
        "file",
        "--runtime",
        "runc",
    ] {
        flags.push(arg.into());
    }
    flags
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self.command().args(["rm", "-af"]).output();
        remove_cgroup(&self.cgroup_parent);
    }
}

/// A CDI spec file in /var/run/cdi, where Podman 4.3 looks, under a name unique to this test
/// process; removed on drop, with the directory when this made it.
pub struct CdiSpecFile {
    path: PathBuf,
    made_dir: bool,
    /// Podman reads every spec in the directory: two tests' specs of one kind name the same
    /// devices, and Podman refuses both. One spec at a time per test binary.
    _exclusive: std::sync::MutexGuard<'static, ()>,
}

impl CdiSpecFile {
    pub const DIR: &'static str = "/var/run/cdi";

    /// A path for a spec not written yet.
    pub fn new(extension: &str) -> CdiSpecFile {
        static SPEC_DIR: std::sync::Mutex<()> = std::sync::Mutex::new(());
        // A test that failed while holding it still left the directory as Drop cleaned it.
        let exclusive = SPEC_DIR.lock().unwrap_or_else(|e| e.into_inner());
        let dir = Path::new(Self::DIR);
        let made_dir = !dir.exists();
        fs::create_dir_all(dir).expect("create /var/run/cdi");
        CdiSpecFile {
            path: dir.join(format!("{}.{extension}", unique_name("nvhook-test"))),
            made_dir,
            _exclusive: exclusive,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for CdiSpecFile {
    /// Removes the spec and the files nvhook wrote beside it (`<name>-imex-channel.yaml`, ...,
    /// and its hook's argument files, `.<name>.<sum>.args`).
    fn drop(&mut self) {
        if let Err(err) = fs::remove_file(&self.path) {
            eprintln!("cleanup: rm {}: {err}", self.path.display());
        }
        let stem = self
            .path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned());
        let args_prefix = self
            .path
            .file_name()
            .map(|n| format!(".{}.", n.to_string_lossy()));
        let beside = |p: &Path| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            let spec = matches!((&stem, &name), (Some(stem), Some(name)) if name.starts_with(&format!("{stem}-")));
            let args = matches!((&args_prefix, &name), (Some(prefix), Some(name)) if name.starts_with(prefix) && name.ends_with(".args"));
            spec || args
        };
        for entry in fs::read_dir(Self::DIR).into_iter().flatten().flatten() {
            if beside(&entry.path()) {
                let _ = fs::remove_file(entry.path());
            }
        }
        if self.made_dir {
            let _ = fs::remove_dir(Self::DIR);
        }
    }
}
