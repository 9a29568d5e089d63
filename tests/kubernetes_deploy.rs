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
use k8s_openapi::api::core::v1::{Container, Namespace, Pod, ServiceAccount};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::resource::v1::DeviceClass;
use nvhook::config;
use serde::Deserialize;
use serde_json::Value;
use support::engines::{
    Dockerd, DockerdBuild, EngineDir, assert_containerd_handler, nvhook_nvml_bin,
    nvhook_runtime_bin, unique_name, write_rootfs_tar,
};
use support::nvhook_bin;

fn repo_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn deploy_dir() -> PathBuf {
    repo_dir().join("deploy/kubernetes")
}

enum Object {
    /// Checked, and needed by nothing else.
    Namespace,
    DaemonSet(Box<DaemonSet>),
    Pod(Box<Pod>),
    RuntimeClass(Box<RuntimeClass>),
    ServiceAccount(Box<ServiceAccount>),
    ClusterRole(Box<ClusterRole>),
    ClusterRoleBinding(Box<ClusterRoleBinding>),
    DeviceClass(Box<DeviceClass>),
}

/// Each YAML document of `file` as its typed Kubernetes object. A field the
/// type does not know (a typo, a wrong level) is an error: what the type
/// serializes back must hold every field of the document.
fn objects(file: &Path) -> Vec<Object> {
    let text = fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let name = file.file_name().unwrap().to_string_lossy().into_owned();
    serde_norway::Deserializer::from_str(&text)
        .map(|document| {
            let yaml = serde_norway::Value::deserialize(document)
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
                "ServiceAccount" => Object::ServiceAccount(typed(&name, &json)),
                "ClusterRole" => Object::ClusterRole(typed(&name, &json)),
                "ClusterRoleBinding" => Object::ClusterRoleBinding(typed(&name, &json)),
                "DeviceClass" => Object::DeviceClass(typed(&name, &json)),
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
    /// nvidia-device-plugin.yaml's: NVIDIA's device plugin, set up for nvhook's policy.
    device_plugin: DaemonSet,
    /// gpu-pod.yaml's (runtime mode) and gpu-pod-nri.yaml's (NRI mode).
    gpu_pod: Pod,
    gpu_pod_nri: Pod,
    /// nvhook-dra.yaml's: the DRA kubelet plugin, its account and what the account may do.
    dra_daemon_set: DaemonSet,
    dra_service_account: ServiceAccount,
    dra_cluster_role: ClusterRole,
    dra_cluster_role_binding: ClusterRoleBinding,
    /// deviceclasses.yaml's.
    device_classes: Vec<DeviceClass>,
}

fn manifests() -> Manifests {
    let mut runtime_classes = vec![];
    let (mut daemon_set, mut nri_daemon_set, mut device_plugin) = (None, None, None);
    let (mut gpu_pod, mut gpu_pod_nri) = (None, None);
    let (mut dra_daemon_set, mut dra_service_account) = (None, None);
    let (mut dra_cluster_role, mut dra_cluster_role_binding) = (None, None);
    let mut device_classes = vec![];
    let mut files: Vec<PathBuf> = fs::read_dir(deploy_dir())
        .expect("read deploy/kubernetes")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    assert!(files.len() >= 3, "{files:?}");
    for file in &files {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        for object in objects(file) {
            match object {
                Object::Namespace => {}
                Object::DaemonSet(d) => {
                    let slot = match d.metadata.name.as_deref() {
                        Some("nvhook-installer") => &mut daemon_set,
                        Some("nvhook-nri") => &mut nri_daemon_set,
                        Some("nvidia-device-plugin-daemonset") => &mut device_plugin,
                        Some("nvhook-dra") => &mut dra_daemon_set,
                        other => panic!("{name}: a DaemonSet {other:?} this test does not know"),
                    };
                    assert!(slot.replace(*d).is_none(), "{name}: a second DaemonSet");
                }
                Object::Pod(p) => {
                    let slot = match name.as_str() {
                        "gpu-pod.yaml" => &mut gpu_pod,
                        "gpu-pod-nri.yaml" => &mut gpu_pod_nri,
                        other => panic!("{other}: a pod this test does not know"),
                    };
                    assert!(slot.replace(*p).is_none(), "{name}: a second pod");
                }
                Object::RuntimeClass(r) => runtime_classes.push(*r),
                Object::ServiceAccount(a) => {
                    assert_eq!(
                        name, "nvhook-dra.yaml",
                        "a ServiceAccount this test does not know"
                    );
                    assert!(
                        dra_service_account.replace(*a).is_none(),
                        "{name}: a second one"
                    );
                }
                Object::ClusterRole(r) => {
                    assert_eq!(
                        name, "nvhook-dra.yaml",
                        "a ClusterRole this test does not know"
                    );
                    assert!(
                        dra_cluster_role.replace(*r).is_none(),
                        "{name}: a second one"
                    );
                }
                Object::ClusterRoleBinding(b) => {
                    assert_eq!(name, "nvhook-dra.yaml", "a binding this test does not know");
                    assert!(
                        dra_cluster_role_binding.replace(*b).is_none(),
                        "{name}: a second one"
                    );
                }
                Object::DeviceClass(c) => {
                    assert_eq!(name, "deviceclasses.yaml", "a DeviceClass elsewhere");
                    device_classes.push(*c);
                }
            }
        }
    }
    assert_eq!(runtime_classes.len(), 1);
    Manifests {
        runtime_class: runtime_classes.remove(0),
        daemon_set: daemon_set.expect("a DaemonSet nvhook-installer"),
        nri_daemon_set: nri_daemon_set.expect("a DaemonSet nvhook-nri"),
        device_plugin: device_plugin.expect("a DaemonSet nvidia-device-plugin-daemonset"),
        gpu_pod: gpu_pod.expect("gpu-pod.yaml"),
        gpu_pod_nri: gpu_pod_nri.expect("gpu-pod-nri.yaml"),
        dra_daemon_set: dra_daemon_set.expect("a DaemonSet nvhook-dra"),
        dra_service_account: dra_service_account.expect("nvhook-dra.yaml's ServiceAccount"),
        dra_cluster_role: dra_cluster_role.expect("nvhook-dra.yaml's ClusterRole"),
        dra_cluster_role_binding: dra_cluster_role_binding
            .expect("nvhook-dra.yaml's ClusterRoleBinding"),
        device_classes,
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
    // Runtime mode names the RuntimeClass; NRI mode has none to name.
    for (pod, class) in [
        (&m.gpu_pod, m.runtime_class.metadata.name.as_ref()),
        (&m.gpu_pod_nri, None),
    ] {
        let text = serde_json::to_string(pod).unwrap();
        assert!(!text.contains("hostPath"), "{text}");
        assert!(!text.contains("alpha.kubernetes.io"), "{text}");
        let spec = pod.spec.as_ref().unwrap();
        assert!(spec.volumes.is_none(), "{text}");
        assert_eq!(spec.runtime_class_name.as_ref(), class, "{text}");
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

/// gpu-pod-nri.yaml is gpu-pod.yaml for NRI mode: no runtimeClassName, and otherwise the same
/// pod, container for container; both docs that describe NRI mode on Kubernetes name it.
#[test]
fn gpu_pod_nri_is_gpu_pod_without_the_runtime_class() {
    let m = manifests();
    let nri = m.gpu_pod_nri.spec.as_ref().unwrap();
    assert_eq!(nri.runtime_class_name, None);
    let mut runtime_mode = m.gpu_pod.clone();
    let spec = runtime_mode.spec.as_mut().unwrap();
    assert_eq!(spec.runtime_class_name.as_deref(), Some("nvidia"));
    spec.runtime_class_name = None;
    assert_eq!(runtime_mode, m.gpu_pod_nri);
    for doc in ["docs/kubernetes.md", "docs/nri.md"] {
        let text = fs::read_to_string(repo_dir().join(doc)).unwrap();
        assert!(
            text.contains("deploy/kubernetes/gpu-pod-nri.yaml"),
            "{doc} does not name gpu-pod-nri.yaml"
        );
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

    /// uninstall.sh with the environment install.sh had (`daemon_set`'s), this host root and
    /// the counting restart; it must succeed.
    fn uninstall(&self, daemon_set: &DaemonSet) -> String {
        let mut cmd = Command::new(deploy_dir().join("uninstall.sh"));
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default());
        for (name, value) in env_of(installer(daemon_set)) {
            if name != "NVHOOK_MODE" {
                cmd.env(name, value);
            }
        }
        let restarts = self.dir.path().join("restarts");
        let output = cmd
            .env("HOST_ROOT", self.root())
            .env(
                "RESTART_CONTAINERD",
                format!("echo restart >> {}", restarts.display()),
            )
            .output()
            .expect("run uninstall.sh");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(output.status.success(), "uninstall.sh failed:\n{said}");
        said
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
    let config = config::from_file(&host.at(nvhook::config::DEFAULT_PATH)).unwrap();
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
    let read = config::from_file(&config).unwrap();
    assert_eq!(read.driver_root, Path::new("/run/nvidia/driver"));
    assert_eq!(read.hook_path, Some("/usr/local/nvhook/bin/nvhook".into()));
    assert!(!read.accept_env_when_unprivileged);

    fs::write(&config, "hook-path = \"/opt/nvhook\"\n").unwrap();
    let said = host.install(&m.daemon_set);
    assert!(said.contains("warning:"), "{said}");
    assert_eq!(
        config::from_file(&config).unwrap().hook_path,
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

/// A simulated node of two GPUs inside `host`'s root, with the loader and libraries
/// nvhook-nvml needs and the /proc and /dev that [`run_refresh`] binds; and the node's config
/// keys as seen from inside that root (its paths, no hook-path), for nvhook's config.
fn node_in(host: &Host) -> (support::SimNode, String) {
    let node = support::SimNode::build(&support::NodeOptions {
        parent: Some(host.root()),
        ..support::NodeOptions::gpus(2)
    });
    copy_shared_libraries(nvhook_nvml_bin(), &host.root());
    let prefix = format!("{}/", host.root().display());
    let node_keys: String = fs::read_to_string(node.config())
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("hook-path"))
        .map(|l| format!("{}\n", l.replace(&prefix, "/")))
        .collect();
    for dir in ["/proc", "/dev"] {
        fs::create_dir_all(host.at(dir)).unwrap();
    }
    (node, node_keys)
}

/// refresh.sh once (REFRESH_INTERVAL_S=0) with `daemon_set`'s environment, chrooted into
/// `host`'s root as the DaemonSet runs it, the machine's /proc and /dev bound into that root
/// in a private mount namespace; it must succeed.
fn run_refresh(host: &Host, daemon_set: &DaemonSet, node: &support::SimNode) -> String {
    let mut cmd = Command::new(support::require_program("unshare"));
    let binds = "mount --bind /proc \"$0/proc\" && mount --bind /dev \"$0/dev\" && exec \"$1\"";
    cmd.args(["-m", "sh", "-c", binds])
        .arg(host.root())
        .arg(deploy_dir().join("refresh.sh"))
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    for (name, value) in env_of(refresher(daemon_set)) {
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
}

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
    let (node, node_keys) = node_in(&host);
    // The node's keys after the installer's own.
    let config = host.at(nvhook::config::DEFAULT_PATH);
    let mut text = fs::read_to_string(&config).unwrap();
    text.push_str(&node_keys);
    fs::write(&config, text).unwrap();

    let refresh = || run_refresh(&host, &m.daemon_set, &node);
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
/// The image holds nvhook-dra too, and `nvhook-dra --version` runs in it.
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
    // nvhook-dra links glibc, which the image's own base (debian-slim) has and busybox lacks.
    assert!(
        bin_dir.join("nvhook-dra").is_file(),
        "{} has no nvhook-dra",
        bin_dir.display()
    );
    if arch == "amd64" {
        let dra = support::workspace_bin("nvhook-dra");
        assert_eq!(bin_dir.join("nvhook-dra"), dra);
        copy_shared_libraries(&dra, &base);
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
    .env("BIN_DIR", &bin_dir)
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
    let original = fs::read(host.at("/etc/containerd/config.toml")).unwrap();
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
    // The image's uninstall.sh, as `kubectl debug node` runs it (the host's root at /host):
    // containerd's config back as it was, nvhook gone.
    let uninstalled = dockerd.docker_checked(&[
        "run",
        "--rm",
        "--network",
        "none",
        "-v",
        &bind,
        "-e",
        "RESTART_CONTAINERD=echo restart",
        "--entrypoint",
        "/opt/nvhook/uninstall.sh",
        &image,
    ]);
    assert!(
        uninstalled.contains("restarting containerd"),
        "{uninstalled}"
    );
    assert_eq!(
        fs::read(host.at("/etc/containerd/config.toml")).unwrap(),
        original,
        "{uninstalled}"
    );
    for gone in ["/usr/local/nvhook", nvhook::config::DEFAULT_PATH] {
        assert!(!host.at(gone).exists(), "{gone} is left: {uninstalled}");
    }
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
        ["bin", "install.sh", "refresh.sh", "uninstall.sh"]
    );
    // nvhook-dra, which nvhook-dra.yaml's init container copies from the image: there, and
    // (amd64, whose base here has its shared libraries) it runs.
    let listed = dockerd.docker_checked(&[
        "run",
        "--rm",
        "--network",
        "none",
        "--entrypoint",
        "/bin/ls",
        &image,
        "/opt/nvhook/bin",
    ]);
    assert_eq!(
        listed.split_whitespace().collect::<Vec<_>>(),
        ["nvhook", "nvhook-dra", "nvhook-nvml", "nvhook-runtime"]
    );
    if arch == "amd64" {
        let version = dockerd.docker_checked(&[
            "run",
            "--rm",
            "--network",
            "none",
            "--entrypoint",
            "/opt/nvhook/bin/nvhook-dra",
            &image,
            "--version",
        ]);
        assert_eq!(
            version.trim(),
            format!("nvhook-dra {}", env!("CARGO_PKG_VERSION"))
        );
    }
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

/// The NRI DaemonSet: install.sh in NRI mode, and a long-running container that runs the
/// installed nvhook as the plugin in the host's root, with the host's PIDs, which it needs to
/// gather driver directories in the engine's mount namespace (nri_e2e's plugin in a mount
/// namespace of its own; restarting nothing is install_sh_nri_mode_gives_a_pod_its_gpu...'s).
#[test]
fn nri_daemon_set_installs_then_runs_the_plugin_and_restarts_nothing() {
    let m = manifests();
    let spec = pod_spec(&m.nri_daemon_set);
    assert_eq!(
        spec.host_pid,
        Some(true),
        "the plugin sees the engine's pid"
    );
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
    let installed = config::from_file(&host.at(nvhook::config::DEFAULT_PATH)).unwrap();
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

// ---- The installer image: where it comes from ----

/// The image scripts/build-installer-image.sh builds when given no name (amd64), as the
/// script spells it (`amd64) image=${1:-NAME}`), its `$version` the nvhook package's.
fn default_installer_image() -> String {
    let script = fs::read_to_string(repo_dir().join("scripts/build-installer-image.sh")).unwrap();
    let line = script
        .lines()
        .find(|l| l.trim_start().starts_with("amd64) image=${1:-"))
        .expect("build-installer-image.sh: an `amd64) image=${1:-NAME}` line");
    assert!(
        script.contains("version=$(cd \"$repo\" && cargo pkgid --quiet -p nvhook"),
        "the script's $version is no longer nvhook's package version: update this test"
    );
    let default = line
        .split_once("${1:-")
        .unwrap()
        .1
        .split_once('}')
        .unwrap()
        .0;
    default.replace("$version", env!("CARGO_PKG_VERSION"))
}

/// The comment lines a manifest starts with, without their `#` and one space.
fn leading_comment(file: &Path) -> Vec<String> {
    fs::read_to_string(file)
        .unwrap()
        .lines()
        .take_while(|l| l.starts_with('#'))
        .map(|l| l.trim_start_matches('#').trim().to_owned())
        .collect()
}

/// The one comment line of `comment` that starts with `start`.
fn comment_line<'a>(file: &str, comment: &'a [String], start: &str) -> &'a str {
    let lines: Vec<&String> = comment.iter().filter(|l| l.starts_with(start)).collect();
    assert_eq!(
        lines.len(),
        1,
        "{file}: the comment lines starting {start:?}"
    );
    lines[0]
}

/// A `sed 'EXPRESSION' deploy/kubernetes/FILE | kubectl apply -f -` line run as written: the
/// manifest kubectl would get, its DaemonSets and pods.
fn sed_applied(file: &str, line: &str, registry: &str) -> Vec<Object> {
    let (expression, rest) = line
        .strip_prefix("sed '")
        .and_then(|l| l.split_once('\''))
        .unwrap_or_else(|| panic!("{file}: {line:?} is not sed 'EXPRESSION' ..."));
    assert_eq!(
        rest.trim(),
        format!("deploy/kubernetes/{file} | kubectl apply -f -"),
        "{file}: {line}"
    );
    let out = Command::new("sed")
        .arg(expression.replace("REGISTRY", registry))
        .arg(deploy_dir().join(file))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = tempfile::tempdir().unwrap();
    let edited = dir.path().join(file);
    fs::write(&edited, &out.stdout).unwrap();
    objects(&edited)
}

/// Init containers and containers of a DaemonSet's pod.
fn all_containers(daemon_set: &DaemonSet) -> Vec<&Container> {
    let spec = pod_spec(daemon_set);
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .collect()
}

/// Both installer manifests, and nvhook-dra.yaml, run the image scripts/build-installer-image.sh
/// builds by default (so that build, then apply works where nodes take images from their own
/// store), pulled only when the node lacks it; and they say how to build it, push it, and point the manifest at the
/// pushed name. The comment's sed line and `kubectl set image` line are checked by running the
/// one and reading the other against the DaemonSet: every container, the right names.
#[test]
fn installer_manifests_run_the_built_image_and_say_how_to_build_and_push_it() {
    let m = manifests();
    let image = default_installer_image();
    let version = env!("CARGO_PKG_VERSION");
    let registry = "registry.example.com/gpu";
    let pushed = format!("{registry}/nvhook-installer:{version}");
    for (file, daemon_set) in [
        ("nvhook-installer.yaml", &m.daemon_set),
        ("nvhook-installer-nri.yaml", &m.nri_daemon_set),
        ("nvhook-dra.yaml", &m.dra_daemon_set),
    ] {
        let containers = all_containers(daemon_set);
        for container in &containers {
            assert_eq!(container.image.as_deref(), Some(image.as_str()), "{file}");
            assert_eq!(
                container.image_pull_policy.as_deref(),
                Some("IfNotPresent"),
                "{file}: {}",
                container.name
            );
        }
        let comment = leading_comment(&deploy_dir().join(file));
        let build = comment_line(file, &comment, "scripts/build-installer-image.sh ");
        assert!(
            build.contains(&format!("# builds {image}")),
            "{file}: {build}"
        );
        comment_line(
            file,
            &comment,
            &format!("docker tag {image} REGISTRY/nvhook-installer:{version}"),
        );
        comment_line(
            file,
            &comment,
            &format!("docker push REGISTRY/nvhook-installer:{version}"),
        );

        // The sed line: every image becomes the pushed one, and nothing else changes.
        let sed = comment_line(file, &comment, "sed '");
        let mut edited = sed_applied(file, sed, registry)
            .into_iter()
            .filter_map(|o| match o {
                Object::DaemonSet(d) => Some(*d),
                _ => None,
            })
            .collect::<Vec<_>>();
        assert_eq!(edited.len(), 1, "{file}");
        let mut edited = edited.remove(0);
        let template = edited.spec.template.spec.as_mut().unwrap();
        for container in template
            .init_containers
            .iter_mut()
            .flatten()
            .chain(template.containers.iter_mut())
        {
            assert_eq!(container.image.as_deref(), Some(pushed.as_str()), "{file}");
            container.image = Some(image.clone());
        }
        assert_eq!(
            &edited, daemon_set,
            "{file}: the sed line changed more than the image"
        );

        // kubectl set image, for a DaemonSet already applied: its namespace, its name, and
        // every one of its containers.
        let set = comment_line(file, &comment, "kubectl -n ");
        let words: Vec<&str> = set.split_whitespace().collect();
        assert_eq!(
            words[..4],
            ["kubectl", "-n", "nvhook-system", "set"],
            "{set}"
        );
        assert_eq!(
            Some(words[2]),
            daemon_set.metadata.namespace.as_deref(),
            "{set}"
        );
        assert_eq!(words[4], "image", "{set}");
        assert_eq!(
            words[5],
            format!("daemonset/{}", daemon_set.metadata.name.as_deref().unwrap()),
            "{set}"
        );
        let mut named: Vec<&str> = words[6..]
            .iter()
            .map(|w| {
                let (container, image) = w.split_once('=').unwrap();
                assert_eq!(
                    image,
                    format!("REGISTRY/nvhook-installer:{version}"),
                    "{set}"
                );
                container
            })
            .collect();
        let mut all: Vec<&str> = containers.iter().map(|c| c.name.as_str()).collect();
        named.sort();
        all.sort();
        assert_eq!(named, all, "{file}: {set}");
    }
    // The guide says the same.
    let docs = fs::read_to_string(repo_dir().join("docs/kubernetes.md")).unwrap();
    for needed in [
        "scripts/build-installer-image.sh",
        &format!("docker push REGISTRY/nvhook-installer:{version}"),
        "kubectl -n nvhook-system set image daemonset/nvhook-installer",
        &format!("sed 's|{image}|REGISTRY/nvhook-installer:{version}|'"),
    ] {
        assert!(docs.contains(needed), "docs/kubernetes.md lacks {needed:?}");
    }
}

// ---- NVIDIA's device plugin under nvhook's policy ----

/// The environment NVIDIA's k8s-device-plugin image sets (deployments/container/Dockerfile at
/// v0.20.0): what the container starts with before the pod's own `env`.
const DEVICE_PLUGIN_IMAGE_ENV: [(&str, &str); 3] = [
    ("NVIDIA_DISABLE_REQUIRE", "true"),
    ("NVIDIA_VISIBLE_DEVICES", "all"),
    ("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"),
];

/// The container's environment as the engine builds it: the image's, then the pod's, a name
/// the pod sets replacing the image's.
fn engine_env(container: &Container, image: &[(&str, &str)]) -> Vec<String> {
    let mut env: Vec<(String, String)> = image
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    for (name, value) in env_of(container) {
        env.retain(|(n, _)| *n != name);
        env.push((name, value));
    }
    env.into_iter().map(|(n, v)| format!("{n}={v}")).collect()
}

/// (host path, container path, read-only) of each hostPath volume `container` mounts.
fn host_path_mounts(
    spec: &k8s_openapi::api::core::v1::PodSpec,
    container: &Container,
) -> Vec<(String, String, bool)> {
    container
        .volume_mounts
        .iter()
        .flatten()
        .filter_map(|m| {
            let volume = spec.volumes.iter().flatten().find(|v| v.name == m.name)?;
            let host = volume.host_path.as_ref()?;
            Some((
                host.path.clone(),
                m.mount_path.clone(),
                m.read_only == Some(true),
            ))
        })
        .collect()
}

/// nvidia-device-plugin.yaml: NVIDIA's plugin at a release tag, handing out GPUs as volume
/// mounts, through nvhook's RuntimeClass on the installer's nodes, registering in the kubelet's
/// device-plugins directory; and the plugin itself gets NVML from nvhook under the policy
/// install.sh sets, unprivileged: in runtime mode nvhook-runtime's plan (nvhook plan on the
/// container's config.json, on a simulated node) gives it every GPU's node and libnvidia-ml,
/// in NRI mode (the manifest applied through its comment's sed line, no runtimeClassName) the
/// NRI plugin reads the same request; without the all-gpus mount (NVIDIA's manifest as it
/// ships) it would get nothing.
#[test]
fn device_plugin_gets_nvml_from_nvhook_under_the_hardened_policy() {
    let m = manifests();
    let file = "nvidia-device-plugin.yaml";
    let spec = pod_spec(&m.device_plugin);
    assert_eq!(
        spec.runtime_class_name.as_ref(),
        m.runtime_class.metadata.name.as_ref()
    );
    assert_eq!(spec.node_selector, pod_spec(&m.daemon_set).node_selector);
    assert_eq!(
        spec.node_selector
            .as_ref()
            .unwrap()
            .get("nvidia.com/gpu.present"),
        Some(&"true".to_string())
    );
    assert_eq!(spec.containers.len(), 1);
    let plugin = &spec.containers[0];
    let image = plugin.image.as_deref().unwrap();
    let tag = image
        .strip_prefix("nvcr.io/nvidia/k8s-device-plugin:v")
        .unwrap_or_else(|| panic!("{image}"));
    assert_eq!(tag, "0.20.0", "the release the manifest and the docs name");
    assert_eq!(env_value(plugin, "DEVICE_LIST_STRATEGY"), "volume-mounts");
    let mounts = host_path_mounts(spec, plugin);
    let kubelet = "/var/lib/kubelet/device-plugins".to_string();
    assert!(
        mounts.contains(&(kubelet.clone(), kubelet, false)),
        "{mounts:?}"
    );
    // Unprivileged, as NVIDIA ships it: the mount, not privilege, gets it its GPUs.
    let security = plugin.security_context.as_ref().unwrap();
    assert_ne!(security.privileged, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(
        security.capabilities.as_ref().unwrap().drop.as_deref(),
        Some(&["ALL".to_string()][..])
    );

    // The policy install.sh sets, on a simulated node.
    let host = Host::new();
    host.install(&m.daemon_set);
    let policy: String = fs::read_to_string(host.at(nvhook::config::DEFAULT_PATH))
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("accept-"))
        .map(|l| format!("{l}\n"))
        .collect();
    let node = support::SimNode::create(2);
    let config_file = node.root().join("hardened.toml");
    fs::write(
        &config_file,
        fs::read_to_string(node.config()).unwrap() + &policy,
    )
    .unwrap();
    let config = config::from_file(&config_file).unwrap();
    assert!(!config.accept_env_when_unprivileged, "{policy}");
    assert!(config.accept_volume_mount_devices, "{policy}");

    let env = engine_env(plugin, &DEVICE_PLUGIN_IMAGE_ENV);
    // Runtime mode: the plan nvhook-runtime makes from the container's config.json (every
    // capability dropped: an empty bounding set).
    let plan = |mounts: &[(String, String, bool)]| -> Value {
        let bundle = tempfile::tempdir().unwrap();
        fs::create_dir(bundle.path().join("rootfs")).unwrap();
        let config_json = serde_json::json!({
            "ociVersion": "1.2.0",
            "root": {"path": "rootfs"},
            "process": {"env": env, "capabilities": {"bounding": []}},
            "mounts": mounts.iter().map(|(source, destination, ro)| serde_json::json!({
                "destination": destination,
                "source": source,
                "type": "bind",
                "options": if *ro { vec!["rbind", "ro"] } else { vec!["rbind"] },
            })).collect::<Vec<_>>(),
        });
        fs::write(bundle.path().join("config.json"), config_json.to_string()).unwrap();
        let out = Command::new(nvhook_bin())
            .arg("plan")
            .arg("--bundle")
            .arg(bundle.path())
            .arg("--config")
            .arg(&config_file)
            .args(["--format", "json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            node.log()
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let planned = plan(&mounts);
    assert_eq!(planned["gpu_requested"], true, "{planned:#}");
    let plan_of = &planned["plan"];
    assert_eq!(
        plan_of["selected"].as_array().unwrap().len(),
        2,
        "{planned:#}"
    );
    let devices: Vec<&str> = plan_of["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["path"].as_str().unwrap())
        .collect();
    for node_path in ["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1"] {
        assert!(devices.contains(&node_path), "{node_path}: {devices:?}");
    }
    assert!(
        plan_of["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["destination"]
                .as_str()
                .unwrap()
                .contains("/libnvidia-ml.so.")),
        "no libnvidia-ml: {planned:#}"
    );
    // NVIDIA's manifest as it ships, without the all-gpus mount: the image's
    // NVIDIA_VISIBLE_DEVICES=all counts for nothing, and the plugin would find no NVML.
    let stock: Vec<_> = mounts
        .iter()
        .filter(|(_, at, _)| !at.starts_with(nvhook::request::DEVICE_MOUNT_ROOT))
        .cloned()
        .collect();
    assert_eq!(stock.len(), mounts.len() - 1, "{mounts:?}");
    assert_eq!(plan(&stock)["gpu_requested"], false);

    // NRI mode: the comment's sed line takes runtimeClassName out and nothing else, and the
    // NRI plugin reads the same request from the container containerd shows it.
    let comment = leading_comment(&deploy_dir().join(file));
    let sed = comment_line(file, &comment, "sed '");
    let Some(Object::DaemonSet(nri_mode)) = sed_applied(file, sed, "unused").pop() else {
        panic!("{file}: the sed line leaves no DaemonSet")
    };
    let mut expected = m.device_plugin.clone();
    expected
        .spec
        .template
        .spec
        .as_mut()
        .unwrap()
        .runtime_class_name = None;
    assert_eq!(*nri_mode, expected);
    let nri_container = |mounts: &[(String, String, bool)]| nvhook_nri::api::Container {
        env: env.clone(),
        mounts: mounts
            .iter()
            .map(|(source, destination, ro)| nvhook_nri::api::Mount {
                destination: destination.clone(),
                r#type: "bind".into(),
                source: source.clone(),
                options: if *ro {
                    vec!["rbind".into(), "ro".into()]
                } else {
                    vec!["rbind".into()]
                },
            })
            .collect(),
        ..Default::default()
    };
    let decide = |container: &nvhook_nri::api::Container| {
        nvhook::request::Request::decide(&nvhook::nri::container::spec_of(container), &config)
            .unwrap()
    };
    match decide(&nri_container(&mounts)) {
        nvhook::request::Decision::Gpu(request) => {
            assert_eq!(request.devices, nvhook::request::DeviceSelection::All);
            assert!(
                request
                    .capabilities
                    .contains(&nvhook::capability::Capability::Utility),
                "{:?}",
                request.capabilities
            );
        }
        _ => panic!("NRI: the device plugin gets no GPU"),
    }
    assert!(matches!(
        decide(&nri_container(&stock)),
        nvhook::request::Decision::EnvIgnored
    ));

    let docs = fs::read_to_string(repo_dir().join("docs/kubernetes.md")).unwrap();
    for needed in [
        "deploy/kubernetes/nvidia-device-plugin.yaml",
        "/var/run/nvidia-container-devices/all",
        sed,
    ] {
        assert!(docs.contains(needed), "docs/kubernetes.md lacks {needed:?}");
    }
}

// ---- uninstall.sh ----

/// Every path under `root` (relative, from `/`) with what it is: `d`, `f`, `c` (a device),
/// or `l -> TARGET`.
fn listing(root: &Path) -> std::collections::BTreeMap<String, String> {
    use std::os::unix::fs::FileTypeExt;
    let mut out = std::collections::BTreeMap::new();
    let mut todo = vec![root.to_owned()];
    while let Some(dir) = todo.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let kind = fs::symlink_metadata(&path).unwrap().file_type();
            let what = if kind.is_symlink() {
                format!("l -> {}", fs::read_link(&path).unwrap().display())
            } else if kind.is_dir() {
                todo.push(path.clone());
                "d".to_owned()
            } else if kind.is_char_device() || kind.is_block_device() {
                "c".to_owned()
            } else {
                "f".to_owned()
            };
            let name = format!("/{}", path.strip_prefix(root).unwrap().display());
            out.insert(name, what);
        }
    }
    out
}

/// The directories nvhook may create that other programs use too, which uninstall.sh leaves
/// (empty, here): containerd's drop-in directory, the CDI spec directory, NFD's feature
/// directory and its parents, /dev/char.
const SHARED_DIRS: [&str; 7] = [
    "/etc/containerd/conf.d",
    "/var/run/cdi",
    "/run/cdi",
    "/etc/kubernetes",
    "/etc/kubernetes/node-feature-discovery",
    "/etc/kubernetes/node-feature-discovery/features.d",
    "/dev/char",
];

/// `after` is `before`: nothing the host had is gone or changed in kind, and what is new is
/// one of the shared directories (under `dev_root` for /dev/char) or one of `allowed`.
#[track_caller]
fn assert_as_before(
    before: &std::collections::BTreeMap<String, String>,
    after: &std::collections::BTreeMap<String, String>,
    dev_root: &str,
    allowed: &[String],
) {
    for (path, what) in before {
        assert_eq!(after.get(path), Some(what), "{path}: gone or changed");
    }
    let dev_char = format!("{}/dev/char", dev_root.trim_end_matches('/'));
    for (path, what) in after.iter().filter(|(p, _)| !before.contains_key(*p)) {
        let shared = SHARED_DIRS.contains(&path.as_str()) || *path == dev_char;
        assert!(
            (shared && what == "d") || allowed.contains(path),
            "left behind: {path} ({what})\nall that is new: {:#?}",
            after
                .iter()
                .filter(|(p, _)| !before.contains_key(*p))
                .collect::<Vec<_>>()
        );
    }
}

/// install.sh with `daemon_set`'s environment on a host whose containerd config is the
/// golden `containerd_config`, then uninstall.sh: the host root is as it was (its listing, and
/// containerd's config byte for byte), with `restarts` containerd restarts in all; a second
/// uninstall.sh finds nothing to do.
fn install_then_uninstall(daemon_set: &DaemonSet, containerd_config: &str, restarts: usize) {
    let host = Host::with_containerd_config(containerd_config);
    // A node has /usr/local; install.sh makes only what is below it.
    fs::create_dir_all(host.at("/usr/local")).unwrap();
    let config = host.at("/etc/containerd/config.toml");
    let original = fs::read(&config).unwrap();
    let before = listing(&host.root());
    let installed = host.install(daemon_set);
    assert!(
        host.at("/usr/local/nvhook/bin/nvhook").exists(),
        "{installed}"
    );
    let said = host.uninstall(daemon_set);
    assert!(said.contains("nvhook-uninstall: done"), "{said}");
    assert_eq!(host.restarts(), restarts, "{installed}{said}");
    assert_eq!(
        String::from_utf8_lossy(&fs::read(&config).unwrap()),
        String::from_utf8_lossy(&original),
        "{said}"
    );
    let after = listing(&host.root());
    assert_as_before(&before, &after, "/", &[]);

    let again = host.uninstall(daemon_set);
    assert_eq!(host.restarts(), restarts, "{again}");
    assert!(
        again.contains("no nvhook in /usr/local/nvhook/bin"),
        "{again}"
    );
    assert_eq!(listing(&host.root()), after, "{again}");
}

/// Runtime mode: the handler is taken out of containerd's config (back byte for byte), with
/// one restart for install.sh's change and one for uninstall.sh's.
#[test]
fn uninstall_sh_undoes_install_sh_in_runtime_mode() {
    let m = manifests();
    install_then_uninstall(&m.daemon_set, "containerd-v2-default.toml", 2);
}

/// Runtime mode on containerd 2.3, whose config imports /etc/containerd/conf.d: nvhook's
/// drop-in goes (and the backup nvhook configure leaves of it), the main file never changed.
#[test]
fn uninstall_sh_undoes_install_sh_with_containerds_drop_in() {
    let m = manifests();
    install_then_uninstall(&m.daemon_set, "containerd-2.3-default.toml", 2);
}

/// NRI mode (containerd 2.3, NRI on by default): no handler was written, so containerd's
/// config is not touched and containerd never restarted, by either script.
#[test]
fn uninstall_sh_undoes_install_sh_in_nri_mode() {
    let m = manifests();
    install_then_uninstall(&m.nri_daemon_set, "containerd-2.3-default.toml", 0);
}

/// NRI mode, where the plugin was killed before it could unmount the driver directories it
/// gathered in nvhook's state directory, and the trees the CDI hook keeps there (each a tmpfs
/// with a driver file bound in it): uninstall.sh unmounts both and removes the state
/// directory, and leaves nothing mounted.
#[test]
fn uninstall_sh_unmounts_the_driver_files_nvhook_gathered() {
    support::require_root();
    let m = manifests();
    let host = Host::with_containerd_config("containerd-2.3-default.toml");
    fs::create_dir_all(host.at("/usr/local")).unwrap();
    host.install(&m.nri_daemon_set);
    let mount = |args: &[&std::ffi::OsStr]| {
        let status = Command::new("mount").args(args).status().unwrap();
        assert!(status.success(), "mount {args:?}");
    };
    let stores = ["/run/nvhook/driver-dirs", "/run/nvhook/hook-trees"];
    for store in stores {
        let gathered = host.at(store);
        fs::create_dir_all(&gathered).unwrap();
        mount(&[
            "-t".as_ref(),
            "tmpfs".as_ref(),
            "tmpfs".as_ref(),
            gathered.as_os_str(),
        ]);
        let set = gathered.join("0123456789abcdef");
        fs::create_dir(&set).unwrap();
        let file = set.join("libcuda.so.1");
        fs::write(&file, "").unwrap();
        let source = host.at("/usr/local/nvhook/bin/nvhook");
        mount(&["--bind".as_ref(), source.as_os_str(), file.as_os_str()]);
    }

    let said = host.uninstall(&m.nri_daemon_set);
    for store in stores {
        assert!(
            said.contains(&format!(
                "unmounted the driver files nvhook gathered ({store})"
            )),
            "{said}"
        );
    }
    assert!(said.contains("nvhook-uninstall: done"), "{said}");
    // The mount table itself: the kept trees are left out of host_mounts_referencing.
    let left = support::engines::mount_points_below(&host.root());
    assert!(left.is_empty(), "{left:#?}");
    assert!(!host.at("/run/nvhook").exists(), "{said}");
}

/// After install.sh and a round of refresh.sh on a simulated node (in runtime mode),
/// uninstall.sh removes what refresh.sh wrote too: the CDI spec, NVML's cached answer, the NFD
/// feature file and the /dev/char links of the NVIDIA nodes. The node's nvhook config is the
/// admin's own (the node's paths, written before install): it keeps its keys and the policy
/// and loses only the hook-path line install.sh added. And the docs' Uninstall section names
/// this script.
#[test]
fn uninstall_sh_removes_what_refresh_sh_wrote_and_keeps_an_admins_config() {
    let m = manifests();
    let host = Host::new();
    // A node has these, /var/run as Debian and Ubuntu have it (an absolute link, which the
    // scripts must not follow out of the host root); the scripts make only what is below.
    for dir in ["/usr/local", "/run", "/var"] {
        fs::create_dir_all(host.at(dir)).unwrap();
    }
    std::os::unix::fs::symlink("/run", host.at("/var/run")).unwrap();
    let (node, node_keys) = node_in(&host);
    let config = host.at(nvhook::config::DEFAULT_PATH);
    fs::create_dir_all(config.parent().unwrap()).unwrap();
    fs::write(&config, &node_keys).unwrap();
    let containerd = host.at("/etc/containerd/config.toml");
    let original = fs::read(&containerd).unwrap();
    let before = listing(&host.root());

    host.install(&m.daemon_set);
    let refreshed = run_refresh(&host, &m.daemon_set, &node);
    let spec = host.at("/run/cdi/nvidia.yaml");
    assert_eq!(nvhook::cdi::REFRESHED_SPEC, "/var/run/cdi/nvidia.yaml");
    let link = node.dev_root().join("dev/char/195:1");
    assert!(spec.exists(), "{refreshed}");
    assert!(host.at(NFD_FEATURE_FILE).exists(), "{refreshed}");
    assert!(fs::symlink_metadata(&link).is_ok(), "{refreshed}");
    let installed = config::from_file(&config).unwrap();
    assert_eq!(
        installed.hook_path,
        Some("/usr/local/nvhook/bin/nvhook".into())
    );
    let cache = host.at(&installed.nvml_cache_file.display().to_string());
    assert!(cache.exists(), "{refreshed}");
    // The argument files the NRI plugin's and nvhook-runtime's cdi modes keep beside it.
    let hook_args = cache.with_file_name(nvhook::delivery::args_file::kept::DIR_NAME);
    fs::create_dir(&hook_args).unwrap();
    fs::write(hook_args.join("0123456789abcdef.args"), "--links\n").unwrap();

    let said = host.uninstall(&m.daemon_set);
    assert!(said.contains("removed /var/run/cdi/nvidia.yaml"), "{said}");
    assert!(said.contains("/dev/char links of NVIDIA nodes"), "{said}");
    assert_eq!(host.restarts(), 2, "{said}");
    assert_eq!(fs::read(&containerd).unwrap(), original, "{said}");
    for gone in [
        spec,
        host.at(NFD_FEATURE_FILE),
        link,
        cache.clone(),
        hook_args,
    ] {
        assert!(
            fs::symlink_metadata(&gone).is_err(),
            "{} is left\n{said}",
            gone.display()
        );
    }
    // The admin's file: every key of theirs, the policy, no hook-path.
    let kept = fs::read_to_string(&config).unwrap();
    for line in node_keys.lines() {
        assert!(kept.contains(line), "{line:?} lost:\n{kept}");
    }
    let read = config::from_file(&config).unwrap();
    assert_eq!(read.hook_path, None, "{kept}");
    assert!(!read.accept_env_when_unprivileged, "{kept}");
    assert!(said.contains("its Kubernetes policy stays"), "{said}");

    // Left: the backup nvhook configure made of the admin's file (kept with it), the log
    // file the admin configured, and the directory of the cache file the config names (the
    // node's own).
    let node_dir = format!(
        "/{}",
        node.root().strip_prefix(host.root()).unwrap().display()
    );
    let allowed = [
        format!("{}.nvhook.bak", nvhook::config::DEFAULT_PATH),
        format!("{node_dir}/nvhook.log"),
        installed
            .nvml_cache_file
            .parent()
            .unwrap()
            .display()
            .to_string(),
    ];
    assert_as_before(&before, &listing(&host.root()), &node_dir, &allowed);

    let docs = fs::read_to_string(repo_dir().join("docs/kubernetes.md")).unwrap();
    let section = docs
        .split_once("\n## Uninstall")
        .expect("docs/kubernetes.md: an Uninstall section")
        .1;
    let section = section.split("\n## ").next().unwrap();
    for needed in [
        "deploy/kubernetes/uninstall.sh",
        "kubectl delete -f deploy/kubernetes/nvhook-installer.yaml",
        "kubectl delete -f deploy/kubernetes/nvhook-installer-nri.yaml",
        "runtimeclass.yaml",
        "/opt/nvhook/uninstall.sh",
        "nvhook configure containerd --remove",
    ] {
        assert!(
            section.contains(needed),
            "Uninstall section lacks {needed:?}"
        );
    }
}

// ---- The DRA kubelet plugin: nvhook-dra.yaml and deviceclasses.yaml ----

/// nvhook-dra's long-running container.
fn dra_plugin(daemon_set: &DaemonSet) -> &Container {
    pod_spec(daemon_set)
        .containers
        .iter()
        .find(|c| c.name == "nvhook-dra")
        .expect("a container named nvhook-dra")
}

/// A path as the host resolves it: /var/run is a link to /run on every host nvhook-dra runs on.
fn on_the_host(path: &Path) -> PathBuf {
    match path.strip_prefix("/var/run") {
        Ok(rest) => Path::new("/run").join(rest),
        Err(_) => path.to_owned(),
    }
}

/// The host path a process chrooted into `chroot` (a mount path of `container`) reaches at
/// `path`, and whether it may write there: through the deepest of the container's mounts that
/// holds it, a hostPath volume. Mount paths are taken as written: the container resolves them,
/// and a mount at `<chroot>/var/run/...` would land on the container's own /run.
fn reached(
    spec: &k8s_openapi::api::core::v1::PodSpec,
    container: &Container,
    chroot: &str,
    path: &Path,
) -> (PathBuf, bool) {
    let seen = Path::new(chroot).join(on_the_host(path).strip_prefix("/").unwrap());
    let mount = container
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| seen.starts_with(&m.mount_path))
        .max_by_key(|m| m.mount_path.len())
        .unwrap_or_else(|| panic!("{}: no mount holds {}", container.name, path.display()));
    let volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .unwrap_or_else(|| panic!("no volume {}", mount.name));
    let host = volume
        .host_path
        .as_ref()
        .unwrap_or_else(|| panic!("{} holds {} and is no hostPath", mount.name, path.display()));
    let rest = seen.strip_prefix(&mount.mount_path).unwrap();
    let at = on_the_host(&Path::new(&host.path).join(rest));
    (at, mount.read_only != Some(true))
}

/// nvhook-dra.yaml's DaemonSet: the image's nvhook-dra, copied beside the nvhook-nvml that
/// install.sh puts on the host, run in the host's root as the NRI DaemonSet runs `nvhook nri`;
/// its node name from the downward API; every host directory it writes (the kubelet's plugin
/// registry, its own plugin directory, the CDI spec directory) writable through a hostPath
/// volume of its own, at the host's path, and the rest of the host (nvhook's config, the
/// driver) read-only; privileged, system-node-critical, on the installers' nodes.
#[test]
fn dra_daemon_set_runs_nvhook_dra_in_the_hosts_root_and_mounts_what_it_writes() {
    let m = manifests();
    let ds = &m.dra_daemon_set;
    let spec = pod_spec(ds);
    assert_eq!(
        spec.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    assert_eq!(spec.node_selector, pod_spec(&m.daemon_set).node_selector);
    let plugin = dra_plugin(ds);
    assert_eq!(
        plugin.security_context.as_ref().and_then(|s| s.privileged),
        Some(true)
    );

    // chroot HOST_ROOT BINARY, HOST_ROOT the mount of the host's /.
    let command = plugin.command.clone().expect("a command");
    let [chroot, host_root, binary] = command.as_slice() else {
        panic!("{command:?}")
    };
    assert_eq!(chroot, "chroot");
    let root_mount = plugin
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| &m.mount_path == host_root)
        .expect("a mount at the chroot's root");
    let root_volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == root_mount.name)
        .unwrap();
    assert_eq!(root_volume.host_path.as_ref().unwrap().path, "/");
    assert_eq!(
        root_mount.read_only,
        Some(true),
        "only its own volumes are written"
    );
    assert_eq!(
        root_mount.mount_propagation.as_deref(),
        Some("HostToContainer")
    );
    // Beside the nvhook-nvml both installers put on the host, which it runs to ask NVML.
    let nvhook_bin = format!("{}/bin", env_value(installer(&m.daemon_set), "NVHOOK_DIR"));
    assert_eq!(
        env_value(installer(&m.nri_daemon_set), "NVHOOK_DIR"),
        env_value(installer(&m.daemon_set), "NVHOOK_DIR")
    );
    assert_eq!(Path::new(binary), Path::new(&nvhook_bin).join("nvhook-dra"));
    let (nvml_helper, _) = reached(
        spec,
        plugin,
        host_root,
        &Path::new(&nvhook_bin).join("nvhook-nvml"),
    );
    assert_eq!(nvml_helper, Path::new(&nvhook_bin).join("nvhook-nvml"));

    // The init container copies the image's nvhook-dra there.
    let install = installer(ds);
    let script = install.command.as_ref().unwrap().join(" ");
    assert!(script.contains("/opt/nvhook/bin/nvhook-dra"), "{script}");
    let mounts = install.volume_mounts.as_ref().unwrap();
    let [mount] = mounts.as_slice() else {
        panic!("{mounts:?}")
    };
    let volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .unwrap();
    assert_eq!(volume.host_path.as_ref().unwrap().path, nvhook_bin);
    assert!(
        script.ends_with(&format!("{}/nvhook-dra", mount.mount_path)),
        "{script}"
    );
    assert_ne!(mount.read_only, Some(true));

    // Its node: the pool it serves and the claims it accepts.
    let node_name = plugin
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "NODE_NAME")
        .expect("NODE_NAME");
    assert_eq!(node_name.value, None);
    assert_eq!(
        node_name
            .value_from
            .as_ref()
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str()),
        Some("spec.nodeName")
    );
    // The paths nvhook-dra is given are the kubelet's and NVIDIA's, and nvhook's own config.
    let registry = env_value(plugin, "KUBELET_REGISTRAR_DIRECTORY_PATH");
    let plugins = env_value(plugin, "KUBELET_PLUGINS_DIRECTORY_PATH");
    let cdi_root = env_value(plugin, "CDI_ROOT");
    let config = env_value(plugin, "NVHOOK_CONFIG");
    assert_eq!(registry, nvhook_dra::KUBELET_REGISTRY_DIR);
    assert_eq!(plugins, nvhook_dra::KUBELET_PLUGINS_DIR);
    assert_eq!(cdi_root, "/var/run/cdi");
    assert_eq!(config, nvhook::config::DEFAULT_PATH);
    // Partitionable devices only where the admin says the cluster serves them.
    assert_eq!(env_value(plugin, "NVHOOK_DRA_DYNAMIC_MIG"), "false");

    // What it writes: the registration socket, the DRA socket and checkpoint, the claims' specs.
    let own_dir = Path::new(&plugins).join(nvhook::dra::DRIVER_NAME);
    for dir in [
        Path::new(&registry),
        own_dir.as_path(),
        Path::new(&cdi_root),
    ] {
        let (host, writable) = reached(spec, plugin, host_root, dir);
        assert_eq!(host, on_the_host(dir), "{}", dir.display());
        assert!(writable, "{} is read-only", dir.display());
    }
    // Sockets made under the plugins directory: propagated both ways, as NVIDIA's plugin has it.
    let plugins_mount = plugin
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| {
            Path::new(&m.mount_path) == Path::new(host_root).join(plugins.trim_start_matches('/'))
        })
        .expect("the plugins directory is a mount of its own");
    assert_eq!(
        plugins_mount.mount_propagation.as_deref(),
        Some("Bidirectional")
    );
    // What it reads: nvhook's config, read-only; the driver's files under the config's
    // driver root (the host's /, unless the admin set another).
    let (host, writable) = reached(spec, plugin, host_root, Path::new(&config));
    assert_eq!(host, Path::new(&config));
    assert!(!writable, "nvhook's config is the admin's");
    let driver_root = nvhook::config::Config::default().driver_root;
    let (host, _) = reached(spec, plugin, host_root, &driver_root.join("usr/lib"));
    assert_eq!(host, driver_root.join("usr/lib"));

    // The API client reads its account where in-cluster clients do, inside the host's root;
    // the kubelet's own mount of it (outside that root) is off, and a kubeconfig in the
    // host's home is never found.
    assert_eq!(spec.service_account_name.as_deref(), Some("nvhook-dra"));
    assert_eq!(spec.automount_service_account_token, Some(false));
    let account = Path::new("/var/run/secrets/kubernetes.io/serviceaccount");
    let seen = Path::new(host_root).join(on_the_host(account).strip_prefix("/").unwrap());
    let mount = plugin
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| Path::new(&m.mount_path) == seen)
        .expect("the service account's mount in the host's root");
    let projected = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .and_then(|v| v.projected.as_ref())
        .expect("a projected volume");
    let paths: Vec<String> = projected
        .sources
        .iter()
        .flatten()
        .flat_map(|s| {
            let token = s.service_account_token.as_ref().map(|t| t.path.clone());
            let ca = s
                .config_map
                .iter()
                .filter(|c| c.name == "kube-root-ca.crt")
                .flat_map(|c| c.items.iter().flatten().map(|i| i.path.clone()));
            let ns = s
                .downward_api
                .iter()
                .flat_map(|d| d.items.iter().flatten())
                .filter(|i| {
                    i.field_ref.as_ref().map(|f| f.field_path.as_str())
                        == Some("metadata.namespace")
                })
                .map(|i| i.path.clone());
            token.into_iter().chain(ca).chain(ns).collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(paths, ["token", "ca.crt", "namespace"]);
    let home = env_value(plugin, "HOME");
    assert!(!home.is_empty() && home != "/root", "{home}");
}

/// The ClusterRole grants exactly what nvhook-dra asks the API server for (a claim by name;
/// its node's ResourceSlices), no other resource or verb, and is bound to the DaemonSet's
/// ServiceAccount, which nvhook-dra.yaml makes in the DaemonSet's namespace.
#[test]
fn dra_cluster_role_grants_exactly_what_nvhook_dra_asks_and_is_bound_to_its_account() {
    let m = manifests();
    let mut granted: Vec<(String, String, String)> = m
        .dra_cluster_role
        .rules
        .iter()
        .flatten()
        .flat_map(|rule| {
            assert!(rule.resource_names.is_none() && rule.non_resource_urls.is_none());
            let groups = rule.api_groups.clone().unwrap_or_default();
            let resources = rule.resources.clone().unwrap_or_default();
            groups.into_iter().flat_map(move |g| {
                let verbs = rule.verbs.clone();
                resources.clone().into_iter().flat_map(move |r| {
                    let g = g.clone();
                    verbs
                        .clone()
                        .into_iter()
                        .map(move |v| (g.clone(), r.clone(), v))
                })
            })
        })
        .collect();
    granted.sort();
    let mut wanted: Vec<(String, String, String)> = [("resourceclaims", "get")]
        .into_iter()
        .chain(
            ["get", "list", "watch", "create", "update", "delete"]
                .map(|verb| ("resourceslices", verb)),
        )
        .map(|(r, v)| ("resource.k8s.io".to_owned(), r.to_owned(), v.to_owned()))
        .collect();
    wanted.sort();
    assert_eq!(granted, wanted);
    assert!(m.dra_cluster_role.aggregation_rule.is_none());

    let binding = &m.dra_cluster_role_binding;
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    assert_eq!(
        binding.role_ref.api_group.as_deref(),
        Some("rbac.authorization.k8s.io")
    );
    assert_eq!(
        Some(&binding.role_ref.name),
        m.dra_cluster_role.metadata.name.as_ref()
    );
    let ds = &m.dra_daemon_set;
    let account = pod_spec(ds)
        .service_account_name
        .clone()
        .expect("an account");
    let subjects = binding.subjects.clone().unwrap_or_default();
    let [subject] = subjects.as_slice() else {
        panic!("{subjects:?}")
    };
    assert_eq!(subject.kind, "ServiceAccount");
    assert_eq!(subject.name, account);
    assert_eq!(subject.namespace, ds.metadata.namespace);
    assert_eq!(m.dra_service_account.metadata.name.as_ref(), Some(&account));
    assert_eq!(
        m.dra_service_account.metadata.namespace,
        ds.metadata.namespace
    );
}

/// deviceclasses.yaml holds NVIDIA's GPU DeviceClasses as NVIDIA's chart makes them on
/// resource.k8s.io/v1, name for name and selector for selector (the strings a cluster's
/// claims and CEL already hold), for nvhook-dra's driver name; then nvhook's own class for
/// the IMEX channels it offers; and nothing else.
#[test]
fn device_classes_are_nvidias_names_and_selectors() {
    let m = manifests();
    let text = fs::read_to_string(deploy_dir().join("deviceclasses.yaml")).unwrap();
    let documents = text.matches("\napiVersion: resource.k8s.io/v1\n").count()
        + usize::from(text.starts_with("apiVersion: resource.k8s.io/v1\n"));
    assert_eq!(
        documents,
        m.device_classes.len(),
        "every class is resource.k8s.io/v1"
    );
    let classes: Vec<(String, Vec<String>, Option<String>)> = m
        .device_classes
        .iter()
        .map(|c| {
            let spec = c.spec.as_ref().expect("a spec");
            let selectors = spec
                .selectors
                .iter()
                .flatten()
                .map(|s| s.cel.as_ref().expect("a CEL selector").expression.clone())
                .collect();
            assert!(spec.config.is_none(), "NVIDIA's classes have no config");
            (
                c.metadata.name.clone().unwrap(),
                selectors,
                spec.extended_resource_name.clone(),
            )
        })
        .collect();
    let driver = nvhook::dra::DRIVER_NAME;
    assert_eq!(driver, "gpu.nvidia.com");
    assert_eq!(
        classes,
        [
            (
                "gpu.nvidia.com".to_owned(),
                vec![format!(
                    "device.driver == '{driver}' && device.attributes['{driver}'].type == 'gpu'"
                )],
                Some("nvidia.com/gpu".to_owned()),
            ),
            (
                "mig.nvidia.com".to_owned(),
                vec![format!(
                    "device.driver == '{driver}' && device.attributes['{driver}'].type == 'mig'"
                )],
                None,
            ),
            (
                "imex-channel.gpu.nvidia.com".to_owned(),
                vec![format!(
                    "device.driver == '{driver}' && device.attributes['{driver}'].type == 'channel'"
                )],
                None,
            ),
        ]
    );
}
