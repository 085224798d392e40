//! The RoCEv2 invariant CRC (IBA Annex A17; Linux `rxe_icrc.c`).
//!
//! CRC-32 (IEEE, as computed by `crc32fast`, which uses PCLMULQDQ/ARMv8 CRC when
//! available) over: 8 bytes of 0xFF standing in for the InfiniBand LRH; the IPv4 header
//! with TOS, TTL and header checksum set to all ones; the UDP header with its checksum set
//! to all ones; the BTH with byte 4 (FECN/BECN/reserved) set to all ones; then everything
//! after the BTH through the last pad byte. The result is appended least significant
//! byte first (what rxe writes on little-endian hosts).

/// Length of the ICRC trailer.
pub const ICRC_LEN: usize = 4;

const PSEUDO_LRH: [u8; 8] = [0xff; 8];
/// IPv4 (20) + UDP (8) + BTH (12): the bytes that get masked.
const MASKED_LEN: usize = 40;
/// Offsets (from the start of the IPv4 header) of the bytes replaced by 0xFF.
const MASKED_OFFSETS: [usize; 6] = [
    1,  // IPv4 TOS
    8,  // IPv4 TTL
    10, // IPv4 header checksum
    11, //
    26, // UDP checksum
    27, //
];
/// BTH byte 4 (FECN, BECN, reserved), at 20 + 8 + 4.
const BTH_RESV_OFFSET: usize = 32;

/// The ICRC of `ip_to_payload_end`: a frame without its Ethernet header and without
/// the ICRC (IPv4 header with no options, UDP, BTH, extension headers, payload, pad).
pub fn compute(ip_to_payload_end: &[u8]) -> u32 {
    compute_parts(&[ip_to_payload_end])
}

/// Like [`compute`] over the concatenation of `parts`, so that a caller can supply
/// rebuilt IPv4/UDP headers and a received UDP payload without copying them together.
pub fn compute_parts(parts: &[&[u8]]) -> u32 {
    // A small stack copy of the masked headers; the payload is hashed in place.
    let mut head = [0u8; MASKED_LEN];
    let mut filled = 0;
    for part in parts {
        let take = part.len().min(MASKED_LEN - filled);
        head[filled..filled + take].copy_from_slice(&part[..take]);
        filled += take;
    }
    for off in MASKED_OFFSETS.into_iter().chain([BTH_RESV_OFFSET]) {
        if off < filled {
            head[off] = 0xff;
        }
    }
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&PSEUDO_LRH);
    hasher.update(&head[..filled]);
    // Second pass: the same split, now hashing what the header copy did not take.
    let mut skipped = 0;
    for part in parts {
        let take = part.len().min(MASKED_LEN - skipped);
        skipped += take;
        hasher.update(&part[take..]);
    }
    hasher.finalize()
}

/// The addressing of a RoCEv2 datagram received or sent through a UDP socket: what is
/// needed to rebuild the IPv4 and UDP headers the ICRC covers (TOS, TTL and the
/// checksums are masked, so they are not needed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DatagramHeaders {
    pub src_addr: std::net::Ipv4Addr,
    pub dst_addr: std::net::Ipv4Addr,
    pub src_port: u16,
    pub dst_port: u16,
    /// IPv4 identification (0 for an unconnected socket with `IP_PMTUDISC_DO`).
    pub ident: u16,
    pub dont_frag: bool,
}

/// The ICRC of a datagram given as its UDP payload without the ICRC (BTH through the
/// last pad byte), rebuilding the IPv4/UDP headers from `h`, without copying the payload.
/// Returns `None` if the datagram is too large for IPv4.
pub fn compute_for_datagram(h: &DatagramHeaders, bth_to_payload_end: &[u8]) -> Option<u32> {
    let udp_len = u16::try_from(8 + bth_to_payload_end.len() + ICRC_LEN).ok()?;
    let total = udp_len.checked_add(20)?;
    let mut hdr = [0u8; 28];
    hdr[0] = 0x45;
    hdr[2..4].copy_from_slice(&total.to_be_bytes());
    hdr[4..6].copy_from_slice(&h.ident.to_be_bytes());
    hdr[6] = if h.dont_frag { 0x40 } else { 0 };
    hdr[9] = crate::ipv4::PROTOCOL_UDP;
    hdr[12..16].copy_from_slice(&h.src_addr.octets());
    hdr[16..20].copy_from_slice(&h.dst_addr.octets());
    hdr[20..22].copy_from_slice(&h.src_port.to_be_bytes());
    hdr[22..24].copy_from_slice(&h.dst_port.to_be_bytes());
    hdr[24..26].copy_from_slice(&udp_len.to_be_bytes());
    Some(compute_parts(&[&hdr, bth_to_payload_end]))
}

/// The ICRC of the same frame with IPv4 identification `new` instead of `old`, from its
/// ICRC `icrc` and the length of what it covers (`ip_to_payload_end`, as for [`compute`]),
/// in O(log len) instead of a pass over the payload.
///
/// Why: UDP segmentation offload (GSO) gives segment `i` of a send the IPv4 ID `i`, and
/// the ICRC covers the ID, so a sender batching frames through GSO re-stamps each one.
/// CRC-32 is affine: for equal lengths, `crc(a) ^ crc(b)` is the init-free CRC of
/// `a ^ b`, here two ID bytes followed by zeros, i.e. the CRC of those two bytes
/// shifted over the rest of the message (`crc32fast`'s `combine` with a zero CRC).
pub fn with_ident(icrc: u32, old: u16, new: u16, ip_to_payload_end_len: usize) -> u32 {
    /// The ID's bytes sit at IPv4 offset 4..6; the CRC runs on to the end of the payload.
    const IDENT_END: usize = 6;
    let diff = (old ^ new).to_be_bytes();
    // CRC without initial value or final XOR: `crc32fast` keeps the complement.
    let mut raw = crc32fast::Hasher::new_with_initial(!0);
    raw.update(&diff);
    let mut shifted = crc32fast::Hasher::new_with_initial_len(!raw.finalize(), 2);
    let zeros = ip_to_payload_end_len.saturating_sub(IDENT_END) as u64;
    shifted.combine(&crc32fast::Hasher::new_with_initial_len(0, zeros));
    icrc ^ shifted.finalize()
}

/// Reads the ICRC stored at the end of `ip_to_icrc_end` and checks it. Inputs shorter
/// than the ICRC itself are reported as not matching.
pub fn verify(ip_to_icrc_end: &[u8]) -> bool {
    match stored(ip_to_icrc_end) {
        Some(icrc) => compute(&ip_to_icrc_end[..ip_to_icrc_end.len() - ICRC_LEN]) == icrc,
        None => false,
    }
}

/// The ICRC value stored in the last 4 bytes, if there are 4 bytes.
pub fn stored(ip_to_icrc_end: &[u8]) -> Option<u32> {
    let n = ip_to_icrc_end.len();
    let tail: [u8; ICRC_LEN] = ip_to_icrc_end.get(n.checked_sub(ICRC_LEN)?..)?.try_into().ok()?;
    Some(u32::from_le_bytes(tail))
}

/// Writes `icrc` into the 4 bytes it occupies on the wire.
pub fn write(icrc: u32, dst: &mut [u8; ICRC_LEN]) {
    *dst = icrc.to_le_bytes();
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Straightforward reference: build the whole masked buffer, CRC it.
    fn reference(data: &[u8]) -> u32 {
        let mut v = PSEUDO_LRH.to_vec();
        let mut d = data.to_vec();
        for off in [1, 8, 10, 11, 26, 27, 32] {
            if off < d.len() {
                d[off] = 0xff;
            }
        }
        v.extend_from_slice(&d);
        crc32fast::hash(&v)
    }

    #[test]
    fn masked_fields_do_not_matter() {
        let mut pkt = [0x5au8; 100];
        let c = compute(&pkt);
        for off in [1, 8, 10, 11, 26, 27, 32] {
            pkt[off] ^= 0x33;
        }
        assert_eq!(compute(&pkt), c);
        pkt[33] ^= 1;
        assert_ne!(compute(&pkt), c);
    }

    #[test]
    fn datagram_matches_full_frame() {
        use crate::{BthRepr, EthAddrs, EthernetAddress, Opcode, Psn, RoceRepr};
        use std::net::Ipv4Addr;
        let mut r = RoceRepr::new(
            EthAddrs { src: EthernetAddress([2, 0, 0, 0, 0, 1]), dst: EthernetAddress([2; 6]) },
            Ipv4Addr::new(10, 0, 0, 1),
            Ipv4Addr::new(10, 0, 0, 2),
            50000,
            BthRepr::new(Opcode::RcSendOnly, 7, Psn::new(9)),
        );
        r.payload_len = 13;
        r.ip_ident = 3;
        let mut buf = [0u8; 128];
        let n = r.emit(&mut buf, |p| p.fill(0xab)).unwrap();
        let h = DatagramHeaders {
            src_addr: r.ip_src,
            dst_addr: r.ip_dst,
            src_port: r.udp_src_port,
            dst_port: r.udp_dst_port,
            ident: 3,
            dont_frag: true,
        };
        let got = compute_for_datagram(&h, &buf[42..n - ICRC_LEN]).unwrap();
        assert_eq!(Some(got), stored(&buf[14..n]));
        assert_eq!(compute_for_datagram(&h, &[0u8; 65535]), None);
    }

    proptest! {
        #[test]
        fn restamped_ident_matches_a_full_computation(
            data in proptest::collection::vec(any::<u8>(), 40..5000),
            old in any::<u16>(),
            new in any::<u16>(),
        ) {
            let mut frame = data.clone();
            frame[4..6].copy_from_slice(&old.to_be_bytes());
            let before = compute(&frame);
            frame[4..6].copy_from_slice(&new.to_be_bytes());
            prop_assert_eq!(with_ident(before, old, new, frame.len()), compute(&frame));
        }

        #[test]
        fn matches_reference(data in proptest::collection::vec(any::<u8>(), 0..300),
                             split in 0usize..300) {
            let c = compute(&data);
            prop_assert_eq!(c, reference(&data));
            let s = split.min(data.len());
            prop_assert_eq!(compute_parts(&[&data[..s], &data[s..]]), c);
            let mut with = data.clone();
            with.extend_from_slice(&c.to_le_bytes());
            prop_assert!(verify(&with));
        }
    }
}
