//! The CPU stage: read, decode and resize the images of one batch in parallel, each straight into
//! its place in a staging slot, and account for the ones that fail.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};

use fast_image_resize::Resizer;
use rayon::prelude::*;

use crate::config::{Config, OnError};
use crate::decode::{decode_rgb8, DecodeOptions};
use crate::error::{panic_message, Error, ItemError, ItemErrorKind, Result};
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
    /// Decode large JPEGs reduced in the DCT domain ([`Config::dct_scaling`]).
    pub dct_scaling: bool,
}

impl PrepareOptions {
    /// Bytes of one prepared image.
    pub fn image_bytes(&self) -> usize {
        self.geometry.width as usize * self.geometry.height as usize * 3
    }
}

impl PrepareOptions {
    /// The CPU-stage options of `config`.
    pub fn from_config(config: &Config) -> PrepareOptions {
        PrepareOptions {
            decode: DecodeOptions {
                max_pixels: config.max_pixels,
                exif_orientation: config.exif_orientation,
            },
            geometry: Geometry::from_config(config),
            on_error: config.on_error,
            dct_scaling: config.dct_scaling,
        }
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
    prepare_bytes(&bytes, options, dst)
}

/// Decodes and resizes one encoded image into `dst`. A panic inside a decoder (a bug the fuzzer
/// has not found) becomes this image's error instead of taking the pipeline down.
fn prepare_bytes(
    bytes: &[u8],
    options: &PrepareOptions,
    dst: &mut [u8],
) -> std::result::Result<(), ItemErrorKind> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        prepare_bytes_unguarded(bytes, options, dst)
    }))
    .unwrap_or_else(|panic| {
        Err(ItemErrorKind::Decode(format!(
            "decoder failed: {}",
            panic_message(panic.as_ref())
        )))
    })
}

/// Decodes and resizes one encoded image into `dst`, with this thread's scratch buffers.
fn prepare_bytes_unguarded(
    bytes: &[u8],
    options: &PrepareOptions,
    dst: &mut [u8],
) -> std::result::Result<(), ItemErrorKind> {
    SCRATCH.with(|scratch| {
        let scratch = &mut *scratch.borrow_mut();
        let geometry = &options.geometry;
        let max_reduction = |w: u32, h: u32| geometry.max_reduction(w, h);
        let no_reduction = |_: u32, _: u32| 1;
        let reduction: &dyn Fn(u32, u32) -> u32 = if options.dct_scaling {
            &max_reduction
        } else {
            &no_reduction
        };
        let decoded = decode_rgb8(bytes, &options.decode, reduction, &mut scratch.pixels)?;
        resize_into_slot(
            &scratch.pixels,
            decoded,
            &options.geometry,
            &mut scratch.resizer,
            dst,
        )
    })
}

/// The CPU stage on one encoded image, exactly as the pipeline runs it: sniff the format,
/// decode, resize and crop per `config` into `out`, which must hold `config.image_bytes()` bytes
/// (RGB8, rows packed). A bad image is [`Error::Item`] with the id `"<memory>"`.
///
/// ```
/// let config = gpufeed::Config::default();
/// let bytes = std::fs::read("assets/rocket.jpg")?;
/// let mut pixels = vec![0u8; config.image_bytes()];
/// gpufeed::prepare_image(&bytes, &config, &mut pixels)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn prepare_image(bytes: &[u8], config: &Config, out: &mut [u8]) -> Result<()> {
    config.validate()?;
    if out.len() != config.image_bytes() {
        return Err(Error::Config(format!(
            "output buffer holds {} bytes, one {}x{} RGB image needs {}",
            out.len(),
            config.width,
            config.height,
            config.image_bytes()
        )));
    }
    prepare_bytes(bytes, &PrepareOptions::from_config(config), out).map_err(|kind| {
        Error::Item(ItemError {
            id: "<memory>".into(),
            index: 0,
            kind,
        })
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
