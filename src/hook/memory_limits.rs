//! Setting a container's GPU memory limits ([`MemoryLimits`]) for its cgroup v2 directory,
//! through NVML ([`crate::inventory::memory_limits`]), as `gpu-memory-limits` says: `enforce`
//! refuses a container whose limits this node cannot set (a driver without the call, a GPU that
//! does not support it, a MIG device, cgroup v1); `best-effort` logs that and goes on. A real
//! failure (NVML refusing the values, a cgroup that cannot be opened) fails the start either
//! way: the container asked for it.

use crate::config::{Config, GpuMemoryLimits};
use crate::inventory::nvml_actions::NvmlActionError;
use crate::request::MemoryLimits;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    #[error(
        "GPU memory limits cannot be set on MIG device {uuid}: the driver limits whole GPUs only (unset NVIDIA_GPU_MEMORY_REQUEST and NVIDIA_GPU_MEMORY_LIMIT, or set gpu-memory-limits = \"best-effort\" in nvhook's config)"
    )]
    Mig { uuid: String },
    #[error(
        "GPU memory limits need cgroup v2, and this container is under cgroup v1 (boot the node with cgroup v2, unset NVIDIA_GPU_MEMORY_REQUEST and NVIDIA_GPU_MEMORY_LIMIT, or set gpu-memory-limits = \"best-effort\")"
    )]
    CgroupV1,
    #[error(transparent)]
    Cgroup(#[from] nvhook_cgroup::CgroupError),
    #[error("cannot set GPU memory limits for cgroup {}: {source}{}", cgroup.display(), hint(source))]
    Nvml {
        cgroup: PathBuf,
        #[source]
        source: NvmlActionError,
    },
}

/// What an unsupported answer adds to NVML's line.
fn hint(source: &NvmlActionError) -> &'static str {
    match source.is_unsupported() {
        true => {
            " (or set gpu-memory-limits = \"best-effort\" in nvhook's config to start such containers unlimited)"
        }
        false => "",
    }
}

impl LimitError {
    /// The node cannot set limits here at all, which `best-effort` goes on without.
    fn cannot_here(&self) -> bool {
        match self {
            LimitError::Mig { .. } | LimitError::CgroupV1 => true,
            LimitError::Nvml { source, .. } => source.is_unsupported(),
            LimitError::Cgroup(_) => false,
        }
    }
}

/// Whether this node sets the GPU memory limits containers ask for, and if not, why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnThisNode {
    Enforced,
    /// `gpu-memory-limits = "off"`.
    Off,
    /// The driver has no `nvmlDeviceSetMemoryLimits_v1` (before CUDA 13.4's).
    DriverLacksTheCall,
    CgroupV1,
}

impl OnThisNode {
    /// From the config, NVML's answer (`driver_has_call`) and whether /sys/fs/cgroup is
    /// cgroup v2 alone.
    pub fn of(config: &Config, driver_has_call: bool, unified: bool) -> OnThisNode {
        if config.gpu_memory_limits == GpuMemoryLimits::Off {
            OnThisNode::Off
        } else if !driver_has_call {
            OnThisNode::DriverLacksTheCall
        } else if !unified {
            OnThisNode::CgroupV1
        } else {
            OnThisNode::Enforced
        }
    }
}

/// How the limits reach the driver: NVML through nvhook-nvml on a node, a record in tests.
pub trait Setter {
    /// The container's cgroup v2 directory; None under cgroup v1.
    fn cgroup(&self) -> Result<Option<PathBuf>, LimitError>;
    fn set(
        &self,
        cgroup: &Path,
        limits: &MemoryLimits,
        gpu_uuids: &[String],
    ) -> Result<(), NvmlActionError>;
}

/// Whose cgroup the limits are for.
#[derive(Debug, Clone)]
pub enum Whose {
    /// The container's process `pid`, as a hook in the runtime's namespaces sees it.
    Process(i32),
    /// The hook's own, which the runtime started in the container's cgroup (at
    /// createContainer); `cgroups_path` is the spec's, for a hook in a cgroup namespace of its own.
    Hook {
        cgroups_path: Option<String>,
        container_id: String,
    },
}

/// The node's NVML, for the container's cgroup.
pub struct Nvml<'a> {
    pub config: &'a Config,
    pub whose: Whose,
}

impl Setter for Nvml<'_> {
    fn cgroup(&self) -> Result<Option<PathBuf>, LimitError> {
        Ok(match &self.whose {
            Whose::Process(pid) => nvhook_cgroup::unified_dir(*pid)?,
            Whose::Hook {
                cgroups_path,
                container_id,
            } => nvhook_cgroup::own_unified_dir(cgroups_path.as_deref(), container_id)?,
        })
    }

    fn set(
        &self,
        cgroup: &Path,
        limits: &MemoryLimits,
        gpu_uuids: &[String],
    ) -> Result<(), NvmlActionError> {
        let (soft, hard) = limits.bytes();
        crate::inventory::memory_limits::set_memory_limits(
            self.config,
            cgroup,
            soft,
            hard,
            gpu_uuids,
        )
    }
}

/// Sets `limits` on each of `gpu_uuids` (GPU or MIG UUIDs) for the container's cgroup;
/// whether they were set.
pub fn apply(
    policy: GpuMemoryLimits,
    setter: &impl Setter,
    limits: &MemoryLimits,
    gpu_uuids: &[String],
) -> Result<bool, LimitError> {
    match set(setter, limits, gpu_uuids) {
        Ok(()) => Ok(true),
        Err(e) if policy == GpuMemoryLimits::BestEffort && e.cannot_here() => {
            tracing::warn!(
                ?limits,
                "GPU memory limits not set (gpu-memory-limits = \"best-effort\"): {e}"
            );
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

fn set(
    setter: &impl Setter,
    limits: &MemoryLimits,
    gpu_uuids: &[String],
) -> Result<(), LimitError> {
    if let Some(mig) = gpu_uuids.iter().find(|u| u.starts_with("MIG-")) {
        return Err(LimitError::Mig { uuid: mig.clone() });
    }
    if gpu_uuids.is_empty() {
        return Ok(());
    }
    let cgroup = setter.cgroup()?.ok_or(LimitError::CgroupV1)?;
    setter
        .set(&cgroup, limits, gpu_uuids)
        .map_err(|source| LimitError::Nvml {
            cgroup: cgroup.clone(),
            source,
        })?;
    tracing::info!(
        cgroup = %cgroup.display(),
        request_mib = limits.request_mib,
        limit_mib = limits.limit_mib,
        gpus = ?gpu_uuids,
        "GPU memory limits set"
    );
    Ok(())
}

/// The createRuntime hook NVIDIA's CDI specs carry for each GPU
/// (`nvidia-cdi-hook apply-cuda-memory-limits --gpu-id UUID`), and nvhook's paths add where a
/// container asks for limits: the limits its spec asks for (or the node's default) on
/// `gpu_uuids`, for the cgroup the runtime made for `state`'s process. A container that asks
/// for none is left alone.
pub fn create_runtime(
    config: &Config,
    state: &crate::oci::State,
    gpu_uuids: &[String],
) -> Result<bool, super::HookError> {
    let spec = crate::oci::load_spec(&state.bundle)?;
    let Some(limits) = crate::request::memory_limits::memory_limits(&spec, config)
        .map_err(crate::request::RequestError::from)?
    else {
        tracing::debug!(id = %state.id, "no GPU memory limits asked for");
        return Ok(false);
    };
    let pid = state.pid.ok_or(super::HookError::NoPid)?;
    let nvml = Nvml {
        config,
        whose: Whose::Process(pid),
    };
    Ok(apply(config.gpu_memory_limits, &nvml, &limits, gpu_uuids)?)
}

/// The limits `spec` asks for, set by the hook of the CDI route (nvhook's specs, DRA claims,
/// nvhook-runtime's and the NRI plugin's `cdi` modes) on the GPUs whose nodes the spec lists,
/// for the cgroup of the container's process `pid` (at createRuntime) or, at createContainer,
/// for the hook's own, which the runtime starts it in. A container that asks for none costs
/// nothing more than reading its spec, which the hook does anyway.
pub fn in_spec_hook(
    config: &Config,
    state: &crate::oci::State,
    spec: &crate::oci::Spec,
    pid: Option<i32>,
) -> Result<bool, super::HookError> {
    let Some(limits) = crate::request::memory_limits::memory_limits(spec, config)
        .map_err(crate::request::RequestError::from)?
    else {
        return Ok(false);
    };
    let (inventory, _) =
        crate::inventory::isolated::load(config, crate::inventory::Scope { graphics: false })?;
    let listed: Vec<&Path> = spec.devices().iter().map(|d| d.path.as_path()).collect();
    let gpus = gpus_of(&inventory, &listed);
    let whose = match pid {
        Some(pid) => Whose::Process(pid),
        None => Whose::Hook {
            cgroups_path: spec.cgroups_path().map(str::to_string),
            container_id: state.id.clone(),
        },
    };
    let nvml = Nvml { config, whose };
    Ok(apply(config.gpu_memory_limits, &nvml, &limits, &gpus)?)
}

/// The UUIDs of the GPUs and MIG devices whose nodes are among `listed` (a spec's
/// `linux.devices`): a GPU by its `/dev/nvidia<minor>`, a MIG device by its GPU instance's
/// capability node; on WSL2, every GPU behind the one `/dev/dxg`.
fn gpus_of(inventory: &crate::inventory::Inventory, listed: &[&Path]) -> Vec<String> {
    let has = |path: String| listed.iter().any(|p| *p == Path::new(&path));
    if inventory
        .wsl
        .as_ref()
        .is_some_and(|w| has(w.dxg.path.clone()))
    {
        return inventory.gpus.iter().map(|g| g.uuid.clone()).collect();
    }
    let mut out = Vec::new();
    for gpu in &inventory.gpus {
        let migs: Vec<&str> = gpu
            .mig_devices
            .iter()
            .filter(|m| {
                m.gi_cap_minor
                    .is_some_and(|minor| has(format!("/dev/nvidia-caps/nvidia-cap{minor}")))
            })
            .map(|m| m.uuid.as_str())
            .collect();
        if !migs.is_empty() {
            out.extend(migs.into_iter().map(str::to_string));
        } else if gpu
            .minor
            .is_some_and(|minor| has(format!("/dev/nvidia{minor}")))
        {
            out.push(gpu.uuid.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{NvmlActionFailure, nvml_return};
    use std::cell::RefCell;

    /// One call: the cgroup, (soft, hard) bytes, the GPUs.
    type Call = (PathBuf, (u64, u64), Vec<String>);

    /// A node whose cgroup and NVML answer as told, recording each call.
    struct Fake {
        cgroup: Option<PathBuf>,
        answer: Option<u32>,
        calls: RefCell<Vec<Call>>,
    }

    impl Fake {
        fn new(cgroup: Option<&str>, answer: Option<u32>) -> Fake {
            Fake {
                cgroup: cgroup.map(PathBuf::from),
                answer,
                calls: RefCell::new(Vec::new()),
            }
        }
    }

    impl Setter for Fake {
        fn cgroup(&self) -> Result<Option<PathBuf>, LimitError> {
            Ok(self.cgroup.clone())
        }

        fn set(
            &self,
            cgroup: &Path,
            limits: &MemoryLimits,
            gpu_uuids: &[String],
        ) -> Result<(), NvmlActionError> {
            self.calls
                .borrow_mut()
                .push((cgroup.into(), limits.bytes(), gpu_uuids.to_vec()));
            match self.answer {
                None => Ok(()),
                Some(code) => Err(NvmlActionError::Nvml(NvmlActionFailure {
                    code: Some(code),
                    message: format!("NVML said {code}"),
                })),
            }
        }
    }

    const LIMITS: MemoryLimits = MemoryLimits {
        request_mib: 1,
        limit_mib: 2,
    };

    fn gpus(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_containers_cgroup_gets_the_limits_in_bytes_on_each_gpu() {
        let fake = Fake::new(Some("/sys/fs/cgroup/pod/c1"), None);
        let set = apply(
            GpuMemoryLimits::Enforce,
            &fake,
            &LIMITS,
            &gpus(&["GPU-a", "GPU-b"]),
        );
        assert!(set.unwrap());
        assert_eq!(
            *fake.calls.borrow(),
            [(
                PathBuf::from("/sys/fs/cgroup/pod/c1"),
                (1 << 20, 2 << 20),
                gpus(&["GPU-a", "GPU-b"])
            )]
        );
    }

    #[test]
    fn what_this_node_cannot_do_refuses_under_enforce_and_is_skipped_under_best_effort() {
        let unsupported = [
            (
                Fake::new(Some("/c"), None),
                gpus(&["GPU-a", "MIG-b"]),
                "MIG device MIG-b",
            ),
            (Fake::new(None, None), gpus(&["GPU-a"]), "need cgroup v2"),
            (
                Fake::new(Some("/c"), Some(nvml_return::FUNCTION_NOT_FOUND)),
                gpus(&["GPU-a"]),
                "NVML said 13 (or set gpu-memory-limits = \"best-effort\"",
            ),
            (
                Fake::new(Some("/c"), Some(nvml_return::NOT_SUPPORTED)),
                gpus(&["GPU-a"]),
                "NVML said 3",
            ),
        ];
        for (fake, ids, needle) in &unsupported {
            let line = apply(GpuMemoryLimits::Enforce, fake, &LIMITS, ids)
                .unwrap_err()
                .to_string();
            assert!(line.contains(needle) && !line.contains('\n'), "{line}");
            assert!(!apply(GpuMemoryLimits::BestEffort, fake, &LIMITS, ids).unwrap());
        }
        // A MIG device stops the call before NVML is asked.
        assert!(unsupported[0].0.calls.borrow().is_empty());
    }

    #[test]
    fn a_real_failure_refuses_under_either_policy() {
        let fake = Fake::new(Some("/c"), Some(nvml_return::OPERATING_SYSTEM));
        for policy in [GpuMemoryLimits::Enforce, GpuMemoryLimits::BestEffort] {
            let line = apply(policy, &fake, &LIMITS, &gpus(&["GPU-a"]))
                .unwrap_err()
                .to_string();
            assert!(
                line.starts_with("cannot set GPU memory limits for cgroup /c: NVML said 17"),
                "{line}"
            );
            assert!(!line.contains("best-effort"), "{line}");
        }
    }
}
