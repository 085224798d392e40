/// Errors of every parser and emitter in this crate.
///
/// Each variant names the header (or field) at fault so that a log line or an
/// `inc-pcap` report says what was wrong, not just that something was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The buffer ends before the header (or the length it announces) does.
    #[error("truncated {what}: need {need} bytes, have {have}")]
    Truncated { what: &'static str, need: usize, have: usize },
    /// A field holds a value the format does not allow.
    #[error("malformed {what}: {reason}")]
    Malformed { what: &'static str, reason: &'static str },
    /// A header checksum (IPv4) does not match.
    #[error("bad {what} checksum")]
    BadChecksum { what: &'static str },
    /// Valid but unsupported here (IPv4 options, fragments, non-IPv4 ARP, ...).
    #[error("unsupported {what}: {reason}")]
    Unsupported { what: &'static str, reason: &'static str },
    /// The frame is not RoCEv2 (not Ethernet/IPv4/UDP to port 4791).
    #[error("not a RoCEv2 frame: {reason}")]
    NotRoce { reason: &'static str },
    /// The caller's output buffer is too small for what it asked to emit.
    #[error("buffer too small for {what}: need {need} bytes, have {have}")]
    BufferTooSmall { what: &'static str, need: usize, have: usize },
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = core::result::Result<T, Error>;

/// Fails with [`Error::Truncated`] unless `have >= need`.
pub(crate) fn need(what: &'static str, need: usize, have: usize) -> Result<()> {
    if have < need {
        Err(Error::Truncated { what, need, have })
    } else {
        Ok(())
    }
}
