//! Running a bundle with runc under the host's cgroup v1 or under cgroup v2.

use std::fmt;
use std::process::{Command, ExitStatus};

use super::bundle::Bundle;
use super::cmd::require_program;

#[derive(Clone, Copy, Debug)]
pub enum RuntimeEnv {
    /// The machine's default hierarchy: runc writes devices.allow/deny.
    CgroupV1,
    /// cgroup2 mounted over /sys/fs/cgroup in a private mount namespace:
    /// runc attaches a BPF_CGROUP_DEVICE program instead.
    CgroupV2,
}

/// Mounting cgroup2 in a private namespace gives runc a v2 host without
/// touching the machine's own v1 layout; `$@` is the runc command line.
const CGROUP2_WRAPPER: &str =
    "mount --make-rprivate / && mount -t cgroup2 none /sys/fs/cgroup && exec \"$@\"";

/// Seconds before a hung container is killed, so a test fails instead of hanging.
const RUN_TIMEOUT_S: &str = "120";

pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// The node's nvhook.log, attached by tests that ran the hook, so that a
    /// failed assertion shows what the hook did.
    pub hook_log: Option<String>,
}

impl Output {
    /// What the prestart hook wrote on stderr, as runc reports it in its error line
    /// (`... error running hook #0: ..., stderr: nvhook: ...\n"`), unescaped.
    pub fn hook_stderr(&self) -> Option<String> {
        let line = self.stderr.lines().find(|l| l.contains("error running"))?;
        let (_, quoted) = line.split_once(", stderr: ")?;
        let quoted = quoted.strip_suffix('"').unwrap_or(quoted);
        let mut out = String::new();
        let mut chars = quoted.chars();
        while let Some(c) = chars.next() {
            if c != '\\' {
                out.push(c);
                continue;
            }
            match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some(other) => out.push(other),
                None => out.push('\\'),
            }
        }
        Some(out)
    }

    /// Asserts that the container never ran and that the hook's whole stderr is `line`.
    #[track_caller]
    pub fn assert_refused_by_hook(&self, line: &str) {
        assert!(!self.status.success(), "the runtime succeeded\n{self}");
        assert!(self.stdout.is_empty(), "the container ran\n{self}");
        assert_eq!(
            self.hook_stderr().as_deref(),
            Some(format!("{line}\n").as_str()),
            "\n{self}"
        );
    }

    /// Asserts, from gpucheck's `--dev /dev/nvidiaN` lines for GPUs `0..total`, that the
    /// container can reach exactly the GPUs in `visible` (ENXIO: allowed, no driver behind
    /// the simulated node) and that the others' nodes are absent.
    #[track_caller]
    pub fn assert_gpus(&self, total: u32, visible: &[u32]) {
        for index in 0..total {
            let verdict = if visible.contains(&index) {
                "ENXIO"
            } else {
                "absent"
            };
            self.assert_lines(&[&format!("dev /dev/nvidia{index} {verdict}")]);
        }
    }

    pub fn has_line(&self, line: &str) -> bool {
        self.stdout.lines().any(|l| l == line)
    }

    #[track_caller]
    pub fn assert_success(&self) {
        assert!(self.status.success(), "container failed\n{self}");
    }

    #[track_caller]
    pub fn assert_lines(&self, lines: &[&str]) {
        for line in lines {
            assert!(self.has_line(line), "missing line {line:?}\n{self}");
        }
    }
}

impl fmt::Display for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "status: {}\n--- stdout\n{}--- stderr\n{}",
            self.status, self.stdout, self.stderr
        )?;
        match &self.hook_log {
            Some(log) => write!(f, "--- nvhook.log\n{log}"),
            None => Ok(()),
        }
    }
}

/// `runc run` in the foreground, then `runc delete -f` whatever happened.
pub fn run_container(bundle: &Bundle, env: RuntimeEnv) -> Output {
    bundle.write_config();
    let output = runc(bundle, env)
        .arg("run")
        .arg("--bundle")
        .arg(bundle.dir())
        .arg(bundle.id())
        .output()
        .expect("spawn runc run");
    delete(bundle, env);
    Output {
        status: output.status,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        hook_log: None,
    }
}

/// A foreground run removes its container when it ends; this is for runs that
/// failed or timed out half way, so its own failure ("does not exist") is moot.
fn delete(bundle: &Bundle, env: RuntimeEnv) {
    let _ = runc(bundle, env)
        .args(["delete", "-f", bundle.id()])
        .output();
}

/// `runc --root <state>` wrapped in a timeout and, for v2, in the namespace.
fn runc(bundle: &Bundle, env: RuntimeEnv) -> Command {
    let mut cmd = Command::new(require_program("timeout"));
    cmd.args(["--kill-after=5", RUN_TIMEOUT_S]);
    if let RuntimeEnv::CgroupV2 = env {
        cmd.arg(require_program("unshare"))
            .args(["-m", "sh", "-c", CGROUP2_WRAPPER, "sh"]);
    }
    cmd.arg(require_program("runc"))
        .arg("--root")
        .arg(bundle.state_dir());
    cmd
}
