//! The lane's coefficient threads: progressive JPEGs, which the engines refuse, have their
//! coefficients decoded ([`ProgressiveDecoder`], faster than libjpeg-turbo reads them) and packed
//! ([`pack`]) on a pool of CPU threads, so that the assisted path's kernels do the rest (inverse
//! DCT, upsampling, colour, resize) exactly as the CPU lane would. The CPU's share of such a file
//! is then its entropy decoding alone, where the CPU lane decodes, converts and resizes it whole.
//!
//! A preparing thread hands each progressive file of its range to the pool as it reads it and
//! goes on with its next range without waiting: the last of the range's files to be decoded
//! queues their calls ([`RangeFiles`]). The pool starts at the first progressive file: a folder
//! without any never starts its threads.
//!
//! Memory: each thread keeps a decoder whose coefficient planes grow to the largest image it
//! decoded (2 bytes a coefficient and a mask word a block: about 3.1 bytes a pixel for 4:2:0,
//! 6.2 for 4:4:4, so 37 MB for a 12-megapixel 4:2:0 photo), and libjpeg-turbo's header reader.

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use super::call::{AssistedInput, CallImage};
use super::prepare::queue_assisted;
use super::shared::Shared;
use super::work::Work;
use crate::coefficients::pack::pack;
use crate::coefficients::progressive::ProgressiveDecoder;
use crate::coefficients::{Layout, Window};
use crate::profile::{Stage, Stopwatch};
use turbojpeg_region::CoefficientReader;

/// The pool, made at its first use.
pub(super) struct CoefficientThreads {
    threads: usize,
    pool: OnceLock<Option<rayon::ThreadPool>>,
}

thread_local! {
    /// A coefficient thread's decoder and header reader, made at its first file.
    static READERS: RefCell<Option<(ProgressiveDecoder, CoefficientReader)>> =
        const { RefCell::new(None) };
}

impl CoefficientThreads {
    /// A pool of `threads` threads (at least one), not started yet.
    pub fn new(threads: usize) -> CoefficientThreads {
        CoefficientThreads {
            threads: threads.max(1),
            pool: OnceLock::new(),
        }
    }

    /// The pool, started at the first call; `None` if its threads cannot start (progressive
    /// files then go to the CPU lane).
    pub fn pool(&self) -> Option<&rayon::ThreadPool> {
        self.pool
            .get_or_init(|| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(self.threads)
                    .thread_name(|i| format!("gpufeed-coefficients-{i}"))
                    .build()
                    .ok()
            })
            .as_ref()
    }
}

/// `image`'s coefficients decoded and packed (the whole image) into `buffer`, on the calling
/// thread; `None` if the path does not take the file (its decoder or libjpeg-turbo's header
/// reader refuses it: the CPU lane then decodes it, and reports it if it is broken).
fn decode(image: &CallImage, mut buffer: Vec<u8>) -> Option<AssistedInput> {
    READERS.with_borrow_mut(|readers| {
        let (decoder, reader) = match readers {
            Some(readers) => readers,
            None => readers.insert((ProgressiveDecoder::new(), CoefficientReader::new().ok()?)),
        };
        let layout = Layout::new(reader.open(&image.bytes).ok()?.header()).ok()?;
        let coefficients = decoder.decode(&image.bytes).ok()?;
        buffer.clear();
        let window = Window::whole(layout.width, layout.height);
        let packed = pack(&coefficients, &layout, &window, &mut buffer).ok()?;
        Some(AssistedInput::Packed(packed, buffer))
    })
}

/// The progressive files of one range on their way through the coefficient threads: the last
/// one decoded (or the preparing thread, if it finishes the range later) queues their calls and
/// publishes the positions refused, so that every position handed here is answered once.
pub(super) struct RangeFiles {
    shared: Arc<Shared>,
    work: Arc<Work>,
    /// Files still being decoded, and one while the preparing thread reads the range.
    pending: AtomicUsize,
    done: Mutex<Decoded>,
}

/// A range's progressive files decoded so far, and the positions (with their slots) of those the
/// path refused.
#[derive(Default)]
struct Decoded {
    images: Vec<CallImage>,
    refused: Vec<(usize, u32)>,
}

/// The preparing thread's hold on a [`RangeFiles`]: given up when dropped, however the range's
/// preparation ends.
pub(super) struct RangeHold(Arc<RangeFiles>);

impl RangeHold {
    /// A hold on the progressive files of a range of `work`.
    pub fn new(shared: Arc<Shared>, work: Arc<Work>) -> RangeHold {
        RangeHold(Arc::new(RangeFiles {
            shared,
            work,
            pending: AtomicUsize::new(1),
            done: Mutex::new(Decoded::default()),
        }))
    }

    /// Hands `image` (a progressive file) to `pool`, to be decoded into `buffer`; from here on
    /// its position is answered by the range's files.
    pub fn spawn(
        &self,
        pool: &rayon::ThreadPool,
        image: CallImage,
        buffer: Vec<u8>,
        stopwatch: Arc<Stopwatch>,
    ) {
        self.0.pending.fetch_add(1, Ordering::AcqRel);
        let range = self.0.clone();
        pool.spawn(move || {
            let place = (image.position, image.slot);
            let decoded = catch_unwind(AssertUnwindSafe(|| {
                let decoding = Instant::now();
                let assisted = decode(&image, buffer);
                stopwatch.add(Stage::GpuCoefficients, decoding.elapsed());
                (image, assisted)
            }));
            {
                let mut done = range.done.lock().unwrap_or_else(|e| e.into_inner());
                match decoded {
                    Ok((mut image, Some(assisted))) => {
                        image.assisted = Some(assisted);
                        done.images.push(image);
                    }
                    _ => done.refused.push(place),
                }
            }
            range.one_done();
        });
    }
}

impl Drop for RangeHold {
    fn drop(&mut self) {
        self.0.one_done();
    }
}

impl RangeFiles {
    /// One file decoded (or the preparing thread done): the last queues the range's calls.
    fn one_done(&self) {
        if self.pending.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let done = std::mem::take(&mut *self.done.lock().unwrap_or_else(|e| e.into_inner()));
        queue_assisted(&self.shared, &self.work, done.images, done.refused);
    }
}
