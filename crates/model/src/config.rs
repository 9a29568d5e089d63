//! `/etc/nvhook/config.toml`: where the host's driver, device nodes and proc live, and policy.

use crate::capability::Capability;
use crate::imex_and_families::Family;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const DEFAULT_PATH: &str = nvhook_runtime::DEFAULT_CONFIG;
/// On tmpfs, so that a reboot forgets it.
pub const DEFAULT_NVML_CACHE_FILE: &str = "/run/nvhook/nvml-inventory.json";
/// In the bpffs systemd mounts, so that a reboot forgets it.
pub const DEFAULT_DEVICE_PROGRAM_PINS: &str = "/sys/fs/bpf/nvhook";
/// Environment variable that names the config file when `--config` is not given.
pub const ENV_VAR: &str = nvhook_runtime::CONFIG_ENV;
/// The `timeout` of the hook entries nvhook writes, in seconds; `nvml-timeout-ms` stays below it.
pub const HOOK_TIMEOUT_S: u32 = 30;
/// The longest `nvml-timeout-ms`: the hook entry's timeout less what the rest of the hook needs.
pub const NVML_TIMEOUT_MAX: Duration = Duration::from_secs(HOOK_TIMEOUT_S as u64 - 5);

/// The longest `runtime-server` socket path, in bytes.
pub const RUNTIME_SERVER_MAX: usize = 96;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct Config {
    /// Root of the host's driver files (libraries, binaries, firmware, ld.so.cache).
    pub driver_root: PathBuf,
    /// Root under which the host's `/dev/nvidia*` nodes live.
    pub dev_root: PathBuf,
    /// The host's procfs (for `devices` and `driver/nvidia`).
    pub proc_root: PathBuf,
    /// The host's sysfs (the kernel's firmware search path, the GPUs' DRM nodes).
    pub sys_root: PathBuf,
    /// NVML library to load; by default `libnvidia-ml.so.1` looked up in the driver root's cache.
    pub nvml_library: Option<PathBuf>,
    /// Capabilities this node serves; a request for another one is an error.
    pub supported_capabilities: Vec<Capability>,
    /// Whether an unprivileged container may select GPUs with NVIDIA_VISIBLE_DEVICES.
    pub accept_env_when_unprivileged: bool,
    /// Whether `/var/run/nvidia-container-devices/<id>` mounts select GPUs.
    pub accept_volume_mount_devices: bool,
    /// Skip every NVIDIA_REQUIRE_* check.
    pub disable_require: bool,
    /// How long NVML may take to answer before the hook gives up, in milliseconds; kept below
    /// the hook entry's own timeout so the user reads nvhook's message, not the runtime's kill.
    pub nvml_timeout_ms: u64,
    /// Where NVML's answer is kept between starts, with the host state it was read in;
    /// empty: every start queries NVML.
    pub nvml_cache_file: PathBuf,
    /// The bpffs directory where the hook keeps cgroup v2 device programs loaded for the
    /// containers after one; empty: every container loads its own.
    pub device_program_pins: PathBuf,
    /// File the hook appends its log to; none means log to stderr only on failure.
    pub log_file: Option<PathBuf>,
    pub log_level: LogLevel,
    /// Low-level runtimes nvhook-runtime execs, first found wins.
    pub runtimes: Vec<String>,
    /// Absolute path of the nvhook binary written into hook entries; by default the nvhook
    /// that writes them, which is the one beside nvhook-runtime.
    pub hook_path: Option<PathBuf>,
    /// The socket of `nvhook runtime-server`, which prepares GPU creates for nvhook-runtime
    /// when it listens there; empty: nvhook-runtime never asks one.
    pub runtime_server: PathBuf,
    /// How nvhook-runtime gives a container its GPUs.
    pub runtime_mode: RuntimeMode,
    /// Who makes the driver files' bind mounts of the CDI-style edits nvhook writes (its
    /// specs, DRA claims' specs, nvhook-runtime's and the NRI plugin's cdi modes).
    pub cdi_mounts: CdiMounts,
    /// The device families a GPU container gets when its variable (NVIDIA_NVSWITCH,
    /// NVIDIA_GDS, NVIDIA_MOFED, NVIDIA_GDRCOPY) is unset or empty; those the host has.
    pub device_families: Vec<Family>,
    /// Whether an image's CUDA forward-compatibility libraries load when they are newer
    /// than the host driver.
    pub cuda_compat: CudaCompatMode,
    /// Kubernetes namespaces whose pods may ask for GPUs with NVIDIA's pod annotation
    /// (`nvidia.cdi.k8s.io/container.<name>`) through `nvhook nri`. Any pod can annotate
    /// itself, so none by default: GPUs come from what the kubelet allocated.
    pub nri_annotation_namespaces: Vec<String>,
    /// What `nvhook nri` hands the engine for a GPU container.
    pub nri_mode: NriMode,
    /// When a GPU container's `/proc/driver/nvidia` is replaced by the view of its own GPUs.
    pub proc_driver_view: ProcDriverView,
    /// What a container's GPU memory limits (`NVIDIA_GPU_MEMORY_REQUEST`/`_LIMIT`) get.
    pub gpu_memory_limits: GpuMemoryLimits,
    /// Which containers' GPU memory limits count.
    pub gpu_memory_limits_from: GpuMemoryLimitsFrom,
    /// The GPU memory request and limit (MiB per GPU) of a GPU container that sets none; both
    /// or neither.
    pub default_gpu_memory_request_mib: Option<u64>,
    pub default_gpu_memory_limit_mib: Option<u64>,
}

/// `enforce`: a container's limits are set by the driver, or the container is refused where
/// this node cannot set them (a driver without the call, a MIG device, cgroup v1): it asked.
/// `best-effort`: set where the node can, logged and left otherwise. `off`: never set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GpuMemoryLimits {
    Enforce,
    BestEffort,
    Off,
}

/// `any`: every GPU container's limits count. `allocated`: only those of a container whose GPUs
/// an orchestrator allocated (the device plugin's mounts, a CDI device or claim, an engine's
/// `--gpus`), not those of one that picked its GPUs with `NVIDIA_VISIBLE_DEVICES`: a request
/// reserves memory other tenants of the GPU then lack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuMemoryLimitsFrom {
    Any,
    Allocated,
}

/// `auto`: the view, except in a container whose `/proc` is unmasked (its spec masks nothing
/// under `/proc`), which nested sandboxes need and the view's mount would lock (see
/// [`crate::proc_view`]). `always`: every GPU container. `never`: no container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProcDriverView {
    Auto,
    Always,
    Never,
}

/// `hook` and `cdi`: as `runtime-mode`. `mounts`: no hook at all, every file a bind mount for
/// the runtime, libraries under their SONAMEs in the loaders' default directories.
/// `cdi-devices`: the GPUs by their names in the CDI spec `nvhook cdi refresh` keeps, for the
/// engine to inject from the spec itself; the adjustment adds no OCI hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NriMode {
    Hook,
    Cdi,
    Mounts,
    CdiDevices,
}

/// `auto`: the image's `/usr/local/cuda/compat` libraries load when their driver version is
/// newer than the host's (see `plan::compat`). `off`: the host's libraries always.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CudaCompatMode {
    Auto,
    Off,
}

/// `hook`: nvhook-runtime puts the device nodes into config.json and adds the prestart hook, which
/// does the rest. `cdi`: nvhook-runtime writes all of the plan as CDI-style edits (nodes, cgroup
/// rules, bind mounts) for the runtime to apply, plus a createContainer hook for the links
/// and the loader cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeMode {
    Hook,
    Cdi,
}

/// `runtime`: the edits list each driver file's bind mount for the engine's runtime to make,
/// as NVIDIA's specs do. `hook`: they keep the device nodes and nvhook's createContainer hook,
/// which makes those mounts itself in the container's mount namespace (a detached read-only
/// tree each, attached onto its target): runc makes each bind mount with several calls and
/// path walks of its own, the larger part of a CDI start's cost (docs/performance.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CdiMounts {
    Runtime,
    Hook,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            driver_root: PathBuf::from("/"),
            dev_root: PathBuf::from("/"),
            proc_root: PathBuf::from("/proc"),
            sys_root: PathBuf::from("/sys"),
            nvml_library: None,
            supported_capabilities: Capability::ALL.to_vec(),
            accept_env_when_unprivileged: true,
            accept_volume_mount_devices: true,
            disable_require: false,
            nvml_timeout_ms: 10_000,
            nvml_cache_file: PathBuf::from(DEFAULT_NVML_CACHE_FILE),
            device_program_pins: PathBuf::from(DEFAULT_DEVICE_PROGRAM_PINS),
            log_file: None,
            log_level: LogLevel::Info,
            runtimes: nvhook_runtime::DEFAULT_RUNTIMES.map(String::from).to_vec(),
            hook_path: None,
            runtime_server: PathBuf::from(nvhook_runtime::server::DEFAULT_SOCKET),
            runtime_mode: RuntimeMode::Hook,
            cdi_mounts: CdiMounts::Hook,
            cuda_compat: CudaCompatMode::Auto,
            device_families: Vec::new(),
            nri_annotation_namespaces: Vec::new(),
            nri_mode: NriMode::Hook,
            proc_driver_view: ProcDriverView::Auto,
            gpu_memory_limits: GpuMemoryLimits::Enforce,
            gpu_memory_limits_from: GpuMemoryLimitsFrom::Any,
            default_gpu_memory_request_mib: None,
            default_gpu_memory_limit_mib: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source} (pass --config FILE or set NVHOOK_CONFIG)")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("bad config {path}: {message}")]
    Parse { path: PathBuf, message: String },
}

impl Config {
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let parse_error = |message: String| ConfigError::Parse {
            path: path.to_path_buf(),
            message,
        };
        let config: Config =
            toml::from_str(text).map_err(|e| parse_error(describe(e.message(), e.span(), text)))?;
        config.validate().map_err(parse_error)?;
        Ok(config)
    }

    /// The checks a config passes beyond its types: the message of the first it fails.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(hook) = self.hook_path.as_ref().filter(|p| !p.is_absolute()) {
            return Err(format!("hook-path {hook:?} must be an absolute path"));
        }
        let max_ms = NVML_TIMEOUT_MAX.as_millis();
        if self.nvml_timeout_ms == 0 || u128::from(self.nvml_timeout_ms) > max_ms {
            return Err(format!(
                "nvml-timeout-ms = {} must be between 1 and {max_ms}: the hook entry's timeout is {} s and the hook needs time after NVML",
                self.nvml_timeout_ms, HOOK_TIMEOUT_S
            ));
        }
        if self.runtimes.is_empty() {
            return Err("runtimes must name at least one runtime (e.g. [\"runc\"])".into());
        }
        if self.nvml_cache().is_some_and(|p| !p.is_absolute()) {
            return Err(format!(
                "nvml-cache-file {:?} must be an absolute path, or \"\" for no cache",
                self.nvml_cache_file
            ));
        }
        if let Some(socket) = self.runtime_server() {
            // sockaddr_un's path holds 108 bytes with its NUL, and the server makes its socket
            // under a name with its pid added first.
            if !socket.is_absolute() || socket.as_os_str().len() > RUNTIME_SERVER_MAX {
                return Err(format!(
                    "runtime-server {socket:?} must be an absolute path of at most {RUNTIME_SERVER_MAX} bytes, or \"\" for no server"
                ));
            }
        }
        if self.device_program_pins().is_some_and(|p| !p.is_absolute()) {
            return Err(format!(
                "device-program-pins {:?} must be an absolute path, or \"\" to keep none",
                self.device_program_pins
            ));
        }
        for (key, p) in [
            ("driver-root", &self.driver_root),
            ("dev-root", &self.dev_root),
            ("proc-root", &self.proc_root),
        ] {
            if !p.is_absolute() {
                return Err(format!("{key} {p:?} must be an absolute path"));
            }
        }
        match (
            self.default_gpu_memory_request_mib,
            self.default_gpu_memory_limit_mib,
        ) {
            (Some(_), None) | (None, Some(_)) => {
                return Err("default-gpu-memory-request-mib and default-gpu-memory-limit-mib: set both or neither".into());
            }
            _ => {}
        }
        if let Some(limits) = self.default_gpu_memory_limits() {
            crate::request::memory_limits::check(limits).map_err(|e| {
                format!("default-gpu-memory-request-mib and default-gpu-memory-limit-mib: {e}")
            })?;
        }
        Ok(())
    }

    /// The GPU memory limits of a container that sets none.
    pub fn default_gpu_memory_limits(&self) -> Option<crate::request::memory_limits::MemoryLimits> {
        Some(crate::request::memory_limits::MemoryLimits {
            request_mib: self.default_gpu_memory_request_mib?,
            limit_mib: self.default_gpu_memory_limit_mib?,
        })
    }

    /// What a GPU container that does not set `family`'s variable gets.
    pub fn family_default(&self, family: Family) -> bool {
        self.device_families.contains(&family)
    }

    /// The NVML cache file, unless `nvml-cache-file = ""` turned the cache off.
    pub fn nvml_cache(&self) -> Option<&Path> {
        Some(self.nvml_cache_file.as_path()).filter(|p| !p.as_os_str().is_empty())
    }

    /// `nvhook runtime-server`'s socket, unless `runtime-server = ""` turned it off.
    pub fn runtime_server(&self) -> Option<&Path> {
        Some(self.runtime_server.as_path()).filter(|p| !p.as_os_str().is_empty())
    }

    /// The device programs' bpffs directory, unless `device-program-pins = ""` turned it off.
    pub fn device_program_pins(&self) -> Option<&Path> {
        Some(self.device_program_pins.as_path()).filter(|p| !p.as_os_str().is_empty())
    }

    pub fn nvml_timeout(&self) -> Duration {
        Duration::from_millis(self.nvml_timeout_ms)
    }

    /// `<driver-root>/<path>` for an absolute host path.
    pub fn driver_path(&self, path: &str) -> PathBuf {
        self.driver_root.join(path.trim_start_matches('/'))
    }

    pub fn dev_path(&self, path: &str) -> PathBuf {
        self.dev_root.join(path.trim_start_matches('/'))
    }

    pub fn proc_path(&self, path: &str) -> PathBuf {
        self.proc_root.join(path.trim_start_matches('/'))
    }

    pub fn sys_path(&self, path: &str) -> PathBuf {
        self.sys_root.join(path.trim_start_matches('/'))
    }
}

/// One line for a toml error: the key whose value is wrong and what it should be
/// (`driver-root: expected a path, found integer 42 (line 1)`), else toml's message with its
/// line. A quoted key may hold control characters, which toml repeats raw: they are escaped.
fn describe(message: &str, span: Option<std::ops::Range<usize>>, text: &str) -> String {
    let Some(at) = span.as_ref().map(|s| s.start.min(text.len())) else {
        return escape_controls(message);
    };
    let line = text[..at].matches('\n').count() + 1;
    // toml says only "duplicate key"; its span is the second one's name.
    if message.trim() == "duplicate key"
        && let Some(name) = span.and_then(|s| text.get(s)).map(str::trim)
    {
        return escape_controls(&format!(
            "line {line}: duplicate key `{name}` (set each key once)"
        ));
    }
    // An unknown key's message names the key already.
    let key = key_at(text, at).filter(|_| !message.starts_with("unknown field"));
    escape_controls(&match key {
        Some(key) => format!("{key}: {} (line {line})", plain_words(message)),
        None => format!("line {line}: {}", unknown_key(message)),
    })
}

/// serde lists every key after an unknown one, which outgrows one line as the config grows:
/// name the nearest key instead, or where every key is documented.
fn unknown_key(message: &str) -> String {
    let Some((unknown, expected)) = message.split_once(", expected one of ") else {
        return message.to_string();
    };
    let given = unknown
        .trim_start_matches("unknown field ")
        .trim_matches('`');
    let nearest = expected
        .split(", ")
        .map(|k| k.trim_matches('`'))
        .map(|k| (edit_distance(given, k), k))
        .min()
        .filter(|(d, _)| *d <= 3);
    match nearest {
        Some((_, key)) => format!("{unknown}; did you mean `{key}`?"),
        None => format!("{unknown} (every key is documented in the config.toml nvhook ships)"),
    }
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (diagonal + usize::from(ca != *cb))
                .min(above + 1)
                .min(row[j] + 1);
            diagonal = above;
        }
    }
    row[b.len()]
}

fn escape_controls(text: &str) -> String {
    text.chars()
        .map(|c| match c.is_control() {
            true => c.escape_default().to_string(),
            false => c.to_string(),
        })
        .collect()
}

/// The top-level key whose line holds byte `at` (nvhook's config is flat).
fn key_at(text: &str, at: usize) -> Option<String> {
    let doc = toml_edit::Document::parse(text).ok()?;
    let table = doc.as_table();
    table.iter().find_map(|(name, item)| {
        let (key, _) = table.get_key_value(name)?;
        let start = key.span()?.start;
        let end = item.span()?.end;
        (start..end.max(start + 1))
            .contains(&at)
            .then(|| name.to_string())
    })
}

/// serde's `invalid type: integer `42`, expected path string` said the other way round, in
/// the config's words: `expected a path, found integer 42`.
fn plain_words(message: &str) -> String {
    let Some((found, expected)) = message
        .strip_prefix("invalid type: ")
        .and_then(|rest| rest.split_once(", expected "))
    else {
        return message.to_string();
    };
    let expected = match expected {
        "path string" => "a path",
        "u64" | "u32" => "a whole number",
        "a sequence" => "an array",
        other => other,
    };
    format!("expected {expected}, found {}", found.replace('`', ""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("/etc/nvhook/config.toml"))
    }

    #[test]
    fn empty_file_gives_defaults() {
        assert_eq!(parse("").unwrap(), Config::default());
    }

    #[test]
    fn keys_are_read() {
        let c = parse(
            r#"
driver-root = "/run/driver"
dev-root = "/d"
proc-root = "/p"
nvml-library = "/x/libnvidia-ml.so.1"
supported-capabilities = ["compute", "utility"]
accept-env-when-unprivileged = false
accept-volume-mount-devices = false
disable-require = true
nvml-timeout-ms = 250
log-file = "/var/log/nvhook.log"
log-level = "debug"
runtimes = ["crun"]
hook-path = "/opt/nvhook"
runtime-mode = "cdi"
cuda-compat = "off"
device-families = ["mofed", "gds"]
"#,
        )
        .unwrap();
        assert_eq!(c.driver_root, Path::new("/run/driver"));
        assert_eq!(
            c.supported_capabilities,
            vec![Capability::Compute, Capability::Utility]
        );
        assert!(!c.accept_env_when_unprivileged);
        assert_eq!(c.nvml_timeout(), Duration::from_millis(250));
        assert_eq!(c.log_level, LogLevel::Debug);
        assert_eq!(c.runtimes, vec!["crun".to_string()]);
        assert_eq!(c.runtime_mode, RuntimeMode::Cdi);
        assert_eq!(c.cuda_compat, CudaCompatMode::Off);
        assert_eq!(Config::default().cuda_compat, CudaCompatMode::Auto);
        assert!(c.family_default(Family::Mofed) && !c.family_default(Family::NvSwitch));
    }

    #[test]
    fn a_wrong_cuda_compat_value_names_the_key() {
        let e = parse("cuda-compat = \"on\"\n").unwrap_err().to_string();
        assert!(e.contains("cuda-compat"), "{e}");
        assert!(e.contains("auto") && e.contains("off"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }

    #[test]
    fn an_unknown_device_family_is_named() {
        let e = parse("device-families = [\"infiniband\"]")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown variant `infiniband`") && e.contains("mofed"),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
    }

    #[test]
    fn unknown_key_names_key_and_file() {
        let e = parse("driver-root = \"/\"\nbogus = 1\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("bogus"), "{e}");
        assert!(e.contains("/etc/nvhook/config.toml"), "{e}");
        assert!(e.contains("line 2"), "{e}");
        assert!(e.contains("every key is documented"), "{e}");
        assert!(!e.contains('\n'), "{e}");
        let typo = parse("sys-rot = \"/sys\"").unwrap_err().to_string();
        assert!(
            typo.ends_with("line 1: unknown field `sys-rot`; did you mean `sys-root`?"),
            "{typo}"
        );
    }

    #[test]
    fn control_characters_in_a_key_stay_on_one_line() {
        let e = parse("\"a\\nb\\u001b\" = 1").unwrap_err().to_string();
        assert!(e.contains("unknown field `a\\nb\\u{1b}`"), "{e}");
        assert!(!e.chars().any(char::is_control), "{e:?}");
    }

    #[test]
    fn wrong_type_names_key() {
        let e = parse("driver-root = 42").unwrap_err().to_string();
        assert!(
            e.ends_with("driver-root: expected a path, found integer 42 (line 1)"),
            "{e}"
        );
        let e = parse("log-level = \"info\"\ndisable-require = \"yes\"")
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with("disable-require: expected a boolean, found string \"yes\" (line 2)"),
            "{e}"
        );
        let e = parse("runtimes = \"runc\"").unwrap_err().to_string();
        assert!(e.contains("runtimes: expected an array"), "{e}");
        let e = parse("nvml-timeout-ms = -1").unwrap_err().to_string();
        assert!(e.contains("nvml-timeout-ms: "), "{e}");
        let e = parse("supported-capabilities = [\"teleport\"]")
            .unwrap_err()
            .to_string();
        assert!(e.contains("teleport"), "{e}");
    }

    #[test]
    fn relative_hook_path_rejected() {
        let e = parse("hook-path = \"nvhook\"").unwrap_err().to_string();
        assert!(e.contains("hook-path"), "{e}");
    }

    #[test]
    fn runtime_server_is_a_socket_path_or_off() {
        assert_eq!(
            parse("").unwrap().runtime_server(),
            Some(Path::new("/run/nvhook/runtime.sock"))
        );
        assert_eq!(
            parse("runtime-server = \"\"").unwrap().runtime_server(),
            None
        );
        for bad in ["rt.sock".to_string(), format!("/{}", "s".repeat(96))] {
            let e = parse(&format!("runtime-server = {bad:?}"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("runtime-server") && !e.contains('\n'), "{e}");
        }
        let longest = format!("/{}", "s".repeat(95));
        assert!(parse(&format!("runtime-server = {longest:?}")).is_ok());
    }

    #[test]
    fn device_program_pins_is_an_absolute_path_or_off() {
        let default = parse("").unwrap();
        assert_eq!(
            default.device_program_pins(),
            Some(Path::new("/sys/fs/bpf/nvhook"))
        );
        assert_eq!(
            parse("device-program-pins = \"\"")
                .unwrap()
                .device_program_pins(),
            None
        );
        let e = parse("device-program-pins = \"bpf/nvhook\"")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("device-program-pins \"bpf/nvhook\" must be an absolute path"),
            "{e}"
        );
    }

    #[test]
    fn nvml_timeout_stays_below_the_hook_timeout() {
        for bad in [
            "nvml-timeout-ms = 0",
            "nvml-timeout-ms = 25001",
            "nvml-timeout-ms = 60000",
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains("nvml-timeout-ms"), "{e}");
            assert!(e.contains("between 1 and 25000"), "{e}");
        }
        assert!(parse("nvml-timeout-ms = 25000").is_ok());
        assert!(NVML_TIMEOUT_MAX < Duration::from_secs(HOOK_TIMEOUT_S.into()));
    }

    #[test]
    fn gpu_memory_limit_settings_parse_and_a_half_default_is_refused() {
        let c = parse(
            "gpu-memory-limits = \"best-effort\"\ngpu-memory-limits-from = \"allocated\"\ndefault-gpu-memory-request-mib = 1024\ndefault-gpu-memory-limit-mib = 4096\n",
        )
        .unwrap();
        assert_eq!(c.gpu_memory_limits, GpuMemoryLimits::BestEffort);
        assert_eq!(c.gpu_memory_limits_from, GpuMemoryLimitsFrom::Allocated);
        assert_eq!(
            c.default_gpu_memory_limits(),
            Some(crate::request::MemoryLimits {
                request_mib: 1024,
                limit_mib: 4096
            })
        );
        for (text, needle) in [
            ("default-gpu-memory-limit-mib = 4096", "set both or neither"),
            (
                "default-gpu-memory-request-mib = 5\ndefault-gpu-memory-limit-mib = 4",
                "is more than the limit",
            ),
            ("gpu-memory-limits = \"strict\"", "gpu-memory-limits"),
        ] {
            let line = parse(text).unwrap_err().to_string();
            assert!(line.contains(needle) && !line.contains('\n'), "{line}");
        }
    }
}
