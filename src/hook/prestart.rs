//! The prestart hook: apply a plan inside a live container, before pivot_root.
//!
//! Order matters. In the host's mount namespace: read the inventory (in a child process),
//! probe the image (through `/proc/<pid>/root`, so as the container sees it), plan, set the
//! cgroup rules, and open every mount source as a detached, read-only tree. Then enter the
//! container's mount namespace and attach those trees onto targets resolved inside the rootfs.
//! Mounts only ever happen in the container's namespace, which dies with the container, so a failure leaves nothing on the host. The effects are
//! behind `effects`, so this order is unit-tested (`tests.rs`) as well as run for real.

use super::effects::{ContainerEffects, HostEffects};
use super::step::Step;
use super::{HookError, container_mounts, effects, memory_limits, userns};
use crate::config::Config;
use crate::delivery::PrepareError;
use crate::host_plan::{Target, container_view, plan_for_host, probe};
use crate::inventory::{self, Inventory};
use crate::oci::{MountPoint, State};
use crate::plan::{ImageInfo, ListedNode, Plan};
use crate::plan_file;
use crate::proc_view;
use crate::request::Request;
use crate::rootfs::Rootfs;
use std::path::PathBuf;

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

/// A live container between its runtime's mounts and pivot_root, as a front end knows it.
struct Container<'a> {
    /// A process in its mount namespace and cgroup.
    pid: i32,
    /// Its rootfs, as the host names it.
    rootfs: PathBuf,
    /// The runtime's mounts in it: which of them nvhook may write on.
    mounts: Vec<MountPoint>,
    /// Device nodes the runtime makes itself, with their cgroup rules.
    listed: Vec<ListedNode<'a>>,
    /// Whether nvhook sets the device cgroup rules (nvidia-container-cli's `--no-cgroups`
    /// leaves them to the caller).
    cgroups: bool,
    /// Whether its /proc/driver/nvidia is replaced by the view of its GPUs.
    proc_view: proc_view::Choice,
}

/// Runs the whole prestart hook for the container described by `state`; `step` holds the
/// steps of the hook's process before it, whose line this run's steps join.
pub fn prestart(config: &Config, state: &State, mut step: Step) -> Result<Outcome, HookError> {
    let spec = crate::oci::load_spec(&state.bundle)?;
    let Some(request) = Request::from_spec(&spec, config)? else {
        tracing::info!(bundle = %state.bundle.display(), "no GPU requested; nothing to do");
        return Ok(Outcome::NotGpu);
    };
    let pid = state.pid.ok_or(HookError::NoPid)?;
    if let Some(p) = spec.shared_rootfs_propagation() {
        return Err(HookError::SharedRootfs(p.into()));
    }
    let container = Container {
        pid,
        rootfs: spec.rootfs(&state.bundle).ok_or(PrepareError::NoRoot)?,
        mounts: spec.mount_points(),
        listed: spec
            .devices()
            .iter()
            .map(|d| (d.path.as_path(), d.major, d.minor))
            .collect(),
        cgroups: true,
        proc_view: proc_view::choose(config.proc_driver_view, Some(&spec)),
    };
    step.done("request");
    // nvhook-runtime already queried NVML for this start and left its plan in the bundle; the
    // NRI plugin, the inventory it planned with.
    let known = Known {
        plan: |image: &ImageInfo| plan_file::read(&state.bundle, image),
        inventory: |scope| {
            let handed = crate::nri_handoff::take(config, &state.id, scope);
            if handed.is_some() {
                tracing::debug!("the inventory the NRI plugin planned this container with");
            }
            handed
        },
    };
    configure(config, &request, &container, step, known)
}

/// What another nvhook process found for this start already, for [`configure`] to use before
/// reading anything itself.
struct Known<P, I> {
    /// The plan for the container's image.
    plan: P,
    /// The host's inventory.
    inventory: I,
}

impl Known<fn(&ImageInfo) -> Option<Plan>, fn(inventory::Scope) -> Option<Inventory>> {
    /// Nothing known: the inventory read and the plan made here.
    const NOTHING: Self = Known {
        plan: |_| None,
        inventory: |_| None,
    };
}

/// nvidia-container-cli's `configure`: the container whose process `pid` has its rootfs at
/// `rootfs`, with no bundle; its mounts come from its mount table.
pub fn configure_process(
    config: &Config,
    request: &Request,
    pid: i32,
    rootfs: PathBuf,
    cgroups: bool,
) -> Result<Outcome, HookError> {
    let step = Step::start();
    // A host process and a host directory make no container: the writes would be the host's.
    if container_mounts::shares_our_mount_ns(pid)
        .map_err(|source| HookError::ContainerGone { pid, source })?
    {
        return Err(HookError::NotAContainer {
            pid,
            why: "shares the host's mount namespace",
        });
    }
    let found = container_mounts::read(pid, &rootfs)
        .map_err(|source| HookError::ContainerGone { pid, source })?;
    if !found.rootfs_is_mount {
        return Err(HookError::NotAContainer {
            pid,
            why: "has no mount at that rootfs",
        });
    }
    if found.rootfs_shared {
        return Err(HookError::SharedRootfs("shared".into()));
    }
    let container = Container {
        pid,
        rootfs,
        mounts: found.mounts,
        listed: Vec::new(),
        cgroups,
        proc_view: proc_view::choose(config.proc_driver_view, None),
    };
    configure(config, request, &container, step, Known::NOTHING)
}

/// Plans `request` for `container` on this host, unless `known` has the plan already for
/// its image, and applies it: the one path of every front end that works on a live container.
fn configure(
    config: &Config,
    request: &Request,
    container: &Container,
    mut step: Step,
    known: Known<
        impl FnOnce(&ImageInfo) -> Option<Plan>,
        impl FnOnce(inventory::Scope) -> Option<Inventory>,
    >,
) -> Result<Outcome, HookError> {
    let pid = container.pid;
    // The rootfs as the container will see it, through its mount namespace: the image is
    // examined, and written once the hook has entered that namespace, with its volumes
    // mounted. The descriptors stay valid there, so it is opened once for both.
    std::fs::symlink_metadata(format!("/proc/{pid}/root"))
        .map_err(|source| HookError::ContainerGone { pid, source })?;
    let rootfs =
        Rootfs::open(&container_view(pid, &container.rootfs))?.with_mounts(&container.mounts);
    let image = probe(request, config, &rootfs);
    step.done("image");
    let mut plan = match (known.plan)(&image) {
        Some(plan) => plan,
        None => {
            let scope = inventory::Scope::for_capabilities(&request.capabilities);
            // Handed over, it is as good as NVML's cached answer: a plan that fails on it asks
            // NVML again.
            let (inventory, source) = match (known.inventory)(scope) {
                Some(handed) => (handed, inventory::isolated::Source::Cache),
                None => inventory::isolated::load(config, scope)?,
            };
            tracing::debug!(?source, "inventory");
            step.done("inventory");
            plan_for_host(request, inventory, source, config, Target::Image(&image))?
        }
    };
    if plan.proc_overlay.is_some() && !container.proc_view.view() {
        plan.proc_overlay = None;
    }
    step.done("plan");
    // Before anything is written: a container refused for its limits is left as it was.
    if let Some(limits) = &plan.memory_limits {
        let gpus: Vec<String> = plan.selected.iter().map(|s| s.uuid.clone()).collect();
        let nvml = memory_limits::Nvml {
            config,
            whose: memory_limits::Whose::Process(pid),
        };
        memory_limits::apply(config.gpu_memory_limits, &nvml, limits, &gpus)?;
        step.done("memory-limits");
    }
    apply(
        effects::System::new(
            pid,
            rootfs,
            userns::container_root(pid)?,
            config.device_program_pins(),
        ),
        &container.listed,
        container.cgroups,
        &plan,
        &mut step,
    )
}

/// Applies `plan`: the nodes and cgroup rules the spec does not already give the runtime,
/// then the mounts, links and loader cache. Every mount source is opened, and the cgroup
/// set, before the hook enters the container; a failure there leaves the container as it was.
fn apply<H: HostEffects>(
    mut host: H,
    listed: &[ListedNode],
    cgroups: bool,
    plan: &Plan,
    step: &mut Step,
) -> Result<Outcome, HookError> {
    let (nodes, rules) = plan.left_to_hook(listed.iter().copied());
    if cgroups && !rules.is_empty() {
        host.allow_devices(&rules)?;
    }
    step.done("cgroup");
    let sources = plan
        .mounts
        .iter()
        .map(|m| host.open_source(m))
        .collect::<Result<Vec<_>, _>>()?;
    let node_sources = nodes
        .iter()
        .map(|n| host.open_node(n))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(overlay) = &plan.proc_overlay {
        host.prepare_proc(overlay)?;
    }
    step.done("sources");
    let mut inside = host.enter_container()?;
    for (node, source) in nodes.iter().zip(&node_sources) {
        inside.make_node(node, source.as_ref())?;
    }
    step.done("devices");
    for (mount, source) in plan.mounts.iter().zip(&sources) {
        inside.attach(source, mount)?;
    }
    step.done("mounts");
    inside.link_and_cache(plan)?;
    step.done("links+ldcache");
    if inside.overlay_proc()? {
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

#[cfg(test)]
mod tests;
