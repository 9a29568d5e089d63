//! One connection to the engine: the socket, and messages in and out of it.

use crate::error::NriError;
use crate::wire::{self, Demux, Kind, Message};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;

pub(crate) struct Connection {
    stream: UnixStream,
    demux: Demux,
    buf: Vec<u8>,
}

impl Connection {
    pub fn new(stream: UnixStream) -> Connection {
        Connection {
            stream,
            demux: Demux::default(),
            buf: vec![0; 64 << 10],
        }
    }

    pub fn send(
        &mut self,
        conn: u32,
        stream: u32,
        kind: Kind,
        payload: &[u8],
    ) -> Result<(), NriError> {
        let bytes = wire::encode(conn, stream, kind, payload)?;
        self.stream.write_all(&bytes).map_err(NriError::Io)
    }

    /// The next message, or `None` once the engine has closed the connection.
    pub fn receive(&mut self) -> Result<Option<Message>, NriError> {
        loop {
            if let Some(message) = self.demux.pop() {
                return Ok(Some(message));
            }
            let n = match self.stream.read(&mut self.buf) {
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                // An engine that goes away mid-write resets the connection: it is closed all
                // the same.
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return Ok(None),
                Err(e) => return Err(NriError::Io(e)),
            };
            if n == 0 {
                return Ok(None);
            }
            self.demux.push(&self.buf[..n])?;
        }
    }
}
