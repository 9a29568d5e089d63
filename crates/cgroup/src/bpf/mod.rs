//! cgroup v2 device programs: instruction encoding, the allow prefix, and bpf(2).
//!
//! Public for diagnostics and for tests that play the runtime's part (attaching the
//! program a container starts with); the hook itself only needs
//! [`allow_devices`](crate::allow_devices).

pub mod insn;
#[cfg(feature = "test-util")]
pub mod interp;
mod prefix;
pub(crate) mod sys;

use crate::CgroupError;
use insn::Insn;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

pub use prefix::Unsupported;
pub(crate) use prefix::extend;

pub(crate) fn open_cgroup(dir: &Path) -> Result<OwnedFd, CgroupError> {
    std::fs::File::open(dir)
        .and_then(|dir| sys::off_stdin(OwnedFd::from(dir)))
        .map_err(|source| CgroupError::OpenDir {
            path: dir.to_owned(),
            source,
        })
}

/// Ids of the device programs attached directly to the cgroup2 directory `dir`.
pub fn attached_device_programs(dir: &Path) -> Result<Vec<u32>, CgroupError> {
    Ok(sys::query_device_programs(open_cgroup(dir)?.as_fd())?.ids)
}

/// Loads `insns` as a device program and attaches it to `dir` with BPF_F_ALLOW_MULTI,
/// as runc does; returns the new program's id.
pub fn attach_device_program(dir: &Path, insns: &[Insn]) -> Result<u32, CgroupError> {
    let cgroup = open_cgroup(dir)?;
    let prog = sys::load_device_program(insns).map_err(|e| CgroupError::Rejected {
        path: dir.to_owned(),
        source: e.source,
        log: e.log,
    })?;
    sys::attach_device_program(cgroup.as_fd(), prog.as_fd(), sys::BPF_F_ALLOW_MULTI)?;
    sys::program_id(prog.as_fd())
}
