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
        let mut conn = Connection::new(stream);
        let register = ttrpc::Request {
            service: api::RUNTIME_SERVICE.into(),
            method: "RegisterPlugin".into(),
            payload: RegisterPluginRequest {
                plugin_name: self.name.clone(),
                plugin_idx: self.index.clone(),
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
