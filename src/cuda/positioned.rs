//! The CPU lane's images of an epoch's first positions, laid out by position in one mapping of
//! their own (huge pages where the system gives them).
//!
//! While the device opens, the CPU lane works far past its lookahead (a quarter of a second is
//! a few thousand images), and the first batches are made of nothing else. Written where their
//! positions say, the images of a batch lie one after another; once the device is open, the
//! part of the mapping written so far is page-locked in place ([`PositionedImages::lock`], a
//! few milliseconds), and a batch uploads each run of them straight from there, one copy per
//! run, instead of copying every image into its staging first (31 µs an image, 8 ms a batch of
//! 256 at 224 x 224 on the H200 machine, while the other lanes wait for the batches).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{sys, CudaContext, CudaSlice, CudaStream};

use super::guarded;
use super::image_staging::queue_copies;
use super::page_locked::{HostPages, HUGE_PAGE};
use crate::error::{Error, Result};

/// Images of one size laid out by position, each handed out once.
pub(crate) struct PositionedImages {
    pages: HostPages,
    image_bytes: usize,
    /// Whether each position's image was handed out.
    taken: Vec<AtomicBool>,
    /// Bytes from the start page-locked (0 until locked).
    locked_bytes: AtomicUsize,
    /// The device the locked bytes are locked for, to unlock them.
    locked_for: Mutex<Option<Arc<CudaContext>>>,
}

impl std::fmt::Debug for PositionedImages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PositionedImages")
            .field("images", &self.taken.len())
            .field("locked_bytes", &self.locked_bytes.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl PositionedImages {
    /// Room for the images of positions `0..images`, `image_bytes` each, mapped but not touched
    /// (each page is faulted in where an image is first written).
    pub fn new(images: usize, image_bytes: usize) -> Result<Arc<PositionedImages>> {
        let image_bytes = image_bytes.max(1);
        let bytes = images.checked_mul(image_bytes).ok_or_else(|| {
            Error::Worker(format!("{images} images of {image_bytes} bytes do not fit"))
        })?;
        let pages = HostPages::map(bytes).map_err(|e| Error::cuda("mapping images", e))?;
        Ok(Arc::new(PositionedImages {
            pages,
            image_bytes,
            taken: (0..images).map(|_| AtomicBool::new(false)).collect(),
            locked_bytes: AtomicUsize::new(0),
            locked_for: Mutex::new(None),
        }))
    }

    /// Positions laid out.
    pub fn len(&self) -> usize {
        self.taken.len()
    }

    /// The image of `position`, if it is laid out and was not handed out before.
    pub fn take(self: &Arc<Self>, position: usize) -> Option<PositionedImage> {
        let taken = self.taken.get(position)?;
        match taken.swap(true, Ordering::AcqRel) {
            true => None,
            false => Some(PositionedImage {
                images: self.clone(),
                position,
            }),
        }
    }

    /// Page-locks, for `context`'s device, the images of positions `0..positions` (the pages
    /// they lie on, whole): those written so far and those being written, as a rule (pages not
    /// written yet are faulted in by the locking). Locks once: later calls change nothing.
    pub fn lock(&self, context: &Arc<CudaContext>, positions: usize) -> Result<()> {
        let mut locked_for = self
            .locked_for
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if locked_for.is_some() {
            return Ok(());
        }
        let bytes = positions
            .min(self.len())
            .saturating_mul(self.image_bytes)
            .next_multiple_of(HUGE_PAGE)
            .min(self.pages.as_slice().len());
        if bytes == 0 {
            return Ok(());
        }
        let start = self.pages.start();
        guarded(
            "page-locking the images made while the device opened",
            || {
                context.bind_to_thread()?;
                // SAFETY: `start..start + bytes` lies inside the mapping `self.pages` owns (a mapping
                // of its own: no other registration overlaps it), which lives until `self`'s drop
                // has unlocked it. Writers of the images in it are not disturbed: locking keeps
                // every page where it is.
                unsafe { sys::cuMemHostRegister_v2(start.as_ptr().cast(), bytes, 0) }.result()
            },
        )?;
        *locked_for = Some(context.clone());
        self.locked_bytes.store(bytes, Ordering::Release);
        Ok(())
    }

    /// The bytes of positions `first..first + count`.
    ///
    /// # Safety
    /// The caller holds the [`PositionedImage`] of every one of these positions, and none of
    /// them is written while the slice lives.
    unsafe fn run(&self, first: usize, count: usize) -> &[u8] {
        // SAFETY: the positions lie inside the mapping (each was handed out, so each is below
        // `len`); the caller's images make these bytes theirs alone, and none writes them.
        unsafe {
            std::slice::from_raw_parts(
                self.pages.start().as_ptr().add(first * self.image_bytes),
                count * self.image_bytes,
            )
        }
    }
}

impl Drop for PositionedImages {
    fn drop(&mut self) {
        let locked_for = self
            .locked_for
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(context) = locked_for.take() {
            if context.bind_to_thread().is_ok() {
                // SAFETY: the range locked in `lock`, inside the mapping, which is unmapped only
                // after this (when `pages` drops); no image is left (each holds `self`), so no
                // copy from it is queued any more.
                let _ = unsafe { sys::cuMemHostUnregister(self.pages.start().as_ptr().cast()) };
            }
        }
    }
}

/// The image of one position of [`PositionedImages`], owned alone: the CPU lane prepares an
/// image into it, and a batch uploads it from there (once locked) or copies it.
#[derive(Debug)]
pub(crate) struct PositionedImage {
    images: Arc<PositionedImages>,
    position: usize,
}

impl PositionedImage {
    /// The image's bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: this value holds the position's image alone (handed out once) and reads it
        // through `&self`: no writer meanwhile.
        unsafe { self.images.run(self.position, 1) }
    }

    /// The image's bytes, to write.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let bytes = self.images.image_bytes;
        // SAFETY: the position lies inside the mapping (it was handed out, so it is below
        // `len`), and this value, which `&mut self` makes the only reference to it, holds its
        // bytes alone.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.images
                    .pages
                    .start()
                    .as_ptr()
                    .add(self.position * bytes),
                bytes,
            )
        }
    }

    /// Whether the image is page-locked: a batch may upload it from where it lies.
    pub fn is_locked(&self) -> bool {
        let end = (self.position + 1) * self.images.image_bytes;
        end <= self.images.locked_bytes.load(Ordering::Acquire)
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
    let Some(bytes) = images.first().map(|(image, _)| image.images.image_bytes) else {
        return Ok(0);
    };
    if let Some((image, place)) = images
        .iter()
        .find(|(image, _)| image.images.image_bytes != bytes || !image.is_locked())
    {
        return Err(Error::Mismatch(format!(
            "the image of position {} (page-locked: {}) uploaded to place {place} of a batch of \
             {bytes}-byte images",
            image.position,
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
                Arc::ptr_eq(&image.images, &first.images)
                    && image.position == first.position + k
                    && *p == place + k
            })
            .count();
        // SAFETY: `self.images[..count]` hold every position of the run (the caller's images,
        // borrowed for `'a`), and nothing writes them meanwhile.
        let run = unsafe { first.images.run(first.position, count) };
        self.images = &self.images[count..];
        Some((run, place))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_position_is_handed_out_once_and_holds_its_own_bytes() {
        let images = PositionedImages::new(40, 150_528).expect("mapped");
        assert_eq!(images.len(), 40);
        assert!(images.take(40).is_none());
        let mut taken: Vec<PositionedImage> =
            (0..40).map(|p| images.take(p).expect("free")).collect();
        assert!(images.take(7).is_none(), "position 7 handed out twice");
        for (p, image) in taken.iter_mut().enumerate() {
            assert!(image.as_slice().iter().all(|&b| b == 0));
            image.as_mut_slice().fill(p as u8);
            assert!(!image.is_locked());
        }
        for (p, image) in taken.iter().enumerate() {
            assert_eq!(image.as_slice().len(), 150_528);
            assert!(image.as_slice().iter().all(|&b| b == p as u8), "{p}");
        }
        // The images lie one after another.
        let starts: Vec<usize> = taken
            .iter()
            .map(|i| i.as_slice().as_ptr() as usize)
            .collect();
        assert!(starts.windows(2).all(|w| w[1] - w[0] == 150_528));
    }

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

    #[test]
    fn images_of_no_bytes_and_of_too_many_bytes() {
        let images = PositionedImages::new(0, 150_528).expect("mapped");
        assert!(images.take(0).is_none());
        assert!(PositionedImages::new(usize::MAX / 2, 150_528).is_err());
    }
}
