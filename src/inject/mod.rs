//! The prestart hook: apply a plan inside a live container, before pivot_root.
//!
//! Order matters. In the host's mount namespace: read the inventory (in a child process),
//! probe the image, plan, set the cgroup rules, and open every mount source as a detached,
//! read-only tree. Then enter the container's mount namespace and attach those trees onto
//! targets resolved inside the rootfs. Mounts only ever happen in the container's namespace,
//! which dies with the container, so a failure leaves nothing on the host.

pub mod procfs;

use crate::config::Config;
use crate::host_plan::{PlanningError, plan_for_host};
use crate::inventory;
use crate::oci::{OciError, Spec, State};
use crate::plan::{MountKind, Plan};
use crate::plan_file;
use crate::request::{Request, RequestError};
use crate::rootfs::{Existing, Rootfs, RootfsError, loader, sys};
use nvhook_cgroup as cgroup;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error(transparent)]
    Oci(#[from] OciError),
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(transparent)]
    Inventory(#[from] inventory::InventoryError),
    #[error(transparent)]
    Planning(#[from] PlanningError),
    #[error(transparent)]
    Cgroup(#[from] cgroup::CgroupError),
    #[error(transparent)]
    Rootfs(#[from] RootfsError),
    #[error("the OCI state has no pid: run nvhook as a prestart or createRuntime hook")]
    NoPid,
    #[error("the OCI spec has no root.path")]
    NoRoot,
    #[error(
        "linux.rootfsPropagation is {0:?}: mounts would propagate to the host; use private or slave"
    )]
    SharedRootfs(String),
    #[error("cannot open mount source {path}: {source}")]
    Source {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("mount source {path} is not a {kind}")]
    SourceKind { path: PathBuf, kind: &'static str },
    #[error("cannot enter the mount namespace of pid {pid}: {source}")]
    Namespace { pid: i32, source: std::io::Error },
}

/// What the hook did, for the caller's log line.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The container asked for no GPU: nothing was touched.
    NotGpu,
    Applied {
        devices: usize,
        mounts: usize,
    },
}

/// Logs how long a step took.
struct Step(Instant);

impl Step {
    fn start() -> Step {
        Step(Instant::now())
    }

    fn done(&mut self, step: &'static str) {
        let us = self.0.elapsed().as_micros();
        tracing::info!(step, us, "done");
        self.0 = Instant::now();
    }
}

/// Runs the whole prestart hook for the container described by `state`.
pub fn prestart(config: &Config, state: &State) -> Result<Outcome, HookError> {
    let mut step = Step::start();
    let spec = Spec::load(&state.bundle)?;
    let Some(request) = Request::from_spec(&spec, config)? else {
        tracing::info!(bundle = %state.bundle.display(), "no GPU requested; nothing to do");
        return Ok(Outcome::NotGpu);
    };
    let pid = state.pid.ok_or(HookError::NoPid)?;
    if let Some(p) = spec.rootfs_propagation().filter(|p| p.contains("shared")) {
        return Err(HookError::SharedRootfs(p.to_string()));
    }
    let rootfs_path = spec.rootfs(&state.bundle).ok_or(HookError::NoRoot)?;
    step.done("request");
    // nvhook-runtime already queried NVML for this start and left its plan in the bundle.
    let plan = match plan_file::read(&state.bundle) {
        Some(plan) => plan,
        None => {
            let (inventory, source) = inventory::isolated::load(config)?;
            tracing::debug!(?source, "inventory");
            step.done("inventory");
            plan_for_host(&request, inventory, source, config, &rootfs_path)?
        }
    };
    step.done("plan");
    apply(&spec, pid, &rootfs_path, &plan, &mut step)
}

fn apply(
    spec: &Spec,
    pid: i32,
    rootfs_path: &Path,
    plan: &Plan,
    step: &mut Step,
) -> Result<Outcome, HookError> {
    let listed = spec
        .devices()
        .iter()
        .map(|d| (d.path.as_path(), d.major, d.minor));
    let (nodes, rules) = plan.left_to_hook(listed);
    if !rules.is_empty() {
        let version = cgroup::allow_devices(pid, &rules)?;
        tracing::info!(?version, rules = rules.len(), "cgroup device rules set");
    }
    step.done("cgroup");
    let sources = open_sources(plan)?;
    // /proc/driver/nvidia is the kernel module's, the same in every procfs instance: without
    // it here the container's procfs lacks it too, and trees cloned for the overlay would
    // only be dissolved again (an RCU grace period each).
    let module_loaded = Path::new(procfs::TARGET).is_dir();
    let proc_prepared = plan
        .proc_overlay
        .as_ref()
        .filter(|_| module_loaded)
        .map(procfs::prepare)
        .transpose()?;
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/mnt"))
        .map_err(|source| HookError::Namespace { pid, source })?;
    step.done("sources");
    sys::enter_mount_ns(&ns).map_err(|source| HookError::Namespace { pid, source })?;
    let rootfs = Rootfs::open(rootfs_path)?;
    for node in &nodes {
        rootfs.make_node(&node.path, node.major, node.minor, node.mode)?;
    }
    step.done("devices");
    for (mount, tree) in plan.mounts.iter().zip(&sources) {
        let (target, existing) = rootfs.mount_target(&mount.destination, mount.kind)?;
        sys::attach(tree.as_fd(), target.as_fd()).map_err(|e| RootfsError::Op {
            op: "mount",
            path: mount.destination.clone(),
            message: e.to_string(),
        })?;
        if existing == Existing::Replaced {
            tracing::info!(path = %mount.destination, "covered the image's own file with the host's");
        }
    }
    step.done("mounts");
    loader::link_and_cache(
        &rootfs,
        &plan.symlinks,
        &plan.ldcache,
        plan.ld_so_conf.as_ref(),
        plan.layout.ldcache,
    )?;
    step.done("links+ldcache");
    let applied = match proc_prepared {
        Some(prepared) => procfs::apply(&rootfs, prepared)?,
        None => false,
    };
    if applied {
        step.done("proc");
    } else if plan.proc_overlay.is_some() {
        tracing::info!(
            "the container's procfs has no /proc/driver/nvidia (no kernel module): overlay skipped"
        );
    }
    Ok(Outcome::Applied {
        devices: nodes.len(),
        mounts: plan.mounts.len(),
    })
}

/// Each mount source as a detached, read-only, nosuid, nodev tree, checked to be the kind
/// of file the plan expects.
fn open_sources(plan: &Plan) -> Result<Vec<OwnedFd>, HookError> {
    plan.mounts
        .iter()
        .map(|m| {
            let fail = |source| HookError::Source {
                path: m.source.clone(),
                source,
            };
            let tree = sys::clone_tree(&m.source, m.kind == MountKind::Dir).map_err(fail)?;
            let st = sys::fstat(tree.as_fd()).map_err(fail)?;
            let (want, kind) = match m.kind {
                MountKind::File => (libc::S_IFREG, "regular file"),
                MountKind::Socket => (libc::S_IFSOCK, "socket"),
                MountKind::Dir => (libc::S_IFDIR, "directory"),
            };
            if sys::file_type(&st) != want {
                return Err(HookError::SourceKind {
                    path: m.source.clone(),
                    kind,
                });
            }
            sys::set_attrs(
                tree.as_fd(),
                sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
            )
            .map_err(fail)?;
            Ok(tree)
        })
        .collect()
}
