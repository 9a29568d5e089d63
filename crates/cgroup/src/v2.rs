//! cgroup v2: widen the runtime's BPF device program by replacing it with an extended copy.
//!
//! Attaching a second program cannot widen access (every attached program must allow),
//! so each attached program is read back, prefixed with allow blocks for the rules,
//! loaded, attached, and the old one detached.

use super::bpf::{self, sys};
use super::{CgroupError, DeviceRule};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

pub(super) fn allow(dir: &Path, rules: &[DeviceRule]) -> Result<(), CgroupError> {
    if rules.is_empty() {
        return Ok(());
    }
    let cgroup = bpf::open_cgroup(dir)?;
    let attached = sys::query_device_programs(cgroup.as_fd())?;
    if attached.ids.is_empty() {
        tracing::debug!(
            cgroup = %dir.display(),
            "no device program attached: cgroup v2 already allows every device, nothing to do"
        );
        return Ok(());
    }
    for &id in &attached.ids {
        replace(dir, cgroup.as_fd(), id, attached.flags, rules)?;
    }
    Ok(())
}

fn replace(
    dir: &Path,
    cgroup: BorrowedFd<'_>,
    old_id: u32,
    flags: u32,
    rules: &[DeviceRule],
) -> Result<(), CgroupError> {
    let old = sys::program_by_id(old_id)?;
    let original = sys::program_instructions(old.as_fd())?;
    let extended = bpf::extend(rules, &original).map_err(|reason| CgroupError::Unsupported {
        id: old_id,
        path: dir.to_owned(),
        reason,
    })?;
    let new = sys::load_device_program(&extended).map_err(|e| CgroupError::Rejected {
        path: dir.to_owned(),
        source: e.source,
        log: e.log,
    })?;
    if flags & sys::BPF_F_ALLOW_MULTI == 0 {
        // Without ALLOW_MULTI a cgroup holds one program, and attaching with the same
        // flags swaps it atomically.
        sys::attach_device_program(cgroup, new.as_fd(), flags)?;
    } else {
        // Attach before detaching: while both run, both must allow, so access never
        // exceeds the final state.
        sys::attach_device_program(cgroup, new.as_fd(), flags)?;
        if let Err(e) = sys::detach_device_program(cgroup, old.as_fd()) {
            // Leave the cgroup as the runtime set it rather than with two programs.
            let _ = sys::detach_device_program(cgroup, new.as_fd());
            return Err(e);
        }
    }
    tracing::debug!(
        cgroup = %dir.display(),
        old_id,
        original_insns = original.len(),
        rules = rules.len(),
        "replaced device program with one that also allows the GPU devices"
    );
    Ok(())
}
