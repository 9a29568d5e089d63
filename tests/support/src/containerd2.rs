//! containerd 2 (Debian sid's, fetched by `scripts/sid-engines.sh` into `.engines/sid`) with its
//! CRI plugin and NRI, as a Kubernetes node runs it, but private to one test: own root, state,
//! gRPC socket, NRI socket, NRI plugin and config directories and CDI spec directories, all
//! under the test's EngineDir. Containers run with Debian 12's runc (sid's runc needs a newer
//! glibc); nvhook-runtime, containerd-shim-runc-v2, is sid's. The pod sandbox image is the harness's
//! busybox, imported at start: nothing is pulled.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::cmd::require_program;
use super::engines::{Containerd, ContainerdBuild, PAUSE_IMAGE, unique_name};

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

/// A containerd 2 node: what to write into its config, and [`Containerd2Cri::start`].
#[derive(Clone, Debug)]
pub struct Containerd2Cri {
    pub nri: Nri,
    /// `enable_cdi = true` with these `cdi_spec_dirs`.
    pub cdi_spec_dirs: Vec<PathBuf>,
    /// The pod sandbox image (`pinned_images.sandbox`), imported by `start`.
    pub sandbox_image: String,
    /// More runtime handlers beside runc: (handler, the program the runc shim runs), as
    /// `nvhook configure containerd` registers nvhook-runtime.
    pub handlers: Vec<(String, PathBuf)>,
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
        }
    }

    /// `containerd config default` of sid's containerd (config version 3) with every host path
    /// under `dir`, and the CRI plugin set up as [`crate::engines::cri_containerd_config`] sets
    /// up containerd 1.6's: no CNI (a host-network pod needs none), the test's pause image, no
    /// negative oom_score_adj; runc is Debian 12's, its state in `DIR/runc`.
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
        runtime["cni"]["conf_dir"] = path(&dir.join("cni"));
        let containerd = &mut runtime["containerd"];
        containerd["default_runtime_name"] = toml_edit::value(DEFAULT_HANDLER);
        let runc = &mut containerd["runtimes"][DEFAULT_HANDLER];
        runc["runtime_type"] = toml_edit::value("io.containerd.runc.v2");
        runc["runtime_path"] = path(&build.program("containerd-shim-runc-v2"));
        runc["options"]["BinaryName"] = path(&require_program("runc"));
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
        let config = dir.join("containerd.toml");
        fs::write(&config, self.config(&build, dir)).expect("write containerd config");
        let mut containerd = Containerd::start_with(&build, dir, &config, env);
        containerd.set_namespace("k8s.io");
        containerd.import_rootfs(
            dir,
            super::busybox_image().rootfs(),
            &self.sandbox_image,
            &PAUSE_IMAGE,
        );
        containerd
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
