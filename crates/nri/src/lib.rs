//! Write NRI plugins in Rust.
//!
//! NRI (the Node Resource Interface) lets a plugin adjust every container an engine creates:
//! containerd 2.x and CRI-O 1.30+ have it on by default. This crate is the plugin side of the
//! protocol: the API generated from containerd/nri v0.12.2's `pkg/api/api.proto` (generated in
//! Rust by protox: no protoc), its transport, registration, and reconnection. It answers both
//! generations of engines: containerd 2.1's (nri v0.8.0), which sends lifecycle events as
//! `StateChange`, and v0.12's (containerd 2.3), which calls one method per event and would
//! fall back to `StateChange`, with a deprecation warning, from a plugin without them; either
//! way a [`Plugin`] gets them in [`Plugin::state_change`]. It is synchronous: a plugin is one thread that
//! answers the engine's calls in turn, which is how the engine makes them.
//!
//! # Example
//!
//! A plugin that sets an environment variable in every container:
//!
//! ```no_run
//! use nvhook_nri::api::{Container, ContainerAdjustment, CreateContainerResponse, Event, EventMask, KeyValue, PodSandbox};
//! use nvhook_nri::{Configuration, HandlerError, Plugin, Stub};
//! use std::path::Path;
//!
//! struct Hello;
//!
//! impl Plugin for Hello {
//!     fn configure(&mut self, _: &Configuration) -> Result<EventMask, HandlerError> {
//!         Ok(EventMask::of(&[Event::CreateContainer]))
//!     }
//!
//!     fn create_container(&mut self, pod: &PodSandbox, _: &Container)
//!         -> Result<CreateContainerResponse, HandlerError> {
//!         let adjust = ContainerAdjustment {
//!             env: vec![KeyValue { key: "HELLO_FROM".into(), value: pod.namespace.clone() }],
//!             ..Default::default()
//!         };
//!         Ok(CreateContainerResponse { adjust: Some(adjust), ..Default::default() })
//!     }
//! }
//!
//! fn main() -> Result<(), nvhook_nri::NriError> {
//!     // Connects to /var/run/nri/nri.sock, or, started by the engine from its plugin
//!     // directory, uses the socket it was given.
//!     let stub = Stub::from_env("hello", "50", Path::new(nvhook_nri::DEFAULT_SOCKET))?;
//!     stub.run(&mut Hello)
//! }
//! ```
//!
//! # The wire, as found in containerd/nri v0.8.0 (upstream documents none of it)
//!
//! - **One socket, two services.** The plugin connects to the engine's socket (or is given one
//!   end of a socket pair). Over that one connection the engine calls the plugin (service
//!   `nri.pkg.api.v1alpha1.Plugin`) and the plugin calls the engine (service
//!   `nri.pkg.api.v1alpha1.Runtime`). Each direction is its own ttrpc connection, carried in
//!   frames of a multiplexer (`pkg/net/multiplex`): an 8-byte header, the sub-connection's id
//!   (u32, big-endian) and the payload's length (u32, big-endian), then the payload. Id 1
//!   carries the Plugin service, id 2 the Runtime service; id 0 is reserved, and frames for an
//!   id nobody opened are dropped. The bytes of one sub-connection form a stream: a ttrpc
//!   message may be split across frames. But the engine's multiplexer hands each frame whole to
//!   one read of its ttrpc connection, which reads through a 4 KiB buffer, and a frame larger
//!   than that read's buffer closes the connection (`ttrpc: closed` in the engine's log, and
//!   the container is created without the plugin's adjustment). So a plugin sends frames of at
//!   most 4096 bytes; it accepts any size up to a whole message.
//! - **ttrpc inside.** Each message has a 10-byte header: payload length (u32, big-endian, at
//!   most 4 MiB), stream id (u32, big-endian), type (1 request, 2 response, 3 data) and flags.
//!   A request's payload is ttrpc's `Request {service, method, payload, timeout_nano,
//!   metadata}`; the answer reuses the stream id, with `Response {status, payload}`. A client
//!   numbers its calls 1, 3, 5, …
//! - **Who speaks first.** The engine reads nothing from a new connection until its own side is
//!   set up, then waits for the plugin's `RegisterPlugin {plugin_name, plugin_idx}` on the
//!   Runtime service (within `plugin_registration_timeout`, 5 s by default). It then calls
//!   `Configure` (the plugin answers with its event mask; event `e` is bit `e - 1`; a mask of 0
//!   subscribes to every event), then `Synchronize` with the pods and containers that exist
//!   (in pieces while `more` is set), and from then on the subscribed events.
//! - **Timeouts fail open.** Every call has `plugin_request_timeout` (2 s by default). A plugin
//!   that answers late, or whose connection is gone, is dropped, and the container is created
//!   **without** its adjustment. A plugin that answers with an error fails that container's
//!   creation, with the error's text in the engine's message.
//! - **Pre-registered plugins.** An executable named `NN-name` in the engine's plugin directory
//!   (`/opt/nri/plugins`) is started by the engine with one end of a socket pair as descriptor 3
//!   and `NRI_PLUGIN_SOCKET=3`, `NRI_PLUGIN_NAME=name`, `NRI_PLUGIN_IDX=NN` in an otherwise
//!   empty environment; its configuration, from `NN-name.conf` or `name.conf` in the plugin
//!   config directory, arrives in `Configure`. It registers like any plugin. When the engine
//!   stops it closes the socket, and a new engine starts the plugin again.
//! - **Later versions.** nri v0.10.0 (containerd 2.2) adds the CDI devices a container asked
//!   for (`Container.CDI_devices`) and `ValidateContainerAdjustment`; containerd 2.1 has
//!   neither, so this crate pins v0.8.0.
//!
//! # Why not the `ttrpc` crate
//!
//! The `ttrpc` crate serves listeners and whole sockets, and generates its code with
//! rust-protobuf; NRI needs both a server and a client on sub-connections of one socket. The
//! framing is two small headers ([`wire`]), so this crate implements it over a blocking
//! `UnixStream`, with prost for the messages and no async runtime.

pub mod api;
mod connection;
mod error;
mod plugin;
mod stub;
pub mod ttrpc;
pub mod wire;

pub use error::NriError;
pub use plugin::{Configuration, HandlerError, Plugin};
pub use stub::{DEFAULT_SOCKET, Ended, Endpoint, Event, INDEX_ENV, NAME_ENV, SOCKET_ENV, Stub};
