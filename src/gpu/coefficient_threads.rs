//! The lane's coefficient threads: progressive JPEGs, which the engines refuse, have their
//! coefficients decoded ([`ProgressiveDecoder`], faster than libjpeg-turbo reads them) and packed
//! ([`pack`](crate::coefficients::pack)) on a pool of CPU threads, so that the assisted path's
//! kernels do the rest (inverse DCT, upsampling, colour, resize) exactly as the CPU lane would. The
//! CPU's share of such a file is then its entropy decoding alone, where the CPU lane decodes,
//! converts and resizes it whole.
//!
//! A preparing thread hands each progressive file of its range to the pool as it reads it and
//! goes on with its next range without waiting: the last of the range's files to be decoded
//! queues their calls ([`RangeFiles`]). The pool starts at the first progressive file: a folder
//! without any never starts its threads.
//!
//! Memory: a decode reserves what it holds ([`packed_decode_bytes`]: one stripe of the decoder's
//! planes, each stripe packed as soon as it is decoded, the file's scans destuffed and the packed
//! coefficients) from the CPU lane's decode memory budget, as the CPU lane's threads reserve
//! theirs, and waits while the others hold too much. Between files each thread keeps what its
//! decoder grew to up to [`KEPT_BYTES`], freeing it after a larger image, and libjpeg-turbo's
//! header reader.

use std::cell::RefCell;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use super::call::{window_read, AssistedInput, CallImage};
use super::prepare::queue_assisted;
use super::shared::Shared;
use super::work::Work;
use crate::coefficients::progressive::{packed_decode_bytes, ProgressiveDecoder};
use crate::coefficients::Layout;
use crate::memory::MemoryBudget;
use crate::profile::{Stage, Stopwatch};
use turbojpeg_region::CoefficientReader;

/// The decoder memory a thread keeps between files (its stripe of planes, the largest file's
/// scans, the packed sections of its later components). After a larger image the thread frees
/// its decoder's memory: allocating it afresh for each image of camera size would cost its page
/// faults every time.
pub(super) const KEPT_BYTES: usize = 128 << 20;

/// The pool, made at its first use.
pub(super) struct CoefficientThreads {
    threads: usize,
    pool: OnceLock<Option<rayon::ThreadPool>>,
    decode_memory: Arc<MemoryBudget>,
}

thread_local! {
    /// A coefficient thread's decoder and header reader, made at its first file.
    static READERS: RefCell<Option<(ProgressiveDecoder, CoefficientReader)>> =
        const { RefCell::new(None) };
}

impl CoefficientThreads {
    /// A pool of `threads` threads (at least one), not started yet, whose decodes reserve their
    /// memory from `decode_memory`.
    pub fn new(threads: usize, decode_memory: Arc<MemoryBudget>) -> CoefficientThreads {
        CoefficientThreads {
            threads: threads.max(1),
            pool: OnceLock::new(),
            decode_memory,
        }
    }

    /// The budget the decodes reserve their memory from.
    pub fn decode_memory(&self) -> &Arc<MemoryBudget> {
        &self.decode_memory
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

/// `jpeg`'s coefficients decoded, and the blocks of `pixels_read` (columns, rows) packed
/// into `buffer`, on the calling thread, with what the decode holds reserved from
/// `decode_memory`; `None` if the path does not take the file (its decoder or libjpeg-turbo's
/// header reader refuses it: the CPU lane then decodes it, and reports it if it is broken). No
/// block row below those pixels is decoded. Its working time, not its wait for the budget, goes
/// to `stopwatch`, where the share between the lanes reads the cores it takes.
fn decode(
    jpeg: &[u8],
    pixels_read: (Range<u32>, Range<u32>),
    mut buffer: Vec<u8>,
    decode_memory: &MemoryBudget,
    stopwatch: &Stopwatch,
) -> Option<AssistedInput> {
    let mut working = Instant::now();
    let assisted = READERS.with_borrow_mut(|readers| {
        let (decoder, reader) = match readers {
            Some(readers) => readers,
            None => readers.insert((ProgressiveDecoder::new(), CoefficientReader::new().ok()?)),
        };
        let layout = Layout::new(reader.open(jpeg).ok()?.header()).ok()?;
        let window = window_read(&layout, pixels_read);
        let read = working.elapsed();
        let reservation = decode_memory.reserve(packed_decode_bytes(&layout, &window, jpeg.len()));
        // The clock restarts after the wait, with the header's reading counted in.
        let resumed = Instant::now();
        working = resumed.checked_sub(read).unwrap_or(resumed);
        buffer.clear();
        let packed = decoder
            .decode_packed(jpeg, &layout, &window, &mut buffer)
            .ok();
        if decoder.memory_bytes() > KEPT_BYTES {
            decoder.release_memory();
        }
        drop(reservation);
        Some(AssistedInput::Packed(packed?, buffer))
    });
    stopwatch.add(Stage::GpuCoefficients, working.elapsed());
    assisted
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

    /// Hands `image` (a progressive file) to `pool`, to be decoded into `buffer` with its memory
    /// reserved from `decode_memory`; from here on its position is answered by the range's files.
    pub fn spawn(
        &self,
        pool: &rayon::ThreadPool,
        decode_memory: &Arc<MemoryBudget>,
        image: CallImage,
        buffer: Vec<u8>,
        stopwatch: &Arc<Stopwatch>,
    ) {
        let (decode_memory, stopwatch) = (decode_memory.clone(), stopwatch.clone());
        self.0.pending.fetch_add(1, Ordering::AcqRel);
        let range = self.0.clone();
        pool.spawn(move || {
            let place = (image.position, image.slot);
            let decoded = catch_unwind(AssertUnwindSafe(|| {
                let read = image.pixels_read();
                let assisted = decode(&image.bytes, read, buffer, &decode_memory, &stopwatch);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coefficients::cases::{picture, samplings};
    use crate::coefficients::Window;
    use turbojpeg_region::{encode, Colorspace, EncodeOptions, Format, Sampling};

    /// Progressive files of every sampling the encoder makes, and gray, at a size that leaves
    /// partial MCUs.
    fn progressive_files() -> Vec<(String, Vec<u8>)> {
        let (width, height) = (517, 389);
        let pixels = picture(width, height, 7);
        let mut options: Vec<(String, EncodeOptions)> = samplings()
            .into_iter()
            .map(|(name, sampling)| {
                let options = EncodeOptions {
                    sampling,
                    progressive: true,
                    quality: 95,
                    ..EncodeOptions::default()
                };
                (name.to_string(), options)
            })
            .collect();
        options.push((
            "gray".into(),
            EncodeOptions {
                colorspace: Colorspace::Gray,
                sampling: Sampling::S444,
                progressive: true,
                ..EncodeOptions::default()
            },
        ));
        options
            .into_iter()
            .map(|(name, options)| {
                let jpeg = encode(&pixels, width, height, Format::Rgb, &options).expect("encode");
                (name, jpeg)
            })
            .collect()
    }

    #[test]
    fn a_decode_reserves_at_least_what_it_holds() {
        let mut reader = CoefficientReader::new().expect("a header reader");
        let mut files = progressive_files();
        let (width, height) = (2600, 1733);
        let options = EncodeOptions {
            progressive: true,
            quality: 95,
            ..EncodeOptions::default()
        };
        let photo = encode(
            &picture(width, height, 8),
            width,
            height,
            Format::Rgb,
            &options,
        );
        files.push(("camera-size".into(), photo.expect("encode")));
        for (name, jpeg) in files {
            let layout = Layout::new(reader.open(&jpeg).expect("headers").header()).expect(&name);
            let (w, h) = (layout.width, layout.height);
            let crop = Window {
                x: w / 6,
                y: h / 16,
                width: w * 2 / 3,
                height: h * 7 / 8,
            };
            for window in [Window::whole(w, h), crop] {
                let reserved = packed_decode_bytes(&layout, &window, jpeg.len());
                // A fresh decoder, so that what it holds is this image's alone.
                let mut decoder = ProgressiveDecoder::new();
                let mut packed = Vec::new();
                let image = decoder.decode_packed(&jpeg, &layout, &window, &mut packed);
                image.expect(&name);
                let held = (decoder.memory_bytes() + packed.capacity()) as u64;
                assert!(
                    held <= reserved,
                    "{name}: holds {held}, reserves {reserved}"
                );
                // Not far over it either: a budget that counts four times an image's memory would
                // hold back threads that fit.
                assert!(
                    reserved < 4 * held,
                    "{name}: holds {held}, reserves {reserved}"
                );
                // Against a decode into planes of the whole image (the planes, as much again for
                // the packed coefficients, and the file): never far over it, and well under it
                // for a camera-size photo's crop, the window a resize reads.
                let whole_planes: u64 = layout
                    .components
                    .iter()
                    .map(|c| u64::from((c.blocks_wide + 3) * (c.blocks_high + 3)) * (64 * 2 + 8))
                    .sum();
                let whole = 2 * whole_planes + jpeg.len() as u64;
                assert!(
                    2 * reserved <= 3 * whole,
                    "{name}, {window:?}: reserves {reserved}, a whole decode {whole}"
                );
                if name == "camera-size" && window == crop {
                    assert!(
                        2 * reserved < whole,
                        "{name}, {window:?}: reserves {reserved}, a whole decode {whole}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_decode_waiting_for_the_budget_counts_its_work_not_its_wait() {
        let (name, jpeg) = progressive_files().pop().expect("a file");
        let budget = MemoryBudget::new(1);
        let stopwatch = Stopwatch::default();
        let waited = std::time::Duration::from_secs(1);
        std::thread::scope(|scope| {
            // The budget is full until the other holder lets go.
            let held = budget.reserve(1);
            let decoding =
                scope.spawn(|| decode(&jpeg, (0..0, 0..0), Vec::new(), &budget, &stopwatch));
            std::thread::sleep(waited);
            drop(held);
            let decoded = decoding.join().expect("the decode");
            assert!(decoded.is_some(), "{name}");
        });
        let worked = stopwatch.total(Stage::GpuCoefficients);
        assert!(worked < waited / 2, "{name}: {worked:?}");
        assert!(!worked.is_zero());
    }
}
