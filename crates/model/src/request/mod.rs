//! The GPU request a container makes through NVIDIA_* variables and device mounts.
//!
//! Pure functions of the OCI spec and the config. The semantics are nvidia-container-toolkit
//! v1.x's (`internal/config/image`, `cmd/nvidia-container-runtime-hook/container_config.go`,
//! libnvidia-container's requirement DSL), so that images and device plugins written for it
//! behave the same; where the toolkit is lenient in a way that hides a mistake, nvhook fails
//! closed instead, and the doc comment says so.

mod devices;
mod imex_and_families;
pub mod memory_limits;
mod require;

pub use devices::{DEVICE_MOUNT_ROOT, DeviceId, DeviceSelection, UnknownDevice};
pub use imex_and_families::{IMEX_CHANNELS, ImexChannels, ImexFamilyError, channel_ranges};
pub use memory_limits::{MemoryLimitError, MemoryLimits};
pub use require::{ConditionError, GpuFacts, InvalidVersion, Requirements, Unsatisfied, Version};

use crate::capability::{Capability, UnknownCapability};
use crate::config::{Config, GpuMemoryLimitsFrom};
use crate::imex_and_families::Family;
use crate::oci::Spec;
use crate::shown::Shown;
use std::collections::BTreeSet;

pub const VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
pub const DRIVER_CAPABILITIES: &str = "NVIDIA_DRIVER_CAPABILITIES";
pub const MIG_CONFIG_DEVICES: &str = "NVIDIA_MIG_CONFIG_DEVICES";
pub const MIG_MONITOR_DEVICES: &str = "NVIDIA_MIG_MONITOR_DEVICES";
pub const DISABLE_REQUIRE: &str = "NVIDIA_DISABLE_REQUIRE";
pub const REQUIRE_PREFIX: &str = "NVIDIA_REQUIRE_";
pub const CUDA_VERSION: &str = "CUDA_VERSION";
const REQUIRE_CUDA: &str = "NVIDIA_REQUIRE_CUDA";
/// Jetson images state JetPack releases, which no host fact answers; the toolkit skips them.
const REQUIRE_JETPACK: &str = "NVIDIA_REQUIRE_JETPACK";

/// What the default `NVIDIA_DRIVER_CAPABILITIES` (unset or empty) means.
const DEFAULT_CAPABILITIES: [Capability; 2] = [Capability::Utility, Capability::Compute];

/// A GPU container's request, ready to be resolved against the host's inventory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub devices: DeviceSelection,
    pub capabilities: BTreeSet<Capability>,
    pub requirements: Requirements,
    /// `NVIDIA_MIG_CONFIG_DEVICES` (privileged containers only).
    pub mig_config: Option<DeviceSelection>,
    /// `NVIDIA_MIG_MONITOR_DEVICES` (privileged containers only).
    pub mig_monitor: Option<DeviceSelection>,
    /// CAP_SYS_ADMIN is in the bounding set.
    pub privileged: bool,
    pub source: SelectionSource,
    /// The image's `CUDA_VERSION`, which names its `/usr/local/cuda-X.Y` directory.
    pub cuda_version: Option<String>,
    /// `NVIDIA_IMEX_CHANNELS` or the device plugin's `imex/<n>` mounts.
    pub imex_channels: Option<ImexChannels>,
    /// The opt-in device families asked for (or on by the config's default).
    pub families: BTreeSet<Family>,
    /// `NVIDIA_GPU_MEMORY_REQUEST` and `NVIDIA_GPU_MEMORY_LIMIT`, or the node's default.
    pub memory_limits: Option<MemoryLimits>,
}

/// Where the device selection came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelectionSource {
    /// `NVIDIA_VISIBLE_DEVICES`, or the `all` a legacy CUDA image implies.
    Env,
    /// Mounts under `/var/run/nvidia-container-devices/`.
    VolumeMounts,
    /// nvidia-container-cli's `--device`, written by the engine (`ctr run --gpus`).
    CliFlag,
}

/// What nvidia-container-cli's `configure` is asked for on its command line. The engine wrote
/// it (`ctr run --gpus`, nerdctl), not the image, so no policy on the environment applies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flags {
    /// `--device=LIST` (the flag may repeat; the lists are joined). None or empty: no GPU,
    /// the driver's files only, as libnvidia-container does.
    pub devices: Option<String>,
    pub capabilities: BTreeSet<Capability>,
    /// Each `--require=EXPR`, one expression each.
    pub requirements: Vec<String>,
    pub mig_config: Option<String>,
    pub mig_monitor: Option<String>,
    /// `--imex-channel=LIST`: channel numbers, or `all`.
    pub imex_channels: Option<String>,
}

/// The outcome of reading a spec, for callers that log why a container is left alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Gpu(Box<Request>),
    /// No GPU asked for (`NVIDIA_VISIBLE_DEVICES` unset, empty or `void`): touch nothing.
    NotRequested,
    /// Asked for through the environment by an unprivileged container while
    /// `accept-env-when-unprivileged` is off: the toolkit then treats the container as not a
    /// GPU container (and logs a warning), so this is not an error either.
    EnvIgnored,
}

/// Every value from the container is an [`Shown`] (or an origin made with one), so that a
/// refusal stays one short line whatever the container says.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("{origin}: {source}")]
    UnknownDevice {
        /// `NAME=value` or `volume mount <path>`.
        origin: String,
        source: UnknownDevice,
    },
    #[error("NVIDIA_DRIVER_CAPABILITIES={value}: {source}")]
    UnknownCapability {
        value: Shown,
        source: UnknownCapability,
    },
    #[error(
        "NVIDIA_DRIVER_CAPABILITIES={value}: this node does not serve capability {capability} (it serves {supported}; ask for those, or add {capability} to supported-capabilities in the nvhook config)"
    )]
    UnsupportedCapability {
        value: Shown,
        capability: Capability,
        supported: String,
    },
    #[error(
        "{variable}={value}: only a privileged container (CAP_SYS_ADMIN in its bounding set) may manage MIG (run it privileged or unset {variable})"
    )]
    MigUnprivileged {
        variable: &'static str,
        value: Shown,
    },
    /// Names the condition at fault rather than the whole value, which would repeat it: the
    /// line then quotes the variable, the condition and its version, not a fourth value.
    #[error("{variable}: {source}")]
    Requirement {
        variable: Shown,
        source: ConditionError,
    },
    #[error(transparent)]
    ImexOrFamily(#[from] ImexFamilyError),
    #[error(transparent)]
    MemoryLimit(#[from] MemoryLimitError),
    #[error(
        "CUDA_VERSION={value}: not a version, so the legacy requirement cuda>=MAJOR.MINOR cannot be formed (fix CUDA_VERSION, set NVIDIA_REQUIRE_CUDA, or set NVIDIA_DISABLE_REQUIRE=true)"
    )]
    LegacyCudaVersion { value: Shown },
}

impl Request {
    /// The request in `spec`, or `None` when the container is not a GPU container and must be
    /// left untouched.
    pub fn from_spec(spec: &Spec, config: &Config) -> Result<Option<Request>, RequestError> {
        Ok(match Self::decide(spec, config)? {
            Decision::Gpu(request) => Some(*request),
            Decision::NotRequested => None,
            Decision::EnvIgnored => {
                // The container asked and gets nothing: say why, where the operator looks.
                tracing::warn!(
                    value = spec
                        .env(VISIBLE_DEVICES)
                        .map(|v| tracing::field::display(Shown(v))),
                    "NVIDIA_VISIBLE_DEVICES ignored: the container is unprivileged and accept-env-when-unprivileged = false (GPUs come from the device plugin's volume mounts)"
                );
                None
            }
        })
    }

    /// Like [`Request::from_spec`], and says why a container is not a GPU container.
    pub fn decide(spec: &Spec, config: &Config) -> Result<Decision, RequestError> {
        let legacy = is_legacy_image(spec);
        let privileged = spec.privileged();
        let (devices, source) = match select_devices(spec, config, privileged, legacy)? {
            Selected::Devices(devices, source) => (devices, source),
            Selected::NotRequested => return Ok(Decision::NotRequested),
            Selected::EnvIgnored => return Ok(Decision::EnvIgnored),
        };
        // The environment counts for IMEX channels and device families where it counts for
        // GPUs: a pod limited to its device plugin's mounts cannot add devices by variable.
        let env_trusted = privileged || config.accept_env_when_unprivileged;
        // Fields are checked in the toolkit's order, so the first error reported matches it.
        Ok(Decision::Gpu(Box::new(Request {
            devices,
            mig_config: mig_devices(spec, MIG_CONFIG_DEVICES, privileged)?,
            mig_monitor: mig_devices(spec, MIG_MONITOR_DEVICES, privileged)?,
            capabilities: capabilities(spec, config, legacy)?,
            requirements: requirements(spec, config, legacy)?,
            imex_channels: imex_and_families::imex_channels(
                spec,
                config,
                env_trusted,
                &devices::mount_ids(spec),
            )?,
            families: imex_and_families::families(spec, config, env_trusted)?,
            memory_limits: allowed_limits(
                memory_limits::memory_limits(spec, config)?,
                config,
                source,
            ),
            privileged,
            source,
            cuda_version: spec
                .env(CUDA_VERSION)
                .filter(|v| !v.is_empty())
                .map(str::to_string),
        })))
    }
}

impl Request {
    /// The request nvidia-container-cli's `configure` flags make. Capabilities the node does
    /// not serve are left out rather than refused: containerd and nerdctl ask for every one
    /// whatever the image needs, and libnvidia-container gives what the driver has.
    pub fn from_flags(flags: &Flags, config: &Config) -> Result<Request, RequestError> {
        let list = |flag: &'static str, value: Option<&str>| {
            let Some(items) = value.and_then(|v| devices::requested_items(v.split(','))) else {
                return Ok(None);
            };
            devices::selection(&items)
                .map(Some)
                .map_err(|source| RequestError::UnknownDevice {
                    origin: env_origin(flag, value.unwrap_or_default()),
                    source,
                })
        };
        let devices =
            list("--device", flags.devices.as_deref())?.unwrap_or(DeviceSelection::NoDevices);
        let (capabilities, unserved): (BTreeSet<Capability>, BTreeSet<Capability>) = flags
            .capabilities
            .iter()
            .copied()
            .partition(|c| config.supported_capabilities.contains(c));
        if !unserved.is_empty() {
            tracing::info!(
                ?unserved,
                "capabilities this node does not serve are left out (supported-capabilities)"
            );
        }
        let mut requirements = Requirements::default();
        if !config.disable_require {
            for expression in &flags.requirements {
                requirements
                    .add("--require", expression)
                    .map_err(|source| RequestError::Requirement {
                        variable: "--require".into(),
                        source,
                    })?;
            }
        }
        Ok(Request {
            devices,
            capabilities,
            requirements,
            mig_config: list("--mig-config", flags.mig_config.as_deref())?,
            mig_monitor: list("--mig-monitor", flags.mig_monitor.as_deref())?,
            // A command line says nothing of the container's capabilities; only the
            // environment's MIG variables above depend on them.
            privileged: false,
            source: SelectionSource::CliFlag,
            cuda_version: None,
            imex_channels: flags
                .imex_channels
                .as_deref()
                .map(|v| imex_and_families::parse_channels(v, &env_origin("--imex-channel", v)))
                .transpose()?
                .flatten(),
            // No image environment: the node's defaults.
            families: imex_and_families::families(&Spec::default(), config, false)?,
            memory_limits: memory_limits::memory_limits(&Spec::default(), config)?,
        })
    }
}

/// `limits`, unless the node takes limits only from containers whose GPUs were allocated and
/// this one picked its own with `NVIDIA_VISIBLE_DEVICES`.
fn allowed_limits(
    limits: Option<MemoryLimits>,
    config: &Config,
    source: SelectionSource,
) -> Option<MemoryLimits> {
    if config.gpu_memory_limits_from == GpuMemoryLimitsFrom::Allocated
        && source == SelectionSource::Env
    {
        if let Some(limits) = limits {
            tracing::warn!(
                ?limits,
                "GPU memory limits ignored: the container chose its GPUs with NVIDIA_VISIBLE_DEVICES and gpu-memory-limits-from = \"allocated\""
            );
        }
        return None;
    }
    limits
}

/// A legacy CUDA image (before `NVIDIA_REQUIRE_CUDA` existed) says only `CUDA_VERSION`.
fn is_legacy_image(spec: &Spec) -> bool {
    spec.env(CUDA_VERSION).is_some_and(|v| !v.is_empty())
        && spec.env(REQUIRE_CUDA).is_none_or(str::is_empty)
}

enum Selected {
    Devices(DeviceSelection, SelectionSource),
    NotRequested,
    EnvIgnored,
}

/// The toolkit's precedence: accepted volume mounts, when there are any, are the whole
/// selection; otherwise the environment, honoured for a privileged container or when the
/// config accepts it from unprivileged ones. The privilege check comes before device ids are
/// parsed, so an ignored variable never fails a container.
fn select_devices(
    spec: &Spec,
    config: &Config,
    privileged: bool,
    legacy: bool,
) -> Result<Selected, RequestError> {
    if config.accept_volume_mount_devices {
        let ids = devices::mount_device_ids(spec);
        if !ids.is_empty() {
            return select_from_mounts(&ids);
        }
    }
    let value = match spec.env(VISIBLE_DEVICES) {
        Some(value) => value,
        None if legacy => "all",
        None => return Ok(Selected::NotRequested),
    };
    let Some(items) = devices::requested_items(value.split(',')) else {
        return Ok(Selected::NotRequested);
    };
    if !(privileged || config.accept_env_when_unprivileged) {
        return Ok(Selected::EnvIgnored);
    }
    let devices = devices::selection(&items).map_err(|source| RequestError::UnknownDevice {
        origin: env_origin(VISIBLE_DEVICES, value),
        source,
    })?;
    Ok(Selected::Devices(devices, SelectionSource::Env))
}

fn select_from_mounts(ids: &[String]) -> Result<Selected, RequestError> {
    let Some(items) = devices::requested_items(ids.iter().map(String::as_str)) else {
        return Ok(Selected::NotRequested);
    };
    let devices = devices::selection(&items).map_err(|source| RequestError::UnknownDevice {
        origin: format!("volume mount {DEVICE_MOUNT_ROOT}/{}", source.0),
        source,
    })?;
    Ok(Selected::Devices(devices, SelectionSource::VolumeMounts))
}

/// MIG management nodes give control over the whole GPU's partitioning, hence privileged
/// only. As in the toolkit, a non-empty value in an unprivileged container is an error.
fn mig_devices(
    spec: &Spec,
    variable: &'static str,
    privileged: bool,
) -> Result<Option<DeviceSelection>, RequestError> {
    let Some(value) = spec.env(variable).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    if !privileged {
        return Err(RequestError::MigUnprivileged {
            variable,
            value: value.into(),
        });
    }
    let Some(items) = devices::requested_items(value.split(',')) else {
        return Ok(None);
    };
    devices::selection(&items)
        .map(Some)
        .map_err(|source| RequestError::UnknownDevice {
            origin: env_origin(variable, value),
            source,
        })
}

/// Unset or empty: utility and compute (those of them the node serves), or everything the
/// node serves for a legacy image. `all` anywhere in the list: everything the node serves.
fn capabilities(
    spec: &Spec,
    config: &Config,
    legacy: bool,
) -> Result<BTreeSet<Capability>, RequestError> {
    let supported: BTreeSet<Capability> = config.supported_capabilities.iter().copied().collect();
    let value = match spec.env(DRIVER_CAPABILITIES) {
        Some(value) => value,
        None if legacy => return Ok(supported),
        None => "",
    };
    let items = list_items(value.split(','));
    if items.is_empty() {
        return Ok(DEFAULT_CAPABILITIES
            .into_iter()
            .filter(|c| supported.contains(c))
            .collect());
    }
    if items.contains(&"all") {
        return Ok(supported);
    }
    items
        .into_iter()
        .map(|name| {
            let capability =
                name.parse::<Capability>()
                    .map_err(|source| RequestError::UnknownCapability {
                        value: value.into(),
                        source,
                    })?;
            if !supported.contains(&capability) {
                return Err(RequestError::UnsupportedCapability {
                    value: value.into(),
                    capability,
                    supported: list(&supported),
                });
            }
            Ok(capability)
        })
        .collect()
}

fn requirements(spec: &Spec, config: &Config, legacy: bool) -> Result<Requirements, RequestError> {
    let mut out = Requirements::default();
    if config.disable_require || spec.env(DISABLE_REQUIRE).is_some_and(go_true) {
        return Ok(out);
    }
    for (variable, value) in spec.env_with_prefix(REQUIRE_PREFIX) {
        if variable.starts_with(REQUIRE_JETPACK) {
            continue;
        }
        out.add(&variable, &value)
            .map_err(|source| RequestError::Requirement {
                variable: variable.into(),
                source,
            })?;
    }
    if legacy {
        let value = spec.env(CUDA_VERSION).unwrap_or_default();
        let major_minor = crate::version::cuda_major_minor(value).ok_or_else(|| {
            RequestError::LegacyCudaVersion {
                value: value.into(),
            }
        })?;
        let expression = format!("cuda>={major_minor}");
        out.add(CUDA_VERSION, &expression)
            .map_err(|source| RequestError::Requirement {
                variable: CUDA_VERSION.into(),
                source,
            })?;
    }
    Ok(out)
}

/// The values Go's `strconv.ParseBool` reads as true; anything else (even `yes`) is false
/// for the toolkit, and so requirements stay on, the safe side.
fn go_true(value: &str) -> bool {
    matches!(value, "1" | "t" | "T" | "true" | "TRUE" | "True")
}

/// The one reading of every NVIDIA_* list (devices, driver capabilities, MIG devices, IMEX
/// channels, the device plugin's mounts), nvidia-container-toolkit's, so that a value an image
/// runs with there runs here: spaces around an item are trimmed, empty items skipped, and a
/// repeated item counts once, where it first appears (`" 1,,0,1"` is `1,0`).
pub(crate) fn list_items<'a>(items: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for item in items.into_iter().map(str::trim) {
        if !item.is_empty() && !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

fn env_origin(variable: &str, value: &str) -> String {
    format!("{variable}={}", Shown(value))
}

fn list(capabilities: &BTreeSet<Capability>) -> String {
    if capabilities.is_empty() {
        return "none".to_string();
    }
    capabilities
        .iter()
        .map(|c| c.name())
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests;
