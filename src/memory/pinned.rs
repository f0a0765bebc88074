//! Page-locked memory for the CPU lane's images one at a time.
//!
//! The CPU lane working ahead of the batches prepares each image before it knows the image's
//! place in a batch (an earlier image may fail, or fall to the GPU lane). Prepared into a
//! [`PinnedImage`], the image crosses PCIe straight from where its thread wrote it, to its place
//! in the batch's device buffer (the device stage's `upload_images`): no thread copies it into
//! the batch's staging. The memory comes in chunks ([`PinnedChunks`]), which the pipeline
//! allocates one at a time where the copies hold its batches back (the lane works into ordinary
//! buffers until then): pinning memory is slow, and holds back the other threads' calls to the
//! driver while it runs.

use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::CudaContext;

use super::page_locked::{PageLocked, HUGE_PAGE};
use crate::error::{guarded, Result};

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
    /// Bytes of the image.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

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
