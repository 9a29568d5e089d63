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
    pub fn create(gpus: u32) -> SimNode {
        SimNode::build(&NodeOptions::gpus(gpus))
    }

    pub fn build(options: &NodeOptions) -> SimNode {
        let mut builder = tempfile::Builder::new();
        builder.prefix("nvhook-node-");
        let dir = match &options.parent {
            Some(parent) => builder.tempdir_in(parent),
            None => builder.tempdir(),
        }
        .expect("create node dir");
        let mut cmd = Command::new(simnode_bin());
        cmd.arg("create")
            .arg(dir.path())
            .args(["--gpus", &options.gpus.to_string()])
            .args([
                "--nvml-init-delay-ms",
                &options.nvml_init_delay_ms.to_string(),
            ])
            // The same binary the bundles' prestart hooks run.
            .arg("--hook-path")
            .arg(nvhook_bin());
        for (gpu, count) in &options.mig {
            cmd.arg("--mig").arg(format!("{gpu}:{count}"));
        }
        run_checked(&mut cmd);
        SimNode { dir }
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
        let path = self
            .driver_root()
            .join("usr/lib/x86_64-linux-gnu/nvml-topology.json");
        let text = fs::read_to_string(&path)
            .unwrap_or_else(|err| panic!("read {}: {err}", path.display()));
        let topology: serde_json::Value = serde_json::from_str(&text).expect("topology is JSON");
        topology["gpus"][index]["uuid"]
            .as_str()
            .unwrap_or_else(|| panic!("no .gpus[{index}].uuid in {}", path.display()))
            .to_owned()
    }
}

/// simnode sits beside this test binary's directory (`target/<profile>/deps`),
/// which also holds when CARGO_TARGET_DIR moves the target directory.
pub fn simnode_bin() -> PathBuf {
    let test_exe = std::env::current_exe().expect("locate the test binary");
    let profile_dir = test_exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary lives in target/<profile>/deps");
    let bin = profile_dir.join("simnode");
    assert!(
        bin.is_file(),
        "{} is missing: run `cargo build --workspace` (same profile) before the end-to-end tests",
        bin.display()
    );
    bin
}
