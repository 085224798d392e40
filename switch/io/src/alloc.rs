//! The process allocator, for memory a switch frees in bulk.
//!
//! When a communicator is removed its slot pool and send queues go back to the
//! allocator; glibc's malloc keeps freed chunks below its mmap threshold (a send-queue
//! frame is about 4 KiB) in its heaps and arenas, so the process's RSS would stay at
//! its peak. [`release_free_memory`] hands every whole free page back to the kernel.

/// Returns the allocator's free pages to the kernel (glibc `malloc_trim(0)`: every
/// arena, every whole free page, not only the top of the heap). Costs a walk of the
/// free lists (about a millisecond for a heap of a GiB): call it after freeing much,
/// not per frame. Returns whether anything was released; a no-op elsewhere than
/// glibc.
pub fn release_free_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // Safety: malloc_trim takes a size and touches only the allocator's own
        // state, under its locks; it is safe to call from any thread at any time.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}
