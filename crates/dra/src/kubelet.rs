//! The kubelet's side of a DRA plugin, for tests on machines with no kubelet: what its plugin
//! watcher does with a registration socket, and the calls its DRA manager makes, over the
//! same gRPC. Blocking calls, each with a deadline.

use crate::api::{self, health, registration, v1, v1beta1};
use crate::{Claim, DeviceHealth, PreparedDevice};
use hyper_util::rt::TokioIo;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// How long one call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// What a kubelet double could not do, in one line.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    #[error("cannot start the kubelet double's runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("cannot connect to {}: {source}", path.display())]
    Connect {
        path: PathBuf,
        source: tonic::transport::Error,
    },
    #[error("{call} failed: {source}")]
    Call {
        call: &'static str,
        source: tonic::Status,
    },
    #[error("the plugin is not a DRA plugin: {0}")]
    NotDra(String),
    #[error(
        "the kubelet's answer for claim {uid} is missing: every claim asked about must have one"
    )]
    MissingClaim { uid: String },
    #[error("no health update came in {0:?}")]
    NoHealth(Duration),
}

/// Which generation of the DRA service the kubelet speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// Kubernetes 1.34 and later.
    V1,
    /// Kubernetes 1.32 and 1.33, and later kubelets whose plugin lists no v1.
    V1beta1,
}

/// A kubelet that speaks up to `newest`.
pub struct Kubelet {
    runtime: tokio::runtime::Runtime,
    newest: Version,
}

/// A plugin the kubelet registered, on the version both speak.
pub struct Registered<'a> {
    kubelet: &'a Kubelet,
    pub info: registration::PluginInfo,
    pub version: Version,
    channel: Channel,
}

impl Kubelet {
    /// A kubelet of 1.34 or later.
    pub fn new() -> Result<Kubelet, KubeletError> {
        Kubelet::speaking(Version::V1)
    }

    /// A kubelet whose newest DRA service is `newest`.
    pub fn speaking(newest: Version) -> Result<Kubelet, KubeletError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(KubeletError::Runtime)?;
        Ok(Kubelet { runtime, newest })
    }

    /// What the plugin watcher does with a new socket in its registry: asks who is there,
    /// picks the newest DRA service both speak, connects to the plugin's endpoint and tells
    /// the plugin it is registered (or why not, and fails).
    pub fn register(&self, registration_socket: &Path) -> Result<Registered<'_>, KubeletError> {
        let channel = self.connect(registration_socket)?;
        let mut client = registration::registration_client::RegistrationClient::new(channel);
        let info = self
            .runtime
            .block_on(client.get_info(registration::InfoRequest {}))
            .map_err(|source| KubeletError::Call {
                call: "GetInfo",
                source,
            })?
            .into_inner();
        let offered = |service: &str| info.supported_versions.iter().any(|s| s == service);
        let version = match (self.newest, offered(api::SERVICE_V1)) {
            (Version::V1, true) => Some(Version::V1),
            _ => offered(api::SERVICE_V1BETA1).then_some(Version::V1beta1),
        };
        let refusal = if info.r#type != api::PLUGIN_TYPE {
            Some(format!("type {:?}, not {}", info.r#type, api::PLUGIN_TYPE))
        } else if version.is_none() {
            Some(format!(
                "no DRA service this kubelet speaks in {:?}",
                info.supported_versions
            ))
        } else {
            None
        };
        let status = registration::RegistrationStatus {
            plugin_registered: refusal.is_none(),
            error: refusal.clone().unwrap_or_default(),
        };
        self.runtime
            .block_on(client.notify_registration_status(status))
            .map_err(|source| KubeletError::Call {
                call: "NotifyRegistrationStatus",
                source,
            })?;
        if let Some(refusal) = refusal {
            return Err(KubeletError::NotDra(refusal));
        }
        let channel = self.connect(Path::new(&info.endpoint))?;
        Ok(Registered {
            kubelet: self,
            info,
            version: version.unwrap_or(Version::V1beta1),
            channel,
        })
    }

    fn connect(&self, socket: &Path) -> Result<Channel, KubeletError> {
        let path = socket.to_path_buf();
        self.runtime
            .block_on(
                // tonic needs a URI; every connection goes to the socket.
                Endpoint::from_static("http://[::]:0")
                    .timeout(CALL_TIMEOUT)
                    .connect_with_connector(tower::service_fn(move |_: Uri| {
                        let path = path.clone();
                        async move { UnixStream::connect(path).await.map(TokioIo::new) }
                    })),
            )
            .map_err(|source| KubeletError::Connect {
                path: socket.to_path_buf(),
                source,
            })
    }
}

/// Each claim's answer by uid: its devices, or the plugin's error line.
pub type Prepared = BTreeMap<String, Result<Vec<PreparedDevice>, String>>;
/// Each claim's answer by uid: done, or the plugin's error line.
pub type Unprepared = BTreeMap<String, Result<(), String>>;

/// The plugin's answer for every claim asked about; a claim left out is an error, as the
/// kubelet treats it (it would ask again).
fn every_claim<T>(
    claims: &[Claim],
    mut answers: BTreeMap<String, T>,
) -> Result<BTreeMap<String, T>, KubeletError> {
    match claims.iter().find(|c| !answers.contains_key(&c.uid)) {
        Some(missing) => Err(KubeletError::MissingClaim {
            uid: missing.uid.clone(),
        }),
        None => {
            answers.retain(|uid, _| claims.iter().any(|c| &c.uid == uid));
            Ok(answers)
        }
    }
}

/// A claim's answer: done, or the plugin's error line.
fn done(error: String) -> Result<(), String> {
    match error.is_empty() {
        true => Ok(()),
        false => Err(error),
    }
}

/// One call of either generation's client, its answer for each claim through `$answer`.
macro_rules! call {
    ($self:ident, $version:ident, $method:ident, $request:ident, $name:literal, $claims:ident, $answer:expr) => {{
        let mut client = $version::dra_plugin_client::DraPluginClient::new($self.channel.clone());
        let request = $version::$request {
            claims: $claims.iter().map(Into::into).collect(),
        };
        let answer = $self
            .kubelet
            .runtime
            .block_on(client.$method(request))
            .map_err(|source| KubeletError::Call {
                call: $name,
                source,
            })?;
        answer
            .into_inner()
            .claims
            .into_iter()
            .map(|(uid, r)| (uid, $answer(r)))
            .collect()
    }};
}

impl Registered<'_> {
    /// NodePrepareResources for `claims`, as the kubelet calls it before a pod's containers.
    pub fn prepare(&self, claims: &[Claim]) -> Result<Prepared, KubeletError> {
        let answers = match self.version {
            Version::V1 => call!(
                self,
                v1,
                node_prepare_resources,
                NodePrepareResourcesRequest,
                "NodePrepareResources",
                claims,
                |r: v1::NodePrepareResourceResponse| done(r.error).map(|()| r
                    .devices
                    .into_iter()
                    .map(Into::into)
                    .collect())
            ),
            Version::V1beta1 => call!(
                self,
                v1beta1,
                node_prepare_resources,
                NodePrepareResourcesRequest,
                "NodePrepareResources",
                claims,
                |r: v1beta1::NodePrepareResourceResponse| done(r.error).map(|()| r
                    .devices
                    .into_iter()
                    .map(Into::into)
                    .collect())
            ),
        };
        every_claim(claims, answers)
    }

    /// NodeUnprepareResources for `claims`, as the kubelet calls it once a pod is gone.
    pub fn unprepare(&self, claims: &[Claim]) -> Result<Unprepared, KubeletError> {
        let answers = match self.version {
            Version::V1 => call!(
                self,
                v1,
                node_unprepare_resources,
                NodeUnprepareResourcesRequest,
                "NodeUnprepareResources",
                claims,
                |r: v1::NodeUnprepareResourceResponse| done(r.error)
            ),
            Version::V1beta1 => call!(
                self,
                v1beta1,
                node_unprepare_resources,
                NodeUnprepareResourcesRequest,
                "NodeUnprepareResources",
                claims,
                |r: v1beta1::NodeUnprepareResourceResponse| done(r.error)
            ),
        };
        every_claim(claims, answers)
    }

    /// Watches the devices' health and returns the first `count` updates, each within
    /// `within`.
    pub fn health_updates(
        &self,
        count: usize,
        within: Duration,
    ) -> Result<Vec<Vec<DeviceHealth>>, KubeletError> {
        let mut client =
            health::dra_resource_health_client::DraResourceHealthClient::new(self.channel.clone());
        self.kubelet.runtime.block_on(async {
            let mut stream = client
                .node_watch_resources(health::NodeWatchResourcesRequest {})
                .await
                .map_err(|source| KubeletError::Call {
                    call: "NodeWatchResources",
                    source,
                })?
                .into_inner();
            let mut updates = Vec::new();
            while updates.len() < count {
                let next = tokio::time::timeout(within, stream.message())
                    .await
                    .map_err(|_| KubeletError::NoHealth(within))?
                    .map_err(|source| KubeletError::Call {
                        call: "NodeWatchResources",
                        source,
                    })?
                    .ok_or(KubeletError::NoHealth(within))?;
                updates.push(next.devices.into_iter().map(Into::into).collect());
            }
            Ok(updates)
        })
    }
}
