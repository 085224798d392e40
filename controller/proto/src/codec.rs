//! Framing: a 4-byte big-endian length, then a JSON body — an [`Envelope`] on the
//! controller protocol, any serde message elsewhere (INCCL's bootstrap uses the same
//! framing through [`encode`] and [`FrameBuffer`]).

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

use crate::{Envelope, Message, PROTOCOL_VERSION};

/// Largest frame body accepted from a peer of the controller (requests, switch
/// answers) and by INCCL's bootstrap, checked before any allocation.
pub const MAX_FRAME: usize = 1 << 20;

/// Largest frame the controller itself sends and its clients accept: replies whose
/// size the controller's own state sets (`status` with every communicator the limits
/// allow is tens of MiB). The client's buffer grows only with bytes that arrived.
pub const MAX_REPLY_FRAME: usize = 256 << 20;

/// Longest peer-provided text quoted in an error message or a log line.
pub const MAX_QUOTED: usize = 128;

/// `text` made safe to quote: at most `max` bytes of it (on a char boundary), control
/// characters escaped (a peer cannot start a new log line or send terminal escapes),
/// and the full length when it was cut.
pub fn quote(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = String::with_capacity(end + 24);
    for c in text[..end].chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    if end < text.len() {
        out.push_str(&format!("... ({} bytes)", text.len()));
    }
    out
}

/// Framing and decoding errors.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// Socket error (includes timeouts: `WouldBlock`/`TimedOut`).
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    /// Peer closed the connection at a frame boundary.
    #[error("connection closed")]
    Closed,
    /// Length prefix above [`MAX_FRAME`].
    #[error("frame of {len} bytes exceeds the {max}-byte limit")]
    TooLarge {
        /// Announced length.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// Body is not a valid envelope.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// Envelope of another protocol version; `id` lets the receiver answer.
    #[error("unsupported protocol version {version} (this side speaks {PROTOCOL_VERSION})")]
    Version {
        /// Version received.
        version: u16,
        /// Request id of the rejected envelope.
        id: u64,
    },
}

impl CodecError {
    /// True if the error is a read timeout.
    pub fn is_timeout(&self) -> bool {
        matches!(self, CodecError::Io(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut))
    }

    /// Request id of the offending envelope, when it could be read, so an error
    /// reply can still be correlated.
    pub fn request_id(&self) -> Option<u64> {
        match self {
            CodecError::Version { id, .. } => Some(*id),
            _ => None,
        }
    }

    /// Whether the stream is still at a frame boundary after this error (the
    /// connection can continue).
    pub fn is_recoverable(&self) -> bool {
        matches!(self, CodecError::Malformed(_) | CodecError::Version { .. })
    }
}

/// Encode a message into a complete frame (length prefix included).
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, CodecError> {
    encode_with_limit(msg, MAX_FRAME)
}

/// [`encode`] with another size limit (the controller's replies: [`MAX_REPLY_FRAME`]).
pub fn encode_with_limit<T: Serialize>(msg: &T, max: usize) -> Result<Vec<u8>, CodecError> {
    let mut buf = vec![0u8; 4];
    serde_json::to_writer(&mut buf, msg).map_err(|e| CodecError::Malformed(e.to_string()))?;
    let len = buf.len() - 4;
    if len > max.min(u32::MAX as usize) {
        return Err(CodecError::TooLarge { len, max });
    }
    buf[..4].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(buf)
}

/// Decode a frame body (without the length prefix).
///
/// The version and id are read first so that a message from a newer peer, whose body
/// this side cannot parse, is reported as a version error that still carries its id.
pub fn decode_body(body: &[u8]) -> Result<Envelope, CodecError> {
    #[derive(Deserialize)]
    struct Header {
        version: u16,
        id: u64,
    }
    // serde_json quotes the offending input (up to a whole frame): only a prefix is kept.
    let malformed =
        |e: serde_json::Error| CodecError::Malformed(quote(&e.to_string(), 2 * MAX_QUOTED));
    let header: Header = serde_json::from_slice(body).map_err(malformed)?;
    if header.version != PROTOCOL_VERSION {
        return Err(CodecError::Version { version: header.version, id: header.id });
    }
    let env: Envelope = serde_json::from_slice(body).map_err(malformed)?;
    Ok(env)
}

/// Best-effort request id of a malformed body, to correlate an error reply.
pub fn peek_id(body: &[u8]) -> Option<u64> {
    #[derive(Deserialize)]
    struct IdOnly {
        id: u64,
    }
    serde_json::from_slice::<IdOnly>(body).ok().map(|h| h.id)
}

/// Read one raw frame body. The length is checked against [`MAX_FRAME`] before the
/// body buffer is allocated.
pub fn read_frame_body<R: Read>(r: &mut R) -> Result<Vec<u8>, CodecError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Err(CodecError::Closed),
            Ok(0) => return Err(CodecError::Io(io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(CodecError::TooLarge { len, max: MAX_FRAME });
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok(body)
}

/// Read and decode one frame.
pub fn read_frame<R: Read>(r: &mut R) -> Result<Envelope, CodecError> {
    let body = read_frame_body(r)?;
    decode_body(&body)
}

/// Encode and write one frame.
pub fn write_frame<W: Write>(w: &mut W, env: &Envelope) -> Result<(), CodecError> {
    let frame = encode(env)?;
    w.write_all(&frame)?;
    w.flush()?;
    Ok(())
}

/// Write a message with the current version.
pub fn write_message<W: Write>(w: &mut W, id: u64, body: Message) -> Result<(), CodecError> {
    write_frame(w, &Envelope::new(id, body))
}

/// Splits a byte stream into frame bodies without blocking: feed it what was read,
/// take complete bodies out. The length is checked against [`MAX_FRAME`] before
/// anything is buffered for the body.
#[derive(Debug)]
pub struct FrameBuffer {
    buf: Vec<u8>,
    /// Largest body accepted.
    max: usize,
    /// Bytes before `start` are consumed; compacted lazily so that many small frames
    /// in one read do not shift the buffer once per frame.
    start: usize,
    /// Length of the oversized frame that ended the stream.
    poisoned: Option<usize>,
}

impl Default for FrameBuffer {
    fn default() -> Self {
        Self::with_limit(MAX_FRAME)
    }
}

/// Capacity a drained buffer keeps; a larger one (after a big frame) is returned to
/// the allocator so an idle connection does not hold a megabyte.
const IDLE_CAPACITY: usize = 64 * 1024;

impl FrameBuffer {
    /// Empty buffer accepting bodies up to [`MAX_FRAME`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Empty buffer accepting bodies up to `max` bytes.
    pub fn with_limit(max: usize) -> Self {
        FrameBuffer { buf: Vec::new(), max, start: 0, poisoned: None }
    }

    /// Append received bytes.
    pub fn extend(&mut self, data: &[u8]) {
        if self.poisoned.is_some() {
            return;
        }
        if self.start > 0 && self.start >= self.buf.len() / 2 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        // Room for the whole frame in one step once its length is known: growing by
        // doubling would hold up to twice a large frame.
        if let Some(len) = self.buf.get(self.start..self.start + 4) {
            let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
            let end = self.start + 4 + len;
            if len <= self.max && end > self.buf.len() + data.len() {
                self.buf.reserve_exact(end - self.buf.len());
            }
        }
        self.buf.extend_from_slice(data);
    }

    /// Bytes received but not yet returned as a body (a partial frame).
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// The next complete body, `Ok(None)` if more bytes are needed. After a
    /// [`CodecError::TooLarge`] the stream cannot be resynchronised and the buffer
    /// keeps returning that error.
    pub fn next_body(&mut self) -> Result<Option<Vec<u8>>, CodecError> {
        if let Some(len) = self.poisoned {
            return Err(CodecError::TooLarge { len, max: self.max });
        }
        let rest = &self.buf[self.start..];
        if rest.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        if len > self.max {
            self.poisoned = Some(len);
            self.buf = Vec::new();
            self.start = 0;
            return Err(CodecError::TooLarge { len, max: self.max });
        }
        if rest.len() < 4 + len {
            return Ok(None);
        }
        let body = rest[4..4 + len].to_vec();
        self.start += 4 + len;
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
            if self.buf.capacity() > IDLE_CAPACITY {
                self.buf = Vec::new();
            }
        }
        Ok(Some(body))
    }
}

/// Incremental decoder of controller envelopes over a byte stream (used by the
/// clients, which read with timeouts, and by the fuzz target).
#[derive(Debug, Default)]
pub struct FrameDecoder {
    frames: FrameBuffer,
}

impl FrameDecoder {
    /// Empty decoder accepting frames up to [`MAX_FRAME`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Empty decoder accepting frames up to `max` bytes (a client reading the
    /// controller: [`MAX_REPLY_FRAME`]).
    pub fn with_limit(max: usize) -> Self {
        FrameDecoder { frames: FrameBuffer::with_limit(max) }
    }

    /// Append received bytes.
    pub fn extend(&mut self, data: &[u8]) {
        self.frames.extend(data);
    }

    /// Bytes buffered but not yet consumed.
    pub fn buffered(&self) -> usize {
        self.frames.buffered()
    }

    /// Next complete envelope, `Ok(None)` if more bytes are needed. After a
    /// [`CodecError::TooLarge`] the decoder keeps returning that error.
    pub fn next_frame(&mut self) -> Result<Option<Envelope>, CodecError> {
        match self.frames.next_body()? {
            Some(body) => decode_body(&body).map(Some),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Peer, PortInfo, SwitchRules};

    fn sample() -> Vec<Envelope> {
        vec![
            Envelope::new(1, Message::Ping),
            Envelope::new(
                2,
                Message::RegisterSwitch {
                    switch_id: 3,
                    token: Some("t".into()),
                    ports: vec![PortInfo {
                        name: "p0".into(),
                        ip: None,
                        mac: None,
                        takes_gso: false,
                        rx_rate_bps: None,
                    }],
                    topology: Some("1-2-4/0123456789abcdef".into()),
                    held: Vec::new(),
                    more_held: false,
                },
            ),
            Envelope::new(
                u64::MAX,
                Message::InstallCommunicator(SwitchRules {
                    comm_id: 1,
                    switch_id: 0,
                    world_size: 2,
                    mtu: 1024,
                    window: 64,
                    slots: 128,
                    parent: None,
                    connections: vec![crate::ConnectionRule {
                        port: "p1".into(),
                        local_ip: "10.1.1.1".parse().unwrap(),
                        local_mac: crate::EthernetAddress([2, 0, 10, 1, 1, 1]),
                        local_qpn: 16,
                        local_udp_port: 0xC010,
                        local_start_psn: 0xfffff0,
                        peer: Peer::Host { rank: 0 },
                        peer_ip: "10.1.1.21".parse().unwrap(),
                        peer_mac: None,
                        peer_qpn: 17,
                        peer_udp_port: 4791,
                        peer_start_psn: 5,
                        ranks: vec![0],
                    }],
                }),
            ),
        ]
    }

    #[test]
    fn roundtrip_stream() {
        let mut bytes = Vec::new();
        for e in sample() {
            write_frame(&mut bytes, &e).unwrap();
        }
        let mut cur = std::io::Cursor::new(&bytes);
        for e in sample() {
            assert_eq!(read_frame(&mut cur).unwrap(), e);
        }
        assert!(matches!(read_frame(&mut cur), Err(CodecError::Closed)));

        // Byte-at-a-time through the incremental decoder.
        let mut dec = FrameDecoder::new();
        let mut out = Vec::new();
        for b in &bytes {
            dec.extend(std::slice::from_ref(b));
            while let Some(e) = dec.next_frame().unwrap() {
                out.push(e);
            }
        }
        assert_eq!(out, sample());
    }

    #[test]
    fn oversized_is_rejected_before_allocation() {
        let bytes = ((MAX_FRAME + 1) as u32).to_be_bytes();
        let mut cur = std::io::Cursor::new(&bytes[..]);
        assert!(matches!(read_frame(&mut cur), Err(CodecError::TooLarge { .. })));
        let mut dec = FrameDecoder::new();
        dec.extend(&u32::MAX.to_be_bytes());
        assert!(matches!(dec.next_frame(), Err(CodecError::TooLarge { .. })));
    }

    #[test]
    fn version_and_malformed() {
        let body = br#"{"version":9,"id":42,"body":"something_new"}"#;
        match decode_body(body) {
            Err(e @ CodecError::Version { .. }) => assert_eq!(e.request_id(), Some(42)),
            other => panic!("{other:?}"),
        }
        let body = br#"{"version":1,"id":7,"body":"nope"}"#;
        assert!(matches!(decode_body(body), Err(CodecError::Malformed(_))));
        assert_eq!(peek_id(body), Some(7));
        assert!(matches!(decode_body(b"\xff\x00"), Err(CodecError::Malformed(_))));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        /// Random bytes never panic the decoder and never make it allocate past the limit.
        #[test]
        fn random_bytes_never_panic(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let mut dec = FrameDecoder::new();
            dec.extend(&data);
            for _ in 0..64 {
                match dec.next_frame() {
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(e) if e.is_recoverable() => {}
                    Err(_) => break,
                }
            }
            let _ = decode_body(&data);
            let mut cur = std::io::Cursor::new(&data);
            let _ = read_frame(&mut cur);
        }

        /// Random bodies behind a valid length prefix exercise the JSON path.
        #[test]
        fn random_json_like_bodies(body in "[{}\\[\\]\":,0-9a-z_ ]{0,200}") {
            let mut frame = (body.len() as u32).to_be_bytes().to_vec();
            frame.extend_from_slice(body.as_bytes());
            let mut dec = FrameDecoder::new();
            dec.extend(&frame);
            let _ = dec.next_frame();
        }
    }
}
