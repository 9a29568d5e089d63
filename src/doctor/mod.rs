//! `nvhook doctor`: whether this node is ready to give containers GPUs, one line per check,
//! each problem with its fix.
//!
//! The facts are gathered here; what each means is decided in `checks`, from the facts
//! alone, so the judgements are unit-tested without a driver or root. Engine configs, hooks.d
//! and `/etc/cdi` are read under a root prefix (`--root`), the driver's files, device nodes and
//! `/proc` under the nvhook config's roots. The low-level runtimes are looked for as
//! nvhook-runtime looks for them, on doctor's own PATH, and asked their version; NVIDIA's
//! command names on that PATH too, and on each running dockerd's.

mod checks;
mod nri;
mod nvidia_names;
mod runtimes;

use crate::cdi::{self, NameStrategy};
use crate::config::Config;
use crate::configure::{self, Applied, Engine};
use crate::delivery::args_file;
use crate::delivery::hook_args::gpu_layout_of;
use crate::dev_char;
use crate::hook::memory_limits::OnThisNode;
use crate::inventory::cache::NvmlCache;
use crate::inventory::change::HostChange;
use crate::inventory::devices::scan_nodes;
use crate::inventory::driver::HostCache;
use crate::inventory::{Inventory, isolated, nvml_library};
use crate::runtime_create;
use checks::{
    CacheState, Cgroup, CurrentDevices, EngineConfig, HooksDir, PluginSocket, QueryError,
    RuntimeBinary, RuntimeSearch, SpecFile, SpecNode,
};
use serde::Serialize;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Ok,
    Warn,
    Fail,
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: String,
    pub level: Level,
    pub detail: String,
    /// What to do about it; None when all is well.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    fn ok(name: &str, detail: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            level: Level::Ok,
            detail: detail.into(),
            fix: None,
        }
    }

    fn warn(name: &str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            level: Level::Warn,
            fix: Some(fix.into()),
            ..Check::ok(name, detail)
        }
    }

    fn fail(name: &str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            level: Level::Fail,
            ..Check::warn(name, detail, fix)
        }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = match self.level {
            Level::Ok => "ok  ",
            Level::Warn => "warn",
            Level::Fail => "FAIL",
        };
        write!(f, "{level} {}: {}", self.name, self.detail)?;
        if let Some(fix) = &self.fix {
            write!(f, " -> fix: {fix}")?;
        }
        Ok(())
    }
}

/// Every check's line, in order.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub ready: bool,
    pub checks: Vec<Check>,
}

impl Report {
    fn new(checks: Vec<Check>) -> Report {
        Report {
            ready: checks.iter().all(|c| c.level != Level::Fail),
            checks,
        }
    }

    pub fn to_text(&self) -> String {
        let mut out: String = self.checks.iter().map(|c| format!("{c}\n")).collect();
        let problems = |level| self.checks.iter().filter(|c| c.level == level).count();
        out.push_str(&match self.ready {
            true => format!("ready (warn: {})\n", problems(Level::Warn)),
            false => format!(
                "NOT READY (FAIL: {}, warn: {})\n",
                problems(Level::Fail),
                problems(Level::Warn)
            ),
        });
        out
    }
}

/// What doctor was asked to look at.
pub struct Options {
    /// Engine configs, hooks.d and CDI spec directories are read under this (`/`).
    pub root: PathBuf,
    pub runtime_name: String,
    /// The nvhook-runtime the engines should run.
    pub runtime_path: String,
    /// The config file doctor was named (`--config`), which the commands it suggests name too.
    pub config_file: Option<PathBuf>,
    /// `--nri`: nvhook runs as an NRI plugin here, started where doctor cannot see it set up.
    pub nri: bool,
}

impl Options {
    /// `nvhook`, with the `--config` doctor was given: the start of every command it suggests.
    fn nvhook(&self) -> String {
        match &self.config_file {
            Some(file) => format!("nvhook --config {}", file.display()),
            None => "nvhook".to_string(),
        }
    }
}

/// Runs every check. Those that compare the host with NVML's answer are left out when NVML
/// does not answer; the NVML line says why.
pub fn run(config: &Config, options: &Options) -> Report {
    let mut out = Vec::new();
    let version_file = config.proc_path("driver/nvidia/version");
    let version = std::fs::read_to_string(&version_file).ok();
    // WSL2 has no NVIDIA kernel module, majors or /dev/nvidia* to check: its own checks come
    // with NVML's answer.
    let wsl = crate::inventory::wsl::find(config);
    if wsl.is_none() {
        out.push(checks::kernel_module(
            &version_file.display().to_string(),
            version.as_deref(),
        ));
    }
    let started = Instant::now();
    let answer =
        isolated::load_uncached(config, crate::inventory::Scope::ALL).map_err(|e| e.to_string());
    out.push(checks::nvml(
        &answer,
        started.elapsed(),
        config.nvml_timeout(),
    ));
    let nodes =
        crate::inventory::devices::read_majors(config).and_then(|m| Ok((m, scan_nodes(config)?)));
    // The kernel's architecture, not this build's: an nvhook of another one may run under qemu.
    let machine = crate::elf_machine::kernel_machine();
    let node_arch = nvhook_ldcache::Arch::from_name(&machine).unwrap_or_default();
    // Before the NVML answer: an nvhook-nvml of another architecture is why NVML failed.
    out.push(checks::binaries(&machine, &own_binaries(options)));
    out.extend(checks::runtime_path(
        &options.runtime_path,
        Path::new(&options.runtime_path).exists(),
        &crate::binary_paths::beside_nvhook(configure::RUNTIME_BINARY)
            .display()
            .to_string(),
    ));
    if let Ok(inventory) = &answer {
        out.extend(checks::persistence(inventory));
        out.push(checks::memory_limits(
            OnThisNode::of(
                config,
                inventory.memory_limits,
                nvhook_cgroup::host_is_unified(),
            ),
            config.gpu_memory_limits,
        ));
        match (&inventory.wsl, &nodes) {
            (Some(driver), _) => {
                let others = wsl.as_ref().map_or(&[][..], |w| &w.others);
                out.extend(checks::wsl(driver, others));
            }
            (None, Ok((majors, nodes))) => {
                out.extend(checks::device_nodes(inventory, majors, nodes))
            }
            (None, Err(e)) => out.push(Check::fail(
                "device nodes",
                e.to_string(),
                "load the nvidia modules (modprobe nvidia nvidia-uvm)",
            )),
        }
        out.push(checks::cache(
            &config.nvml_cache_file.display().to_string(),
            &cache_state(config, inventory),
            &options.nvhook(),
        ));
        let heads: Vec<_> = inventory
            .files
            .libraries
            .iter()
            .map(|l| (l.clone(), head(&l.host_path)))
            .collect();
        if inventory.wsl.is_none() {
            out.extend(checks::driver_files(inventory, node_arch, &heads));
            out.extend(checks::library_versions(
                version.as_deref().and_then(checks::module_version),
                inventory,
            ));
        }
        out.extend(cdi_checks(config, options, inventory));
    }
    if let Ok((_, nodes)) = &nodes {
        let dev = config.dev_path("/dev");
        let links: Vec<_> = dev_char::for_host_nodes(&dev, nodes)
            .into_iter()
            .map(|l| {
                let state = if dev_char::resolves(&dev, l.major, l.minor) {
                    checks::LinkState::Resolves
                } else if dev_char::not_a_link(&dev, &l) {
                    checks::LinkState::NotALink
                } else {
                    checks::LinkState::Fixable
                };
                (l, state)
            })
            .collect();
        out.push(checks::dev_char(
            &dev.join("char"),
            &links,
            &options.nvhook(),
        ));
    }
    let engines = engine_configs(options);
    // Docker has no NRI: its runtime is no double of the plugin's work.
    let runtime_configured = engines
        .iter()
        .any(|e| matches!(e.engine, "containerd" | "crio") && e.configured == Ok(true));
    let nri = nri::gather(&options.root, runtime_configured, options.nri);
    out.extend(checks::engines(
        &engines,
        &options.runtime_name,
        &options.runtime_path,
        nri.nri_mode(),
    ));
    out.extend(nri::checks(&nri, &options.runtime_name));
    out.extend(checks::hooks(&hooks_dirs(&options.root)));
    out.extend(checks::runtimes(&runtime_search(config)));
    // NVIDIA's names are judged against the nvhook they should lead to: this one.
    let nvhook = std::env::current_exe()
        .and_then(std::fs::canonicalize)
        .unwrap_or_default();
    out.extend(nvidia_names::checks(&nvidia_names::gather(nvhook)));
    let (socket, state) = dra_registration(&options.root);
    out.push(checks::dra_plugin(
        crate::dra::DRIVER_NAME,
        &socket.display().to_string(),
        &state,
    ));
    out.push(checks::cgroup(&cgroup(config)));
    out.push(checks::policy(config));
    Report::new(out)
}

/// The kubelet's plugin registry, where its plugin watcher finds kubelet plugins by their
/// registration sockets (nvhook-dra's default, and NVIDIA's).
pub const KUBELET_REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";

/// nvhook-dra's registration socket under `root`, and whether it accepts a connection. A plain
/// connect says a process is listening; what it speaks is the kubelet's to find out (doctor
/// has no gRPC client, and needs none for this).
fn dra_registration(root: &Path) -> (PathBuf, PluginSocket) {
    let socket = under(
        root,
        &format!(
            "{KUBELET_REGISTRY_DIR}/{}-reg.sock",
            crate::dra::DRIVER_NAME
        ),
    );
    let state = match std::fs::symlink_metadata(&socket) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => PluginSocket::Missing,
        _ => match std::os::unix::net::UnixStream::connect(&socket) {
            Ok(_) => PluginSocket::Accepts,
            Err(e) => PluginSocket::Refuses {
                denied: e.kind() == std::io::ErrorKind::PermissionDenied,
                error: e.to_string(),
            },
        },
    };
    (socket, state)
}

fn under(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}

fn cache_state(config: &Config, inventory: &Inventory) -> CacheState {
    let stored = HostCache::open(config)
        .ok()
        .and_then(|c| nvml_library(config, &c).ok())
        .and_then(|library| NvmlCache::open(config, &library));
    let Some(stored) = stored else {
        return CacheState::Off;
    };
    // Fresh: stored for this host state, and describing the GPUs NVML reports now.
    match (stored.read(), stored.previous()) {
        (Some(system), _) if HostChange::between(&system, &inventory.system()).is_none() => {
            CacheState::Fresh
        }
        (None, None) => match stored.unusable() {
            Some(why) => CacheState::Unusable(why),
            None => CacheState::Missing,
        },
        _ => CacheState::Stale,
    }
}

/// The first bytes of a file: enough for the ELF magic, class and machine.
fn head(path: &Path) -> checks::LibraryHead {
    crate::elf_machine::read_head(path).map_err(|e| e.to_string())
}

/// nvhook (this program), the nvhook-runtime the engines should run and the nvhook-nvml
/// beside nvhook, with their first bytes; those that are not there are left to the checks
/// that need them (NVML's, the engines').
fn own_binaries(options: &Options) -> Vec<(PathBuf, checks::LibraryHead)> {
    let mut paths = vec![
        crate::binary_paths::this_nvhook(),
        PathBuf::from(&options.runtime_path),
        crate::binary_paths::beside_nvhook(isolated::HELPER),
    ];
    paths.dedup();
    paths
        .into_iter()
        .filter(|path| path.is_absolute() && path.exists())
        .map(|path| {
            let head = head(&path);
            (path, head)
        })
        .collect()
}

/// Each engine config that exists, judged by `nvhook configure --dry-run`: nvhook's runtime
/// is there with the right path exactly when adding it would change nothing. Where it is not,
/// the same dry run as the fix would run it (the runtime must be there) says whether
/// configure takes that command.
fn engine_configs(options: &Options) -> Vec<EngineConfig> {
    let files = Engine::ALL.into_iter().flat_map(|engine| {
        engine
            .existing_configs(&options.root)
            .into_iter()
            .map(move |f| (engine, f))
    });
    files
        .map(|(engine, file)| {
            // The command the fix proposes, as a dry run.
            let proposed = configure::Options {
                engine,
                file: Some(file.clone()),
                runtime_name: options.runtime_name.clone(),
                runtime_path: options.runtime_path.clone(),
                allow_missing: false,
                set_as_default: false,
                remove: false,
                dry_run: true,
                kubernetes_policy: None,
                nri: false,
                engine_version: None,
            };
            let dry_run = configure::run(&configure::Options {
                // Whether the file names the runtime does not depend on the runtime's being
                // there: that is the nvhook-runtime line's to say.
                allow_missing: true,
                ..proposed.clone()
            });
            let (configured, refused) = match dry_run {
                Ok(outcome) => {
                    let configured = outcome
                        .files
                        .iter()
                        .all(|f| f.applied == Applied::Unchanged);
                    let refused = match configured {
                        true => None,
                        false => configure::run(&proposed).err().map(|e| instead_of(&e)),
                    };
                    (Ok(configured), refused)
                }
                // Doctor's own flags, not the file: configure refuses them for any file.
                Err(e) if e.is_usage() => (
                    Err(format!("not checked: {e}")),
                    Some(
                        "run nvhook doctor with a --runtime-path and --runtime-name that nvhook configure takes"
                            .to_string(),
                    ),
                ),
                Err(e) => (Err(e.to_string()), None),
            };
            EngineConfig {
                engine: engine.name(),
                configured,
                refused,
                file,
            }
        })
        .collect()
}

/// What an engine line says to do where `nvhook configure` refuses the command that would
/// set the file right: never that command.
fn instead_of(refusal: &configure::ConfigureError) -> String {
    match refusal {
        configure::ConfigureError::MissingRuntime(path) => format!(
            "install nvhook-runtime, or name the installed one with --runtime-path (configure refuses {path}, which is not there; see the nvhook-runtime line), then run nvhook doctor again for the configure command"
        ),
        other => format!("configure refuses that command now: {other}"),
    }
}

/// Podman's and CRI-O's hooks.d directories, for those installed under `root`.
fn hooks_dirs(root: &Path) -> Vec<HooksDir> {
    let dirs: Vec<PathBuf> = [
        "/usr/share/containers/oci/hooks.d",
        "/etc/containers/oci/hooks.d",
    ]
    .iter()
    .map(|d| under(root, d))
    .collect();
    [("podman", "/usr/bin/podman"), ("crio", "/usr/bin/crio")]
        .into_iter()
        .filter(|(_, binary)| under(root, binary).exists())
        .map(|(engine, _)| HooksDir {
            engine,
            found: dirs.iter().find_map(|d| nvhook_hook_in(d)),
            dirs: dirs.clone(),
        })
        .collect()
}

/// A hook file in `dir` whose hook runs a program named `nvhook`.
fn nvhook_hook_in(dir: &Path) -> Option<PathBuf> {
    std::fs::read_dir(dir).ok()?.flatten().find_map(|entry| {
        let path = entry.path();
        let text = std::fs::read_to_string(&path).ok()?;
        let json: serde_json::Value = serde_json::from_str(&text).ok()?;
        let program = Path::new(json["hook"]["path"].as_str()?);
        (program.file_name()? == "nvhook").then_some(path)
    })
}

/// Why the hooks of the spec `file` (found under `root`) could not use the file their
/// arguments are in, where they name one. nvhook writes that file beside the spec: it is read
/// there, and a spec that names one elsewhere (moved away from it) is a problem itself.
fn args_file_problem(root: &Path, file: &Path, edits: &cdi::ContainerEdits) -> Option<String> {
    edits.hooks.iter().find_map(|hook| {
        let mut args = hook.args.clone();
        let at = args.iter().position(|a| a == args_file::FLAG)?;
        let named = PathBuf::from(args.get(at + 1)?);
        let beside = file.with_file_name(named.file_name()?);
        if named != beside && under(root, &named.display().to_string()) != beside {
            return Some(format!(
                "it names {}, which is not beside the spec",
                named.display()
            ));
        }
        args[at + 1] = beside.display().to_string();
        args_file::inline(&args).err().map(|e| e.to_string())
    })
}

fn cdi_checks(config: &Config, options: &Options, inventory: &Inventory) -> Vec<Check> {
    let dirs: Vec<PathBuf> = cdi::SPEC_DIRS
        .iter()
        .map(|d| under(&options.root, d))
        .collect();
    let dirs: Vec<&Path> = dirs.iter().map(PathBuf::as_path).collect();
    let specs: Vec<SpecFile> = cdi::spec_files(&dirs)
        .into_iter()
        .filter_map(|file| {
            let (devices, gpu_layout, args_file) = match cdi::read_spec(&file) {
                Err(e) => (Err(e.to_string()), None, None),
                Ok(spec) if spec.kind != cdi::KIND => return None,
                Ok(spec) => (
                    Ok(spec
                        .devices
                        .iter()
                        .map(|d| (d.name.clone(), spec_nodes(&d.container_edits)))
                        .collect()),
                    gpu_layout_of(&spec.container_edits).map(str::to_owned),
                    args_file_problem(&options.root, &file, &spec.container_edits),
                ),
            };
            Some(SpecFile {
                file,
                devices,
                gpu_layout,
                args_file,
            })
        })
        .collect();
    if specs.is_empty() {
        return Vec::new();
    }
    let ids = cdi::generate::device_ids(inventory)
        .into_iter()
        .map(|(id, uuid)| (id.to_string(), uuid))
        .collect();
    let (nodes, gpu_layout) = match cdi::generate(
        config,
        None,
        inventory,
        &[NameStrategy::Index, NameStrategy::Uuid],
    ) {
        Ok(spec) => (
            spec.devices
                .iter()
                .map(|d| (d.name.clone(), spec_nodes(&d.container_edits)))
                .collect(),
            gpu_layout_of(&spec.container_edits).map(str::to_owned),
        ),
        Err(_) => (Vec::new(), None),
    };
    let now = CurrentDevices {
        ids,
        nodes,
        gpu_layout,
    };
    checks::cdi(&specs, &now, &options.nvhook())
}

/// A device's nodes, as the check compares them.
fn spec_nodes(edits: &cdi::ContainerEdits) -> Vec<SpecNode> {
    edits
        .device_nodes
        .iter()
        .map(|n| SpecNode {
            path: n.path.clone(),
            number: n.major.zip(n.minor),
        })
        .collect()
}

/// The config's `runtimes` and runc, crun and youki, each where nvhook-runtime would find
/// it, once per file, with what its `--version` says.
fn runtime_search(config: &Config) -> RuntimeSearch {
    let path_var = std::env::var_os("PATH");
    let dirs = runtime_create::search_dirs(path_var.as_deref());
    let execd = runtime_create::find_runtime(config, path_var.as_deref()).ok();
    let mut names = config.runtimes.clone();
    for name in runtimes::RUNTIMES {
        if !names.iter().any(|n| n == name) {
            names.push(name.to_string());
        }
    }
    let mut seen = Vec::new();
    let found = names
        .iter()
        .filter_map(|name| runtime_create::locate_runtime(name, &dirs))
        .filter(|path| {
            // One binary reached twice (the config's absolute path and the same file on PATH,
            // or a link to it) is one runtime.
            let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
            let new = !seen.contains(&real);
            seen.push(real);
            new
        })
        .map(|path| RuntimeBinary {
            execd: execd.as_ref() == Some(&path),
            version: version_of(&path),
            path,
        })
        .collect();
    RuntimeSearch { names, dirs, found }
}

/// What `NAME --version` says, for the program `name` found on this process's PATH; None
/// when there is none, or it does not answer.
pub fn program_version(name: &str) -> Option<String> {
    let path_var = std::env::var_os("PATH")?;
    let program = std::env::split_paths(&path_var)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())?;
    version_of(&program).ok()
}

/// Longer than any runtime takes to print its version; a hung one is given up on.
const VERSION_TIMEOUT: Duration = Duration::from_secs(5);

/// `path --version`'s output. Only doctor, an admin's diagnostic, runs the host's runtime:
/// the hook never does.
fn version_of(path: &Path) -> Result<String, QueryError> {
    let mut child = Command::new(path)
        .arg("--version")
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(QueryError::Spawn)?;
    let deadline = Instant::now() + VERSION_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(QueryError::Spawn)? {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(QueryError::Timeout(VERSION_TIMEOUT.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    if !status.success() {
        let stderr = drain(child.stderr.take());
        return Err(QueryError::Failed {
            status,
            stderr: stderr.lines().next().unwrap_or_default().to_string(),
        });
    }
    Ok(drain(child.stdout.take()))
}

/// What an exited child wrote to `pipe`; what cannot be read counts as nothing written.
fn drain(pipe: Option<impl Read>) -> String {
    let mut bytes = Vec::new();
    if let Some(mut pipe) = pipe {
        let _ = pipe.read_to_end(&mut bytes);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

fn cgroup(config: &Config) -> Cgroup {
    Cgroup {
        v2: Path::new("/sys/fs/cgroup/cgroup.controllers").exists(),
        // The sysctl exists exactly when the kernel has the bpf() system call.
        bpf: Path::new("/proc/sys/kernel/unprivileged_bpf_disabled").exists(),
        pins: config
            .device_program_pins()
            .map(|dir| (dir.to_owned(), nvhook_cgroup::bpf::kept::keeping(dir))),
    }
}
