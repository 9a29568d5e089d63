//! cgroup v2 device programs: instruction encoding, the allow prefix, and bpf(2).
//!
//! Public for diagnostics and for tests that play the runtime's part (attaching the
//! program a container starts with); the hook itself only needs
//! [`allow_devices`](crate::allow_devices).

pub mod insn;
#[cfg(feature = "test-util")]
pub mod interp;
pub mod kept;
mod prefix;
pub(crate) mod sys;

use crate::{Access, CgroupError, DeviceKind};
use insn::Insn;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

pub use prefix::Unsupported;
pub(crate) use prefix::extend;

/// The type value of `struct bpf_cgroup_dev_ctx` (BPF_DEVCG_DEV_*).
pub(crate) fn kind_value(kind: DeviceKind) -> u32 {
    match kind {
        DeviceKind::Block => 1,
        DeviceKind::Char => 2,
    }
}

/// The access bits of `struct bpf_cgroup_dev_ctx` (BPF_DEVCG_ACC_*).
pub(crate) fn access_bits(access: Access) -> u32 {
    u32::from(access.mknod) | u32::from(access.read) << 1 | u32::from(access.write) << 2
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_bits_are_the_kernels() {
        assert_eq!(access_bits(Access::RWM), 7);
        let mknod = Access {
            mknod: true,
            ..Access::default()
        };
        assert_eq!(access_bits(mknod), 1);
        assert_eq!(kind_value(DeviceKind::Char), 2);
    }
}
