//! A simulated GPU node made by the workspace's `simnode` tool.

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
    pub fn log(&self) -> String {
        fs::read_to_string(self.root().join("nvhook.log")).unwrap_or_default()
    }

    /// The UUID of GPU `index`, as the node's mock NVML reports it.
    pub fn gpu_uuid(&self, index: usize) -> String {
        self.topology()["gpus"][index]["uuid"]
            .as_str()
            .unwrap_or_else(|| panic!("no .gpus[{index}].uuid in the node's topology"))
            .to_owned()
    }

    /// The driver version the node's files carry (`libcuda.so.<version>`).
    pub fn driver_version(&self) -> String {
        self.topology()["driver_version"]
            .as_str()
            .expect("no .driver_version in the node's topology")
            .to_owned()
    }

    fn topology(&self) -> serde_json::Value {
        let path = self
            .driver_root()
            .join("usr/lib/x86_64-linux-gnu/nvml-topology.json");
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
