//! `nvhook runtime-server`: nvhook-runtime's create path in a long-running nvhook, so that a
//! GPU create through nvhook-runtime starts no second program (what is said on the socket:
//! `nvhook_runtime::server`).
//!
//! The server prepares a bundle only where `nvhook runtime` would have prepared it the same
//! way: for a peer of the server's own user (the socket is the owner's alone too), in the
//! server's mount namespace (so paths name the same files), naming the same config file and
//! the same nvhook binary as this process (a server left running across an upgrade, or started
//! with another config, is passed by). Anything else is answered "pass", and nvhook-runtime
//! runs `nvhook runtime` itself, exactly as with no server. Requests are served by worker
//! threads that each have a working directory of their own (`unshare(CLONE_FS)`), set for each
//! request to the one nvhook-runtime sent, so a relative `--bundle` means what it meant to the
//! engine.

use super::{Inventories, prepare_command};
use crate::config::{Config, ConfigError};
use crate::file_id::{FileId, SETTLED};
use crate::hook::step::Step;
use crate::inventory::isolated::Remembered;
use crate::kept_config;
use nix::errno::Errno;
use nix::sys::socket::{
    self, AddressFamily, Backlog, ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr,
    sockopt::{self, PeerCredentials},
};
use nvhook_runtime::server::{self as wire, Request};
use std::ffi::OsStr;
use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// How long a connected peer has to send its request.
const REQUEST_TIMEOUT_S: i64 = 5;

/// Who prepared a bundle, in the create's log line.
const BY: &str = "runtime-server";

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot {op} {path}: {source}")]
    Socket {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{0} is in use by another nvhook runtime-server (stop it, or give this one another socket)"
    )]
    InUse(PathBuf),
    #[error("{0} exists and is not a socket (remove it, or give the server another socket)")]
    NotASocket(PathBuf),
    #[error(
        "the config sets runtime-server = \"\": no socket to listen on (set one, or pass --socket)"
    )]
    Off,
}

/// A file's device and inode: the same file, whatever its times.
type Inode = (u64, u64);

fn inode(path: &Path) -> Option<Inode> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// A listening server.
pub struct Server {
    listener: OwnedFd,
    socket: PathBuf,
    /// The config file this process was started with, canonical; `None`: the default one.
    config: Option<PathBuf>,
    /// This process's own binary.
    exe: Inode,
    /// This process's mount namespace, as `/proc/PID/ns/mnt` reads.
    mount_ns: PathBuf,
    /// Requests being answered, which a stop waits for.
    in_flight: AtomicUsize,
    /// NVML's answer and the driver's files, kept while the host is as they were read in.
    inventory: Mutex<Remembered>,
    /// The config as parsed, kept while its file is the one it was parsed from.
    config_kept: Mutex<Option<(FileId, Config)>>,
}

impl Server {
    /// Listens on `socket` (mode 0600; its directory made 0700 where missing); a socket left
    /// by a server that is gone is replaced. `config` is the file this process's config came
    /// from (`None`: the default).
    pub fn bind(socket: &Path, config: Option<&Path>) -> Result<Server, ServerError> {
        let err = socket_error;
        if let Some(dir) = socket.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(err("create the directory of", socket))?;
        }
        // What requests are checked against, read before there is a socket to find.
        let config = config
            .map(|c| c.canonicalize().map_err(err("resolve", c)))
            .transpose()?;
        let exe = Path::new("/proc/self/exe");
        let exe = inode(exe)
            .ok_or_else(|| err("read", exe)(std::io::Error::from(std::io::ErrorKind::NotFound)))?;
        let mount_ns = Path::new("/proc/self/ns/mnt");
        let mount_ns = std::fs::read_link(mount_ns).map_err(err("read", mount_ns))?;
        remove_stale(socket)?;
        // Made under another name and renamed into place once it listens, so that a client
        // that finds the socket is answered.
        let mut name = socket.as_os_str().to_owned();
        name.push(format!(".{}", std::process::id()));
        let fresh = PathBuf::from(name);
        let listener = listen_at(&fresh).inspect_err(|_| {
            let _ = std::fs::remove_file(&fresh);
        })?;
        std::fs::rename(&fresh, socket).map_err(|e| {
            let _ = std::fs::remove_file(&fresh);
            err("rename a socket to", socket)(e)
        })?;
        Ok(Server {
            listener,
            socket: socket.to_path_buf(),
            config,
            exe,
            mount_ns,
            in_flight: AtomicUsize::new(0),
            inventory: Mutex::default(),
            config_kept: Mutex::default(),
        })
    }

    /// Answers requests until the process is stopped, on `workers` threads that each take
    /// the next request as soon as they are free.
    pub fn serve(self: Arc<Self>, workers: usize) -> Result<(), ServerError> {
        let threads: Vec<_> = (0..workers.max(1))
            .map(|_| {
                let server = Arc::clone(&self);
                std::thread::Builder::new()
                    .name("create".into())
                    .spawn(move || server.work())
                    .map_err(|source| ServerError::Socket {
                        op: "start a thread for",
                        path: self.socket.clone(),
                        source,
                    })
            })
            .collect::<Result<_, _>>()?;
        for thread in threads {
            thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
        }
        Ok(())
    }

    /// One worker: a working directory of its own (each request's is set there), then
    /// requests until accepting fails for good.
    fn work(&self) -> Result<(), ServerError> {
        let fail = |op: &'static str, source: std::io::Error| ServerError::Socket {
            op,
            path: self.socket.clone(),
            source,
        };
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_FS).map_err(|e| {
            fail(
                "give a working directory of its own to a worker of",
                e.into(),
            )
        })?;
        loop {
            let conn = match socket::accept4(self.listener.as_raw_fd(), SockFlag::SOCK_CLOEXEC) {
                // SAFETY: accept4 returned a new descriptor that nothing else owns.
                Ok(fd) => unsafe { OwnedFd::from_raw_fd(fd) },
                Err(Errno::EINTR | Errno::ECONNABORTED) => continue,
                // Out of descriptors or memory for now: the requests waiting get theirs later.
                Err(e @ (Errno::EMFILE | Errno::ENFILE | Errno::ENOBUFS | Errno::ENOMEM)) => {
                    tracing::warn!(error = %e, "runtime-server: cannot accept a request yet");
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                Err(e) => return Err(fail("accept on", e.into())),
            };
            self.in_flight.fetch_add(1, Ordering::SeqCst);
            self.answer(&conn);
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Stops taking requests (the socket goes, so nvhook-runtime runs `nvhook runtime` again),
    /// then waits for those being answered, at most `wait`.
    pub fn stop(&self, wait: Duration) {
        let _ = std::fs::remove_file(&self.socket);
        let until = Instant::now() + wait;
        while self.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Reads one request and replies; a peer that is not this server's user gets no reply.
    fn answer(&self, conn: &OwnedFd) {
        let started = Instant::now();
        let step = Step::start();
        let Ok(peer) = socket::getsockopt(conn, PeerCredentials) else {
            return;
        };
        if peer.uid() != nix::unistd::geteuid().as_raw() {
            tracing::warn!(
                uid = peer.uid(),
                pid = peer.pid(),
                "runtime-server: a request from another user, not answered"
            );
            return;
        }
        // nvhook-runtime sends its request as soon as it is connected: a peer that does not
        // cannot hold a worker for long.
        let wait = nix::sys::time::TimeVal::new(REQUEST_TIMEOUT_S, 0);
        if socket::setsockopt(conn, sockopt::ReceiveTimeout, &wait).is_err() {
            return;
        }
        let mut msg = vec![0u8; wire::MAX_REQUEST];
        let reply = match receive(conn, &mut msg) {
            Some((len, cwd)) => self.reply(&msg[..len], cwd, peer.pid(), step, started),
            None => passed(
                peer.pid(),
                "a message without exactly one descriptor, or cut short",
            ),
        };
        if let Err(e) = socket::send(conn.as_raw_fd(), &reply, MsgFlags::MSG_NOSIGNAL) {
            tracing::warn!(error = %e, "runtime-server: cannot reply to nvhook-runtime");
        }
    }

    fn reply(&self, msg: &[u8], cwd: OwnedFd, pid: i32, step: Step, started: Instant) -> Vec<u8> {
        let Some(request) = Request::decode(msg) else {
            return passed(pid, "a request of another version");
        };
        let config = request.config.map(|c| Path::new(OsStr::from_bytes(c)));
        let peer_ns = std::fs::read_link(format!("/proc/{pid}/ns/mnt"));
        if peer_ns.ok().as_deref() != Some(self.mount_ns.as_path()) {
            return passed(pid, "another mount namespace");
        }
        if inode(Path::new(OsStr::from_bytes(request.nvhook))) != Some(self.exe) {
            return passed(pid, "another nvhook binary beside nvhook-runtime");
        }
        if nix::unistd::fchdir(&cwd).is_err() {
            return passed(pid, "a working directory that cannot be entered");
        }
        if !self.same_config(config) {
            return passed(pid, "another config file");
        }
        // The line `nvhook runtime` would print after its program's name.
        let prepared = match self.load_config(config) {
            Ok(c) => {
                let inventories = Inventories::Remembered(&self.inventory);
                prepare_command(&c, config, &inventories, request.args(), step, started, BY)
                    .map_err(|e| e.to_string())
            }
            Err(e) => Err(e.to_string()),
        };
        match prepared {
            Ok(()) => wire::DONE.to_vec(),
            Err(line) => [wire::FAILED, line.as_bytes()].concat(),
        }
    }

    /// The config `named` (NVHOOK_CONFIG as nvhook-runtime has it) names, parsed again only
    /// when its file is another one, or changed too lately for its times to tell (as
    /// `kept_config` keeps it between processes).
    fn load_config(&self, named: Option<&Path>) -> Result<Config, ConfigError> {
        let file = FileId::of(named.unwrap_or(Path::new(crate::config::DEFAULT_PATH)));
        let mut kept = self.config_kept.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(file), Some((then, config))) = (&file, &*kept)
            && file == then
        {
            return Ok(config.clone());
        }
        let config = kept_config::load(named)?;
        *kept = file
            .filter(|f| !f.changed_lately(SystemTime::now(), SETTLED))
            .map(|f| (f, config.clone()));
        Ok(config)
    }

    /// Whether `named` (NVHOOK_CONFIG as nvhook-runtime has it, resolved from its working
    /// directory) is the file this server's config came from.
    fn same_config(&self, named: Option<&Path>) -> bool {
        match (&self.config, named) {
            (None, None) => true,
            (Some(own), Some(named)) => named.canonicalize().is_ok_and(|n| &n == own),
            _ => false,
        }
    }
}

/// The answer for a create that `nvhook runtime` prepares instead, saying why.
fn passed(pid: i32, why: &str) -> Vec<u8> {
    tracing::info!(pid, why, "runtime-server: a create left to nvhook runtime");
    wire::PASS.to_vec()
}

/// `op` on `path` failed with `source`.
fn socket_error(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ServerError {
    let path = path.to_path_buf();
    move |source| ServerError::Socket { op, path, source }
}

/// A socket of the kind nvhook-runtime connects to, and `path` as its address.
fn unix_socket(path: &Path) -> Result<(OwnedFd, UnixAddr), ServerError> {
    let fd = socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| socket_error("open a socket for", path)(e.into()))?;
    let addr = UnixAddr::new(path).map_err(|e| socket_error("name", path)(e.into()))?;
    Ok((fd, addr))
}

/// A new socket at `path`, mode 0600, listening.
fn listen_at(path: &Path) -> Result<OwnedFd, ServerError> {
    let (listener, addr) = unix_socket(path)?;
    let err = |op| socket_error(op, path);
    socket::bind(listener.as_raw_fd(), &addr).map_err(|e| err("listen on")(e.into()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(err("restrict"))?;
    socket::listen(&listener, Backlog::MAXCONN).map_err(|e| err("listen on")(e.into()))?;
    Ok(listener)
}

/// A socket at `path` that no server answers on goes; one that answers, or another kind of
/// file, stays and is an error.
fn remove_stale(path: &Path) -> Result<(), ServerError> {
    let err = |op| socket_error(op, path);
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {}
        Ok(_) => return Err(ServerError::NotASocket(path.to_path_buf())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(err("read")(e)),
    }
    let (probe, addr) = unix_socket(path)?;
    match socket::connect(probe.as_raw_fd(), &addr) {
        Ok(()) => Err(ServerError::InUse(path.to_path_buf())),
        Err(Errno::ECONNREFUSED) => std::fs::remove_file(path).map_err(err("remove")),
        Err(e) => Err(err("check")(e.into())),
    }
}

/// One request message and the working directory sent with it; `None` for a message cut
/// short or without one.
fn receive(conn: &OwnedFd, buf: &mut [u8]) -> Option<(usize, OwnedFd)> {
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = socket::recvmsg::<()>(
        conn.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .ok()?;
    // Every descriptor received is owned, so that each is closed, whatever was sent.
    let mut fds = Vec::new();
    for c in msg.cmsgs().ok()? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            // SAFETY: the kernel installed these descriptors for this process just now.
            fds.extend(
                raw.into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    let cut = msg
        .flags
        .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC);
    let len = msg.bytes;
    (!cut && fds.len() == 1).then(|| (len, fds.remove(0)))
}
