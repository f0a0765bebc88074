//! The upload of the CPU lane's page-locked images ([`PinnedImage`], [`PositionedImage`]) to
//! their places in a batch's device buffer, and the page-locked images kept until their uploads
//! are done ([`ImagesInFlight`]).

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DevicePtrMut};

use crate::error::{Error, Result};
use crate::memory::{PinnedImage, PositionedImage};

/// Queues on `stream` the upload of each pinned image to its place (in images of its size) of
/// `input`, its first `used` bytes of each `(image, place, used)` (a patch sequence's image
/// fills its place in part), and returns the bytes queued. The images must stay untouched until
/// work recorded on `stream` after this call has completed.
pub(crate) fn upload_images(
    stream: &Arc<CudaStream>,
    images: &[(PinnedImage, usize, usize)],
    input: &mut CudaSlice<u8>,
) -> Result<usize> {
    let Some(bytes) = images.first().map(|(image, _, _)| image.bytes()) else {
        return Ok(0);
    };
    if let Some((image, place, used)) = images
        .iter()
        .find(|(image, _, used)| image.bytes() != bytes || *used > bytes)
    {
        return Err(Error::Mismatch(format!(
            "{used} bytes of an image of {} uploaded to place {place} of a batch of {bytes}-byte \
             images",
            image.bytes(),
        )));
    }
    let copies = images
        .iter()
        .map(|(image, place, used)| (&image.as_slice()[..*used], *place));
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
unsafe fn queue_copies<'a>(
    stream: &Arc<CudaStream>,
    copies: impl Iterator<Item = (&'a [u8], usize)> + Clone,
    image_bytes: usize,
    input: &mut CudaSlice<u8>,
) -> Result<usize> {
    let image_bytes = image_bytes.max(1);
    if let Some((source, place)) = copies.clone().find(|(source, place)| {
        // Whole images (a run of them), or part of one.
        (source.len() > image_bytes && source.len() % image_bytes != 0)
            || place * image_bytes + source.len() > input.len()
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

/// Queues on `stream` the upload of each page-locked positioned image to its place (in images of
/// its size) of `input`, one copy for each run of images whose positions and places both follow
/// one another, and returns the bytes queued. The images must stay alive until work recorded on
/// `stream` after this call has completed.
pub(crate) fn upload_positioned(
    stream: &Arc<CudaStream>,
    images: &[(PositionedImage, usize)],
    input: &mut CudaSlice<u8>,
) -> Result<usize> {
    let Some(bytes) = images.first().map(|(image, _)| image.image_bytes()) else {
        return Ok(0);
    };
    if let Some((image, place)) = images
        .iter()
        .find(|(image, _)| image.image_bytes() != bytes || !image.is_locked())
    {
        return Err(Error::Mismatch(format!(
            "the image of position {} (page-locked: {}) uploaded to place {place} of a batch of \
             {bytes}-byte images",
            image.position(),
            image.is_locked(),
        )));
    }
    // SAFETY: every run lies in the page-locked part of its mapping (checked above), which the
    // caller's images keep alive and nothing writes until the stream is past this call's work.
    unsafe { queue_copies(stream, Runs { images }, bytes, input) }
}

/// The runs of images whose positions (in one mapping) and places both follow one another:
/// `(their bytes, the first one's place)`.
#[derive(Clone)]
struct Runs<'a> {
    images: &'a [(PositionedImage, usize)],
}

impl<'a> Iterator for Runs<'a> {
    type Item = (&'a [u8], usize);

    fn next(&mut self) -> Option<Self::Item> {
        let (first, place) = self.images.first().map(|(image, place)| (image, *place))?;
        let count = self
            .images
            .iter()
            .enumerate()
            .take_while(|(k, (image, p))| {
                Arc::ptr_eq(image.images(), first.images())
                    && image.position() == first.position() + k
                    && *p == place + k
            })
            .count();
        // SAFETY: `self.images[..count]` hold every position of the run (the caller's images,
        // borrowed for `'a`), and nothing writes them meanwhile.
        let run = unsafe { first.images().run(first.position(), count) };
        self.images = &self.images[count..];
        Some((run, place))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::PositionedImages;

    #[test]
    fn a_batch_uploads_a_run_for_each_stretch_of_positions_and_places_in_step() {
        let bytes = 1000;
        let images = PositionedImages::new(16, bytes).expect("mapped");
        let other = PositionedImages::new(16, bytes).expect("mapped");
        let batch: Vec<(PositionedImage, usize)> = [
            (&images, 0, 0),
            (&images, 1, 1),
            (&images, 2, 2),
            (&images, 5, 3),
            (&images, 6, 4),
            (&images, 3, 5),
            (&images, 7, 7),
            (&images, 8, 8),
            (&other, 9, 9),
        ]
        .into_iter()
        .map(|(from, position, place)| (from.take(position).expect("free"), place))
        .collect();
        let runs: Vec<(usize, usize)> = Runs { images: &batch }
            .map(|(run, place)| (run.len() / bytes, place))
            .collect();
        assert_eq!(runs, [(3, 0), (2, 3), (1, 5), (2, 7), (1, 9)]);
        let starts: Vec<*const u8> = Runs { images: &batch }
            .map(|(run, _)| run.as_ptr())
            .collect();
        assert_eq!(starts[0], batch[0].0.as_slice().as_ptr());
        assert_eq!(starts[1], batch[3].0.as_slice().as_ptr());
        assert_eq!(starts[4], batch[8].0.as_slice().as_ptr());
    }
}
