//! What a plugin implements, and the dispatch of the engine's calls to it.

use crate::api::{
    self, Container, ContainerUpdate, CreateContainerResponse, EventMask, LinuxResources,
    PodSandbox, StateChangeEvent,
};
use crate::ttrpc::{Response, code};
use prost::Message;

/// A handler's failure. Its text (one line) is what the engine reports for the call: for
/// CreateContainer, in the error that the container's creation fails with.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync>;

/// What the engine tells a plugin when it configures it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Configuration {
    /// The plugin's configuration from the engine's plugin config directory, if any.
    pub config: String,
    pub runtime_name: String,
    pub runtime_version: String,
    /// How long the engine waits for a plugin to register, and for an answer to each call;
    /// an answer that comes later is not waited for (see the crate's docs).
    pub registration_timeout_ms: i64,
    pub request_timeout_ms: i64,
    /// The NRI version the engine speaks (`v0.12.2`); empty from engines before v0.10.
    pub nri_version: String,
}

/// An NRI plugin. The engine calls the handlers of the events [`Plugin::configure`] subscribed
/// to, one call at a time; every handler but `configure` has a default that changes nothing.
pub trait Plugin {
    /// A connection to the engine is made; `engine_pid` is the engine's process as the
    /// socket's peer credentials give it (None where this pid namespace cannot see it).
    fn connected(&mut self, _engine_pid: Option<i32>) {}

    /// Called once per connection, first: returns the events to subscribe to.
    fn configure(&mut self, config: &Configuration) -> Result<EventMask, HandlerError>;

    /// The pods and containers that exist when the plugin connects; the plugin may ask for
    /// updates to them.
    fn synchronize(
        &mut self,
        _pods: Vec<PodSandbox>,
        _containers: Vec<Container>,
    ) -> Result<Vec<ContainerUpdate>, HandlerError> {
        Ok(Vec::new())
    }

    /// A container is being created: the adjustment to make to it (and updates to others).
    /// A failure fails the creation of this container only.
    fn create_container(
        &mut self,
        _pod: &PodSandbox,
        _container: &Container,
    ) -> Result<CreateContainerResponse, HandlerError> {
        Ok(CreateContainerResponse::default())
    }

    fn update_container(
        &mut self,
        _pod: &PodSandbox,
        _container: &Container,
        _resources: Option<&LinuxResources>,
    ) -> Result<Vec<ContainerUpdate>, HandlerError> {
        Ok(Vec::new())
    }

    fn stop_container(
        &mut self,
        _pod: &PodSandbox,
        _container: &Container,
    ) -> Result<Vec<ContainerUpdate>, HandlerError> {
        Ok(Vec::new())
    }

    /// Any other lifecycle event subscribed to (pod started, container removed, …), whether the
    /// engine sends it as the event's own call (NRI v0.12) or as `StateChange` (earlier).
    fn state_change(&mut self, _event: &StateChangeEvent) -> Result<(), HandlerError> {
        Ok(())
    }

    /// The engine is shutting down; the connection closes next.
    fn shutdown(&mut self) {}
}

/// Routes the engine's calls to a plugin, one connection's worth.
pub(crate) struct Dispatcher<'p, P: Plugin + ?Sized> {
    plugin: &'p mut P,
    /// Synchronize arrives in pieces while `more` is set; the plugin sees it whole.
    pending: Option<api::SynchronizeRequest>,
    pub configured: bool,
}

impl<'p, P: Plugin + ?Sized> Dispatcher<'p, P> {
    pub fn new(plugin: &'p mut P) -> Self {
        Dispatcher {
            plugin,
            pending: None,
            configured: false,
        }
    }

    pub fn call(&mut self, method: &str, payload: &[u8]) -> Response {
        match self.answer(method, payload) {
            Ok(reply) => Response::ok(reply),
            Err(Failure(code, message)) => Response::error(code, message),
        }
    }

    fn answer(&mut self, method: &str, payload: &[u8]) -> Result<Vec<u8>, Failure> {
        let plugin = &mut *self.plugin;
        Ok(match method {
            "Configure" => {
                let req: api::ConfigureRequest = decode(payload)?;
                let events = plugin.configure(&Configuration {
                    config: req.config,
                    runtime_name: req.runtime_name,
                    runtime_version: req.runtime_version,
                    registration_timeout_ms: req.registration_timeout,
                    request_timeout_ms: req.request_timeout,
                    nri_version: req.nri_version,
                })?;
                self.configured = true;
                api::ConfigureResponse { events: events.0 }.encode_to_vec()
            }
            "Synchronize" => {
                let req: api::SynchronizeRequest = decode(payload)?;
                let more = req.more;
                let whole = match self.pending.take() {
                    Some(mut pending) => {
                        pending.pods.extend(req.pods);
                        pending.containers.extend(req.containers);
                        pending
                    }
                    None => req,
                };
                if more {
                    self.pending = Some(whole);
                    api::SynchronizeResponse {
                        update: Vec::new(),
                        more: true,
                    }
                } else {
                    api::SynchronizeResponse {
                        update: plugin.synchronize(whole.pods, whole.containers)?,
                        more: false,
                    }
                }
                .encode_to_vec()
            }
            "Shutdown" => {
                plugin.shutdown();
                api::Empty {}.encode_to_vec()
            }
            "CreateContainer" => {
                let req: api::CreateContainerRequest = decode(payload)?;
                let (pod, container) = (
                    req.pod.unwrap_or_default(),
                    req.container.unwrap_or_default(),
                );
                plugin.create_container(&pod, &container)?.encode_to_vec()
            }
            "UpdateContainer" => {
                let req: api::UpdateContainerRequest = decode(payload)?;
                let (pod, container) = (
                    req.pod.unwrap_or_default(),
                    req.container.unwrap_or_default(),
                );
                let update =
                    plugin.update_container(&pod, &container, req.linux_resources.as_ref())?;
                api::UpdateContainerResponse {
                    update,
                    evict: Vec::new(),
                }
                .encode_to_vec()
            }
            "StopContainer" => {
                let req: api::StopContainerRequest = decode(payload)?;
                let (pod, container) = (
                    req.pod.unwrap_or_default(),
                    req.container.unwrap_or_default(),
                );
                let update = plugin.stop_container(&pod, &container)?;
                api::StopContainerResponse { update }.encode_to_vec()
            }
            "StateChange" => {
                let event: StateChangeEvent = decode(payload)?;
                plugin.state_change(&event)?;
                api::Empty {}.encode_to_vec()
            }
            // NRI v0.12's own call per lifecycle event: the event StateChange carries, answered
            // with the call's empty reply (which encodes as Empty does: no bytes).
            "UpdatePodSandbox" => {
                let req: api::UpdatePodSandboxRequest = decode(payload)?;
                plugin.state_change(&StateChangeEvent {
                    event: api::Event::UpdatePodSandbox as i32,
                    pod: req.pod,
                    container: None,
                })?;
                api::Empty {}.encode_to_vec()
            }
            other => {
                let Some(event) = lifecycle_event(other) else {
                    return Err(Failure(
                        code::UNIMPLEMENTED,
                        format!("this plugin does not implement NRI method {other}"),
                    ));
                };
                let req: api::PostCreateContainerRequest = decode(payload)?;
                plugin.state_change(&StateChangeEvent {
                    event: event as i32,
                    pod: req.pod,
                    container: req.container,
                })?;
                api::Empty {}.encode_to_vec()
            }
        })
    }
}

/// The event of an NRI v0.12 per-event call that older engines send as `StateChange`. Each of
/// these requests holds the pod (field 1) and, for a container's event, the container (field
/// 2), so each decodes as [`api::PostCreateContainerRequest`]. (UpdatePodSandbox's fields 2
/// and 3 are resources, not a container: it has an arm of its own.)
fn lifecycle_event(method: &str) -> Option<api::Event> {
    use api::Event::*;
    Some(match method {
        "RunPodSandbox" => RunPodSandbox,
        "StopPodSandbox" => StopPodSandbox,
        "RemovePodSandbox" => RemovePodSandbox,
        "PostUpdatePodSandbox" => PostUpdatePodSandbox,
        "PostCreateContainer" => PostCreateContainer,
        "StartContainer" => StartContainer,
        "PostStartContainer" => PostStartContainer,
        "PostUpdateContainer" => PostUpdateContainer,
        "RemoveContainer" => RemoveContainer,
        _ => return None,
    })
}

/// A call's failure, as the status the engine gets.
struct Failure(i32, String);

impl From<HandlerError> for Failure {
    fn from(e: HandlerError) -> Failure {
        Failure(code::UNKNOWN, e.to_string())
    }
}

fn decode<M: Message + Default>(payload: &[u8]) -> Result<M, Failure> {
    M::decode(payload).map_err(|e| {
        Failure(
            code::INVALID_ARGUMENT,
            format!("cannot decode the engine's request: {e}"),
        )
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::Event;

    /// A plugin that records what the engine told it and adjusts every container it is asked
    /// about, for the dispatcher's tests and the engine double's.
    #[derive(Default)]
    pub(crate) struct Recorder {
        pub synced: Vec<(usize, usize)>,
        pub nri_version: String,
        /// Lifecycle events, with the container's name (the pod's for a pod's event).
        pub events: Vec<(i32, String)>,
        /// The engine's pid, as the connection gave it.
        pub engine_pid: Option<i32>,
    }

    impl Plugin for Recorder {
        fn connected(&mut self, engine_pid: Option<i32>) {
            self.engine_pid = engine_pid;
        }

        fn configure(&mut self, config: &Configuration) -> Result<EventMask, HandlerError> {
            if config.config == "refuse" {
                return Err("refused by configuration".into());
            }
            self.nri_version = config.nri_version.clone();
            Ok(EventMask::of(&[Event::CreateContainer]))
        }

        fn state_change(&mut self, event: &StateChangeEvent) -> Result<(), HandlerError> {
            let who = match (&event.pod, &event.container) {
                (_, Some(c)) => c.name.clone(),
                (Some(p), None) => p.name.clone(),
                (None, None) => String::new(),
            };
            self.events.push((event.event, who));
            Ok(())
        }

        fn synchronize(
            &mut self,
            pods: Vec<PodSandbox>,
            containers: Vec<Container>,
        ) -> Result<Vec<ContainerUpdate>, HandlerError> {
            self.synced.push((pods.len(), containers.len()));
            Ok(Vec::new())
        }

        fn create_container(
            &mut self,
            _pod: &PodSandbox,
            container: &Container,
        ) -> Result<CreateContainerResponse, HandlerError> {
            if container.name == "bad" {
                return Err("no GPU 9 on this node".into());
            }
            let mut adjust = api::ContainerAdjustment::default();
            adjust.env.push(api::KeyValue {
                key: "SEEN".into(),
                value: container.name.clone(),
            });
            Ok(CreateContainerResponse {
                adjust: Some(adjust),
                ..Default::default()
            })
        }
    }

    #[test]
    fn configure_subscribes_and_failures_carry_their_text() {
        let mut plugin = Recorder::default();
        let mut d = Dispatcher::new(&mut plugin);
        let r = d.call(
            "Configure",
            &api::ConfigureRequest::default().encode_to_vec(),
        );
        assert!(r.failure().is_none());
        assert_eq!(
            api::ConfigureResponse::decode(&r.payload[..])
                .unwrap()
                .events,
            1 << 3
        );
        assert!(d.configured);
        let refuse = api::ConfigureRequest {
            config: "refuse".into(),
            ..Default::default()
        };
        let r = d.call("Configure", &refuse.encode_to_vec());
        assert_eq!(r.failure().unwrap().message, "refused by configuration");
    }

    #[test]
    fn synchronize_is_delivered_whole() {
        let mut plugin = Recorder::default();
        let mut d = Dispatcher::new(&mut plugin);
        for more in [true, true, false] {
            let req = api::SynchronizeRequest {
                pods: vec![PodSandbox::default()],
                containers: vec![Container::default(), Container::default()],
                more,
            };
            let r = d.call("Synchronize", &req.encode_to_vec());
            assert_eq!(
                api::SynchronizeResponse::decode(&r.payload[..])
                    .unwrap()
                    .more,
                more
            );
        }
        assert_eq!(plugin.synced, vec![(3, 6)]);
    }

    #[test]
    fn create_container_answers_or_fails_this_container_only() {
        let mut plugin = Recorder::default();
        let mut d = Dispatcher::new(&mut plugin);
        let req = |name: &str| api::CreateContainerRequest {
            pod: None,
            container: Some(Container {
                name: name.into(),
                ..Default::default()
            }),
        };
        let r = d.call("CreateContainer", &req("good").encode_to_vec());
        let reply = CreateContainerResponse::decode(&r.payload[..]).unwrap();
        assert_eq!(reply.adjust.unwrap().env[0].value, "good");
        let r = d.call("CreateContainer", &req("bad").encode_to_vec());
        assert_eq!(r.failure().unwrap().message, "no GPU 9 on this node");
        let r = d.call("CreateContainer", b"\xff\xff\xff");
        assert_eq!(r.failure().unwrap().code, code::INVALID_ARGUMENT);
        let r = d.call("Frobnicate", &[]);
        assert_eq!(r.failure().unwrap().code, code::UNIMPLEMENTED);
    }
}
