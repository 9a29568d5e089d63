//! The plugin's two gRPC servers: registration on the socket the kubelet's plugin watcher
//! finds, the DRA services (and health) on the socket registration names.

use crate::api::{self, health, registration, v1, v1beta1};
use crate::{Claim, DeviceHealth, DraError, Driver, PreparedDevice};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::{Request, Response, Status};

/// Where the kubelet's plugin watcher looks for registration sockets.
pub const KUBELET_REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";
/// Where kubelet plugins keep their own sockets and state, a directory per driver.
pub const KUBELET_PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";

/// How long a stopped plugin lets the calls under way finish.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// Where a plugin listens, and what it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginOptions {
    /// The DRA driver's name, as ResourceSlices and DeviceClasses name it.
    pub driver_name: String,
    /// The kubelet's plugin registry directory.
    pub registry_dir: PathBuf,
    /// The plugin's own directory, where the DRA socket is.
    pub plugin_dir: PathBuf,
    /// How often [`Driver::health`] is asked while the kubelet watches; None offers no
    /// health service.
    pub health_interval: Option<Duration>,
}

impl PluginOptions {
    /// The kubelet's default directories for `driver_name`, no health service.
    pub fn new(driver_name: &str) -> PluginOptions {
        PluginOptions {
            driver_name: driver_name.to_string(),
            registry_dir: PathBuf::from(KUBELET_REGISTRY_DIR),
            plugin_dir: Path::new(KUBELET_PLUGINS_DIR).join(driver_name),
            health_interval: None,
        }
    }

    /// `<registry>/<driver>-reg.sock`, the name the kubelet's own helper library gives.
    pub fn registration_socket(&self) -> PathBuf {
        self.registry_dir
            .join(format!("{}-reg.sock", self.driver_name))
    }

    pub fn dra_socket(&self) -> PathBuf {
        self.plugin_dir.join("dra.sock")
    }

    /// The services the kubelet reads from `PluginInfo.supported_versions`.
    pub fn services(&self) -> Vec<String> {
        let mut services = vec![
            api::SERVICE_V1.to_string(),
            api::SERVICE_V1BETA1.to_string(),
        ];
        if self.health_interval.is_some() {
            services.push(api::SERVICE_HEALTH.to_string());
        }
        services
    }
}

/// What the kubelet said of the registration: None until it said anything.
type RegistrationStatus = Arc<Mutex<Option<Result<(), String>>>>;

/// A running plugin. Dropping it stops it.
pub struct Server {
    stop: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<Result<(), DraError>>>,
    status: RegistrationStatus,
    sockets: [PathBuf; 2],
}

impl Server {
    /// What the kubelet said when it registered the plugin, if it has.
    pub fn registration(&self) -> Option<Result<(), String>> {
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Stops serving and removes both sockets (the kubelet's watcher sees the registration
    /// socket go and forgets the plugin); how serving ended.
    pub fn stop(mut self) -> Result<(), DraError> {
        self.finish(true)
    }

    /// Serves until a server fails.
    pub fn wait(mut self) -> Result<(), DraError> {
        self.finish(false)
    }

    fn finish(&mut self, stop: bool) -> Result<(), DraError> {
        if stop {
            self.stop.send_replace(true);
        }
        let outcome = match self.thread.take() {
            Some(thread) => thread.join().unwrap_or_else(|_| {
                Err(DraError::Runtime(std::io::Error::other(
                    "the plugin's server thread panicked",
                )))
            }),
            None => Ok(()),
        };
        for socket in &self.sockets {
            let _ = std::fs::remove_file(socket);
        }
        outcome
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.thread.is_some() {
            let _ = self.finish(true);
        }
    }
}

/// Listens on the DRA socket, then on the registration socket (the kubelet finds the plugin
/// by the latter, so the former must be ready first), and serves both on a thread of their
/// own. A socket left by an earlier run is replaced; anything else in its place is an error.
pub fn start<D: Driver>(driver: Arc<D>, options: &PluginOptions) -> Result<Server, DraError> {
    let dra_path = options.dra_socket();
    let registration_path = options.registration_socket();
    let dra = listen(&dra_path)?;
    let registration = listen(&registration_path)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(DraError::Runtime)?;
    let (stop, stopped) = watch::channel(false);
    let status = RegistrationStatus::default();
    let info = registration::PluginInfo {
        r#type: api::PLUGIN_TYPE.to_string(),
        name: options.driver_name.clone(),
        endpoint: dra_path.display().to_string(),
        supported_versions: options.services(),
    };
    let registrar = Registrar {
        info,
        status: status.clone(),
    };
    let interval = options.health_interval;
    let sockets = [dra_path.clone(), registration_path.clone()];
    let thread = std::thread::Builder::new()
        .name("dra-plugin".into())
        .spawn(move || {
            runtime.block_on(async move {
                let until_stopped = |mut stopped: watch::Receiver<bool>| async move {
                    let _ = stopped.wait_for(|stop| *stop).await;
                };
                let incoming = |listener: std::os::unix::net::UnixListener, path: &Path| {
                    tokio::net::UnixListener::from_std(listener)
                        .map(UnixListenerStream::new)
                        .map_err(|source| DraError::Listen {
                            path: path.to_path_buf(),
                            source,
                        })
                };
                let dra_incoming = incoming(dra, &dra_path)?;
                let registration_incoming = incoming(registration, &registration_path)?;
                let health = interval.map(|every| {
                    health::dra_resource_health_server::DraResourceHealthServer::new(
                        HealthService {
                            driver: driver.clone(),
                            every,
                        },
                    )
                });
                let dra_server = tonic::transport::Server::builder()
                    .add_service(v1::dra_plugin_server::DraPluginServer::new(DraService(
                        driver.clone(),
                    )))
                    .add_service(v1beta1::dra_plugin_server::DraPluginServer::new(
                        DraService(driver),
                    ))
                    .add_optional_service(health)
                    .serve_with_incoming_shutdown(dra_incoming, until_stopped(stopped.clone()));
                let registration_server = tonic::transport::Server::builder()
                    .add_service(registration::registration_server::RegistrationServer::new(
                        registrar,
                    ))
                    .serve_with_incoming_shutdown(
                        registration_incoming,
                        until_stopped(stopped.clone()),
                    );
                let served = async {
                    let (dra, registration) = tokio::join!(dra_server, registration_server);
                    dra.map_err(|source| DraError::Serve {
                        path: dra_path,
                        source,
                    })?;
                    registration.map_err(|source| DraError::Serve {
                        path: registration_path,
                        source,
                    })
                };
                // Stopped, the servers take no new connection and finish the calls under way;
                // a kubelet that keeps its connection open does not hold the plugin past that.
                let grace_over = async {
                    until_stopped(stopped).await;
                    tokio::time::sleep(STOP_GRACE).await;
                };
                tokio::select! {
                    served = served => served,
                    () = grace_over => Ok(()),
                }
            })
        })
        .map_err(DraError::Runtime)?;
    Ok(Server {
        stop,
        thread: Some(thread),
        status,
        sockets,
    })
}

/// A listening socket at `path`, its directory made if missing.
fn listen(path: &Path) -> Result<std::os::unix::net::UnixListener, DraError> {
    let fail = |source| DraError::Listen {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path).map_err(fail)?,
        Ok(_) => {
            return Err(DraError::NotASocket {
                path: path.to_path_buf(),
            });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail(e)),
    }
    let listener = std::os::unix::net::UnixListener::bind(path).map_err(fail)?;
    listener.set_nonblocking(true).map_err(fail)?;
    Ok(listener)
}

struct Registrar {
    info: registration::PluginInfo,
    status: RegistrationStatus,
}

#[tonic::async_trait]
impl registration::registration_server::Registration for Registrar {
    async fn get_info(
        &self,
        _: Request<registration::InfoRequest>,
    ) -> Result<Response<registration::PluginInfo>, Status> {
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<registration::RegistrationStatus>,
    ) -> Result<Response<registration::RegistrationStatusResponse>, Status> {
        let said = request.into_inner();
        let status = match said.plugin_registered {
            true => {
                tracing::info!(driver = %self.info.name, "registered with the kubelet");
                Ok(())
            }
            false => {
                tracing::error!(driver = %self.info.name, error = %said.error, "the kubelet refused the registration");
                Err(said.error)
            }
        };
        *self.status.lock().unwrap_or_else(|e| e.into_inner()) = Some(status);
        Ok(Response::new(registration::RegistrationStatusResponse {}))
    }
}

/// Every claim of `claims` with the driver's answer, prepared on a blocking thread.
async fn each_claim<D: Driver, T: Send + 'static>(
    driver: &Arc<D>,
    claims: Vec<Claim>,
    call: fn(&D, &Claim) -> T,
) -> Result<Vec<(String, T)>, Status> {
    let driver = driver.clone();
    tokio::task::spawn_blocking(move || {
        claims
            .into_iter()
            .map(|claim| {
                let answer = call(&driver, &claim);
                (claim.uid, answer)
            })
            .collect()
    })
    .await
    .map_err(|e| Status::internal(format!("the driver failed: {e}")))
}

/// The DRA service of one generation of the API, over the same driver.
struct DraService<D>(Arc<D>);

/// The two generations' services are the same calls on messages of the same shape.
macro_rules! dra_service {
    ($version:ident) => {
        #[tonic::async_trait]
        impl<D: Driver> $version::dra_plugin_server::DraPlugin for DraService<D> {
            async fn node_prepare_resources(
                &self,
                request: Request<$version::NodePrepareResourcesRequest>,
            ) -> Result<Response<$version::NodePrepareResourcesResponse>, Status> {
                let claims = request.into_inner().claims.into_iter().map(Claim::from);
                let answers = each_claim(&self.0, claims.collect(), D::prepare).await?;
                let claims = answers
                    .into_iter()
                    .map(|(uid, answer)| {
                        let response = match answer {
                            Ok(devices) => $version::NodePrepareResourceResponse {
                                devices: devices.into_iter().map(PreparedDevice::into).collect(),
                                error: String::new(),
                            },
                            Err(error) => $version::NodePrepareResourceResponse {
                                devices: Vec::new(),
                                error,
                            },
                        };
                        (uid, response)
                    })
                    .collect();
                Ok(Response::new($version::NodePrepareResourcesResponse {
                    claims,
                }))
            }

            async fn node_unprepare_resources(
                &self,
                request: Request<$version::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<$version::NodeUnprepareResourcesResponse>, Status> {
                let claims = request.into_inner().claims.into_iter().map(Claim::from);
                let answers = each_claim(&self.0, claims.collect(), D::unprepare).await?;
                let claims = answers
                    .into_iter()
                    .map(|(uid, answer)| {
                        let error = answer.err().unwrap_or_default();
                        (uid, $version::NodeUnprepareResourceResponse { error })
                    })
                    .collect();
                Ok(Response::new($version::NodeUnprepareResourcesResponse {
                    claims,
                }))
            }
        }
    };
}
dra_service!(v1);
dra_service!(v1beta1);

struct HealthService<D> {
    driver: Arc<D>,
    every: Duration,
}

#[tonic::async_trait]
impl<D: Driver> health::dra_resource_health_server::DraResourceHealth for HealthService<D> {
    type NodeWatchResourcesStream =
        ReceiverStream<Result<health::NodeWatchResourcesResponse, Status>>;

    /// The devices' health at once, then again each time it changes, until the kubelet goes.
    async fn node_watch_resources(
        &self,
        _: Request<health::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        let (tx, rx) = mpsc::channel(1);
        let driver = self.driver.clone();
        let mut ticks = tokio::time::interval(self.every);
        tokio::spawn(async move {
            let mut sent: Option<Vec<DeviceHealth>> = None;
            while !tx.is_closed() {
                ticks.tick().await;
                let asked = driver.clone();
                let Ok(now) = tokio::task::spawn_blocking(move || asked.health()).await else {
                    break;
                };
                if sent.as_ref() == Some(&now) {
                    continue;
                }
                let message = health::NodeWatchResourcesResponse {
                    devices: now.iter().map(Into::into).collect(),
                };
                if tx.send(Ok(message)).await.is_err() {
                    break;
                }
                sent = Some(now);
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
