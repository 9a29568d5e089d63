//! A small CRI client: the calls the kubelet makes to start a pod and its
//! containers, over containerd's gRPC socket (k8s-cri's generated tonic client,
//! runtime API v1). Blocking, so that tests stay plain functions.

use std::collections::HashMap;
use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::thread::sleep;
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    CdiDevice, ContainerConfig, ContainerMetadata, ContainerState, ContainerStatusRequest,
    CreateContainerRequest, IdMapping, ImageSpec, ImageStatusRequest, KeyValue,
    LinuxContainerConfig, LinuxContainerSecurityContext, LinuxPodSandboxConfig,
    LinuxSandboxSecurityContext, Mount, NamespaceMode, NamespaceOption, PodSandboxConfig,
    PodSandboxMetadata, RemoveContainerRequest, RemovePodSandboxRequest, RunPodSandboxRequest,
    StartContainerRequest, StopPodSandboxRequest, UserNamespace, VersionRequest,
};
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::Output;

/// How long a container may run before the test gives up on it.
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);
/// Every CRI call gets this long: a hung runtime fails the test.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

pub struct Cri {
    rt: tokio::runtime::Runtime,
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    /// `NAME VERSION` from the CRI Version call.
    runtime_name: String,
}

/// One container of a pod, as the kubelet hands it to the runtime after the
/// device plugin's Allocate: env vars, mounts, annotations and CDI devices.
#[derive(Default)]
pub struct ContainerRequest<'a> {
    pub image: &'a str,
    pub args: &'a [&'a str],
    pub env: &'a [(&'a str, &'a str)],
    /// (container path, host path), read-only.
    pub mounts: &'a [(&'a str, &'a str)],
    /// securityContext.privileged (the pod is then privileged too).
    pub privileged: bool,
    /// The container's annotations (CreateContainer's config.annotations).
    pub annotations: &'a [(&'a str, &'a str)],
    /// The pod's annotations (RunPodSandbox's config.annotations), what NRI plugins see as
    /// the pod's.
    pub pod_annotations: &'a [(&'a str, &'a str)],
    /// Fully qualified CDI device names (`vendor.com/class=name`), the CRI's CDI_devices
    /// (what a device plugin's Allocate returns as CDIDevices).
    pub cdi_devices: &'a [&'a str],
    /// Kubernetes `hostUsers: false`: the pod's user namespace, as the kubelet hands it over.
    pub user_namespace: Option<PodUserNamespace>,
}

/// The user namespace of a `hostUsers: false` pod: container ids `0..size` are the host's
/// `host_id..host_id + size`, uids and gids alike (the kubelet gives each pod 65536 ids).
#[derive(Clone, Copy, Debug)]
pub struct PodUserNamespace {
    pub host_id: u32,
    pub size: u32,
}

/// What a pod's one container printed, and how long the kubelet's calls took.
pub struct PodRun {
    pub output: Output,
    /// RunPodSandbox.
    pub sandbox: Duration,
    /// CreateContainer + StartContainer: the runtime's share of a pod start.
    pub container_start: Duration,
    /// CreateContainer alone (the engine's spec, CDI injection and NRI, the snapshot); the
    /// rest of `container_start` is StartContainer.
    pub container_create: Duration,
    /// The container's id, as CreateContainer answered it; None when the engine refused it.
    pub container_id: Option<String>,
}

impl Cri {
    pub fn connect(socket: &Path) -> Cri {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("build a tokio runtime");
        let socket = socket.to_path_buf();
        let channel = rt
            .block_on(
                // The URI is required by tonic but unused: every connection is the socket.
                Endpoint::from_static("http://[::]:0")
                    .timeout(CALL_TIMEOUT)
                    .connect_with_connector(tower::service_fn(move |_: Uri| {
                        let socket = socket.clone();
                        async move { UnixStream::connect(socket).await.map(TokioIo::new) }
                    })),
            )
            .expect("connect to containerd's CRI socket");
        let mut cri = Cri {
            rt,
            runtime: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
            runtime_name: String::new(),
        };
        let version = cri
            .rt
            .block_on(cri.runtime.version(VersionRequest::default()))
            .expect("CRI Version (is containerd's CRI plugin loaded?)")
            .into_inner();
        eprintln!(
            "CRI: {} {} (API {})",
            version.runtime_name, version.runtime_version, version.runtime_api_version
        );
        cri.runtime_name = format!("{} {}", version.runtime_name, version.runtime_version);
        cri
    }

    /// The runtime's name and version, as CRI Version says them (`containerd 2.1.9+unknown` for sid's build).
    pub fn runtime_name(&self) -> &str {
        &self.runtime_name
    }

    /// Whether the CRI plugin sees `image` (imported into the k8s.io namespace).
    pub fn has_image(&mut self, image: &str) -> bool {
        let request = ImageStatusRequest {
            image: Some(image_spec(image)),
            verbose: false,
        };
        self.rt
            .block_on(self.images.image_status(request))
            .expect("CRI ImageStatus")
            .into_inner()
            .image
            .is_some()
    }

    /// Runs a pod of one container to completion the way the kubelet does:
    /// RunPodSandbox (host network unless the pod has a user namespace, runtime handler
    /// `handler`, cgroups under `cgroup_parent`, logs under `log_dir`), CreateContainer,
    /// StartContainer, then ContainerStatus until it exited; the pod is
    /// stopped and removed afterwards, also when a call failed. Panics when RunPodSandbox
    /// fails.
    pub fn run_pod(
        &mut self,
        name: &str,
        handler: &str,
        cgroup_parent: &str,
        log_dir: &Path,
        container: &ContainerRequest,
    ) -> PodRun {
        self.try_run_pod(name, handler, cgroup_parent, log_dir, container)
            .unwrap_or_else(|message| panic!("RunPodSandbox {name} ({handler}): {message}"))
    }

    /// [`Cri::run_pod`], RunPodSandbox's error returned, for a test whose runtime is to
    /// refuse the pod itself.
    pub fn try_run_pod(
        &mut self,
        name: &str,
        handler: &str,
        cgroup_parent: &str,
        log_dir: &Path,
        container: &ContainerRequest,
    ) -> Result<PodRun, String> {
        let log_dir = log_dir.join(name);
        fs::create_dir_all(&log_dir).expect("create the pod's log directory");
        let sandbox_config = sandbox_config(name, cgroup_parent, &log_dir, container);
        let started = Instant::now();
        let sandbox_id = self
            .rt
            .block_on(self.runtime.run_pod_sandbox(RunPodSandboxRequest {
                config: Some(sandbox_config.clone()),
                runtime_handler: handler.to_owned(),
            }))
            .map_err(|e| e.message().to_owned())?
            .into_inner()
            .pod_sandbox_id;
        let sandbox = started.elapsed();
        let pod = Pod {
            cri: self,
            id: sandbox_id,
        };
        let log_path = "main.log";
        let config = container_config(container, log_path);
        let started = Instant::now();
        let container_id = pod.cri.call(
            "CreateContainer",
            pod.cri
                .runtime
                .clone()
                .create_container(CreateContainerRequest {
                    pod_sandbox_id: pod.id.clone(),
                    config: Some(config),
                    sandbox_config: Some(sandbox_config),
                }),
        );
        let container_create = started.elapsed();
        let container_id = match container_id {
            Ok(response) => response.container_id,
            // The engine's refusal (an NRI plugin's error among them) is the result.
            Err(message) => {
                return Ok(PodRun {
                    output: output(1, String::new(), message),
                    sandbox,
                    container_start: started.elapsed(),
                    container_create,
                    container_id: None,
                });
            }
        };
        if let Err(message) = pod.cri.call(
            "StartContainer",
            pod.cri
                .runtime
                .clone()
                .start_container(StartContainerRequest {
                    container_id: container_id.clone(),
                }),
        ) {
            // The runtime's refusal (e.g. nvhook's one-line error) is the result.
            return Ok(PodRun {
                output: output(1, String::new(), message),
                sandbox,
                container_start: started.elapsed(),
                container_create,
                container_id: Some(container_id),
            });
        }
        let container_start = started.elapsed();
        let exit_code = pod.cri.wait_exited(&container_id);
        let (stdout, stderr) = read_cri_log(&log_dir.join(log_path));
        let _ = pod.cri.call(
            "RemoveContainer",
            pod.cri
                .runtime
                .clone()
                .remove_container(RemoveContainerRequest {
                    container_id: container_id.clone(),
                }),
        );
        Ok(PodRun {
            output: output(exit_code, stdout, stderr),
            sandbox,
            container_start,
            container_create,
            container_id: Some(container_id),
        })
    }

    /// Runs a CRI call to completion; a gRPC error becomes its message.
    fn call<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, String> {
        self.rt
            .block_on(call)
            .map(tonic::Response::into_inner)
            .map_err(|status| format!("CRI {what}: {}", status.message()))
    }

    fn wait_exited(&mut self, container_id: &str) -> i32 {
        let start = Instant::now();
        loop {
            let status = self
                .call(
                    "ContainerStatus",
                    self.runtime
                        .clone()
                        .container_status(ContainerStatusRequest {
                            container_id: container_id.to_owned(),
                            verbose: false,
                        }),
                )
                .unwrap_or_else(|message| panic!("{message}"))
                .status
                .expect("ContainerStatus has a status");
            if status.state == ContainerState::ContainerExited as i32 {
                return status.exit_code;
            }
            assert!(
                start.elapsed() < EXIT_TIMEOUT,
                "container {container_id} still {:?} after {EXIT_TIMEOUT:?}",
                status.state
            );
            sleep(Duration::from_millis(20));
        }
    }
}

/// A pod sandbox; stopped and removed on drop.
struct Pod<'a> {
    cri: &'a mut Cri,
    id: String,
}

impl Drop for Pod<'_> {
    fn drop(&mut self) {
        let mut runtime = self.cri.runtime.clone();
        let id = self.id.clone();
        let stopped = self.cri.call(
            "StopPodSandbox",
            runtime.stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: id.clone(),
            }),
        );
        let removed = self.cri.call(
            "RemovePodSandbox",
            runtime.remove_pod_sandbox(RemovePodSandboxRequest { pod_sandbox_id: id }),
        );
        for message in [stopped.err(), removed.err()].into_iter().flatten() {
            eprintln!("cleanup: {message}");
        }
    }
}

fn image_spec(image: &str) -> ImageSpec {
    ImageSpec {
        image: image.to_owned(),
        ..Default::default()
    }
}

/// A pod on the host network (no CNI needed), as `hostNetwork: true` gives it, or, in a user
/// namespace of its own, in a network and UTS namespace of its own.
fn sandbox_config(
    name: &str,
    cgroup_parent: &str,
    log_dir: &Path,
    container: &ContainerRequest,
) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.to_owned(),
            uid: format!("uid-{name}"),
            namespace: "default".to_owned(),
            attempt: 0,
        }),
        // None of its own for a host-network pod: it shares the node's UTS namespace.
        hostname: if host_network(container) {
            String::new()
        } else {
            name.to_owned()
        },
        log_directory: log_dir.display().to_string(),
        annotations: string_map(container.pod_annotations),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: cgroup_parent.to_owned(),
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(namespace_options(container)),
                privileged: container.privileged,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Whether the pod runs on the node's network: all but `hostUsers: false` pods, which
/// Kubernetes keeps off it (and containerd 2.1 refuses there); those need a CNI network.
fn host_network(container: &ContainerRequest) -> bool {
    container.user_namespace.is_none()
}

/// What the kubelet puts in both the pod's and each container's namespace options.
fn namespace_options(container: &ContainerRequest) -> NamespaceOption {
    let network = if host_network(container) {
        NamespaceMode::Node
    } else {
        NamespaceMode::Pod
    };
    NamespaceOption {
        network: network as i32,
        userns_options: container.user_namespace.map(|userns| {
            let ids = vec![IdMapping {
                host_id: userns.host_id,
                container_id: 0,
                length: userns.size,
            }];
            UserNamespace {
                mode: NamespaceMode::Pod as i32,
                uids: ids.clone(),
                gids: ids,
            }
        }),
        ..Default::default()
    }
}

fn string_map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect()
}

fn container_config(container: &ContainerRequest, log_path: &str) -> ContainerConfig {
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: "main".to_owned(),
            attempt: 0,
        }),
        image: Some(image_spec(container.image)),
        args: container.args.iter().map(|a| a.to_string()).collect(),
        envs: container
            .env
            .iter()
            .map(|(key, value)| KeyValue {
                key: key.to_string(),
                value: value.to_string(),
            })
            .collect(),
        mounts: container
            .mounts
            .iter()
            .map(|(container_path, host_path)| Mount {
                container_path: container_path.to_string(),
                host_path: host_path.to_string(),
                readonly: true,
                ..Default::default()
            })
            .collect(),
        log_path: log_path.to_owned(),
        annotations: string_map(container.annotations),
        cdi_devices: container
            .cdi_devices
            .iter()
            .map(|name| CdiDevice {
                name: name.to_string(),
            })
            .collect(),
        linux: Some(LinuxContainerConfig {
            security_context: Some(LinuxContainerSecurityContext {
                privileged: container.privileged,
                namespace_options: Some(namespace_options(container)),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn output(exit_code: i32, stdout: String, stderr: String) -> Output {
    Output {
        status: ExitStatus::from_raw((exit_code & 0xff) << 8),
        stdout,
        stderr,
        hook_log: None,
    }
}

/// stdout and stderr from a CRI log file: each line is
/// `<RFC 3339 time> <stdout|stderr> <F|P> <text>`, P marking a partial line.
fn read_cri_log(path: &PathBuf) -> (String, String) {
    let text = fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read the container log {}: {e}", path.display()));
    let (mut stdout, mut stderr) = (String::new(), String::new());
    for line in text.lines() {
        let mut fields = line.splitn(4, ' ');
        let (_time, stream, tag) = (fields.next(), fields.next(), fields.next());
        let content = fields.next().unwrap_or("");
        let out = if stream == Some("stderr") {
            &mut stderr
        } else {
            &mut stdout
        };
        out.push_str(content);
        if tag != Some("P") {
            out.push('\n');
        }
    }
    (stdout, stderr)
}
