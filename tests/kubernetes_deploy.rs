//! deploy/kubernetes: every manifest read into the Kubernetes API's own types
//! (k8s-openapi), with no field those types do not know; the things a cluster
//! admin relies on (RuntimeClass handler, a GPU pod with no hostPath, a
//! privileged installer that mounts what it writes); and install.sh run for
//! real, with the real nvhook, against a temporary host root.

use nvhook_test_support as support;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, Namespace, Pod};
use k8s_openapi::api::node::v1::RuntimeClass;
use nvhook::config::Config;
use serde::Deserialize;
use serde_json::Value;
use support::engines::{
    Dockerd, DockerdBuild, EngineDir, assert_containerd_handler, nvhook_nvml_bin,
    nvhook_runtime_bin, unique_name, write_rootfs_tar,
};
use support::nvhook_bin;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes")
}

enum Object {
    /// Checked, and needed by nothing else.
    Namespace,
    DaemonSet(Box<DaemonSet>),
    Pod(Box<Pod>),
    RuntimeClass(Box<RuntimeClass>),
}

/// Each YAML document of `file` as its typed Kubernetes object. A field the
/// type does not know (a typo, a wrong level) is an error: what the type
/// serializes back must hold every field of the document.
fn objects(file: &Path) -> Vec<Object> {
    let text = fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let name = file.file_name().unwrap().to_string_lossy().into_owned();
    serde_yaml::Deserializer::from_str(&text)
        .map(|document| {
            let yaml = serde_yaml::Value::deserialize(document)
                .unwrap_or_else(|e| panic!("{name}: not YAML: {e}"));
            let json = serde_json::to_value(&yaml).expect("YAML maps to JSON");
            let kind = json["kind"].as_str().unwrap_or_default().to_owned();
            match kind.as_str() {
                "Namespace" => {
                    typed::<Namespace>(&name, &json);
                    Object::Namespace
                }
                "DaemonSet" => Object::DaemonSet(typed(&name, &json)),
                "Pod" => Object::Pod(typed(&name, &json)),
                "RuntimeClass" => Object::RuntimeClass(typed(&name, &json)),
                other => panic!("{name}: kind {other:?} is not one this test knows"),
            }
        })
        .collect()
}

fn typed<T>(file: &str, json: &Value) -> Box<T>
where
    T: serde::de::DeserializeOwned + serde::Serialize,
{
    let object: T = serde_json::from_value(json.clone())
        .unwrap_or_else(|e| panic!("{file}: not a valid {}: {e}", json["kind"]));
    let back = serde_json::to_value(&object).expect("serialize");
    assert_known_fields(file, "", json, &back);
    Box::new(object)
}

#[track_caller]
fn assert_known_fields(file: &str, path: &str, written: &Value, typed: &Value) {
    match (written, typed) {
        (Value::Object(fields), Value::Object(known)) => {
            for (key, value) in fields {
                let at = format!("{path}.{key}");
                let known = known
                    .get(key)
                    .unwrap_or_else(|| panic!("{file}: {at} is not a Kubernetes API field"));
                assert_known_fields(file, &at, value, known);
            }
        }
        (Value::Array(items), Value::Array(known)) => {
            assert_eq!(items.len(), known.len(), "{file}: {path}");
            for (i, (item, known)) in items.iter().zip(known).enumerate() {
                assert_known_fields(file, &format!("{path}[{i}]"), item, known);
            }
        }
        // Quantities and int-or-strings come back as strings (`1` -> `"1"`).
        (Value::Number(n), Value::String(s)) => assert_eq!(&n.to_string(), s, "{file}: {path}"),
        _ => assert_eq!(written, typed, "{file}: {path}"),
    }
}

/// Every manifest of deploy/kubernetes, by kind.
struct Manifests {
    runtime_class: RuntimeClass,
    daemon_set: DaemonSet,
    /// nvhook-installer-nri.yaml's: NRI plugin mode.
    nri_daemon_set: DaemonSet,
    pods: Vec<Pod>,
}

fn manifests() -> Manifests {
    let (mut runtime_classes, mut daemon_sets, mut pods) = (vec![], vec![], vec![]);
    let mut files: Vec<PathBuf> = fs::read_dir(deploy_dir())
        .expect("read deploy/kubernetes")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    assert!(files.len() >= 3, "{files:?}");
    for file in &files {
        for object in objects(file) {
            match object {
                Object::Namespace => {}
                Object::DaemonSet(d) => daemon_sets.push(*d),
                Object::Pod(p) => pods.push(*p),
                Object::RuntimeClass(r) => runtime_classes.push(*r),
            }
        }
    }
    assert_eq!((runtime_classes.len(), daemon_sets.len()), (1, 2));
    assert!(!pods.is_empty());
    let nri = daemon_sets
        .iter()
        .position(|d| d.metadata.name.as_deref() == Some("nvhook-nri"))
        .expect("a DaemonSet nvhook-nri");
    let nri_daemon_set = daemon_sets.remove(nri);
    assert_eq!(
        daemon_sets[0].metadata.name.as_deref(),
        Some("nvhook-installer")
    );
    Manifests {
        runtime_class: runtime_classes.remove(0),
        daemon_set: daemon_sets.remove(0),
        nri_daemon_set,
        pods,
    }
}

#[test]
fn runtime_class_names_the_handler_configure_writes() {
    let m = manifests();
    assert_eq!(m.runtime_class.metadata.name.as_deref(), Some("nvidia"));
    assert_eq!(
        m.runtime_class.handler,
        nvhook::configure::DEFAULT_RUNTIME_NAME
    );
    // Pods of the class land only where the installer runs.
    let class_nodes = m
        .runtime_class
        .scheduling
        .as_ref()
        .and_then(|s| s.node_selector.clone());
    let installer_nodes = pod_spec(&m.daemon_set).node_selector.clone();
    assert!(class_nodes.is_some());
    assert_eq!(class_nodes, installer_nodes);
}

#[test]
fn gpu_pod_asks_the_device_plugin_and_mounts_nothing_from_the_host() {
    let m = manifests();
    for pod in &m.pods {
        let text = serde_json::to_string(pod).unwrap();
        assert!(!text.contains("hostPath"), "{text}");
        assert!(!text.contains("alpha.kubernetes.io"), "{text}");
        let spec = pod.spec.as_ref().unwrap();
        assert!(spec.volumes.is_none(), "{text}");
        assert_eq!(
            spec.runtime_class_name.as_ref(),
            m.runtime_class.metadata.name.as_ref()
        );
        for container in &spec.containers {
            let gpus = container
                .resources
                .as_ref()
                .and_then(|r| r.limits.as_ref())
                .and_then(|l| l.get("nvidia.com/gpu"))
                .unwrap_or_else(|| panic!("no nvidia.com/gpu limit: {text}"));
            assert_eq!(gpus.0, "1");
            assert!(container.volume_mounts.is_none(), "{text}");
        }
    }
}

fn pod_spec(daemon_set: &DaemonSet) -> &k8s_openapi::api::core::v1::PodSpec {
    daemon_set
        .spec
        .template
        .spec
        .as_ref()
        .expect("the DaemonSet has a pod spec")
}

fn installer(daemon_set: &DaemonSet) -> &Container {
    let init = pod_spec(daemon_set)
        .init_containers
        .as_ref()
        .expect("init containers");
    assert_eq!(init.len(), 1);
    &init[0]
}

/// The long-running container: refresh.sh.
fn refresher(daemon_set: &DaemonSet) -> &Container {
    let refresh = pod_spec(daemon_set)
        .containers
        .iter()
        .find(|c| c.name == "refresh")
        .expect("a container named refresh");
    assert_eq!(
        refresh.command.as_deref(),
        Some(&["/opt/nvhook/refresh.sh".to_string()][..])
    );
    refresh
}

fn env_of(container: &Container) -> Vec<(String, String)> {
    container
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect()
}

fn env_value(container: &Container, name: &str) -> String {
    env_of(container)
        .into_iter()
        .find_map(|(n, v)| (n == name).then_some(v))
        .unwrap_or_else(|| panic!("installer sets no {name}"))
}

#[test]
fn installer_is_privileged_and_mounts_every_host_path_it_writes() {
    let m = manifests();
    let spec = pod_spec(&m.daemon_set);
    let install = installer(&m.daemon_set);
    assert_eq!(
        install.security_context.as_ref().and_then(|s| s.privileged),
        Some(true)
    );
    // To reach systemd through PID 1 for the restart.
    assert_eq!(spec.host_pid, Some(true));
    assert_eq!(
        install.command.as_deref(),
        Some(&["/opt/nvhook/install.sh".to_string()][..])
    );
    // The image scripts/build-installer-image.sh builds by default (its test builds one).
    let built_by_default = format!(
        "ghcr.io/nvhook/nvhook-installer:{}",
        env!("CARGO_PKG_VERSION")
    );
    for container in [install, refresher(&m.daemon_set)] {
        assert_eq!(container.image.as_deref(), Some(built_by_default.as_str()));
    }

    let host_root = env_value(install, "HOST_ROOT");
    let containerd_config = PathBuf::from(env_value(install, "CONTAINERD_CONFIG"));
    let written = [
        PathBuf::from(env_value(install, "NVHOOK_DIR")),
        // refresh.sh: nvhook cdi refresh's spec, dev-char-links' links.
        PathBuf::from(nvhook::cdi::REFRESHED_SPEC)
            .parent()
            .unwrap()
            .to_owned(),
        PathBuf::from("/dev/char"),
        PathBuf::from(nvhook::config::DEFAULT_PATH)
            .parent()
            .unwrap()
            .to_owned(),
        containerd_config.parent().unwrap().to_owned(),
    ];
    // Each container that writes there mounts a hostPath volume holding the directory, at the
    // same place under HOST_ROOT.
    let volumes = spec.volumes.as_ref().expect("volumes");
    let refresh = refresher(&m.daemon_set);
    for container in [install, refresh] {
        assert_eq!(
            container
                .security_context
                .as_ref()
                .and_then(|s| s.privileged),
            Some(true),
            "{}",
            container.name
        );
        assert_eq!(env_value(container, "HOST_ROOT"), host_root);
        let mounts = container.volume_mounts.as_ref().expect("volume mounts");
        for host_dir in &written {
            let (volume, mount) = volumes
                .iter()
                .filter_map(|v| {
                    let path = Path::new(&v.host_path.as_ref()?.path);
                    let mount = mounts.iter().find(|m| m.name == v.name)?;
                    host_dir.starts_with(path).then_some((path, mount))
                })
                .next()
                .unwrap_or_else(|| {
                    panic!(
                        "{}: no hostPath volume holds {}",
                        container.name,
                        host_dir.display()
                    )
                });
            assert_eq!(
                Path::new(&mount.mount_path),
                Path::new(&host_root).join(volume.strip_prefix("/").unwrap()),
                "{}: volume {}",
                container.name,
                mount.name
            );
            assert_ne!(mount.read_only, Some(true), "volume {}", mount.name);
        }
    }
}

/// A temporary host root with containerd's packaged config (version 2) and
/// the image's binaries where install.sh takes them from.
struct Host {
    dir: tempfile::TempDir,
}

impl Host {
    fn new() -> Host {
        Host::with_containerd_config("containerd-v2-default.toml")
    }

    /// A host whose `/etc/containerd/config.toml` is the golden `name`.
    fn with_containerd_config(name: &str) -> Host {
        let dir = tempfile::tempdir().unwrap();
        let containerd = dir.path().join("root/etc/containerd");
        fs::create_dir_all(&containerd).unwrap();
        fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/golden/configure")
                .join(name),
            containerd.join("config.toml"),
        )
        .unwrap();
        let image_bin = dir.path().join("image-bin");
        fs::create_dir(&image_bin).unwrap();
        fs::copy(nvhook_bin(), image_bin.join("nvhook")).unwrap();
        fs::copy(nvhook_runtime_bin(), image_bin.join("nvhook-runtime")).unwrap();
        fs::copy(nvhook_nvml_bin(), image_bin.join("nvhook-nvml")).unwrap();
        Host { dir }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn at(&self, host_path: &str) -> PathBuf {
        self.root().join(host_path.trim_start_matches('/'))
    }

    fn restarts(&self) -> usize {
        fs::read_to_string(self.dir.path().join("restarts"))
            .unwrap_or_default()
            .lines()
            .count()
    }

    /// install.sh with the DaemonSet's environment, but this host root, and
    /// a restart that only counts.
    fn install(&self, daemon_set: &DaemonSet) -> String {
        let output = self.install_output(daemon_set);
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "install.sh failed:\n{stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        stdout
    }

    /// [`Host::install`], succeeding or not.
    fn install_output(&self, daemon_set: &DaemonSet) -> std::process::Output {
        let mut cmd = Command::new(deploy_dir().join("install.sh"));
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default());
        for (name, value) in env_of(installer(daemon_set)) {
            cmd.env(name, value);
        }
        let restarts = self.dir.path().join("restarts");
        cmd.env("HOST_ROOT", self.root())
            .env("NVHOOK_SOURCE", self.dir.path().join("image-bin"))
            .env(
                "RESTART_CONTAINERD",
                format!("echo restart >> {}", restarts.display()),
            )
            .output()
            .expect("run install.sh")
    }
}

#[test]
fn install_sh_installs_nvhook_on_a_host_root() {
    let m = manifests();
    let host = Host::new();
    let said = host.install(&m.daemon_set);

    let bin = "/usr/local/nvhook/bin";
    for (name, built) in [
        ("nvhook", nvhook_bin()),
        ("nvhook-runtime", nvhook_runtime_bin()),
        ("nvhook-nvml", nvhook_nvml_bin()),
    ] {
        let installed = host.at(&format!("{bin}/{name}"));
        assert_eq!(fs::read(&installed).unwrap(), fs::read(built).unwrap());
        let mode = fs::metadata(&installed).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755, "{name}");
    }
    // NVIDIA's command names, beside nvhook and leading to it.
    for name in nvhook::nvidia_cli::NAMES {
        let link = host.at(&format!("{bin}/{name}"));
        assert_eq!(fs::read_link(&link).unwrap(), Path::new("nvhook"), "{name}");
    }
    let config = Config::from_file(&host.at(nvhook::config::DEFAULT_PATH)).unwrap();
    assert_eq!(config.hook_path, Some(format!("{bin}/nvhook").into()));
    assert!(!config.accept_env_when_unprivileged);
    assert!(config.accept_volume_mount_devices);
    // The host's own paths, read back by containerd itself.
    assert_containerd_handler(
        &host.at("/etc/containerd/config.toml"),
        "nvidia",
        &format!("{bin}/nvhook-runtime"),
    );
    assert_eq!(host.restarts(), 1, "{said}");

    // A second run (a pod restart, a node reboot) changes nothing, containerd included.
    let files = |host: &Host| {
        ["/etc/containerd/config.toml", nvhook::config::DEFAULT_PATH]
            .map(|p| fs::read(host.at(p)).unwrap())
    };
    let before = files(&host);
    let said = host.install(&m.daemon_set);
    assert_eq!(files(&host), before);
    assert_eq!(host.restarts(), 1, "{said}");
    assert!(said.contains("no restart"), "{said}");
}

#[test]
fn install_sh_on_containerd_2_writes_the_drop_in_its_config_imports() {
    let m = manifests();
    // containerd 2.3's own default: version 4, imports /etc/containerd/conf.d/*.toml.
    let host = Host::with_containerd_config("containerd-2.3-default.toml");
    let main = host.at("/etc/containerd/config.toml");
    let original = fs::read(&main).unwrap();
    let said = host.install(&m.daemon_set);
    let drop_in = host.at("/etc/containerd/conf.d/99-nvhook.toml");
    let written = fs::read_to_string(&drop_in).unwrap_or_else(|e| panic!("{e}: {said}"));
    assert!(
        written.contains("BinaryName = '/usr/local/nvhook/bin/nvhook-runtime'"),
        "{written}"
    );
    assert_eq!(fs::read(&main).unwrap(), original, "main config untouched");
    assert!(
        said.contains("/etc/containerd/conf.d/99-nvhook.toml"),
        "{said}"
    );
    assert_eq!(host.restarts(), 1, "{said}");
    let said = host.install(&m.daemon_set);
    assert!(said.contains("no restart"), "{said}");
    assert_eq!(host.restarts(), 1, "{said}");
}

#[test]
fn install_sh_keeps_an_admins_nvhook_config() {
    let m = manifests();
    let host = Host::new();
    let config = host.at(nvhook::config::DEFAULT_PATH);
    fs::create_dir_all(config.parent().unwrap()).unwrap();
    fs::write(&config, "driver-root = \"/run/nvidia/driver\"").unwrap();
    host.install(&m.daemon_set);
    let read = Config::from_file(&config).unwrap();
    assert_eq!(read.driver_root, Path::new("/run/nvidia/driver"));
    assert_eq!(read.hook_path, Some("/usr/local/nvhook/bin/nvhook".into()));
    assert!(!read.accept_env_when_unprivileged);

    fs::write(&config, "hook-path = \"/opt/nvhook\"\n").unwrap();
    let said = host.install(&m.daemon_set);
    assert!(said.contains("warning:"), "{said}");
    assert_eq!(
        Config::from_file(&config).unwrap().hook_path,
        Some("/opt/nvhook".into())
    );
}

/// Copies what `binary` needs from the host's loader and libraries to the same paths in
/// `root`, so that it runs chrooted there.
fn copy_shared_libraries(binary: &Path, root: &Path) {
    let listing = support::stdout_of(Command::new("ldd").arg(binary));
    for path in listing.lines().filter_map(|l| {
        let after = l.split_once("=> ").map_or(l.trim(), |(_, rest)| rest);
        after
            .split_whitespace()
            .next()
            .filter(|p| p.starts_with('/'))
    }) {
        let real = fs::canonicalize(path).unwrap();
        let inside = root.join(path.trim_start_matches('/'));
        fs::create_dir_all(inside.parent().unwrap()).unwrap();
        fs::copy(&real, &inside).unwrap_or_else(|e| panic!("{path}: {e}"));
    }
}

/// Where refresh.sh writes the node's labels for Node Feature Discovery's `local` source.
const NFD_FEATURE_FILE: &str = "/etc/kubernetes/node-feature-discovery/features.d/nvhook";

/// refresh.sh for real, the way the DaemonSet runs it: nvhook chrooted into the host's root.
/// The host root holds a simulated node, nvhook's config naming the node's paths as the
/// chroot sees them, and the loader and libraries nvhook-nvml needs; /proc and /dev are bound
/// into it in a private mount namespace, as the pod's HostToContainer mount of / gives them. The CDI
/// spec appears in the host's /var/run/cdi with the node's GPUs, the node's /dev/char links
/// are made, the NFD feature file holds the node's GPU labels, and a second round leaves the
/// spec as it was.
#[test]
fn refresh_sh_keeps_the_hosts_cdi_spec_and_dev_char_links() {
    let m = manifests();
    let host = Host::new();
    host.install(&m.daemon_set);
    let node = support::SimNode::build(&support::NodeOptions {
        parent: Some(host.root()),
        ..support::NodeOptions::gpus(2)
    });
    copy_shared_libraries(nvhook_nvml_bin(), &host.root());
    // The node's keys, as seen from inside the host root, after the installer's own.
    let prefix = format!("{}/", host.root().display());
    let node_keys: String = fs::read_to_string(node.config())
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("hook-path"))
        .map(|l| format!("{}\n", l.replace(&prefix, "/")))
        .collect();
    let config = host.at(nvhook::config::DEFAULT_PATH);
    let mut text = fs::read_to_string(&config).unwrap();
    text.push_str(&node_keys);
    fs::write(&config, text).unwrap();
    for dir in ["/proc", "/dev"] {
        fs::create_dir_all(host.at(dir)).unwrap();
    }

    let refresh = || {
        let mut cmd = Command::new(support::require_program("unshare"));
        let binds = "mount --bind /proc \"$0/proc\" && mount --bind /dev \"$0/dev\" && exec \"$1\"";
        cmd.args(["-m", "sh", "-c", binds])
            .arg(host.root())
            .arg(deploy_dir().join("refresh.sh"))
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default());
        for (name, value) in env_of(refresher(&m.daemon_set)) {
            cmd.env(name, value);
        }
        let out = cmd
            .env("HOST_ROOT", host.root())
            .env("REFRESH_INTERVAL_S", "0")
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{said}\n{}", node.log());
        said
    };
    let said = refresh();
    assert!(
        said.contains("refreshed /var/run/cdi/nvidia.yaml"),
        "{said}\n{}",
        node.log()
    );
    assert!(!said.contains("warning"), "{said}");
    // The host root holds no runc or crun for nvhook-runtime, and none of NVIDIA's command
    // names (the installer does not place them): those warnings and only those, beside any
    // about a dockerd another test of this binary runs on the machine meanwhile.
    for warning in [
        "\nwarn runtimes: none of runc, crun",
        "\nwarn name nvidia-container-runtime-hook: not on PATH",
        "\nwarn name nvidia-container-cli: not on PATH",
        "\nwarn name nvidia-cdi-hook: not on PATH",
    ] {
        assert!(said.contains(warning), "{warning:?} missing: {said}");
    }
    let dockerds = said
        .lines()
        .filter(|l| l.starts_with("warn dockerd "))
        .count();
    assert!(
        said.contains(&format!("\nready (warn: {})\n", 4 + dockerds)),
        "{said}"
    );
    let spec = host.at(nvhook::cdi::REFRESHED_SPEC);
    let names = nvhook::cdi::read_spec(&spec).unwrap().qualified_names();
    for gpu in ["nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=all"] {
        assert!(names.iter().any(|n| n == gpu), "{gpu} not in {names:?}");
    }
    let link = node.dev_root().join("dev/char/195:1");
    assert_eq!(fs::read_link(&link).unwrap(), Path::new("../nvidia1"));
    let features = fs::read_to_string(host.at(NFD_FEATURE_FILE)).unwrap();
    let labels: std::collections::BTreeMap<String, String> = features
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (name, value) = l.split_once('=').unwrap();
            (name.to_owned(), value.to_owned())
        })
        .collect();
    // The DaemonSet's MIG_STRATEGY is the device plugin's default, none.
    assert_eq!(labels, node.expected_labels(false), "{features}");

    let written = fs::read(&spec).unwrap();
    let said = refresh();
    assert!(
        said.contains("unchanged: /var/run/cdi/nvidia.yaml"),
        "{said}"
    );
    assert_eq!(fs::read(&spec).unwrap(), written);
}

/// The installer image, built by the one documented command with a private dockerd (from a
/// local busybox base: no registry is reachable here), then run as the DaemonSet's init
/// container runs it: install.sh from the image installs nvhook on a host root bound at /host.
#[test]
fn the_installer_image_builds_with_one_command_and_installs_nvhook() {
    support::require_root();
    let busybox = support::require_program("busybox");
    let docker = DockerdBuild::debian();
    installer_image_installs(
        &docker,
        "amd64",
        &busybox,
        support::profile_dir(),
        nvhook_bin(),
    );
}

/// The arm64 installer image (`ARCH=arm64`): the aarch64 binaries scripts/build-arm64.sh
/// built, on an arm64 base (Debian's arm64 busybox), a linux/arm64 image; run here under
/// qemu-aarch64 (binfmt_misc), its install.sh installs the aarch64 nvhook. Debian sid's
/// dockerd 28 builds it: Debian 12's dockerd 20.10 ignores `docker import --platform` (the
/// base, and so the image, stays amd64).
#[test]
fn the_arm64_installer_image_builds_with_one_command_and_installs_nvhook() {
    support::require_root();
    let arm64 = support::arm64::Arm64::require();
    let bin_dir = arm64.nvhook().parent().expect("the kit").to_owned();
    let docker = DockerdBuild::sid();
    installer_image_installs(&docker, "arm64", &arm64.busybox(), bin_dir, &arm64.nvhook());
}

/// Builds the installer image for `arch` with `docker`'s engine and client, its binaries from
/// `bin_dir`, on a base of `busybox` and its applets, runs it as the init container does, and
/// checks that the host got `nvhook` (these very bytes) and a containerd configured for
/// nvhook-runtime.
fn installer_image_installs(
    docker: &DockerdBuild,
    arch: &str,
    busybox: &Path,
    bin_dir: PathBuf,
    nvhook: &Path,
) {
    let dir = EngineDir::new("image-build");
    let daemon_json = dir.path().join("daemon.json");
    fs::write(&daemon_json, "{}").unwrap();
    let mut dockerd = Dockerd::start_with(docker, dir.path(), &daemon_json, &[]);

    // A base with a shell, coreutils and chroot: busybox and every applet it has.
    let base = dir.path().join("base");
    fs::create_dir_all(base.join("bin")).unwrap();
    fs::copy(busybox, base.join("bin/busybox")).unwrap();
    let applets = support::stdout_of(Command::new(busybox).arg("--list"));
    for applet in applets.lines().filter(|a| *a != "busybox") {
        std::os::unix::fs::symlink("busybox", base.join("bin").join(applet)).unwrap();
    }
    let tar = dir.path().join("base.tar");
    write_rootfs_tar(&base, &tar);
    let base_image = format!("nvhook-test/base:{}", unique_name("b"));
    let platform = format!("linux/{arch}");
    dockerd.docker_checked(&[
        "import",
        "--platform",
        &platform,
        tar.to_str().unwrap(),
        &base_image,
    ]);

    let image = format!("nvhook-test/installer:{}", unique_name("i"));
    let out = Command::new(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/build-installer-image.sh"),
    )
    .arg(&image)
    .env("DOCKER_HOST", dockerd.host())
    // The script runs the docker on PATH: this build's client first.
    .env("PATH", client_first(&docker.program("docker")))
    .env("ARCH", arch)
    .env("BIN_DIR", bin_dir)
    .env("BASE", &base_image)
    .output()
    .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{said}{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        dockerd.log()
    );
    assert_eq!(said.trim(), image);
    let inspected =
        dockerd.docker_checked(&["image", "inspect", "--format", "{{.Architecture}}", &image]);
    assert_eq!(inspected.trim(), arch);

    let host = Host::new();
    let bind = format!("{}:/host", host.root().display());
    let installed = dockerd.docker_checked(&[
        "run",
        "--rm",
        "--network",
        "none",
        "-v",
        &bind,
        "-e",
        "HOST_ROOT=/host",
        "-e",
        "RESTART_CONTAINERD=echo restart",
        &image,
    ]);
    assert!(installed.contains("restarting containerd"), "{installed}");
    assert_eq!(
        fs::read(host.at("/usr/local/nvhook/bin/nvhook")).unwrap(),
        fs::read(nvhook).unwrap()
    );
    assert_containerd_handler(
        &host.at("/etc/containerd/config.toml"),
        "nvidia",
        "/usr/local/nvhook/bin/nvhook-runtime",
    );
    let listed = dockerd.docker_checked(&[
        "run",
        "--rm",
        "--network",
        "none",
        "--entrypoint",
        "/bin/ls",
        &image,
        "/opt/nvhook",
    ]);
    assert_eq!(
        listed.split_whitespace().collect::<Vec<_>>(),
        ["bin", "install.sh", "refresh.sh"]
    );
    assert!(dockerd.shutdown(), "{}", dockerd.log());
}

/// PATH with `client`'s directory first.
fn client_first(client: &Path) -> std::ffi::OsString {
    let dir = client.parent().expect("a program lives in a directory");
    let rest = std::env::var_os("PATH").unwrap_or_default();
    std::env::join_paths(std::iter::once(dir.to_owned()).chain(std::env::split_paths(&rest)))
        .expect("PATH entries hold no ':'")
}

// ---- NRI plugin mode: nvhook-installer-nri.yaml ----

/// The NRI DaemonSet: install.sh in NRI mode, with no hostPID (it restarts nothing), and a
/// long-running container that runs the installed nvhook as the plugin in the host's root.
#[test]
fn nri_daemon_set_installs_then_runs_the_plugin_and_restarts_nothing() {
    let m = manifests();
    let spec = pod_spec(&m.nri_daemon_set);
    assert_ne!(spec.host_pid, Some(true), "NRI mode restarts no engine");
    assert_eq!(
        spec.node_selector,
        pod_spec(&m.daemon_set).node_selector,
        "the same GPU nodes"
    );
    let install = installer(&m.nri_daemon_set);
    assert_eq!(env_value(install, "NVHOOK_MODE"), "nri");
    let host_root = env_value(install, "HOST_ROOT");
    let nri = spec
        .containers
        .iter()
        .find(|c| c.name == "nri")
        .expect("a container named nri");
    let command = nri.command.clone().unwrap();
    let nvhook = format!("{}/bin/nvhook", env_value(install, "NVHOOK_DIR"));
    assert_eq!(
        command,
        ["chroot", host_root.as_str(), nvhook.as_str(), "nri"]
    );
    assert_eq!(
        nri.security_context.as_ref().and_then(|s| s.privileged),
        Some(true)
    );
    let mount = &nri.volume_mounts.as_ref().unwrap()[0];
    assert_eq!(mount.mount_path, host_root);
    let volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .unwrap();
    assert_eq!(volume.host_path.as_ref().unwrap().path, "/");
    refresher(&m.nri_daemon_set);
}

/// containerd 1.7 ships NRI off: NRI mode stops with the one-time fix, and changes nothing.
#[test]
fn install_sh_nri_mode_stops_where_containerd_runs_no_nri() {
    let m = manifests();
    let host = Host::with_containerd_config("containerd-1.7-default.toml");
    let config = host.at("/etc/containerd/config.toml");
    let before = fs::read(&config).unwrap();
    let out = host.install_output(&m.nri_daemon_set);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("nvhook configure containerd --nri"),
        "{stderr}"
    );
    assert_eq!(fs::read(&config).unwrap(), before);
    assert_eq!(host.restarts(), 0);
    assert_eq!(fs::read_dir(config.parent().unwrap()).unwrap().count(), 1);
}

/// NRI mode end to end, with Debian sid's containerd 2.1.9 as a node runs it: install.sh
/// (NVHOOK_MODE=nri, as the DaemonSet sets it) installs nvhook and its Kubernetes policy and
/// leaves containerd's config byte for byte as it was, with no restart and no runtime
/// handler; the DaemonSet's nri container's command (here without its chroot: the test's
/// host root is not this machine's) connects the installed nvhook to containerd's NRI socket;
/// a pod of the default runtime that the device plugin allocated GPU 2 (volume-mount list,
/// the hardened policy's way) gets GPU 2 and the driver, and no other GPU.
#[test]
fn install_sh_nri_mode_gives_a_pod_its_gpu_with_containerd_unchanged() {
    use std::time::{Duration, Instant};
    use support::containerd2::{Containerd2Cri, DEFAULT_HANDLER};
    use support::cri::{ContainerRequest, Cri};
    use support::engines::{CgroupParent, ImageConfig};

    support::require_root();
    let m = manifests();
    let node = support::SimNode::create(4);
    let dir = EngineDir::new("k8s-nri");
    let setup = Containerd2Cri::under(dir.path());
    let containerd = setup.start(dir.path(), &[]);
    let app = format!("docker.io/nvhook-test/{}:latest", unique_name("cuda-app"));
    let image = ImageConfig {
        cmd: &["/gpucheck"],
        env: &["NVIDIA_VISIBLE_DEVICES=all"],
    };
    containerd.import_rootfs(dir.path(), support::glibc_image().rootfs(), &app, &image);

    // The host root: containerd's own config file (the same file: a hard link), and nvhook's
    // config an admin wrote for this node (the simulated node's paths and its hook-path).
    let host = Host::new();
    let config = host.at("/etc/containerd/config.toml");
    fs::remove_file(&config).unwrap();
    fs::hard_link(dir.path().join("containerd.toml"), &config).unwrap();
    let before = fs::read(&config).unwrap();
    let nvhook_config = host.at(nvhook::config::DEFAULT_PATH);
    fs::create_dir_all(nvhook_config.parent().unwrap()).unwrap();
    fs::copy(node.config(), &nvhook_config).unwrap();

    let said = host.install(&m.nri_daemon_set);
    assert!(said.contains("no restart"), "{said}");
    assert_eq!(host.restarts(), 0, "{said}");
    assert_eq!(fs::read(&config).unwrap(), before, "{said}");
    assert!(!String::from_utf8_lossy(&before).contains("nvhook-runtime"));
    assert_eq!(fs::read_dir(config.parent().unwrap()).unwrap().count(), 1);
    let installed = Config::from_file(&host.at(nvhook::config::DEFAULT_PATH)).unwrap();
    assert!(!installed.accept_env_when_unprivileged, "{said}");

    // The nri container's command, its program the installed nvhook.
    let spec = pod_spec(&m.nri_daemon_set);
    let nri = spec.containers.iter().find(|c| c.name == "nri").unwrap();
    let command = nri.command.as_ref().unwrap();
    let stderr = dir.path().join("nri.stderr");
    let mut plugin = Command::new(host.at(&command[2]))
        .args(&command[3..])
        .arg("--socket")
        .arg(&setup.nri.socket)
        .env_clear()
        .env("NVHOOK_CONFIG", host.at(nvhook::config::DEFAULT_PATH))
        .stderr(fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !node.log().contains("registered and configured") {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the plugin never registered\n{}\n{}",
            fs::read_to_string(&stderr).unwrap_or_default(),
            containerd.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let mut cri = Cri::connect(containerd.socket());
    let cgroups = CgroupParent::new("nvhook-k8s-nri");
    let mount_point = format!("/var/run/nvidia-container-devices/{}", node.gpu_uuid(2));
    let request = |mounts| ContainerRequest {
        image: &app,
        args: &[
            "/gpucheck",
            "--dev",
            "/dev/nvidia0",
            "--dev",
            "/dev/nvidia2",
            "--ls",
            "/dev",
        ],
        mounts,
        ..Default::default()
    };
    let run = |cri: &mut Cri, name: &str, mounts| {
        let logs = dir.path().join("pods");
        let output = cri
            .run_pod(
                &unique_name(name),
                DEFAULT_HANDLER,
                &cgroups.path(),
                &logs,
                &request(mounts),
            )
            .output;
        let context = format!("{output}\n{}\n{}", node.log(), containerd.log());
        (output, context)
    };
    let allocated = [(mount_point.as_str(), "/dev/null")];
    let (gpu, context) = run(&mut cri, "gpu", &allocated);
    gpu.assert_success();
    assert!(gpu.has_line("dev /dev/nvidia2 ENXIO"), "{context}");
    assert!(gpu.has_line("dev /dev/nvidia0 absent"), "{context}");
    assert_eq!(gpu.gpu_nodes_in_dev(), ["nvidia2"], "{context}");
    assert!(gpu.has_line("dlopen libcuda.so.1 ok"), "{context}");
    // The image's own NVIDIA_VISIBLE_DEVICES=all counts for nothing under the policy.
    let (none, context) = run(&mut cri, "nogpu", &[]);
    none.assert_success();
    assert!(none.gpu_nodes_in_dev().is_empty(), "{context}");
    assert_eq!(fs::read(&config).unwrap(), before);
    let _ = plugin.kill();
    let _ = plugin.wait();
}
