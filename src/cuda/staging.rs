//! The pinned u8 staging ring and the host-to-device upload.
//!
//! Each slot holds one batch of u8 HWC pixels in page-locked host memory, which the CPU stage
//! writes straight into. A slot's upload is asynchronous on the pipeline's stream; an event
//! recorded after it tells when the slot may be written again, so the CPU only ever waits for a
//! copy that is still reading the very slot it wants.
//!
//! The slots' memory is ordinary memory, its pages faulted in by a thread of its own while the
//! CUDA context is made ([`TouchedSlots::touch_beside`]), then page-locked in place once the
//! device is open ([`StagingRing::new`]): most of allocating page-locked memory is faulting its
//! pages in (on the H200 machine 40-53 ms for two slots of 256 images of 224 x 224, against
//! 3 ms to page-lock them once touched), and the context takes a quarter of a second anyway.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, CudaEvent, CudaSlice, CudaStream};

use super::guarded;
use crate::background::Background;
use crate::error::{Error, Result};

/// The alignment of the slots' page-locked range, and so the bytes padded on either side of it:
/// a page of any size Linux runs with, so that the range shares no page with other memory.
const PAGE_ALIGN: usize = 64 << 10;

/// The byte poured into the slots' memory as its pages are faulted in (anything but zero, which
/// a compiler may leave to the allocator's zeroed pages, faulting nothing in).
const TOUCH_BYTE: u8 = 0xA5;

/// Bytes touched between two looks at the flag that gives the touching up.
const TOUCH_STEP: usize = 8 << 20;

/// Slots being touched on a thread of their own ([`TouchedSlots::touch_beside`]).
pub(crate) type SlotsComing = Background<Result<TouchedSlots>>;

/// Host memory for a ring's slots, its pages faulted in: ordinary memory until the ring
/// page-locks it.
pub(crate) struct TouchedSlots {
    /// The slots' bytes, padded by [`PAGE_ALIGN`] on either side.
    memory: Vec<u8>,
    slots: usize,
    slot_bytes: usize,
}

impl TouchedSlots {
    /// `slots` slots of `slot_bytes` each, their pages faulted in now.
    pub fn touch(slots: usize, slot_bytes: usize) -> Result<TouchedSlots> {
        TouchedSlots::touch_unless(slots, slot_bytes, &AtomicBool::new(false))
    }

    /// [`TouchedSlots::touch`] on a thread of its own, beside whatever comes next (the device's
    /// opening), given up if dropped first (no device opened); `None` if the thread cannot
    /// start (the slots are then touched when the device is open).
    pub fn touch_beside(slots: usize, slot_bytes: usize) -> Option<SlotsComing> {
        Background::start("gpufeed-staging-touch", touching_stopped, move |cancel| {
            TouchedSlots::touch_unless(slots, slot_bytes, cancel)
        })
        .ok()
    }

    /// [`TouchedSlots::touch`], given up once `cancel` is raised.
    fn touch_unless(slots: usize, slot_bytes: usize, cancel: &AtomicBool) -> Result<TouchedSlots> {
        let slot_bytes = slot_bytes.max(1);
        let too_large = || {
            Error::invalid(
                "batch_size",
                format!("{slots} staging slots of {slot_bytes} bytes do not fit in memory"),
            )
        };
        let bytes = slots
            .checked_mul(slot_bytes)
            .and_then(|b| b.checked_add(2 * PAGE_ALIGN))
            .ok_or_else(too_large)?;
        let mut memory = Vec::new();
        memory.try_reserve_exact(bytes).map_err(|_| too_large())?;
        while memory.len() < bytes {
            if cancel.load(Ordering::Relaxed) {
                return touching_stopped();
            }
            memory.resize(bytes.min(memory.len() + TOUCH_STEP), TOUCH_BYTE);
        }
        Ok(TouchedSlots {
            memory,
            slots,
            slot_bytes,
        })
    }

    /// The range to page-lock: the slots, page-aligned inside the padding.
    fn range(&self) -> std::ops::Range<usize> {
        let start = self
            .memory
            .as_ptr()
            .align_offset(PAGE_ALIGN)
            .min(PAGE_ALIGN);
        start..start + self.slots * self.slot_bytes
    }
}

/// The slots of a touching thread that stopped before it had them.
fn touching_stopped() -> Result<TouchedSlots> {
    Err(Error::Worker(
        "the thread touching the staging stopped".into(),
    ))
}

/// Touched host memory page-locked in place for the device (`cuMemHostRegister`), unlocked when
/// dropped.
struct PageLocked {
    touched: TouchedSlots,
    context: Arc<CudaContext>,
}

impl PageLocked {
    fn new(context: &Arc<CudaContext>, mut touched: TouchedSlots) -> Result<PageLocked> {
        let range = touched.range();
        let memory = &mut touched.memory[range];
        guarded("page-locking the staging memory", || {
            context.bind_to_thread()?;
            // SAFETY: the pointer and length are those of a live range of `touched`'s buffer,
            // which the returned value owns and never reallocates, and whose drop unlocks the
            // range before the buffer is freed; the range shares no page with other memory
            // (`PAGE_ALIGN`), so no other registration can overlap it.
            unsafe { sys::cuMemHostRegister_v2(memory.as_mut_ptr().cast(), memory.len(), 0) }
                .result()
        })?;
        Ok(PageLocked {
            touched,
            context: context.clone(),
        })
    }

    fn slot(&mut self, index: usize) -> &mut [u8] {
        let range = self.touched.range();
        let bytes = self.touched.slot_bytes;
        &mut self.touched.memory[range][index * bytes..(index + 1) * bytes]
    }
}

impl Drop for PageLocked {
    fn drop(&mut self) {
        let range = self.touched.range();
        let memory = &mut self.touched.memory[range];
        let _ = guarded("unlocking the staging memory", || {
            self.context.bind_to_thread()?;
            // SAFETY: the range page-locked in `PageLocked::new`, still owned by `self`; no copy
            // reads it any more (the ring waits for its slots' uploads before it drops this).
            unsafe { sys::cuMemHostUnregister(memory.as_mut_ptr().cast()) }.result()
        });
    }
}

struct Slot {
    /// Recorded on the stream after the last upload from this slot.
    uploaded: Option<CudaEvent>,
}

impl Slot {
    fn wait_for_upload(&mut self) -> Result<()> {
        if let Some(event) = self.uploaded.take() {
            event
                .synchronize()
                .map_err(|e| Error::cuda("waiting for an upload", e))?;
        }
        Ok(())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // The page-locked memory must outlive any copy still reading it.
        if let Some(event) = &self.uploaded {
            let _ = event.synchronize();
        }
    }
}

/// A ring of pinned host buffers and the device buffer they upload into.
pub(crate) struct StagingRing {
    /// Dropped before `memory`: each waits for its slot's last upload.
    slots: Vec<Slot>,
    memory: PageLocked,
    device_input: CudaSlice<u8>,
    stream: Arc<CudaStream>,
    slot_bytes: usize,
}

impl StagingRing {
    /// The slots of `touched`, page-locked, and one device buffer of a slot's bytes.
    pub fn new(stream: &Arc<CudaStream>, touched: TouchedSlots) -> Result<StagingRing> {
        let slot_bytes = touched.slot_bytes;
        let slots = (0..touched.slots)
            .map(|_| Slot { uploaded: None })
            .collect();
        let memory = PageLocked::new(stream.context(), touched)?;
        // SAFETY: device memory left uninitialized; every byte the kernel reads was uploaded first.
        let device_input = guarded("allocating the device input buffer", || unsafe {
            stream.alloc::<u8>(slot_bytes)
        })?;
        Ok(StagingRing {
            slots,
            memory,
            device_input,
            stream: stream.clone(),
            slot_bytes,
        })
    }

    /// Number of slots.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Page-locked bytes held by the ring.
    pub fn pinned_bytes(&self) -> usize {
        self.slots.len() * self.slot_bytes
    }

    /// Slot `index` for the CPU to write, once its previous upload has finished.
    pub fn slot_mut(&mut self, index: usize) -> Result<&mut [u8]> {
        self.slots[index].wait_for_upload()?;
        Ok(self.memory.slot(index))
    }

    /// Queues the upload of the byte ranges `ranges` (each inside the slot) of slot `index` to
    /// the same ranges of the device input buffer, and returns that buffer. The slot stays
    /// untouched until the copies have finished.
    pub fn upload(
        &mut self,
        index: usize,
        ranges: &[std::ops::Range<usize>],
    ) -> Result<&mut CudaSlice<u8>> {
        if let Some(r) = ranges
            .iter()
            .find(|r| r.end > self.slot_bytes || r.start > r.end)
        {
            return Err(Error::Mismatch(format!(
                "upload of bytes {r:?} from a {}-byte slot",
                self.slot_bytes
            )));
        }
        let slot = &mut self.slots[index];
        slot.wait_for_upload()?;
        let host: &[u8] = self.memory.slot(index);
        for range in ranges.iter().filter(|r| !r.is_empty()) {
            let mut dst = self.device_input.slice_mut(range.clone());
            // From a plain slice of page-locked memory the copy is asynchronous and cudarc does
            // not track it; the event below does.
            self.stream
                .memcpy_htod(&host[range.clone()], &mut dst)
                .map_err(|e| Error::cuda("uploading a batch", e))?;
        }
        slot.uploaded = Some(
            self.stream
                .record_event(None)
                .map_err(|e| Error::cuda("recording an upload", e))?,
        );
        Ok(&mut self.device_input)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touched_slots_lie_page_aligned_inside_their_padding() {
        for (slots, slot_bytes) in [(2, 150_528 * 3), (2, 1), (3, PAGE_ALIGN + 7)] {
            let touched = TouchedSlots::beside_and_taken(slots, slot_bytes);
            let range = touched.range();
            let start = touched.memory.as_ptr() as usize + range.start;
            assert_eq!(start % PAGE_ALIGN, 0, "{slots} x {slot_bytes}");
            assert_eq!(range.len(), slots * slot_bytes);
            // No page of the range reaches past the buffer.
            assert!(
                (start + range.len()).next_multiple_of(PAGE_ALIGN)
                    <= touched.memory.as_ptr() as usize + touched.memory.len()
            );
            assert!(touched.memory.iter().all(|&b| b == TOUCH_BYTE));
        }
    }

    impl TouchedSlots {
        fn beside_and_taken(slots: usize, slot_bytes: usize) -> TouchedSlots {
            TouchedSlots::touch_beside(slots, slot_bytes)
                .expect("a thread")
                .wait()
                .expect("the slots fit in memory")
        }
    }
}
