//! The bench's world: a work directory on tmpfs, the glibc test image with /bin/true,
//! simulated nodes, nvhook configs derived from the nodes', and bundles to start.

use crate::cycle::Runtime;
use crate::hook_timer;
use crate::stats::Samples;
use crate::support::{self, Bundle, Image, NodeOptions, SimNode};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// A fresh directory on /dev/shm: on this kind of VM's disk each file the hook creates
/// costs ~0.8 ms, which would hide everything else.
pub fn tmpfs_work_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    // SAFETY: a zeroed statfs is a valid out-value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: the path is NUL-terminated and `st` is writable.
    let rc = unsafe { libc::statfs(c"/dev/shm".as_ptr(), &mut st) };
    assert!(
        rc == 0 && st.f_type == libc::TMPFS_MAGIC,
        "/dev/shm must be a tmpfs: the bench keeps its nodes and bundles there"
    );
    tempfile::Builder::new()
        .prefix("nvhook-bench-")
        .tempdir_in(shm)
        .expect("create the work dir in /dev/shm")
}

/// The end-to-end tests' glibc image, with the host's /usr/bin/true added (it needs only
/// the libc and loader the image already has).
pub fn image() -> &'static Image {
    static DONE: OnceLock<()> = OnceLock::new();
    let image = support::glibc_image();
    DONE.get_or_init(|| {
        std::fs::copy("/usr/bin/true", image.rootfs().join("usr/bin/true"))
            .expect("copy /usr/bin/true into the image");
    });
    image
}

/// The config the packages install.
const PACKAGED_CONFIG: &str = include_str!("../../config/config.toml");

pub struct Node {
    pub sim: SimNode,
    pub label: String,
}

impl Node {
    pub fn build(label: &str, options: NodeOptions) -> Node {
        Node {
            sim: SimNode::build(&options),
            label: label.into(),
        }
    }

    /// The node's config written as the packaged one (every key, documented in comments), with
    /// the node's own settings in place of the packaged ones: what a real node's processes parse.
    pub fn with_packaged_config(self) -> Node {
        let path = self.sim.config();
        let own = std::fs::read_to_string(&path).expect("read the node's config");
        let key = |line: &str| line.split('=').next().map(str::trim).map(String::from);
        let mut own: Vec<(Option<String>, &str)> = own.lines().map(|l| (key(l), l)).collect();
        let mut text = String::new();
        for line in PACKAGED_CONFIG.lines() {
            let at = own
                .iter()
                .position(|(k, _)| !line.starts_with('#') && *k == key(line));
            text += at.map_or(line, |i| own.remove(i).1);
            text.push('\n');
        }
        for (_, line) in own {
            text += &format!("{line}\n");
        }
        std::fs::write(&path, text).expect("write the node's config");
        self
    }

    /// The node's config with the production log level, this log file and hook path; without
    /// `nvml_cache`, NVML is queried on every start (`nvml-cache-file = ""`).
    pub fn config(&self, dest: &Path, log: &Path, hook_path: &Path, nvml_cache: bool) -> PathBuf {
        let text = std::fs::read_to_string(self.sim.config()).expect("read the node's config");
        let replaced = ["log-level", "log-file", "hook-path", "nvml-cache-file"];
        let mut out: String = text
            .lines()
            .filter(|l| {
                nvml_cache && l.starts_with("nvml-cache-file")
                    || !replaced.iter().any(|k| l.starts_with(k))
            })
            .map(|l| format!("{l}\n"))
            .collect();
        out += &format!(
            "log-level = \"info\"\nlog-file = \"{}\"\nhook-path = \"{}\"\n",
            log.display(),
            hook_path.display()
        );
        if !nvml_cache {
            out += "nvml-cache-file = \"\"\n";
        }
        std::fs::write(dest, out).expect("write a derived config");
        dest.to_path_buf()
    }
}

/// What a container asks for.
#[derive(Clone, Copy)]
pub enum Ask {
    NoGpu,
    /// NVIDIA_VISIBLE_DEVICES=all with these NVIDIA_DRIVER_CAPABILITIES.
    Gpus(&'static str),
}

/// How the hook enters a start.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// runc with no hook at all.
    Runc,
    /// runc with nvhook as the bundle's prestart hook (hooks.d style): it gets the inventory.
    Hook,
    /// runc with /bin/true as the prestart hook: what running any hook at all costs.
    NoopHook,
    /// nvhook-runtime: it plans, edits config.json and adds the hook, which reads the plan.
    NvhookRuntime,
    /// nvhook-runtime with `runtime-mode = "cdi"`: runc makes the mounts; a createContainer
    /// hook makes the links and the loader cache.
    ShimCdi,
}

/// One thing measured over many starts.
pub struct Variant {
    pub label: String,
    pub runtime: Runtime,
    pub bundle: Bundle,
    /// The hook timer's record, when the hook's own wall time is measured.
    pub record: Option<PathBuf>,
    pub log: PathBuf,
    /// Wall and CPU time of whole starts, ms.
    pub starts: Samples,
    pub cpu: Samples,
    /// Wall time of each phase of a start, ms (see [`crate::cycle::PHASES`]).
    pub phases: [Samples; 4],
}

pub struct VariantSpec<'a> {
    pub label: String,
    pub node: &'a Node,
    pub ask: Ask,
    pub via: Via,
    /// Time the hook itself (through the timer) rather than run nvhook directly.
    pub timed_hook: bool,
    /// Where the bundle lives (the work dir on tmpfs, or a disk dir for context).
    pub parent: &'a Path,
    /// Keep NVML's answer between starts (the default config), or query it every start.
    pub nvml_cache: bool,
}

impl Variant {
    pub fn new(spec: VariantSpec, work: &Path) -> Variant {
        let slug: String = spec
            .label
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let log = work.join(format!("{slug}.log"));
        let record = spec.timed_hook.then(|| work.join(format!("{slug}.rec")));
        let nvhook = support::nvhook_bin();
        let hook_path = match (&record, spec.via) {
            (Some(record), Via::NvhookRuntime) => {
                let script = work.join(format!("{slug}.hook.sh"));
                hook_timer::write_wrapper_script(&script, record, nvhook);
                script
            }
            _ => nvhook.to_path_buf(),
        };
        let config = spec.node.config(
            &work.join(format!("{slug}.toml")),
            &log,
            &hook_path,
            spec.nvml_cache,
        );
        let mut bundle = Bundle::new_in(spec.parent, image(), &["/bin/true"]);
        if let Ask::Gpus(caps) = spec.ask {
            bundle
                .env("NVIDIA_VISIBLE_DEVICES=all")
                .env(&format!("NVIDIA_DRIVER_CAPABILITIES={caps}"));
        }
        let runtime = match spec.via {
            Via::NvhookRuntime => Runtime::NvhookRuntime(config.clone()),
            Via::ShimCdi => {
                let mut text = std::fs::read_to_string(&config).expect("read the config");
                text += "runtime-mode = \"cdi\"\n";
                std::fs::write(&config, text).expect("write the config");
                Runtime::NvhookRuntime(config.clone())
            }
            Via::Runc | Via::Hook | Via::NoopHook => Runtime::Runc,
        };
        if spec.via == Via::NoopHook {
            bundle.prestart_command(Path::new("/bin/true"), &["true".to_string()]);
        }
        if spec.via == Via::Hook {
            let (path, args) = match &record {
                Some(record) => hook_timer::hook_args(record, nvhook, &config),
                None => (
                    nvhook.to_path_buf(),
                    [
                        "nvhook",
                        "--config",
                        &config.display().to_string(),
                        "hook",
                        "prestart",
                    ]
                    .map(String::from)
                    .to_vec(),
                ),
            };
            bundle.prestart_command(&path, &args);
        }
        Variant {
            label: spec.label,
            runtime,
            bundle,
            record,
            log,
            starts: Samples::default(),
            cpu: Samples::default(),
            phases: Default::default(),
        }
    }

    /// The hook's own costs, from the timer's record.
    pub fn hook(&self) -> hook_timer::HookCost {
        hook_timer::read_record(self.record.as_ref().expect("a timed variant"))
    }

    /// The hook's log lines.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Runs `rounds` starts of every variant, interleaved (A B C, B C A, ...) so that load
/// from elsewhere on the machine falls on all of them alike.
pub fn run_rounds(variants: &mut [Variant], rounds: usize) {
    let n = variants.len();
    for round in 0..rounds {
        for k in 0..n {
            let v = &mut variants[(round + k) % n];
            v.bundle.renew_rootfs(image());
            v.bundle.write_config();
            let cost = crate::cycle::run(&v.runtime, &v.bundle);
            v.starts.push(cost.wall.as_secs_f64() * 1000.0);
            v.cpu.push(cost.cpu.as_secs_f64() * 1000.0);
            for (samples, phase) in v.phases.iter_mut().zip(cost.phases) {
                samples.push(phase.as_secs_f64() * 1000.0);
            }
        }
    }
}
