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
//! Memory: a decode reserves what it holds (the decoder's planes, the file's scans destuffed and
//! the packed coefficients) from the CPU lane's decode memory budget, as the CPU lane's threads
//! reserve theirs, and waits while the others hold too much. Between files each thread keeps its decoder's planes (2 bytes
//! a coefficient and a mask word a block: about 3.1 bytes a pixel for 4:2:0, 6.2 for 4:4:4, so
//! 37 MB for a 12-megapixel 4:2:0 photo) up to [`KEPT_BYTES`], freeing them after a larger image,
//! and libjpeg-turbo's header reader.

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
use crate::coefficients::pack::pack;
use crate::coefficients::progressive::ProgressiveDecoder;
use crate::coefficients::Layout;
use crate::cpu::MemoryBudget;
use crate::profile::{Stage, Stopwatch};
use turbojpeg_region::CoefficientReader;

/// The decoder memory a thread keeps between files: enough for the planes of a 20-megapixel
/// 4:4:4 photo (about 125 MB) or a 40-megapixel 4:2:0 one. After a larger image the thread frees
/// its decoder's memory: allocating planes afresh for each image of camera size would cost their
/// page faults every time.
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
        let read = working.elapsed();
        let reservation = decode_memory.reserve(decode_bytes(&layout, jpeg.len()));
        // The clock restarts after the wait, with the header's reading counted in.
        let resumed = Instant::now();
        working = resumed.checked_sub(read).unwrap_or(resumed);
        let window = window_read(&layout, pixels_read);
        // Each component's block rows down to the window's last.
        let block_rows: Vec<u32> = (0..layout.components.len())
            .map(|c| layout.blocks(c, &window).y1)
            .collect();
        let packed = decoder
            .decode_top(jpeg, Some(&block_rows))
            .ok()
            .and_then(|coefficients| {
                buffer.clear();
                pack(&coefficients, &layout, &window, &mut buffer).ok()
            });
        if decoder.memory_bytes() > KEPT_BYTES {
            decoder.release_memory();
        }
        drop(reservation);
        Some(AssistedInput::Packed(packed?, buffer))
    });
    stopwatch.add(Stage::GpuCoefficients, working.elapsed());
    assisted
}

/// What decoding and packing an image of `layout` from a file of `file_bytes` holds at most: the
/// decoder's planes, 2 bytes a coefficient and a mask word a block, each component padded to
/// whole MCUs (at most 3 blocks more each way), its scans' destuffed data, no more than the file,
/// and the packed coefficients, no larger than the planes.
fn decode_bytes(layout: &Layout, file_bytes: usize) -> u64 {
    let planes: u64 = layout
        .components
        .iter()
        .map(|c| (u64::from(c.blocks_wide) + 3) * (u64::from(c.blocks_high) + 3) * (64 * 2 + 8))
        .sum();
    2 * planes + file_bytes as u64
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
        for (name, jpeg) in progressive_files() {
            let layout = Layout::new(reader.open(&jpeg).expect("headers").header()).expect(&name);
            let reserved = decode_bytes(&layout, jpeg.len());
            // A fresh decoder, so that what it holds is this image's alone.
            let mut decoder = ProgressiveDecoder::new();
            let coefficients = decoder.decode(&jpeg).expect(&name);
            let mut packed = Vec::new();
            let window = Window::whole(layout.width, layout.height);
            pack(&coefficients, &layout, &window, &mut packed).expect(&name);
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
