//! nvhook-runtime: a drop-in for runc that, on `create` and `run` of a GPU container, puts
//! the plan's device nodes and cgroup rules into config.json (so the runtime owns them and
//! they survive `runc update` and `systemctl daemon-reload`), adds the prestart hook, and
//! hands the plan to the hook through the bundle so NVML is initialised once per start.

use crate::cdi::{self, ContainerEdits, HookBinary};
use crate::config::{Config, RuntimeMode};
use crate::file_id::FileId;
use crate::inject;
use crate::inventory;
use crate::oci::Spec;
use crate::plan::Plan;
use crate::request::Request;
use crate::runtime_front;
use serde_json::Value;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The plan the shim computed, read by the hook instead of querying NVML again.
pub const PLAN_FILE: &str = "nvhook-plan.json";

/// The `timeout` of the hook entries nvhook writes, in seconds; `nvml-timeout-ms` stays below it.
pub const HOOK_TIMEOUT_S: u32 = 30;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("none of the runtimes {0:?} is installed (set `runtimes` in the nvhook config)")]
    NoRuntime(Vec<String>),
    #[error("cannot {op} {path}: {message}")]
    Bundle {
        op: &'static str,
        path: PathBuf,
        message: String,
    },
    #[error(transparent)]
    Hook(#[from] inject::HookError),
}

/// What the runtime is asked to do, as far as the shim cares.
#[derive(Debug, PartialEq, Eq)]
pub struct Invocation {
    pub command: Option<String>,
    pub bundle: Option<PathBuf>,
}

impl Invocation {
    /// Reads runc's command line (without argv[0]), as nvhook-runtime does.
    pub fn parse(args: &[OsString]) -> Invocation {
        let front = runtime_front::Invocation::parse(args.iter().map(|a| a.as_bytes()));
        Invocation {
            command: front
                .command
                .map(|c| String::from_utf8_lossy(c).into_owned()),
            bundle: front.bundle.map(|b| PathBuf::from(OsStr::from_bytes(b))),
        }
    }

    /// Whether this command creates a container from a bundle.
    pub fn creates(&self) -> bool {
        matches!(self.command.as_deref(), Some("create" | "run"))
    }
}

/// The low-level runtime to exec: the first of `runtimes` that exists (absolute, or on PATH).
pub fn find_runtime(config: &Config, path_var: Option<&OsStr>) -> Result<PathBuf, RuntimeError> {
    let path_var = path_var.unwrap_or(OsStr::from_bytes(runtime_front::DEFAULT_SEARCH_PATH));
    let dirs: Vec<PathBuf> = std::env::split_paths(path_var).collect();
    config
        .runtimes
        .iter()
        .find_map(|name| {
            let p = Path::new(name);
            if p.is_absolute() {
                return is_executable(p).then(|| p.to_path_buf());
            }
            dirs.iter().map(|d| d.join(name)).find(|c| is_executable(c))
        })
        .ok_or_else(|| RuntimeError::NoRuntime(config.runtimes.clone()))
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Prepares a bundle for a GPU container; a container that asks for no GPU is left
/// byte for byte as it was. Returns whether config.json was changed.
pub fn prepare_bundle(
    config: &Config,
    config_path: Option<&Path>,
    bundle: &Path,
) -> Result<bool, RuntimeError> {
    let path = bundle.join("config.json");
    let bundle_err = |op: &'static str, message: String| RuntimeError::Bundle {
        op,
        path: path.clone(),
        message,
    };
    let text = std::fs::read_to_string(&path).map_err(|e| bundle_err("read", e.to_string()))?;
    let spec = Spec::parse(&text, &path).map_err(inject::HookError::from)?;
    let Some(request) = Request::from_spec(&spec, config).map_err(inject::HookError::from)? else {
        return Ok(false);
    };
    let rootfs = spec.rootfs(bundle).ok_or(inject::HookError::NoRoot)?;
    let (inventory, source) = inventory::isolated::load(config).map_err(inject::HookError::from)?;
    let plan = inject::plan_for_host(&request, inventory, source, config, &rootfs)?;
    let mut value: Value =
        serde_json::from_str(&text).map_err(|e| bundle_err("parse", e.to_string()))?;
    match config.runtime_mode {
        RuntimeMode::Hook => edit_spec(&mut value, &plan, &hook_entry(config, config_path)),
        // The same edits a CDI spec would make, for this container's image and request.
        RuntimeMode::Cdi => cdi::oci::apply(
            &mut value,
            &cdi::container_edits(&plan, &HookBinary::new(config, config_path)),
        ),
    }
    let out = serde_json::to_vec_pretty(&value).map_err(|e| bundle_err("encode", e.to_string()))?;
    let mode = std::fs::metadata(&path)
        .map(|m| m.permissions().mode() & 0o7777)
        .unwrap_or(0o644);
    write_atomic(&path, &out, mode).map_err(|e| bundle_err("write", e.to_string()))?;
    if config.runtime_mode == RuntimeMode::Hook {
        let written = FileId::of(&path)
            .ok_or_else(|| bundle_err("stat", "gone after it was written".into()))?;
        let plan_json = serde_json::to_vec(&PlanFile {
            config_json: written,
            plan,
        })
        .map_err(|e| bundle_err("encode", e.to_string()))?;
        write_atomic(&bundle.join(PLAN_FILE), &plan_json, 0o600)
            .map_err(|e| bundle_err("write the plan beside", e.to_string()))?;
    }
    Ok(true)
}

/// The shim's plan, with the config.json it was made for: a bundle whose config.json was
/// rewritten since (a reused bundle, a later start without the shim) gets a fresh plan.
#[derive(serde::Serialize, serde::Deserialize)]
struct PlanFile {
    config_json: FileId,
    plan: Plan,
}

/// The prestart hook entry: absolute path, explicit non-empty env, a timeout.
pub fn hook_entry(config: &Config, config_path: Option<&Path>) -> cdi::spec::Hook {
    HookBinary::new(config, config_path).hook("prestart", Vec::new())
}

/// Adds the hook (unless one with the same path is there), the device nodes to
/// `linux.devices` and their allow rules to `linux.resources.devices`. Unknown fields stay.
pub fn edit_spec(spec: &mut Value, plan: &Plan, hook: &cdi::spec::Hook) {
    let edits = ContainerEdits {
        device_nodes: cdi::edits::device_nodes(plan),
        hooks: vec![hook.clone()],
        ..ContainerEdits::default()
    };
    cdi::oci::apply(spec, &edits);
}

/// Writes a temporary file beside `path` and renames it into place.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.nvhook-{}", std::process::id()));
    let result = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(bytes)?;
            f.set_permissions(std::fs::Permissions::from_mode(mode))
        })
        .and_then(|()| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The plan the shim left in the bundle, if any.
pub fn read_plan(bundle: &Path) -> Option<Plan> {
    let bytes = std::fs::read(bundle.join(PLAN_FILE)).ok()?;
    let file: PlanFile = serde_json::from_slice(&bytes).ok()?;
    let current = FileId::of(&bundle.join("config.json"));
    if current.as_ref() != Some(&file.config_json) {
        tracing::info!("the shim's plan was made for another config.json: not used");
        return None;
    }
    Some(file.plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn packaged_hook_json_has_the_same_timeout() {
        let hook: Value =
            serde_json::from_str(include_str!("../hooks/oci-nvhook-hook.json")).unwrap();
        assert_eq!(hook["hook"]["timeout"], HOOK_TIMEOUT_S);
        assert_eq!(
            hook_entry(&Config::default(), None).timeout,
            Some(HOOK_TIMEOUT_S)
        );
    }

    fn one_gpu_plan() -> Plan {
        serde_json::from_value(json!({
            "driver_version": "550", "selected": [],
            "layout": {"lib64_dir": "/usr/lib", "lib32_dir": "/usr/lib32", "ldcache": false},
            "devices": [{"path": "/dev/nvidia0", "host_path": "/dev/nvidia0", "major": 195, "minor": 0, "mode": 438}],
            "cgroup_rules": [{"kind": "c", "major": 195, "minor": 0, "access": "rw"}],
            "mounts": [], "symlinks": [], "ldcache": [], "ld_so_conf": null, "proc_overlay": null
        }))
        .unwrap()
    }

    #[test]
    fn the_hook_uses_the_shims_plan_only_for_the_config_json_it_was_made_for() {
        let bundle = tempfile::tempdir().unwrap();
        let config_json = bundle.path().join("config.json");
        std::fs::write(&config_json, b"{}").unwrap();
        let file = PlanFile {
            config_json: FileId::of(&config_json).unwrap(),
            plan: one_gpu_plan(),
        };
        let plan_path = bundle.path().join(PLAN_FILE);
        std::fs::write(&plan_path, serde_json::to_vec(&file).unwrap()).unwrap();
        assert_eq!(read_plan(bundle.path()), Some(one_gpu_plan()));
        // The bundle is used again with a config.json written anew: that plan is stale.
        write_atomic(&config_json, b"{}", 0o644).unwrap();
        assert_eq!(read_plan(bundle.path()), None);
        // A plan file from before the config.json identity was recorded is not trusted.
        std::fs::write(&plan_path, serde_json::to_vec(&one_gpu_plan()).unwrap()).unwrap();
        assert_eq!(read_plan(bundle.path()), None);
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
        let hook = hook_entry(&Config::default(), Some(Path::new("/etc/n.toml")));
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
}
