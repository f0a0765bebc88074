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

use cudarc::driver::{sys, CudaContext};

use super::page_locked::{HostPages, HUGE_PAGE};
use crate::error::{guarded, Error, Result};

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
    pub(crate) unsafe fn run(&self, first: usize, count: usize) -> &[u8] {
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

    /// The position whose image this is.
    pub fn position(&self) -> usize {
        self.position
    }

    /// Bytes of the image.
    pub fn image_bytes(&self) -> usize {
        self.images.image_bytes
    }

    /// The images laid out by position this one is among.
    pub fn images(&self) -> &Arc<PositionedImages> {
        &self.images
    }

    /// Whether the image is page-locked: a batch may upload it from where it lies.
    pub fn is_locked(&self) -> bool {
        let end = (self.position + 1) * self.images.image_bytes;
        end <= self.images.locked_bytes.load(Ordering::Acquire)
    }
}

#[cfg(test)]
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
    fn images_of_no_bytes_and_of_too_many_bytes() {
        let images = PositionedImages::new(0, 150_528).expect("mapped");
        assert!(images.take(0).is_none());
        assert!(PositionedImages::new(usize::MAX / 2, 150_528).is_err());
    }
}
