//! BTH opcodes of the RC, UC and UD transports and the RoCEv2 CNP.

use core::fmt;

/// Transport service encoded in the top 3 bits of the opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable Connection (0x00-0x1F).
    Rc,
    /// Unreliable Connection (0x20-0x3F).
    Uc,
    /// Reliable Datagram (0x40-0x5F); not decoded further by this crate.
    Rd,
    /// Unreliable Datagram (0x60-0x7F).
    Ud,
    /// RoCEv2 congestion notification packet (0x81) and the rest of 0x80-0x9F.
    Cnp,
    /// Reserved or manufacturer-specific ranges (0xA0-0xFF).
    Other,
}

macro_rules! opcodes {
    ($( $(#[$doc:meta])* $variant:ident = $code:literal, $name:literal; )*) => {
        /// A BTH opcode. Codes this crate does not decode are kept as `Unknown(code)`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Opcode {
            $( $(#[$doc])* $variant, )*
            Unknown(u8),
        }

        impl From<u8> for Opcode {
            fn from(v: u8) -> Opcode {
                match v {
                    $( $code => Opcode::$variant, )*
                    other => Opcode::Unknown(other),
                }
            }
        }

        impl From<Opcode> for u8 {
            fn from(op: Opcode) -> u8 {
                match op {
                    $( Opcode::$variant => $code, )*
                    Opcode::Unknown(other) => other,
                }
            }
        }

        impl Opcode {
            /// Every opcode this crate decodes, for tests and tools.
            pub const ALL: &'static [Opcode] = &[ $( Opcode::$variant, )* ];

            /// The name used by the Linux kernel (`RC_SEND_FIRST`, ...), or `UNKNOWN`.
            pub const fn name(self) -> &'static str {
                match self {
                    $( Opcode::$variant => $name, )*
                    Opcode::Unknown(_) => "UNKNOWN",
                }
            }
        }
    };
}

opcodes! {
    RcSendFirst = 0x00, "RC_SEND_FIRST";
    RcSendMiddle = 0x01, "RC_SEND_MIDDLE";
    RcSendLast = 0x02, "RC_SEND_LAST";
    RcSendLastWithImmediate = 0x03, "RC_SEND_LAST_WITH_IMMEDIATE";
    RcSendOnly = 0x04, "RC_SEND_ONLY";
    RcSendOnlyWithImmediate = 0x05, "RC_SEND_ONLY_WITH_IMMEDIATE";
    RcRdmaWriteFirst = 0x06, "RC_RDMA_WRITE_FIRST";
    RcRdmaWriteMiddle = 0x07, "RC_RDMA_WRITE_MIDDLE";
    RcRdmaWriteLast = 0x08, "RC_RDMA_WRITE_LAST";
    RcRdmaWriteLastWithImmediate = 0x09, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE";
    RcRdmaWriteOnly = 0x0a, "RC_RDMA_WRITE_ONLY";
    RcRdmaWriteOnlyWithImmediate = 0x0b, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE";
    RcRdmaReadRequest = 0x0c, "RC_RDMA_READ_REQUEST";
    RcRdmaReadResponseFirst = 0x0d, "RC_RDMA_READ_RESPONSE_FIRST";
    RcRdmaReadResponseMiddle = 0x0e, "RC_RDMA_READ_RESPONSE_MIDDLE";
    RcRdmaReadResponseLast = 0x0f, "RC_RDMA_READ_RESPONSE_LAST";
    RcRdmaReadResponseOnly = 0x10, "RC_RDMA_READ_RESPONSE_ONLY";
    RcAcknowledge = 0x11, "RC_ACKNOWLEDGE";
    RcAtomicAcknowledge = 0x12, "RC_ATOMIC_ACKNOWLEDGE";
    RcCompareSwap = 0x13, "RC_COMPARE_SWAP";
    RcFetchAdd = 0x14, "RC_FETCH_ADD";
    RcSendLastWithInvalidate = 0x16, "RC_SEND_LAST_WITH_INVALIDATE";
    RcSendOnlyWithInvalidate = 0x17, "RC_SEND_ONLY_WITH_INVALIDATE";
    UcSendFirst = 0x20, "UC_SEND_FIRST";
    UcSendMiddle = 0x21, "UC_SEND_MIDDLE";
    UcSendLast = 0x22, "UC_SEND_LAST";
    UcSendLastWithImmediate = 0x23, "UC_SEND_LAST_WITH_IMMEDIATE";
    UcSendOnly = 0x24, "UC_SEND_ONLY";
    UcSendOnlyWithImmediate = 0x25, "UC_SEND_ONLY_WITH_IMMEDIATE";
    UcRdmaWriteFirst = 0x26, "UC_RDMA_WRITE_FIRST";
    UcRdmaWriteMiddle = 0x27, "UC_RDMA_WRITE_MIDDLE";
    UcRdmaWriteLast = 0x28, "UC_RDMA_WRITE_LAST";
    UcRdmaWriteLastWithImmediate = 0x29, "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE";
    UcRdmaWriteOnly = 0x2a, "UC_RDMA_WRITE_ONLY";
    UcRdmaWriteOnlyWithImmediate = 0x2b, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE";
    UdSendOnly = 0x64, "UD_SEND_ONLY";
    UdSendOnlyWithImmediate = 0x65, "UD_SEND_ONLY_WITH_IMMEDIATE";
    /// RoCEv2 Congestion Notification Packet.
    Cnp = 0x81, "CNP";
}

impl Opcode {
    /// The opcode byte.
    pub fn code(self) -> u8 {
        self.into()
    }

    /// The transport service, from the top 3 bits.
    pub fn transport(self) -> Transport {
        match self.code() >> 5 {
            0 => Transport::Rc,
            1 => Transport::Uc,
            2 => Transport::Rd,
            3 => Transport::Ud,
            4 => Transport::Cnp,
            _ => Transport::Other,
        }
    }

    /// The operation within the transport (low 5 bits) if the opcode is known.
    fn op(self) -> Option<u8> {
        match self {
            Opcode::Unknown(_) | Opcode::Cnp => None,
            known => Some(known.code() & 0x1f),
        }
    }

    /// First packet of a multi-packet message.
    pub fn is_first(self) -> bool {
        matches!(self.op(), Some(0x00 | 0x06 | 0x0d))
    }

    /// Middle packet of a multi-packet message.
    pub fn is_middle(self) -> bool {
        matches!(self.op(), Some(0x01 | 0x07 | 0x0e))
    }

    /// Last packet of a multi-packet message.
    pub fn is_last(self) -> bool {
        matches!(self.op(), Some(0x02 | 0x03 | 0x08 | 0x09 | 0x0f | 0x16))
    }

    /// A message that fits in one packet (SEND/WRITE/READ-response ONLY, READ
    /// requests, atomics, ACKs; UD sends).
    pub fn is_only(self) -> bool {
        match self.transport() {
            Transport::Ud => self.op().is_some(),
            _ => matches!(
                self.op(),
                Some(0x04 | 0x05 | 0x0a | 0x0b | 0x0c | 0x10 | 0x11 | 0x12 | 0x13 | 0x14 | 0x17)
            ),
        }
    }

    /// Ends a message (LAST or ONLY).
    pub fn ends_message(self) -> bool {
        self.is_last() || self.is_only()
    }

    /// Any SEND opcode (the data path of INC collectives).
    pub fn is_send(self) -> bool {
        match self.transport() {
            Transport::Ud => self.op().is_some(),
            Transport::Rc | Transport::Uc => {
                matches!(self.op(), Some(0x00..=0x05 | 0x16 | 0x17))
            }
            _ => false,
        }
    }

    /// Any RDMA WRITE opcode.
    pub fn is_rdma_write(self) -> bool {
        matches!(self.transport(), Transport::Rc | Transport::Uc)
            && matches!(self.op(), Some(0x06..=0x0b))
    }

    /// RDMA READ response (first/middle/last/only).
    pub fn is_read_response(self) -> bool {
        matches!(self.transport(), Transport::Rc) && matches!(self.op(), Some(0x0d..=0x10))
    }

    /// Packets a requester sends (as opposed to responses: ACKs and READ/atomic
    /// responses).
    pub fn is_request(self) -> bool {
        self.op().is_some() && !self.is_response()
    }

    /// Responses: ACK, atomic ACK, READ responses.
    pub fn is_response(self) -> bool {
        matches!(self.transport(), Transport::Rc) && matches!(self.op(), Some(0x0d..=0x12))
    }

    /// Carries a 4-byte ImmDt header.
    pub fn has_immediate(self) -> bool {
        match self.transport() {
            Transport::Rc | Transport::Uc => matches!(self.op(), Some(0x03 | 0x05 | 0x09 | 0x0b)),
            Transport::Ud => self == Opcode::UdSendOnlyWithImmediate,
            _ => false,
        }
    }

    /// Carries a 4-byte IETH (SEND with invalidate).
    pub fn has_ieth(self) -> bool {
        matches!(self, Opcode::RcSendLastWithInvalidate | Opcode::RcSendOnlyWithInvalidate)
    }

    /// Carries a 4-byte AETH.
    pub fn has_aeth(self) -> bool {
        matches!(
            self,
            Opcode::RcRdmaReadResponseFirst
                | Opcode::RcRdmaReadResponseLast
                | Opcode::RcRdmaReadResponseOnly
                | Opcode::RcAcknowledge
                | Opcode::RcAtomicAcknowledge
        )
    }

    /// Carries a 16-byte RETH.
    pub fn has_reth(self) -> bool {
        (matches!(self.transport(), Transport::Rc | Transport::Uc)
            && matches!(self.op(), Some(0x06 | 0x0a | 0x0b)))
            || self == Opcode::RcRdmaReadRequest
    }

    /// Carries an 8-byte DETH (all UD opcodes).
    pub fn has_deth(self) -> bool {
        matches!(self.transport(), Transport::Ud) && self.op().is_some()
    }

    /// Carries a 28-byte AtomicETH.
    pub fn has_atomic_eth(self) -> bool {
        matches!(self, Opcode::RcCompareSwap | Opcode::RcFetchAdd)
    }

    /// Carries an 8-byte AtomicAckETH.
    pub fn has_atomic_ack_eth(self) -> bool {
        self == Opcode::RcAtomicAcknowledge
    }

    /// May carry payload bytes after its headers (SEND, WRITE, READ response; CNP's
    /// 16 reserved bytes; unknown opcodes, whose bytes after the BTH are opaque).
    pub fn has_payload(self) -> bool {
        match self {
            Opcode::Cnp | Opcode::Unknown(_) => true,
            op => op.is_send() || op.is_rdma_write() || op.is_read_response(),
        }
    }

    /// Length of the extension headers between the BTH and the payload.
    pub fn ext_headers_len(self) -> usize {
        let mut n = 0;
        if self.has_deth() {
            n += crate::ext::DETH_LEN;
        }
        if self.has_reth() {
            n += crate::ext::RETH_LEN;
        }
        if self.has_atomic_eth() {
            n += crate::ext::ATOMIC_ETH_LEN;
        }
        if self.has_aeth() {
            n += crate::ext::AETH_LEN;
        }
        if self.has_atomic_ack_eth() {
            n += crate::ext::ATOMIC_ACK_ETH_LEN;
        }
        if self.has_immediate() {
            n += 4;
        }
        if self.has_ieth() {
            n += 4;
        }
        n
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Opcode::Unknown(c) => write!(f, "UNKNOWN(0x{c:02x})"),
            op => f.write_str(op.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_round_trip() {
        for c in 0..=255u8 {
            assert_eq!(u8::from(Opcode::from(c)), c);
        }
        assert_eq!(Opcode::ALL.len(), 38);
        assert_eq!(Opcode::from(0x15), Opcode::Unknown(0x15));
        assert_eq!(Opcode::from(0x40), Opcode::Unknown(0x40));
    }

    #[test]
    fn classification() {
        use Opcode::*;
        assert!(RcSendFirst.is_first() && !RcSendFirst.ends_message());
        assert!(UcSendMiddle.is_middle());
        assert!(RcSendLastWithImmediate.is_last() && RcSendLastWithImmediate.has_immediate());
        assert!(RcSendOnly.is_only() && RcAcknowledge.is_only());
        assert!(UdSendOnly.is_only() && UdSendOnly.has_deth());
        assert!(RcRdmaWriteOnlyWithImmediate.has_reth());
        assert!(RcRdmaWriteOnlyWithImmediate.has_immediate());
        assert!(!RcRdmaWriteMiddle.has_reth());
        assert!(RcRdmaReadRequest.has_reth() && !RcRdmaReadRequest.has_payload());
        assert!(RcRdmaReadResponseFirst.has_aeth() && !RcRdmaReadResponseMiddle.has_aeth());
        assert!(RcAtomicAcknowledge.has_aeth() && RcAtomicAcknowledge.has_atomic_ack_eth());
        assert!(RcFetchAdd.has_atomic_eth() && !RcFetchAdd.has_payload());
        assert_eq!(RcAcknowledge.ext_headers_len(), 4);
        assert_eq!(UdSendOnlyWithImmediate.ext_headers_len(), 12);
        assert_eq!(RcRdmaWriteOnlyWithImmediate.ext_headers_len(), 20);
        assert_eq!(RcCompareSwap.ext_headers_len(), 28);
        assert_eq!(RcAtomicAcknowledge.ext_headers_len(), 12);
        assert_eq!(Cnp.transport(), Transport::Cnp);
        assert_eq!(Opcode::Unknown(0x15).ext_headers_len(), 0);
        assert!(RcAcknowledge.is_response() && RcSendOnly.is_request());
        assert_eq!(RcSendFirst.to_string(), "RC_SEND_FIRST");
        assert_eq!(Opcode::Unknown(0x1f).to_string(), "UNKNOWN(0x1f)");
    }
}
