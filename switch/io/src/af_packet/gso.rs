//! UDP GSO frames as the virtio-net header (`PACKET_VNET_HDR`) describes them: which
//! staged frames go out together as one (runs), the headers of such a frame, and the
//! split of a received one into the frames it was sent as. Byte work only, no I/O, so
//! the unit tests check it without sockets.

use crate::backend::{PortCounters, TxStaging};

/// `struct virtio_net_hdr` (what `PACKET_VNET_HDR` puts in front of a frame).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct VirtioNetHdr {
    pub(super) flags: u8,
    pub(super) gso_type: u8,
    pub(super) hdr_len: u16,
    pub(super) gso_size: u16,
    pub(super) csum_start: u16,
    pub(super) csum_offset: u16,
}

pub(super) const VNET_HDR_LEN: usize = std::mem::size_of::<VirtioNetHdr>();
pub(super) const VIRTIO_NET_HDR_F_NEEDS_CSUM: u8 = 1;
pub(super) const VIRTIO_NET_HDR_GSO_UDP_L4: u8 = 5;
/// Ethernet (14) + IPv4 without options (20) + UDP (8).
pub(super) const UDP_PAYLOAD_AT: usize = 42;
/// True for an Ethernet/IPv4 (no options)/UDP frame with a payload.
pub(super) fn is_plain_udp(f: &[u8]) -> bool {
    f.len() > UDP_PAYLOAD_AT && f[12..14] == [0x08, 0x00] && f[14] == 0x45 && f[23] == 17
}

/// Whether `next` can follow `prev` in a GSO run: same Ethernet header, same IPv4
/// addresses, TOS, TTL and flags, same UDP ports.
fn same_flow(prev: &[u8], next: &[u8]) -> bool {
    is_plain_udp(next)
        && prev[..14] == next[..14]
        && prev[15] == next[15]
        && prev[20..24] == next[20..24]
        && prev[26..38] == next[26..38]
}

/// IPv4 ID of a plain UDP frame.
pub(super) fn ident(f: &[u8]) -> u16 {
    u16::from_be_bytes([f[18], f[19]])
}

/// Split the staged frames of a port into GSO runs (frame counts, in order): frames
/// of one flow, all but the last with the UDP payload size of the first, IPv4 IDs
/// counting up from the first's (what the segmentation gives them), within the
/// kernel's limits.
pub(super) fn gso_runs(tx: &TxStaging, staged: &[(usize, usize)]) -> Vec<usize> {
    let frame = |k: usize| tx.frame_at(staged[k].0, staged[k].1);
    let payload = |k: usize| staged[k].1.saturating_sub(UDP_PAYLOAD_AT);
    let mut runs = Vec::new();
    inc_wire::gso::runs(
        staged.len(),
        payload,
        payload,
        |first, next| {
            let (f, n) = (frame(first), frame(next));
            is_plain_udp(f)
                && same_flow(f, n)
                && ident(n) == ident(f).wrapping_add((next - first) as u16)
        },
        |_, count| runs.push(count),
    );
    runs
}

/// The headers of a GSO run (at least two frames) starting with `first`, whose
/// segments carry `payload` UDP payload bytes in all: `first`'s headers with the
/// whole run's lengths, IPv4 checksum and the UDP pseudo-header sum, and the
/// virtio-net header.
pub(super) fn gso_run_headers(
    first: &[u8],
    payload: usize,
) -> (VirtioNetHdr, [u8; UDP_PAYLOAD_AT]) {
    let mut f = [0u8; UDP_PAYLOAD_AT];
    f.copy_from_slice(&first[..UDP_PAYLOAD_AT]);
    let udp_len = (8 + payload) as u16;
    f[16..18].copy_from_slice(&(20 + udp_len).to_be_bytes());
    f[24..26].copy_from_slice(&[0, 0]);
    let ip_csum = inc_wire::ipv4::internet_checksum(&f[14..34]);
    f[24..26].copy_from_slice(&ip_csum.to_be_bytes());
    f[38..40].copy_from_slice(&udp_len.to_be_bytes());
    // NEEDS_CSUM: the UDP checksum field holds the pseudo-header sum; the kernel (or
    // the receiver's checksum-offload path) completes each segment's checksum.
    let pseudo = pseudo_header_sum(&f[26..30], &f[30..34], udp_len);
    f[40..42].copy_from_slice(&pseudo.to_be_bytes());
    let vhdr = VirtioNetHdr {
        flags: VIRTIO_NET_HDR_F_NEEDS_CSUM,
        gso_type: VIRTIO_NET_HDR_GSO_UDP_L4,
        hdr_len: UDP_PAYLOAD_AT as u16,
        gso_size: (first.len() - UDP_PAYLOAD_AT) as u16,
        csum_start: 34,
        csum_offset: 6,
    };
    (vhdr, f)
}

/// One's-complement sum (folded, not inverted) of the UDP pseudo-header.
pub(super) fn pseudo_header_sum(src: &[u8], dst: &[u8], udp_len: u16) -> u16 {
    let mut ph = [0u8; 12];
    ph[..4].copy_from_slice(src);
    ph[4..8].copy_from_slice(dst);
    ph[9] = inc_wire::ipv4::PROTOCOL_UDP;
    ph[10..].copy_from_slice(&udp_len.to_be_bytes());
    !inc_wire::ipv4::internet_checksum(&ph)
}

/// Hand the segments of a received UDP GSO frame to `sink` as the frames they were
/// sent as: segment `k` gets the first frame's headers with its own lengths, IPv4 ID
/// (first + `k`, as segmentation numbers them and the sender stamped its ICRC for) and
/// checksums, written
/// in place over the last 42 bytes of segment `k - 1`, which `sink` is done with.
pub(super) fn split_gso_frame(
    frame: &mut [u8],
    size: usize,
    port: usize,
    c: &mut PortCounters,
    sink: &mut dyn FnMut(usize, &[u8]),
) -> usize {
    let mut head = [0u8; UDP_PAYLOAD_AT];
    head.copy_from_slice(&frame[..UDP_PAYLOAD_AT]);
    let base = ident(&head);
    let payload = frame.len() - UDP_PAYLOAD_AT;
    let mut n = 0;
    for (k, start) in (0..payload).step_by(size).enumerate() {
        let seg = size.min(payload - start);
        let at = start; // the segment's headers end where its payload starts
        let f = &mut frame[at..at + UDP_PAYLOAD_AT + seg];
        f[..UDP_PAYLOAD_AT].copy_from_slice(&head);
        f[16..18].copy_from_slice(&((28 + seg) as u16).to_be_bytes());
        f[18..20].copy_from_slice(&base.wrapping_add(k as u16).to_be_bytes());
        f[24..26].copy_from_slice(&[0, 0]);
        let ip_csum = inc_wire::ipv4::internet_checksum(&f[14..34]);
        f[24..26].copy_from_slice(&ip_csum.to_be_bytes());
        f[38..40].copy_from_slice(&((8 + seg) as u16).to_be_bytes());
        f[40..42].copy_from_slice(&[0, 0]);
        c.rx_packets += 1;
        c.rx_bytes += f.len() as u64;
        sink(port, f);
        n += 1;
    }
    n
}
