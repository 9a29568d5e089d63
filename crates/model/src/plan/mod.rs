//! Request × Inventory × Config → Plan: everything a GPU container needs, as plain data.
//!
//! Pure: no I/O here. The hook applies a plan, nvhook-runtime writes part of one into
//! config.json, and `nvhook plan` prints one.

use crate::capability::Capability;
use crate::device_rule::DeviceRule;
use crate::inventory::GLX_SERVER;
use crate::inventory::{Gpu, HostFile, HostNode, Inventory, MigDevice};
use crate::inventory::{MODESET_MINOR, NVIDIACTL_MINOR};
use crate::request::{
    DEVICE_MOUNT_ROOT, DeviceId, DeviceSelection, GpuFacts, MemoryLimits, Request, SelectionSource,
    VISIBLE_DEVICES, Version,
};
use crate::shown::Shown;
use nvhook_ldcache::{Arch, ElfClass};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};

pub mod compat;
pub mod driver_dirs;
pub mod shadow;
pub use compat::{CompatDir, CudaCompat};
pub use driver_dirs::DriverDirs;

/// Every mount nvhook makes is a read-only, private bind that cannot carry setuid or devices.
pub const MOUNT_OPTIONS: &[&str] = &["ro", "nosuid", "nodev", "rbind", "rprivate"];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub driver_version: String,
    /// What was selected, for logs and `nvhook plan`.
    pub selected: Vec<Selected>,
    pub layout: Layout,
    pub devices: Vec<DeviceNode>,
    pub cgroup_rules: Vec<DeviceRule>,
    pub mounts: Vec<Mount>,
    pub symlinks: Vec<Symlink>,
    /// Entries to add to the image's /etc/ld.so.cache (when it has one).
    pub ldcache: Vec<CacheEntry>,
    /// `/etc/ld.so.conf.d` files keeping non-default library dirs (and a used CUDA compat
    /// directory, first) across an ldconfig run in the image.
    pub ld_so_confs: Vec<LdSoConf>,
    pub proc_overlay: Option<ProcOverlay>,
    /// What became of the image's CUDA forward-compatibility libraries, when it has some.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_compat: Option<CudaCompat>,
    /// Optional extras the request asked for that this host lacks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<Skipped>,
    /// The GPU memory limits the request asked for, set on each selected GPU for the
    /// container's cgroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limits: Option<MemoryLimits>,
}

/// Something asked for and left out, with the reason, for logs and `nvhook plan`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    pub what: String,
    pub why: String,
}

/// A device node as the container's spec lists it in `linux.devices` (numbers optional there).
pub type ListedNode<'a> = (&'a Path, Option<i64>, Option<i64>);

impl Plan {
    /// Points the loader at the image's compat libraries where [`compat::apply`] says so.
    fn apply_cuda_compat(&mut self, found: &CompatDir, inventory: &Inventory) {
        let host_files: Vec<(&str, &str)> = inventory
            .files
            .libraries
            .iter()
            .filter(|l| l.class == ElfClass::Lib64)
            .map(|l| (l.soname.as_str(), l.file_name.as_str()))
            .collect();
        let (decision, conf) = compat::apply(
            found,
            &self.driver_version,
            self.layout.ldcache,
            &host_files,
            &mut self.ldcache,
        );
        decision.log();
        // First, so that an ldconfig run in the image reads the compat directory first.
        self.ld_so_confs.splice(0..0, conf);
        self.cuda_compat = Some(decision);
    }

    /// The device nodes the hook must make itself, and the cgroup rules for them: those not
    /// listed in the spec already. nvhook-runtime lists its nodes there so the runtime makes
    /// them and owns their rules (they then survive `runc update`).
    pub fn left_to_hook<'a, 'b>(
        &'a self,
        listed: impl IntoIterator<Item = ListedNode<'b>>,
    ) -> (Vec<&'a DeviceNode>, Vec<DeviceRule>) {
        // Sets, so that a node with hundreds of MIG devices costs no quadratic term.
        let listed: HashSet<ListedNode> = listed.into_iter().collect();
        let nodes: Vec<&DeviceNode> = self
            .devices
            .iter()
            .filter(|d| {
                let key = (
                    Path::new(&d.path),
                    Some(d.major.into()),
                    Some(d.minor.into()),
                );
                !listed.contains(&key)
            })
            .collect();
        let ours: HashSet<(u32, u32)> = nodes.iter().map(|d| (d.major, d.minor)).collect();
        let rules = self
            .cgroup_rules
            .iter()
            .filter(|r| ours.contains(&(r.major, r.minor)))
            .copied()
            .collect();
        (nodes, rules)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Selected {
    /// `0` for a GPU, `0:1` for a MIG device.
    pub id: String,
    pub uuid: String,
    pub pci_bus_id: String,
}

/// Where the image's loader looks for libraries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    /// The architecture of the image's loader (the host's): Debian's directory names and the
    /// loader cache's flags follow it.
    #[serde(default)]
    pub arch: Arch,
    pub lib64_dir: String,
    pub lib32_dir: String,
    /// The image has a glibc loader cache to update.
    pub ldcache: bool,
    /// Set for CDI specs, which serve any image: libraries then keep their directory on the
    /// host, relative to this canonical driver root (as NVIDIA's CDI specs do), and the
    /// hook's cache and ld.so.conf.d entries make the loader find them there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_driver_root: Option<PathBuf>,
    /// Set for containers no nvhook process will see (NRI's hookless mode): each library is
    /// mounted under its SONAME in the loader's default directories of both image families,
    /// so that neither a link nor a cache entry is needed (see [`Layout::at_sonames`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub at_sonames: bool,
    /// With `at_sonames`: the driver directories the image's environment searches, which
    /// then hold its libraries and binaries instead of the image's own directories.
    #[serde(default, skip_serializing_if = "DriverDirs::is_none")]
    pub driver_dirs: DriverDirs,
}

/// What the plan needs to know about the image, probed safely by the caller.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageInfo {
    pub debian: bool,
    pub has_usr_lib64: bool,
    pub has_ldcache: bool,
    /// The image's CUDA compat directory, when it has one and it was looked for.
    pub cuda_compat: Option<CompatDir>,
}

impl Layout {
    /// The directories of an image probed as `image`, whose loader is `arch`'s.
    pub fn for_image(image: &ImageInfo, arch: Arch) -> Layout {
        let (lib64, lib32) = if image.debian {
            (
                format!("/usr/lib/{}", arch.multiarch(ElfClass::Lib64)),
                format!("/usr/lib/{}", arch.multiarch(ElfClass::Lib32)),
            )
        } else if image.has_usr_lib64 {
            // Fedora, RHEL, SUSE: the same on x86_64 and aarch64.
            ("/usr/lib64".into(), "/usr/lib".into())
        } else {
            // musl and static images: the loader's default path.
            ("/usr/lib".into(), "/usr/lib32".into())
        };
        Layout {
            arch,
            lib64_dir: lib64,
            lib32_dir: lib32,
            ldcache: image.has_ldcache,
            host_driver_root: None,
            at_sonames: false,
            driver_dirs: DriverDirs::default(),
        }
    }

    /// Libraries under their SONAMEs where glibc's loader looks with no cache entry: the
    /// Debian family's multiarch directory (`/usr/lib/x86_64-linux-gnu`) and the Fedora
    /// family's `/usr/lib64` (`/usr/lib` for 32-bit), each library in both, as the image is
    /// not known. No link, no cache entry, no ld.so.conf.d file: nothing for a hook to do.
    /// Where the image's environment names a driver directory (`driver_dirs`), the libraries
    /// or binaries go there alone.
    pub fn at_sonames(arch: Arch, driver_dirs: DriverDirs) -> Layout {
        Layout {
            lib64_dir: format!("/usr/lib/{}", arch.multiarch(ElfClass::Lib64)),
            lib32_dir: format!("/usr/lib/{}", arch.multiarch(ElfClass::Lib32)),
            ldcache: false,
            at_sonames: true,
            driver_dirs,
            ..Layout::for_image(&ImageInfo::default(), arch)
        }
    }

    /// The directories a library of `class` is mounted in by an [`Layout::at_sonames`] layout.
    fn soname_dirs(&self, class: ElfClass) -> [&str; 2] {
        match class {
            ElfClass::Lib64 => [&self.lib64_dir, "/usr/lib64"],
            ElfClass::Lib32 => [&self.lib32_dir, "/usr/lib"],
        }
    }

    /// Libraries at their host paths under `driver_root` (canonical), for an image not known
    /// yet; the cache entries are written when the image turns out to have a cache.
    pub fn host_paths(driver_root: PathBuf, arch: Arch) -> Layout {
        Layout {
            host_driver_root: Some(driver_root),
            ..Layout::for_image(
                &ImageInfo {
                    has_ldcache: true,
                    ..ImageInfo::default()
                },
                arch,
            )
        }
    }

    /// Where `lib` goes in the container.
    fn lib_dir(&self, lib: &crate::inventory::Library) -> String {
        let host_dir = self.host_driver_root.as_ref().and_then(|root| {
            let relative = lib.host_path.parent()?.strip_prefix(root).ok()?;
            Some(format!("/{}", relative.display()))
        });
        host_dir.unwrap_or_else(|| self.dir(lib.class).to_string())
    }

    fn dir(&self, class: ElfClass) -> &str {
        match class {
            ElfClass::Lib64 => &self.lib64_dir,
            ElfClass::Lib32 => &self.lib32_dir,
        }
    }
}

impl ImageInfo {
    /// Whether this image, which has no loader cache of its own, needs one for `entries`: a
    /// static spec keeps libraries at their host paths (`/usr/local/nvidia/lib64` on GKE,
    /// `/usr/lib64` on a Fedora host), where the image's loader may not look without a cache.
    /// Only the directory an image-aware plan would choose ([`Layout::for_image`]) is taken
    /// as searched: the loader's built-in path differs between glibc builds.
    pub fn needs_cache_for(&self, arch: Arch, entries: &[CacheEntry]) -> bool {
        if self.has_ldcache {
            return false;
        }
        let searched = Layout::for_image(self, arch);
        entries
            .iter()
            .any(|e| e.path.rsplit_once('/').map(|(dir, _)| dir) != Some(searched.dir(e.class)))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceNode {
    /// In the container.
    pub path: String,
    /// On the host, checked against when the node is made.
    pub host_path: PathBuf,
    pub major: u32,
    pub minor: u32,
    pub mode: u32,
}

impl From<&HostNode> for DeviceNode {
    fn from(n: &HostNode) -> DeviceNode {
        DeviceNode {
            path: n.path.clone(),
            host_path: n.host_path.clone(),
            major: n.major,
            minor: n.minor,
            mode: n.mode,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MountKind {
    File,
    Socket,
    Dir,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    pub source: PathBuf,
    pub destination: String,
    pub kind: MountKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Symlink {
    pub path: String,
    /// Relative to the link's directory: a name beside it, or `../name` from a subdirectory;
    /// or absolute in the container, for a file kept at its host path (WSL2's nvidia-smi).
    pub target: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheEntry {
    pub soname: String,
    pub path: String,
    pub class: ElfClass,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LdSoConf {
    pub path: String,
    pub dirs: Vec<String>,
}

/// A tmpfs over the container's /proc/driver/nvidia holding what the selected GPUs need.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcOverlay {
    /// Host's `<proc-root>/driver/nvidia`.
    pub host_dir: PathBuf,
    /// Bus ids of the selected GPUs (`gpus/<busid>` directories bound read-only).
    pub gpus: Vec<String>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlanError {
    #[error("{origin}: no such GPU (this node has {have})")]
    NoSuchDevice {
        /// Where the container named the device: `NVIDIA_VISIBLE_DEVICES=<id>` or the device
        /// plugin's `volume mount <path>`, built with an [`Shown`] of the id.
        origin: String,
        have: String,
    },
    #[error("{unsatisfied} ({have})")]
    Unsatisfied { unsatisfied: String, have: String },
    #[error(
        "device node {path} is missing under dev-root {dev_root} or is not {major}:{minor} (is the NVIDIA driver loaded? run nvidia-modprobe)"
    )]
    MissingNode {
        path: String,
        dev_root: String,
        major: u32,
        minor: u32,
    },
    #[error(
        "{origin}: on WSL2 every GPU is reached through the one /dev/dxg, so a container cannot be given some of them (ask for all: {all})"
    )]
    WslNeedsAll {
        origin: String,
        /// The same request for every GPU, as the container would spell it.
        all: String,
    },
    #[error(
        "/proc/devices lists no nvidia character device: the NVIDIA kernel module is not loaded (load it: nvidia-modprobe)"
    )]
    NoNvidiaMajor,
    #[error(
        "GPU {index} has no device node: NVML reports no minor number for it (a WSL2 host needs /dev/dxg and NVIDIA's driver store under /usr/lib/wsl/drivers; run nvhook doctor)"
    )]
    NoMinor { index: u32 },
    #[error(
        "compute needs /dev/nvidia-uvm but /proc/devices has no nvidia-uvm (load the module: nvidia-modprobe -u -c=0)"
    )]
    NoUvm,
    #[error(
        "{what} needs the nvidia-caps device, which this host's driver does not expose (/proc/devices has no nvidia-caps)"
    )]
    NoCapsMajor { what: String },
    #[error(
        "NVIDIA_IMEX_CHANNELS={value}: this host's driver has no IMEX channels (/proc/devices has no nvidia-caps-imex-channels; IMEX needs driver 550 or later)"
    )]
    NoImexMajor { value: Shown },
    #[error(
        "NVIDIA_IMEX_CHANNELS: IMEX channel {channel} does not exist on this host (it has {have}; ask for one it has, or all)"
    )]
    NoSuchImexChannel { channel: u32, have: String },
    #[error(
        "capability {capability} needs {soname}, which the driver root does not have (is the driver installed completely? run ldconfig in the driver root)"
    )]
    MissingLibrary {
        capability: Capability,
        soname: &'static str,
    },
}

/// A GPU or MIG device chosen by the request.
enum Choice<'a> {
    Gpu(&'a Gpu),
    Mig(&'a Gpu, &'a MigDevice),
}

impl Choice<'_> {
    fn parent(&self) -> &Gpu {
        match self {
            Choice::Gpu(g) | Choice::Mig(g, _) => g,
        }
    }

    fn selected(&self) -> Selected {
        match self {
            Choice::Gpu(g) => Selected {
                id: g.index.to_string(),
                uuid: g.uuid.clone(),
                pci_bus_id: g.pci_bus_id.clone(),
            },
            Choice::Mig(g, m) => Selected {
                id: format!("{}:{}", g.index, m.index),
                uuid: m.uuid.clone(),
                pci_bus_id: g.pci_bus_id.clone(),
            },
        }
    }
}

/// Computes the plan for `request` on this host, for an image probed as `image`.
pub fn build(
    request: &Request,
    inventory: &Inventory,
    dev_root: &str,
    image: ImageInfo,
) -> Result<Plan, PlanError> {
    let layout = Layout::for_image(&image, inventory.arch);
    let mut plan = build_with_layout(request, inventory, dev_root, layout)?;
    if let Some(found) = &image.cuda_compat {
        match inventory.wsl {
            None => plan.apply_cuda_compat(found, inventory),
            Some(_) => plan.skipped.push(wsl::compat_skipped(found)),
        }
    }
    Ok(plan)
}

/// Computes the plan for `request` with libraries placed as `layout` says.
pub fn build_with_layout(
    request: &Request,
    inventory: &Inventory,
    dev_root: &str,
    layout: Layout,
) -> Result<Plan, PlanError> {
    if let Some(driver) = &inventory.wsl {
        return wsl::build(request, inventory, driver, layout);
    }
    let choices = select(&request.devices, request.source, inventory)?;
    check_requirements(request, inventory, &choices)?;
    let nodes = NodeFinder {
        inventory,
        dev_root,
    };
    let mut devices = device_nodes(request, inventory, &choices, &nodes)?;
    let (extra, mut skipped) = imex_and_families::nodes(request, inventory)?;
    devices.extend(extra);
    skipped.extend(compat32_skipped(request, layout.arch));
    let mut builder = FileBuilder {
        layout: &layout,
        mounts: Vec::new(),
        symlinks: Vec::new(),
        ldcache: Vec::new(),
    };
    builder.add_driver_files(request, inventory, !choices.is_empty())?;
    let files = Files {
        mounts: builder.mounts,
        symlinks: builder.symlinks,
        ldcache: builder.ldcache,
    };
    let gathered = Gathered {
        devices,
        files,
        proc_overlay: proc_overlay(inventory, &choices),
        skipped,
    };
    Ok(assemble(request, inventory, &choices, layout, gathered))
}

/// The files a plan gives a container: bind mounts, links and loader cache entries.
struct Files {
    mounts: Vec<Mount>,
    symlinks: Vec<Symlink>,
    ldcache: Vec<CacheEntry>,
}

/// What a builder gathered for the chosen devices.
struct Gathered {
    devices: Vec<DeviceNode>,
    files: Files,
    proc_overlay: Option<ProcOverlay>,
    skipped: Vec<Skipped>,
}

/// The plan made of what a builder gathered: a cgroup rule for each node, and the
/// `ld.so.conf.d` files that keep its library directories in an image's later ldconfig.
fn assemble(
    request: &Request,
    inventory: &Inventory,
    choices: &[Choice],
    layout: Layout,
    gathered: Gathered,
) -> Plan {
    let Gathered {
        devices,
        files,
        proc_overlay,
        skipped,
    } = gathered;
    let ld_so_confs = ld_so_conf(&layout, &files.ldcache).into_iter().collect();
    Plan {
        driver_version: inventory.driver_version.clone(),
        selected: choices.iter().map(Choice::selected).collect(),
        cgroup_rules: devices
            .iter()
            .map(|d| DeviceRule::char_rw(d.major, d.minor))
            .collect(),
        devices,
        mounts: files.mounts,
        symlinks: files.symlinks,
        ldcache: files.ldcache,
        ld_so_confs,
        proc_overlay,
        layout,
        cuda_compat: None,
        skipped,
        memory_limits: request.memory_limits,
    }
}

fn select<'a>(
    selection: &DeviceSelection,
    source: SelectionSource,
    inventory: &'a Inventory,
) -> Result<Vec<Choice<'a>>, PlanError> {
    let mut out: Vec<Choice<'a>> = Vec::new();
    let ids = match selection {
        DeviceSelection::NoDevices => return Ok(out),
        DeviceSelection::All => {
            for gpu in &inventory.gpus {
                out.push(Choice::Gpu(gpu));
                out.extend(gpu.mig_devices.iter().map(|m| Choice::Mig(gpu, m)));
            }
            return Ok(out);
        }
        DeviceSelection::List(ids) => ids,
    };
    for id in ids {
        let choice = resolve(id, inventory).ok_or_else(|| PlanError::NoSuchDevice {
            origin: origin(source, &id.to_string()),
            have: describe_gpus(inventory),
        })?;
        let key = choice.selected().uuid;
        if !out.iter().any(|c| c.selected().uuid == key) {
            out.push(choice);
        }
    }
    Ok(out)
}

/// Where the container named device `id`, for a message: a pod with the device plugin's
/// mounts has no NVIDIA_VISIBLE_DEVICES to look for.
fn origin(source: SelectionSource, id: &str) -> String {
    let id = Shown(id.to_string());
    match source {
        SelectionSource::Env => format!("{VISIBLE_DEVICES}={id}"),
        SelectionSource::VolumeMounts => format!("volume mount {DEVICE_MOUNT_ROOT}/{id}"),
        SelectionSource::CliFlag => format!("--device={id}"),
    }
}

fn resolve<'a>(id: &DeviceId, inventory: &'a Inventory) -> Option<Choice<'a>> {
    let gpus = &inventory.gpus;
    let migs = || {
        gpus.iter()
            .flat_map(|g| g.mig_devices.iter().map(move |m| (g, m)))
    };
    match id {
        DeviceId::Index(i) => gpus.iter().find(|g| g.index == *i).map(Choice::Gpu),
        DeviceId::GpuUuid(u) => gpus
            .iter()
            .find(|g| g.uuid.eq_ignore_ascii_case(u))
            .map(Choice::Gpu),
        DeviceId::PciBusId(b) => gpus
            .iter()
            .find(|g| g.pci_bus_id.eq_ignore_ascii_case(b))
            .map(Choice::Gpu),
        DeviceId::MigUuid(u) => migs()
            .find(|(_, m)| m.uuid.eq_ignore_ascii_case(u))
            .map(|(g, m)| Choice::Mig(g, m)),
        DeviceId::MigIndex { gpu, mig } => migs()
            .find(|(g, m)| g.index == *gpu && m.index == *mig)
            .map(|(g, m)| Choice::Mig(g, m)),
    }
}

/// "0-3" style summary of the GPUs (and MIG devices) a node has, for error messages.
fn describe_gpus(inventory: &Inventory) -> String {
    let n = inventory.gpus.len();
    let mut s = match n {
        0 => "no GPU".to_string(),
        1 => "GPU 0".to_string(),
        _ => format!("{}-{}", 0, n - 1),
    };
    let migs: Vec<String> = inventory
        .gpus
        .iter()
        .flat_map(|g| {
            g.mig_devices
                .iter()
                .map(move |m| format!("{}:{}", g.index, m.index))
        })
        .collect();
    if !migs.is_empty() {
        s.push_str(&format!(" and MIG devices {}", migs.join(",")));
    }
    s
}

fn check_requirements(
    request: &Request,
    inventory: &Inventory,
    choices: &[Choice],
) -> Result<(), PlanError> {
    let cuda = Version::parse_lenient(&inventory.cuda_version);
    let driver = Version::parse_lenient(&inventory.driver_version);
    let host = format!(
        "this host's driver is {} and supports CUDA {}",
        inventory.driver_version, inventory.cuda_version
    );
    let unsatisfied = |u: crate::request::Unsatisfied, have: String| PlanError::Unsatisfied {
        unsatisfied: u.to_string(),
        have,
    };
    // With no GPU selected ("none") only the host-wide conditions can be judged.
    if choices.is_empty() {
        return request
            .requirements
            .check_without_gpu(&cuda, &driver)
            .map_err(|u| unsatisfied(u, host));
    }
    for choice in choices {
        let gpu = choice.parent();
        let facts = GpuFacts {
            cuda: cuda.clone(),
            driver: driver.clone(),
            arch: Version::parse_lenient(&gpu.compute_capability),
            brand: gpu.brand.clone(),
        };
        request.requirements.check(&facts).map_err(|u| {
            unsatisfied(
                u,
                format!(
                    "{host}; GPU {} has compute capability {} and brand {}",
                    gpu.index, gpu.compute_capability, gpu.brand
                ),
            )
        })?;
    }
    Ok(())
}

struct NodeFinder<'a> {
    inventory: &'a Inventory,
    dev_root: &'a str,
}

impl NodeFinder<'_> {
    /// The host node at `path`, which must be a char device `major:minor`.
    fn get(&self, path: &str, major: u32, minor: u32) -> Result<DeviceNode, PlanError> {
        self.inventory
            .nodes
            .iter()
            .find(|n: &&HostNode| n.path == path && n.major == major && n.minor == minor)
            .map(DeviceNode::from)
            .ok_or_else(|| PlanError::MissingNode {
                path: path.into(),
                dev_root: self.dev_root.into(),
                major,
                minor,
            })
    }

    fn cap(&self, what: &str, minor: u32) -> Result<DeviceNode, PlanError> {
        let major = self
            .inventory
            .majors
            .caps
            .ok_or_else(|| PlanError::NoCapsMajor { what: what.into() })?;
        self.get(&format!("/dev/nvidia-caps/nvidia-cap{minor}"), major, minor)
    }
}

fn device_nodes(
    request: &Request,
    inventory: &Inventory,
    choices: &[Choice],
    nodes: &NodeFinder,
) -> Result<Vec<DeviceNode>, PlanError> {
    let nvidia = inventory.majors.nvidia.ok_or(PlanError::NoNvidiaMajor)?;
    let caps = &request.capabilities;
    let mut out = vec![nodes.get("/dev/nvidiactl", nvidia, NVIDIACTL_MINOR)?];
    if caps.contains(&Capability::Compute) {
        let uvm = inventory.majors.uvm.ok_or(PlanError::NoUvm)?;
        out.push(nodes.get("/dev/nvidia-uvm", uvm, 0)?);
        out.push(nodes.get("/dev/nvidia-uvm-tools", uvm, 1)?);
    }
    // Headless hosts (most data-centre GPUs) have no modeset node, and images ask for
    // `all`: like nvidia-container-cli, display then goes without it instead of failing.
    if caps.contains(&Capability::Display) {
        match nodes.get("/dev/nvidia-modeset", nvidia, MODESET_MINOR) {
            Ok(node) => out.push(node),
            Err(e) => tracing::info!("capability display without its device node: {e}"),
        }
    }
    // A whole GPU's DRM nodes serve Vulkan, EGL and GBM; a host without nvidia-drm has none,
    // and the GPU works without them (an extra, never a reason to fail).
    if caps.contains(&Capability::Graphics) || caps.contains(&Capability::Display) {
        for choice in choices {
            if let Choice::Gpu(gpu) = choice {
                out.extend(
                    inventory
                        .drm_nodes
                        .iter()
                        .filter(|d| d.pci_bus_id == gpu.pci_bus_id)
                        .map(|d| DeviceNode::from(&d.node)),
                );
            }
        }
    }
    for choice in choices {
        let gpu = choice.parent();
        let minor = gpu.minor.ok_or(PlanError::NoMinor { index: gpu.index })?;
        out.push(nodes.get(&format!("/dev/nvidia{minor}"), nvidia, minor)?);
        if let Choice::Mig(_, mig) = choice {
            let what = format!("MIG device {}", mig.uuid);
            for minor in [mig.gi_cap_minor, mig.ci_cap_minor] {
                let minor = minor.ok_or_else(|| PlanError::NoCapsMajor { what: what.clone() })?;
                out.push(nodes.cap(&what, minor)?);
            }
        }
    }
    for (wanted, minor, what) in [
        (
            &request.mig_config,
            inventory.mig_config_minor,
            "NVIDIA_MIG_CONFIG_DEVICES",
        ),
        (
            &request.mig_monitor,
            inventory.mig_monitor_minor,
            "NVIDIA_MIG_MONITOR_DEVICES",
        ),
    ] {
        if wanted.is_some() {
            let minor = minor.ok_or_else(|| PlanError::NoCapsMajor { what: what.into() })?;
            out.push(nodes.cap(what, minor)?);
        }
    }
    let mut seen = BTreeSet::new();
    out.retain(|d| seen.insert(d.path.clone()));
    Ok(out)
}

struct FileBuilder<'a> {
    layout: &'a Layout,
    mounts: Vec<Mount>,
    symlinks: Vec<Symlink>,
    ldcache: Vec<CacheEntry>,
}

impl FileBuilder<'_> {
    fn add_driver_files(
        &mut self,
        request: &Request,
        inventory: &Inventory,
        any_gpu: bool,
    ) -> Result<(), PlanError> {
        let caps = &request.capabilities;
        // Where the architecture has no 32-bit driver libraries, compat32 was skipped (see
        // [`compat32_skipped`]) and only the 64-bit ones go in.
        let compat32 = caps.contains(&Capability::Compat32) && self.layout.arch.has_compat32();
        for &cap in caps {
            // Display brings the graphics stack; compat32 only adds 32-bit copies of the others.
            let lib_cap = if cap == Capability::Display {
                Capability::Graphics
            } else {
                cap
            };
            for lib in inventory.libraries(lib_cap) {
                if lib.class == ElfClass::Lib32 && !compat32 {
                    continue;
                }
                self.add_library(lib);
            }
            let files = &inventory.files;
            let bin_dir = self
                .layout
                .driver_dirs
                .bin_dir()
                .filter(|_| self.layout.at_sonames);
            for f in files
                .binaries
                .iter()
                .filter(|f| f.capability == Some(lib_cap))
            {
                match (bin_dir, f.container_path.rsplit_once('/')) {
                    (Some(dir), Some((_, name))) => {
                        self.add_file_at(&f.host_path, &format!("{dir}/{name}"))
                    }
                    _ => self.add_file(f, MountKind::File),
                }
            }
            for f in files
                .configs
                .iter()
                .chain(&files.xorg_modules)
                .filter(|f| f.capability == Some(lib_cap))
            {
                self.add_file(f, MountKind::File);
            }
            for f in files.sockets.iter().filter(|f| f.capability == Some(cap)) {
                let kind = if f.is_dir {
                    MountKind::Dir
                } else {
                    MountKind::Socket
                };
                self.add_file(f, kind);
            }
            if let Some(soname) = required_library(cap)
                && !inventory
                    .libraries(lib_cap)
                    .any(|l| l.soname == soname && l.class == ElfClass::Lib64)
            {
                return Err(PlanError::MissingLibrary {
                    capability: cap,
                    soname,
                });
            }
        }
        if caps.contains(&Capability::Graphics) || caps.contains(&Capability::Display) {
            self.add_graphics_links(inventory);
        }
        if any_gpu {
            for f in &inventory.files.firmware {
                self.add_file(f, MountKind::File);
            }
        }
        Ok(())
    }

    /// The names the graphics loaders open that no SONAME gives: GBM's backend, Xorg's GLX
    /// module, and the libraries configs name by absolute path.
    fn add_graphics_links(&mut self, inventory: &Inventory) {
        let allocator = self
            .ldcache
            .iter()
            .find(|e| e.soname == "libnvidia-allocator.so.1" && e.class == ElfClass::Lib64);
        if let Some((dir, soname)) = allocator.and_then(|e| e.path.rsplit_once('/')) {
            self.symlinks.push(Symlink {
                path: format!("{dir}/gbm/nvidia-drm_gbm.so"),
                target: format!("../{soname}"),
            });
        }
        for module in &inventory.files.xorg_modules {
            if let Some((dir, name)) = module.container_path.rsplit_once('/')
                && name.starts_with(&format!("{GLX_SERVER}."))
            {
                self.symlinks.push(Symlink {
                    path: format!("{dir}/{GLX_SERVER}"),
                    target: name.to_string(),
                });
            }
        }
        for wanted in &inventory.files.config_library_paths {
            if !self.mounts.iter().any(|m| m.destination == wanted.config) {
                continue;
            }
            let name = wanted.library_path.rsplit('/').next().unwrap_or_default();
            let library =
                inventory.files.libraries.iter().find(|l| {
                    l.class == ElfClass::Lib64 && (l.soname == name || l.file_name == name)
                });
            match library {
                Some(lib) => self.add_file_at(&lib.host_path, &wanted.library_path),
                None => tracing::warn!(
                    config = %wanted.config,
                    "library_path {} names no driver library: the loader may not find it",
                    wanted.library_path
                ),
            }
        }
    }

    fn add_library(&mut self, lib: &crate::inventory::Library) {
        if self.layout.at_sonames {
            match self.layout.driver_dirs.lib_dir(lib.class) {
                Some(dir) => self.add_file_at(&lib.host_path, &format!("{dir}/{}", lib.soname)),
                None => {
                    for dir in self.layout.soname_dirs(lib.class) {
                        self.add_file_at(&lib.host_path, &format!("{dir}/{}", lib.soname));
                    }
                }
            }
            return;
        }
        let dir = self.layout.lib_dir(lib);
        let destination = format!("{dir}/{}", lib.file_name);
        // One file may carry several names (`libcuda.so.1` and a second cache entry): it is
        // mounted once, and each name still gets its link and cache entry.
        if !self.mounts.iter().any(|m| m.destination == destination) {
            self.mounts.push(Mount {
                source: lib.host_path.clone(),
                destination,
                kind: MountKind::File,
            });
        }
        if self
            .ldcache
            .iter()
            .any(|e| e.soname == lib.soname && e.class == lib.class)
        {
            return;
        }
        if lib.soname != lib.file_name {
            self.symlinks.push(Symlink {
                path: format!("{dir}/{}", lib.soname),
                target: lib.file_name.clone(),
            });
        }
        if let Some((name, target)) = other_name(lib) {
            self.symlinks.push(Symlink {
                path: format!("{dir}/{name}"),
                target: target.to_string(),
            });
            // ldconfig caches a library's `.so` link for ld(1) under its own name: so does
            // the cache NVIDIA's update-ldcache makes, and `dlopen("libcuda.so")` relies on it
            // where the directory is not one the loader searches by default.
            if name.ends_with(".so") {
                self.ldcache.push(CacheEntry {
                    soname: name.to_string(),
                    path: format!("{dir}/{name}"),
                    class: lib.class,
                });
            }
        }
        self.ldcache.push(CacheEntry {
            soname: lib.soname.clone(),
            path: format!("{dir}/{}", lib.soname),
            class: lib.class,
        });
    }

    fn add_file_at(&mut self, source: &Path, destination: &str) {
        if !self.mounts.iter().any(|m| m.destination == destination) {
            self.mounts.push(Mount {
                source: source.to_path_buf(),
                destination: destination.to_string(),
                kind: MountKind::File,
            });
        }
    }

    fn add_file(&mut self, file: &HostFile, kind: MountKind) {
        // /var/run and /run name the same host file: mount it once. Host paths are canonical,
        // so equal paths are equal bytes (`Path`'s own `==` parses both into components).
        if self
            .mounts
            .iter()
            .any(|m| m.source.as_os_str() == file.host_path.as_os_str())
        {
            return;
        }
        self.mounts.push(Mount {
            source: file.host_path.clone(),
            destination: file.container_path.clone(),
            kind,
        });
    }
}

/// A second name some driver libraries are looked up by, and what it links to; the names
/// NVIDIA's toolkit makes too, so that images built for it find them: the unversioned name
/// programs link against at build time (`libcuda.so`) or dlopen (the optical flow SDK's
/// `libnvidia-opticalflow.so`, `libnvidia-vulkan-producer.so`), and glvnd's indirect-GLX
/// vendor library (`libGLX_indirect.so.0`).
fn other_name(lib: &crate::inventory::Library) -> Option<(&'static str, &str)> {
    let versioned = |stem: &str| {
        lib.file_name
            .strip_prefix(stem)
            .is_some_and(|v| v.starts_with(".so."))
    };
    match lib.soname.as_str() {
        "libcuda.so.1" => Some(("libcuda.so", &lib.soname)),
        "libnvidia-opticalflow.so.1" => Some(("libnvidia-opticalflow.so", &lib.soname)),
        _ if versioned("libnvidia-vulkan-producer") => {
            Some(("libnvidia-vulkan-producer.so", &lib.file_name))
        }
        _ if versioned("libGLX_nvidia") => Some(("libGLX_indirect.so.0", &lib.file_name)),
        _ => None,
    }
}

/// The library without which a capability is useless: a container that asked for compute
/// and started without libcuda would fail later, far from the cause. Other capabilities'
/// sets vary between driver packages (headless ones lack graphics), so they are not checked.
fn required_library(cap: Capability) -> Option<&'static str> {
    match cap {
        Capability::Compute => Some("libcuda.so.1"),
        Capability::Utility => Some("libnvidia-ml.so.1"),
        _ => None,
    }
}

/// compat32 (32-bit copies of the driver libraries) on an architecture whose driver has
/// none, arm64's: images ask for `all` capabilities wherever they land, so it is an optional
/// extra that is left out with a log line, never a failed start.
fn compat32_skipped(request: &Request, arch: Arch) -> Option<Skipped> {
    if !request.capabilities.contains(&Capability::Compat32) || arch.has_compat32() {
        return None;
    }
    let skipped = Skipped {
        what: "capability compat32".into(),
        why: format!(
            "the NVIDIA driver for {} has no 32-bit libraries; the 64-bit ones are mounted",
            arch.name()
        ),
    };
    tracing::info!(what = %skipped.what, why = %skipped.why, "skipped");
    Some(skipped)
}

/// Directories every loader searches without configuration.
const DEFAULT_LIB_DIRS: &[&str] = &["/lib", "/usr/lib", "/lib64", "/usr/lib64"];

fn ld_so_conf(layout: &Layout, entries: &[CacheEntry]) -> Option<LdSoConf> {
    if !layout.ldcache {
        return None;
    }
    ld_so_conf_listing(
        entries
            .iter()
            .map(|e| e.path.rsplit_once('/').map_or("/", |(d, _)| d)),
    )
}

/// nvhook's `ld.so.conf.d` file naming `dirs` but the loaders' defaults, so that an
/// `ldconfig` run later in the image keeps finding what nvhook's cache lists there.
pub fn ld_so_conf_listing<'a>(dirs: impl IntoIterator<Item = &'a str>) -> Option<LdSoConf> {
    let mut listed: Vec<String> = Vec::new();
    for dir in dirs {
        if !DEFAULT_LIB_DIRS.contains(&dir) && !listed.iter().any(|d| d == dir) {
            listed.push(dir.to_string());
        }
    }
    (!listed.is_empty()).then(|| LdSoConf {
        path: "/etc/ld.so.conf.d/000-nvhook.conf".into(),
        dirs: listed,
    })
}

fn proc_overlay(inventory: &Inventory, choices: &[Choice]) -> Option<ProcOverlay> {
    let host_dir = inventory.proc_driver.clone()?;
    if choices.is_empty() {
        return None;
    }
    let mut gpus: Vec<String> = Vec::new();
    for c in choices {
        let bus = &c.parent().pci_bus_id;
        if !gpus.contains(bus) {
            gpus.push(bus.clone());
        }
    }
    Some(ProcOverlay { host_dir, gpus })
}

/// The driver's params with device-file modification off: a container must never make
/// the driver (re)create nodes on its own.
pub fn container_params(host_params: &str) -> String {
    let mut out = String::with_capacity(host_params.len());
    for line in host_params.lines() {
        if line.starts_with("ModifyDeviceFiles:") {
            out.push_str("ModifyDeviceFiles: 0");
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

mod imex_and_families;
mod wsl;
pub use imex_and_families::{family_device_nodes, imex_channel_nodes};
#[cfg(any(test, feature = "test-util"))]
pub mod fixtures;
#[cfg(test)]
mod tests;
pub mod text;
