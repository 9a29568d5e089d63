//! Plan → CDI container edits: the one conversion behind `nvhook cdi generate`, the runtime
//! create path's cdi mode, and the device nodes of its hook mode.
//!
//! With CDI the engine or runtime makes the device nodes, their cgroup rules and the bind
//! mounts itself; what is left for nvhook is a `createRuntime` hook that creates the SONAME
//! links and writes the image's loader cache (and, with `cdi-mounts = "hook"`, makes the mounts).

use crate::config::Config;
use crate::delivery::cdi_spec::{ContainerEdits, DeviceNode, Hook, KIND, Mount};
use crate::delivery::hook_args::LinkArgs;
use crate::imex_and_families;
use crate::plan::{MOUNT_OPTIONS, Plan};
use crate::request::VISIBLE_DEVICES;
use std::path::{Path, PathBuf};

/// Every hook entry nvhook writes runs with this environment: explicit and never empty, so
/// nothing of the image's or the engine's environment reaches it.
pub const HOOK_ENV: &[&str] = &["PATH=/usr/sbin:/usr/bin:/sbin:/bin"];

/// The nvhook binary that hook entries run, and the config file it is told to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookBinary {
    pub path: PathBuf,
    pub config: Option<PathBuf>,
    /// Whether its createRuntime hook makes the driver files' bind mounts
    /// (`cdi-mounts = "hook"`) instead of the runtime.
    pub makes_mounts: bool,
}

impl HookBinary {
    pub fn new(config: &Config, config_path: Option<&Path>) -> HookBinary {
        HookBinary {
            // The nvhook that nvhook-runtime runs from beside itself, or that wrote a CDI spec.
            path: config
                .hook_path
                .clone()
                .unwrap_or_else(crate::binary_paths::this_nvhook),
            // The hook runs with `/` as its working directory.
            config: config_path.map(|p| std::path::absolute(p).unwrap_or_else(|_| p.into())),
            makes_mounts: config.cdi_mounts == crate::config::CdiMounts::Hook,
        }
    }

    /// `nvhook [--config FILE] hook STAGE ARGS...` at OCI stage `stage`.
    pub fn hook(&self, stage: &str, args: Vec<String>) -> Hook {
        let mut argv = vec!["nvhook".to_string()];
        if let Some(config) = &self.config {
            argv.push("--config".into());
            argv.push(config.display().to_string());
        }
        argv.extend(["hook".to_string(), stage.to_string()]);
        argv.extend(args);
        Hook {
            hook_name: stage.into(),
            path: self.path.display().to_string(),
            args: argv,
            env: HOOK_ENV.iter().map(|s| s.to_string()).collect(),
            timeout: Some(crate::config::HOOK_TIMEOUT_S),
        }
    }
}

/// Everything `plan` asks of a container, as CDI container edits.
pub fn container_edits(plan: &Plan, hook: &HookBinary) -> ContainerEdits {
    container_edits_with(plan, hook, LinkArgs::from_plan(plan))
}

/// [`container_edits`] whose createRuntime hook does what `links` say, and makes the plan's
/// mounts where `hook` says it does.
pub fn container_edits_with(plan: &Plan, hook: &HookBinary, mut links: LinkArgs) -> ContainerEdits {
    let mounts = match hook.makes_mounts {
        true => {
            links.mounts = plan.mounts.clone();
            Vec::new()
        }
        false => mounts(plan),
    };
    ContainerEdits {
        // The devices are in: no hook that reads this variable (nvhook's own from hooks.d,
        // NVIDIA's legacy one) may act on the container again.
        env: vec![format!("{VISIBLE_DEVICES}=void")],
        device_nodes: device_nodes(plan),
        mounts,
        // The hook also sets the GPU memory limits the container asks for.
        hooks: (!links.is_empty())
            .then(|| hook.hook("createRuntime", links.to_args()))
            .into_iter()
            .collect(),
    }
}

/// The createRuntime hook that sets the container's GPU memory limits, where its plan has
/// some, for edits with no hook of nvhook's spec to set them: a container that asks for none
/// runs no such hook.
fn memory_limits_hook(plan: &Plan, hook: &HookBinary) -> Option<Hook> {
    plan.memory_limits?;
    let gpus: Vec<String> = plan.selected.iter().map(|s| s.uuid.clone()).collect();
    let mut entry = hook.hook("memoryLimits", gpus);
    entry.hook_name = "createRuntime".into();
    Some(entry)
}

/// The edits of a plan made for no hook ([`crate::plan::Layout::at_sonames`]): the device
/// nodes and the bind mounts, all of it for the runtime to make. What only a process in the
/// container's mount namespace could add is logged as left out: links a plan still asks for
/// and the `/proc/driver/nvidia` view (runtimes mount nothing under /proc). GPU memory limits
/// the container asked for are the one hook it still gets: only a process can set them.
/// Each driver directory in `gathered` (its path in the container, and the host's directory
/// holding its files) is one recursive bind mount instead of one per file.
pub fn hookless_edits(
    plan: &Plan,
    hook: &HookBinary,
    gathered: &[(&str, PathBuf)],
) -> ContainerEdits {
    for link in &plan.symlinks {
        tracing::info!(link = %link.path, "left out without a hook: a link");
    }
    if plan.proc_overlay.is_some() {
        tracing::info!("left out without a hook: the /proc/driver/nvidia view of the given GPUs");
    }
    ContainerEdits {
        env: vec![format!("{VISIBLE_DEVICES}=void")],
        device_nodes: device_nodes(plan),
        mounts: gathered
            .iter()
            .map(|(dir, tree)| bind(tree, dir))
            .chain(mounts(plan).into_iter().filter(|m| {
                let parent = m.container_path.rsplit_once('/').map(|(p, _)| p);
                !gathered.iter().any(|(dir, _)| Some(*dir) == parent)
            }))
            .collect(),
        hooks: memory_limits_hook(plan, hook).into_iter().collect(),
    }
}

fn mounts(plan: &Plan) -> Vec<Mount> {
    plan.mounts
        .iter()
        .map(|m| bind(&m.source, &m.destination))
        .collect()
}

fn bind(source: &Path, destination: &str) -> Mount {
    Mount {
        host_path: source.display().to_string(),
        container_path: destination.to_string(),
        // Untyped, as in NVIDIA's specs: `rbind` makes it a bind mount (with what is mounted
        // under it), and the spec stays readable by engines whose CDI library predates 0.4.0.
        kind: None,
        options: MOUNT_OPTIONS.iter().map(|o| o.to_string()).collect(),
    }
}

/// The edits of `runtime-mode = "hook"`: the plan's device nodes (so that their rules are the
/// runtime's, and survive `runc update`) and nvhook's prestart hook, which does the rest. In
/// a container with a user namespace of its own (`user_namespace`) runc binds each listed node
/// from its container path on the host, whatever the edit's host path: a node that lives
/// elsewhere there (a dev root other than /) is left to the hook, which binds it from where it
/// is.
pub fn hook_mode_edits(plan: &Plan, hook: &HookBinary, user_namespace: bool) -> ContainerEdits {
    let mut device_nodes = device_nodes(plan);
    if user_namespace {
        device_nodes.retain(|n| n.host_path.is_none());
    }
    ContainerEdits {
        device_nodes,
        hooks: vec![hook.hook("prestart", Vec::new())],
        ..ContainerEdits::default()
    }
}

/// `nri-mode = "cdi-devices"`: the CDI names of the GPUs and MIG devices `plan` selected
/// (`nvidia.com/gpu=0`, `nvidia.com/gpu=3:1`), as the spec `nvhook cdi refresh` writes them by
/// default, for the engine to inject.
pub fn cdi_device_names(plan: &Plan) -> Vec<String> {
    plan.selected
        .iter()
        .map(|s| format!("{KIND}={}", s.id))
        .collect()
}

/// The IMEX channel and device-family nodes `plan` adds, as plain device nodes: no CDI spec
/// device names them per container (`nri-mode = "cdi-devices"` gives them this way). No hook.
pub fn imex_and_family_edits(plan: &Plan) -> ContainerEdits {
    ContainerEdits {
        device_nodes: plan
            .devices
            .iter()
            .filter(|d| imex_and_families::all_kinds().any(|k| k.matches(&d.path)))
            .map(|d| device_node(d, None))
            .collect(),
        ..ContainerEdits::default()
    }
}

/// The plan's device nodes, each with the cgroup access the plan grants it.
pub fn device_nodes(plan: &Plan) -> Vec<DeviceNode> {
    plan.devices
        .iter()
        .map(|d| {
            let access = plan
                .cgroup_rules
                .iter()
                .find(|r| r.major == d.major && r.minor == d.minor)
                .map(|r| r.access.to_string());
            device_node(d, access)
        })
        .collect()
}

/// One node as a CDI device node, with `access` (`rw`) for its cgroup rule.
pub fn device_node(d: &crate::plan::DeviceNode, access: Option<String>) -> DeviceNode {
    let host_path = d.host_path.display().to_string();
    DeviceNode {
        host_path: (host_path != d.path).then_some(host_path),
        path: d.path.clone(),
        kind: Some("c".into()),
        major: Some(d.major.into()),
        minor: Some(d.minor.into()),
        file_mode: Some(d.mode),
        permissions: access,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{ImageInfo, build};
    use crate::request::{DeviceId, DeviceSelection};
    use nvhook_model::plan::fixtures::standard;

    /// The hook entries' nvhook at /usr/bin, told `config`; its hook makes the mounts or not.
    fn hook_binary(makes_mounts: bool, config: Option<&str>) -> HookBinary {
        HookBinary {
            path: "/usr/bin/nvhook".into(),
            config: config.map(Into::into),
            makes_mounts,
        }
    }

    pub(crate) fn request(devices: DeviceSelection) -> crate::request::Request {
        crate::cdi::generate::request(devices, Config::default().supported_capabilities)
    }

    #[test]
    fn cdi_devices_name_the_selected_gpus_and_carry_only_imex_and_family_nodes() {
        let image = ImageInfo {
            debian: true,
            has_usr_lib64: false,
            has_ldcache: true,
            cuda_compat: None,
        };
        let req = request(DeviceSelection::List(vec![
            DeviceId::Index(1),
            DeviceId::Index(2),
        ]));
        let mut plan = build(&req, &standard(), "/node", image).unwrap();
        plan.devices.push(crate::plan::DeviceNode {
            path: "/dev/nvidia-caps-imex-channels/channel3".into(),
            host_path: "/node/dev/nvidia-caps-imex-channels/channel3".into(),
            major: 234,
            minor: 3,
            mode: 0o666,
        });
        let names = cdi_device_names(&plan);
        let edits = imex_and_family_edits(&plan);
        assert_eq!(names, ["nvidia.com/gpu=1", "nvidia.com/gpu=2"]);
        let paths: Vec<&str> = edits.device_nodes.iter().map(|n| n.path.as_str()).collect();
        assert_eq!(paths, ["/dev/nvidia-caps-imex-channels/channel3"]);
        assert!(edits.hooks.is_empty() && edits.mounts.is_empty() && edits.env.is_empty());
    }

    /// Edits with no hook of a spec (`mounts`) get nvhook's memoryLimits hook naming the GPUs
    /// where the plan has GPU memory limits, and none where it has not; the edits with the
    /// spec's hook leave the limits to it.
    #[test]
    fn only_a_container_that_asks_for_memory_limits_gets_their_hook() {
        let image = ImageInfo {
            debian: true,
            has_usr_lib64: false,
            has_ldcache: true,
            cuda_compat: None,
        };
        let mut req = request(DeviceSelection::List(vec![
            DeviceId::Index(0),
            DeviceId::Index(2),
        ]));
        let hook = hook_binary(false, None);
        let plain = build(&req, &standard(), "/node", image.clone()).unwrap();
        let stages = |edits: &ContainerEdits| -> Vec<String> {
            edits.hooks.iter().map(|h| h.hook_name.clone()).collect()
        };
        assert!(hookless_edits(&plain, &hook, &[]).hooks.is_empty());

        req.memory_limits = Some(crate::request::MemoryLimits {
            request_mib: 1,
            limit_mib: 2,
        });
        let limited = build(&req, &standard(), "/node", image).unwrap();
        assert_eq!(stages(&container_edits(&limited, &hook)), ["createRuntime"]);
        let uuids: Vec<String> = limited.selected.iter().map(|s| s.uuid.clone()).collect();
        assert_eq!(uuids.len(), 2);
        let edits = hookless_edits(&limited, &hook, &[]);
        assert_eq!(stages(&edits), ["createRuntime"]);
        let mut expected = vec!["nvhook".to_string(), "hook".into(), "memoryLimits".into()];
        expected.extend(uuids);
        assert_eq!(edits.hooks[0].args, expected);
    }

    /// A gathered driver directory is one recursive, read-only bind of the host's directory
    /// in place of its files' mounts; the files of a directory not gathered keep theirs.
    #[test]
    fn a_gathered_driver_directory_is_one_bind_mount() {
        let inventory = standard();
        let req = request(DeviceSelection::List(vec![DeviceId::Index(1)]));
        let dirs = crate::plan::DriverDirs {
            lib64: true,
            lib32: false,
            bin: true,
        };
        let layout = crate::plan::Layout::at_sonames(inventory.arch, dirs);
        let plan = crate::plan::build_with_layout(&req, &inventory, "/node", layout).unwrap();
        let hook = hook_binary(false, None);
        let per_file = hookless_edits(&plan, &hook, &[]);
        let lib64 = "/usr/local/nvidia/lib64";
        let tree = PathBuf::from("/run/nvhook/driver-dirs/0123456789abcdef");
        let edits = hookless_edits(&plan, &hook, &[(lib64, tree)]);
        let in_dir = |edits: &ContainerEdits, dir: &str| {
            edits
                .mounts
                .iter()
                .filter(|m| m.container_path.rsplit_once('/').map(|(p, _)| p) == Some(dir))
                .count()
        };
        assert!(in_dir(&per_file, lib64) > 1);
        assert_eq!(in_dir(&edits, lib64), 0);
        let bind = edits
            .mounts
            .iter()
            .find(|m| m.container_path == lib64)
            .unwrap();
        assert_eq!(bind.host_path, "/run/nvhook/driver-dirs/0123456789abcdef");
        assert_eq!(bind.options, ["ro", "nosuid", "nodev", "rbind", "rprivate"]);
        let bin = "/usr/local/nvidia/bin";
        assert!(in_dir(&edits, bin) > 0);
        assert_eq!(in_dir(&edits, bin), in_dir(&per_file, bin));
        assert_eq!(
            edits.mounts.len(),
            per_file.mounts.len() - in_dir(&per_file, lib64) + 1
        );
    }

    #[test]
    fn edits_carry_nodes_mounts_and_one_create_runtime_hook() {
        let image = ImageInfo {
            debian: true,
            has_usr_lib64: false,
            has_ldcache: true,
            cuda_compat: None,
        };
        let req = request(DeviceSelection::List(vec![DeviceId::Index(1)]));
        let plan = build(&req, &standard(), "/node", image).unwrap();
        let hook = hook_binary(false, Some("/etc/nvhook/config.toml"));
        let edits = container_edits(&plan, &hook);
        assert_eq!(edits.env, vec!["NVIDIA_VISIBLE_DEVICES=void"]);
        let gpu1 = edits
            .device_nodes
            .iter()
            .find(|n| n.path == "/dev/nvidia1")
            .unwrap();
        assert_eq!(gpu1.host_path.as_deref(), Some("/node/dev/nvidia1"));
        assert_eq!((gpu1.major, gpu1.minor), (Some(195), Some(1)));
        assert_eq!(gpu1.permissions.as_deref(), Some("rw"));
        assert_eq!(gpu1.file_mode, Some(0o666));
        assert!(!edits.device_nodes.iter().any(|n| n.path == "/dev/nvidia0"));
        assert_eq!(edits.device_nodes.len(), plan.devices.len());
        assert_eq!(edits.mounts.len(), plan.mounts.len());
        let libcuda = edits
            .mounts
            .iter()
            .find(|m| m.container_path == "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15")
            .unwrap();
        assert_eq!(
            libcuda.host_path,
            "/drv/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"
        );
        assert!(libcuda.options.contains(&"ro".to_string()));
        assert!(libcuda.options.contains(&"nosuid".to_string()));
        let [h] = edits.hooks.as_slice() else {
            panic!("one hook expected: {:?}", edits.hooks)
        };
        assert_eq!(h.hook_name, "createRuntime");
        assert_eq!(h.path, "/usr/bin/nvhook");
        assert_eq!(
            h.args[..5],
            [
                "nvhook",
                "--config",
                "/etc/nvhook/config.toml",
                "hook",
                "createRuntime"
            ]
        );
        assert!(!h.env.is_empty() && h.timeout.is_some());
        // What the hook is told to do is the plan's links and cache entries, exactly.
        assert!(
            LinkArgs::parse(&h.args[5..])
                .unwrap()
                .applies_like(&LinkArgs::from_plan(&plan))
        );
    }

    /// `cdi-mounts = "hook"`: the edits keep the nodes and leave every mount of the plan to the
    /// createRuntime hook, whose arguments name each with its kind.
    #[test]
    fn with_mounts_by_the_hook_the_edits_list_none_and_the_hook_has_them_all() {
        let req = request(DeviceSelection::List(vec![DeviceId::Index(1)]));
        let plan = build(&req, &standard(), "/node", ImageInfo::default()).unwrap();
        assert!(!plan.mounts.is_empty());
        let hook = hook_binary(true, None);
        let edits = container_edits(&plan, &hook);
        assert!(edits.mounts.is_empty());
        assert_eq!(edits.device_nodes.len(), plan.devices.len());
        let [h] = edits.hooks.as_slice() else {
            panic!("one hook expected: {:?}", edits.hooks)
        };
        let args = LinkArgs::parse(&h.args[3..]).unwrap();
        let planned = LinkArgs {
            mounts: plan.mounts.clone(),
            ..LinkArgs::from_plan(&plan)
        };
        assert!(args.applies_like(&planned), "{args:?}");
        // The files' sources are under the driver root, which the arguments name once.
        let at = h.args.iter().position(|a| a == "--host-root").unwrap();
        assert_eq!(h.args[at + 1], "/drv");
    }

    #[test]
    fn no_hook_when_there_is_nothing_to_link() {
        let mut inventory = standard();
        for node in &mut inventory.nodes {
            node.host_path = node.path.clone().into();
        }
        let mut plan = build(
            &request(DeviceSelection::All),
            &inventory,
            "/",
            ImageInfo::default(),
        )
        .unwrap();
        plan.symlinks.clear();
        plan.ldcache.clear();
        plan.ld_so_confs.clear();
        plan.proc_overlay = None;
        let hook = hook_binary(false, None);
        let edits = container_edits(&plan, &hook);
        assert!(edits.hooks.is_empty());
        // The host's node is at the container's path: no hostPath, so no CDI 0.5.0 needed.
        assert!(edits.device_nodes.iter().all(|n| n.host_path.is_none()));
    }
}
