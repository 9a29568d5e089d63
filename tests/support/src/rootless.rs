//! Rootless Podman run by a real unprivileged user: its own user namespace (newuidmap and
//! the user's /etc/subuid and /etc/subgid ranges), vfs storage, no cgroup device control.
//!
//! Nothing of it reaches the host. The user's home, runtime dir and storage live in a
//! private EngineDir, and podman runs in a private mount namespace in which
//! - /run is a fresh tmpfs, so a CDI spec goes to /run/cdi (Podman 4.3 reads specs only
//!   from /etc/cdi and /var/run/cdi) without touching the host's;
//! - /dev is an overlay of the host's /dev with a simulated node's device nodes
//!   bind-mounted at /dev/nvidia*: in a user namespace runc cannot make device nodes, so it
//!   bind-mounts each from the host path equal to the container path (an OCI config
//!   carries no other), and the nodes must sit where the CDI spec's host paths say.
//!
//! The test user is made when missing, with subordinate id ranges when it has none.

use std::fs;
use std::os::unix::fs::{PermissionsExt, chown};
use std::path::{Path, PathBuf};
use std::process::Command;

use super::bundle::nvhook_bin;
use super::cmd::{require_program, run_checked, stdout_of};
use super::engines::{EngineDir, output_of, sid_runtime_bin, timed, write_rootfs_tar};
use super::mountns::MountNs;
use super::node::{NodeOptions, SimNode};
use super::podman::{RUN_FLAGS, global_flags};
use super::runc::{Output, RuntimeEnv};

/// The unprivileged user the tests run Podman as.
pub const USER: &str = "nvhook-rootless";
/// Subordinate ids given to the user when it has none: a full 16-bit range.
const SUBID_COUNT: u32 = 65536;
/// Where shadow's useradd starts subordinate ranges (login.defs SUB_UID_MIN).
const SUBID_MIN: u32 = 100_000;

/// Run in the namespace once, with a directory of the engine dir: a private /run whose CDI
/// spec directory is that directory, so that a spec's path outside is a path inside too (the
/// hook reads its arguments' file beside the spec by the path the spec names).
const RUN_SETUP: &str = r#"set -e
mount -t tmpfs -o mode=755 nvhook-run /run
mkdir /run/cdi
mount --bind "$1" /run/cdi"#;

/// Run in the namespace with a scratch directory and a node's dev dir: /dev becomes an
/// overlay of itself (the host's /dev/pts, /dev/mqueue, ... mounted again on top) holding
/// the node's device nodes, each bind-mounted so that it is the very node the spec names,
/// and a private /dev/shm for Podman's lock file.
const DEV_SETUP: &str = r#"set -e
work=$1 node_dev=$2
mount -t tmpfs nvhook-dev "$work"
mkdir "$work/host" "$work/upper" "$work/work"
mount --rbind /dev "$work/host"
mount -t overlay nvhook-dev -o "lowerdir=/dev,upperdir=$work/upper,workdir=$work/work" /dev
for sub in "$work"/host/*; do
  if mountpoint -q "$sub"; then mount --rbind "$sub" "/dev/${sub##*/}"; fi
done
mount -t tmpfs -o mode=1777 nvhook-shm /dev/shm
for node in "$node_dev"/nvidia*; do
  if [ -c "$node" ]; then touch "/dev/${node##*/}"; mount --bind "$node" "/dev/${node##*/}"; fi
done
"#;

/// Rootless Podman for one test; removes its containers and its pause process on drop.
pub struct RootlessPodman {
    ns: MountNs,
    dir: EngineDir,
    uid: u32,
    gid: u32,
    /// sid's Podman 5 through its wrapper (which runs it as the user once it has made its
    /// namespace, as root), not Debian 12's.
    sid: bool,
    /// One rootless Podman of the test user at a time: a second one would join the first's
    /// user namespace (its pause process), whose mappings are not its own.
    _one_at_a_time: std::sync::MutexGuard<'static, ()>,
}

impl Default for RootlessPodman {
    fn default() -> RootlessPodman {
        RootlessPodman::new()
    }
}

impl RootlessPodman {
    /// Debian 12's Podman 4.3.
    pub fn new() -> RootlessPodman {
        RootlessPodman::of(false)
    }

    /// Debian sid's Podman 5 (`scripts/sid-runtimes.sh`), over sid's runc 1.3.
    pub fn sid() -> RootlessPodman {
        RootlessPodman::of(true)
    }

    fn of(sid: bool) -> RootlessPodman {
        static USER_TAKEN: std::sync::Mutex<()> = std::sync::Mutex::new(());
        // A test that failed while holding it still dropped its Podman.
        let one_at_a_time = USER_TAKEN.lock().unwrap_or_else(|e| e.into_inner());
        require_program("newuidmap");
        require_program("newgidmap");
        let (uid, gid) = ensure_user();
        let dir = EngineDir::new("rootless");
        // The user walks through to its own dir and to the node's files.
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755))
            .expect("chmod the rootless engine dir");
        let podman = RootlessPodman {
            ns: MountNs::new(RuntimeEnv::CgroupV1),
            dir,
            uid,
            gid,
            sid,
            _one_at_a_time: one_at_a_time,
        };
        for sub in ["", "home", "xdg", "hooks.d", "networks"] {
            let path = podman.user_dir().join(sub);
            fs::create_dir_all(&path).expect("create the user's podman dirs");
            fs::set_permissions(&path, fs::Permissions::from_mode(0o700)).expect("chmod");
            chown(&path, Some(uid), Some(gid)).expect("chown to the test user");
        }
        let cdi = podman.cdi_dir();
        fs::create_dir(&cdi).expect("create the CDI spec directory");
        podman.setup(RUN_SETUP, &[&cdi]);
        podman
    }

    /// The namespace's /run/cdi, seen from outside at the same path as from inside.
    fn cdi_dir(&self) -> PathBuf {
        self.dir.path().join("cdi")
    }

    /// The test user's uid and gid.
    pub fn user_ids(&self) -> (u32, u32) {
        (self.uid, self.gid)
    }

    /// Where the user's home, runtime dir and storage live (the user owns it).
    fn user_dir(&self) -> PathBuf {
        self.dir.path().join("user")
    }

    fn setup(&self, script: &str, args: &[&Path]) {
        let prefix = self.ns.nsenter();
        run_checked(
            Command::new(&prefix[0])
                .args(&prefix[1..])
                .args(["sh", "-c", script, "sh"])
                .args(args),
        );
    }

    /// A simulated node the user can read, whose hook entries name a copy of nvhook the
    /// user can run, with its device nodes at /dev in the namespace. Call it once.
    pub fn node(&self, gpus: u32) -> SimNode {
        let hook = self.dir.path().join("nvhook");
        fs::copy(nvhook_bin(), &hook).expect("copy nvhook for the test user");
        let node = SimNode::build(&NodeOptions {
            parent: Some(self.dir.path().to_owned()),
            hook: Some(hook),
            ..NodeOptions::gpus(gpus)
        });
        fs::set_permissions(node.root(), fs::Permissions::from_mode(0o755))
            .expect("chmod the node dir");
        let work = self.dir.path().join("dev");
        fs::create_dir(&work).expect("create the /dev overlay's dir");
        self.setup(DEV_SETUP, &[&work, &node.dev_root().join("dev")]);
        node
    }

    /// Where to write a CDI spec named `file_name` for this Podman: its /run/cdi, at a path
    /// both the host and the namespace see.
    pub fn cdi_spec_path(&self, file_name: &str) -> PathBuf {
        self.cdi_dir().join(file_name)
    }

    /// `podman` as the test user with a clean environment, everything private, vfs storage.
    pub fn command(&self) -> Command {
        let user = self.user_dir();
        let prefix = self.ns.nsenter();
        let mut cmd = timed(Path::new(&prefix[0]));
        cmd.args(&prefix[1..]);
        if !self.sid {
            cmd.arg(require_program("runuser")).args(["-u", USER, "--"]);
        }
        cmd.arg(require_program("env"))
            .arg("-i")
            .arg(format!("HOME={}", user.join("home").display()))
            .arg(format!("XDG_RUNTIME_DIR={}", user.join("xdg").display()))
            .arg(format!("USER={USER}"))
            .arg("PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin");
        if self.sid {
            cmd.arg(format!("NVHOOK_SID_USER={USER}"))
                .arg(sid_runtime_bin("podman"));
        } else {
            cmd.arg(require_program("podman"));
        }
        cmd.args(global_flags(&user))
            .args(["--storage-driver", "vfs"]);
        cmd
    }

    /// Imports `rootfs` into the user's storage as image `name`.
    pub fn import(&self, rootfs: &Path, name: &str) {
        let tar = self.user_dir().join("rootfs.tar");
        write_rootfs_tar(rootfs, &tar);
        chown(&tar, Some(self.uid), Some(self.gid)).expect("chown the rootfs tar");
        run_checked(self.command().arg("import").arg(&tar).arg(name));
        fs::remove_file(&tar).expect("remove rootfs tar");
    }

    /// `podman run --rm ... EXTRA IMAGE ARGS...` as the test user.
    pub fn run(&self, extra: &[&str], image: &str, args: &[&str]) -> Output {
        output_of(
            self.command()
                .arg("run")
                .args(RUN_FLAGS)
                .args(extra)
                .arg(image)
                .args(args),
        )
    }
}

impl Drop for RootlessPodman {
    fn drop(&mut self) {
        let _ = self.command().args(["rm", "-af"]).output();
        // Rootless Podman keeps its user namespace alive with a pause process, which would
        // outlive the test and pin the namespace it was started in.
        // Podman 4 writes its pid in its tmpdir, Podman 5 in the runtime dir.
        for pid_file in ["tmp/pause.pid", "xdg/libpod/tmp/pause.pid"] {
            if let Some(pid) = fs::read_to_string(self.user_dir().join(pid_file))
                .ok()
                .and_then(|text| text.trim().parse::<libc::pid_t>().ok())
            {
                // SAFETY: kill takes plain integers; the pid is the one Podman wrote.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

/// The processes of user `uid` still running (zombies aside), as `pid name` lines: the
/// test user's are gone once a [`RootlessPodman`] dropped.
pub fn processes_of(uid: u32) -> Vec<String> {
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc").expect("read /proc").flatten() {
        let Ok(status) = fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(str::trim)
                .unwrap_or_default()
                .to_owned()
        };
        let real_uid = field("Uid:").split_whitespace().next().map(str::to_owned);
        if real_uid == Some(uid.to_string()) && !field("State:").starts_with('Z') {
            found.push(format!(
                "{} {}",
                entry.file_name().display(),
                field("Name:")
            ));
        }
    }
    found
}

/// The test user's uid and gid, after making the user and its subordinate id ranges where
/// they are missing.
fn ensure_user() -> (u32, u32) {
    let id = |flag: &str| {
        Command::new(require_program("id"))
            .args([flag, USER])
            .output()
    };
    if !id("-u").is_ok_and(|o| o.status.success()) {
        run_checked(
            Command::new(require_program("useradd"))
                .args([
                    "--user-group",
                    "--no-create-home",
                    "--home-dir",
                    "/nonexistent",
                ])
                .args(["--shell", "/usr/sbin/nologin", USER]),
        );
    }
    for (file, flag) in [
        ("/etc/subuid", "--add-subuids"),
        ("/etc/subgid", "--add-subgids"),
    ] {
        let text = fs::read_to_string(file).unwrap_or_default();
        if !text.lines().any(|l| l.starts_with(&format!("{USER}:"))) {
            let start = next_free_subid(&text);
            let range = format!("{start}-{}", start + SUBID_COUNT - 1);
            run_checked(Command::new(require_program("usermod")).args([flag, &range, USER]));
        }
    }
    let number = |flag: &str| {
        stdout_of(Command::new(require_program("id")).args([flag, USER]))
            .trim()
            .parse()
            .expect("id prints a number")
    };
    (number("-u"), number("-g"))
}

/// The first id after every range of a subuid or subgid file, and at least [`SUBID_MIN`].
fn next_free_subid(text: &str) -> u32 {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(':').skip(1);
            let start: u32 = fields.next()?.parse().ok()?;
            let count: u32 = fields.next()?.parse().ok()?;
            start.checked_add(count)
        })
        .fold(SUBID_MIN, u32::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_subordinate_range_follows_every_other() {
        assert_eq!(next_free_subid(""), SUBID_MIN);
        assert_eq!(
            next_free_subid("alice:100000:65536\nbob:165536:65536\n# note\n"),
            231_072
        );
        assert_eq!(next_free_subid("root:1000:10\n"), SUBID_MIN);
    }
}
