//! The pinned u8 staging ring and the host-to-device upload.
//!
//! Each slot holds one batch of u8 HWC pixels in page-locked host memory, which the CPU stage
//! writes straight into. A slot's upload is asynchronous on the pipeline's stream; an event
//! recorded after it tells when the slot may be written again, so the CPU only ever waits for a
//! copy that is still reading the very slot it wants.
//!
//! The slots' memory is ordinary memory in huge pages, faulted in by a thread of its own while
//! the CUDA context is made ([`TouchedSlots::touch_beside`]), then page-locked in place once the
//! device is open ([`StagingRing::new`], [`PageLocked`]): most of allocating page-locked memory
//! is faulting its pages in, and the context takes a quarter of a second anyway.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream};

use crate::background::Background;
use crate::error::guarded;
use crate::error::{Error, Result};
use crate::memory::{HostPages, PageLocked};

/// Slots being touched on a thread of their own ([`TouchedSlots::touch_beside`]).
pub(crate) type SlotsComing = Background<Result<TouchedSlots>>;

/// Host memory for a ring's slots, its pages faulted in: ordinary memory until the ring
/// page-locks it.
pub(crate) struct TouchedSlots {
    pages: HostPages,
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
        let bytes = slots.checked_mul(slot_bytes).ok_or_else(too_large)?;
        match HostPages::touch_unless(bytes, cancel) {
            Ok(Some(pages)) => Ok(TouchedSlots {
                pages,
                slots,
                slot_bytes,
            }),
            Ok(None) => touching_stopped(),
            Err(_) => Err(too_large()),
        }
    }
}

/// The slots of a touching thread that stopped before it had them.
fn touching_stopped() -> Result<TouchedSlots> {
    Err(Error::Worker(
        "the thread touching the staging stopped".into(),
    ))
}

/// The ring's slots, page-locked.
struct LockedSlots {
    memory: PageLocked,
    slot_bytes: usize,
}

impl LockedSlots {
    fn new(stream: &Arc<CudaStream>, touched: TouchedSlots) -> Result<LockedSlots> {
        let memory = guarded("page-locking the staging memory", || {
            PageLocked::lock(stream.context(), touched.pages)
        })?;
        Ok(LockedSlots {
            memory,
            slot_bytes: touched.slot_bytes,
        })
    }

    fn slot(&self, index: usize) -> &[u8] {
        let bytes = self.slot_bytes;
        &self.memory.as_slice()[index * bytes..(index + 1) * bytes]
    }

    fn slot_mut(&mut self, index: usize) -> &mut [u8] {
        let bytes = self.slot_bytes;
        &mut self.memory.as_mut_slice()[index * bytes..(index + 1) * bytes]
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
    memory: LockedSlots,
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
        let memory = LockedSlots::new(stream, touched)?;
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
        Ok(self.memory.slot_mut(index))
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
    fn touched_slots_hold_every_slot_zeroed() {
        for (slots, slot_bytes) in [(2, 150_528 * 3), (2, 1), (3, (2 << 20) + 7)] {
            let touched = TouchedSlots::beside_and_taken(slots, slot_bytes);
            let memory = touched.pages.as_slice();
            assert!(memory.len() >= slots * slot_bytes, "{slots} x {slot_bytes}");
            assert!(memory.iter().all(|&b| b == 0));
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
