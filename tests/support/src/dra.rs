//! nvhook's DRA kubelet plugin for tests: `nvhook-dra` on a simulated node with the kubelet's
//! directories under a test's own, and ResourceClaims as the scheduler leaves them.

use super::SimNode;
use super::apiserver::ApiServer;
use super::engines::unique_name;
use super::node::workspace_bin;
use k8s_openapi::api::resource::v1::ResourceClaim;
use nvhook_dra::Claim;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The node's name, and so its pool's.
pub const NODE: &str = "node-a";
pub const DRIVER: &str = "gpu.nvidia.com";

/// `nvhook-dra` for `node`, with the kubelet's directories and the CDI spec directory under
/// `dir`, reading claims from `api`; killed on drop.
pub struct Plugin {
    child: Child,
    dir: PathBuf,
}

impl Plugin {
    pub fn start(node: &SimNode, dir: &Path, api: &ApiServer) -> Plugin {
        Plugin::start_with(node, dir, api, &[])
    }

    /// [`Plugin::start`] with `extra` arguments.
    pub fn start_with(node: &SimNode, dir: &Path, api: &ApiServer, extra: &[&str]) -> Plugin {
        let child = Command::new(workspace_bin("nvhook-dra"))
            .args(["--node-name", NODE, "--api-server", &api.url()])
            .arg("--config")
            .arg(node.config())
            .arg("--cdi-root")
            .arg(dir.join("cdi"))
            .arg("--registry-dir")
            .arg(dir.join("plugins_registry"))
            .arg("--plugins-dir")
            .arg(dir.join("plugins"))
            .args(["--resync", "1"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start nvhook-dra");
        let plugin = Plugin {
            child,
            dir: dir.to_path_buf(),
        };
        let socket = plugin.registration_socket();
        let started = Instant::now();
        // Listening, not just there: a killed plugin leaves its socket behind.
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "nvhook-dra does not listen on {}",
                socket.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        plugin
    }

    pub fn registration_socket(&self) -> PathBuf {
        self.dir
            .join("plugins_registry")
            .join(format!("{DRIVER}-reg.sock"))
    }

    pub fn spec(&self, uid: &str) -> PathBuf {
        self.dir
            .join("cdi")
            .join(format!("k8s.gpu.nvidia.com-claim_{uid}.yaml"))
    }

    pub fn checkpoint(&self) -> String {
        std::fs::read_to_string(
            self.dir
                .join("plugins")
                .join(DRIVER)
                .join("checkpoint.json"),
        )
        .unwrap_or_default()
    }

    /// Kills the plugin as a node losing it would (no chance to clean up).
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A claim as the scheduler leaves it: allocated `devices` of `pool`, for request `gpu`.
pub fn allocated_claim(name: &str, pool: &str, devices: &[&str]) -> (ResourceClaim, Claim) {
    let uid = format!("{}-{name}", unique_name("uid"));
    let results: Vec<serde_json::Value> = devices
        .iter()
        .map(|device| {
            serde_json::json!({"request": "gpu", "driver": DRIVER, "pool": pool, "device": device})
        })
        .collect();
    let claim = serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ml", "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "count": devices.len()}}]}},
        "status": {"allocation": {"devices": {"results": results}}},
    });
    let claim: ResourceClaim = serde_json::from_value(claim).expect("a v1 ResourceClaim");
    let named = Claim {
        namespace: "ml".into(),
        uid,
        name: name.into(),
    };
    (claim, named)
}
