//! OCI bundles: `runc spec` output edited as JSON, plus a private rootfs copy.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::{Value, json};
use tempfile::TempDir;

use super::cmd::{require_program, run_checked};
use super::image::Image;
use super::node::SimNode;

/// The nvhook binary cargo built for this test run.
pub fn nvhook_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| super::workspace_bin("nvhook"))
}

/// Links each of `names` (NVIDIA's command names) in the directory `bin` to the nvhook binary,
/// as the packages install them.
pub fn link_to_nvhook(bin: &Path, names: &[&str]) {
    for name in names {
        std::os::unix::fs::symlink(nvhook_bin(), bin.join(name))
            .unwrap_or_else(|e| panic!("link {name} in {} to nvhook: {e}", bin.display()));
    }
}

/// Runs the nvhook binary with `args`, never reading the caller's `NVHOOK_CONFIG`.
pub fn run_nvhook(args: &[&str]) -> std::process::Output {
    std::process::Command::new(nvhook_bin())
        .args(args)
        .env_remove("NVHOOK_CONFIG")
        .output()
        .expect("run nvhook")
}

/// A bundle directory (removed when dropped) holding `rootfs/`, `config.json`
/// and the private runc state directory, with a container id unique to it.
pub struct Bundle {
    dir: TempDir,
    rootfs: PathBuf,
    spec: Value,
    id: String,
}

impl Bundle {
    /// A bundle running `args` in a fresh copy of `image`, no terminal, with a
    /// writable rootfs (the hook must make its own mounts read-only).
    pub fn new(image: &Image, args: &[&str]) -> Bundle {
        let dir = tempfile::Builder::new()
            .prefix("nvhook-bundle-")
            .tempdir()
            .expect("create bundle dir");
        Bundle::in_dir(dir, image, args)
    }

    /// Like `new`, in a directory under `parent` (a tmpfs, say).
    pub fn new_in(parent: &Path, image: &Image, args: &[&str]) -> Bundle {
        let dir = tempfile::Builder::new()
            .prefix("nvhook-bundle-")
            .tempdir_in(parent)
            .expect("create bundle dir");
        Bundle::in_dir(dir, image, args)
    }

    fn in_dir(dir: TempDir, image: &Image, args: &[&str]) -> Bundle {
        let rootfs = image.instantiate(dir.path());
        let mut spec = default_spec(dir.path());
        spec["process"]["args"] = json!(args);
        spec["process"]["terminal"] = json!(false);
        spec["root"] = json!({ "path": rootfs, "readonly": false });
        Bundle {
            dir,
            rootfs,
            spec,
            id: unique_id(),
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn rootfs(&self) -> &Path {
        &self.rootfs
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// runc's `--root`: private, so parallel tests never see each other.
    pub fn state_dir(&self) -> PathBuf {
        self.dir().join("runc-state")
    }

    /// Adds `NAME=value` to the container's environment.
    pub fn env(&mut self, var: &str) -> &mut Self {
        push(&mut self.spec["process"]["env"], json!(var));
        self
    }

    /// Installs the node's nvhook as the prestart hook, configured for `node`,
    /// the way nvhook itself writes hook entries: absolute path, explicit env,
    /// timeout.
    pub fn prestart_hook(&mut self, node: &SimNode) -> &mut Self {
        let args = [
            "nvhook",
            "--config",
            &node.config().display().to_string(),
            "hook",
            "prestart",
        ]
        .map(String::from);
        self.prestart_command(node.hook(), &args)
    }

    /// A prestart hook running `path` with `args` (argv[0] included), entered the way
    /// nvhook writes hook entries.
    pub fn prestart_command(&mut self, path: &Path, args: &[String]) -> &mut Self {
        let hook = json!({
            "path": path,
            "args": args,
            "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"],
            "timeout": 30,
        });
        self.raw_prestart_hook(hook)
    }

    /// Runs the container on `rootfs` (prepared by the test) instead of the bundle's copy.
    pub fn use_rootfs(&mut self, rootfs: &Path) -> &mut Self {
        self.rootfs = rootfs.to_path_buf();
        self.spec["root"]["path"] = json!(rootfs);
        self
    }

    /// Makes runc remount the rootfs read-only after the hooks ran (`root.readonly`).
    pub fn readonly_root(&mut self) -> &mut Self {
        self.spec["root"]["readonly"] = json!(true);
        self
    }

    /// Adds a prestart hook entry as given (for hooks wrapped in another program).
    /// Sets `linux.rootfsPropagation`.
    pub fn rootfs_propagation(&mut self, propagation: &str) -> &mut Self {
        self.spec["linux"]["rootfsPropagation"] = Value::from(propagation);
        self
    }

    pub fn raw_prestart_hook(&mut self, hook: Value) -> &mut Self {
        self.raw_hook("prestart", hook)
    }

    /// Adds `hook` to the hooks of `stage` (`createContainer`, ...), after those there.
    pub fn raw_hook(&mut self, stage: &str, hook: Value) -> &mut Self {
        push(&mut self.spec["hooks"][stage], hook);
        self
    }

    /// Adds `mount` (an OCI mount entry) after the spec's mounts, as an engine writes one.
    pub fn raw_mount(&mut self, mount: Value) -> &mut Self {
        push(&mut self.spec["mounts"], mount);
        self
    }

    /// The device plugin's volume-mount device list: `/dev/null` bound at
    /// `/var/run/nvidia-container-devices/<id>`.
    pub fn device_list_mount(&mut self, id: &str) -> &mut Self {
        let mount = json!({
            "destination": format!("/var/run/nvidia-container-devices/{id}"),
            "type": "bind", "source": "/dev/null", "options": ["bind", "ro"],
        });
        self.raw_mount(mount)
    }

    /// Binds the host directory `source` at `destination`, as an engine binds a volume
    /// (Docker `-v`, a Kubernetes hostPath or PVC), with `options` after `rbind`.
    pub fn volume(&mut self, destination: &str, source: &Path, options: &[&str]) -> &mut Self {
        let mut all = vec!["rbind"];
        all.extend(options);
        let mount = json!({
            "destination": destination, "type": "bind", "source": source, "options": all,
        });
        self.raw_mount(mount)
    }

    /// Replaces the rootfs with a fresh copy of `image`, as a new container would get.
    pub fn renew_rootfs(&self, image: &Image) {
        fs::remove_dir_all(&self.rootfs).expect("remove the old rootfs");
        image.instantiate(self.dir());
    }

    /// Has runc create a char device node at `path` WITHOUT a cgroup rule for
    /// it: opening it must then fail with EPERM.
    pub fn extra_device(&mut self, path: &str, major: u32, minor: u32) -> &mut Self {
        let device = json!({
            "path": path, "type": "c", "major": major, "minor": minor,
            "fileMode": 0o666, "uid": 0, "gid": 0,
        });
        push(&mut self.spec["linux"]["devices"], device);
        self
    }

    /// Adds a cgroup rule allowing read/write/mknod of char device major:minor.
    pub fn allow_device(&mut self, major: u32, minor: u32) -> &mut Self {
        let rule =
            json!({ "allow": true, "type": "c", "major": major, "minor": minor, "access": "rwm" });
        push(&mut self.spec["linux"]["resources"]["devices"], rule);
        self
    }

    /// Puts CAP_SYS_ADMIN in the bounding set: nvidia's definition of a
    /// privileged container.
    pub fn privileged(&mut self) -> &mut Self {
        push(
            &mut self.spec["process"]["capabilities"]["bounding"],
            json!("CAP_SYS_ADMIN"),
        );
        self
    }

    /// Runs the container in a user namespace whose ids 0..`size` are the host's
    /// `host_id`..`host_id + size` (uid and gid alike), the shape Kubernetes `hostUsers:
    /// false`, Docker's `userns-remap` and Podman's `--userns=auto` give runc, with the rootfs
    /// owned by the container's root as those engines leave it.
    pub fn user_namespace(&mut self, host_id: u32, size: u32) -> &mut Self {
        push(
            &mut self.spec["linux"]["namespaces"],
            json!({ "type": "user" }),
        );
        let mapping = json!([{ "containerID": 0, "hostID": host_id, "size": size }]);
        self.spec["linux"]["uidMappings"] = mapping.clone();
        self.spec["linux"]["gidMappings"] = mapping;
        let owner = format!("{host_id}:{host_id}");
        run_checked(
            Command::new(require_program("chown"))
                .args(["-R", "-h", &owner])
                .arg(&self.rootfs),
        );
        self
    }

    /// Puts the container in a cgroup namespace of its own (where it sees its cgroup as `/`,
    /// as Kubernetes', Docker's and Podman's containers do on cgroup v2), in the cgroup
    /// `cgroups_path` names.
    pub fn cgroup_namespace(&mut self, cgroups_path: &str) -> &mut Self {
        push(
            &mut self.spec["linux"]["namespaces"],
            json!({ "type": "cgroup" }),
        );
        self.spec["linux"]["cgroupsPath"] = json!(cgroups_path);
        self
    }

    /// Runs the process as `uid`:`gid`, with no capabilities, as a pod's unprivileged user.
    pub fn user(&mut self, uid: u32, gid: u32) -> &mut Self {
        self.spec["process"]["user"] = json!({ "uid": uid, "gid": gid });
        self
    }

    /// Masks nothing under /proc: Kubernetes `procMount: Unmasked`, Docker
    /// `--security-opt systempaths=unconfined`.
    pub fn unmask_proc(&mut self) -> &mut Self {
        self.spec["linux"]["maskedPaths"] = json!([]);
        self.spec["linux"]["readonlyPaths"] = json!([]);
        self
    }

    /// Sets the spec's annotation `key` (the runtime reads some: crun's `run.oci.hooks.stderr`).
    pub fn annotation(&mut self, key: &str, value: &str) -> &mut Self {
        self.spec["annotations"][key] = json!(value);
        self
    }

    /// A read-only tmpfs of the runtime's at `destination`.
    pub fn tmpfs(&mut self, destination: &str) -> &mut Self {
        let mount = json!({
            "destination": destination, "type": "tmpfs", "source": "tmpfs",
            "options": ["nosuid", "nodev", "noexec", "ro"],
        });
        push(&mut self.spec["mounts"], mount);
        self
    }

    /// Writes the spec as edited so far; run_container calls this.
    pub fn write_config(&self) {
        let text = serde_json::to_string_pretty(&self.spec).expect("serialize config.json");
        fs::write(self.dir().join("config.json"), text).expect("write config.json");
    }
}

/// `runc spec` run in `dir`, read back as JSON.
fn default_spec(dir: &Path) -> Value {
    run_checked(
        Command::new(require_program("runc"))
            .arg("spec")
            .current_dir(dir),
    );
    let path = dir.join("config.json");
    let text = fs::read_to_string(&path).expect("read runc spec output");
    fs::remove_file(&path).expect("remove runc spec output");
    serde_json::from_str(&text).expect("runc spec output is JSON")
}

/// Appends to a JSON array, creating it when the key is missing.
fn push(slot: &mut Value, item: Value) {
    if slot.is_null() {
        *slot = json!([]);
    }
    slot.as_array_mut()
        .expect("spec field is an array")
        .push(item);
}

/// Tests run in parallel threads and test binaries may overlap: pid + counter.
fn unique_id() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "nvhook-e2e-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
