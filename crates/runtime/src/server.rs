//! What nvhook-runtime and `nvhook runtime-server` say to each other over the server's socket.
//!
//! A GPU create handed to nvhook starts a second program image, whose load and C library
//! start-up cost more than nvhook-runtime's whole pass-through. A node that runs the server
//! (a long-running nvhook) has its create prepared there instead: nvhook-runtime sends its
//! command line with its working directory, the server edits the bundle exactly as
//! `nvhook runtime` would, and nvhook-runtime execs the runtime itself. With no server
//! listening, or one that cannot answer for this create, the create goes to nvhook as before.
//!
//! One request and one reply, each a single `SOCK_SEQPACKET` message; the request carries the
//! client's working directory as an `SCM_RIGHTS` descriptor, so a relative `--bundle` means
//! what it means to the engine that ran nvhook-runtime.

/// The config key that names the server's socket (empty: no server).
pub const SOCKET_KEY: &str = "runtime-server";

/// The socket when the config names none.
pub const DEFAULT_SOCKET: &str = "/run/nvhook/runtime.sock";

/// The first bytes of a request; a server that reads another version answers [`PASS`].
const MAGIC: &[u8] = b"nvhook-runtime create 1\0";

/// The largest request: a longer command line is handed to nvhook.
pub const MAX_REQUEST: usize = 32 * 1024;

/// How long nvhook-runtime waits for the reply: longer than the server's NVML query may take
/// (`nvml-timeout-ms`, 10 s by default), short of an engine's own timeout for a create.
pub const REPLY_TIMEOUT_S: usize = 60;

/// The bundle is prepared: exec the runtime.
pub const DONE: &[u8] = b"done";
/// The server cannot answer for this create (another config or nvhook binary, another mount
/// namespace, another version): hand it to nvhook, as with no server.
pub const PASS: &[u8] = b"pass";
/// The create is refused; the rest of the reply is nvhook's one line.
pub const FAILED: &[u8] = b"fail ";

/// A create, as nvhook-runtime asks it.
#[derive(Debug, PartialEq, Eq)]
pub struct Request<'a> {
    /// The nvhook beside nvhook-runtime, which it would run without a server.
    pub nvhook: &'a [u8],
    /// NVHOOK_CONFIG as nvhook-runtime has it; `None` when unset.
    pub config: Option<&'a [u8]>,
    /// runc's command line, without argv[0], each followed by a NUL.
    args: &'a [u8],
}

impl<'a> Request<'a> {
    /// Writes the request into `buf`; `None` when it does not fit or a string holds a NUL.
    pub fn encode<'b, I: IntoIterator<Item = &'a [u8]>>(
        buf: &'b mut [u8],
        nvhook: &[u8],
        config: Option<&[u8]>,
        args: I,
    ) -> Option<&'b [u8]> {
        let mut out = Writer { buf, len: 0 };
        out.put(MAGIC)?;
        out.string(nvhook)?;
        match config {
            None => out.put(b"-")?,
            Some(c) => {
                out.put(b"=")?;
                out.string(c)?;
            }
        }
        for arg in args {
            out.string(arg)?;
        }
        let Writer { buf, len } = out;
        Some(&buf[..len])
    }

    /// Reads a request; `None` for one of another version or malformed.
    pub fn decode(msg: &'a [u8]) -> Option<Request<'a>> {
        let rest = msg.strip_prefix(MAGIC)?;
        let (nvhook, rest) = split_string(rest)?;
        let (config, args) = match rest.split_first()? {
            (b'-', args) => (None, args),
            (b'=', rest) => {
                let (config, args) = split_string(rest)?;
                (Some(config), args)
            }
            _ => return None,
        };
        if !args.is_empty() && args.last() != Some(&0) {
            return None;
        }
        Some(Request {
            nvhook,
            config,
            args,
        })
    }

    /// runc's command line, without argv[0].
    pub fn args(&self) -> impl Iterator<Item = &'a [u8]> + use<'a> {
        let args = self.args;
        args.split(|&c| c == 0)
            .take(args.iter().filter(|&&c| c == 0).count())
    }
}

/// The string up to the first NUL, and what follows that NUL.
fn split_string(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let end = bytes.iter().position(|&c| c == 0)?;
    Some((&bytes[..end], &bytes[end + 1..]))
}

struct Writer<'b> {
    buf: &'b mut [u8],
    len: usize,
}

impl Writer<'_> {
    fn put(&mut self, bytes: &[u8]) -> Option<()> {
        let end = self.len.checked_add(bytes.len())?;
        self.buf.get_mut(self.len..end)?.copy_from_slice(bytes);
        self.len = end;
        Some(())
    }

    fn string(&mut self, s: &[u8]) -> Option<()> {
        if s.contains(&0) {
            return None;
        }
        self.put(s)?;
        self.put(b"\0")
    }
}
