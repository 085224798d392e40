//! InfiniBand Base Transport Header (12 bytes).

use crate::error::{need, Error, Result};
use crate::field;
use crate::opcode::Opcode;
use crate::psn::Psn;

/// Length of the BTH.
pub const BTH_LEN: usize = 12;
/// The default partition key, which RoCEv2 uses.
pub const DEFAULT_PKEY: u16 = 0xffff;

/// Zero-copy view of a BTH and what follows it.
#[derive(Debug, Clone, Copy)]
pub struct BthPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> BthPacket<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        BthPacket { buffer }
    }
    /// Checks that the buffer holds the 12-byte header.
    pub fn new_checked(buffer: T) -> Result<Self> {
        need("BTH", BTH_LEN, buffer.as_ref().len())?;
        Ok(BthPacket { buffer })
    }
    pub fn into_inner(self) -> T {
        self.buffer
    }
    pub fn opcode(&self) -> Opcode {
        self.buffer.as_ref()[0].into()
    }
    pub fn solicited(&self) -> bool {
        self.buffer.as_ref()[1] & 0x80 != 0
    }
    pub fn mig_req(&self) -> bool {
        self.buffer.as_ref()[1] & 0x40 != 0
    }
    pub fn pad_count(&self) -> u8 {
        (self.buffer.as_ref()[1] >> 4) & 0x3
    }
    pub fn tver(&self) -> u8 {
        self.buffer.as_ref()[1] & 0x0f
    }
    pub fn pkey(&self) -> u16 {
        field::u16_at(self.buffer.as_ref(), 2)
    }
    pub fn fecn(&self) -> bool {
        self.buffer.as_ref()[4] & 0x80 != 0
    }
    pub fn becn(&self) -> bool {
        self.buffer.as_ref()[4] & 0x40 != 0
    }
    pub fn dest_qp(&self) -> u32 {
        field::u24_at(self.buffer.as_ref(), 5)
    }
    pub fn ack_req(&self) -> bool {
        self.buffer.as_ref()[8] & 0x80 != 0
    }
    pub fn psn(&self) -> Psn {
        Psn::new(field::u24_at(self.buffer.as_ref(), 9))
    }
    /// The bytes after the BTH (extension headers, payload, pad, ICRC).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[BTH_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> BthPacket<T> {
    pub fn set_opcode(&mut self, op: Opcode) {
        self.buffer.as_mut()[0] = op.into();
    }
    /// Sets byte 1: SE, MigReq, PadCnt (2 bits) and TVer (4 bits); excess bits of
    /// `pad_count`/`tver` are discarded.
    pub fn set_flags(&mut self, solicited: bool, mig_req: bool, pad_count: u8, tver: u8) {
        self.buffer.as_mut()[1] = (u8::from(solicited) << 7)
            | (u8::from(mig_req) << 6)
            | ((pad_count & 3) << 4)
            | (tver & 0x0f);
    }
    pub fn set_pad_count(&mut self, pad_count: u8) {
        let b = &mut self.buffer.as_mut()[1];
        *b = (*b & !0x30) | ((pad_count & 3) << 4);
    }
    pub fn set_pkey(&mut self, v: u16) {
        field::set_u16(self.buffer.as_mut(), 2, v);
    }
    /// Sets byte 4 (FECN, BECN, reserved bits zero).
    pub fn set_ecn(&mut self, fecn: bool, becn: bool) {
        self.buffer.as_mut()[4] = (u8::from(fecn) << 7) | (u8::from(becn) << 6);
    }
    /// Sets the 24-bit destination QP (excess bits discarded).
    pub fn set_dest_qp(&mut self, qp: u32) {
        field::set_u24(self.buffer.as_mut(), 5, qp & 0xff_ffff);
    }
    /// Sets byte 8 (AckReq, reserved bits zero).
    pub fn set_ack_req(&mut self, a: bool) {
        self.buffer.as_mut()[8] = u8::from(a) << 7;
    }
    pub fn set_psn(&mut self, psn: Psn) {
        field::set_u24(self.buffer.as_mut(), 9, psn.value());
    }
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[BTH_LEN..]
    }
}

/// High-level BTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BthRepr {
    pub opcode: Opcode,
    /// SE: solicited event.
    pub solicited: bool,
    /// M: migration request.
    pub mig_req: bool,
    /// Number of pad bytes (0-3) before the ICRC. [`crate::RoceRepr::emit`] computes it.
    pub pad_count: u8,
    /// Transport header version (0).
    pub tver: u8,
    pub pkey: u16,
    pub fecn: bool,
    pub becn: bool,
    /// 24-bit destination QP number.
    pub dest_qp: u32,
    pub ack_req: bool,
    pub psn: Psn,
}

impl BthRepr {
    /// A BTH with RoCEv2 defaults (P_Key 0xFFFF, TVer 0, no flags).
    pub fn new(opcode: Opcode, dest_qp: u32, psn: Psn) -> BthRepr {
        BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: false,
            psn,
        }
    }

    /// Reads every field. Reserved bits are ignored; no field value is rejected, so
    /// that tools can show odd packets as they are.
    pub fn parse<T: AsRef<[u8]>>(packet: &BthPacket<T>) -> Result<Self> {
        need("BTH", BTH_LEN, packet.buffer.as_ref().len())?;
        Ok(BthRepr {
            opcode: packet.opcode(),
            solicited: packet.solicited(),
            mig_req: packet.mig_req(),
            pad_count: packet.pad_count(),
            tver: packet.tver(),
            pkey: packet.pkey(),
            fecn: packet.fecn(),
            becn: packet.becn(),
            dest_qp: packet.dest_qp(),
            ack_req: packet.ack_req(),
            psn: packet.psn(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        BTH_LEN
    }

    /// Writes the header. Fails if a field does not fit its width (pad count > 3,
    /// TVer > 15, DestQP > 24 bits) or the view is shorter than 12 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut BthPacket<T>) -> Result<()> {
        need("BTH (emit)", BTH_LEN, packet.buffer.as_ref().len())?;
        if self.pad_count > 3 {
            return Err(Error::Malformed { what: "BTH pad_count", reason: "exceeds 3" });
        }
        if self.tver > 15 {
            return Err(Error::Malformed { what: "BTH tver", reason: "exceeds 4 bits" });
        }
        if self.dest_qp > 0xff_ffff {
            return Err(Error::Malformed { what: "BTH dest_qp", reason: "exceeds 24 bits" });
        }
        packet.set_opcode(self.opcode);
        packet.set_flags(self.solicited, self.mig_req, self.pad_count, self.tver);
        packet.set_pkey(self.pkey);
        packet.set_ecn(self.fecn, self.becn);
        packet.set_dest_qp(self.dest_qp);
        packet.set_ack_req(self.ack_req);
        packet.set_psn(self.psn);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        let r = BthRepr {
            solicited: true,
            pad_count: 2,
            ack_req: true,
            becn: true,
            ..BthRepr::new(Opcode::RcSendLastWithImmediate, 0x12_3456, Psn::new(0xab_cdef))
        };
        let mut buf = [0u8; BTH_LEN];
        r.emit(&mut BthPacket::new_unchecked(&mut buf[..])).unwrap();
        assert_eq!(buf, [0x03, 0xa0, 0xff, 0xff, 0x40, 0x12, 0x34, 0x56, 0x80, 0xab, 0xcd, 0xef]);
        assert_eq!(BthRepr::parse(&BthPacket::new_checked(&buf[..]).unwrap()).unwrap(), r);
        let bad = BthRepr { dest_qp: 1 << 24, ..r };
        assert!(bad.emit(&mut BthPacket::new_unchecked(&mut buf[..])).is_err());
        assert!(BthPacket::new_checked(&buf[..11]).is_err());
    }
}
