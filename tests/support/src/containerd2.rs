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

use super::cmd::{require_program, write_script};
use super::cri::{ContainerRequest, Cri, PodRun};
use super::engines::{
    CgroupParent, Containerd, ContainerdBuild, EngineDir, PAUSE_IMAGE, assert_no_mounts_left,
    unique_name,
};
use super::{MountNs, Output, RuntimeEnv, SimNode};

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

    /// Writes `node`'s CDI spec (`nvhook cdi generate`) as `nvidia.yaml` in the first of
    /// [`Containerd2Cri::cdi_spec_dirs`], which it creates.
    pub fn write_cdi_spec(&self, node: &SimNode) {
        let dir = &self.cdi_spec_dirs[0];
        fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        node.generate_cdi_spec(&dir.join("nvidia.yaml"));
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
    write_script(wrapper, &script);
}

/// Where the pods of a test run: their cgroup parent and logs.
pub struct Pods {
    pub cgroups: CgroupParent,
    pub logs: PathBuf,
}

impl Pods {
    /// Under a cgroup parent `nvhook-NAME-...` of its own, their logs in `DIR/pods`.
    pub fn new(name: &str, dir: &Path) -> Pods {
        Pods {
            cgroups: CgroupParent::new(&format!("nvhook-{name}")),
            logs: dir.join("pods"),
        }
    }

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
        self.try_run_on(DEFAULT_HANDLER, cri, containerd, node, name, request)
            .unwrap_or_else(|message| panic!("RunPodSandbox {name}: {message}"))
            .output
    }

    /// [`Pods::run`] on the runtime handler `handler` (a RuntimeClass's), with the container's
    /// id and the CRI calls' times; RunPodSandbox's error returned, for a test whose runtime
    /// is to refuse the pod itself.
    pub fn try_run_on(
        &self,
        handler: &str,
        cri: &mut Cri,
        containerd: &Containerd,
        node: &SimNode,
        name: &str,
        request: ContainerRequest,
    ) -> Result<PodRun, String> {
        let mut run = cri.try_run_pod(
            &unique_name(name),
            handler,
            &self.cgroups.path(),
            &self.logs,
            &request,
        )?;
        run.output.hook_log = Some(format!(
            "{}\n(containerd log)\n{}",
            node.log(),
            containerd.log()
        ));
        Ok(run)
    }

    /// The pods' cgroup parent in a cgroup v2 hierarchy at /sys/fs/cgroup, where containerd's
    /// CRI (cgroupfs driver) has the runtime make each container's and sandbox's cgroup, named
    /// by its id: `/sys/fs/cgroup/PARENT`.
    pub fn cgroup_parent_dir(&self) -> PathBuf {
        Path::new("/sys/fs/cgroup").join(&self.cgroups.path()[1..])
    }
}

/// A Go duration string (`time.ParseDuration`).
fn go_duration(duration: Duration) -> String {
    format!("{}ms", duration.as_millis())
}

/// `nvhook nri` beside the engine, as nvhook-nri.service runs it, reading `config`; stopped
/// on drop.
pub struct NriPlugin {
    child: std::process::Child,
    stderr: PathBuf,
    config: PathBuf,
}

impl NriPlugin {
    /// Starts it against `socket`, its stderr kept in a file under `dir`.
    pub fn start(config: &Path, socket: &Path, dir: &Path) -> NriPlugin {
        NriPlugin::start_under(&[], config, socket, dir)
    }

    /// [`NriPlugin::start`], run by the command line `wrapper` (a program and its arguments,
    /// `unshare ...` say, which must stop the plugin when it gets SIGTERM); none when empty.
    pub fn start_under(wrapper: &[&str], config: &Path, socket: &Path, dir: &Path) -> NriPlugin {
        let command = match wrapper {
            [] => std::process::Command::new(super::nvhook_bin()),
            [program, args @ ..] => {
                let mut command = std::process::Command::new(super::require_program(program));
                command.args(args).arg(super::nvhook_bin());
                command
            }
        };
        NriPlugin::spawn(command, config, socket, dir)
    }

    /// [`NriPlugin::start`] of another build of nvhook (`program`), whose hook is then that
    /// build's too: a bench's before and after in one run.
    pub fn start_build(program: &Path, config: &Path, socket: &Path, dir: &Path) -> NriPlugin {
        NriPlugin::spawn(std::process::Command::new(program), config, socket, dir)
    }

    fn spawn(
        mut command: std::process::Command,
        config: &Path,
        socket: &Path,
        dir: &Path,
    ) -> NriPlugin {
        let stderr = dir.join(format!("{}.stderr", unique_name("nri")));
        let child = command
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

    /// Stops it as its unit or the kubelet does (SIGTERM), and kills it if it is still there
    /// after ten seconds.
    pub fn kill(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: kill(2) with a child's pid; it has not been waited for.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for NriPlugin {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A containerd 2 node (sid's) for a test's pods, with the gpucheck image imported, nvhook's
/// CDI spec in containerd's spec directory, the node's config given to containerd's children
/// as NVHOOK_CONFIG, and the NRI plugin connected on demand. With `cgroup2`, [`CriNode::start`]
/// runs containerd in a mount namespace of the test's with the cgroup2 hierarchy at /sys/fs/cgroup
/// (this machine's own layout is hybrid, its controllers bound to v1), so that the daemon, its
/// shims, the runtimes and nvhook's hooks see cgroup v2 alone and the pods' cgroup parent is a
/// path of that hierarchy; the CRI client and the NRI plugin stay on the host either way,
/// talking to containerd's sockets under the test's directory.
pub struct CriNode {
    pub node: SimNode,
    pub cri: Cri,
    pub containerd: Containerd,
    pub image: String,
    pub pods: Pods,
    pub setup: Containerd2Cri,
    plugin: Option<NriPlugin>,
    /// The namespace outlives containerd (dropped after it) and the directory outlives both.
    pub ns: Option<MountNs>,
    pub dir: EngineDir,
}

impl CriNode {
    /// Starts a node of `gpus` simulated GPUs (made with `simnode_flags`), its pods under a
    /// cgroup parent `nvhook-NAME-...`, containerd on the host's mounts, or with `cgroup2` in a
    /// mount namespace of cgroup v2 alone; `configure` picks the runtimes (it may write
    /// wrappers into the engine's directory, its first argument) and the pods' network before
    /// containerd starts. Panics unless run as root.
    pub fn start(
        name: &str,
        gpus: u32,
        simnode_flags: &[&str],
        cgroup2: bool,
        configure: impl FnOnce(&Path, &SimNode, &mut Containerd2Cri),
    ) -> CriNode {
        super::require_root();
        let node = SimNode::create_with(gpus, simnode_flags);
        let ns = cgroup2.then(|| MountNs::new(RuntimeEnv::CgroupV2));
        if let Some(ns) = &ns {
            assert_ns_has_pure_cgroup_v2(ns);
        }
        let dir = EngineDir::new(name);
        let mut setup = Containerd2Cri::under(dir.path());
        configure(dir.path(), &node, &mut setup);
        setup.write_cdi_spec(&node);
        let config = node.config();
        let env = [("NVHOOK_CONFIG", config.as_path())];
        let containerd = match &ns {
            Some(ns) => setup.start_in(ns, dir.path(), &env),
            None => setup.start(dir.path(), &env),
        };
        let image = containerd.import_gpucheck_image(dir.path());
        CriNode {
            cri: Cri::connect(containerd.socket()),
            pods: Pods::new(name, dir.path()),
            node,
            containerd,
            image,
            setup,
            plugin: None,
            ns,
            dir,
        }
    }

    /// Connects `nvhook nri` (on the host) to containerd's NRI socket, in `mode`.
    pub fn connect_nri_plugin(&mut self, mode: &str) {
        self.node.configure(&format!("nri-mode = {mode:?}"));
        let plugin = NriPlugin::start(&self.node.config(), &self.setup.nri.socket, self.dir.path());
        plugin.wait_registered(&self.node.log_file(), 1, &self.containerd);
        self.plugin = Some(plugin);
    }

    /// A pod of one container on `handler`, the gpucheck image running `args`, the rest as
    /// `request` says (its image and args are set here); its output carries the node's and
    /// containerd's logs. Panics when RunPodSandbox fails.
    pub fn run_gpucheck(
        &mut self,
        handler: &str,
        name: &str,
        args: &[String],
        request: ContainerRequest,
    ) -> PodRun {
        self.try_run_gpucheck(handler, name, args, request)
            .unwrap_or_else(|message| panic!("RunPodSandbox {name} ({handler}): {message}"))
    }

    /// RunPodSandbox's error for a pod of [`CriNode::run_gpucheck`] whose sandbox the runtime is
    /// to refuse; panics with `if_it_ran` and the pod's output when it ran.
    pub fn sandbox_refusal(
        &mut self,
        handler: &str,
        args: &[String],
        request: ContainerRequest,
        if_it_ran: &str,
    ) -> String {
        match self.try_run_gpucheck(handler, "refused", args, request) {
            Err(message) => message,
            Ok(run) => panic!("{if_it_ran}\n{}", run.output),
        }
    }

    fn try_run_gpucheck(
        &mut self,
        handler: &str,
        name: &str,
        args: &[String],
        request: ContainerRequest,
    ) -> Result<PodRun, String> {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let image = self.image.clone();
        let request = ContainerRequest {
            image: &image,
            args: &args,
            ..request
        };
        self.pods.try_run_on(
            handler,
            &mut self.cri,
            &self.containerd,
            &self.node,
            name,
            request,
        )
    }

    /// The cgroup v2 namespace containerd runs in. Panics for a node started on the host's
    /// mounts.
    pub fn cgroup2_ns(&self) -> &MountNs {
        self.ns.as_ref().expect("a node started with cgroup2")
    }

    /// The controllers of the namespace's cgroup2 root (`cgroup.controllers`).
    pub fn controllers(&self) -> Vec<String> {
        let path = self
            .cgroup2_ns()
            .inside(Path::new("/sys/fs/cgroup/cgroup.controllers"));
        fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    }

    /// Stops the plugin and containerd, which must stop on SIGTERM, and checks that nothing of
    /// the pods is left: no pod network's bridge, no mount of a driver file or under the
    /// engine's directory on the host, and in a cgroup v2 namespace no such mount there, no
    /// process in a pod cgroup, and no pod cgroup once the test's cgroup parent is removed.
    pub fn stop(self) {
        let CriNode {
            node,
            cri,
            containerd,
            pods,
            setup,
            plugin,
            ns,
            dir,
            ..
        } = self;
        stop_engine(plugin, cri, containerd);
        let bridge = setup
            .pod_network
            .as_ref()
            .map(|network| Path::new("/sys/class/net").join(network.bridge()));
        drop(setup);
        if let Some(bridge) = bridge {
            assert!(
                !bridge.exists(),
                "the pods' bridge is left: {}",
                bridge.display()
            );
        }
        assert_no_mounts_left(dir.path(), node.root());
        let Some(ns) = ns else { return };
        let needles = [
            dir.path().display().to_string(),
            node.root().display().to_string(),
        ];
        let leaked: Vec<String> = ns
            .table()
            .into_iter()
            .filter(|l| needles.iter().any(|n| l.contains(n.as_str())))
            .collect();
        assert!(
            leaked.is_empty(),
            "mounts left in containerd's namespace: {leaked:#?}"
        );
        // A runtime may leave the cgroup of a sandbox it refused (empty); the parent goes with it.
        let parent = ns.inside(&pods.cgroup_parent_dir());
        for cgroup in fs::read_dir(&parent).into_iter().flatten().flatten() {
            let procs = cgroup.path().join("cgroup.procs");
            if let Ok(procs) = fs::read_to_string(&procs) {
                assert!(
                    procs.trim().is_empty(),
                    "processes left in {}: {procs}",
                    cgroup.path().display()
                );
            }
        }
        drop(pods);
        assert!(
            !parent.exists(),
            "the pods' cgroup parent is left: {}",
            parent.display()
        );
    }
}

/// Ends a test's engine in order: the NRI plugin, the CRI client, then containerd, which must
/// stop on SIGTERM.
pub fn stop_engine(plugin: impl Into<Option<NriPlugin>>, cri: Cri, mut containerd: Containerd) {
    drop(plugin.into());
    drop(cri);
    assert!(
        containerd.shutdown(),
        "containerd ignored SIGTERM:\n{}",
        containerd.log()
    );
}

/// The namespace's /sys/fs/cgroup is cgroup2 and nothing else.
#[track_caller]
fn assert_ns_has_pure_cgroup_v2(ns: &MountNs) {
    let cgroup_mounts: Vec<String> = ns
        .table()
        .into_iter()
        .filter(|l| {
            l.split(' ')
                .nth(4)
                .is_some_and(|p| p.starts_with("/sys/fs/cgroup"))
        })
        .collect();
    let top = cgroup_mounts
        .iter()
        .rev()
        .find(|l| l.split(' ').nth(4) == Some("/sys/fs/cgroup"))
        .unwrap_or_else(|| panic!("no mount at /sys/fs/cgroup: {cgroup_mounts:#?}"));
    assert!(
        top.contains(" - cgroup2 "),
        "/sys/fs/cgroup is not cgroup2 in the namespace: {top}"
    );
}

/// What `nri-mode = "cdi-devices"` leaves in nvhook's `log`: the plugin named the GPU for the
/// engine to inject from nvhook's CDI spec (an adjustment with no device node and no mount), and
/// the spec's createRuntime hook ran, no prestart hook.
#[track_caller]
pub fn assert_injected_from_the_cdi_spec(log: &str) {
    assert!(
        log.lines()
            .any(|l| l.contains("NRI: GPU container adjusted")
                && l.contains("devices=0")
                && l.contains("mounts=0")),
        "{log}"
    );
    assert!(log.contains("stage=CreateRuntime"), "{log}");
    assert!(!log.contains("stage=Prestart"), "{log}");
}
