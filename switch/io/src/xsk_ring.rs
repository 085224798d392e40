//! The shared memory of an AF_XDP socket: an owned `mmap` (UMEM or ring) and the
//! single-producer/single-consumer rings the kernel shares with user space.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, Ordering};

/// A shared mapping (UMEM or ring), unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
    pub(crate) base: *mut u8,
    pub(crate) len: usize,
}

// Safety: the mapping is owned by this value and only accessed through its owner
// (`&mut` or atomics shared with the kernel); moving it between threads is sound.
unsafe impl Send for Mapping {}

impl Mapping {
    pub(crate) fn new(fd: Option<RawFd>, len: usize, offset: u64) -> std::io::Result<Self> {
        let (flags, fd) = match fd {
            Some(fd) => (libc::MAP_SHARED | libc::MAP_POPULATE, fd),
            None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE, -1),
        };
        // Safety: a fresh mapping of `len` bytes; the result is checked and owned here.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                offset as libc::off_t,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping { base: base.cast(), len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // Safety: base/len are exactly what mmap returned; nothing borrows it any more.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// One single-producer/single-consumer ring shared with the kernel. We are the
/// producer of fill and tx rings and the consumer of rx and completion rings.
#[derive(Debug)]
pub(crate) struct Ring<T> {
    map: Mapping,
    producer: usize,
    consumer: usize,
    flags: usize,
    desc: usize,
    mask: u32,
    /// Our copy of the index we own (producer or consumer).
    pub(crate) local: u32,
    _t: std::marker::PhantomData<T>,
}

impl<T: Copy> Ring<T> {
    pub(crate) fn open(
        fd: RawFd,
        off: &libc::xdp_ring_offset,
        size: u32,
        pgoff: u64,
    ) -> std::io::Result<Self> {
        let len = off.desc as usize + size as usize * std::mem::size_of::<T>();
        let map = Mapping::new(Some(fd), len, pgoff)?;
        Ok(Ring {
            map,
            producer: off.producer as usize,
            consumer: off.consumer as usize,
            flags: off.flags as usize,
            desc: off.desc as usize,
            mask: size - 1,
            local: 0,
            _t: std::marker::PhantomData,
        })
    }

    fn word(&self, at: usize) -> &AtomicU32 {
        // Safety: producer/consumer/flags offsets come from XDP_MMAP_OFFSETS and lie in
        // the mapping, 4-aligned; the kernel updates them concurrently, hence atomics.
        unsafe { &*(self.map.base.add(at) as *const AtomicU32) }
    }

    pub(crate) fn needs_wakeup(&self) -> bool {
        self.word(self.flags).load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0
    }

    /// Entries the kernel produced that we have not consumed.
    pub(crate) fn available(&self) -> u32 {
        self.word(self.producer).load(Ordering::Acquire).wrapping_sub(self.local)
    }

    pub(crate) fn read(&self, i: u32) -> T {
        let at = self.desc + (i & self.mask) as usize * std::mem::size_of::<T>();
        // Safety: slot (i & mask) lies inside the descriptor array of the mapping; the
        // kernel published it before advancing the producer (acquire in `available`).
        unsafe { std::ptr::read_volatile(self.map.base.add(at) as *const T) }
    }

    pub(crate) fn write(&mut self, i: u32, v: T) {
        let at = self.desc + (i & self.mask) as usize * std::mem::size_of::<T>();
        // Safety: slot (i & mask) lies inside the descriptor array and is ours until
        // the producer index passes it (release in `publish`).
        unsafe { std::ptr::write_volatile(self.map.base.add(at) as *mut T, v) };
    }

    /// Consumer side: release entries up to `local`.
    pub(crate) fn release(&self) {
        self.word(self.consumer).store(self.local, Ordering::Release);
    }

    /// Producer side: publish entries up to `local`.
    pub(crate) fn publish(&self) {
        self.word(self.producer).store(self.local, Ordering::Release);
    }

    /// Producer side: entries the kernel has not consumed yet.
    pub(crate) fn in_flight(&self) -> u32 {
        self.local.wrapping_sub(self.word(self.consumer).load(Ordering::Acquire))
    }
}
