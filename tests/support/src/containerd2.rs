//! containerd 2 (Debian sid's, fetched by `scripts/sid-engines.sh` into `.engines/sid`) with its
//! CRI plugin and NRI, as a Kubernetes node runs it, but private to one test: own root, state,
//! gRPC socket, NRI socket, NRI plugin and config directories and CDI spec directories, all
//! under the test's EngineDir. Containers run with Debian 12's runc unless a test picks another
//! (sid's, through its wrapper); containerd-shim-runc-v2 is sid's. Pods share the node's network
//! unless a test gives them a [`PodNetwork`]. The pod sandbox image is the harness's busybox,
//! imported at start: nothing is pulled.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::cmd::require_program;
use super::cri::{ContainerRequest, Cri};
use super::engines::{CgroupParent, Containerd, ContainerdBuild, PAUSE_IMAGE, unique_name};
use super::{MountNs, Output, SimNode};

/// The CRI runtime handler of the default runtime (runc); `""` means the same.
pub const DEFAULT_HANDLER: &str = "runc";

/// containerd 2's NRI settings (`[plugins.'io.containerd.nri.v1.nri']`).
#[derive(Clone, Debug)]
pub struct Nri {
    /// Where containerd listens for NRI plugins that connect by themselves (`socket_path`).
    pub socket: PathBuf,
    /// Plugins containerd starts itself when it starts, executables named `IDX-NAME`
    /// (`plugin_path`).
    pub plugin_dir: PathBuf,
    /// Their configurations, `IDX-NAME.conf` or `NAME.conf` (`plugin_config_path`).
    pub plugin_config_dir: PathBuf,
    /// How long a plugin may take to register (`plugin_registration_timeout`).
    pub registration_timeout: Duration,
    /// How long a plugin may take to answer one request (`plugin_request_timeout`).
    pub request_timeout: Duration,
}

impl Nri {
    /// `DIR/nri/nri.sock`, `DIR/nri/plugins`, `DIR/nri/conf.d`, and containerd's default
    /// timeouts (5 s to register, 2 s a request).
    pub fn under(dir: &Path) -> Nri {
        let nri = dir.join("nri");
        Nri {
            socket: nri.join("nri.sock"),
            plugin_dir: nri.join("plugins"),
            plugin_config_dir: nri.join("conf.d"),
            registration_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(2),
        }
    }
}

/// Where Debian's containernetworking-plugins puts the CNI plugins.
const CNI_BIN_DIR: &str = "/usr/lib/cni";

/// A network for pods that cannot share the node's: a `hostUsers: false` pod, whose network
/// namespace containerd makes and pins beside its user namespace (containerd 2.1 refuses one
/// on the host network: "failed to pin user namespace: failed to open netns(): open : no such
/// file or directory"). CNI's bridge plugin gives each pod an `eth0` with an address (the CRI
/// wants one: a loopback-only network fails the pod with "failed to find network info for
/// sandbox"), on a bridge of its own with no address on the host, so no route, forwarding or
/// NAT rule changes there. The bridge is deleted on drop.
#[derive(Debug)]
pub struct PodNetwork {
    bridge: String,
    /// iproute2's `ip`, found at the start: a drop cannot panic with the fix.
    ip: PathBuf,
}

impl PodNetwork {
    /// A bridge of a name unique to this process and call. Panics with the fix when the CNI
    /// plugins are missing.
    pub fn new() -> PodNetwork {
        for plugin in ["bridge", "host-local"] {
            let path = Path::new(CNI_BIN_DIR).join(plugin);
            assert!(
                path.is_file(),
                "no CNI plugin {} (a pod with a network of its own needs it): apt-get install containernetworking-plugins",
                path.display()
            );
        }
        // An interface name has at most 15 bytes.
        let bridge = unique_name("nvh").replace('-', "");
        assert!(bridge.len() <= 15, "bridge name {bridge} is too long");
        PodNetwork {
            bridge,
            ip: require_program("ip"),
        }
    }

    /// The bridge's name, under /sys/class/net while it exists.
    pub fn bridge(&self) -> &str {
        &self.bridge
    }

    /// The CNI network list, its address leases kept under `ipam_dir`.
    fn conflist(&self, ipam_dir: &Path) -> String {
        serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "nvhook-test",
            "plugins": [{
                "type": "bridge",
                "bridge": self.bridge,
                "isGateway": false,
                "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{ "subnet": "10.254.0.0/24" }]],
                    "dataDir": ipam_dir,
                },
            }],
        })
        .to_string()
    }
}

impl Default for PodNetwork {
    fn default() -> PodNetwork {
        PodNetwork::new()
    }
}

impl Drop for PodNetwork {
    fn drop(&mut self) {
        let exists = Path::new("/sys/class/net").join(&self.bridge).exists();
        if exists {
            let deleted = std::process::Command::new(&self.ip)
                .args(["link", "delete", &self.bridge])
                .status();
            if !deleted.is_ok_and(|s| s.success()) {
                eprintln!("cleanup: cannot delete the pods' bridge {}", self.bridge);
            }
        }
    }
}

/// A containerd 2 node: what to write into its config, and [`Containerd2Cri::start`].
#[derive(Debug)]
pub struct Containerd2Cri {
    pub nri: Nri,
    /// `enable_cdi = true` with these `cdi_spec_dirs`.
    pub cdi_spec_dirs: Vec<PathBuf>,
    /// The pod sandbox image (`pinned_images.sandbox`), imported by `start`.
    pub sandbox_image: String,
    /// More runtime handlers beside runc: (handler, the program the runc shim runs), as
    /// `nvhook configure containerd` registers nvhook-runtime.
    pub handlers: Vec<(String, PathBuf)>,
    /// The default handler's runtime (`BinaryName`): Debian 12's runc unless a test needs
    /// what only a newer one does, as `hostUsers: false` pods need idmapped mounts (sid's
    /// runc, [`crate::engines::sid_runtime_bin`]).
    pub runc: PathBuf,
    /// A directory of device nodes (a simulated node's `dev`) that the default handler's runc
    /// sees at `/dev` beside the host's, each run of it in a mount namespace of its own, as on
    /// a GPU host: in a user namespace runc binds every node of `linux.devices` from its
    /// container path on the host (where a CDI spec's `hostPath` is not looked at).
    pub runc_dev: Option<PathBuf>,
    /// The network of pods that ask for one of their own; None: only host-network pods run.
    pub pod_network: Option<PodNetwork>,
}

impl Containerd2Cri {
    /// Everything under `dir`: [`Nri::under`], CDI specs in `DIR/cdi`, a pause image of a
    /// unique name.
    pub fn under(dir: &Path) -> Containerd2Cri {
        Containerd2Cri {
            nri: Nri::under(dir),
            cdi_spec_dirs: vec![dir.join("cdi")],
            sandbox_image: format!("docker.io/nvhook-test/{}:latest", unique_name("pause")),
            handlers: Vec::new(),
            runc: require_program("runc"),
            runc_dev: None,
            pod_network: None,
        }
    }

    /// `containerd config default` of sid's containerd (config version 3) with every host path
    /// under `dir`, and the CRI plugin set up as [`crate::engines::cri_containerd_config`] sets
    /// up containerd 1.6's: CNI only with a [`PodNetwork`] (a host-network pod needs none), the
    /// test's pause image, no negative oom_score_adj; pods' network namespaces pinned under the
    /// state directory, not in the host's /run/netns; runc is [`Containerd2Cri::runc`], its
    /// state in `DIR/runc`.
    pub fn config(&self, build: &ContainerdBuild, dir: &Path) -> String {
        let mut doc = build.config(dir);
        let path = |p: &Path| toml_edit::value(p.display().to_string());
        let plugins = &mut doc["plugins"];
        plugins["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] =
            toml_edit::value(&self.sandbox_image);
        let runtime = &mut plugins["io.containerd.cri.v1.runtime"];
        runtime["restrict_oom_score_adj"] = toml_edit::value(true);
        runtime["enable_cdi"] = toml_edit::value(true);
        runtime["cdi_spec_dirs"] = toml_edit::value(
            self.cdi_spec_dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<toml_edit::Array>(),
        );
        runtime["netns_mounts_under_state_dir"] = toml_edit::value(true);
        runtime["cni"]["conf_dir"] = path(&dir.join("cni"));
        runtime["cni"]["bin_dirs"] = toml_edit::value(toml_edit::Array::from_iter([CNI_BIN_DIR]));
        let containerd = &mut runtime["containerd"];
        containerd["default_runtime_name"] = toml_edit::value(DEFAULT_HANDLER);
        let runc = &mut containerd["runtimes"][DEFAULT_HANDLER];
        runc["runtime_type"] = toml_edit::value("io.containerd.runc.v2");
        runc["runtime_path"] = path(&build.program("containerd-shim-runc-v2"));
        runc["options"]["BinaryName"] = path(&self.runc_program(dir));
        runc["options"]["Root"] = path(&dir.join("runc"));
        let runc = runc.clone();
        for (handler, program) in &self.handlers {
            let runtime = &mut containerd["runtimes"][handler.as_str()];
            *runtime = runc.clone();
            runtime["options"]["BinaryName"] = path(program);
        }
        let nri = &mut plugins["io.containerd.nri.v1.nri"];
        nri["disable"] = toml_edit::value(false);
        nri["socket_path"] = path(&self.nri.socket);
        nri["plugin_path"] = path(&self.nri.plugin_dir);
        nri["plugin_config_path"] = path(&self.nri.plugin_config_dir);
        nri["plugin_registration_timeout"] =
            toml_edit::value(go_duration(self.nri.registration_timeout));
        nri["plugin_request_timeout"] = toml_edit::value(go_duration(self.nri.request_timeout));
        doc.to_string()
    }

    /// Writes `DIR/containerd.toml`, creates the NRI and CDI directories, starts sid's
    /// containerd with `env` added to its environment (and so its shims' and runtimes'),
    /// points its ctr at the CRI's `k8s.io` namespace and imports the pause image there.
    /// Panics when sid's containerd is missing (run scripts/sid-engines.sh).
    pub fn start(&self, dir: &Path, env: &[(&str, &Path)]) -> Containerd {
        self.start_behind(dir, env, &[])
    }

    /// [`Containerd2Cri::start`] in the mount namespace `ns`: containerd, its shims and their
    /// runtimes see that namespace's mounts, as crun needs a pure cgroup v2 hierarchy at
    /// /sys/fs/cgroup (a [`MountNs`] of [`crate::RuntimeEnv::CgroupV2`]), which this
    /// machine's hybrid layout is not. Its sockets and directories are the host's files: the
    /// CRI and NRI clients stay outside.
    pub fn start_in(&self, ns: &MountNs, dir: &Path, env: &[(&str, &Path)]) -> Containerd {
        self.start_behind(dir, env, &ns.nsenter())
    }

    fn start_behind(&self, dir: &Path, env: &[(&str, &Path)], prefix: &[OsString]) -> Containerd {
        let build = ContainerdBuild::sid();
        for d in [&self.nri.plugin_dir, &self.nri.plugin_config_dir]
            .into_iter()
            .chain(&self.cdi_spec_dirs)
        {
            fs::create_dir_all(d).unwrap_or_else(|e| panic!("create {}: {e}", d.display()));
        }
        if let Some(parent) = self.nri.socket.parent() {
            fs::create_dir_all(parent).expect("create the NRI socket's directory");
        }
        if let Some(network) = &self.pod_network {
            let conf_dir = dir.join("cni");
            fs::create_dir_all(&conf_dir).expect("create the CNI config directory");
            fs::write(
                conf_dir.join("10-nvhook-test.conflist"),
                network.conflist(&dir.join("cni-ipam")),
            )
            .expect("write the CNI network list");
        }
        if let Some(dev) = &self.runc_dev {
            write_runc_with_dev(&self.runc_program(dir), &self.runc, dev);
        }
        let config = dir.join("containerd.toml");
        fs::write(&config, self.config(&build, dir)).expect("write containerd config");
        let mut containerd = Containerd::start_behind(&build, dir, &config, env, prefix);
        containerd.set_namespace("k8s.io");
        containerd.import_rootfs(
            dir,
            super::busybox_image().rootfs(),
            &self.sandbox_image,
            &PAUSE_IMAGE,
        );
        containerd
    }

    /// The default handler's `BinaryName`: [`Containerd2Cri::runc`], or the wrapper that gives
    /// it [`Containerd2Cri::runc_dev`].
    fn runc_program(&self, dir: &Path) -> PathBuf {
        match self.runc_dev {
            Some(_) => dir.join("runc-with-dev"),
            None => self.runc.clone(),
        }
    }
}

/// Writes `wrapper`, a script that runs `runc` in a mount namespace of its own where `/dev` is
/// an overlay of the host's `/dev` over `dev`. Read-only: runc only binds from it. Its
/// namespace is a slave of the host's, so the rootfs the shim mounts reaches it, and nothing
/// of it reaches the host.
fn write_runc_with_dev(wrapper: &Path, runc: &Path, dev: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let script = format!(
        "#!/bin/sh\n\
         # runc with {dev} under the host's /dev, written by nvhook's tests (containerd2.rs).\n\
         exec {unshare} --mount --propagation slave -- /bin/sh -c '\n\
           said=$({mount} -t overlay -o ro,lowerdir=/dev:\"$0\" nvhook-test-dev /dev 2>&1) ||\n\
             {{ echo \"runc-with-dev: cannot lay $0 under /dev:\" $said >&2; exit 125; }}\n\
           exec \"$@\"' \"{dev}\" \"{runc}\" \"$@\"\n",
        dev = dev.display(),
        runc = runc.display(),
        unshare = require_program("unshare").display(),
        mount = require_program("mount").display(),
    );
    fs::write(wrapper, script).unwrap_or_else(|e| panic!("write {}: {e}", wrapper.display()));
    fs::set_permissions(wrapper, fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("make {} executable: {e}", wrapper.display()));
}

/// Where the pods of a test run: their cgroup parent and logs.
pub struct Pods {
    pub cgroups: CgroupParent,
    pub logs: PathBuf,
}

impl Pods {
    /// Runs a pod of one container through the CRI on the default handler, its output
    /// carrying the node's and containerd's logs.
    pub fn run(
        &self,
        cri: &mut Cri,
        containerd: &Containerd,
        node: &SimNode,
        name: &str,
        request: ContainerRequest,
    ) -> Output {
        self.run_on(DEFAULT_HANDLER, cri, containerd, node, name, request)
    }

    /// [`Pods::run`] on the runtime handler `handler` (a RuntimeClass's).
    pub fn run_on(
        &self,
        handler: &str,
        cri: &mut Cri,
        containerd: &Containerd,
        node: &SimNode,
        name: &str,
        request: ContainerRequest,
    ) -> Output {
        let mut output = cri
            .run_pod(
                &unique_name(name),
                handler,
                &self.cgroups.path(),
                &self.logs,
                &request,
            )
            .output;
        output.hook_log = Some(format!(
            "{}\n(containerd log)\n{}",
            node.log(),
            containerd.log()
        ));
        output
    }
}

/// A Go duration string (`time.ParseDuration`).
fn go_duration(duration: Duration) -> String {
    format!("{}ms", duration.as_millis())
}

/// `nvhook nri` beside the engine, as nvhook-nri.service runs it, reading `config`; killed
/// on drop.
pub struct NriPlugin {
    child: std::process::Child,
    stderr: PathBuf,
    config: PathBuf,
}

impl NriPlugin {
    /// Starts it against `socket`, its stderr kept in a file under `dir`.
    pub fn start(config: &Path, socket: &Path, dir: &Path) -> NriPlugin {
        let stderr = dir.join(format!("{}.stderr", unique_name("nri")));
        let child = std::process::Command::new(super::nvhook_bin())
            .arg("--config")
            .arg(config)
            .arg("nri")
            .arg("--socket")
            .arg(socket)
            .env_remove("NVHOOK_CONFIG")
            .stdin(std::process::Stdio::null())
            .stderr(fs::File::create(&stderr).expect("create the plugin's stderr file"))
            .spawn()
            .expect("start nvhook nri");
        NriPlugin {
            child,
            stderr,
            config: config.to_path_buf(),
        }
    }

    /// Waits until the plugin has registered `times` times in all, as its log (the config's
    /// log-file) says.
    pub fn wait_registered(&self, log: &Path, times: usize, containerd: &Containerd) {
        let start = std::time::Instant::now();
        let read = || fs::read_to_string(log).unwrap_or_default();
        while read().matches("registered and configured").count() < times {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "nvhook nri ({}) did not register {times}×\n(its log)\n{}\n(its stderr)\n{}\n(containerd log)\n{}",
                self.config.display(),
                read(),
                self.stderr(),
                containerd.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn stderr(&self) -> String {
        fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for NriPlugin {
    fn drop(&mut self) {
        self.kill();
    }
}
