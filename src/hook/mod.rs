//! nvhook's hook stages, run by the OCI runtime inside a container's start: the prestart hook
//! (also `nvidia-container-cli configure`), the hook of CDI specs and of the cdi modes (at
//! `createRuntime`, or `createContainer` in specs written before), and NVIDIA's
//! `nvidia-cdi-hook` commands. What they share: entering the container's mount namespace ([`effects`]), the view of its mounts
//! ([`container_mounts`]), `/proc/driver/nvidia` ([`procfs`]) and its user namespace
//! ([`userns`]).

pub mod container_mounts;
pub mod create_container;
pub mod dir_groups;
pub mod effects;
pub mod gathered;
pub mod kept_trees;
pub mod memory_limits;
pub mod nvidia_hooks;
pub mod prestart;
pub mod procfs;
pub mod step;
pub mod userns;

pub use prestart::{Outcome, configure_process, prestart};

use crate::delivery::PrepareError;
use crate::shown::Shown;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error(transparent)]
    Prepare(#[from] PrepareError),
    #[error(transparent)]
    Cgroup(#[from] nvhook_cgroup::CgroupError),
    #[error(transparent)]
    MemoryLimits(#[from] memory_limits::LimitError),
    #[error("the OCI state has no pid: run nvhook as a prestart or createRuntime hook")]
    NoPid,
    #[error(
        "linux.rootfsPropagation is \"{0}\": mounts would propagate to the host; use private or slave"
    )]
    SharedRootfs(Shown),
    #[error(
        "linux.rootfsPropagation is \"{0}\": the driver files' mounts nvhook's CDI hook makes would propagate to the host; use private or slave, or set cdi-mounts = \"runtime\" in the nvhook config and regenerate the CDI spec"
    )]
    SharedRootfsForHookMounts(Shown),
    #[error("cannot open mount source {path}: {source}")]
    Source {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("mount source {path} is not a {kind}")]
    SourceKind { path: PathBuf, kind: &'static str },
    #[error("cannot enter the mount namespace of pid {pid}: {source}")]
    Namespace { pid: i32, source: std::io::Error },
    #[error(
        "cannot see the container's rootfs through /proc/{pid}/root: {source} (is the container still running?)"
    )]
    ContainerGone { pid: i32, source: std::io::Error },
    #[error(
        "pid {pid} is not a container's process on that rootfs: it {why} (configure works only on a container its runtime is starting: --pid=PID ROOTFS as the runtime's prestart hook gives them)"
    )]
    NotAContainer { pid: i32, why: &'static str },
    #[error("cannot read the user namespace of pid {pid}: {source}")]
    UserNamespace { pid: i32, source: std::io::Error },
    #[error(
        "the user namespace of pid {pid} maps no host id to its root: map the container's id 0 (uidMappings and gidMappings)"
    )]
    UnmappedRoot { pid: i32 },
    #[error(
        "the CDI spec that gave this container its GPUs was written for another GPU layout of this host (GPU layout {written_for}, now {now}: GPUs or MIG instances changed since): run `nvhook cdi refresh` (or `nvhook cdi generate` for a spec kept elsewhere) and start the container again"
    )]
    StaleCdiSpec { written_for: String, now: String },
    #[error(
        "the runtime ran nvhook's createContainer hook in its own mount namespace, not the container's, so the hook cannot make the driver files' mounts there: use a runtime that follows the OCI spec for createContainer hooks (runc, crun, youki), or set cdi-mounts = \"runtime\" in the nvhook config and regenerate the CDI spec"
    )]
    HostMountNamespace,
    #[error(
        "cannot tell whether the createContainer hook runs in the container's mount namespace (from /proc/1/mountinfo and the mount of /): {0} (or set cdi-mounts = \"runtime\" in the nvhook config and regenerate the CDI spec)"
    )]
    MountTables(#[source] std::io::Error),
    #[error(
        "pid {pid}, the container's process by the OCI state, shares the runtime's mount namespace: the runtime ran nvhook's createRuntime hook on a process that is not the container's; use a runtime that follows the OCI spec for createRuntime hooks (runc, crun, youki)"
    )]
    NotInAContainer { pid: i32 },
    #[error("cannot act as the container's root (host uid {uid}, gid {gid}): {source}")]
    ActAsRoot {
        uid: u32,
        gid: u32,
        source: std::io::Error,
    },
}

crate::delivery::prepare_error_sources!(HookError);
