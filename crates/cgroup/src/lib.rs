//! cgroup device rules: v1 devices.allow and v2 BPF device programs.
//!
//! The hook calls [`allow_devices`] from the host mount namespace, before it enters the
//! container, so that the container's cgroup lets it open exactly the GPU device nodes.

pub mod bpf;
pub mod mountinfo;
mod proc;
pub mod spec_path;

mod v1;
mod v2;

use std::io;
use std::path::{Path, PathBuf};

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
    #[error("cannot find this container's cgroup: {why}")]
    FromSpec { why: String },
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

/// This process's own cgroup2 directory, where cgroup v2 alone governs it (None under v1), as
/// a path in its mount namespace: from `/proc/self/cgroup`, or, where the process sees its
/// cgroup as `/` (a cgroup namespace of its own, as a createContainer hook has), from the
/// container's `cgroups_path` (runc's default for none: `/<container id>`), checked to hold this
/// process (or one child of it that does: crun may put the container's processes in a child of
/// the cgroup it was given).
pub fn own_unified_dir(
    cgroups_path: Option<&str>,
    container_id: &str,
) -> Result<Option<PathBuf>, CgroupError> {
    let pid = std::process::id() as i32;
    if !host_is_unified() {
        return Ok(None);
    }
    let read = |path: &str| read_proc(pid, PathBuf::from(path));
    let membership = read("/proc/self/cgroup")?;
    let seen = membership
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or("/");
    if seen != "/" && !seen.contains("..") {
        // /proc/self, not /proc/<pid>: this process may be in a PID namespace of its own, and
        // /proc the host's.
        let mountinfo = read(MOUNTINFO)?;
        let location =
            proc::locate(&membership, &mountinfo).map_err(|reason| CgroupError::NotFound {
                pid,
                mountinfo: MOUNTINFO,
                reason,
            })?;
        return not_the_root(location);
    }
    let root = std::path::Path::new("/sys/fs/cgroup");
    let not_found = |why: String| CgroupError::FromSpec { why };
    let default = format!("/{container_id}");
    let cgroups_path = cgroups_path.or(Some(default.as_str()).filter(|_| !container_id.is_empty()));
    let Some(relative) = cgroups_path.and_then(spec_path::relative_dir) else {
        return Err(not_found(format!(
            "its cgroup namespace hides it and cgroupsPath {cgroups_path:?} names no cgroup"
        )));
    };
    let dir = root.join(relative);
    let holds_us = |dir: &Path| holds_process(dir, pid);
    if holds_us(&dir) {
        return Ok(Some(dir));
    }
    let child = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.is_dir() && holds_us(p));
    child.map(Some).ok_or_else(|| {
        not_found(format!(
            "{} (from cgroupsPath {cgroups_path:?}) does not hold this process",
            dir.display()
        ))
    })
}

/// The cgroup2 directory of process `pid` where cgroup v2 alone governs it, as a path in the
/// caller's mount namespace; None on a cgroup v1 or hybrid host (the driver's per-cgroup GPU
/// memory limits need cgroup v2). Same requirements as [`allow_devices`].
pub fn unified_dir(pid: i32) -> Result<Option<PathBuf>, CgroupError> {
    not_the_root(locate_dir(pid)?)
}

/// A container's cgroup2 directory, never the hierarchy's root: what is set there would hold
/// every process of the host.
fn not_the_root(location: proc::Location) -> Result<Option<PathBuf>, CgroupError> {
    match location {
        proc::Location::V1(_) => Ok(None),
        proc::Location::V2(dir) if dir == std::path::Path::new("/sys/fs/cgroup") => {
            Err(CgroupError::FromSpec {
                why: "it resolves to the root of the cgroup hierarchy, the whole host's".into(),
            })
        }
        proc::Location::V2(dir) => Ok(Some(dir)),
    }
}

/// A procfs file about process `pid`'s cgroups. It says its size is 0, so a plain read starts
/// with small probing reads, each a syscall; most of these files fit the first buffer.
fn read_proc(pid: i32, path: PathBuf) -> Result<String, CgroupError> {
    let mut text = String::with_capacity(16 * 1024);
    std::fs::File::open(&path)
        .and_then(|mut f| std::io::Read::read_to_string(&mut f, &mut text))
        .map_err(|source| CgroupError::Read { pid, path, source })?;
    Ok(text)
}

/// The cgroup directory of process `pid`: where most hosts have it, when it is there
/// ([`proc::usual_location`], checked by [`holds`]), else found through the caller's mount
/// table, which a busy node's thousand mounts make costly to read.
fn locate_dir(pid: i32) -> Result<proc::Location, CgroupError> {
    let membership = read_proc(pid, PathBuf::from(format!("/proc/{pid}/cgroup")))?;
    locate_with(
        &membership,
        |location| holds(location, pid),
        || read_proc(pid, PathBuf::from(MOUNTINFO)),
    )
    .map_err(|e| match e {
        Located::Read(e) => e,
        Located::NotFound(reason) => CgroupError::NotFound {
            pid,
            mountinfo: MOUNTINFO,
            reason,
        },
    })
}

/// Why [`locate_with`] found no directory.
enum Located {
    Read(CgroupError),
    NotFound(LocateError),
}

/// [`locate_dir`]'s decision: the usual location where `holds` confirms it, else what the
/// mount table `mountinfo` gives says.
fn locate_with(
    membership: &str,
    holds: impl Fn(&proc::Location) -> bool,
    mountinfo: impl FnOnce() -> Result<String, CgroupError>,
) -> Result<proc::Location, Located> {
    if let Some(usual) = proc::usual_location(membership).filter(|l| holds(l)) {
        return Ok(usual);
    }
    let mountinfo = mountinfo().map_err(Located::Read)?;
    proc::locate(membership, &mountinfo).map_err(Located::NotFound)
}

/// Whether `location` is a directory of its cgroup kind (a v1 hierarchy with the `devices`
/// controller, or cgroup2) that holds process `pid`: then it is that process's cgroup.
fn holds(location: &proc::Location, pid: i32) -> bool {
    // A v1 hierarchy is the devices one by its controller's file; cgroup2 has every
    // controller in one hierarchy.
    let (dir, magic, controller) = match location {
        proc::Location::V1(dir) => (dir, libc::CGROUP_SUPER_MAGIC as u32, Some("devices.allow")),
        proc::Location::V2(dir) => (dir, libc::CGROUP2_SUPER_MAGIC as u32, None),
    };
    on_filesystem(dir, magic)
        && controller.is_none_or(|file| dir.join(file).is_file())
        && holds_process(dir, pid)
}

/// Whether `path` is on a filesystem of type `magic` (statfs's `f_type`).
/// Magics are 32-bit, in a type that differs between C libraries.
fn on_filesystem(path: &Path, magic: u32) -> bool {
    let Ok(path) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: a zeroed statfs is a valid out-value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: the path is NUL-terminated and `st` is writable, both for the call.
    let rc = unsafe { libc::statfs(path.as_ptr(), &mut st) };
    rc == 0 && st.f_type as u32 == magic
}

/// Whether cgroup directory `dir` lists process `pid` (as the caller's PID namespace numbers it).
fn holds_process(dir: &Path, pid: i32) -> bool {
    let pid = pid.to_string();
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .is_ok_and(|procs| procs.lines().any(|l| l.trim() == pid))
}

/// Lets the cgroup of process `pid` open the device nodes in `rules`, on top of what it
/// may already open, and says which cgroup version enforced it.
///
/// Must run as root in the host cgroup namespace; reads `/proc/<pid>/cgroup` and the
/// caller's mountinfo to find the cgroup directory. Under cgroup v2, `kept_programs` names
/// a directory in a bpffs where device programs are kept for the containers after this one
/// (made if missing; unused where its parent is no bpffs).
pub fn allow_devices(
    pid: i32,
    rules: &[DeviceRule],
    kept_programs: Option<&Path>,
) -> Result<CgroupVersion, CgroupError> {
    match locate_dir(pid)? {
        proc::Location::V1(dir) => {
            v1::allow(&dir, rules)?;
            Ok(CgroupVersion::V1)
        }
        proc::Location::V2(dir) => {
            v2::allow(&dir, rules, kept_programs)?;
            Ok(CgroupVersion::V2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "12:devices:/docker/abc\n0::/docker/abc\n";
    const TABLE: &str = "\
22 1 259:1 / / rw - ext4 /dev/root rw
26 22 0:22 / /sys/fs/cgroup ro - tmpfs tmpfs ro
35 26 0:31 / /srv/devices rw - cgroup cgroup rw,devices
";

    #[test]
    fn the_usual_location_serves_when_it_holds_the_process() {
        let read = std::cell::Cell::new(false);
        let mountinfo = || {
            read.set(true);
            Ok(TABLE.to_string())
        };
        let found = locate_with(HYBRID, |_| true, mountinfo);
        assert!(
            matches!(found, Ok(proc::Location::V1(dir)) if dir == Path::new("/sys/fs/cgroup/devices/docker/abc"))
        );
        assert!(!read.get(), "the mount table was read");
    }

    #[test]
    fn the_mount_table_decides_where_the_usual_location_does_not_hold_it() {
        let found = locate_with(HYBRID, |_| false, || Ok(TABLE.to_string()));
        assert!(
            matches!(found, Ok(proc::Location::V1(dir)) if dir == Path::new("/srv/devices/docker/abc"))
        );
        // No usual location for a path with `..`: the table says it is outside the namespace.
        let outside = locate_with("12:devices:/../x\n", |_| true, || Ok(TABLE.to_string()));
        assert!(matches!(
            outside,
            Err(Located::NotFound(LocateError::OutsideNamespace(_)))
        ));
        let unreadable = locate_with(
            HYBRID,
            |_| false,
            || Err(CgroupError::FromSpec { why: "gone".into() }),
        );
        assert!(matches!(unreadable, Err(Located::Read(_))));
    }

    /// This test's own cgroup: the usual location, where it serves, is where the mount table
    /// leads, and it serves wherever the table finds one (a host that mounts its hierarchies
    /// where systemd does, as this one; the arm64 tests' chroot has none mounted).
    #[test]
    fn the_usual_location_is_where_the_mount_table_leads() {
        let pid = std::process::id() as i32;
        let membership = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let mountinfo = std::fs::read_to_string(MOUNTINFO).unwrap();
        let by_table = proc::locate(&membership, &mountinfo).ok();
        let usual = proc::usual_location(&membership).filter(|l| holds(l, pid));
        assert_eq!(
            usual.is_some(),
            by_table.is_some(),
            "{usual:?} {by_table:?}"
        );
        let found = locate_with(&membership, |l| holds(l, pid), || Ok(mountinfo.clone()));
        assert_eq!(found.ok(), by_table);
    }
}
