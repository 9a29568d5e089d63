//! nvhook-runtime: a drop-in for runc that, on `create` and `run` of a GPU container, puts
//! the plan's device nodes and cgroup rules into config.json (so the runtime owns them and
//! they survive `runc update` and `systemctl daemon-reload`), adds the prestart hook, and
//! hands the plan to the hook through the bundle so NVML is initialised once per start.

use crate::atomic_file::{NewFile, write_atomic};
use crate::config::{Config, RuntimeMode};
use crate::delivery::{self, HookBinary, PrepareError};
use crate::dev_char;
use crate::hook::step::Step;
use crate::host_plan::{Target, plan_for_host, probe_image};
use crate::inventory::isolated::{Remembered, Source};
use crate::inventory::{self, Inventory, InventoryError, Scope};
use crate::oci::Spec;
use crate::plan::Plan;
use crate::plan_file::{self, PlanFileError};
use crate::request::Request;
use crate::rootfs::Rootfs;

use nvhook_runtime::Invocation;
use serde_json::Value;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

pub mod server;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeCreateError {
    #[error("none of the runtimes {0:?} is installed (set `runtimes` in the nvhook config)")]
    NoRuntime(Vec<String>),
    #[error("cannot {op} {path}: {source}")]
    Bundle {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot edit {path}: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error(transparent)]
    Prepare(#[from] PrepareError),
    #[error(transparent)]
    PlanFile(#[from] PlanFileError),
    #[error("cannot find the bundle (no --bundle and no working directory): {source}")]
    NoBundle { source: std::io::Error },
}

delivery::prepare_error_sources!(RuntimeCreateError);

/// The low-level runtime to exec: the first of `runtimes` that exists (absolute, or on PATH).
pub fn find_runtime(
    config: &Config,
    path_var: Option<&OsStr>,
) -> Result<PathBuf, RuntimeCreateError> {
    let dirs = search_dirs(path_var);
    config
        .runtimes
        .iter()
        .find_map(|name| locate_runtime(name, &dirs))
        .ok_or_else(|| RuntimeCreateError::NoRuntime(config.runtimes.clone()))
}

/// The directories a runtime named without a path is looked for in: PATH's, or the default
/// search path's when PATH is unset.
pub fn search_dirs(path_var: Option<&OsStr>) -> Vec<PathBuf> {
    let path_var = path_var.unwrap_or(OsStr::from_bytes(nvhook_runtime::DEFAULT_SEARCH_PATH));
    std::env::split_paths(path_var).collect()
}

/// The runtime `name` stands for: itself when absolute, else the first executable file of
/// that name in `dirs`.
pub fn locate_runtime(name: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
    let p = Path::new(name);
    if p.is_absolute() {
        return is_executable(p).then(|| p.to_path_buf());
    }
    dirs.iter().map(|d| d.join(name)).find(|c| is_executable(c))
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Where a create's inventory comes from.
pub enum Inventories<'a> {
    /// What a new process reads: NVML's answer cached in a file for the host's state.
    Files,
    /// A long-running process's memory, used while the host is in the state it was kept for
    /// (the NRI plugin's way), and forgotten when a plan fails on it.
    Remembered(&'a Mutex<Remembered>),
}

impl Inventories<'_> {
    fn load(&self, config: &Config, scope: Scope) -> Result<(Inventory, Source), InventoryError> {
        match self {
            Inventories::Files => inventory::isolated::load(config, scope),
            // A thread that panicked left the answer as a whole value: still usable.
            Inventories::Remembered(kept) => kept
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .load(config, scope),
        }
    }

    /// A kept answer a plan failed on may be stale: the next create asks again.
    fn forget(&self) {
        if let Inventories::Remembered(kept) = self {
            kept.lock().unwrap_or_else(|e| e.into_inner()).forget();
        }
    }
}

/// What `nvhook runtime` does before the runtime runs, for runc's command line `args`: a
/// `create`/`run` gets its bundle prepared, and a GPU container's steps are logged in their
/// own line, with who prepared it (`by`). `step` and `started` began with the request.
pub fn prepare_command<'a>(
    config: &Config,
    config_path: Option<&Path>,
    inventories: &Inventories,
    args: impl IntoIterator<Item = &'a [u8]>,
    mut step: Step,
    started: Instant,
    by: &str,
) -> Result<(), RuntimeCreateError> {
    let invocation = Invocation::parse(args);
    if !invocation.creates() {
        return Ok(());
    }
    let bundle = match invocation.bundle {
        Some(b) => PathBuf::from(OsStr::from_bytes(b)),
        None => {
            std::env::current_dir().map_err(|source| RuntimeCreateError::NoBundle { source })?
        }
    };
    step.done("config");
    let prepared = prepare_bundle(config, config_path, inventories, &bundle, &mut step);
    // Logged in its own line, never as a hook's steps, and only for a GPU container.
    let steps = step.finish();
    if prepared? {
        // Its own time until the runtime may run, as the hooks' `total_us`, and its steps.
        tracing::info!(
            bundle = %bundle.display(),
            by = %by,
            total_us = started.elapsed().as_micros(),
            "GPU container prepared; steps:{steps}"
        );
    }
    Ok(())
}

/// Prepares a bundle for a GPU container; a container that asks for no GPU is left
/// byte for byte as it was. Returns whether config.json was changed; `step` gets the
/// steps' times.
pub fn prepare_bundle(
    config: &Config,
    config_path: Option<&Path>,
    inventories: &Inventories,
    bundle: &Path,
    step: &mut Step,
) -> Result<bool, RuntimeCreateError> {
    let path = bundle.join("config.json");
    let io_err = |op: &'static str| {
        let path = path.clone();
        move |source| RuntimeCreateError::Bundle { op, path, source }
    };
    let json_err = |source| RuntimeCreateError::Json {
        path: path.clone(),
        source,
    };
    let text = std::fs::read_to_string(&path).map_err(io_err("read"))?;
    let (spec, mut value) = Spec::parse_with_document(&text, &path)?;
    let Some(request) = Request::from_spec(&spec, config)? else {
        return Ok(false);
    };
    step.done("request");
    let rootfs = spec.rootfs(bundle).ok_or(PrepareError::NoRoot)?;
    let scope = inventory::Scope::for_capabilities(&request.capabilities);
    let (inventory, source) = inventories.load(config, scope)?;
    let kept = source == Source::Cache;
    step.done("inventory");
    // The container's mount namespace does not exist yet: the image as the host sees it. The
    // hook probes it again through the namespace and plans anew where a volume changed it.
    let image = probe_image(&request, config, &rootfs)?;
    step.done("image");
    let plan = plan_for_host(&request, inventory, source, config, Target::Image(&image))
        .inspect_err(|_| {
            if kept {
                inventories.forget();
            }
        })?;
    step.done("plan");
    if config.runtime_mode == RuntimeMode::Cdi {
        // Refused before the runtime starts: where it makes the driver files' mounts
        // (`cdi-mounts = "runtime"`) it would make these mount points before any hook could
        // check them; where the hook makes them, it is the same refusal, earlier.
        Rootfs::open(&rootfs)?.check_binds(
            plan.mounts.iter().map(|m| m.destination.as_str()),
            &spec.mount_points(),
        )?;
    }
    // Before the runtime turns the rules into systemd's DeviceAllow= entries.
    dev_char::ensure_for_plan(config, &plan);
    step.done("dev-char");
    match config.runtime_mode {
        RuntimeMode::Hook => edit_spec(&mut value, &plan, &HookBinary::new(config, config_path)),
        // The same edits a CDI spec would make, for this container's image and request.
        RuntimeMode::Cdi => {
            let mut edits = delivery::container_edits(&plan, &HookBinary::new(config, config_path));
            delivery::args_file::kept::externalize(&mut edits, config);
            delivery::config_json::apply(&mut value, &edits)
        }
    }
    step.done("edit");
    // Compact, as engines write it: the runtime reads it once, and pretty printing costs more.
    let out = serde_json::to_vec(&value).map_err(json_err)?;
    let mode = std::fs::metadata(&path)
        .map(|m| m.permissions().mode() & 0o7777)
        .unwrap_or(0o644);
    write_atomic(&path, &out, NewFile::mode(mode)).map_err(io_err("write"))?;
    if config.runtime_mode == RuntimeMode::Hook {
        plan_file::write(bundle, plan, image)?;
    }
    step.done("write");
    Ok(true)
}

/// Adds the hook (unless one with the same path is there), the device nodes to
/// `linux.devices` and their allow rules to `linux.resources.devices`. Unknown fields stay.
pub fn edit_spec(spec: &mut Value, plan: &Plan, hook: &HookBinary) {
    let edits = delivery::hook_mode_edits(plan, hook, has_user_namespace(spec));
    delivery::config_json::apply(spec, &edits);
}

fn has_user_namespace(spec: &Value) -> bool {
    spec["linux"]["namespaces"]
        .as_array()
        .is_some_and(|all| all.iter().any(|ns| ns["type"] == "user"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HOOK_TIMEOUT_S;
    use nvhook_model::plan::fixtures::one_gpu_plan;
    use serde_json::json;

    #[test]
    fn packaged_hook_json_has_the_same_timeout() {
        let hook: Value =
            serde_json::from_str(include_str!("../hooks/oci-nvhook-hook.json")).unwrap();
        assert_eq!(hook["hook"]["timeout"], HOOK_TIMEOUT_S);
        assert_eq!(
            HookBinary::new(&Config::default(), None)
                .hook("prestart", Vec::new())
                .timeout,
            Some(HOOK_TIMEOUT_S)
        );
    }

    #[test]
    fn edit_keeps_unknown_fields_and_is_idempotent_for_hooks() {
        let mut spec = json!({
            "ociVersion": "1.0.2",
            "x-unknown": {"keep": [1, 2]},
            "hooks": {"poststop": [{"path": "/bin/true"}]},
            "linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]}}
        });
        let plan = one_gpu_plan();
        let hook = HookBinary::new(&Config::default(), Some(Path::new("/etc/n.toml")));
        edit_spec(&mut spec, &plan, &hook);
        edit_spec(&mut spec, &plan, &hook);
        assert_eq!(spec["x-unknown"], json!({"keep": [1, 2]}));
        assert_eq!(spec["hooks"]["poststop"][0]["path"], "/bin/true");
        assert_eq!(spec["hooks"]["prestart"].as_array().unwrap().len(), 1);
        assert_eq!(spec["hooks"]["prestart"][0]["args"][2], "/etc/n.toml");
        assert!(
            !spec["hooks"]["prestart"][0]["env"]
                .as_array()
                .unwrap()
                .is_empty()
        );
        assert_eq!(spec["linux"]["devices"].as_array().unwrap().len(), 1);
        assert_eq!(spec["linux"]["devices"][0]["fileMode"], 438);
        // The default deny stays first; the allow rule comes after it.
        assert_eq!(spec["linux"]["resources"]["devices"][0]["allow"], false);
        assert_eq!(spec["linux"]["resources"]["devices"][1]["major"], 195);
    }

    #[test]
    fn in_a_user_namespace_a_node_from_another_dev_root_is_left_to_the_hook() {
        let hook = HookBinary::new(&Config::default(), None);
        let userns = json!({"linux": {"namespaces": [{"type": "pid"}, {"type": "user"}]}});
        // The node at the same path on the host: runc binds it itself.
        let mut spec = userns.clone();
        edit_spec(&mut spec, &one_gpu_plan(), &hook);
        assert_eq!(spec["linux"]["devices"].as_array().unwrap().len(), 1);
        // Under a dev root: runc would look for it at /dev/nvidia0 on the host.
        let mut plan = one_gpu_plan();
        plan.devices[0].host_path = "/run/nvidia/driver/dev/nvidia0".into();
        let mut spec = userns;
        edit_spec(&mut spec, &plan, &hook);
        assert!(
            spec["linux"]["devices"]
                .as_array()
                .is_none_or(|d| d.is_empty())
        );
        assert_eq!(spec["hooks"]["prestart"].as_array().unwrap().len(), 1);
        // Without a user namespace runc makes it by its numbers, wherever it lives.
        let mut spec = json!({});
        edit_spec(&mut spec, &plan, &hook);
        assert_eq!(spec["linux"]["devices"].as_array().unwrap().len(), 1);
    }
}
