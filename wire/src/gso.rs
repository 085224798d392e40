//! UDP segmentation offload (GSO) as RoCEv2 frames meet it, for both ends that batch
//! frames (the userspace host transport and the switch's af_packet backend): the
//! kernel's limits on one GSO send, how a batch of frames splits into sends, and the
//! IPv4 ID a segment gets (segment `k` carries the first one's ID + `k`, and the ICRC
//! covers it).

use crate::icrc::{self, ICRC_LEN};

/// Most datagrams in one UDP GSO send (`UDP_MAX_SEGMENTS` of older kernels).
pub const MAX_SEGMENTS: usize = 64;
/// Most UDP payload bytes of one GSO send: the largest UDP payload of an IPv4 datagram.
pub const MAX_PAYLOAD: usize = 65_535 - 20 - 8;

/// Split `n` consecutive frames into GSO sends, handing each to `push(first, count)`.
/// `payload(i)` is frame `i`'s UDP payload length, `segment(first)` the segment size of
/// a send starting at `first`, `joins(first, next)` whether frame `next` may go in that
/// send at all (same flow). A send takes the following frames while the one before is
/// exactly `segment` long, the next is at most that long and the kernel's limits hold.
pub fn runs(
    n: usize,
    payload: impl Fn(usize) -> usize,
    segment: impl Fn(usize) -> usize,
    joins: impl Fn(usize, usize) -> bool,
    mut push: impl FnMut(usize, usize),
) {
    let mut first = 0;
    while first < n {
        let size = segment(first);
        let mut bytes = payload(first);
        let mut next = first + 1;
        while next < n
            && payload(next - 1) == size
            && payload(next) <= size
            && next - first < MAX_SEGMENTS
            && bytes + payload(next) <= MAX_PAYLOAD
            && joins(first, next)
        {
            bytes += payload(next);
            next += 1;
        }
        push(first, next - first);
        first = next;
    }
}

/// Give a complete Ethernet/IPv4 (no options)/UDP RoCEv2 frame, ICRC included, the
/// IPv4 ID `ident`, re-stamping the ICRC that covers it ([`icrc::with_ident`]).
pub fn restamp_ident(frame: &mut [u8], ident: u16) {
    let len = frame.len();
    let (covered, stored) = frame[14..].split_at_mut(len - 14 - ICRC_LEN);
    let old = u16::from_be_bytes([covered[4], covered[5]]);
    covered[4..6].copy_from_slice(&ident.to_be_bytes());
    let crc = u32::from_le_bytes([stored[0], stored[1], stored[2], stored[3]]);
    let crc = icrc::with_ident(crc, old, ident, covered.len());
    stored.copy_from_slice(&crc.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(payloads: &[usize], segment: Option<usize>) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let seg = |first: usize| segment.unwrap_or(payloads[first]);
        runs(payloads.len(), |i| payloads[i], seg, |_, _| true, |f, c| out.push((f, c)));
        out
    }

    #[test]
    fn restamped_frames_carry_a_valid_icrc_for_their_segment_ident() {
        use crate::{BthRepr, EthAddrs, EthernetAddress, Opcode, Psn, RoceRepr};
        let mut r = RoceRepr::new(
            EthAddrs { src: EthernetAddress([2, 0, 0, 0, 0, 1]), dst: EthernetAddress([2; 6]) },
            std::net::Ipv4Addr::new(10, 1, 1, 21),
            std::net::Ipv4Addr::new(10, 1, 1, 1),
            crate::ROCEV2_PORT,
            BthRepr::new(Opcode::RcSendOnly, 0x101, Psn::new(77)),
        );
        r.payload_len = 4096;
        const DATA: usize = 42 + 12 + 4096 + 4;
        let mut frame = vec![0u8; DATA];
        let n = r.emit(&mut frame, |p| p.fill(0x5a)).unwrap();
        assert_eq!(n, DATA);
        let original = frame.clone();
        restamp_ident(&mut frame, 9);
        assert_eq!(&frame[18..20], &[0, 9], "IPv4 ID");
        assert!(icrc::verify(&frame[14..]), "ICRC valid for ID 9");
        restamp_ident(&mut frame, 0);
        assert_eq!(frame, original, "undone exactly");
    }

    #[test]
    fn runs_keep_every_segment_but_the_last_full_and_within_64_kib() {
        const FULL: usize = 4112;
        assert_eq!(split(&[FULL; 20], None), [(0, 15), (15, 5)], "15 x 4112 bytes fit 64 KiB");
        assert_eq!(
            split(&[FULL, FULL, 20, FULL], None),
            [(0, 3), (3, 1)],
            "a short one ends a run"
        );
        assert_eq!(split(&[20, FULL, FULL], Some(FULL)), [(0, 1), (1, 2)], "short first: alone");
        assert_eq!(split(&[20; 70], None), [(0, 64), (64, 6)], "the segment-count limit");
        assert_eq!(split(&[100, 200], None), [(0, 1), (1, 1)], "a longer one never follows");
        let mut out = Vec::new();
        runs(4, |_| FULL, |_| FULL, |_, next| next != 2, |f, c| out.push((f, c)));
        assert_eq!(out, [(0, 2), (2, 2)], "joins decides");
    }
}
