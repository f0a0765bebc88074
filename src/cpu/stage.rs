//! The CPU lane on a batch: its images read, decoded and resized in parallel on the lane's
//! threads, each straight into its place in the batch's staging, failures accounted for.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rayon::prelude::*;

use super::normalize::NormalizeTable;
use super::prepare::{prepare_one, ImageTask, Made, PrepareOptions};
use crate::error::{Error, ItemError, ItemErrorKind, Result};
use crate::geometry::{CropDraw, Geometry};
use crate::memory::{BufferPool, MemoryBudget};
use crate::options::{DecodeOptions, OnError, ResizeOptions};
use crate::order::EpochOrder;
use crate::profile::Stopwatch;
use crate::schedule::expected_cost;
use crate::source::Source;
use crate::tensor::{HostData, NormalizedSlot};
use crate::views::LaneViews;

/// Where a batch's images go: u8 RGB HWC, one image after another, and on the CPU device also
/// their normalized copy, made by the thread that prepared each image while it is in its cache.
pub(crate) struct Staging<'a> {
    /// `batch_size` images of packed RGB8.
    pub pixels: &'a mut [u8],
    /// The batch's normalized output and how to make it, when the output lives on the host.
    pub normalized: Option<(&'a mut HostData, &'a NormalizeTable)>,
}

impl Staging<'_> {
    /// Moves image `from` to place `to` (closing the gap a failed image left).
    pub fn move_image(&mut self, from: usize, to: usize, image_bytes: usize) {
        self.pixels.copy_within(
            from * image_bytes..(from + 1) * image_bytes,
            to * image_bytes,
        );
        if let Some((data, _)) = &mut self.normalized {
            data.move_image(from, to, image_bytes);
        }
    }
}

/// A filled staging: its first `indices.len()` images are good, in order.
#[derive(Debug, Default)]
pub(crate) struct Filled {
    /// Source index of each image in the staging.
    pub indices: Vec<usize>,
    /// What each image's random transforms drew (`None` without random transforms).
    pub draws: Vec<Option<CropDraw>>,
    /// What each image's views drew, in a pipeline of views (empty otherwise).
    pub view_draws: Vec<Vec<crate::views::ViewDraw>>,
    /// Whether each image pads this rank's shard (a repeat, to keep the ranks equal).
    pub padded: Vec<bool>,
    /// Images that failed, in order.
    pub skipped: Vec<ItemError>,
    /// How many positions of the order were used.
    pub consumed: usize,
}

impl Filled {
    /// Records the outcome of image `index`, which pads the shard if `padding`: a good image
    /// joins the batch (`Ok(true)`), a bad one is listed as skipped (unless it is padding: its
    /// own position reports it), or, under [`OnError::Fail`], ends the batch with its error.
    pub fn record(
        &mut self,
        index: usize,
        padding: bool,
        outcome: std::result::Result<Option<CropDraw>, ItemErrorKind>,
        source: &Source,
        on_error: OnError,
    ) -> Result<bool> {
        match outcome {
            Ok(draw) => {
                self.indices.push(index);
                self.draws.push(draw);
                self.padded.push(padding);
                Ok(true)
            }
            Err(kind) => {
                let error = ItemError {
                    id: source.item(index).id().to_string(),
                    index,
                    kind,
                };
                if on_error == OnError::Fail {
                    return Err(Error::Item(error));
                }
                if !padding {
                    self.skipped.push(error);
                }
                Ok(false)
            }
        }
    }
}

/// Which images a batch is filled from, and how.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchRequest<'a> {
    /// The epoch's positions.
    pub order: &'a EpochOrder,
    /// The position the batch starts at.
    pub start: usize,
    /// The epoch the batch belongs to.
    pub epoch: u64,
    /// Good images wanted.
    pub batch_size: usize,
    /// The most positions the batch takes (a batch planned ahead takes its own and no more,
    /// however many of its images fail); `usize::MAX` for as many as its images need.
    pub positions: usize,
    /// Skip bad images, or stop at the first.
    pub on_error: OnError,
}

/// What became of one image (what its random transforms drew, or why it failed): `None` if it
/// was not tried because the lane was stopped.
pub(crate) type Outcome = Option<std::result::Result<Option<CropDraw>, ItemErrorKind>>;

/// How the CPU lane's threads prepare an image, and the memory they share.
#[derive(Debug)]
pub(crate) struct LaneCore {
    pub options: PrepareOptions,
    /// The decode memory budget, shared with the GPU lane's coefficient threads.
    pub budget: Arc<MemoryBudget>,
    pub buffers: BufferPool,
    /// Where the lane's read, decode and resize times go.
    pub stopwatch: Arc<Stopwatch>,
    /// Threads a large image's resize may be cut across, in bands of rows (0 or 1: its own
    /// thread alone): a server's request of fewer images than the lane's threads lends each
    /// image the threads the others leave idle ([`CpuLane::lend_threads`]).
    pub resize_threads: AtomicUsize,
    /// A pipeline of views made by lanes working ahead: each image's views written as one
    /// record ([`crate::views::ViewLayout::record_bytes`]) instead of one image.
    pub views: Option<Arc<LaneViews>>,
}

impl LaneCore {
    /// How images are prepared under `decode` to the output `geometry` plans, with the memory
    /// budget of `decode`; the stages' times go to `stopwatch`.
    pub fn new(decode: &DecodeOptions, geometry: Geometry, stopwatch: Arc<Stopwatch>) -> LaneCore {
        LaneCore {
            options: PrepareOptions::new(decode, geometry),
            budget: Arc::new(MemoryBudget::new(decode.memory_limit)),
            buffers: BufferPool::new(decode.memory_limit),
            stopwatch,
            resize_threads: AtomicUsize::new(1),
            views: None,
        }
    }

    /// The same, making each image's `views` as one record (lanes working ahead of a pipeline
    /// of views).
    pub fn with_views(mut self, views: Option<Arc<LaneViews>>) -> LaneCore {
        self.views = views;
        self
    }

    /// Bytes of what [`LaneCore::prepare`] writes for one image: an output image, or the record
    /// of its views.
    pub fn output_bytes(&self) -> usize {
        crate::views::lane_output_bytes(self.views.as_deref(), &self.options.geometry)
    }

    /// Threads an image's resize may be cut across (at least 1).
    pub fn resize_threads(&self) -> usize {
        self.resize_threads.load(Ordering::Relaxed).max(1)
    }

    /// Prepares image `task` of `source` into `dst` (one output image's place, or a record of
    /// its views: [`LaneCore::output_bytes`]); returns what its random transforms drew and the
    /// bytes it wrote.
    pub fn prepare(
        &self,
        source: &Source,
        task: ImageTask,
        dst: &mut [u8],
    ) -> std::result::Result<Made, ItemErrorKind> {
        match &self.views {
            Some(views) => super::views::prepare_record(source, task, self, views, dst),
            None => prepare_one(source, task, self, dst),
        }
    }
}

/// The CPU lane: a pool of threads and how they prepare an image.
#[derive(Debug)]
pub(crate) struct CpuLane {
    pub(super) pool: rayon::ThreadPool,
    pub(super) core: Arc<LaneCore>,
    /// A pipeline of views: how the lane makes them ([`CpuLane::fill_views`]).
    pub(super) views: Option<Arc<LaneViews>>,
}

impl CpuLane {
    /// A lane of `threads` threads (0: one per core), its images decoded under `decode` to the
    /// output `geometry` plans.
    pub fn new(
        decode: &DecodeOptions,
        geometry: Geometry,
        threads: usize,
        stopwatch: Arc<Stopwatch>,
    ) -> Result<CpuLane> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("gpufeed-cpu-{i}"))
            .build()
            .map_err(|e| Error::invalid("threads", format!("cannot start the threads: {e}")))?;
        Ok(CpuLane {
            pool,
            core: Arc::new(LaneCore::new(decode, geometry, stopwatch)),
            views: None,
        })
    }

    /// The same lane making `views` instead of one image each (a pipeline of views).
    pub fn with_views(mut self, views: Option<Arc<LaneViews>>) -> CpuLane {
        self.views = views;
        self
    }

    /// Threads of the lane.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Lends each image of the next fills of `images` images the lane's threads they leave
    /// idle: a large image's resize is cut into bands of rows on up to `threads / images`
    /// threads (the same bytes). For a server's requests; a pipeline's batches keep every
    /// thread on images of its own.
    pub fn lend_threads(&self, images: usize) {
        let threads = (self.threads() / images.max(1)).max(1);
        self.core.resize_threads.store(threads, Ordering::Relaxed);
    }

    /// Bytes of one prepared image.
    pub fn image_bytes(&self) -> usize {
        self.core.options.geometry.image_bytes()
    }

    /// Fills `staging` with up to `batch_size` good images taken from the request's positions,
    /// in order, skipping (or, under [`OnError::Fail`], stopping at) images that fail. Returns
    /// `Ok(None)` if `stop` was raised meanwhile.
    pub fn fill(
        &self,
        staging: &mut Staging<'_>,
        request: &BatchRequest<'_>,
        source: &Source,
        stop: &AtomicBool,
    ) -> Result<Option<Filled>> {
        if let Some(views) = &self.views {
            return self.fill_views(views, staging, request, source, stop);
        }
        let mut filled = Filled::default();
        let BatchRequest {
            order,
            start,
            epoch,
            batch_size,
            positions,
            on_error,
        } = *request;
        let image_bytes = self.image_bytes();
        let reach = order.reach(start).min(positions);
        let mut good = filled.indices.len();
        while good < batch_size && filled.consumed < reach {
            let take = (batch_size - good).min(reach - filled.consumed);
            let first_position = start + filled.consumed;
            let chunk: Vec<ImageTask> = (first_position..first_position + take)
                .map_while(|p| {
                    order.get(p).map(|index| ImageTask {
                        index,
                        epoch,
                        seq_len: order.seq_len_at(p),
                    })
                })
                .collect();
            if chunk.is_empty() {
                break;
            }
            let outcomes = self
                .pool
                .install(|| self.prepare_range(staging, good, &chunk, source, stop));
            // Close the gaps the failed images left, keeping the order.
            let first = good;
            for (k, outcome) in outcomes.into_iter().enumerate() {
                let Some(outcome) = outcome else {
                    return Ok(None);
                };
                let padding = order.is_padding(first_position + k);
                if filled.record(chunk[k].index, padding, outcome, source, on_error)? {
                    if first + k != good {
                        staging.move_image(first + k, good, image_bytes);
                    }
                    good += 1;
                }
            }
            filled.consumed += chunk.len();
        }
        Ok(Some(filled))
    }

    /// Prepares image `chunk[k]` into image `first + k` of `staging`, for every `k`, on every
    /// thread of the pool. The largest files go first and each thread takes the next one as it
    /// frees up, so the batch ends on small images and no thread idles long at its end (a split
    /// of the batch into fixed shares ends on whatever image is slowest).
    fn prepare_range(
        &self,
        staging: &mut Staging<'_>,
        first: usize,
        chunk: &[ImageTask],
        source: &Source,
        stop: &AtomicBool,
    ) -> Vec<Outcome> {
        let jobs = self.jobs(staging, first, chunk.len());
        let queue = JobQueue::new(jobs, chunk, source);
        let done = self
            .pool
            .install(|| self.run_queue(&queue, chunk, source, stop));
        let mut outcomes: Vec<Outcome> = (0..chunk.len()).map(|_| None).collect();
        for (k, outcome) in done {
            outcomes[k] = outcome;
        }
        outcomes
    }

    /// The destinations of images `first..first + count` of `staging`, one job each.
    fn jobs<'s>(&self, staging: &'s mut Staging<'_>, first: usize, count: usize) -> Vec<Job<'s>> {
        let image_bytes = self.image_bytes();
        let range = first * image_bytes..(first + count) * image_bytes;
        let mut normalized_slots = match &mut staging.normalized {
            Some((data, table)) => {
                let table: &NormalizeTable = table;
                let slots: Vec<_> = data
                    .image_slots(image_bytes)
                    .into_iter()
                    .skip(first)
                    .map(move |slot| (slot, table))
                    .collect();
                Some(slots.into_iter())
            }
            None => None,
        };
        staging.pixels[range]
            .chunks_mut(image_bytes)
            .enumerate()
            .map(|(k, pixels)| Job {
                k,
                pixels,
                normalized: normalized_slots.as_mut().and_then(Iterator::next),
            })
            .collect()
    }

    /// Prepares the jobs of `queue` on every thread of the pool until none is left
    /// (call it inside the pool); returns each job's outcome, by its `k` (image `chunk[k]`).
    fn run_queue(
        &self,
        queue: &JobQueue<'_>,
        chunk: &[ImageTask],
        source: &Source,
        stop: &AtomicBool,
    ) -> Vec<(usize, Outcome)> {
        let core = &*self.core;
        let per_thread: Vec<Vec<(usize, Outcome)>> = rayon::broadcast(|_| {
            let mut done = Vec::new();
            while let Some(Job {
                k,
                pixels,
                normalized,
            }) = queue.pop()
            {
                let outcome = (!stop.load(Ordering::Relaxed)).then(|| {
                    let made = core.prepare(source, chunk[k], pixels)?;
                    if let Some((slot, table)) = normalized {
                        table.write_image(pixels, slot);
                    }
                    Ok(made.draw)
                });
                done.push((k, outcome));
            }
            done
        });
        per_thread.into_iter().flatten().collect()
    }
}

/// One image's destinations in the staging: its u8 pixels and, on the CPU device, its
/// normalized copy; `k` is its place in the round.
pub(crate) struct Job<'a> {
    pub k: usize,
    pub pixels: &'a mut [u8],
    normalized: Option<(NormalizedSlot<'a>, &'a NormalizeTable)>,
}

/// The jobs of one round, shared by the lane's threads: each takes the next as it frees up, the
/// dearest first (by format and size: [`crate::schedule::expected_cost`]), so that no round
/// waits on one large WebP or PNG started last.
struct JobQueue<'a> {
    jobs: Mutex<Vec<Job<'a>>>,
}

impl<'a> JobQueue<'a> {
    /// A queue of `jobs` (image `chunk[job.k]` of `source`).
    fn new(mut jobs: Vec<Job<'a>>, chunk: &[ImageTask], source: &Source) -> JobQueue<'a> {
        let sizes: Vec<u64> = jobs
            .par_iter()
            .map(|job| {
                let item = source.item(chunk[job.k].index);
                expected_cost(item.id(), item.size_hint())
            })
            .collect();
        let mut order: Vec<usize> = (0..jobs.len()).collect();
        // Popped from the end: the smallest at the front.
        order.sort_by_key(|&i| sizes[i]);
        let mut by_index: Vec<Option<Job<'a>>> = jobs.drain(..).map(Some).collect();
        let sorted = order
            .into_iter()
            .filter_map(|i| by_index[i].take())
            .collect();
        JobQueue {
            jobs: Mutex::new(sorted),
        }
    }

    /// The next job; `None` once none is left.
    fn pop(&self) -> Option<Job<'a>> {
        // Nothing panics while the lock is held, so a poisoned queue is still whole.
        self.jobs.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }
}

/// The CPU lane on its own: reads, decodes, resizes and crops batches of a source into packed
/// RGB8 buffers on its own threads, as a pipeline's CPU stage does, for code that uploads or
/// measures the pixels itself.
///
/// ```
/// use gpufeed::{CpuStage, DecodeOptions, ResizeOptions, Source};
/// let stage = CpuStage::new(&DecodeOptions::default(), &ResizeOptions::default(), 2)?;
/// let source = Source::directory("assets")?;
/// let mut pixels = vec![0u8; 4 * stage.image_bytes()];
/// let prepared = stage.prepare_batch(&source, &[0, 1, 2, 3], &mut pixels)?;
/// assert_eq!(prepared.indices.len() + prepared.failed.len(), 4);
/// # Ok::<(), gpufeed::Error>(())
/// ```
#[derive(Debug)]
pub struct CpuStage {
    lane: CpuLane,
}

/// What [`CpuStage::prepare_batch`] made of a batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PreparedBatch {
    /// Source index of each prepared image, in the order they sit in the buffer.
    pub indices: Vec<usize>,
    /// Images that could not be prepared, with the reason.
    pub failed: Vec<ItemError>,
    /// What each prepared image's random transforms drew (epoch 0), when the resize options
    /// draw any.
    pub crops: Option<Vec<CropDraw>>,
}

impl CpuStage {
    /// A stage of `threads` threads (0: one per core).
    pub fn new(decode: &DecodeOptions, resize: &ResizeOptions, threads: usize) -> Result<CpuStage> {
        crate::Options::default()
            .decode(*decode)
            .resize(*resize)
            .validate()?;
        Ok(CpuStage {
            lane: CpuLane::new(decode, Geometry::new(resize), threads, Arc::default())?,
        })
    }

    /// Threads of the stage.
    pub fn threads(&self) -> usize {
        self.lane.threads()
    }

    /// Bytes of one prepared image (`height * width * 3`).
    pub fn image_bytes(&self) -> usize {
        self.lane.image_bytes()
    }

    /// Prepares the images `indices` of `source` into `out`, one after another; failed images
    /// are left out (the good ones close up) and listed. `out` must hold `indices.len()` images.
    pub fn prepare_batch(
        &self,
        source: &Source,
        indices: &[usize],
        out: &mut [u8],
    ) -> Result<PreparedBatch> {
        let need = indices.len() * self.image_bytes();
        if out.len() < need {
            return Err(Error::Mismatch(format!(
                "output buffer holds {} bytes, {} images need {need}",
                out.len(),
                indices.len()
            )));
        }
        if let Some(&bad) = indices.iter().find(|&&i| i >= source.len()) {
            return Err(Error::Mismatch(format!(
                "index {bad} is outside a source of {} images",
                source.len()
            )));
        }
        let mut staging = Staging {
            pixels: out,
            normalized: None,
        };
        let stop = AtomicBool::new(false);
        let order = EpochOrder::new(indices.to_vec());
        let request = BatchRequest {
            order: &order,
            start: 0,
            epoch: 0,
            batch_size: indices.len(),
            positions: usize::MAX,
            on_error: OnError::Skip,
        };
        let filled = self.lane.fill(&mut staging, &request, source, &stop)?;
        let filled = filled.unwrap_or_default();
        Ok(PreparedBatch {
            crops: filled.draws.iter().copied().collect(),
            indices: filled.indices,
            failed: filled.skipped,
        })
    }
}
