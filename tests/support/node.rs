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

impl SimNode {
    /// A node served by the nvhook cargo built for this test run.
    pub fn create(gpus: u32) -> SimNode {
        Self::create_with(gpus, &[])
    }

    /// A node with `extra` simnode options, e.g. `["--mig", "1:2"]`.
    pub fn create_with(gpus: u32, extra: &[&str]) -> SimNode {
        Self::build(gpus, extra, nvhook_bin())
    }

    /// A node whose config and hook entries name the nvhook binary at `hook`
    /// (an installed one, say).
    pub fn create_for(gpus: u32, hook: &Path) -> SimNode {
        Self::build(gpus, &[], hook)
    }

    fn build(gpus: u32, extra: &[&str], hook: &Path) -> SimNode {
        let dir = tempfile::Builder::new()
            .prefix("nvhook-node-")
            .tempdir()
            .expect("create node dir");
        run_checked(
            Command::new(simnode_bin())
                .arg("create")
                .arg(dir.path())
                .args(["--gpus", &gpus.to_string()])
                .args(extra)
                // The same binary the bundles' prestart hooks run.
                .arg("--hook-path")
                .arg(hook),
        );
        SimNode {
            dir,
            hook: hook.to_owned(),
        }
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

/// simnode sits beside the test binary's directory.
pub fn simnode_bin() -> PathBuf {
    let bin = profile_dir().join("simnode");
    assert!(
        bin.is_file(),
        "{} is missing: run `cargo build --workspace` (same profile) before the end-to-end tests",
        bin.display()
    );
    bin
}
