//! `nvhook nri`: nvhook as an NRI plugin. The engine asks it about every container it
//! creates; a GPU container gets its devices, driver files and createRuntime hook as an
//! adjustment, with no engine config, no restart and no RuntimeClass.
//!
//! The request is read by the hook's own code ([`Request::from_spec`]) from the container's
//! fields, and the edits are nvhook-runtime's, handed to the engine: in `nri-mode = "hook"`
//! the device nodes and the prestart hook; in `"cdi"` the plan a CDI spec holds for those
//! devices (libraries at their host paths, for any image) as edits for the runtime; in
//! `"mounts"` no hook: every file a bind mount, libraries under their SONAMEs where the
//! loader looks without a cache entry, or, in an image whose environment searches
//! `/usr/local/nvidia/lib64` (NVIDIA's CUDA images), each such directory one bind mount of the
//! files gathered on the host ([`driver_trees`]).

pub mod adjust;
pub mod container;
pub mod driver_trees;
pub mod engine_view;
pub mod registration;

use crate::atomic_file::{NewFile, write_atomic};
use crate::cdi::ContainerEdits;
use crate::config::{Config, NriMode};
use crate::delivery::edits::{cdi_device_names, imex_and_family_edits};
use crate::delivery::{HookBinary, PrepareError, container_edits, hook_mode_edits, hookless_edits};
use crate::host_plan::{Target, plan_for_host};
use crate::inventory::isolated::Remembered;
use crate::inventory::{self};
use crate::request::Request;
use engine_view::EngineView;
use nvhook_nri::api::{
    Container, ContainerAdjustment, CreateContainerResponse, Event, EventMask, PodSandbox,
    StateChangeEvent,
};
use nvhook_nri::{Configuration, HandlerError, Plugin};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The name nvhook registers under, and its default index: early, so that plugins after it
/// see the GPUs it gave.
pub const PLUGIN_NAME: &str = "nvhook";
pub const PLUGIN_INDEX: &str = "10";

/// How the config the engine passes is named in errors, and where the hook entries find it.
const ENGINE_CONFIG: &str = "(the engine's NRI plugin config for nvhook)";
const ENGINE_CONFIG_COPY: &str = "nri-config.toml";
const DEFAULT_STATE_DIR: &str = "/run/nvhook";

/// The plugin. Like the hook, it takes its config as it is for every container (read again
/// once the file changed), so a policy change applies to the next container without a restart.
pub struct GpuPlugin {
    config_path: Option<PathBuf>,
    config: Mutex<crate::config::Kept>,
    /// NVML's answer for the host as it is: asked once, not per container.
    nvml: Mutex<Remembered>,
    /// When the inventories left for hooks were last swept ([`crate::nri_handoff::sweep`]).
    swept: Mutex<Option<std::time::Instant>>,
    /// Where mounts the engine sees are made, which gathered driver directories need.
    engine: Mutex<EngineView>,
}

impl GpuPlugin {
    /// A plugin that reads the config at `config_path` (the default path if none).
    pub fn new(config_path: Option<PathBuf>) -> GpuPlugin {
        GpuPlugin {
            config_path,
            config: Mutex::default(),
            nvml: Mutex::new(Remembered::default()),
            swept: Mutex::default(),
            engine: Mutex::new(EngineView::Unseen("no engine connected yet".into())),
        }
    }

    /// The engine on the other end of the connection is the process `pid` (as this process's
    /// pid namespace numbers it; None where the kernel gave none): where it sees mounts
    /// decides where driver directories are gathered, if anywhere.
    pub fn engine_connected(&self, pid: Option<i32>) {
        let view = EngineView::of(pid);
        match &view {
            EngineView::Shared => tracing::info!(
                ?pid,
                "NRI: the engine shares this plugin's mount namespace: driver directories an image searches are gathered on the host"
            ),
            EngineView::Entered(_) => tracing::info!(
                ?pid,
                "NRI: the engine is in another mount namespace: driver directories an image searches are gathered in the engine's"
            ),
            EngineView::Unseen(why) => tracing::info!(
                ?pid,
                "NRI: {why}: in nri-mode = \"mounts\" the runtime binds each driver file"
            ),
        }
        *self.engine.lock().unwrap_or_else(|e| e.into_inner()) = view;
    }

    /// The gathered directory of each driver directory `plan` uses, where the engine can see
    /// them; a directory that cannot be gathered is left to per-file mounts, with a warning.
    fn gathered(&self, config: &Config, plan: &crate::plan::Plan) -> Vec<(&'static str, PathBuf)> {
        let by_dir = crate::plan::driver_dirs::files_by_dir(plan);
        let view = self
            .engine
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if by_dir.is_empty() || !view.sees_gathered() {
            return Vec::new();
        }
        let trees = driver_trees::DriverTrees::new(&state_dir(config), view);
        let sets: Vec<&[(&str, &Path)]> =
            by_dir.iter().map(|(_, files)| files.as_slice()).collect();
        let gathered = trees.gather(&sets).unwrap_or_else(|e| {
            tracing::warn!("NRI: {e}: the runtime binds each driver file");
            Vec::new()
        });
        by_dir
            .iter()
            .zip(gathered)
            .filter_map(|((dir, _), tree)| match tree {
                Ok(tree) => Some((*dir, tree)),
                Err(e) => {
                    tracing::warn!(dir, "NRI: cannot gather the driver's files ({e}): the runtime binds each of them");
                    None
                }
            })
            .collect()
    }

    /// Removes the inventories left for hooks that can no longer take them: always when
    /// `now` (the plugin connecting: containers may have gone while it was away), else when
    /// the last sweep is older than what a hook may take.
    fn sweep_handoffs(&self, config: &Config, now: bool) {
        let mut swept = self.swept.lock().unwrap_or_else(|e| e.into_inner());
        if now || swept.is_none_or(|at| at.elapsed() >= crate::nri_handoff::MAX_AGE) {
            let removed = crate::nri_handoff::sweep(config);
            if removed > 0 {
                tracing::info!(
                    removed,
                    "NRI: inventories left for containers that never took them removed"
                );
            }
            *swept = Some(std::time::Instant::now());
        }
    }

    fn config(&self) -> Result<Config, PrepareError> {
        // A plugin thread that panicked left the kept config whole: still usable.
        let mut kept = self.config.lock().unwrap_or_else(|e| e.into_inner());
        Ok(kept.load(self.config_path.as_deref())?)
    }

    /// What `container` gets: `None` for a container that asked for no GPU, which is left
    /// exactly as it is.
    pub fn adjust(
        &self,
        pod: &PodSandbox,
        container: &Container,
    ) -> Result<Option<ContainerAdjustment>, PrepareError> {
        let started = std::time::Instant::now();
        let config = self.config()?;
        // The engine applies these from nvhook's spec: anything added here would be a second
        // copy, and a CUDA image's NVIDIA_VISIBLE_DEVICES=all would add every other GPU.
        let from_engine = container::engine_cdi_devices(container);
        if !from_engine.is_empty() {
            tracing::info!(devices = ?from_engine, "NRI: the engine injects the CDI devices of nvhook's kind this container asked for: nothing added");
            return Ok(None);
        }
        let mut spec = container::spec_of(container);
        let annotated =
            container::annotated_devices(pod, container, &config.nri_annotation_namespaces);
        if !annotated.is_empty() {
            spec = container::with_device_mounts(spec, &annotated);
        }
        let Some(request) = Request::from_spec(&spec, &config)? else {
            return Ok(None);
        };
        let scope = inventory::Scope::for_capabilities(&request.capabilities);
        // A plugin thread that panicked left the answer as a whole value: still usable.
        let mut nvml = self.nvml.lock().unwrap_or_else(|e| e.into_inner());
        let (inventory, source) = nvml.load(&config, scope)?;
        let target = match config.nri_mode {
            NriMode::Hook | NriMode::Cdi | NriMode::CdiDevices => Target::AnyImage,
            NriMode::Mounts => {
                Target::AnyImageNoHook(crate::plan::DriverDirs::from_env(&container.env))
            }
        };
        let kept = source == inventory::isolated::Source::Cache;
        // The hook plans for the image with the same inventory.
        let handed = match (config.nri_mode, nvml.fingerprint()) {
            (NriMode::Hook, Some(fingerprint)) => Some((fingerprint.clone(), inventory.clone())),
            _ => None,
        };
        let plan =
            plan_for_host(&request, inventory, source, &config, target).inspect_err(|_| {
                // A kept answer the plan failed on may be stale: the next container asks again.
                // A fresh one stays: the request was at fault.
                if kept {
                    nvml.forget()
                }
            })?;
        drop(nvml);
        if let Some((fingerprint, inventory)) = handed {
            self.sweep_handoffs(&config, false);
            crate::nri_handoff::leave(&config, &container.id, fingerprint, scope, inventory);
        }
        crate::dev_char::ensure_for_plan(&config, &plan);
        let hook = HookBinary::new(&config, self.config_path.as_deref());
        let edits = match config.nri_mode {
            // The hook reads the request from config.json as the engine wrote it, so devices
            // an annotation asked for reach it the way the device plugin's do.
            NriMode::Hook => ContainerEdits {
                mounts: annotated
                    .iter()
                    .map(|id| container::device_mount(id))
                    .collect(),
                ..hook_mode_edits(&plan, &hook, container::has_user_namespace(container))
            },
            NriMode::Cdi => {
                let mut edits = container_edits(&plan, &hook);
                crate::delivery::args_file::kept::externalize(&mut edits, &config);
                edits
            }
            NriMode::Mounts => hookless_edits(&plan, &hook, &self.gathered(&config, &plan)),
            // The engine injects the GPUs from the spec, whose createRuntime hook sets the
            // GPU memory limits the container asks for.
            NriMode::CdiDevices => imex_and_family_edits(&plan),
        };
        let mut adjustment = adjust::adjustment(&edits);
        if config.nri_mode == NriMode::CdiDevices {
            adjustment.cdi_devices = cdi_device_names(&plan)
                .into_iter()
                .map(|name| nvhook_nri::api::CdiDevice { name })
                .collect();
        }
        // One line per GPU container, as the hook's "hook finished".
        tracing::info!(id = %container.id, mode = ?config.nri_mode, us = started.elapsed().as_micros(), "NRI: planned");
        Ok(Some(adjustment))
    }
}

/// nvhook's runtime state directory: beside NVML's cached answer.
pub fn state_dir(config: &Config) -> PathBuf {
    config
        .nvml_cache()
        .and_then(Path::parent)
        .unwrap_or(Path::new(DEFAULT_STATE_DIR))
        .to_path_buf()
}

impl Plugin for GpuPlugin {
    fn connected(&mut self, engine_pid: Option<i32>) {
        self.engine_connected(engine_pid);
    }

    fn configure(&mut self, config: &Configuration) -> Result<EventMask, HandlerError> {
        tracing::info!(
            runtime = %config.runtime_name,
            version = %config.runtime_version,
            nri = %config.nri_version,
            request_timeout_ms = config.request_timeout_ms,
            "NRI: configured by the engine"
        );
        // A pre-registered plugin's config file (NN-nvhook.conf in the engine's plugin config
        // directory) is nvhook's config: a bad one fails the registration, in the engine's log.
        if !config.config.trim().is_empty() {
            let parsed = Config::parse(&config.config, Path::new(ENGINE_CONFIG))?;
            crate::logging::redirect_service(&parsed);
            // Read from a file for every container, as every hook entry reads it: beside
            // nvhook's other runtime state (NVML's cached answer).
            let path = &state_dir(&parsed).join(ENGINE_CONFIG_COPY);
            std::fs::create_dir_all(path.parent().unwrap_or(Path::new("/")))
                .and_then(|()| write_atomic(path, config.config.as_bytes(), NewFile::mode(0o644)))
                .map_err(|e| {
                    format!(
                        "cannot keep the engine's config for nvhook at {}: {e}",
                        path.display()
                    )
                })?;
            self.config_path = Some(path.into());
            tracing::info!(copy = %path.display(), "NRI: using the config the engine passed");
        }
        Ok(EventMask::of(&[
            Event::CreateContainer,
            Event::RemoveContainer,
        ]))
    }

    /// The plugin (re)connected: what was left for containers removed while it was not
    /// connected goes.
    fn synchronize(
        &mut self,
        _pods: Vec<PodSandbox>,
        _containers: Vec<Container>,
    ) -> Result<Vec<nvhook_nri::api::ContainerUpdate>, HandlerError> {
        if let Ok(config) = self.config() {
            self.sweep_handoffs(&config, true);
        }
        Ok(Vec::new())
    }

    /// A container removed before its hook took what was left for it.
    fn state_change(&mut self, event: &StateChangeEvent) -> Result<(), HandlerError> {
        if event.event == Event::RemoveContainer as i32
            && let Some(container) = &event.container
            && let Ok(config) = self.config()
        {
            crate::nri_handoff::discard(&config, &container.id);
        }
        Ok(())
    }

    fn create_container(
        &mut self,
        pod: &PodSandbox,
        container: &Container,
    ) -> Result<CreateContainerResponse, HandlerError> {
        let name = format!("{}/{}/{}", pod.namespace, pod.name, container.name);
        match self.adjust(pod, container) {
            Ok(None) => Ok(CreateContainerResponse::default()),
            Ok(Some(adjust)) => {
                tracing::info!(
                    container = %name,
                    devices = adjust.linux.as_ref().map_or(0, |l| l.devices.len()),
                    mounts = adjust.mounts.len(),
                    "NRI: GPU container adjusted"
                );
                Ok(CreateContainerResponse {
                    adjust: Some(adjust),
                    ..Default::default()
                })
            }
            Err(e) => {
                tracing::warn!(container = %name, "NRI: refused: {e}");
                Err(format!("nvhook: {e}").into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A container whose CDI devices of nvhook's kind the engine applies gets nothing from the
    /// plugin, though its image asks for every GPU; the same container without them is read
    /// as a request (and fails here, where nothing answers for NVML).
    #[test]
    fn a_container_the_engine_gives_nvhooks_cdi_devices_is_left_to_the_engine() {
        let dir = tempfile::tempdir().expect("a config directory");
        let config = dir.path().join("config.toml");
        let absent = dir.path().join("libnvidia-ml.so.1");
        std::fs::write(
            &config,
            format!(
                "nvml-library = \"{}\"\nnvml-cache-file = \"\"\n",
                absent.display()
            ),
        )
        .expect("write the config");
        let plugin = GpuPlugin::new(Some(config));
        let mut container = Container {
            name: "train".into(),
            env: vec!["NVIDIA_VISIBLE_DEVICES=all".into()],
            ..Default::default()
        };
        let pod = PodSandbox::default();
        assert!(plugin.adjust(&pod, &container).is_err());
        container.cdi_devices = vec![nvhook_nri::api::CdiDevice {
            name: format!("{}=1", crate::cdi::KIND),
        }];
        assert_eq!(plugin.adjust(&pod, &container).unwrap(), None);
    }
}
