//! The pinned u8 staging ring and the host-to-device upload.
//!
//! Each slot holds one batch of u8 HWC pixels in page-locked host memory, which the CPU stage
//! writes straight into. A slot's upload is asynchronous on the pipeline's stream; an event
//! recorded after it tells when the slot may be written again, so the CPU only ever waits for a
//! copy that is still reading the very slot it wants.

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, PinnedHostSlice};

use super::guarded;
use crate::error::{Error, Result};

struct Slot {
    host: PinnedHostSlice<u8>,
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
        // The pinned memory must outlive any copy still reading it.
        if let Some(event) = &self.uploaded {
            let _ = event.synchronize();
        }
    }
}

/// A ring of pinned host buffers and the device buffer they upload into.
pub(crate) struct StagingRing {
    slots: Vec<Slot>,
    device_input: CudaSlice<u8>,
    stream: Arc<CudaStream>,
    slot_bytes: usize,
}

impl StagingRing {
    /// `slots` pinned buffers of `slot_bytes` each, and one device buffer of `slot_bytes`.
    pub fn new(stream: &Arc<CudaStream>, slots: usize, slot_bytes: usize) -> Result<StagingRing> {
        let ctx = stream.context();
        let mut ring = Vec::with_capacity(slots);
        for _ in 0..slots {
            // Flags 0: ordinary page-locked memory. (cudarc's `alloc_pinned` is write-combined,
            // which is very slow for the CPU to read back.)
            // SAFETY: the buffer is uninitialized u8 memory; `slot_mut` hands it out only as a
            // `&mut [u8]` the CPU stage writes before anything reads it, and u8 has no invalid
            // bit patterns.
            let host = guarded("allocating pinned staging memory", || unsafe {
                ctx.alloc_pinned_with_flags::<u8>(slot_bytes.max(1), 0)
            })?;
            ring.push(Slot {
                host,
                uploaded: None,
            });
        }
        // SAFETY: device memory left uninitialized; every byte the kernel reads was uploaded first.
        let device_input = guarded("allocating the device input buffer", || unsafe {
            stream.alloc::<u8>(slot_bytes.max(1))
        })?;
        Ok(StagingRing {
            slots: ring,
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
        let slot = &mut self.slots[index];
        slot.wait_for_upload()?;
        slot.host
            .as_mut_slice()
            .map(|s| &mut s[..self.slot_bytes])
            .map_err(|e| Error::cuda("mapping pinned staging memory", e))
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
        let host = slot
            .host
            .as_slice()
            .map_err(|e| Error::cuda("mapping pinned staging memory", e))?;
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
