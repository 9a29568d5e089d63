//! Running a bundle with runc under the host's cgroup v1 or under cgroup v2.

use std::fmt;
use std::path::Path;
use std::process::{Command, ExitStatus};

use super::bundle::Bundle;
use super::cmd::require_program;
use super::mountns::MountNs;

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
    run_container_with(bundle, env, &require_program("runc"), &[])
}

/// Like [`run_container`], with `runtime` (nvhook-runtime) in runc's place and `vars` added
/// to its environment.
pub fn run_container_with(
    bundle: &Bundle,
    env: RuntimeEnv,
    runtime: &Path,
    vars: &[(&str, &Path)],
) -> Output {
    let output = run_with(bundle, env, runtime, vars, &["run"]);
    delete(bundle, env);
    output
}

/// `RUNTIME --root <state> RUN_ARGS --bundle B ID` with `vars` added to its environment.
fn run_with(
    bundle: &Bundle,
    env: RuntimeEnv,
    runtime: &Path,
    vars: &[(&str, &Path)],
    run_args: &[&str],
) -> Output {
    bundle.write_config();
    let mut cmd = runtime_command(bundle, env, runtime);
    for (key, value) in vars {
        cmd.env(key, value);
    }
    let output = cmd
        .args(run_args)
        .arg("--bundle")
        .arg(bundle.dir())
        .arg(bundle.id())
        .output()
        .expect("spawn the runtime's run");
    Output {
        status: output.status,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        hook_log: None,
    }
}

/// Like [`run_container_with`], as `RUNTIME run --detach`, then the container's output read
/// until it exits, and `RUNTIME delete -f`: for youki, whose foreground `run` can miss the exit
/// of a container that ends at once and wait for ever. The status is the runtime's (the
/// container made and started, its hooks passed), not the container's exit code.
pub fn run_detached_with(
    bundle: &Bundle,
    env: RuntimeEnv,
    runtime: &Path,
    vars: &[(&str, &Path)],
) -> Output {
    // The container keeps the pipes: the output is read until it has exited.
    let output = run_with(bundle, env, runtime, vars, &["run", "--detach"]);
    let _ = runtime_command(bundle, env, runtime)
        .args(["delete", "-f", bundle.id()])
        .output();
    remove_leftover_cgroup(bundle.id());
    output
}

/// youki names a container's cgroup `:youki:<id>` when the spec names none, and its `delete`
/// leaves that directory behind in every hierarchy of a cgroup v1 or hybrid host: one per run,
/// on the test machine for good. Each is removed with rmdir, which only an empty cgroup allows.
fn remove_leftover_cgroup(id: &str) {
    let name = format!(":youki:{id}");
    let root = Path::new("/sys/fs/cgroup");
    let hierarchies = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path());
    for hierarchy in hierarchies.chain([root.to_path_buf()]) {
        let _ = std::fs::remove_dir(hierarchy.join(&name));
    }
}

/// `RUNTIME --root <state> run` inside `ns`, where RUNTIME is runc or a drop-in for it
/// (nvhook-runtime) and `vars` its only additions to the environment; then `runc delete -f`.
pub fn run_in_ns(bundle: &Bundle, ns: &MountNs, runtime: &Path, vars: &[(&str, &str)]) -> Output {
    bundle.write_config();
    let mut cmd = Command::new(require_program("timeout"));
    cmd.args(["--kill-after=5", RUN_TIMEOUT_S])
        .args(ns.nsenter())
        // Only the runtime gets `vars`, not the wrappers in front of it.
        .arg(require_program("env"))
        .args(vars.iter().map(|(k, v)| format!("{k}={v}")))
        .arg(runtime)
        .arg("--root")
        .arg(bundle.state_dir())
        .arg("run")
        .arg("--bundle")
        .arg(bundle.dir())
        .arg(bundle.id());
    let output = cmd.output().expect("spawn the runtime");
    let _ = Command::new(require_program("runc"))
        .arg("--root")
        .arg(bundle.state_dir())
        .args(["delete", "-f", bundle.id()])
        .output();
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
    runtime_command(bundle, env, &require_program("runc"))
}

fn runtime_command(bundle: &Bundle, env: RuntimeEnv, runtime: &Path) -> Command {
    let mut cmd = Command::new(require_program("timeout"));
    cmd.args(["--kill-after=5", RUN_TIMEOUT_S]);
    if let RuntimeEnv::CgroupV2 = env {
        cmd.arg(require_program("unshare"))
            .args(["-m", "sh", "-c", CGROUP2_WRAPPER, "sh"]);
    }
    cmd.arg(runtime).arg("--root").arg(bundle.state_dir());
    cmd
}
