//! Page-locked host memory, made in two steps: a mapping of its own, in huge pages where the
//! system gives them (Linux's transparent huge pages, asked for with `madvise`), its pages
//! faulted in outside the driver, then locked in place for the device (`cuMemHostRegister`).
//!
//! `cuMemHostAlloc` faults its pages in inside the driver, holding the driver's lock
//! throughout, so every other thread's call (an upload, a kernel launch, the GPU lane's opening)
//! waits; and pages of 4 KiB cost again when the process lets them go. Measured with bare
//! driver calls on the H200 machine, 512 MiB: `cuMemHostAlloc` 195-239 ms, freed in 48-49 ms;
//! the same memory in pages of 4 KiB touched in 254-294 ms, locked in 24-132 ms, let go in
//! 25-28 ms; in huge pages touched in 85-111 ms, locked in 12-13 ms, let go in 9-11 ms.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, DriverError};
use rustix::mm::{madvise, mmap_anonymous, munmap, Advice, MapFlags, ProtFlags};

/// A huge page on x86-64 and on aarch64 with 4 KiB base pages: mappings are sized and aligned
/// to it, so that every page of them may be a huge one.
pub(crate) const HUGE_PAGE: usize = 2 << 20;

/// The smallest page Linux runs with: touching one byte of each faults every page in.
const SMALL_PAGE: usize = 4 << 10;

/// Bytes touched between two looks at the flag that gives the touching up.
const TOUCH_STEP: usize = 8 << 20;

/// The driver's answer to memory that cannot be had, for memory the host could not give.
fn out_of_memory() -> DriverError {
    DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY)
}

/// Ordinary host memory in a mapping of its own, its pages faulted in by [`HostPages::touch`]
/// or where first written ([`HostPages::map`]): page-locked by [`PageLocked::lock`]. Its bytes
/// start zeroed (the touching writes zeros).
pub(crate) struct HostPages {
    /// The whole mapping, aligned or not.
    mapping: NonNull<u8>,
    mapping_bytes: usize,
    /// The memory handed out: [`HUGE_PAGE`]-aligned inside the mapping, whole huge pages.
    start: NonNull<u8>,
    bytes: usize,
}

// SAFETY: the mapping is plain memory owned by the value alone; it is reached only through the
// value (`&self` for reading, `&mut self` for writing).
unsafe impl Send for HostPages {}
// SAFETY: as above: shared references hand out only shared access to the bytes.
unsafe impl Sync for HostPages {}

impl HostPages {
    /// At least `bytes` bytes (whole huge pages, at least one), their pages faulted in now.
    pub fn touch(bytes: usize) -> Result<HostPages, DriverError> {
        HostPages::touch_unless(bytes, &AtomicBool::new(false))?.ok_or_else(out_of_memory)
    }

    /// [`HostPages::touch`], given up (`None`) once `cancel` is raised.
    pub fn touch_unless(
        bytes: usize,
        cancel: &AtomicBool,
    ) -> Result<Option<HostPages>, DriverError> {
        let pages = HostPages::map(bytes)?;
        for step in (0..pages.bytes).step_by(TOUCH_STEP) {
            if cancel.load(Ordering::Relaxed) {
                return Ok(None);
            }
            for page in (step..pages.bytes.min(step + TOUCH_STEP)).step_by(SMALL_PAGE) {
                // SAFETY: `page < bytes`: inside the memory handed out, which nothing else
                // reaches yet. A volatile write, so that the fault is not left out.
                unsafe { pages.start.as_ptr().add(page).write_volatile(0) };
            }
        }
        Ok(Some(pages))
    }

    /// At least `bytes` bytes (whole huge pages, at least one), mapped but not touched: each page
    /// is faulted in where it is first written.
    pub fn map(bytes: usize) -> Result<HostPages, DriverError> {
        let bytes = bytes
            .max(1)
            .checked_next_multiple_of(HUGE_PAGE)
            .ok_or_else(out_of_memory)?;
        let mapping_bytes = bytes.checked_add(HUGE_PAGE).ok_or_else(out_of_memory)?;
        // SAFETY: a new private anonymous mapping at an address the kernel picks: it overlaps no
        // memory of the process, and the value returned owns it and unmaps it when dropped.
        let mapping = unsafe {
            mmap_anonymous(
                std::ptr::null_mut(),
                mapping_bytes,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )
        }
        .map_err(|_| out_of_memory())?;
        let mapping = NonNull::new(mapping.cast::<u8>()).ok_or_else(out_of_memory)?;
        let offset = mapping.as_ptr().align_offset(HUGE_PAGE).min(HUGE_PAGE);
        // SAFETY: `offset <= HUGE_PAGE`, so the start lies inside the mapping with `bytes`
        // after it (`mapping_bytes = bytes + HUGE_PAGE`).
        let start = unsafe { mapping.add(offset) };
        // SAFETY: the range lies inside the mapping just made; advice changes no contents. Where
        // the system gives no huge pages the advice fails and the pages stay small.
        let _ = unsafe { madvise(start.as_ptr().cast(), bytes, Advice::LinuxHugepage) };
        Ok(HostPages {
            mapping,
            mapping_bytes,
            start,
            bytes,
        })
    }

    /// The first byte: for the images laid out by position in one mapping
    /// ([`super::positioned`]), which reach their own parts of it through it.
    pub(super) fn start(&self) -> NonNull<u8> {
        self.start
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `start..start + bytes` lies inside the live mapping, initialized (zeroed by
        // the kernel or written since), and `&self` allows no writer meanwhile.
        unsafe { std::slice::from_raw_parts(self.start.as_ptr(), self.bytes) }
    }

    /// The bytes, to write.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only reference to them.
        unsafe { std::slice::from_raw_parts_mut(self.start.as_ptr(), self.bytes) }
    }
}

impl Drop for HostPages {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `HostPages::map`, owned by `self` alone, unmapped once; no
        // reference to its bytes outlives `self`.
        let _ = unsafe { munmap(self.mapping.as_ptr().cast(), self.mapping_bytes) };
    }
}

/// Host memory page-locked in place for the device, unlocked when dropped: the copies queued
/// from it run asynchronously, like those from `cuMemHostAlloc`'s memory (flags 0: not
/// write-combined, so the CPU reads it back at full speed).
pub(crate) struct PageLocked {
    pages: HostPages,
    context: Arc<CudaContext>,
}

impl PageLocked {
    /// At least `bytes` bytes (whole huge pages) of page-locked memory for `context`'s device,
    /// touched on this thread first.
    pub fn new(context: &Arc<CudaContext>, bytes: usize) -> Result<PageLocked, DriverError> {
        PageLocked::lock(context, HostPages::touch(bytes)?)
    }

    /// `pages` page-locked for `context`'s device.
    pub fn lock(
        context: &Arc<CudaContext>,
        mut pages: HostPages,
    ) -> Result<PageLocked, DriverError> {
        context.bind_to_thread()?;
        let memory = pages.as_mut_slice();
        // SAFETY: the pointer and length are those of `pages`' memory, a mapping of its own
        // (no other registration can overlap it), which the returned value owns and whose drop
        // unlocks it before it is unmapped.
        unsafe { sys::cuMemHostRegister_v2(memory.as_mut_ptr().cast(), memory.len(), 0) }
            .result()?;
        Ok(PageLocked {
            pages,
            context: context.clone(),
        })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        self.pages.as_slice()
    }

    /// The bytes, to write.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.pages.as_mut_slice()
    }
}

impl Drop for PageLocked {
    fn drop(&mut self) {
        let memory = self.pages.as_mut_slice();
        if self.context.bind_to_thread().is_ok() {
            // SAFETY: the memory locked in `PageLocked::lock`, still owned by `self`; whoever
            // queued copies from it has waited for them before dropping it.
            let _ = unsafe { sys::cuMemHostUnregister(memory.as_mut_ptr().cast()) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_pages_are_whole_huge_pages_aligned_and_zeroed() {
        for bytes in [2 * 150_528 * 256, 1, HUGE_PAGE, HUGE_PAGE + 7, 0] {
            let mut pages = HostPages::touch(bytes).expect("the memory fits");
            let memory = pages.as_mut_slice();
            assert_eq!(memory.as_ptr() as usize % HUGE_PAGE, 0, "{bytes}");
            assert_eq!(memory.len(), bytes.max(1).next_multiple_of(HUGE_PAGE));
            assert!(memory.iter().all(|&b| b == 0));
            memory.fill(0x5A);
            assert!(pages.as_slice().iter().all(|&b| b == 0x5A));
        }
    }

    #[test]
    fn touching_given_up_maps_nothing_more() {
        let cancel = AtomicBool::new(true);
        assert!(HostPages::touch_unless(64 << 20, &cancel)
            .expect("the memory fits")
            .is_none());
    }

    #[test]
    fn memory_the_host_cannot_give_is_the_drivers_out_of_memory() {
        let error = HostPages::touch(usize::MAX - HUGE_PAGE).err();
        assert_eq!(error, Some(out_of_memory()));
        let error = HostPages::touch(1 << 60).err();
        assert_eq!(error, Some(out_of_memory()));
    }
}
