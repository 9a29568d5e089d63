//! The checks, as pure functions of facts read from the host (by the module above): each gives
//! lines of ok, warn or fail, and for every problem the command or setting that fixes it.

use super::Check;
use super::runtimes::{self, Version};
use crate::config::{Config, GpuMemoryLimits};
use crate::configure;
use crate::dev_char::CharLink;
use crate::elf_machine::{ElfHead, mismatch};
use crate::hook::memory_limits::OnThisNode;
use crate::inventory::{DeviceMajors, HostNode, Inventory, Library, WslDriver};
use nvhook_cgroup::bpf::kept::Keeping;
use nvhook_ldcache::{Arch, ElfClass};
use nvhook_model::inventory::wsl;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The loaded module's driver version, from `/proc/driver/nvidia/version`'s text.
pub fn module_version(text: &str) -> Option<&str> {
    // `NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 ...`
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    line.split_whitespace()
        .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()) && w.contains('.'))
}

/// `/proc/driver/nvidia/version`'s text, when it could be read.
pub fn kernel_module(version_file: &str, text: Option<&str>) -> Check {
    let version = text.and_then(module_version);
    match (text, version) {
        (Some(_), Some(v)) => Check::ok("kernel module", format!("nvidia loaded, driver {v}")),
        (Some(_), None) => Check::ok("kernel module", format!("nvidia loaded ({version_file})")),
        (None, _) => Check::fail(
            "kernel module",
            format!("{version_file} is missing: the nvidia kernel module is not loaded"),
            "load it (modprobe nvidia), or install the NVIDIA driver",
        ),
    }
}

/// A WSL2 host, in place of the kernel module and device node checks, which cannot apply
/// there: `/dev/dxg`, the driver store in use (and `others` passed over), the files NVIDIA's
/// toolkit requires of it, and `libdxcore.so`.
pub fn wsl(driver: &WslDriver, others: &[String]) -> Vec<Check> {
    let dxg = &driver.dxg;
    let mut out = vec![Check::ok(
        "WSL2",
        format!(
            "{} {}:{} and NVIDIA's driver store {}: containers get every GPU through /dev/dxg (NVIDIA_VISIBLE_DEVICES=all), no /dev/nvidia* and no kernel module",
            dxg.path, dxg.major, dxg.minor, driver.store
        ),
    )];
    if !others.is_empty() {
        out.push(Check::warn(
            "WSL2 driver store",
            format!("other NVIDIA driver stores are passed over: {}", others.join(", ")),
            "remove the old NVIDIA driver package in Windows (pnputil /delete-driver), then wsl --shutdown",
        ));
    }
    let names = driver
        .files
        .iter()
        .filter(|f| f.dir_and_name().0 == driver.store)
        .map(|f| f.dir_and_name().1);
    let missing = wsl::missing_required(names);
    if !missing.is_empty() {
        out.push(Check::warn(
            "WSL2 driver store",
            format!("{} lacks {}", driver.store, missing.join(", ")),
            "update NVIDIA's Windows driver, which the store comes from, then wsl --shutdown",
        ));
    }
    let dxcore = format!("{}/{}", wsl::LIB_DIR, wsl::DXCORE);
    if !driver.files.iter().any(|f| f.container_path == dxcore) {
        out.push(Check::fail(
            "WSL2 libdxcore.so",
            format!("{dxcore} is missing: CUDA and NVML in containers find no GPU"),
            "restart WSL (wsl --shutdown) so that Windows maps /usr/lib/wsl/lib again",
        ));
    }
    out
}

/// NVML asked through nvhook-nvml, and how long it took.
pub fn nvml(answer: &Result<Inventory, String>, took: Duration, timeout: Duration) -> Check {
    let ms = took.as_millis();
    match answer {
        Err(e) => Check::fail(
            "NVML",
            format!("nvhook-nvml could not ask NVML ({ms} ms): {e}"),
            "as the error says (nvhook info gives the same one)",
        ),
        Ok(inv) if took > timeout / 2 => Check::warn(
            "NVML",
            format!(
                "answered in {ms} ms ({} GPUs), more than half of nvml-timeout-ms ({} ms)",
                inv.gpus.len(),
                timeout.as_millis()
            ),
            "enable persistence mode (nvidia-smi -pm 1, or start nvidia-persistenced)",
        ),
        Ok(inv) => Check::ok(
            "NVML",
            format!(
                "answered in {ms} ms: {} GPUs, driver {}, CUDA {}",
                inv.gpus.len(),
                inv.driver_version,
                inv.cuda_version
            ),
        ),
    }
}

/// Persistence mode of each GPU: off, every NVML init pays the GPUs' set-up again.
pub fn persistence(inv: &Inventory) -> Vec<Check> {
    inv.gpus
        .iter()
        .map(|gpu| {
            let name = format!("persistence mode GPU {}", gpu.index);
            match gpu.persistence_mode {
                Some(true) => Check::ok(&name, "on"),
                Some(false) => Check::warn(
                    &name,
                    "off: each NVML initialisation (a container start without NVML's cached answer) costs seconds on a big node",
                    format!(
                        "nvidia-smi -i {} -pm 1, or start nvidia-persistenced",
                        gpu.index
                    ),
                ),
                None => Check::ok(&name, "not reported by NVML"),
            }
        })
        .collect()
}

/// Whether the GPU memory limits containers ask for (NVIDIA_GPU_MEMORY_REQUEST/LIMIT) are set
/// on this node, and what a container that asks meets where they are not.
pub fn memory_limits(limits: OnThisNode, policy: GpuMemoryLimits) -> Check {
    let name = "GPU memory limits";
    let why = match limits {
        OnThisNode::Enforced => {
            return Check::ok(name, "set per container by the driver (cgroup v2)");
        }
        OnThisNode::Off => return Check::ok(name, "off in nvhook's config: never set"),
        OnThisNode::DriverLacksTheCall => {
            "the driver has no nvmlDeviceSetMemoryLimits_v1 (it came with CUDA 13.4's driver)"
        }
        OnThisNode::CgroupV1 => "/sys/fs/cgroup is not cgroup v2, which the driver's limits need",
    };
    // Not a fault of the node: only a container that asks meets it, and is told so.
    let then = match policy {
        GpuMemoryLimits::BestEffort => "a container that asks starts unlimited (best-effort)",
        _ => {
            "a container that asks is refused (gpu-memory-limits = \"best-effort\" starts it unlimited)"
        }
    };
    Check::ok(name, format!("not set here: {why}; {then}"))
}

/// Every GPU's `/dev/nvidia<minor>`, `nvidiactl` and `nvidia-uvm`, with the majors the
/// kernel gave the driver in `/proc/devices`.
pub fn device_nodes(inv: &Inventory, majors: &DeviceMajors, nodes: &[HostNode]) -> Vec<Check> {
    let fix = "run nvidia-smi (or nvidia-modprobe) as root, which makes the driver's nodes";
    let Some(nvidia) = majors.nvidia else {
        return vec![Check::fail(
            "device nodes",
            "/proc/devices lists no nvidia character device",
            "load the nvidia modules (modprobe nvidia nvidia-uvm)",
        )];
    };
    let mut wanted: Vec<(String, u32, u32)> = inv
        .gpus
        .iter()
        .filter_map(|g| Some((format!("/dev/nvidia{}", g.minor?), nvidia, g.minor?)))
        .collect();
    wanted.push(("/dev/nvidiactl".into(), nvidia, 255));
    // A MIG device is opened through the nvidia-caps nodes of its GPU and compute instance.
    if let Some(caps) = majors.caps {
        let cap_minors = inv
            .gpus
            .iter()
            .flat_map(|g| &g.mig_devices)
            .flat_map(|m| [m.gi_cap_minor, m.ci_cap_minor])
            .flatten();
        for minor in cap_minors {
            let path = format!("/dev/nvidia-caps/nvidia-cap{minor}");
            if !wanted.iter().any(|(p, _, _)| *p == path) {
                wanted.push((path, caps, minor));
            }
        }
    }
    let mut out: Vec<Check> = wanted
        .iter()
        .map(|(path, major, minor)| node_check(nodes, path, *major, Some(*minor), fix))
        .collect();
    // Without nvidia-uvm, or with its nodes missing or numbered for a module loaded before,
    // nvidia-smi works and cuInit fails with CUDA_ERROR_UNKNOWN.
    match majors.uvm {
        None => out.push(Check::fail(
            "device /dev/nvidia-uvm",
            "nvidia-uvm is not in /proc/devices: the module is not loaded (cuInit fails with CUDA_ERROR_UNKNOWN)",
            "modprobe nvidia-uvm",
        )),
        Some(uvm) => {
            for (path, minor) in [("/dev/nvidia-uvm", 0), ("/dev/nvidia-uvm-tools", 1)] {
                out.push(node_check(
                    nodes,
                    path,
                    uvm,
                    Some(minor),
                    "nvidia-modprobe -u -c 0 as root, which makes nvidia-uvm's nodes",
                ));
            }
        }
    }
    out
}

/// The driver's user-space libraries and the loaded kernel module are one release: a driver
/// upgraded without a reboot leaves the old module loaded, and then nvidia-smi may still
/// answer while CUDA's cuInit fails (CUDA_ERROR_UNKNOWN, or "system not yet initialized").
pub fn library_versions(module: Option<&str>, inv: &Inventory) -> Option<Check> {
    let module = module?;
    let versions: BTreeSet<(&str, &str)> = inv
        .files
        .libraries
        .iter()
        .filter(|l| l.class == ElfClass::Lib64)
        .filter(|l| matches!(l.soname.as_str(), "libcuda.so.1" | "libnvidia-ml.so.1"))
        // A file named by its SONAME says no version.
        .filter(|l| l.file_name != l.soname)
        .filter_map(|l| {
            let version = l.file_name.strip_prefix(l.soname.trim_end_matches(".1"))?;
            Some((l.file_name.as_str(), version.strip_prefix('.')?))
        })
        .collect();
    if versions.is_empty() {
        return None;
    }
    let differing: Vec<String> = versions
        .iter()
        .filter(|(_, version)| *version != module)
        .map(|(file, version)| format!("{file} is {version}"))
        .collect();
    Some(if differing.is_empty() {
        Check::ok(
            "driver versions",
            format!("libraries and kernel module are both {module}"),
        )
    } else {
        Check::fail(
            "driver versions",
            format!(
                "the kernel module loaded is {module}, but {}: cuInit fails (CUDA_ERROR_UNKNOWN) while nvidia-smi may still work",
                differing.join(", ")
            ),
            "reboot, or reload the modules of the installed driver (rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia, then modprobe nvidia nvidia-uvm)",
        )
    })
}

fn node_check(nodes: &[HostNode], path: &str, major: u32, minor: Option<u32>, fix: &str) -> Check {
    let name = format!("device {path}");
    let want = match minor {
        Some(m) => format!("{major}:{m}"),
        None => format!("{major}:*"),
    };
    match nodes.iter().find(|n| n.path == path) {
        None => Check::fail(&name, format!("missing (want {want})"), fix),
        Some(n) if n.major != major || minor.is_some_and(|m| m != n.minor) => Check::fail(
            &name,
            format!("is {}:{}, want {want}", n.major, n.minor),
            format!(
                "remove {} and make it again (mknod {} c {} {})",
                n.host_path.display(),
                n.host_path.display(),
                major,
                minor.unwrap_or(n.minor)
            ),
        ),
        Some(n) => Check::ok(&name, format!("{}:{}", n.major, n.minor)),
    }
}

/// What a driver library file starts with, or why it could not be read.
pub type LibraryHead = Result<Vec<u8>, String>;

/// The libraries nvhook would mount: the two every GPU container needs are there, and each
/// one is a readable ELF file of the class the loader cache says, built for `node`, the
/// architecture the kernel runs.
pub fn driver_files(inv: &Inventory, node: Arch, heads: &[(Library, LibraryHead)]) -> Vec<Check> {
    let mut out = Vec::new();
    for soname in ["libcuda.so.1", "libnvidia-ml.so.1"] {
        let found = inv
            .files
            .libraries
            .iter()
            .any(|l| l.soname == soname && l.class == ElfClass::Lib64);
        if !found {
            out.push(Check::fail(
                &format!("driver {soname}"),
                format!(
                    "not in the driver root's loader cache as a {} file",
                    inv.driver_version
                ),
                "reinstall the NVIDIA driver's libraries and run ldconfig (in driver-root)",
            ));
        }
    }
    let mut foreign = false;
    let bad: Vec<String> = heads
        .iter()
        .filter_map(|(lib, head)| {
            let problem = match head.as_deref().map(ElfHead::parse) {
                Err(e) => format!("unreadable ({e})"),
                Ok(Err(why)) => why,
                Ok(Ok(elf)) => {
                    let class = match lib.class {
                        ElfClass::Lib64 => 2,
                        ElfClass::Lib32 => 1,
                    };
                    if elf.class != class {
                        format!(
                            "ELF class {} where the loader cache says {:?}",
                            elf.class, lib.class
                        )
                    } else if elf.arch() == Some((node, lib.class)) {
                        return None;
                    } else {
                        foreign = true;
                        format!("built for {} on this {} node", elf.name(), node.name())
                    }
                }
            };
            Some(format!("{}: {problem}", lib.host_path.display()))
        })
        .collect();
    out.push(match bad.as_slice() {
        [] => Check::ok(
            "driver files",
            format!(
                "{} libraries of driver {}, each a readable ELF file of its class",
                heads.len(),
                inv.driver_version
            ),
        ),
        _ if foreign => Check::fail(
            "driver files",
            bad.join("; "),
            format!(
                "install the NVIDIA driver for {} (the driver root holds another architecture's)",
                node.name()
            ),
        ),
        _ => Check::fail(
            "driver files",
            bad.join("; "),
            "reinstall the NVIDIA driver (its files are damaged or replaced)",
        ),
    });
    out
}

/// nvhook's own programs (nvhook, the nvhook-runtime engines run, nvhook-nvml), each with the
/// first bytes of its file: every one must be built for `machine`, the architecture the kernel
/// runs (`uname -m`). On a mixed fleet an x86_64 package on an arm64 node fails only when a
/// GPU container starts, or runs nvhook slowly under binfmt_misc's qemu.
pub fn binaries(machine: &str, files: &[(PathBuf, LibraryHead)]) -> Check {
    const NAME: &str = "nvhook binaries";
    let Some(node) = Arch::from_name(machine) else {
        return Check::fail(
            NAME,
            format!("this node runs {machine:?}, an architecture nvhook is not built for"),
            "run nvhook on an x86_64 or aarch64 node",
        );
    };
    let bad: Vec<String> = files
        .iter()
        .filter_map(|(path, head)| {
            let problem = match head {
                Err(e) => format!("unreadable ({e})"),
                Ok(head) => mismatch(head, node)?,
            };
            Some(format!("{}: {problem}", path.display()))
        })
        .collect();
    if bad.is_empty() {
        let names: Vec<String> = files
            .iter()
            .map(|(path, _)| path.display().to_string())
            .collect();
        return Check::ok(
            NAME,
            format!(
                "{} built for {}, as this node",
                names.join(", "),
                node.name()
            ),
        );
    }
    let package = match node {
        Arch::X86_64 => "amd64 .deb or x86_64 .rpm",
        Arch::Aarch64 => "arm64 .deb or aarch64 .rpm",
    };
    Check::fail(
        NAME,
        format!("{} (this node runs {})", bad.join("; "), node.name()),
        format!("install nvhook's {package}"),
    )
}

/// NVML's cached answer against the host now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheState {
    /// `nvml-cache-file` is empty, or the host cannot be fingerprinted.
    Off,
    Missing,
    /// A file is there that this user does not use, and why.
    Unusable(String),
    /// Stored for another host state (a reboot, a driver or MIG change since).
    Stale,
    Fresh,
}

pub fn cache(path: &str, state: &CacheState, nvhook: &str) -> Check {
    let fix = &format!(
        "nothing to do: the next container start (or {nvhook} cdi refresh) asks NVML and stores the answer"
    );
    match state {
        CacheState::Fresh => Check::ok("NVML cache", format!("{path}: fresh for this host")),
        CacheState::Off => Check::warn(
            "NVML cache",
            "off (nvml-cache-file is empty, or the host cannot be fingerprinted): every start asks NVML",
            "set nvml-cache-file in the nvhook config",
        ),
        CacheState::Missing => Check::warn("NVML cache", format!("{path}: none stored yet"), fix),
        CacheState::Unusable(why) => Check::warn(
            "NVML cache",
            format!("{path}: not used: {why}"),
            "run nvhook doctor as the user the hook runs as (root), or make the cache's directory that user's alone (chown, chmod go-w)",
        ),
        CacheState::Stale => Check::warn(
            "NVML cache",
            format!(
                "{path}: stored for another host state (reboot, driver or MIG change); the next start asks NVML again"
            ),
            fix,
        ),
    }
}

/// An engine config nvhook knows, as `nvhook configure --dry-run` judges it.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub engine: &'static str,
    pub file: PathBuf,
    /// Ok(true): nvhook's runtime is there with `runtime_path`; Ok(false): it is not.
    pub configured: Result<bool, String>,
    /// Where `nvhook configure` would refuse the command that sets this file right (the
    /// runtime it would name is not there, or doctor's own flags are ones configure refuses),
    /// what to do instead: the fix then proposes no command configure refuses.
    pub refused: Option<String>,
}

/// The nvhook-runtime the engines should run (`--runtime-path`, else the one beside nvhook),
/// where it is not a runtime `nvhook configure` would write: relative, or not there. None
/// where it is there: the binaries line names it, with its architecture.
pub fn runtime_path(path: &str, exists: bool, beside: &str) -> Option<Check> {
    const NAME: &str = "nvhook-runtime";
    if !path.starts_with('/') {
        return Some(Check::fail(
            NAME,
            format!(
                "--runtime-path {path:?} is not absolute: engines do not look it up in PATH, and configure refuses it"
            ),
            format!("name it by its full path, such as {beside}"),
        ));
    }
    (!exists).then(|| {
        Check::fail(
            NAME,
            format!("{path} does not exist: an engine told to run it fails every container it starts with it"),
            format!(
                "install nvhook's package (it puts nvhook-runtime beside nvhook, {beside}), or name the installed one with --runtime-path"
            ),
        )
    })
}

/// `nri_mode`: nvhook gives GPUs through NRI here, so containerd and CRI-O need no runtime.
pub fn engines(
    configs: &[EngineConfig],
    runtime_name: &str,
    runtime_path: &str,
    nri_mode: bool,
) -> Vec<Check> {
    if configs.is_empty() {
        return vec![Check::warn(
            "engines",
            "no Docker, containerd, CRI-O, k3s or RKE2 config found",
            "install an engine, then nvhook configure ENGINE",
        )];
    }
    configs
        .iter()
        .map(|c| {
            let name = format!("engine {}", c.engine);
            let file = c.file.display();
            match &c.configured {
                Ok(true) => Check::ok(
                    &name,
                    format!("{file}: runtime {runtime_name} is {runtime_path}"),
                ),
                Ok(false) if nri_mode && matches!(c.engine, "containerd" | "crio") => Check::ok(
                    &name,
                    format!("{file}: no runtime {runtime_name}: GPUs come through NRI (see the NRI lines)"),
                ),
                Ok(false) => Check::fail(
                    &name,
                    format!("{file}: no runtime {runtime_name} running {runtime_path}"),
                    match &c.refused {
                        Some(instead) => instead.clone(),
                        None => format!(
                            "nvhook configure {} --engine-config {file}{} --runtime-path {runtime_path}, then restart it",
                            c.engine,
                            match runtime_name == configure::DEFAULT_RUNTIME_NAME {
                                true => String::new(),
                                false => format!(" --runtime-name {runtime_name}"),
                            }
                        ),
                    },
                ),
                Err(e) => Check::fail(
                    &name,
                    format!("{file}: {e}"),
                    c.refused.as_deref().unwrap_or("fix the file by hand"),
                ),
            }
        })
        .collect()
}

/// An OCI hooks.d directory of an installed Podman or CRI-O.
#[derive(Debug, Clone)]
pub struct HooksDir {
    pub engine: &'static str,
    pub dirs: Vec<PathBuf>,
    /// The hook file naming nvhook, when one is there.
    pub found: Option<PathBuf>,
}

pub fn hooks(dirs: &[HooksDir]) -> Vec<Check> {
    dirs.iter()
        .map(|h| {
            let name = format!("{} hooks.d", h.engine);
            match &h.found {
                Some(file) => Check::ok(&name, format!("{} runs nvhook", file.display())),
                None => Check::warn(
                    &name,
                    format!(
                        "{} installed, and no hook in {} runs nvhook",
                        h.engine,
                        h.dirs
                            .iter()
                            .map(|d| d.display().to_string())
                            .collect::<Vec<_>>()
                            .join(" or ")
                    ),
                    "copy hooks/oci-nvhook-hook.json into /usr/share/containers/oci/hooks.d (or use nvhook-runtime)",
                ),
            }
        })
        .collect()
}

/// A CDI spec file of kind `nvidia.com/gpu` (or one that cannot be read), with the device
/// names it offers and each device's nodes.
#[derive(Debug, Clone)]
pub struct SpecFile {
    pub file: PathBuf,
    pub devices: Result<Vec<(String, Vec<SpecNode>)>, String>,
    /// The GPU layout stamp its hook checks (specs nvhook wrote).
    pub gpu_layout: Option<String>,
    /// Why its hook cannot use the file its arguments are in, where it names one that way.
    pub args_file: Option<String>,
}

/// A device node of a CDI device: its path in the container, and its numbers where the spec
/// gives them (NVIDIA's nvidia-ctk writes paths alone; the runtime then reads the numbers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecNode {
    pub path: String,
    pub number: Option<(i64, i64)>,
}

/// Whether two devices' nodes are the same: the same paths, and the same numbers wherever
/// both give them.
fn same_nodes(a: &[SpecNode], b: &[SpecNode]) -> bool {
    let paths = |nodes: &[SpecNode]| {
        nodes
            .iter()
            .map(|n| n.path.clone())
            .collect::<BTreeSet<_>>()
    };
    paths(a) == paths(b)
        && a.iter().all(|x| {
            b.iter()
                .filter(|y| y.path == x.path)
                .all(|y| x.number.is_none() || y.number.is_none() || x.number == y.number)
        })
}

/// The names and nodes nvhook would write for this node now.
pub struct CurrentDevices {
    /// (index name, UUID name) of each GPU and MIG device.
    pub ids: Vec<(String, String)>,
    /// name → its device nodes.
    pub nodes: Vec<(String, Vec<SpecNode>)>,
    /// The GPU layout stamp a spec written now would carry.
    pub gpu_layout: Option<String>,
}

pub fn cdi(specs: &[SpecFile], now: &CurrentDevices, nvhook: &str) -> Vec<Check> {
    let fix = &format!("{nvhook} cdi refresh --output FILE (or delete the file)");
    let known: BTreeSet<&str> = now
        .ids
        .iter()
        .flat_map(|(i, u)| [i.as_str(), u.as_str()])
        .chain(["all"])
        .collect();
    specs
        .iter()
        .map(|spec| {
            let name = format!("CDI {}", spec.file.display());
            let devices = match &spec.devices {
                Err(e) => {
                    return Check::fail(
                        &name,
                        e.clone(),
                        "fix or remove the file: engines refuse every spec beside a bad one",
                    );
                }
                Ok(d) => d,
            };
            let names: BTreeSet<&str> = devices.iter().map(|(n, _)| n.as_str()).collect();
            let extra: Vec<&str> = names.difference(&known).copied().collect();
            let missing: Vec<&str> = now
                .ids
                .iter()
                .filter(|(i, u)| !names.contains(i.as_str()) && !names.contains(u.as_str()))
                .map(|(i, _)| i.as_str())
                .collect();
            let changed: Vec<&str> = devices
                .iter()
                .filter(|(n, nodes)| {
                    now.nodes
                        .iter()
                        .find(|(m, _)| m == n)
                        .is_some_and(|(_, want)| !same_nodes(want, nodes))
                })
                .map(|(n, _)| n.as_str())
                .collect();
            let mut problems = Vec::new();
            if !extra.is_empty() {
                problems.push(format!(
                    "names devices this node does not have: {}",
                    extra.join(", ")
                ));
            }
            if !missing.is_empty() {
                problems.push(format!("lacks this node's devices: {}", missing.join(", ")));
            }
            if !changed.is_empty() {
                problems.push(format!("device nodes changed for: {}", changed.join(", ")));
            }
            if let Some(problem) = &spec.args_file {
                problems.push(format!(
                    "its hook cannot use its argument file, so nvhook refuses every start through it: {problem}"
                ));
            }
            if let (Some(written), Some(now)) = (&spec.gpu_layout, &now.gpu_layout)
                && written != now
            {
                problems.push(format!(
                    "written for another GPU layout ({written}, now {now}: GPUs or MIG instances changed), so nvhook refuses every start through it"
                ));
            }
            match problems.is_empty() {
                true => Check::ok(
                    &name,
                    format!("{} devices, true to this node", devices.len()),
                ),
                false => Check::fail(&name, format!("stale: {}", problems.join("; ")), fix),
            }
        })
        .collect()
}

/// A low-level runtime found where nvhook-runtime looks, and what its `--version` said.
#[derive(Debug)]
pub struct RuntimeBinary {
    pub path: PathBuf,
    /// The first of the config's `runtimes` found: the one nvhook-runtime execs.
    pub execd: bool,
    pub version: Result<String, QueryError>,
}

/// Why a runtime's `--version` gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("cannot run it: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("it did not exit within {0} s")]
    Timeout(u64),
    #[error("it exited with {status}: {stderr}")]
    Failed {
        status: std::process::ExitStatus,
        /// Its first line.
        stderr: String,
    },
}

/// The runtimes looked for (the config's `runtimes`, then runc, crun and youki), the
/// directories a name without a path is looked for in, and what was found.
#[derive(Debug)]
pub struct RuntimeSearch {
    pub names: Vec<String>,
    pub dirs: Vec<PathBuf>,
    pub found: Vec<RuntimeBinary>,
}

/// Each runtime found, with its version and the container-escape fixes it lacks.
pub fn runtimes(search: &RuntimeSearch) -> Vec<Check> {
    if search.found.is_empty() {
        let dirs: Vec<String> = search
            .dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        return vec![Check::warn(
            "runtimes",
            format!(
                "none of {} found (by absolute path, or in {}): nvhook-runtime has nothing to exec, and the runtime's fixes cannot be checked",
                search.names.join(", "),
                dirs.join(":")
            ),
            "install runc or crun, or run doctor with the engine's runtime directory on PATH (k3s: /var/lib/rancher/k3s/data/current/bin), or name it by absolute path in the nvhook config's runtimes",
        )];
    }
    search.found.iter().map(runtime).collect()
}

fn runtime(binary: &RuntimeBinary) -> Check {
    let path = binary.path.display();
    let name = format!(
        "runtime {}",
        binary
            .path
            .file_name()
            .map_or_else(|| path.to_string(), |n| n.to_string_lossy().into_owned())
    );
    let by_hand =
        format!("run {path} --version yourself and compare it with SECURITY.md's runtime table");
    let text = match &binary.version {
        Ok(text) => text,
        Err(e) => return Check::warn(&name, format!("{path} --version: {e}"), by_hand),
    };
    let reported = match runtimes::parse_output(text) {
        Ok(reported) => reported,
        Err(e) => return Check::warn(&name, format!("{path} --version: {e}"), by_hand),
    };
    let at = match binary.execd {
        true => format!("at {path}, which nvhook-runtime execs"),
        false => format!("at {path}"),
    };
    let program = reported.name;
    if !runtimes::RUNTIMES.contains(&program) {
        return Check::ok(
            &name,
            format!(
                "{program} {} {at}: not runc, crun or youki, whose fixes doctor knows",
                reported.printed
            ),
        );
    }
    let Some((version, len)) = Version::parse(reported.printed) else {
        return Check::warn(
            &name,
            format!(
                "{path} --version: {:?} is not a version doctor can read",
                reported.printed
            ),
            by_hand,
        );
    };
    let build = match (&reported.printed[len..], reported.commit) {
        ("", _) => String::new(),
        (_, Some(commit)) => format!(" (built as {}, commit {commit})", reported.printed),
        (_, None) => format!(" (built as {})", reported.printed),
    };
    let head = format!("{program} {} {at}{build}", &reported.printed[..len]);
    let Some(upgrade) = runtimes::upgrade(program, &version) else {
        return Check::ok(
            &name,
            format!("{head}: no container-escape fix in SECURITY.md's table is missing"),
        );
    };
    let missing: Vec<String> = upgrade
        .lacking
        .iter()
        .map(|f| format!("{} (fixed in {})", f.ids.join(", "), f.fixed_in.join(", ")))
        .collect();
    Check::warn(
        &name,
        format!(
            "{head}: upstream fixes missing for {}; distributions backport fixes without changing the version, so a distribution's build may have them",
            missing.join("; ")
        ),
        format!(
            "upgrade {program} to {} or later, or check that your distribution's security advisories list these CVEs as fixed in the build you have",
            upgrade.to
        ),
    )
}

/// The cgroup hierarchy, and on v2 whether a device program can be loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup {
    pub v2: bool,
    /// The kernel has the bpf() system call (needed on v2).
    pub bpf: bool,
    /// `device-program-pins` and what is there; None where the config turned it off.
    pub pins: Option<(PathBuf, Keeping)>,
}

pub fn cgroup(c: &Cgroup) -> Check {
    match (c.v2, c.bpf) {
        (false, _) => Check::ok("cgroup", "v1: GPU rules go into devices.allow"),
        (true, true) => {
            let keeping = match &c.pins {
                None => "device-program-pins = \"\": each container loads its own".to_owned(),
                Some((dir, Keeping::Kept(n))) => {
                    format!("kept for the next container in {} ({n} now)", dir.display())
                }
                Some((dir, Keeping::NoBpffs)) => format!(
                    "each container loads its own, as {} is not a bpffs (mount one there, as systemd does, to keep them in {})",
                    dir.parent().unwrap_or(dir).display(),
                    dir.display()
                ),
            };
            Check::ok(
                "cgroup",
                format!(
                    "v2: the runtime's BPF device program can be replaced by one that allows the GPUs; device programs: {keeping}"
                ),
            )
        }
        (true, false) => Check::fail(
            "cgroup",
            "v2 without the bpf() system call: the device filter cannot be replaced",
            "boot a kernel built with CONFIG_BPF_SYSCALL and CONFIG_CGROUP_BPF",
        ),
    }
}

/// What is at `/dev/char/MAJ:MIN` for an NVIDIA node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkState {
    /// It resolves to that node.
    Resolves,
    /// Missing, or a link that leads elsewhere: `nvhook dev-char-links` puts it right.
    Fixable,
    /// Something that is not a link, which `nvhook dev-char-links` leaves alone.
    NotALink,
}

/// `/dev/char/MAJ:MIN` for each NVIDIA node (in `dir`), and whether it resolves to that node.
pub fn dev_char(dir: &Path, links: &[(CharLink, LinkState)], nvhook: &str) -> Check {
    let names = |state: LinkState| -> Vec<&str> {
        links
            .iter()
            .filter(|(_, s)| *s == state)
            .map(|(l, _)| l.name.as_str())
            .collect()
    };
    let (fixable, blocked) = (names(LinkState::Fixable), names(LinkState::NotALink));
    if fixable.is_empty() && blocked.is_empty() {
        return Check::ok(
            "/dev/char links",
            format!("{} NVIDIA nodes linked", links.len()),
        );
    }
    let wrong = [fixable.as_slice(), blocked.as_slice()].concat().join(", ");
    let fix = match blocked.as_slice() {
        [] => format!("{nvhook} dev-char-links"),
        _ => {
            let paths: Vec<String> = blocked
                .iter()
                .map(|name| dir.join(name).display().to_string())
                .collect();
            format!(
                "move {} out of the way (not links: dev-char-links replaces only links), then run {nvhook} dev-char-links",
                paths.join(", ")
            )
        }
    };
    Check::warn(
        "/dev/char links",
        format!(
            "missing or wrong: {wrong} (systemd drops those devices from a container's rules on daemon-reload)"
        ),
        fix,
    )
}

/// What is at a DRA driver's registration socket in the kubelet's plugin registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginSocket {
    /// Nothing there: no kubelet plugin of that driver on this node.
    Missing,
    /// A connection to it is accepted: a plugin is serving there.
    Accepts,
    /// It is there, and a connection to it failed (`denied`: for want of permission, which
    /// says nothing about the plugin).
    Refuses { denied: bool, error: String },
}

/// nvhook's DRA kubelet plugin (nvhook-dra), through the registration socket the kubelet's
/// plugin watcher finds it by. nvhook-dra is optional, so no socket is no problem; a socket
/// nothing accepts on is a plugin that died, and the kubelet cannot prepare a claim until it
/// is back.
pub fn dra_plugin(driver: &str, socket: &str, state: &PluginSocket) -> Check {
    let name = "DRA plugin";
    match state {
        PluginSocket::Missing => Check::ok(
            name,
            format!(
                "not installed: no {socket} (nvhook-dra is optional: deploy/kubernetes/nvhook-dra.yaml)"
            ),
        ),
        PluginSocket::Accepts => Check::ok(
            name,
            format!("{driver} registered and serving: {socket} accepts connections"),
        ),
        PluginSocket::Refuses {
            denied: true,
            error,
        } => Check::warn(
            name,
            format!("cannot connect to {socket}: {error}"),
            "run nvhook doctor as root",
        ),
        PluginSocket::Refuses {
            denied: false,
            error,
        } => Check::fail(
            name,
            format!(
                "{socket} is there and refuses connections ({error}): the {driver} plugin that made it has stopped, and the kubelet prepares no {driver} claim on this node"
            ),
            "restart the nvhook-dra pod on this node: kubectl -n nvhook-system delete pod -l app.kubernetes.io/name=nvhook-dra --field-selector spec.nodeName=NODE (its DaemonSet starts a new one, which replaces the socket)",
        ),
    }
}

/// The device-selection policy in force, in one sentence.
pub fn policy(config: &Config) -> Check {
    let env = match config.accept_env_when_unprivileged {
        true => "NVIDIA_VISIBLE_DEVICES selects GPUs for every container",
        false => "NVIDIA_VISIBLE_DEVICES selects GPUs only for privileged containers",
    };
    let mounts = match config.accept_volume_mount_devices {
        true => ", the device plugin's /var/run/nvidia-container-devices mounts select them too",
        false => ", volume mounts select none",
    };
    let require = match config.disable_require {
        true => ", and NVIDIA_REQUIRE_* is not checked",
        false => ", and NVIDIA_REQUIRE_* is checked",
    };
    let caps: Vec<String> = config
        .supported_capabilities
        .iter()
        .map(|c| c.to_string())
        .collect();
    Check::ok(
        "policy",
        format!(
            "{env}{mounts}{require}; capabilities served: {}",
            caps.join(",")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Level;
    use crate::doctor::runtimes::recorded;
    use crate::elf_machine::tests::elf_head;
    use nvhook_model::plan::fixtures::{inventory, standard};

    fn levels(checks: &[Check]) -> Vec<Level> {
        checks.iter().map(|c| c.level).collect()
    }

    #[test]
    fn wsl_says_so_and_names_what_the_store_lacks() {
        let store = "/usr/lib/wsl/drivers/nv_dispi.inf_amd64_1";
        let file = |p: &str| crate::inventory::WslFile {
            host_path: p.into(),
            container_path: p.into(),
        };
        let mut driver = WslDriver {
            dxg: HostNode {
                path: "/dev/dxg".into(),
                host_path: "/dev/dxg".into(),
                major: 10,
                minor: 63,
                mode: 0o666,
            },
            store: store.into(),
            files: wsl::REQUIRED
                .iter()
                .map(|n| file(&format!("{store}/{n}")))
                .chain([file("/usr/lib/wsl/lib/libdxcore.so")])
                .collect(),
        };
        let all_there = super::wsl(&driver, &[]);
        assert_eq!(all_there.len(), 1, "{all_there:?}");
        assert_eq!(all_there[0].level, Level::Ok);
        assert!(
            all_there[0]
                .detail
                .starts_with("/dev/dxg 10:63 and NVIDIA's driver store")
        );

        driver.files.retain(|f| {
            !f.container_path.ends_with("nvcubins.bin") && !f.container_path.ends_with("dxcore.so")
        });
        let lacking = super::wsl(&driver, &["/usr/lib/wsl/drivers/nv_old".into()]);
        let levels: Vec<_> = lacking.iter().map(|c| (c.name.as_str(), c.level)).collect();
        assert_eq!(
            levels,
            [
                ("WSL2", Level::Ok),
                ("WSL2 driver store", Level::Warn),
                ("WSL2 driver store", Level::Warn),
                ("WSL2 libdxcore.so", Level::Fail),
            ]
        );
        assert_eq!(lacking[2].detail, format!("{store} lacks nvcubins.bin"));
    }

    #[test]
    fn the_module_version_is_read_from_its_line() {
        let text = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\nGCC version:  gcc 12\n";
        let ok = kernel_module("/proc/driver/nvidia/version", Some(text));
        assert_eq!(ok.level, Level::Ok);
        assert_eq!(ok.detail, "nvidia loaded, driver 550.54.15");
        let gone = kernel_module("/proc/driver/nvidia/version", None);
        assert_eq!(gone.level, Level::Fail);
        assert!(gone.fix.unwrap().contains("modprobe nvidia"));
    }

    #[test]
    fn libraries_of_another_release_than_the_module_fail() {
        let inv = standard();
        assert_eq!(library_versions(None, &inv), None);
        let same = library_versions(Some("550.54.15"), &inv).unwrap();
        assert_eq!(same.level, Level::Ok, "{same:?}");
        let other = library_versions(Some("535.104.05"), &inv).unwrap();
        assert_eq!(other.level, Level::Fail);
        assert!(
            other.detail.contains("libcuda.so.550.54.15 is 550.54.15"),
            "{other:?}"
        );
        // A library file named by its SONAME says no version: nothing to compare.
        let mut unversioned = standard();
        for lib in &mut unversioned.files.libraries {
            lib.file_name = lib.soname.clone();
        }
        assert_eq!(library_versions(Some("535.104.05"), &unversioned), None);
    }

    #[test]
    fn nvml_is_slow_past_half_its_timeout() {
        let inv = standard();
        let timeout = Duration::from_millis(1000);
        let fast = nvml(&Ok(inv.clone()), Duration::from_millis(20), timeout);
        assert_eq!(fast.level, Level::Ok);
        assert!(fast.detail.starts_with("answered in 20 ms: 4 GPUs"));
        let slow = nvml(&Ok(inv), Duration::from_millis(600), timeout);
        assert_eq!(slow.level, Level::Warn);
        let failed = nvml(&Err("boom".into()), Duration::from_millis(3), timeout);
        assert_eq!(failed.level, Level::Fail);
        assert!(failed.detail.ends_with("boom"));
    }

    #[test]
    fn persistence_off_warns_per_gpu() {
        let mut inv = inventory(2, &[]);
        inv.gpus[1].persistence_mode = Some(false);
        let checks = persistence(&inv);
        assert_eq!(levels(&checks), [Level::Ok, Level::Warn]);
        assert!(checks[1].fix.as_ref().unwrap().contains("-i 1 -pm 1"));
    }

    #[test]
    fn device_nodes_must_carry_the_drivers_numbers() {
        let inv = inventory(2, &[(1, 2)]);
        let all = device_nodes(&inv, &inv.majors, &inv.nodes);
        assert!(all.iter().all(|c| c.level == Level::Ok), "{all:?}");
        assert_eq!(
            all.len(),
            9,
            "two GPUs, nvidiactl, 2 MIG devices' 2 caps each, nvidia-uvm and nvidia-uvm-tools"
        );

        let mut nodes = inv.nodes.clone();
        nodes.retain(|n| n.path != "/dev/nvidia1");
        nodes
            .iter_mut()
            .find(|n| n.path == "/dev/nvidia0")
            .unwrap()
            .minor = 9;
        let broken = device_nodes(&inv, &inv.majors, &nodes);
        assert_eq!(broken[0].detail, "is 195:9, want 195:0");
        assert_eq!(broken[1].detail, "missing (want 195:1)");

        let no_uvm = DeviceMajors {
            uvm: None,
            ..inv.majors.clone()
        };
        let last = device_nodes(&inv, &no_uvm, &inv.nodes).pop().unwrap();
        assert_eq!(
            (last.level, last.fix.as_deref()),
            (Level::Fail, Some("modprobe nvidia-uvm"))
        );
    }

    #[test]
    fn libraries_must_be_elf_of_their_class() {
        let inv = standard();
        let elf = |class: u8, machine: u16| Ok(elf_head(class, machine));
        let heads_for = |arch: Arch| -> Vec<(Library, LibraryHead)> {
            inv.files
                .libraries
                .iter()
                .map(|l| {
                    let class = if l.class == ElfClass::Lib64 { 2 } else { 1 };
                    (l.clone(), elf(class, arch.elf_machine(l.class)))
                })
                .collect()
        };
        let heads = heads_for(Arch::X86_64);
        assert_eq!(
            levels(&driver_files(&inv, Arch::X86_64, &heads)),
            [Level::Ok]
        );

        let mut bad = heads.clone();
        bad[0].1 = Ok(b"#!/bin/sh\n".to_vec());
        bad[1].1 = if bad[1].0.class == ElfClass::Lib64 {
            elf(1, 3)
        } else {
            elf(2, 62)
        };
        bad[2].1 = Err("Permission denied".into());
        let check = driver_files(&inv, Arch::X86_64, &bad).pop().unwrap();
        assert_eq!(check.level, Level::Fail);
        assert_eq!(check.detail.matches("; ").count(), 2, "{}", check.detail);
        assert!(check.detail.contains("not an ELF file"));
        assert!(check.detail.contains("ELF class"));
        assert!(check.detail.contains("unreadable (Permission denied)"));
        assert!(
            check
                .fix
                .unwrap()
                .starts_with("reinstall the NVIDIA driver")
        );

        let mut no_cuda = inv.clone();
        no_cuda
            .files
            .libraries
            .retain(|l| l.soname != "libcuda.so.1");
        let checks = driver_files(&no_cuda, Arch::X86_64, &heads);
        assert_eq!(checks[0].name, "driver libcuda.so.1");
        assert_eq!(checks[0].level, Level::Fail);
    }

    #[test]
    fn driver_libraries_of_another_architecture_fail() {
        let inv = standard();
        let heads = |machine: u16| -> Vec<(Library, LibraryHead)> {
            inv.files
                .libraries
                .iter()
                .filter(|l| l.class == ElfClass::Lib64)
                .map(|l| (l.clone(), Ok(elf_head(2, machine))))
                .collect()
        };
        // x86_64 libraries (EM_X86_64) on a Grace node, and aarch64 ones on an x86_64 node.
        let check = driver_files(&inv, Arch::Aarch64, &heads(62)).pop().unwrap();
        assert_eq!(check.level, Level::Fail);
        assert!(
            check
                .detail
                .contains("built for x86_64 on this aarch64 node"),
            "{}",
            check.detail
        );
        assert_eq!(
            check.fix.as_deref(),
            Some(
                "install the NVIDIA driver for aarch64 (the driver root holds another architecture's)"
            )
        );
        let check = driver_files(&inv, Arch::X86_64, &heads(183)).pop().unwrap();
        assert!(
            check
                .detail
                .contains("built for aarch64 on this x86_64 node")
        );
        // The 64-bit libraries of the node's own architecture pass.
        let check = driver_files(&inv, Arch::Aarch64, &heads(183))
            .pop()
            .unwrap();
        assert_eq!(check.level, Level::Ok, "{}", check.detail);
    }

    #[test]
    fn nvhook_binaries_of_another_architecture_fail() {
        let files = |machine: u16| -> Vec<(PathBuf, LibraryHead)> {
            [
                "/usr/bin/nvhook",
                "/usr/bin/nvhook-runtime",
                "/usr/bin/nvhook-nvml",
            ]
            .into_iter()
            .map(|p| (PathBuf::from(p), Ok(elf_head(2, machine))))
            .collect()
        };
        let ok = binaries("aarch64", &files(183));
        assert_eq!(ok.level, Level::Ok);
        assert_eq!(
            ok.detail,
            "/usr/bin/nvhook, /usr/bin/nvhook-runtime, /usr/bin/nvhook-nvml built for aarch64, as this node"
        );
        assert_eq!(binaries("x86_64", &files(62)).level, Level::Ok);

        // An amd64 package installed on a Grace node: every binary is named.
        let wrong = binaries("aarch64", &files(62));
        assert_eq!(wrong.level, Level::Fail);
        assert_eq!(wrong.detail.matches("built for x86_64").count(), 3);
        assert!(wrong.detail.ends_with("(this node runs aarch64)"));
        assert_eq!(
            wrong.fix.as_deref(),
            Some("install nvhook's arm64 .deb or aarch64 .rpm")
        );

        // One x86_64 helper among aarch64 binaries, and an unreadable one.
        let mut mixed = files(183);
        mixed[2].1 = Ok(elf_head(2, 62));
        mixed[1].1 = Err("Permission denied".into());
        let check = binaries("aarch64", &mixed);
        assert_eq!(check.level, Level::Fail);
        assert!(
            check
                .detail
                .starts_with("/usr/bin/nvhook-runtime: unreadable (Permission denied); /usr/bin/nvhook-nvml: built for x86_64"),
            "{}",
            check.detail
        );
        assert_eq!(
            binaries("x86_64", &files(183)).fix.as_deref(),
            Some("install nvhook's amd64 .deb or x86_64 .rpm")
        );

        let other = binaries("ppc64le", &files(21));
        assert_eq!(other.level, Level::Fail);
        assert!(other.detail.contains("\"ppc64le\""), "{}", other.detail);
    }

    #[test]
    fn a_runtime_configure_would_refuse_fails_and_is_never_proposed() {
        let beside = "/usr/bin/nvhook-runtime";
        assert_eq!(runtime_path(beside, true, beside), None);
        let missing = runtime_path("/nonexistent2/nvhook-runtime", false, beside).unwrap();
        assert_eq!(
            missing.to_string(),
            "FAIL nvhook-runtime: /nonexistent2/nvhook-runtime does not exist: an engine told to run it fails every container it starts with it -> fix: install nvhook's package (it puts nvhook-runtime beside nvhook, /usr/bin/nvhook-runtime), or name the installed one with --runtime-path"
        );
        let relative = runtime_path("nvhook-runtime", false, beside).unwrap();
        assert_eq!(
            relative.to_string(),
            "FAIL nvhook-runtime: --runtime-path \"nvhook-runtime\" is not absolute: engines do not look it up in PATH, and configure refuses it -> fix: name it by its full path, such as /usr/bin/nvhook-runtime"
        );

        let config = |refused: Option<&str>| EngineConfig {
            engine: "containerd",
            file: "/etc/containerd/config.toml".into(),
            configured: Ok(false),
            refused: refused.map(str::to_owned),
        };
        let proposed = engines(&[config(None)], "nvidia", beside, false);
        assert_eq!(
            proposed[0].fix.as_deref(),
            Some(
                "nvhook configure containerd --engine-config /etc/containerd/config.toml --runtime-path /usr/bin/nvhook-runtime, then restart it"
            )
        );
        // The fix configures the runtime doctor looked for, by its name.
        let named = engines(&[config(None)], "gpu", beside, false);
        assert_eq!(
            named[0].fix.as_deref(),
            Some(
                "nvhook configure containerd --engine-config /etc/containerd/config.toml --runtime-name gpu --runtime-path /usr/bin/nvhook-runtime, then restart it"
            )
        );
        let refused = engines(&[config(Some("install it first"))], "nvidia", beside, false);
        assert_eq!(refused[0].level, Level::Fail);
        assert_eq!(refused[0].fix.as_deref(), Some("install it first"));
        let flags = EngineConfig {
            configured: Err("not checked: --runtime-name \"a b\": ...".into()),
            ..config(Some("run nvhook doctor with other flags"))
        };
        let flags = engines(&[flags], "a b", beside, false);
        assert_eq!(
            flags[0].fix.as_deref(),
            Some("run nvhook doctor with other flags")
        );
    }

    #[test]
    fn a_spec_is_stale_when_its_names_or_nodes_are_not_the_nodes() {
        let node = |minor: Option<i64>| SpecNode {
            path: "/dev/nvidia0".into(),
            number: minor.map(|m| (195, m)),
        };
        let now = CurrentDevices {
            ids: vec![("0".into(), "GPU-a".into()), ("1".into(), "GPU-b".into())],
            nodes: vec![("0".into(), vec![node(Some(0))])],
            gpu_layout: Some("00000000000000aa".into()),
        };
        let spec = |names: &[&str], minor: Option<i64>| SpecFile {
            file: "/etc/cdi/nvidia.yaml".into(),
            devices: Ok(names
                .iter()
                .map(|n| (n.to_string(), vec![node(minor)]))
                .collect()),
            gpu_layout: None,
            args_file: None,
        };
        let checks = cdi(
            &[
                spec(&["0", "1", "all"], Some(0)),
                spec(&["GPU-a", "GPU-b", "2", "all"], Some(0)),
                spec(&["0", "GPU-b"], Some(5)),
                // Paths alone, as nvidia-ctk writes them.
                spec(&["0", "1", "all"], None),
            ],
            &now,
            "nvhook",
        );
        assert_eq!(
            levels(&checks),
            [Level::Ok, Level::Fail, Level::Fail, Level::Ok]
        );
        assert_eq!(
            checks[1].detail,
            "stale: names devices this node does not have: 2"
        );
        assert_eq!(checks[2].detail, "stale: device nodes changed for: 0");
        let missing = cdi(&[spec(&["0", "all"], Some(0))], &now, "nvhook");
        assert_eq!(missing[0].detail, "stale: lacks this node's devices: 1");
        // The same names and nodes, written for another GPU layout (MIG remade alike).
        let stamped = |stamp: &str| SpecFile {
            gpu_layout: Some(stamp.into()),
            ..spec(&["0", "1", "all"], Some(0))
        };
        let checks = cdi(
            &[stamped("00000000000000aa"), stamped("00000000000000bb")],
            &now,
            "nvhook",
        );
        assert_eq!(levels(&checks), [Level::Ok, Level::Fail]);
        assert_eq!(
            checks[1].detail,
            "stale: written for another GPU layout (00000000000000bb, now 00000000000000aa: GPUs or MIG instances changed), so nvhook refuses every start through it"
        );
        // The same names and nodes, the file of its hook's arguments gone.
        let without_args = SpecFile {
            args_file: Some("cannot read /etc/cdi/.nvidia.yaml.00000000000000cc.args".into()),
            ..spec(&["0", "1", "all"], Some(0))
        };
        let checks = cdi(&[without_args], &now, "nvhook");
        assert_eq!(levels(&checks), [Level::Fail]);
        assert!(
            checks[0].detail.contains("cannot use its argument file")
                && checks[0]
                    .detail
                    .contains(".nvidia.yaml.00000000000000cc.args"),
            "{}",
            checks[0].detail
        );
    }

    fn found(path: &str, execd: bool, version: Result<&str, QueryError>) -> RuntimeSearch {
        RuntimeSearch {
            names: vec!["runc".into(), "crun".into(), "youki".into()],
            dirs: vec!["/usr/sbin".into(), "/usr/bin".into()],
            found: vec![RuntimeBinary {
                path: path.into(),
                execd,
                version: version.map(String::from),
            }],
        }
    }

    #[test]
    fn a_runtime_without_escape_fixes_warns_with_the_upgrade() {
        let checks = runtimes(&found("/usr/sbin/runc", true, Ok(recorded::RUNC_DEBIAN_12)));
        assert_eq!(levels(&checks), [Level::Warn]);
        let check = &checks[0];
        assert_eq!(check.name, "runtime runc");
        assert!(
            check.detail.starts_with(
                "runc 1.1.5 at /usr/sbin/runc, which nvhook-runtime execs (built as 1.1.5+ds1, commit 1.1.5+ds1-1+deb12u1): upstream fixes missing for CVE-2024-21626 (fixed in 1.1.12); "
            ),
            "{}",
            check.detail
        );
        for words in [
            "CVE-2025-31133, CVE-2025-52565, CVE-2025-52881 (fixed in 1.2.8, 1.3.3, 1.4.0-rc.3)",
            "CVE-2026-41579 (fixed in 1.3.6, 1.4.3, 1.5.0-rc.3)",
            "distributions backport fixes without changing the version",
        ] {
            assert!(
                check.detail.contains(words),
                "{words:?} in {}",
                check.detail
            );
        }
        let fix = check.fix.as_deref().unwrap();
        assert!(fix.starts_with("upgrade runc to 1.3.6 or later, or check that your distribution's security advisories"), "{fix}");

        let crun = runtimes(&found("/usr/bin/crun", false, Ok(recorded::CRUN_DEBIAN_12)));
        assert_eq!(
            crun[0].detail,
            "crun 1.8.1 at /usr/bin/crun: upstream fixes missing for CVE-2025-24965 (fixed in 1.20); CVE-2026-47766 (fixed in 1.28); distributions backport fixes without changing the version, so a distribution's build may have them"
        );
        assert!(
            crun[0]
                .fix
                .as_deref()
                .unwrap()
                .starts_with("upgrade crun to 1.28 or later")
        );
    }

    #[test]
    fn a_runtime_with_every_fix_is_named_with_its_version() {
        let checks = runtimes(&found("/usr/bin/runc", false, Ok(recorded::RUNC_1_3_6)));
        assert_eq!(levels(&checks), [Level::Ok]);
        assert_eq!(
            checks[0].detail,
            "runc 1.3.6 at /usr/bin/runc: no container-escape fix in SECURITY.md's table is missing"
        );
        let youki = runtimes(&found(
            "/usr/local/bin/youki",
            false,
            Ok(recorded::YOUKI_0_7_0),
        ));
        assert_eq!(levels(&youki), [Level::Ok]);
        assert!(
            youki[0].detail.starts_with("youki 0.7.0 at "),
            "{}",
            youki[0].detail
        );
    }

    #[test]
    fn a_runtime_doctor_cannot_read_warns_and_another_is_only_named() {
        let gone = runtimes(&found(
            "/usr/sbin/runc",
            true,
            Err(QueryError::Spawn(
                std::io::ErrorKind::PermissionDenied.into(),
            )),
        ));
        assert_eq!(levels(&gone), [Level::Warn]);
        assert!(
            gone[0]
                .detail
                .starts_with("/usr/sbin/runc --version: cannot run it: ")
        );
        assert!(gone[0].fix.as_deref().unwrap().contains("SECURITY.md"));
        let garbled = runtimes(&found("/usr/sbin/runc", true, Ok("runc version dev\n")));
        assert_eq!(levels(&garbled), [Level::Warn]);
        assert!(garbled[0].detail.contains("\"dev\" is not a version"));
        let nothing = runtimes(&found("/usr/sbin/runc", true, Ok("")));
        assert_eq!(
            nothing[0].detail,
            "/usr/sbin/runc --version: it printed nothing"
        );

        let gvisor = runtimes(&found(
            "/usr/local/bin/runsc",
            true,
            Ok("runsc version release-20240513.0\nspec: 1.1.0-rc.1\n"),
        ));
        assert_eq!(levels(&gvisor), [Level::Ok]);
        assert!(
            gvisor[0]
                .detail
                .ends_with("not runc, crun or youki, whose fixes doctor knows")
        );
    }

    #[test]
    fn no_runtime_at_all_warns() {
        let none = RuntimeSearch {
            found: Vec::new(),
            ..found("/x", false, Ok(""))
        };
        let checks = runtimes(&none);
        assert_eq!(levels(&checks), [Level::Warn]);
        assert_eq!(
            checks[0].detail,
            "none of runc, crun, youki found (by absolute path, or in /usr/sbin:/usr/bin): nvhook-runtime has nothing to exec, and the runtime's fixes cannot be checked"
        );
    }

    #[test]
    fn cgroup_v2_needs_bpf() {
        assert_eq!(
            cgroup(&Cgroup {
                v2: false,
                bpf: false,
                pins: None
            })
            .level,
            Level::Ok
        );
        assert_eq!(
            cgroup(&Cgroup {
                v2: true,
                bpf: true,
                pins: None
            })
            .level,
            Level::Ok
        );
        assert_eq!(
            cgroup(&Cgroup {
                v2: true,
                bpf: false,
                pins: None
            })
            .level,
            Level::Fail
        );
    }

    #[test]
    fn cgroup_v2_says_where_device_programs_are_kept() {
        let v2 = |pins| {
            cgroup(&Cgroup {
                v2: true,
                bpf: true,
                pins,
            })
        };
        let dir = PathBuf::from("/sys/fs/bpf/nvhook");
        let kept = v2(Some((dir.clone(), Keeping::Kept(3))));
        assert_eq!(kept.level, Level::Ok);
        assert!(
            kept.detail.ends_with(
                "device programs: kept for the next container in /sys/fs/bpf/nvhook (3 now)"
            ),
            "{}",
            kept.detail
        );
        let none = v2(Some((dir, Keeping::NoBpffs)));
        assert_eq!(none.level, Level::Ok, "an optimisation, not a fault");
        assert!(
            none.detail.contains("/sys/fs/bpf is not a bpffs"),
            "{}",
            none.detail
        );
        assert!(v2(None).detail.contains("device-program-pins = \"\""));
    }

    #[test]
    fn the_dra_plugin_is_optional_ok_when_serving_and_fails_when_its_socket_is_dead() {
        let socket = "/var/lib/kubelet/plugins_registry/gpu.nvidia.com-reg.sock";
        let check = |state| dra_plugin("gpu.nvidia.com", socket, &state);

        let missing = check(PluginSocket::Missing);
        assert_eq!(missing.level, Level::Ok);
        assert!(
            missing.detail.starts_with("not installed: no "),
            "{missing}"
        );
        assert!(missing.detail.contains(socket), "{missing}");
        assert_eq!(missing.fix, None);

        let serving = check(PluginSocket::Accepts);
        assert_eq!(serving.level, Level::Ok);
        assert!(
            serving
                .detail
                .contains("gpu.nvidia.com registered and serving")
        );
        assert_eq!(serving.fix, None);

        let dead = check(PluginSocket::Refuses {
            denied: false,
            error: "Connection refused (os error 111)".into(),
        });
        assert_eq!(dead.level, Level::Fail);
        assert!(dead.detail.contains("Connection refused"), "{dead}");
        assert!(dead.detail.contains(socket), "{dead}");
        let fix = dead.fix.as_deref().unwrap();
        assert!(fix.contains("restart the nvhook-dra pod"), "{fix}");
        assert!(fix.contains("kubectl -n nvhook-system delete pod"), "{fix}");

        // Not allowed to look is not a dead plugin: no restart proposed.
        let denied = check(PluginSocket::Refuses {
            denied: true,
            error: "Permission denied (os error 13)".into(),
        });
        assert_eq!(denied.level, Level::Warn);
        assert_eq!(denied.fix.as_deref(), Some("run nvhook doctor as root"));
    }

    #[test]
    fn the_policy_is_one_sentence_of_the_config() {
        let hardened = Config {
            accept_env_when_unprivileged: false,
            ..Config::default()
        };
        let line = policy(&hardened).detail;
        assert!(line.starts_with("NVIDIA_VISIBLE_DEVICES selects GPUs only for privileged containers, the device plugin's"));
        assert!(!line.contains('\n'));
    }

    #[test]
    fn memory_limits_say_whether_a_container_that_asks_is_served_refused_or_unlimited() {
        let check = memory_limits(OnThisNode::Enforced, GpuMemoryLimits::Enforce);
        assert_eq!(check.level, super::super::Level::Ok);
        let check = memory_limits(OnThisNode::DriverLacksTheCall, GpuMemoryLimits::Enforce);
        assert_eq!(check.level, super::super::Level::Ok);
        assert!(check.detail.contains("is refused"), "{}", check.detail);
        assert!(check.detail.contains("nvmlDeviceSetMemoryLimits_v1"));
        let check = memory_limits(OnThisNode::CgroupV1, GpuMemoryLimits::BestEffort);
        assert_eq!(check.level, super::super::Level::Ok);
        assert!(
            check.detail.contains("starts unlimited"),
            "{}",
            check.detail
        );
        let check = memory_limits(OnThisNode::Off, GpuMemoryLimits::Off);
        assert!(check.detail.contains("off in nvhook's config"));
    }
}
