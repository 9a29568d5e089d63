//! One container start the way an engine's shim does it: `create`, `start`, wait for the
//! container's process to exit, `delete`, with either runc or nvhook-runtime.

use crate::support::Bundle;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub enum Runtime {
    Runc,
    /// nvhook-runtime reading this nvhook config (NVHOOK_CONFIG), exec'ing runc.
    NvhookRuntime(PathBuf),
}

/// Makes this process the reaper of the containers it starts, as containerd's shim is:
/// `runc create` exits and leaves the container's init to the nearest subreaper.
pub fn become_subreaper() {
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER only sets a flag on this process.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    assert_eq!(rc, 0, "prctl(PR_SET_CHILD_SUBREAPER) failed");
}

/// Wall time and the CPU time of every process involved (runtimes, hooks, the container).
pub struct Cost {
    pub wall: Duration,
    pub cpu: Duration,
    /// Wall time of each phase, in the order of [`PHASES`].
    pub phases: [Duration; 4],
}

pub const PHASES: [&str; 4] = ["create", "start", "wait", "delete"];

/// Runs one create/start/wait/delete cycle of `bundle` (config.json as written).
pub fn run(runtime: &Runtime, bundle: &Bundle) -> Cost {
    let pid_file = bundle.dir().join("container.pid");
    let _ = std::fs::remove_file(&pid_file);
    let id = bundle.id();
    let cpu_before = children_cpu();
    let started = Instant::now();
    invoke(
        runtime,
        bundle,
        &["create", "--pid-file"],
        &[&pid_file, Path::new(id)],
    );
    let created = Instant::now();
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .expect("read the container's pid file")
        .trim()
        .parse()
        .expect("pid file holds a number");
    invoke(runtime, bundle, &["start"], &[Path::new(id)]);
    let running = Instant::now();
    wait_for(pid);
    let exited = Instant::now();
    invoke(runtime, bundle, &["delete"], &[Path::new(id)]);
    let deleted = Instant::now();
    Cost {
        wall: deleted - started,
        cpu: children_cpu() - cpu_before,
        phases: [
            created - started,
            running - created,
            exited - running,
            deleted - exited,
        ],
    }
}

/// User + system time of all waited-for descendants: each runtime waits for its hooks, and
/// this process (the subreaper) waits for the runtimes and the container.
fn children_cpu() -> Duration {
    // SAFETY: a zeroed rusage is a valid out-value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) };
    tv(u.ru_utime) + tv(u.ru_stime)
}

pub fn tv(t: libc::timeval) -> Duration {
    Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
}

/// `RUNTIME --root <state> COMMAND FLAGS... PATHS...` with the bundle as cwd (runc's
/// default bundle), stdio away from the terminal and stderr kept for a failure message.
fn invoke(runtime: &Runtime, bundle: &Bundle, command: &[&str], rest: &[&Path]) {
    let err_path = bundle.dir().join("runtime.stderr");
    let mut cmd = match runtime {
        Runtime::Runc => Command::new(runc()),
        Runtime::NvhookRuntime(config) => {
            let mut c = Command::new(crate::support::engines::nvhook_runtime_bin());
            c.env("NVHOOK_CONFIG", config);
            c
        }
    };
    cmd.arg("--root")
        .arg(bundle.state_dir())
        .args(command)
        .args(rest)
        .current_dir(bundle.dir())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(&err_path).expect("create the runtime's stderr file"));
    let status = cmd.status().expect("spawn the runtime");
    if !status.success() {
        let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
        panic!("{cmd:?} failed with {status}\n{stderr}");
    }
}

fn wait_for(pid: i32) {
    let mut status = 0;
    // SAFETY: waitpid on our own (reparented) child with a valid out-pointer.
    let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(
        rc,
        pid,
        "waitpid({pid}): {} (is this process the container's subreaper?)",
        std::io::Error::last_os_error()
    );
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the container's process ended with wait status {status:#x}"
    );
}

pub fn runc() -> &'static Path {
    static RUNC: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    RUNC.get_or_init(|| crate::support::require_program("runc"))
}

/// Wall time of `program args` run to completion (for the exec cost of a front end).
pub fn time_command(program: &Path, args: &[&str], env: &[(&str, &Path)]) -> Duration {
    let mut cmd = Command::new(program);
    cmd.args(args).stdin(Stdio::null()).stdout(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let started = Instant::now();
    let status = cmd.status().expect("spawn");
    let elapsed = started.elapsed();
    assert!(status.success(), "{cmd:?} failed with {status}");
    elapsed
}
