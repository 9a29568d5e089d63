//! Connecting a plugin to the engine: registration, serving the engine's calls, and
//! reconnecting when the engine restarts.

use crate::api::{self, RegisterPluginRequest};
use crate::connection::Connection;
use crate::error::NriError;
use crate::plugin::{Dispatcher, Plugin};
use crate::ttrpc::{self, code};
use crate::wire::{self, Kind};
use prost::Message;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where engines listen for plugins that connect on their own.
pub const DEFAULT_SOCKET: &str = "/var/run/nri/nri.sock";
/// Set by the engine for a plugin it starts itself: the descriptor of its end of a socket pair.
pub const SOCKET_ENV: &str = "NRI_PLUGIN_SOCKET";
/// Set by the engine for a plugin it starts itself: the name and index from its file name.
pub const NAME_ENV: &str = "NRI_PLUGIN_NAME";
pub const INDEX_ENV: &str = "NRI_PLUGIN_IDX";

/// The stream id of the plugin's one call to the engine's Runtime service. ttrpc clients
/// number their calls with odd ids, from 1.
const REGISTER_STREAM: u32 = 1;

/// How the plugin reaches the engine.
#[derive(Debug)]
pub enum Endpoint {
    /// A socket the plugin connects to, and connects to again after the engine restarts.
    Socket(PathBuf),
    /// The pre-registered form: the engine started the plugin from its plugin directory and
    /// passed a connected socket. When the engine closes it, the plugin's work is done.
    Inherited(OwnedFd),
}

/// How a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The engine closed it (it stopped, restarted, or dropped the plugin).
    Closed,
    /// The engine said it was shutting down, then closed it.
    Shutdown,
}

/// A plugin's identity and endpoint.
#[derive(Debug)]
pub struct Stub {
    name: String,
    index: String,
    endpoint: Endpoint,
}

impl Stub {
    /// A plugin named `name` at `index` (two digits: lower indexes are called first) that
    /// connects to `socket`, or, when the engine started it ([`SOCKET_ENV`] is set), uses
    /// the socket and the name and index the engine gave it.
    pub fn from_env(name: &str, index: &str, socket: &Path) -> Result<Stub, NriError> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let endpoint = match var(SOCKET_ENV) {
            Some(value) => Endpoint::Inherited(inherited_socket(&value)?),
            None => Endpoint::Socket(socket.to_path_buf()),
        };
        let pre_registered = matches!(endpoint, Endpoint::Inherited(_));
        let pick = |env: &str, own: &str| match var(env) {
            Some(v) if pre_registered => v,
            _ => own.to_string(),
        };
        Stub::new(&pick(NAME_ENV, name), &pick(INDEX_ENV, index), endpoint)
    }

    pub fn new(name: &str, index: &str, endpoint: Endpoint) -> Result<Stub, NriError> {
        if index.len() != 2 || !index.bytes().all(|b| b.is_ascii_digit()) {
            return Err(NriError::BadIndex(index.into()));
        }
        if name.is_empty() || name.contains(|c: char| c == '/' || c.is_whitespace()) {
            return Err(NriError::BadName(name.into()));
        }
        Ok(Stub {
            name: name.into(),
            index: index.into(),
            endpoint,
        })
    }

    /// `INDEX-NAME`, as the engine names the plugin in its log and errors.
    pub fn qualified_name(&self) -> String {
        format!("{}-{}", self.index, self.name)
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Serves one connection: registers, then answers the engine until it closes.
    pub fn serve<P: Plugin + ?Sized>(&self, plugin: &mut P) -> Result<Ended, NriError> {
        self.serve_reporting(plugin, &mut |_| {})
    }

    fn serve_reporting<P: Plugin + ?Sized>(
        &self,
        plugin: &mut P,
        report: &mut dyn FnMut(Event<'_>),
    ) -> Result<Ended, NriError> {
        let stream = match &self.endpoint {
            Endpoint::Socket(path) => {
                UnixStream::connect(path).map_err(|source| NriError::Connect {
                    path: path.clone(),
                    source,
                })?
            }
            Endpoint::Inherited(fd) => UnixStream::from(fd.try_clone().map_err(NriError::Io)?),
        };
        self.serve_stream(stream, plugin, report)
    }

    /// Serves until the plugin is stopped. Through a socket, a lost connection is made again
    /// as soon as the engine listens again; an engine that refuses the registration ends it.
    /// Started by the engine, the plugin is done when the engine closes its socket.
    pub fn run<P: Plugin + ?Sized>(&self, plugin: &mut P) -> Result<(), NriError> {
        self.run_reporting(plugin, &mut |_| {})
    }

    /// [`Stub::run`], telling `report` each time the plugin is registered and configured, the
    /// engine closes the connection, or a connection fails (the first failure of a row: the
    /// retries that follow are not reported), so that a front end run by hand can say so.
    pub fn run_reporting<P: Plugin + ?Sized>(
        &self,
        plugin: &mut P,
        report: &mut dyn FnMut(Event<'_>),
    ) -> Result<(), NriError> {
        if let Endpoint::Inherited(_) = self.endpoint {
            self.serve_reporting(plugin, report)?;
            return Ok(());
        }
        let mut wait = Retry::default();
        loop {
            match self.serve_reporting(plugin, report) {
                Ok(ended) => {
                    tracing::info!(?ended, plugin = %self.qualified_name(), "the engine closed the NRI connection; connecting again");
                    report(Event::Closed(ended));
                    wait.reset();
                }
                Err(e @ NriError::Refused { .. }) => return Err(e),
                Err(e) => {
                    if wait.first() {
                        tracing::warn!("{e}; trying again until the engine's NRI socket answers");
                        report(Event::Failed(&e));
                    }
                }
            }
            std::thread::sleep(wait.next());
        }
    }

    fn serve_stream<P: Plugin + ?Sized>(
        &self,
        stream: UnixStream,
        plugin: &mut P,
        report: &mut dyn FnMut(Event<'_>),
    ) -> Result<Ended, NriError> {
        plugin.connected(peer_pid(&stream));
        let mut conn = Connection::new(stream);
        let register = ttrpc::Request {
            service: api::RUNTIME_SERVICE.into(),
            method: "RegisterPlugin".into(),
            payload: RegisterPluginRequest {
                plugin_name: self.name.clone(),
                plugin_idx: self.index.clone(),
                nri_version: api::NRI_VERSION.into(),
            }
            .encode_to_vec(),
            ..Default::default()
        };
        conn.send(
            wire::RUNTIME_SERVICE,
            REGISTER_STREAM,
            Kind::Request,
            &register.encode_to_vec(),
        )?;
        let mut dispatcher = Dispatcher::new(plugin);
        let mut ended = Ended::Closed;
        while let Some(message) = conn.receive()? {
            match (message.conn, message.kind) {
                (wire::PLUGIN_SERVICE, k) if k == Kind::Request as u8 => {
                    let request = decode::<ttrpc::Request>(&message.payload, "call")?;
                    let response = if request.service == api::PLUGIN_SERVICE {
                        dispatcher.call(&request.method, &request.payload)
                    } else {
                        ttrpc::Response::error(
                            code::UNIMPLEMENTED,
                            format!("this plugin serves no service {}", request.service),
                        )
                    };
                    if let Some(failure) = response.failure() {
                        tracing::warn!(method = %request.method, "{}", failure.message);
                    }
                    conn.send(
                        wire::PLUGIN_SERVICE,
                        message.stream,
                        Kind::Response,
                        &response.encode_to_vec(),
                    )?;
                    if request.method == "Shutdown" {
                        ended = Ended::Shutdown;
                    }
                    if request.method == "Configure" && dispatcher.configured {
                        tracing::info!(plugin = %self.qualified_name(), "registered and configured");
                        report(Event::Configured);
                    }
                }
                (wire::RUNTIME_SERVICE, k)
                    if k == Kind::Response as u8 && message.stream == REGISTER_STREAM =>
                {
                    let response = decode::<ttrpc::Response>(&message.payload, "answer")?;
                    if let Some(failure) = response.failure() {
                        return Err(NriError::Refused {
                            name: self.name.clone(),
                            index: self.index.clone(),
                            message: failure.message.clone(),
                        });
                    }
                }
                (conn, kind) => tracing::debug!(conn, kind, "ignored an NRI message"),
            }
        }
        if !dispatcher.configured {
            return Err(NriError::ClosedEarly(self.qualified_name()));
        }
        Ok(ended)
    }
}

fn decode<M: Message + Default>(payload: &[u8], what: &'static str) -> Result<M, NriError> {
    M::decode(payload).map_err(|source| NriError::Decode { what, source })
}

/// What [`Stub::run_reporting`] tells its caller.
#[derive(Debug)]
pub enum Event<'a> {
    /// The engine took the registration and configured the plugin.
    Configured,
    /// The engine closed a connection it had served; the stub connects again.
    Closed(Ended),
    /// A connection failed; the stub tries again until the engine answers.
    Failed(&'a NriError),
}

/// The descriptor in [`SOCKET_ENV`], checked to be a socket and kept from the plugin's
/// children.
fn inherited_socket(value: &str) -> Result<OwnedFd, NriError> {
    let bad = |why: String| NriError::BadInheritedSocket {
        var: SOCKET_ENV,
        value: value.into(),
        why,
    };
    let fd: RawFd = value
        .parse()
        .ok()
        .filter(|fd| *fd >= 0)
        .ok_or_else(|| bad("not a descriptor number".into()))?;
    // SAFETY: a zeroed `stat` is a valid value of a plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into the struct it is given and reads nothing else.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(bad(format!("{}", std::io::Error::last_os_error())));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(bad("the descriptor is not a socket".into()));
    }
    // SAFETY: F_SETFD on a descriptor number touches no memory; a bad one is EBADF.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    // SAFETY: the engine gave this descriptor to the plugin, and nothing else here owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Waits between attempts to reach the engine: short at first, an engine restart is quick.
#[derive(Debug)]
struct Retry {
    delay: Duration,
}

impl Default for Retry {
    fn default() -> Retry {
        Retry {
            delay: Duration::ZERO,
        }
    }
}

impl Retry {
    const FIRST: Duration = Duration::from_millis(50);
    const MOST: Duration = Duration::from_secs(2);

    fn first(&self) -> bool {
        self.delay.is_zero()
    }

    fn next(&mut self) -> Duration {
        self.delay = (self.delay * 2).clamp(Self::FIRST, Self::MOST);
        self.delay
    }

    fn reset(&mut self) {
        self.delay = Duration::ZERO;
    }
}

/// The pid of the process on the other end of `stream`, from its credentials (SO_PEERCRED);
/// None where the kernel gives 0 (a process this pid namespace cannot see).
fn peer_pid(stream: &UnixStream) -> Option<i32> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred and len are valid out-pointers of the sizes given, for a socket fd.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0 && cred.pid > 0).then_some(cred.pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_indexes_are_checked() {
        let socket = || Endpoint::Socket(DEFAULT_SOCKET.into());
        assert!(Stub::new("nvhook", "10", socket()).is_ok());
        for index in ["1", "100", "a1", ""] {
            assert!(matches!(
                Stub::new("x", index, socket()),
                Err(NriError::BadIndex(_))
            ));
        }
        for name in ["", "a/b", "a b"] {
            assert!(matches!(
                Stub::new(name, "10", socket()),
                Err(NriError::BadName(_))
            ));
        }
        assert_eq!(
            Stub::new("nvhook", "10", socket())
                .unwrap()
                .qualified_name(),
            "10-nvhook"
        );
    }

    #[test]
    fn an_inherited_socket_must_be_one() {
        assert!(inherited_socket("x").is_err());
        assert!(inherited_socket("-1").is_err());
        let file = tempfile::tempfile().unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        let e = inherited_socket(&fd.to_string()).unwrap_err();
        assert!(e.to_string().contains("not a socket"), "{e}");
        let (a, _b) = UnixStream::pair().unwrap();
        let fd = std::os::fd::IntoRawFd::into_raw_fd(a);
        let owned = inherited_socket(&fd.to_string()).unwrap();
        assert_eq!(std::os::fd::AsRawFd::as_raw_fd(&owned), fd);
    }

    #[test]
    fn retries_grow_to_a_bound_and_start_over() {
        let mut r = Retry::default();
        assert!(r.first());
        let waits: Vec<_> = (0..8).map(|_| r.next()).collect();
        assert_eq!(waits[0], Retry::FIRST);
        assert_eq!(*waits.last().unwrap(), Retry::MOST);
        r.reset();
        assert_eq!(r.next(), Retry::FIRST);
    }
}

/// An engine built from the crate's own wire code, for both generations of the protocol:
/// containerd 2.1's (nri v0.8: lifecycle events as `StateChange`) and v0.12's (one call per
/// event, `StateChange` only after the plugin answered a call "unimplemented").
#[cfg(test)]
mod engine_double {
    use super::*;
    use crate::api::{Container, CreateContainerResponse, Event, PodSandbox};
    use crate::plugin::tests::Recorder;
    use crate::ttrpc::Response;

    /// The engine's end of one plugin connection.
    struct Engine {
        conn: Connection,
        next_stream: u32,
    }

    impl Engine {
        /// Takes the plugin's registration and accepts it; returns what the plugin sent.
        fn accept(stream: UnixStream) -> (Engine, RegisterPluginRequest) {
            let mut conn = Connection::new(stream);
            let message = conn.receive().unwrap().expect("a registration");
            assert_eq!(message.conn, wire::RUNTIME_SERVICE);
            let request = ttrpc::Request::decode(&message.payload[..]).unwrap();
            assert_eq!(
                (request.service.as_str(), request.method.as_str()),
                (api::RUNTIME_SERVICE, "RegisterPlugin")
            );
            let registration = RegisterPluginRequest::decode(&request.payload[..]).unwrap();
            let ok = Response::ok(api::Empty {}.encode_to_vec());
            conn.send(
                wire::RUNTIME_SERVICE,
                message.stream,
                Kind::Response,
                &ok.encode_to_vec(),
            )
            .unwrap();
            let engine = Engine {
                conn,
                next_stream: 1,
            };
            (engine, registration)
        }

        fn call(&mut self, method: &str, payload: impl Message) -> Response {
            let stream = self.next_stream;
            self.next_stream += 2;
            let request = ttrpc::Request {
                service: api::PLUGIN_SERVICE.into(),
                method: method.into(),
                payload: payload.encode_to_vec(),
                ..Default::default()
            };
            self.conn
                .send(
                    wire::PLUGIN_SERVICE,
                    stream,
                    Kind::Request,
                    &request.encode_to_vec(),
                )
                .unwrap();
            loop {
                let message = self.conn.receive().unwrap().expect("the plugin's answer");
                if message.conn == wire::PLUGIN_SERVICE && message.stream == stream {
                    return Response::decode(&message.payload[..]).unwrap();
                }
            }
        }

        /// A lifecycle event as an engine of `generation` sends it: v0.12 calls the event's
        /// own method and falls back to StateChange on "unimplemented"; v0.8 sends
        /// StateChange.
        fn event(&mut self, generation: &str, event: Event, pod: &str, container: Option<&str>) {
            let pod = Some(PodSandbox {
                name: pod.into(),
                ..Default::default()
            });
            let container = container.map(|name| Container {
                name: name.into(),
                ..Default::default()
            });
            if generation == "v0.12" {
                let response = match event {
                    Event::RunPodSandbox => {
                        self.call("RunPodSandbox", api::RunPodSandboxRequest { pod })
                    }
                    Event::UpdatePodSandbox => self.call(
                        "UpdatePodSandbox",
                        api::UpdatePodSandboxRequest {
                            pod,
                            overhead_linux_resources: None,
                            linux_resources: Some(api::LinuxResources::default()),
                        },
                    ),
                    Event::RemoveContainer => self.call(
                        "RemoveContainer",
                        api::RemoveContainerRequest { pod, container },
                    ),
                    other => panic!("no v0.12 call for {other:?} here"),
                };
                assert!(response.failure().is_none(), "{response:?}");
                assert!(response.payload.is_empty());
                return;
            }
            let state = api::StateChangeEvent {
                event: event as i32,
                pod,
                container,
            };
            let response = self.call("StateChange", state);
            assert!(response.failure().is_none(), "{response:?}");
        }
    }

    fn session(generation: &str) -> Recorder {
        let (plugin_end, engine_end) = UnixStream::pair().unwrap();
        let mut recorder = Recorder::default();
        std::thread::scope(|scope| {
            let plugin = scope.spawn(|| {
                let stub =
                    Stub::new("double", "10", Endpoint::Socket(DEFAULT_SOCKET.into())).unwrap();
                stub.serve_stream(plugin_end, &mut recorder, &mut |_| {})
                    .unwrap()
            });
            let (mut engine, registration) = Engine::accept(engine_end);
            assert_eq!(registration.plugin_name, "double");
            assert_eq!(registration.nri_version, api::NRI_VERSION);
            // Engines before nri v0.10 send no version.
            let configure = api::ConfigureRequest {
                runtime_name: "double".into(),
                nri_version: match generation {
                    "v0.12" => api::NRI_VERSION.into(),
                    _ => String::new(),
                },
                ..Default::default()
            };
            let reply = engine.call("Configure", configure);
            let events = api::ConfigureResponse::decode(&reply.payload[..]).unwrap();
            assert!(api::EventMask(events.events).contains(Event::CreateContainer));
            let reply = engine.call("Synchronize", api::SynchronizeRequest::default());
            assert!(reply.failure().is_none(), "{reply:?}");
            engine.event(generation, Event::RunPodSandbox, "pod", None);
            let create = api::CreateContainerRequest {
                pod: None,
                container: Some(Container {
                    name: "gpu".into(),
                    ..Default::default()
                }),
            };
            let reply = engine.call("CreateContainer", create);
            let adjust = CreateContainerResponse::decode(&reply.payload[..])
                .unwrap()
                .adjust
                .unwrap();
            assert_eq!(adjust.env[0].value, "gpu");
            engine.event(generation, Event::UpdatePodSandbox, "pod", None);
            engine.event(generation, Event::RemoveContainer, "pod", Some("gpu"));
            // A v0.12 engine asks a plugin to validate others' adjustments only when it
            // subscribed; this one did not, and says so.
            let validate = engine.call(
                "ValidateContainerAdjustment",
                api::ValidateContainerAdjustmentRequest::default(),
            );
            assert_eq!(validate.failure().unwrap().code, code::UNIMPLEMENTED);
            let reply = engine.call("Shutdown", api::Empty {});
            assert!(reply.failure().is_none());
            drop(engine);
            assert_eq!(plugin.join().unwrap(), Ended::Shutdown);
        });
        recorder
    }

    #[test]
    fn both_generations_deliver_the_same_events() {
        let old = session("v0.8");
        let new = session("v0.12");
        assert_eq!(
            (old.nri_version.as_str(), new.nri_version.as_str()),
            ("", api::NRI_VERSION)
        );
        let expected = vec![
            (Event::RunPodSandbox as i32, "pod".to_string()),
            (Event::UpdatePodSandbox as i32, "pod".to_string()),
            (Event::RemoveContainer as i32, "gpu".to_string()),
        ];
        assert_eq!(old.events, expected);
        assert_eq!(new.events, expected);
        // The engine's end is this process: its pid comes from the socket's credentials.
        let this = i32::try_from(std::process::id()).ok();
        assert_eq!((old.engine_pid, new.engine_pid), (this, this));
    }
}
