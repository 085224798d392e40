//! The receive ring of one port: its TPACKET geometry (V3 blocks, or V2 slots of one
//! frame each), the mapping shared with the kernel, and the status word through which
//! each slot passes between the kernel and user space.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, Ordering};

use super::gso::{UDP_PAYLOAD_AT, VNET_HDR_LEN};
use super::{AfPacketConfig, RxRing};
use crate::sys;

/// Size of `tpacket3_hdr` rounded up to TPACKET_ALIGNMENT: where the sockaddr_ll starts.
pub(super) const TPACKET3_HDR_ALIGNED: usize =
    (std::mem::size_of::<libc::tpacket3_hdr>() + libc::TPACKET_ALIGNMENT - 1)
        & !(libc::TPACKET_ALIGNMENT - 1);

/// Size of `tpacket2_hdr` rounded up to TPACKET_ALIGNMENT.
pub(super) const TPACKET2_HDR_ALIGNED: usize =
    (std::mem::size_of::<libc::tpacket2_hdr>() + libc::TPACKET_ALIGNMENT - 1)
        & !(libc::TPACKET_ALIGNMENT - 1);

/// What a port's V2 receive ring must take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RingUse {
    /// Frames of the interface MTU, 4 x `block_count` slots.
    Plain,
    /// Whole UDP GSO frames, `gso_slots` slots.
    Gso,
    /// Nothing the switch sends itself ([`AfPacketConfig::quiet_ports`]):
    /// [`QUIET_SLOTS`] slots of the interface MTU.
    Quiet,
}

/// Slots of a quiet port's ring: room for what the kernel sends on its own (IPv6
/// neighbour discovery and the like).
pub(super) const QUIET_SLOTS: u32 = 8;

/// The TPACKET version and ring request of a port opened with `cfg`: V3 blocks as
/// configured, or V2 slots sized for a full-MTU frame (`mtu`, 1500 if unknown) or for
/// a whole UDP GSO frame, as many as `what` needs.
pub(super) fn request(
    cfg: &AfPacketConfig,
    mtu: Option<u32>,
    what: RingUse,
) -> (libc::tpacket_versions, libc::tpacket_req3) {
    match cfg.ring {
        RxRing::V3 => {
            let frame_size = 2048u32;
            let req = libc::tpacket_req3 {
                tp_block_size: cfg.block_size,
                tp_block_nr: cfg.block_count,
                tp_frame_size: frame_size,
                tp_frame_nr: cfg.block_size / frame_size * cfg.block_count,
                tp_retire_blk_tov: cfg.block_timeout_ms.max(1),
                tp_sizeof_priv: 0,
                tp_feature_req_word: 0,
            };
            (libc::tpacket_versions::TPACKET_V3, req)
        }
        RxRing::V2 => {
            // A slot holds header, address and a full-MTU frame.
            let need =
                TPACKET2_HDR_ALIGNED + std::mem::size_of::<libc::sockaddr_ll>() + 16 + VNET_HDR_LEN;
            // A GSO port's slots hold a whole GSO frame (up to 64 KiB of UDP payload),
            // and fewer of them, as each usually holds several frames.
            let plain = mtu.unwrap_or(1500) as usize + 14;
            let (frame, slots) = match what {
                RingUse::Gso => (inc_wire::gso::MAX_PAYLOAD + UDP_PAYLOAD_AT, cfg.gso_slots),
                RingUse::Plain => (plain, cfg.block_count * 4),
                RingUse::Quiet => (plain, QUIET_SLOTS),
            };
            let (frame_size, frames_per_block, block_size) = v2_geometry(need + frame, slots);
            let blocks = slots.div_ceil(frames_per_block);
            let req = libc::tpacket_req3 {
                tp_block_size: block_size,
                tp_block_nr: blocks,
                tp_frame_size: frame_size,
                tp_frame_nr: blocks * frames_per_block,
                tp_retire_blk_tov: 0,
                tp_sizeof_priv: 0,
                tp_feature_req_word: 0,
            };
            (libc::tpacket_versions::TPACKET_V2, req)
        }
    }
}

/// Largest V2 block: the kernel allocates each block as one run of a power-of-two
/// number of pages (falling back to vmalloc), so blocks of one frame each would round a
/// 68 KiB GSO slot up to 128 KiB and a 9 KiB slot up to 16 KiB.
const V2_BLOCK_MAX: usize = 1 << 20;

/// V2 frame size (`slot` rounded to TPACKET_ALIGNMENT), frames per block and block
/// size for about `slots` slots: a power of two, at least a page and one frame, up to
/// [`V2_BLOCK_MAX`] (unless one frame needs more), no larger than `slots` frames need.
/// Frames are packed into blocks the kernel allocates without rounding waste beyond
/// the tail of a block.
pub(super) fn v2_geometry(slot: usize, slots: u32) -> (u32, u32, u32) {
    let frame = slot.next_multiple_of(libc::TPACKET_ALIGNMENT);
    let least = frame.next_power_of_two().max(4096);
    let block =
        (frame * slots.max(1) as usize).next_power_of_two().clamp(least, least.max(V2_BLOCK_MAX));
    (frame as u32, (block / frame) as u32, block as u32)
}

/// Set up the receive ring `req` on socket `raw`, whose TPACKET version is `ring`'s.
pub(super) fn set_rx_ring(
    raw: RawFd,
    ring: RxRing,
    req: &libc::tpacket_req3,
) -> std::io::Result<()> {
    // V2 reads only the leading tpacket_req fields of the same layout.
    match ring {
        RxRing::V3 => sys::setsockopt(raw, libc::SOL_PACKET, libc::PACKET_RX_RING, req),
        RxRing::V2 => {
            let req2 = libc::tpacket_req {
                tp_block_size: req.tp_block_size,
                tp_block_nr: req.tp_block_nr,
                tp_frame_size: req.tp_frame_size,
                tp_frame_nr: req.tp_frame_nr,
            };
            sys::setsockopt(raw, libc::SOL_PACKET, libc::PACKET_RX_RING, &req2)
        }
    }
}

/// Receive ring mapped from the kernel: `slot_count` slots of `slot_size` bytes; a
/// slot is a block (V3) or a frame (V2, `slots_per_block` of them packed in each block
/// of `block_size` bytes, the blocks back to back).
#[derive(Debug)]
pub(super) struct Ring {
    pub(super) base: *mut u8,
    len: usize,
    pub(super) version: RxRing,
    pub(super) slot_size: usize,
    pub(super) slot_count: usize,
    slots_per_block: usize,
    block_size: usize,
    /// Next slot to look at.
    pub(super) cur: usize,
}

// Safety: the mapping is owned by this Ring and only touched through `&mut self` or
// atomics; moving it to another thread is sound.
unsafe impl Send for Ring {}

impl Ring {
    /// Map the ring `req` just set up on socket `raw`.
    pub(super) fn map(
        raw: RawFd,
        version: RxRing,
        req: &libc::tpacket_req3,
    ) -> std::io::Result<Ring> {
        let len = req.tp_block_size as usize * req.tp_block_nr as usize;
        // Safety: maps the ring just configured on `raw`; the result is checked and
        // owned by `Ring`, which unmaps it on drop.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                raw,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let (slot_size, slot_count) = match version {
            RxRing::V3 => (req.tp_block_size, req.tp_block_nr),
            RxRing::V2 => (req.tp_frame_size, req.tp_frame_nr),
        };
        let slots_per_block = (req.tp_block_size / slot_size) as usize;
        Ok(Ring {
            base: base.cast(),
            len,
            version,
            slot_size: slot_size as usize,
            slot_count: slot_count as usize,
            slots_per_block,
            block_size: req.tp_block_size as usize,
            cur: 0,
        })
    }

    /// Offset of slot `i` in the mapping; the slot ends `slot_size` bytes later, inside
    /// its block.
    pub(super) fn offset(&self, i: usize) -> usize {
        (i / self.slots_per_block) * self.block_size + (i % self.slots_per_block) * self.slot_size
    }

    /// Status word of slot `i`, shared with the kernel.
    pub(super) fn status(&self, i: usize) -> &AtomicU32 {
        let field = match self.version {
            RxRing::V3 => std::mem::offset_of!(libc::tpacket_block_desc, hdr),
            RxRing::V2 => std::mem::offset_of!(libc::tpacket2_hdr, tp_status),
        };
        let off = self.offset(i) + field;
        // Safety: slot i lies inside the mapping; the status is a 4-aligned u32 at the
        // start of the slot's header (slots start 16-aligned), and the kernel accesses it
        // concurrently, hence an atomic view.
        unsafe { &*(self.base.add(off) as *const AtomicU32) }
    }

    /// Whether the next slot is user space's to read (`TP_STATUS_USER`).
    pub(super) fn ready(&self) -> bool {
        self.status(self.cur).load(Ordering::Acquire) & libc::TP_STATUS_USER != 0
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // Safety: base/len are exactly what mmap returned; nothing borrows the ring now.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}
