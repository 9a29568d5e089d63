//! cgroup device rules: v1 devices.allow and v2 BPF device programs.
//!
//! The hook calls [`allow_devices`] from the host mount namespace, before it enters the
//! container, so that the container's cgroup lets it open exactly the GPU device nodes.

pub mod bpf;
pub mod mountinfo;
mod proc;

mod v1;
mod v2;

use std::io;
use std::path::PathBuf;

pub use nvhook_model::device_rule::{Access, DeviceKind, DeviceRule};
pub use proc::LocateError;

/// Which cgroup mechanism enforced the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
}

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error(
        "cannot read {path} to find the cgroup of pid {pid}: {source} (is the container still running?)"
    )]
    Read {
        pid: i32,
        path: PathBuf,
        source: io::Error,
    },
    #[error(
        "cannot find the devices cgroup of pid {pid} (/proc/{pid}/cgroup, {mountinfo}): {reason}"
    )]
    NotFound {
        pid: i32,
        mountinfo: &'static str,
        reason: LocateError,
    },
    #[error(
        "cannot write \"{rule}\" to {path}: {source} (nvhook must run as root in the host cgroup namespace)"
    )]
    Write {
        rule: DeviceRule,
        path: PathBuf,
        source: io::Error,
    },
    #[error("cannot open cgroup directory {path}: {source}")]
    OpenDir { path: PathBuf, source: io::Error },
    #[error("bpf({cmd}) failed: {source} ({})", bpf::sys::hint(cmd, source))]
    Bpf {
        cmd: &'static str,
        source: io::Error,
    },
    #[error(
        "the device program {id} attached to {path} cannot be extended: {reason} (was it attached by runc or crun?)"
    )]
    Unsupported {
        id: u32,
        path: PathBuf,
        reason: bpf::Unsupported,
    },
    #[error(
        "the kernel rejected the extended device program for {path}: {source}; verifier: {log}"
    )]
    Rejected {
        path: PathBuf,
        source: io::Error,
        log: String,
    },
}

/// Where the hook looks up mount points: the calling thread's own view, which is what
/// paths it opens resolve against (the same as /proc/self in the single-threaded hook).
const MOUNTINFO: &str = "/proc/thread-self/mountinfo";

/// Whether this process's /sys/fs/cgroup is cgroup v2 alone (the unified hierarchy mounted
/// there), as on a node booted with cgroup v2.
pub fn host_is_unified() -> bool {
    std::fs::read_to_string(MOUNTINFO).is_ok_and(|text| {
        proc::visible_mounts(&text).iter().any(|m| {
            m.mount_point == std::path::Path::new("/sys/fs/cgroup") && m.fstype == "cgroup2"
        })
    })
}

/// The cgroup2 directory of process `pid` where cgroup v2 alone governs it, as a path in the
/// caller's mount namespace; None on a cgroup v1 or hybrid host (the driver's per-cgroup GPU
/// memory limits need cgroup v2). Same requirements as [`allow_devices`].
pub fn unified_dir(pid: i32) -> Result<Option<PathBuf>, CgroupError> {
    match locate_dir(pid)? {
        proc::Location::V1(_) => Ok(None),
        proc::Location::V2(dir) => Ok(Some(dir)),
    }
}

fn locate_dir(pid: i32) -> Result<proc::Location, CgroupError> {
    let cgroup_file = PathBuf::from(format!("/proc/{pid}/cgroup"));
    let read = |path: PathBuf| {
        std::fs::read_to_string(&path).map_err(|source| CgroupError::Read { pid, path, source })
    };
    let membership = read(cgroup_file)?;
    let mountinfo = read(PathBuf::from(MOUNTINFO))?;
    proc::locate(&membership, &mountinfo).map_err(|reason| CgroupError::NotFound {
        pid,
        mountinfo: MOUNTINFO,
        reason,
    })
}

/// Lets the cgroup of process `pid` open the device nodes in `rules`, on top of what it
/// may already open, and says which cgroup version enforced it.
///
/// Must run as root in the host cgroup namespace; reads `/proc/<pid>/cgroup` and the
/// caller's mountinfo to find the cgroup directory.
pub fn allow_devices(pid: i32, rules: &[DeviceRule]) -> Result<CgroupVersion, CgroupError> {
    match locate_dir(pid)? {
        proc::Location::V1(dir) => {
            v1::allow(&dir, rules)?;
            Ok(CgroupVersion::V1)
        }
        proc::Location::V2(dir) => {
            v2::allow(&dir, rules)?;
            Ok(CgroupVersion::V2)
        }
    }
}
