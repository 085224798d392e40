//! The receive path: the ready slots of a port's ring handed to the caller's sink in
//! place (every frame of a V3 block, or the one frame of a V2 slot), then given back
//! to the kernel; a received UDP GSO frame is handed over as the frames it was sent as.

use std::sync::atomic::Ordering;

use super::gso::{
    is_plain_udp, split_gso_frame, VirtioNetHdr, VIRTIO_NET_HDR_GSO_UDP_L4, VNET_HDR_LEN,
};
use super::ring::{Ring, TPACKET2_HDR_ALIGNED, TPACKET3_HDR_ALIGNED};
use super::{AfPacketBackend, RxRing};
use crate::backend::PortCounters;

/// Hand one received frame to `sink` unless it is truncated, outgoing or out of bounds.
/// `hdr` is the offset of its tpacket header in the ring, `slot_end` the end of the
/// slot (V2) or block (V3) holding it, `sll_at` the aligned header size after which
/// the sockaddr_ll follows, `(mac, snaplen, len)` from the header.
/// With `vnet` (PACKET_VNET_HDR) a UDP GSO frame is handed over as its segments.
/// Returns the frames delivered.
#[allow(clippy::too_many_arguments)]
fn deliver(
    ring: &Ring,
    (hdr, slot_end): (usize, usize),
    sll_at: usize,
    (mac, snap, len): (usize, u32, u32),
    vnet: bool,
    port: usize,
    c: &mut PortCounters,
    sink: &mut dyn FnMut(usize, &[u8]),
) -> usize {
    let sll = hdr + sll_at;
    if hdr + mac + snap as usize > slot_end
        || sll + std::mem::size_of::<libc::sockaddr_ll>() > slot_end
    {
        return 0;
    }
    if snap < len {
        // Larger than a slot holds: never hand a cut frame to the engine.
        c.rx_truncated += 1;
        return 0;
    }
    // Safety: the sockaddr_ll follows the aligned header inside the user-owned slot
    // (bounds checked above).
    let pkttype = unsafe { (*(ring.base.add(sll) as *const libc::sockaddr_ll)).sll_pkttype };
    if pkttype == libc::PACKET_OUTGOING {
        return 0;
    }
    let vnet = (vnet && mac >= VNET_HDR_LEN).then(|| {
        // Safety: with PACKET_VNET_HDR the kernel writes a virtio-net header right in
        // front of the frame, inside the user-owned slot; it may be unaligned.
        unsafe {
            std::ptr::read_unaligned(ring.base.add(hdr + mac - VNET_HDR_LEN) as *const VirtioNetHdr)
        }
    });
    // Safety: [hdr+mac, hdr+mac+snap) lies inside the user-owned slot (checked above),
    // which nothing else reads or writes until it is handed back to the kernel.
    let frame = unsafe { std::slice::from_raw_parts_mut(ring.base.add(hdr + mac), snap as usize) };
    match vnet.filter(|v| v.gso_type == VIRTIO_NET_HDR_GSO_UDP_L4 && v.gso_size > 0) {
        Some(v) if is_plain_udp(frame) => {
            c.rx_gso_frames += 1;
            split_gso_frame(frame, v.gso_size.into(), port, c, sink)
        }
        _ => {
            c.rx_packets += 1;
            c.rx_bytes += u64::from(snap);
            sink(port, frame);
            1
        }
    }
}

impl AfPacketBackend {
    /// Hand the frames of port `p`'s ready slots to `sink`, up to `budget` frames (whole
    /// V3 blocks: a block is released only when all its frames are handed over).
    pub(super) fn recv_port(
        &mut self,
        p: usize,
        budget: usize,
        sink: &mut dyn FnMut(usize, &[u8]),
    ) -> usize {
        let sock = &mut self.socks[p];
        let c = &mut self.counters[p];
        let vnet = sock.vnet;
        let ring = &mut sock.ring;
        let mut n = 0;
        while n < budget && ring.ready() {
            let slot = ring.offset(ring.cur);
            let slot_end = slot + ring.slot_size;
            match ring.version {
                RxRing::V3 => {
                    // Safety: the block is owned by user space (TP_STATUS_USER, acquired
                    // in ready()) until handed back below; its header is at the start.
                    let (num, first) = unsafe {
                        let bd = &*(ring.base.add(slot) as *const libc::tpacket_block_desc);
                        (bd.hdr.bh1.num_pkts as usize, bd.hdr.bh1.offset_to_first_pkt as usize)
                    };
                    let mut off = first;
                    for _ in 0..num {
                        if off + std::mem::size_of::<libc::tpacket3_hdr>() > ring.slot_size {
                            break; // malformed block; release it rather than read past it
                        }
                        // Safety: `off` stays inside the user-owned block (checked above);
                        // the kernel wrote a 16-aligned tpacket3_hdr there.
                        let h =
                            unsafe { &*(ring.base.add(slot + off) as *const libc::tpacket3_hdr) };
                        let frame = (h.tp_mac as usize, h.tp_snaplen, h.tp_len);
                        n += deliver(
                            ring,
                            (slot + off, slot_end),
                            TPACKET3_HDR_ALIGNED,
                            frame,
                            vnet,
                            p,
                            c,
                            sink,
                        );
                        let next = h.tp_next_offset as usize;
                        if next == 0 {
                            break;
                        }
                        off += next;
                    }
                }
                RxRing::V2 => {
                    // Safety: the frame slot is user-owned (TP_STATUS_USER, acquired in
                    // ready()) until handed back below; its tpacket2_hdr is at the start.
                    let h = unsafe { &*(ring.base.add(slot) as *const libc::tpacket2_hdr) };
                    let frame = (h.tp_mac as usize, h.tp_snaplen, h.tp_len);
                    let at = (slot, slot_end);
                    n += deliver(ring, at, TPACKET2_HDR_ALIGNED, frame, vnet, p, c, sink);
                }
            }
            c.rx_batches += 1;
            ring.status(ring.cur).store(libc::TP_STATUS_KERNEL, Ordering::Release);
            ring.cur = (ring.cur + 1) % ring.slot_count;
        }
        n
    }
}
