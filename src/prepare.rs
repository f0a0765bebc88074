//! The CPU stage: read, decode and resize the images of one batch in parallel, each straight into
//! its place in a staging slot, and account for the ones that fail.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use fast_image_resize::Resizer;
use rayon::prelude::*;

use crate::config::{Config, OnError};
use crate::decode::{decode, DecodeOptions, DecodeWindow};
use crate::error::{panic_message, Error, ItemError, ItemErrorKind, Result};
use crate::resize::{resize_into_slot, Geometry};
use crate::source::Source;

/// Per-thread scratch, reused across images: the decoded pixels, the resizer's buffers and the
/// one-channel output of gray images.
struct Scratch {
    pixels: Vec<u8>,
    resizer: Resizer,
    gray: Vec<u8>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch {
        pixels: Vec::new(),
        resizer: Resizer::new(),
        gray: Vec::new(),
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
    /// Decode only the part of a JPEG the resize reads (same output; off only to measure it).
    pub partial_decode: bool,
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
            partial_decode: true,
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
        let window = |w: u32, h: u32| {
            let reduction = if options.dct_scaling {
                geometry.max_reduction(w, h)
            } else {
                1
            };
            DecodeWindow {
                reduction,
                region: options
                    .partial_decode
                    .then(|| geometry.source_window(w, h, reduction))
                    .flatten(),
            }
        };
        let decoded = decode(bytes, &options.decode, &window, &mut scratch.pixels)?;
        resize_into_slot(
            &scratch.pixels,
            decoded,
            geometry,
            &mut scratch.resizer,
            &mut scratch.gray,
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

/// What became of one image: `None` if it was not tried because `stop` was raised.
type Outcome = Option<std::result::Result<(), ItemErrorKind>>;

/// Prepares image `chunk[k]` of `source` into the `k`-th image of `region`, for every `k`, on every
/// thread of the current pool. The largest files go first and each thread takes the next one as
/// it frees up, so the batch ends on small images and no thread idles long at its end (a split
/// of the batch into fixed shares ends on whatever image is slowest).
fn prepare_largest_first(
    region: &mut [u8],
    chunk: &[usize],
    source: &Source,
    options: &PrepareOptions,
    stop: &AtomicBool,
) -> Vec<Outcome> {
    let sizes: Vec<u64> = chunk
        .par_iter()
        .map(|&index| source.item(index).size_hint())
        .collect();
    let mut jobs: Vec<(usize, &mut [u8])> = region
        .chunks_mut(options.image_bytes())
        .enumerate()
        .collect();
    jobs.sort_by_key(|&(k, _)| std::cmp::Reverse(sizes[k]));
    let queue = Mutex::new(jobs.into_iter());
    let per_thread: Vec<Vec<(usize, Outcome)>> = rayon::broadcast(|_| {
        let mut done = Vec::new();
        loop {
            // Nothing panics while the lock is held, so a poisoned queue is still whole.
            let job = queue.lock().unwrap_or_else(|e| e.into_inner()).next();
            let Some((k, dst)) = job else {
                break done;
            };
            let outcome = (!stop.load(Ordering::Relaxed))
                .then(|| prepare_one(source, chunk[k], options, dst));
            done.push((k, outcome));
        }
    });
    let mut outcomes: Vec<Outcome> = (0..chunk.len()).map(|_| None).collect();
    for (k, outcome) in per_thread.into_iter().flatten() {
        outcomes[k] = outcome;
    }
    outcomes
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
        let results = prepare_largest_first(region, chunk, source, options, stop);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Interpolation, ResizeMode};

    /// JPEGs of every shape the partial decode meets: the bundled photos, the JPEG fixtures
    /// (`sampling_2x1_all.jpg`, made with `cjpeg -sample 2x1,2x1,2x1`, has sampling factors
    /// libjpeg-turbo cannot crop at the MCU it reports, so it is decoded whole),
    /// ImageNet-sized crops of the photos (colour 4:2:0 and 4:4:4, and gray) at random sizes and
    /// aspect ratios, and the files of `GPUFEED_TEST_CORPUS` if set (e.g. a make-corpus folder).
    fn jpegs() -> Vec<(String, Vec<u8>)> {
        use image::codecs::jpeg::JpegEncoder;
        let mut out: Vec<(String, Vec<u8>)> = Vec::new();
        let mut read_dir = |dir: &std::path::Path| {
            let mut stack = vec![dir.to_path_buf()];
            while let Some(d) = stack.pop() {
                for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                    let path = entry.path();
                    let name = path.to_string_lossy().to_lowercase();
                    if path.is_dir() {
                        stack.push(path);
                    } else if name.ends_with(".jpg") || name.ends_with(".jpeg") {
                        out.push((name, std::fs::read(&path).expect("read")));
                    }
                }
            }
        };
        read_dir(std::path::Path::new("assets"));
        read_dir(std::path::Path::new("tests/fixtures"));
        if let Ok(dir) = std::env::var("GPUFEED_TEST_CORPUS") {
            read_dir(std::path::Path::new(&dir));
        }
        let photo = image::open("assets/astronaut.png")
            .expect("photo")
            .to_rgb8();
        let photo = image::imageops::resize(&photo, 1000, 900, image::imageops::Triangle);
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |n: u32| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as u32
        };
        for i in 0..24 {
            let (w, h) = (100 + next(700), 60 + next(700));
            let (x, y) = (next(photo.width() - w), next(photo.height() - h));
            let crop = image::imageops::crop_imm(&photo, x, y, w, h).to_image();
            let mut bytes = Vec::new();
            let mut encoder = JpegEncoder::new_with_quality(&mut bytes, 75 + (i % 20) as u8);
            if i % 4 == 3 {
                let gray = image::DynamicImage::ImageRgb8(crop).to_luma8();
                encoder.encode_image(&gray).expect("encode");
            } else {
                encoder.encode_image(&crop).expect("encode");
            }
            out.push((format!("synthetic {w}x{h} #{i}"), bytes));
        }
        out
    }

    /// Decoding only the window the resize reads gives the very bytes of decoding everything,
    /// for every filter, other sizes, and with DCT scaling.
    #[test]
    fn partial_decode_is_exact() {
        let configs = [
            Config::default(),
            Config {
                interpolation: Interpolation::Lanczos,
                ..Config::default()
            },
            Config {
                interpolation: Interpolation::Bicubic,
                dct_scaling: true,
                ..Config::default()
            },
            Config {
                interpolation: Interpolation::Nearest,
                ..Config::default()
            },
            Config {
                resize_mode: ResizeMode::ShorterSideThenCenterCrop { shorter_side: 160 },
                height: 128,
                width: 96,
                dct_scaling: true,
                ..Config::default()
            },
        ];
        let files = jpegs();
        let mut compared = 0;
        for config in &configs {
            let whole = PrepareOptions {
                partial_decode: false,
                ..PrepareOptions::from_config(config)
            };
            let partial = PrepareOptions::from_config(config);
            assert!(partial.partial_decode);
            let mut a = vec![0u8; config.image_bytes()];
            let mut b = vec![1u8; config.image_bytes()];
            for (name, bytes) in &files {
                let ra = prepare_bytes(bytes, &whole, &mut a);
                let rb = prepare_bytes(bytes, &partial, &mut b);
                assert_eq!(ra.is_ok(), rb.is_ok(), "{name}");
                if ra.is_ok() {
                    assert!(a == b, "{name}: partial decode differs ({config:?})");
                    compared += 1;
                }
            }
        }
        assert!(compared >= configs.len() * 30, "only {compared} compared");
    }

    /// A gray JPEG resized as one channel equals the same image resized as RGB.
    #[test]
    fn gray_jpegs_resize_as_one_channel_exactly() {
        let jpeg = std::fs::read("tests/fixtures/gray.jpg").expect("fixture");
        let options = PrepareOptions::from_config(&Config::default());
        let mut one_channel = vec![0u8; options.image_bytes()];
        prepare_bytes(&jpeg, &options, &mut one_channel).expect("gray path");
        // The same gray pixels spread to RGB and resized as RGB.
        let mut gray = Vec::new();
        let decoded = decode(
            &jpeg,
            &options.decode,
            &|_, _| DecodeWindow::WHOLE,
            &mut gray,
        )
        .expect("decode");
        assert_eq!(decoded.channels, 1);
        let rgb: Vec<u8> = gray.iter().flat_map(|&g| [g, g, g]).collect();
        let mut three_channels = vec![0u8; options.image_bytes()];
        resize_into_slot(
            &rgb,
            crate::decode::Decoded {
                channels: 3,
                ..decoded
            },
            &options.geometry,
            &mut Resizer::new(),
            &mut Vec::new(),
            &mut three_channels,
        )
        .expect("rgb resize");
        assert!(one_channel == three_channels);
    }
}
