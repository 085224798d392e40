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

/// CRC-32 of the 8 bytes of 0xFF that stand in for the LRH: every ICRC starts from it,
/// so that prefix is never hashed.
const PSEUDO_LRH_CRC: u32 = 0x2144_df1c;
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
    let mut hasher = crc32fast::Hasher::new_with_initial(PSEUDO_LRH_CRC);
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
/// without a pass over the payload.
///
/// Why: UDP segmentation offload (GSO) gives segment `i` of a send the IPv4 ID `i`, and
/// the ICRC covers the ID, so a sender batching frames through GSO re-stamps each one.
pub fn with_ident(icrc: u32, old: u16, new: u16, ip_to_payload_end_len: usize) -> u32 {
    /// The ID's bytes sit at IPv4 offset 4..6.
    const IDENT_AT: usize = 4;
    with_xor(icrc, IDENT_AT, &(old ^ new).to_be_bytes(), ip_to_payload_end_len)
}

/// The ICRC of the same frame with the bytes at `at` (an offset into `ip_to_payload_end`,
/// outside the masked fields) XORed with `xor`, from its ICRC `icrc`.
///
/// CRC-32 is affine: for equal lengths, `crc(a) ^ crc(b)` is the linear (init-free) CRC
/// of `a ^ b`, here the changed bytes followed by zeros, i.e. their linear CRC shifted
/// over the rest of the message. The shift is a table lookup per byte of state once the
/// table for that length exists (see [`shift_zeros`]), so this costs a few nanoseconds
/// where a pass over a 4 KiB frame costs about 90.
pub fn with_xor(icrc: u32, at: usize, xor: &[u8], ip_to_payload_end_len: usize) -> u32 {
    let zeros = ip_to_payload_end_len.saturating_sub(at + xor.len());
    icrc ^ shift_zeros(linear_crc(xor), zeros)
}

/// The CRC-32 of a RoCEv2 payload and its pad, computed once and used for every frame
/// that carries the same payload ([`with_payload_crc`]): a result the switch fans out to
/// two children is hashed once instead of once per child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadCrc {
    crc: u32,
    payload_len: usize,
}

impl PayloadCrc {
    /// The CRC of `payload` followed by the BTH pad that rounds it up to 4 bytes.
    pub fn new(payload: &[u8]) -> Self {
        let mut h = crc32fast::Hasher::new();
        h.update(payload);
        h.update(&[0u8; 3][..pad_len(payload.len())]);
        Self { crc: h.finalize(), payload_len: payload.len() }
    }

    /// The CRC of a received frame's payload (and pad) read off its ICRC, without a pass
    /// over the payload: the inverse of [`with_payload_crc`]. `ip_to_headers_end` are
    /// the frame's headers as for [`with_payload_crc`]; `icrc` must be the frame's
    /// correct ICRC (verified, or of a frame known intact), or the result is wrong.
    pub fn from_icrc(icrc: u32, ip_to_headers_end: &[u8], payload_len: usize) -> Self {
        let covered = payload_len + pad_len(payload_len);
        Self { crc: icrc ^ shift_zeros(compute(ip_to_headers_end), covered), payload_len }
    }

    /// Length of the payload (without the pad) this CRC was computed over.
    pub fn payload_len(&self) -> usize {
        self.payload_len
    }

    fn covered_len(&self) -> usize {
        self.payload_len + pad_len(self.payload_len)
    }
}

/// The BTH pad count for a payload of `len` bytes.
const fn pad_len(len: usize) -> usize {
    (4 - len % 4) % 4
}

/// The ICRC of a frame given its headers (`ip_to_headers_end`: IPv4 through the last
/// extension header, as for [`compute`]) and the CRC of what follows them, without a
/// pass over the payload: `crc(a ++ b) = crc(a) * x^(8 len(b)) ^ crc(b)`.
pub fn with_payload_crc(ip_to_headers_end: &[u8], payload: &PayloadCrc) -> u32 {
    shift_zeros(compute(ip_to_headers_end), payload.covered_len()) ^ payload.crc
}

const POLY: u32 = 0xedb8_8320;

/// The byte-at-a-time table of the bit-reflected CRC-32.
const BYTE_STEP: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = (c >> 1) ^ ((c & 1).wrapping_neg() & POLY);
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// CRC state `s` with byte `b` appended (no initial value or final XOR involved).
fn step(s: u32, b: u8) -> u32 {
    BYTE_STEP[((s ^ u32::from(b)) & 0xff) as usize] ^ (s >> 8)
}

/// The CRC of `bytes` without initial value or final XOR (the linear part).
fn linear_crc(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0, |s, &b| step(s, b))
}

/// `a(x) * b(x) mod p(x)`, bit-reflected (as in zlib's `crc32_combine`).
const fn multiply(a: u32, mut b: u32) -> u32 {
    let mut p = 0u32;
    let mut i = 0;
    while i < 32 {
        p ^= b & ((a >> (31 - i)) & 1).wrapping_neg();
        b = (b >> 1) ^ ((b & 1).wrapping_neg() & POLY);
        i += 1;
    }
    p
}

/// `x^(8 len) mod p(x)`, bit-reflected: multiplying a CRC state by it appends `len`
/// zero bytes.
const fn x8n(len: usize) -> u32 {
    let mut p = 0x8000_0000; // x^0
    let mut sq = 0x0080_0000; // x^8
    let mut n = len;
    while n != 0 {
        if n & 1 != 0 {
            p = multiply(sq, p);
        }
        sq = multiply(sq, sq);
        n >>= 1;
    }
    p
}

/// Appending a fixed number of zero bytes to a CRC state, one lookup per state byte.
struct ZeroShift {
    zeros: usize,
    table: Box<[[u32; 256]; 4]>,
}

impl ZeroShift {
    fn new(zeros: usize) -> Self {
        let x = x8n(zeros);
        let mut table = Box::new([[0u32; 256]; 4]);
        for (k, row) in table.iter_mut().enumerate() {
            for (v, entry) in row.iter_mut().enumerate() {
                *entry = multiply(x, (v as u32) << (8 * k));
            }
        }
        Self { zeros, table }
    }

    fn apply(&self, state: u32) -> u32 {
        let t = &self.table;
        t[0][(state & 0xff) as usize]
            ^ t[1][((state >> 8) & 0xff) as usize]
            ^ t[2][((state >> 16) & 0xff) as usize]
            ^ t[3][(state >> 24) as usize]
    }
}

/// Shifts below this many zeros step the CRC register over the zero bytes (about 4
/// instructions a byte: an AckReq patch or a small frame's payload CRC costs tens, where
/// `x8n` and a multiplication cost about a thousand); the tables (4 KiB each, about 30 us
/// to build) pay for the frame sizes that repeat.
const SHIFT_TABLE_MIN_ZEROS: usize = 256;
/// Tables kept per thread: the few frame sizes of the running collectives.
const SHIFT_TABLES: usize = 8;

thread_local! {
    static SHIFT_CACHE: std::cell::RefCell<Vec<ZeroShift>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `state` (a CRC value or linear CRC) with `zeros` zero bytes appended to its message.
fn shift_zeros(state: u32, zeros: usize) -> u32 {
    if zeros == 0 {
        return state;
    }
    if zeros < SHIFT_TABLE_MIN_ZEROS {
        return (0..zeros).fold(state, |s, _| step(s, 0));
    }
    SHIFT_CACHE.with_borrow_mut(|cache| {
        if let Some(at) = cache.iter().position(|s| s.zeros == zeros) {
            // Most recently used first, so eviction drops the least recent.
            cache[..=at].rotate_right(1);
        } else {
            if cache.len() == SHIFT_TABLES {
                cache.pop();
            }
            cache.insert(0, ZeroShift::new(zeros));
        }
        cache[0].apply(state)
    })
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

    const PSEUDO_LRH: [u8; 8] = [0xff; 8];

    #[test]
    fn the_icrc_starts_from_the_crc_of_the_pseudo_lrh() {
        assert_eq!(PSEUDO_LRH_CRC, crc32fast::hash(&PSEUDO_LRH));
    }

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

    /// Both ways of shifting below the table threshold are the same linear map.
    #[test]
    fn zero_byte_steps_equal_the_polynomial_shift() {
        for zeros in 0..SHIFT_TABLE_MIN_ZEROS {
            for state in [0, 1, 0x8000_0000, 0xdead_beef, u32::MAX] {
                assert_eq!(shift_zeros(state, zeros), multiply(x8n(zeros), state), "{zeros}");
            }
        }
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
        fn xor_anywhere_matches_a_full_computation(
            data in proptest::collection::vec(any::<u8>(), 41..5000),
            at in 40usize..5000,
            xor in proptest::collection::vec(any::<u8>(), 1..4),
        ) {
            let at = at.min(data.len() - xor.len());
            let before = compute(&data);
            let mut frame = data.clone();
            for (b, x) in frame[at..].iter_mut().zip(&xor) {
                *b ^= x;
            }
            prop_assert_eq!(with_xor(before, at, &xor, frame.len()), compute(&frame));
        }

        #[test]
        fn payload_crc_matches_a_full_computation(
            headers in proptest::collection::vec(any::<u8>(), 40..80),
            payload in proptest::collection::vec(any::<u8>(), 0..5000),
        ) {
            let mut frame = headers.clone();
            frame.extend_from_slice(&payload);
            frame.extend(std::iter::repeat_n(0u8, (4 - payload.len() % 4) % 4));
            let pc = PayloadCrc::new(&payload);
            prop_assert_eq!(pc.payload_len(), payload.len());
            prop_assert_eq!(with_payload_crc(&headers, &pc), compute(&frame));
            prop_assert_eq!(PayloadCrc::from_icrc(compute(&frame), &headers, payload.len()), pc);
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
