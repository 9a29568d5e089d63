//! The hook runs as root with every capability the runtime had. Before it reads anything a
//! container's author wrote, it keeps only the capabilities its own work needs, and makes
//! sure neither it nor the NVML helper it runs can regain the others (bounding set,
//! no_new_privs): a bug in the hook can then mount and make nodes, as it must, but cannot
//! load a kernel module, change its user, reach the network stack or raw I/O, ...

use caps::{CapSet, Capability, CapsHashSet};

/// What the hook and the CDI route's hook need, and why.
pub const KEPT: &[(Capability, &str)] = &[
    (
        Capability::CAP_SYS_ADMIN,
        "the mount API, setns, cgroup v1 rules, bpf",
    ),
    (Capability::CAP_SYS_CHROOT, "setns into a mount namespace"),
    (
        Capability::CAP_SYS_PTRACE,
        "the container's /proc/<pid>/ns/mnt (the runtime makes its init undumpable)",
    ),
    (Capability::CAP_MKNOD, "device nodes in the rootfs"),
    (
        Capability::CAP_DAC_OVERRIDE,
        "images' files and directories owned by other users",
    ),
    (Capability::CAP_DAC_READ_SEARCH, "the same, for lookups"),
    (
        Capability::CAP_FOWNER,
        "replacing image files in sticky directories",
    ),
    (Capability::CAP_BPF, "device programs on cgroup v2"),
    (
        Capability::CAP_IPC_LOCK,
        "BPF memory charged to RLIMIT_MEMLOCK on older kernels",
    ),
    (
        Capability::CAP_SYS_RESOURCE,
        "BPF memory charged to RLIMIT_MEMLOCK on older kernels",
    ),
];

/// Kept in the permitted set only, never effective until used: the hook sets its filesystem
/// ids to those of a user-namespaced container's root before it writes in that container
/// ([`act_as`]), and gives both up when it enters any container ([`give_up_id_changes`]).
const ID_CHANGES: [Capability; 2] = [Capability::CAP_SETUID, Capability::CAP_SETGID];

#[derive(Debug, thiserror::Error)]
#[error("cannot drop the capabilities the hook does not need: {0}")]
pub struct PrivilegeError(#[source] caps::errors::CapsError);

/// Keeps only [`KEPT`] (of what the process has), in every set, and [`ID_CHANGES`] in the
/// permitted set, and sets no_new_privs.
pub fn keep_only_what_the_hook_needs() -> Result<(), PrivilegeError> {
    let effective: CapsHashSet = KEPT.iter().map(|(cap, _)| *cap).collect();
    let kept: CapsHashSet = effective.iter().chain(&ID_CHANGES).copied().collect();
    // The bounding set first: dropping from it takes CAP_SETPCAP, which goes below. It holds
    // no ID_CHANGES either: the NVML helper, the one program the hook runs, gets none.
    // Dropped without reading it first (a call per capability fewer): dropping one the set
    // lacks is no error, and one this kernel does not know (EINVAL) it cannot hold.
    for cap in caps::all().difference(&effective) {
        // SAFETY: PR_CAPBSET_DROP takes integer arguments only.
        if unsafe {
            libc::prctl(
                libc::PR_CAPBSET_DROP,
                libc::c_ulong::from(cap.index()),
                0,
                0,
                0,
            )
        } != 0
        {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINVAL) {
                return Err(PrivilegeError(format!("PR_CAPBSET_DROP {cap}: {e}").into()));
            }
        }
    }
    caps::clear(None, CapSet::Ambient).map_err(PrivilegeError)?;
    caps::clear(None, CapSet::Inheritable).map_err(PrivilegeError)?;
    let permitted: CapsHashSet = caps::read(None, CapSet::Permitted)
        .map_err(PrivilegeError)?
        .intersection(&kept)
        .copied()
        .collect();
    // Effective must stay within permitted at each step.
    let in_effect = permitted.intersection(&effective).copied().collect();
    caps::set(None, CapSet::Effective, &in_effect).map_err(PrivilegeError)?;
    caps::set(None, CapSet::Permitted, &permitted).map_err(PrivilegeError)?;
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(PrivilegeError(
            format!("PR_SET_NO_NEW_PRIVS: {}", std::io::Error::last_os_error()).into(),
        ));
    }
    Ok(())
}

/// Makes `uid` and `gid` the filesystem ids of this thread (what it creates is theirs), then
/// gives up changing ids again. The hook keeps the file capabilities of [`KEPT`] in effect,
/// as a container's root has them in its own namespace: an image's root directory is often
/// read-only to its owner (`dr-xr-xr-x`), and the mount targets are made in it.
pub fn act_as(uid: u32, gid: u32) -> std::io::Result<()> {
    for cap in ID_CHANGES {
        // Not permitted when the start could not drop capabilities: then root has them all.
        let _ = caps::raise(None, CapSet::Effective, cap);
    }
    // The kernel takes them out of the effective set when the filesystem uid leaves 0.
    let effective = caps::read(None, CapSet::Effective);
    let set = crate::rootfs::sys::set_fs_ids(uid, gid);
    if let Ok(effective) = effective
        && let Err(e) = caps::set(None, CapSet::Effective, &effective)
    {
        tracing::warn!("cannot keep the file capabilities as the container's root: {e}");
    }
    give_up_id_changes();
    set
}

/// Drops [`ID_CHANGES`] from the effective and permitted sets, for good. Every container start
/// pays this: one read and one write of each set, not one per capability.
pub fn give_up_id_changes() {
    let without = |set| -> Result<CapsHashSet, caps::errors::CapsError> {
        let mut caps = caps::read(None, set)?;
        for cap in ID_CHANGES {
            caps.remove(&cap);
        }
        Ok(caps)
    };
    // Effective first: it must stay within permitted.
    for set in [CapSet::Effective, CapSet::Permitted] {
        if let Err(e) = without(set).and_then(|caps| caps::set(None, set, &caps)) {
            tracing::warn!("cannot drop CAP_SETUID and CAP_SETGID: {e}");
        }
    }
}

/// The kernel's view of the process's capabilities, for the log: `CapEff`, `CapBnd` and
/// `NoNewPrivs` from /proc/self/status.
pub fn status_lines() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .filter(|l| {
            ["CapEff:", "CapBnd:", "NoNewPrivs:"]
                .iter()
                .any(|k| l.starts_with(k))
        })
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join(", ")
}
