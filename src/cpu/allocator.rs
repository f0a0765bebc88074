//! Giving freed memory back to the system after a large image. glibc keeps what a thread frees
//! in that thread's arena (allocations under its mmap threshold, which grows up to 32 MB), so
//! with many threads each decoding a large image now and then, resident memory would grow by up
//! to a large image per thread although the decode budget bounds what is in use at once.
//! `malloc_trim` returns the free pages of every arena; the CPU lane calls it after an image
//! that needed more than [`TRIM_AFTER`] bytes, which is rare next to the time such an image
//! takes to decode.

/// In-flight bytes of an image above which its memory is handed back once it is done.
pub(crate) const TRIM_AFTER: u64 = 16 << 20;

/// Returns the free memory of every allocator arena to the system (glibc); elsewhere nothing to
/// do.
pub(crate) fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes a plain integer (bytes to keep free at the top of the heap),
    // touches only the allocator's own free lists under its locks, and is safe to call from any
    // thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}
