//! Unit tests of the UDP GSO byte work (runs, run headers, split), without sockets;
//! `tests/af_packet_netns.rs` drives the backend over veths.

use std::net::Ipv4Addr;

use inc_protocol::QueuedFrame;
use inc_wire::{BthRepr, EthAddrs, EthernetAddress, Opcode, Psn, RoceRepr};

use super::gso::{
    gso_run_headers, gso_runs, ident, pseudo_header_sum, split_gso_frame, VirtioNetHdr,
    UDP_PAYLOAD_AT, VIRTIO_NET_HDR_F_NEEDS_CSUM, VIRTIO_NET_HDR_GSO_UDP_L4,
};
use crate::backend::{PortCounters, TxStaging};

/// A RoCEv2 frame of one connection with `payload` bytes, PSN `psn` and, as a
/// switch stamps them, the PSN's low 16 bits as IPv4 ID.
fn frame(psn: u32, payload: usize, src_port: u16) -> Vec<u8> {
    let mut r = RoceRepr::new(
        EthAddrs { src: EthernetAddress([2, 0, 0, 0, 0, 1]), dst: EthernetAddress([2; 6]) },
        Ipv4Addr::new(10, 1, 1, 1),
        Ipv4Addr::new(10, 1, 1, 21),
        src_port,
        BthRepr::new(Opcode::RcSendOnly, 0x101, Psn::new(psn)),
    );
    r.payload_len = payload;
    r.ip_ident = psn as u16;
    let mut buf = vec![0u8; 9000];
    let n = r.emit(&mut buf, |p| p.fill(psn as u8)).unwrap();
    buf.truncate(n);
    buf
}

/// The frames staged for port 0: odd ones copied into their buffers, even ones
/// committed as queued frames.
fn stage(frames: &[Vec<u8>]) -> (TxStaging, Vec<(usize, usize)>) {
    let mut tx = TxStaging::new(64, 9216);
    for (k, f) in frames.iter().enumerate() {
        if k % 2 == 0 {
            tx.commit_queued(0, QueuedFrame::from(f.clone()), 1);
        } else {
            tx.buffer().unwrap()[..f.len()].copy_from_slice(f);
            tx.commit(0, f.len(), 1);
        }
    }
    let staged = tx.port_frames(0).map(|(i, f)| (i, f.len())).collect();
    (tx, staged)
}

/// What the kernel's UDP segmentation makes of a GSO frame: the first frame's
/// headers with per-segment lengths and IPv4 ID base + k, and the k-th payload.
fn segment(gso: &[u8], size: usize, k: usize) -> Vec<u8> {
    let payload = &gso[UDP_PAYLOAD_AT..];
    let part = &payload[k * size..((k + 1) * size).min(payload.len())];
    let mut f = gso[..UDP_PAYLOAD_AT].to_vec();
    let base = ident(&f);
    f[16..18].copy_from_slice(&((28 + part.len()) as u16).to_be_bytes());
    f[18..20].copy_from_slice(&base.wrapping_add(k as u16).to_be_bytes());
    f[38..40].copy_from_slice(&((8 + part.len()) as u16).to_be_bytes());
    f.extend_from_slice(part);
    f
}

#[test]
fn runs_follow_one_flow_of_full_frames_within_64_kib() {
    let full = |psn| frame(psn, 4096, 0xc001);
    let mut frames: Vec<Vec<u8>> = (0..20).map(full).collect();
    let (tx, staged) = stage(&frames);
    assert_eq!(gso_runs(&tx, &staged), [15, 5], "15 x 4112 bytes fit 64 KiB");
    // A short frame ends a run; another connection (source port) starts a new one.
    frames.truncate(4);
    frames.insert(2, frame(2, 100, 0xc001));
    frames.push(frame(9, 4096, 0xc002));
    frames.push(frame(10, 4096, 0xc002));
    let (tx, staged) = stage(&frames);
    assert_eq!(gso_runs(&tx, &staged), [3, 2, 2]);
    // IPv4 IDs that do not count up (PSN gap, or a retransmission behind newer
    // frames) end a run: the segmentation would give the next another ID.
    let frames = [full(7), full(8), full(10), full(11), full(3), full(4)];
    let (tx, staged) = stage(&frames);
    assert_eq!(gso_runs(&tx, &staged), [2, 2, 2]);
    let wrap = [full(0xffff), full(0x1_0000), full(0x1_0001)];
    let (tx, staged) = stage(&wrap);
    assert_eq!(gso_runs(&tx, &staged), [3], "IDs wrap with the PSN's low 16 bits");
    // Not UDP: alone.
    let mut arp = vec![0u8; 60];
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    let (tx, staged) = stage(&[arp.clone(), arp]);
    assert_eq!(gso_runs(&tx, &staged), [1, 1]);
}

/// The GSO frame of a run as the kernel gets it (without the virtio-net header):
/// the run's headers, the first frame's UDP payload, then the others'.
fn gso_frame(tx: &TxStaging, staged: &[(usize, usize)]) -> (VirtioNetHdr, Vec<u8>) {
    let payload = staged.iter().map(|&(_, len)| len - UDP_PAYLOAD_AT).sum();
    let (hdr, headers) = gso_run_headers(tx.frame_at(staged[0].0, staged[0].1), payload);
    let mut gso = headers.to_vec();
    for &(i, len) in staged {
        gso.extend_from_slice(&tx.frame_at(i, len)[UDP_PAYLOAD_AT..]);
    }
    (hdr, gso)
}

#[test]
fn segments_of_a_run_are_the_original_frames_with_valid_icrcs() {
    let mut frames: Vec<Vec<u8>> = (0..5).map(|p| frame(p + 300, 4096, 0xc001)).collect();
    frames.push(frame(305, 1000, 0xc001));
    let (tx, staged) = stage(&frames);
    assert_eq!(gso_runs(&tx, &staged), [6]);
    let (hdr, gso) = gso_frame(&tx, &staged);
    assert_eq!(
        (hdr.flags, hdr.gso_type, hdr.hdr_len, hdr.gso_size, hdr.csum_start, hdr.csum_offset),
        (VIRTIO_NET_HDR_F_NEEDS_CSUM, VIRTIO_NET_HDR_GSO_UDP_L4, 42, 4112, 34, 6)
    );
    assert_eq!(u16::from_be_bytes([gso[16], gso[17]]) as usize, gso.len() - 14);
    assert_eq!(inc_wire::ipv4::internet_checksum(&gso[14..34]), 0, "IPv4 checksum");
    for (k, original) in frames.iter().enumerate() {
        let seg = segment(&gso, 4112, k);
        assert_eq!(seg.len(), original.len());
        assert_eq!(u16::from_be_bytes([seg[18], seg[19]]), 300 + k as u16, "IPv4 ID");
        assert!(inc_wire::icrc::verify(&seg[14..]), "segment {k}: ICRC as stamped");
        assert_eq!(seg[42..], original[42..], "UDP payload {k}");
    }
    assert_eq!(tx.frame_at(staged[0].0, staged[0].1), &frames[0][..], "first frame untouched");
}

#[test]
fn a_received_gso_frame_is_split_into_the_frames_sent() {
    let mut frames: Vec<Vec<u8>> = (0..4).map(|p| frame(p, 4096, 0xc001)).collect();
    frames.push(frame(4, 1500, 0xc001));
    let (tx, staged) = stage(&frames);
    let (hdr, mut gso) = gso_frame(&tx, &staged);
    let mut c = PortCounters::default();
    let mut got = Vec::new();
    let n = split_gso_frame(&mut gso, hdr.gso_size.into(), 3, &mut c, &mut |port, f| {
        assert_eq!(port, 3);
        got.push(f.to_vec());
    });
    assert_eq!((n, got.len(), c.rx_packets), (5, 5, 5));
    for (k, (seg, original)) in got.iter().zip(&frames).enumerate() {
        assert_eq!(seg, original, "segment {k}");
        assert!(inc_wire::icrc::verify(&seg[14..]), "segment {k}: ICRC");
    }
}

#[test]
fn pseudo_header_sum_completes_to_a_valid_udp_checksum() {
    let f = frame(1, 64, 0xc001);
    let udp_len = (f.len() - 34) as u16;
    let sum = pseudo_header_sum(&f[26..30], &f[30..34], udp_len);
    // Finishing the checksum over the UDP header (checksum field = pseudo sum) and
    // payload, as the kernel does for NEEDS_CSUM, gives one that verifies.
    let mut udp = f[34..].to_vec();
    udp[6..8].copy_from_slice(&sum.to_be_bytes());
    let check = inc_wire::ipv4::internet_checksum(&udp);
    udp[6..8].copy_from_slice(&check.to_be_bytes());
    let mut all = Vec::new();
    all.extend_from_slice(&f[26..34]);
    all.extend_from_slice(&[0, 17]);
    all.extend_from_slice(&udp_len.to_be_bytes());
    all.extend_from_slice(&udp);
    assert_eq!(inc_wire::ipv4::internet_checksum(&all), 0);
}

/// V2 rings pack their frame slots into blocks of 1 MiB (the kernel allocates each
/// block as a power-of-two run of pages): a 64 KiB GSO slot no longer rounds up to
/// 128 KiB of kernel memory, and a port's ring is sized by its slot count.
#[test]
fn v2_slots_are_packed_into_blocks() {
    use super::ring::{request, v2_geometry, RingUse};
    use super::{AfPacketConfig, RxRing};
    assert_eq!(v2_geometry(65_627, 64), (65_632, 15, 1 << 20));
    assert_eq!(v2_geometry(9_092, 512), (9_104, 115, 1 << 20));
    assert_eq!(v2_geometry(3 << 20, 2), (3 << 20, 1, 4 << 20));
    // A quiet port: 8 slots of 9 KiB in one 128 KiB block (14 slots).
    assert_eq!(v2_geometry(9_092, 8), (9_104, 14, 128 << 10));
    let cfg = AfPacketConfig { ring: RxRing::V2, ..AfPacketConfig::default() };
    // A host port on a veth (whole GSO frames): 64 slots asked, 75 in 5 blocks: 5 MiB
    // (one 128 KiB block per 68 KiB slot, 256 of them, before: 32 MiB of kernel memory).
    let (_, gso) = request(&cfg, Some(9000), RingUse::Gso);
    assert_eq!((gso.tp_block_nr, gso.tp_frame_nr, gso.tp_block_size), (5, 75, 1 << 20));
    // A switch port at MTU 9000: 512 slots asked, 575 in 5 blocks.
    let (_, plain) = request(&cfg, Some(9000), RingUse::Plain);
    assert_eq!((plain.tp_block_nr, plain.tp_frame_nr, plain.tp_frame_size), (5, 575, 9_104));
    // A port of an in-process link: 14 slots in one block of 128 KiB.
    let (_, quiet) = request(&cfg, Some(9000), RingUse::Quiet);
    assert_eq!((quiet.tp_block_nr, quiet.tp_frame_nr, quiet.tp_block_size), (1, 14, 128 << 10));
}
