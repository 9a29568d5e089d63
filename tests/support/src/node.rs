//! A simulated GPU node made by the workspace's `simnode` tool.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;

use super::bundle::nvhook_bin;
use super::cmd::run_checked;

/// A node directory: `config.toml` (nvhook's config), `driver/` (driver
/// root), `dev/` (device nodes), `nvhook.log`. Removed when dropped.
pub struct SimNode {
    dir: TempDir,
    hook: PathBuf,
}

/// What a test's node leaves mounted in it (NRI's gathered driver directories, say) would keep
/// the directory from being removed and stay in the host's mount table after the test.
impl Drop for SimNode {
    fn drop(&mut self) {
        super::engines::unmount_below(self.dir.path());
    }
}

/// What `SimNode::build` makes; `NodeOptions::gpus(n)` is a plain node in the temp dir.
#[derive(Clone, Debug, Default)]
pub struct NodeOptions {
    pub gpus: u32,
    /// (GPU, COUNT): MIG on for GPU with COUNT MIG devices.
    pub mig: Vec<(u32, u32)>,
    pub nvml_init_delay_ms: u64,
    /// Directory to create the node in (default: the temp dir).
    pub parent: Option<PathBuf>,
    /// The nvhook binary the node's config names (default: the one cargo built).
    pub hook: Option<PathBuf>,
    /// More `simnode create` flags (`--nvml-init-error 9`, ...).
    pub flags: Vec<String>,
}

impl NodeOptions {
    pub fn gpus(gpus: u32) -> NodeOptions {
        NodeOptions {
            gpus,
            ..NodeOptions::default()
        }
    }
}

impl SimNode {
    /// A node served by the nvhook cargo built for this test run.
    pub fn create(gpus: u32) -> SimNode {
        Self::create_with(gpus, &[])
    }

    /// A node with `extra` simnode options, e.g. `["--mig", "1:2"]`.
    pub fn create_with(gpus: u32, extra: &[&str]) -> SimNode {
        Self::build(&NodeOptions {
            flags: extra.iter().map(|f| f.to_string()).collect(),
            ..NodeOptions::gpus(gpus)
        })
    }

    /// A node whose config and hook entries name the nvhook binary at `hook`
    /// (an installed one, say).
    pub fn create_for(gpus: u32, hook: &Path) -> SimNode {
        Self::build(&NodeOptions {
            hook: Some(hook.to_owned()),
            ..NodeOptions::gpus(gpus)
        })
    }

    pub fn build(options: &NodeOptions) -> SimNode {
        let mut builder = tempfile::Builder::new();
        builder.prefix("nvhook-node-");
        let dir = match &options.parent {
            Some(parent) => builder.tempdir_in(parent),
            None => builder.tempdir(),
        }
        .expect("create node dir");
        let hook = options.hook.as_deref().unwrap_or(nvhook_bin()).to_owned();
        let mut cmd = Command::new(simnode_bin());
        cmd.arg("create")
            .arg(dir.path())
            .args(["--gpus", &options.gpus.to_string()])
            // The binary the bundles' prestart hooks run.
            .arg("--hook-path")
            .arg(&hook)
            .args(&options.flags);
        if options.nvml_init_delay_ms > 0 {
            cmd.arg("--nvml-init-delay-ms")
                .arg(options.nvml_init_delay_ms.to_string());
        }
        for (gpu, count) in &options.mig {
            cmd.arg("--mig").arg(format!("{gpu}:{count}"));
        }
        run_checked(&mut cmd);
        SimNode { dir, hook }
    }

    /// `nvhook cdi generate --output OUTPUT` for this node, with the nvhook cargo built.
    pub fn generate_cdi_spec(&self, output: &Path) {
        let out = Command::new(nvhook_bin())
            .arg("--config")
            .arg(self.config())
            .args(["cdi", "generate", "--output"])
            .arg(output)
            .output()
            .expect("run nvhook cdi generate");
        assert!(
            out.status.success(),
            "nvhook cdi generate: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
    }

    /// A mount namespace where the node's device nodes are at `/dev/...` as on a real GPU host
    /// (an overlay of the host's `/dev` and the node's, read-only, with the host's `/dev/shm`
    /// and `/dev/pts` back on top, from a private copy: a shared one would get the overlay
    /// too): for engines that take a node from the host's own path,
    /// as runc does in a user namespace. `scratch` is an empty directory of the caller's.
    pub fn dev_at_host_paths(&self, env: super::RuntimeEnv, scratch: &Path) -> super::MountNs {
        self.dev_at_host_paths_and(env, scratch, "true")
    }

    /// Like [`SimNode::dev_at_host_paths`], then the shell commands `more` in the namespace.
    pub fn dev_at_host_paths_and(
        &self,
        env: super::RuntimeEnv,
        scratch: &Path,
        more: &str,
    ) -> super::MountNs {
        let setup = format!(
            "mount --rbind /dev {save} && mount --make-rprivate {save} && \
             mount -t overlay -o ro,lowerdir=/dev:{node} overlay /dev && \
             for d in shm pts; do mount --rbind {save}/$d /dev/$d; done && {more}",
            save = scratch.display(),
            node = self.dev_root().join("dev").display(),
        );
        super::MountNs::with_setup(env, &setup)
    }

    /// Changes the node in place as a live host changes (`simnode create --keep-state`):
    /// `flags` are the whole node's flags after the change (`--gpus 4 --driver-version ...`);
    /// nvhook's config, log, NVML cache and /dev/char links stay.
    pub fn change(&self, flags: &[&str]) {
        run_checked(
            Command::new(simnode_bin())
                .arg("create")
                .arg(self.root())
                .arg("--keep-state")
                .arg("--hook-path")
                .arg(&self.hook)
                .args(flags),
        );
    }

    /// The nvhook binary this node's hook entries run.
    pub fn hook(&self) -> &Path {
        &self.hook
    }

    /// Appends `key = value` lines to the node's nvhook config.
    pub fn configure(&self, lines: &str) -> &Self {
        let path = self.config();
        let mut text = fs::read_to_string(&path).expect("read node config");
        text.push_str(lines);
        text.push('\n');
        fs::write(&path, text).expect("write node config");
        self
    }

    /// Sets one key of the node's config to `value` (TOML), replacing the line simnode wrote
    /// for it, or adding one.
    pub fn set(&self, key: &str, value: &str) -> &Self {
        let path = self.config();
        let text = fs::read_to_string(&path).expect("read node config");
        let is_key = |line: &str| line.split('=').next().is_some_and(|k| k.trim() == key);
        let mut lines: Vec<String> = text
            .lines()
            .filter(|l| !is_key(l))
            .map(String::from)
            .collect();
        lines.push(format!("{key} = {value}"));
        fs::write(&path, lines.join("\n") + "\n").expect("write node config");
        self
    }

    /// The dev root: the node's `dev/nvidia*` nodes live under it.
    pub fn dev_root(&self) -> &Path {
        self.root()
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn config(&self) -> PathBuf {
        self.root().join("config.toml")
    }

    pub fn driver_root(&self) -> PathBuf {
        self.root().join("driver")
    }

    /// The hook's log so far, or an empty string before it wrote one; tests
    /// print it when they fail.
    /// The config's log-file.
    pub fn log_file(&self) -> PathBuf {
        self.root().join("nvhook.log")
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.log_file()).unwrap_or_default()
    }

    /// The µs of each of the hooks' `step` in the log, in order.
    pub fn step_us(&self, step: &str) -> Vec<u64> {
        self.log()
            .lines()
            .flat_map(crate::hook_log::steps_of)
            .filter(|(name, _)| *name == step)
            .map(|(_, us)| us)
            .collect()
    }

    /// The UUID of GPU `index`, as the node's mock NVML reports it.
    pub fn gpu_uuid(&self, index: usize) -> String {
        self.topology()["gpus"][index]["uuid"]
            .as_str()
            .unwrap_or_else(|| panic!("no .gpus[{index}].uuid in the node's topology"))
            .to_owned()
    }

    /// The processes that initialised the node's mock NVML so far, one line each in its
    /// record.
    pub fn nvml_inits(&self) -> usize {
        fs::read_to_string(self.root().join("nvml-inits"))
            .unwrap_or_default()
            .lines()
            .count()
    }

    /// Every `nvmlDeviceSetMemoryLimits_v1` call the node's mock NVML answered so far, in
    /// order: `pid`, `gpu` (UUID), `path` (the cgroup directory), `soft` and `hard` (bytes; null
    /// where NVML could not read them) and `result` (its `nvmlReturn_t`).
    pub fn memory_limit_calls(&self) -> Vec<serde_json::Value> {
        fs::read_to_string(self.root().join("nvml-memory-limit-calls"))
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str(line).expect("a record line is JSON"))
            .collect()
    }

    /// The driver version the node's files carry (`libcuda.so.<version>`).
    pub fn driver_version(&self) -> String {
        self.topology()["driver_version"]
            .as_str()
            .expect("no .driver_version in the node's topology")
            .to_owned()
    }

    /// The labels GPU feature discovery gives this node, worked out from its topology (the
    /// `nvidia.com` names); with `mixed`, its MIG strategy's `mig-<profile>.count` from the
    /// MIG devices' names.
    pub fn expected_labels(&self, mixed: bool) -> BTreeMap<String, String> {
        let topology = self.topology();
        let gpus = topology["gpus"].as_array().unwrap();
        let first = &gpus[0];
        let driver: Vec<&str> = topology["driver_version"]
            .as_str()
            .unwrap()
            .split('.')
            .collect();
        let cuda = topology["cuda_driver_version"].as_u64().unwrap();
        let cc = &first["cuda_compute_capability"];
        let mut want: BTreeMap<String, String> = [
            ("gpu.count", gpus.len().to_string()),
            ("gpu.present", "true".into()),
            // simnode's /sys/class/dmi/id/product_name, as GPU feature discovery labels it.
            ("gpu.machine", "nvhook-simulated-GPU-node".into()),
            (
                "gpu.product",
                first["name"].as_str().unwrap().replace(' ', "-"),
            ),
            // nvmlDeviceArchitecture_t: the simulated boards are Ampere (7).
            (
                "gpu.family",
                match first["architecture"].as_u64() {
                    Some(7) => "ampere".into(),
                    other => panic!("architecture {other:?}: not a simulated board's"),
                },
            ),
            (
                "gpu.memory",
                (first["memory_total"].as_u64().unwrap() >> 20).to_string(),
            ),
            ("gpu.compute.major", cc[0].to_string()),
            ("gpu.compute.minor", cc[1].to_string()),
            ("cuda.driver.major", driver[0].into()),
            ("cuda.driver.minor", driver[1].into()),
            ("cuda.driver.rev", driver[2].into()),
            ("cuda.driver-version.major", driver[0].into()),
            ("cuda.driver-version.minor", driver[1].into()),
            ("cuda.driver-version.revision", driver[2].into()),
            ("cuda.driver-version.full", driver.join(".")),
            ("cuda.runtime.major", (cuda / 1000).to_string()),
            ("cuda.runtime.minor", (cuda % 1000 / 10).to_string()),
            ("cuda.runtime-version.major", (cuda / 1000).to_string()),
            ("cuda.runtime-version.minor", (cuda % 1000 / 10).to_string()),
            (
                "cuda.runtime-version.full",
                format!("{}.{}", cuda / 1000, cuda % 1000 / 10),
            ),
            ("mig.capable", "true".into()),
            // The simulated driver has the call; the host's cgroup decides.
            ("gpu.memory-limits", cgroup_v2_here().to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (format!("nvidia.com/{k}"), v))
        .collect();
        if !mixed {
            return want;
        }
        want.insert("nvidia.com/mig.strategy".into(), "mixed".into());
        for mig in gpus
            .iter()
            .filter(|g| g["mig_mode"] == 1)
            .flat_map(|g| g["mig_devices"].as_array().unwrap())
        {
            let profile = mig["name"].as_str().unwrap().rsplit(' ').next().unwrap();
            let count = want
                .entry(format!("nvidia.com/mig-{profile}.count"))
                .or_insert_with(|| "0".into());
            *count = (count.parse::<u32>().unwrap() + 1).to_string();
        }
        want
    }

    /// The node's `nvml-topology.json`: what its mock NVML reports.
    /// `nvhook --config NODE ARGS...`, which must succeed; its stdout.
    pub fn nvhook(&self, args: &[&str]) -> String {
        let output = Command::new(nvhook_bin())
            .arg("--config")
            .arg(self.config())
            .args(args)
            .output()
            .expect("spawn nvhook");
        assert!(
            output.status.success(),
            "nvhook {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&output.stderr),
            self.log()
        );
        String::from_utf8(output.stdout).expect("nvhook prints UTF-8")
    }

    /// The mock NVML's topology, beside the node's NVML: in the Linux driver's library
    /// directory, or on a `--wsl` node in NVIDIA's driver store.
    pub fn topology(&self) -> serde_json::Value {
        const FILE: &str = "nvml-topology.json";
        let root = self.driver_root();
        let stores = fs::read_dir(root.join("usr/lib/wsl/drivers"))
            .into_iter()
            .flatten();
        // Beside the mock NVML: in a WSL driver store, Debian's directory, or GKE's.
        let default = root.join("usr/lib/x86_64-linux-gnu").join(FILE);
        let path = stores
            .flatten()
            .map(|store| store.path().join(FILE))
            .chain([root.join("usr/local/nvidia/lib64").join(FILE)])
            .find(|p| p.is_file())
            .unwrap_or(default);
        let text = fs::read_to_string(&path)
            .unwrap_or_else(|err| panic!("read {}: {err}", path.display()));
        serde_json::from_str(&text).expect("topology is JSON")
    }
}

/// `target/<profile>`, the parent of this test binary's directory
/// (`target/<profile>/deps`), which also holds when CARGO_TARGET_DIR moves the
/// target directory.
pub fn profile_dir() -> PathBuf {
    let test_exe = std::env::current_exe().expect("locate the test binary");
    test_exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary lives in target/<profile>/deps")
        .to_owned()
}

/// `target/tmp`: scratch space that `cargo clean` removes.
pub fn target_tmp_dir() -> PathBuf {
    profile_dir()
        .parent()
        .expect("target/<profile> has a parent")
        .join("tmp")
}

/// simnode sits beside the test binary's directory.
pub fn simnode_bin() -> PathBuf {
    workspace_bin("simnode")
}

/// A binary of another workspace crate (cargo gives a test only its own package's), from
/// the profile directory this test binary was built in.
pub fn workspace_bin(name: &str) -> PathBuf {
    let bin = profile_dir().join(name);
    assert!(
        bin.is_file(),
        "{} is missing: run `cargo build --workspace` (same profile) before the end-to-end tests",
        bin.display()
    );
    bin
}

/// Whether this process's /sys/fs/cgroup is cgroup v2 (the last mount there is a cgroup2).
fn cgroup_v2_here() -> bool {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").expect("read mountinfo");
    mountinfo
        .lines()
        .rfind(|l| l.split(' ').nth(4) == Some("/sys/fs/cgroup"))
        .and_then(|l| l.split_once(" - "))
        .is_some_and(|(_, rest)| rest.starts_with("cgroup2 "))
}
