//! Page-locked memory for the CPU lane's images one at a time, and their upload.
//!
//! The CPU lane working ahead of the batches prepares each image before it knows the image's
//! place in a batch (an earlier image may fail, or fall to the GPU lane). Prepared into a
//! [`PinnedImage`], the image crosses PCIe straight from where its thread wrote it, to its place
//! in the batch's device buffer ([`upload_images`]): no thread copies it into the batch's
//! staging. The memory comes in chunks ([`PinnedChunks`]), which the pipeline allocates one at a
//! time where the copies hold its batches back (the lane works into ordinary buffers until
//! then): pinning memory is slow, and holds back the other threads' calls to the driver while it
//! runs.

use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtrMut};

use super::guarded;
use super::page_locked::{PageLocked, HUGE_PAGE};
use super::positioned::PositionedImage;
use crate::error::{Error, Result};

/// Images a chunk of page-locked memory holds at least: more where its whole huge pages hold
/// more ([`chunk_images`]).
const CHUNK_IMAGES: usize = 32;

/// The images of `image_bytes` a chunk holds: as many as its whole huge pages take.
fn chunk_images(image_bytes: usize) -> usize {
    let image_bytes = image_bytes.max(1);
    (CHUNK_IMAGES * image_bytes).next_multiple_of(HUGE_PAGE) / image_bytes
}

/// One allocation of page-locked memory, cut into images.
struct Chunk {
    /// Kept for its memory (freed with the chunk, once no image of it is left).
    _host: PageLocked,
    base: NonNull<u8>,
}

// SAFETY: the chunk's memory is page-locked host memory owned by `_host` (plain owned memory);
// `base` points into it, and each image of it is reached only through the one `PinnedImage`
// that owns it.
unsafe impl Send for Chunk {}
// SAFETY: as above: shared references to a chunk hand out no access to its bytes.
unsafe impl Sync for Chunk {}

/// One image's bytes in page-locked memory, owned alone: the CPU lane prepares an image into it,
/// and the batch uploads it from there.
pub(crate) struct PinnedImage {
    chunk: Arc<Chunk>,
    offset: usize,
    bytes: usize,
}

impl std::fmt::Debug for PinnedImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedImage")
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

impl PinnedImage {
    /// The image's bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `offset..offset + bytes` lies inside the chunk's allocation (made so by
        // `allocate_chunk`), which lives as long as `self.chunk`; no other `PinnedImage` covers
        // these bytes; and the only copy reading them (`upload_images`) is waited for before the
        // image is written again (the caller keeps the image until its event has completed).
        unsafe { std::slice::from_raw_parts(self.chunk.base.as_ptr().add(self.offset), self.bytes) }
    }

    /// The image's bytes, to write.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only reference to them.
        unsafe {
            std::slice::from_raw_parts_mut(self.chunk.base.as_ptr().add(self.offset), self.bytes)
        }
    }
}

/// Allocates one chunk of page-locked memory for [`chunk_images`] images of `image_bytes`.
fn allocate_chunk(context: &Arc<CudaContext>, image_bytes: usize) -> Result<Vec<PinnedImage>> {
    let image_bytes = image_bytes.max(1);
    let images = chunk_images(image_bytes);
    let mut host = guarded("allocating page-locked memory for images", || {
        PageLocked::new(context, images * image_bytes)
    })?;
    let base = NonNull::from(host.as_mut_slice()).cast::<u8>();
    let chunk = Arc::new(Chunk { _host: host, base });
    Ok((0..images)
        .map(|k| PinnedImage {
            chunk: chunk.clone(),
            offset: k * image_bytes,
            bytes: image_bytes,
        })
        .collect())
}

/// Page-locked images to allocate, a chunk at a time.
pub(crate) struct PinnedChunks {
    context: Arc<CudaContext>,
    image_bytes: usize,
    /// Chunks not allocated yet.
    left: usize,
    chunks: usize,
}

impl PinnedChunks {
    /// At least `images` images of `image_bytes` (whole chunks) on `context`'s device.
    pub fn new(context: Arc<CudaContext>, image_bytes: usize, images: usize) -> PinnedChunks {
        let chunks = images.div_ceil(chunk_images(image_bytes));
        PinnedChunks {
            context,
            image_bytes,
            left: chunks,
            chunks,
        }
    }

    /// The page-locked bytes of every chunk.
    pub fn bytes(&self) -> usize {
        let image_bytes = self.image_bytes.max(1);
        self.chunks * (chunk_images(image_bytes) * image_bytes).next_multiple_of(HUGE_PAGE)
    }

    /// The next chunk's images; none once every chunk is allocated.
    pub fn next_chunk(&mut self) -> Result<Vec<PinnedImage>> {
        if self.left == 0 {
            return Ok(Vec::new());
        }
        self.left -= 1;
        allocate_chunk(&self.context, self.image_bytes)
    }

    /// Whether every chunk is allocated (or the rest given up).
    pub fn done(&self) -> bool {
        self.left == 0
    }

    /// Allocates no more chunks.
    pub fn give_up(&mut self) {
        self.left = 0;
    }
}

/// Queues on `stream` the upload of each pinned image to its place (in images of its size) of
/// `input`, and returns the bytes queued. The images must stay untouched until work recorded on
/// `stream` after this call has completed.
pub(crate) fn upload_images(
    stream: &Arc<CudaStream>,
    images: &[(PinnedImage, usize)],
    input: &mut CudaSlice<u8>,
) -> Result<usize> {
    let Some(bytes) = images.first().map(|(image, _)| image.bytes) else {
        return Ok(0);
    };
    if let Some((image, place)) = images.iter().find(|(image, _)| image.bytes != bytes) {
        return Err(Error::Mismatch(format!(
            "an image of {} bytes uploaded to place {place} of a batch of {bytes}-byte images",
            image.bytes,
        )));
    }
    let copies = images
        .iter()
        .map(|(image, place)| (image.as_slice(), *place));
    // SAFETY: each source is a pinned image's page-locked bytes, which the caller keeps
    // untouched until the stream is past this call's work.
    unsafe { queue_copies(stream, copies, bytes, input) }
}

/// Queues on `stream` the copy of each `(bytes, place)` of `copies` to `input`, from image
/// `place` on (in images of `image_bytes`), once every one is checked to fit, and returns the
/// bytes queued.
///
/// # Safety
/// Each source lies in page-locked memory, and stays alive and unwritten until work recorded
/// on `stream` after this call has completed.
pub(super) unsafe fn queue_copies<'a>(
    stream: &Arc<CudaStream>,
    copies: impl Iterator<Item = (&'a [u8], usize)> + Clone,
    image_bytes: usize,
    input: &mut CudaSlice<u8>,
) -> Result<usize> {
    let image_bytes = image_bytes.max(1);
    if let Some((source, place)) = copies.clone().find(|(source, place)| {
        source.len() % image_bytes != 0 || place * image_bytes + source.len() > input.len()
    }) {
        return Err(Error::Mismatch(format!(
            "{} bytes uploaded to place {place} of a {}-byte batch of {image_bytes}-byte images",
            source.len(),
            input.len()
        )));
    }
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| Error::cuda("binding the device for an upload", e))?;
    let (base, _sync) = input.device_ptr_mut(stream);
    let mut queued = 0;
    for (source, place) in copies {
        let dst = base + (place * image_bytes) as u64;
        // SAFETY: the destination is `source.len()` bytes inside `input` (checked above), kept
        // borrowed while the copy is queued on `stream`, which orders every later use of it; the
        // source is page-locked and kept alive and unwritten until the stream is past this copy
        // (the caller's promise).
        unsafe { cudarc::driver::result::memcpy_htod_async(dst, source, stream.cu_stream()) }
            .map_err(|e| Error::cuda("uploading images", e))?;
        queued += source.len();
    }
    Ok(queued)
}

/// Page-locked images whose uploads are queued, batch by batch, until the stream is past them:
/// the CPU lane's images of its own, and those it laid out by position.
#[derive(Default)]
pub(crate) struct ImagesInFlight {
    batches: std::collections::VecDeque<(CudaEvent, Vec<PinnedImage>, Vec<PositionedImage>)>,
}

impl ImagesInFlight {
    /// Records on `stream`, after the uploads of `images` and `positioned` queued there, when
    /// they are done.
    pub fn push(
        &mut self,
        stream: &Arc<CudaStream>,
        images: Vec<PinnedImage>,
        positioned: Vec<PositionedImage>,
    ) -> Result<()> {
        if images.is_empty() && positioned.is_empty() {
            return Ok(());
        }
        let event = stream
            .record_event(None)
            .map_err(|e| Error::cuda("recording an upload of images", e))?;
        self.batches.push_back((event, images, positioned));
        Ok(())
    }

    /// The images whose uploads are done, waiting for the oldest batches' until at most
    /// `pending` batches are left in flight (their uploads were queued a batch ago or more:
    /// done long since, as a rule). The positioned images done are dropped (each position
    /// serves once).
    pub fn reclaim(&mut self, pending: usize) -> Result<Vec<PinnedImage>> {
        let mut done = Vec::new();
        while let Some((event, _, _)) = self.batches.front() {
            let complete = match self.batches.len() > pending {
                true => event
                    .synchronize()
                    .map(|_| true)
                    .map_err(|e| Error::cuda("waiting for an upload of images", e))?,
                false => event
                    .try_is_complete()
                    .map_err(|e| Error::cuda("querying an upload of images", e))?,
            };
            if !complete {
                break;
            }
            if let Some((_, images, _)) = self.batches.pop_front() {
                done.extend(images);
            }
        }
        Ok(done)
    }
}

impl Drop for ImagesInFlight {
    fn drop(&mut self) {
        // The page-locked memory must outlive any copy still reading it.
        for (event, _, _) in &self.batches {
            let _ = event.synchronize();
        }
    }
}
