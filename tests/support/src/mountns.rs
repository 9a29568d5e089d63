//! A private copy of the host's mount namespace to run runtimes in, whose whole mount table
//! can then be compared before and after: other processes on the machine cannot blur it.

use std::ffi::OsString;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::cmd::require_program;
use super::runc::RuntimeEnv;

/// Everything private first (cut off from the machine), then shared again, so that it is
/// laid out as on a systemd host: a mount that propagated out of a container would show
/// here. For cgroup v2, the hierarchy is mounted as in support/runc.rs.
/// `$2`: more set-up, a shell command line.
const SETUP: &str = "mount --make-rprivate / && mount --make-rshared / && \
     if [ \"$1\" = v2 ]; then mount -t cgroup2 none /sys/fs/cgroup; fi && \
     eval \"$2\" && echo ready && exec sleep 1000000";

/// A process holding the namespace; killed when dropped, which ends the namespace.
pub struct MountNs {
    holder: Child,
    env: RuntimeEnv,
}

impl MountNs {
    pub fn new(env: RuntimeEnv) -> MountNs {
        MountNs::with_setup(env, "true")
    }

    /// A namespace where the shell command line `setup` (mounts, say) ran after the usual
    /// set-up.
    pub fn with_setup(env: RuntimeEnv, setup: &str) -> MountNs {
        let cgroup = match env {
            RuntimeEnv::CgroupV1 => "v1",
            RuntimeEnv::CgroupV2 => "v2",
        };
        let mut holder = Command::new(require_program("unshare"))
            .args(["-m", "sh", "-c", SETUP, "sh", cgroup, setup])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the mount namespace holder");
        let mut line = String::new();
        let stdout = holder.stdout.take().expect("holder stdout");
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read the holder's ready line");
        let ns = MountNs { holder, env };
        assert_eq!(
            line, "ready\n",
            "the mount namespace holder failed to start"
        );
        ns
    }

    pub fn env(&self) -> RuntimeEnv {
        self.env
    }

    /// The namespace's mount table, line by line, less the trees nodes keep
    /// ([`super::kept_by_the_node`]).
    pub fn table(&self) -> Vec<String> {
        let path = format!("/proc/{}/mountinfo", self.holder.id());
        fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {path}: {e}"))
            .lines()
            .filter(|line| !super::kept_by_the_node(line))
            .map(str::to_owned)
            .collect()
    }

    /// `path` as the namespace sees it, reached from outside through the holder's root.
    pub fn inside(&self, path: &Path) -> PathBuf {
        let relative = path.strip_prefix("/").unwrap_or(path);
        Path::new(&format!("/proc/{}/root", self.holder.id())).join(relative)
    }

    /// The command line prefix that runs a program inside the namespace.
    pub fn nsenter(&self) -> Vec<OsString> {
        vec![
            require_program("nsenter").into(),
            format!("--mount=/proc/{}/ns/mnt", self.holder.id()).into(),
            "--".into(),
        ]
    }
}

impl Drop for MountNs {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// Lines only in `before` (prefixed `-`) and only in `after` (`+`).
pub fn table_diff(before: &[String], after: &[String]) -> Vec<String> {
    let gone = before
        .iter()
        .filter(|l| !after.contains(l))
        .map(|l| format!("- {l}"));
    let new = after
        .iter()
        .filter(|l| !before.contains(l))
        .map(|l| format!("+ {l}"));
    gone.chain(new).collect()
}
