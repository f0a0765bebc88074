//! The CPU stage: read, decode and resize the images of one batch in parallel, each straight into
//! its place in a staging slot, and account for the ones that fail.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};

use fast_image_resize::Resizer;
use rayon::prelude::*;

use crate::config::OnError;
use crate::decode::{decode_rgb8, DecodeOptions};
use crate::error::{Error, ItemError, ItemErrorKind, Result};
use crate::resize::{resize_into_slot, Geometry};
use crate::source::Source;

/// Per-thread scratch, reused across images: the decoded pixels and the resizer's buffers.
struct Scratch {
    pixels: Vec<u8>,
    resizer: Resizer,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch {
        pixels: Vec::new(),
        resizer: Resizer::new(),
    });
}

/// How the CPU stage turns one image into output pixels.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PrepareOptions {
    pub decode: DecodeOptions,
    pub geometry: Geometry,
    pub on_error: OnError,
}

impl PrepareOptions {
    /// Bytes of one prepared image.
    pub fn image_bytes(&self) -> usize {
        self.geometry.width as usize * self.geometry.height as usize * 3
    }
}

/// Reads, decodes and resizes one image into `dst`.
pub(crate) fn prepare_one(
    source: &Source,
    index: usize,
    options: &PrepareOptions,
    dst: &mut [u8],
) -> std::result::Result<(), ItemErrorKind> {
    let bytes = source.item(index).read()?;
    SCRATCH.with(|scratch| {
        let scratch = &mut *scratch.borrow_mut();
        let decoded = decode_rgb8(&bytes, &options.decode, &mut scratch.pixels)?;
        drop(bytes);
        resize_into_slot(
            &scratch.pixels,
            decoded,
            &options.geometry,
            &mut scratch.resizer,
            dst,
        )
    })
}

/// A filled staging slot: the first `indices.len()` images of the slot are good, in order.
#[derive(Debug, Default)]
pub(crate) struct Filled {
    /// Source index of each image in the slot.
    pub indices: Vec<usize>,
    /// Images that failed, in order.
    pub skipped: Vec<ItemError>,
    /// How many entries of `order` were used.
    pub consumed: usize,
}

/// Fills `slot` with up to `batch_size` good images taken from `order` in order, skipping (or,
/// under [`OnError::Fail`], stopping at) images that fail. Runs on the current rayon pool.
/// Returns `Ok(None)` if `stop` was raised meanwhile.
pub(crate) fn fill_slot(
    slot: &mut [u8],
    order: &[usize],
    batch_size: usize,
    source: &Source,
    options: &PrepareOptions,
    stop: &AtomicBool,
) -> Result<Option<Filled>> {
    let image_bytes = options.image_bytes();
    let mut filled = Filled::default();
    let mut good = 0;
    while good < batch_size && filled.consumed < order.len() {
        let take = (batch_size - good).min(order.len() - filled.consumed);
        let chunk = &order[filled.consumed..filled.consumed + take];
        let region = &mut slot[good * image_bytes..(good + take) * image_bytes];
        let results: Vec<Option<std::result::Result<(), ItemErrorKind>>> = region
            .par_chunks_mut(image_bytes)
            .zip(chunk.par_iter())
            .map(|(dst, &index)| {
                if stop.load(Ordering::Relaxed) {
                    return None;
                }
                Some(prepare_one(source, index, options, dst))
            })
            .collect();
        // Close the gaps the failed images left, keeping the order.
        let first = good;
        for (k, result) in results.into_iter().enumerate() {
            let Some(result) = result else {
                return Ok(None);
            };
            match result {
                Ok(()) => {
                    let at = first + k;
                    if at != good {
                        slot.copy_within(
                            at * image_bytes..(at + 1) * image_bytes,
                            good * image_bytes,
                        );
                    }
                    filled.indices.push(chunk[k]);
                    good += 1;
                }
                Err(kind) => {
                    let error = ItemError {
                        id: source.item(chunk[k]).id().to_string(),
                        index: chunk[k],
                        kind,
                    };
                    if options.on_error == OnError::Fail {
                        return Err(Error::Item(error));
                    }
                    filled.skipped.push(error);
                }
            }
        }
        filled.consumed += take;
    }
    Ok(Some(filled))
}
