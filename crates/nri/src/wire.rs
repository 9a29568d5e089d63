//! Bytes on an NRI connection: the multiplexer's frames around ttrpc's messages.
//!
//! Pure: what goes over the socket is built and taken apart here, with no I/O, so the
//! framing is tested without an engine.

use std::collections::VecDeque;

/// The sub-connection on which the engine calls the plugin (Configure, CreateContainer, …).
pub const PLUGIN_SERVICE: u32 = 1;
/// The sub-connection on which the plugin calls the engine (RegisterPlugin, UpdateContainers).
pub const RUNTIME_SERVICE: u32 = 2;

const MUX_HEADER: usize = 8;
const TTRPC_HEADER: usize = 10;
/// ttrpc's own limit on one message's payload.
pub const MAX_MESSAGE: usize = 4 << 20;
/// The most a frame we send carries. The engine's multiplexer hands each frame whole to one
/// read of its ttrpc connection, and fails the connection when that read's buffer is smaller;
/// ttrpc reads through a 4 KiB buffer, so no frame may be larger.
const SEND_FRAME: usize = 4096;
/// The most a frame we accept carries: the engine's multiplexer sends at most a whole ttrpc
/// message in one.
const MAX_FRAME: usize = TTRPC_HEADER + MAX_MESSAGE;

/// ttrpc's message types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Request = 1,
    Response = 2,
    Data = 3,
}

/// One ttrpc message, with the sub-connection it travelled on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub conn: u32,
    pub stream: u32,
    pub kind: u8,
    pub flags: u8,
    pub payload: Vec<u8>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("the engine sent a ttrpc message of {0} bytes, more than ttrpc's limit of 4 MiB")]
    TooLong(usize),
    #[error("a message of {0} bytes is more than ttrpc's limit of 4 MiB")]
    TooLongToSend(usize),
}

/// `payload` as one ttrpc message on sub-connection `conn`, in multiplexer frames.
pub fn encode(conn: u32, stream: u32, kind: Kind, payload: &[u8]) -> Result<Vec<u8>, WireError> {
    if payload.len() > MAX_MESSAGE {
        return Err(WireError::TooLongToSend(payload.len()));
    }
    let mut message = Vec::with_capacity(TTRPC_HEADER + payload.len());
    message.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    message.extend_from_slice(&stream.to_be_bytes());
    message.push(kind as u8);
    message.push(0);
    message.extend_from_slice(payload);
    let frames = message.len().div_ceil(SEND_FRAME);
    let mut out = Vec::with_capacity(frames * MUX_HEADER + message.len());
    for chunk in message.chunks(SEND_FRAME) {
        out.extend_from_slice(&conn.to_be_bytes());
        out.extend_from_slice(&(chunk.len() as u32).to_be_bytes());
        out.extend_from_slice(chunk);
    }
    Ok(out)
}

/// Takes the bytes read from the socket, in whatever pieces they arrive, and gives back whole
/// ttrpc messages. Each sub-connection is a byte stream of its own: a ttrpc message may span
/// frames, and a frame may end inside a message.
#[derive(Debug, Default)]
pub struct Demux {
    trunk: Vec<u8>,
    plugin: Vec<u8>,
    runtime: Vec<u8>,
    ready: VecDeque<Message>,
}

impl Demux {
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), WireError> {
        self.trunk.extend_from_slice(bytes);
        let mut at = 0;
        while self.trunk.len() - at >= MUX_HEADER {
            let conn = be32(&self.trunk[at..]);
            let len = be32(&self.trunk[at + 4..]) as usize;
            if len > MAX_FRAME {
                return Err(WireError::TooLong(len));
            }
            let start = at + MUX_HEADER;
            if self.trunk.len() - start < len {
                break;
            }
            let frame = &self.trunk[start..start + len];
            // The engine's multiplexer drops frames for sub-connections nobody opened; so do we.
            match conn {
                PLUGIN_SERVICE => self.plugin.extend_from_slice(frame),
                RUNTIME_SERVICE => self.runtime.extend_from_slice(frame),
                _ => {}
            }
            at = start + len;
        }
        self.trunk.drain(..at);
        for (conn, buf) in [
            (PLUGIN_SERVICE, &mut self.plugin),
            (RUNTIME_SERVICE, &mut self.runtime),
        ] {
            while let Some(message) = take_message(conn, buf)? {
                self.ready.push_back(message);
            }
        }
        Ok(())
    }

    pub fn pop(&mut self) -> Option<Message> {
        self.ready.pop_front()
    }
}

fn take_message(conn: u32, buf: &mut Vec<u8>) -> Result<Option<Message>, WireError> {
    if buf.len() < TTRPC_HEADER {
        return Ok(None);
    }
    let len = be32(buf) as usize;
    if len > MAX_MESSAGE {
        return Err(WireError::TooLong(len));
    }
    if buf.len() < TTRPC_HEADER + len {
        return Ok(None);
    }
    let message = Message {
        conn,
        stream: be32(&buf[4..]),
        kind: buf[8],
        flags: buf[9],
        payload: buf[TTRPC_HEADER..TTRPC_HEADER + len].to_vec(),
    };
    buf.drain(..TTRPC_HEADER + len);
    Ok(Some(message))
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_comes_back_whatever_the_pieces() {
        let bytes = encode(PLUGIN_SERVICE, 7, Kind::Request, b"hello nri").unwrap();
        // Header of the frame, header of the message, payload.
        assert_eq!(bytes.len(), 8 + 10 + 9);
        assert_eq!(&bytes[..8], &[0, 0, 0, 1, 0, 0, 0, 19]);
        for split in 0..bytes.len() {
            let mut demux = Demux::default();
            demux.push(&bytes[..split]).unwrap();
            demux.push(&bytes[split..]).unwrap();
            let m = demux.pop().unwrap();
            assert_eq!((m.conn, m.stream, m.kind), (PLUGIN_SERVICE, 7, 1));
            assert_eq!(m.payload, b"hello nri");
            assert!(demux.pop().is_none());
        }
    }

    #[test]
    fn a_message_may_span_frames_and_the_two_services_interleave() {
        let message = encode(RUNTIME_SERVICE, 1, Kind::Response, b"abcdef").unwrap();
        // Re-frame the message's bytes as two frames, with a frame of the other service between.
        let body = &message[8..];
        let mut bytes = Vec::new();
        for (conn, chunk) in [
            (RUNTIME_SERVICE, &body[..4]),
            (
                PLUGIN_SERVICE,
                &encode(PLUGIN_SERVICE, 3, Kind::Request, b"x").unwrap()[8..],
            ),
            (RUNTIME_SERVICE, &body[4..]),
            (9, &b"ignored"[..]),
        ] {
            bytes.extend_from_slice(&conn.to_be_bytes());
            bytes.extend_from_slice(&(chunk.len() as u32).to_be_bytes());
            bytes.extend_from_slice(chunk);
        }
        let mut demux = Demux::default();
        demux.push(&bytes).unwrap();
        let first = demux.pop().unwrap();
        assert_eq!(
            (first.conn, first.stream, first.payload.as_slice()),
            (PLUGIN_SERVICE, 3, &b"x"[..])
        );
        let second = demux.pop().unwrap();
        assert_eq!((second.conn, second.stream), (RUNTIME_SERVICE, 1));
        assert_eq!(second.payload, b"abcdef");
        assert!(demux.pop().is_none());
    }

    #[test]
    fn frames_we_send_fit_the_engines_read_buffer() {
        let payload: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let bytes = encode(PLUGIN_SERVICE, 5, Kind::Response, &payload).unwrap();
        let mut at = 0;
        let mut sizes = Vec::new();
        while at < bytes.len() {
            let len = be32(&bytes[at + 4..]) as usize;
            sizes.push(len);
            at += MUX_HEADER + len;
        }
        assert_eq!(sizes, [4096, 4096, 10 + 10_000 - 8192]);
        let mut demux = Demux::default();
        demux.push(&bytes).unwrap();
        assert_eq!(demux.pop().unwrap().payload, payload);
    }

    #[test]
    fn oversized_messages_are_refused_both_ways() {
        let mut demux = Demux::default();
        let mut bytes = vec![0, 0, 0, 1, 0, 0, 0, 10];
        bytes.extend_from_slice(&u32::MAX.to_be_bytes());
        bytes.extend_from_slice(&[0; 6]);
        assert_eq!(
            demux.push(&bytes),
            Err(WireError::TooLong(u32::MAX as usize))
        );
        let big = vec![0; MAX_MESSAGE + 1];
        assert!(encode(PLUGIN_SERVICE, 1, Kind::Response, &big).is_err());
    }
}
