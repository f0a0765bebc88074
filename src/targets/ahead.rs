//! Batches made ahead: the rows of the next batches loaded and transformed on the rayon pool
//! while the caller uses the batch it has, each batch laid out as soon as its last row is made
//! (no thread waits for a batch's slowest row), and the batches handed out strictly in order.
//! A batch is made from its [`Key`] alone (the draws come from (seed, epoch, index)), so its
//! bytes do not depend on which thread made which row nor on how far ahead it was made; a batch
//! whose key is not the one asked for is never handed out.

use std::any::Any;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::error::ItemError;
use crate::memory::BufferPool;
use crate::options::DecodeOptions;

use super::batch::{make_batch, prepare, Made, Row, Spare};
use super::device::StagingPool;
use super::{TargetRecipe, TargetSource};

/// How many batches are made ahead when the caller does not say: enough that every thread of
/// the pool has [`AheadPolicy::ROWS_PER_THREAD`] rows in work, and at least
/// [`AheadPolicy::MIN_BATCHES`]. A row's cost varies several times over (a random resize of
/// 260 to 1040, a large photo), and a batch is laid out only once its last row is made, so a
/// few rows a thread leave threads idle. Measured on the H200 machine (16 threads, 2,048
/// ImageNet-sized JPEGs with their masks and objects, batch 16, 3 epochs, two rounds in turn):
/// 3 batches (3 rows a thread) against 6 (6 a thread) and 12: segmentation `eval` 3,532-3,987,
/// 3,860-4,446 and 3,997-4,520 images/s; `train` 4,240-4,974, 4,433-5,386 and 4,792-5,555;
/// detection `lsj` 1,481-1,556, 1,656-1,663 and 1,698-1,759. The rows' samples are held until
/// their batch is laid out, so the default's memory grows with the pool (`docs/targets.md`).
pub(crate) struct AheadPolicy;

impl AheadPolicy {
    /// Rows in work for each thread of the pool.
    pub(crate) const ROWS_PER_THREAD: usize = 6;
    /// Batches in work at least.
    pub(crate) const MIN_BATCHES: usize = 3;

    /// Batches made ahead for a pool of `threads` and batches of `batch_size` rows.
    pub(crate) fn batches(threads: usize, batch_size: usize) -> usize {
        (threads * AheadPolicy::ROWS_PER_THREAD)
            .div_ceil(batch_size.max(1))
            .max(AheadPolicy::MIN_BATCHES)
    }
}

/// Everything a batch is made from: two batches of equal keys (of one source) are equal byte
/// for byte.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Key {
    pub recipe: TargetRecipe,
    pub decode: DecodeOptions,
    pub seed: u64,
    pub epoch: u64,
    /// The rows' source indices, in order.
    pub indices: Vec<usize>,
    pub divisible: u32,
    pub pad_fill: u8,
    /// Made for the device (its rows' pixels left for the device to resample) or the host.
    pub for_device: bool,
}

/// What a batch in work ends as: the batch, or the panic of one of its rows (raised again in
/// the caller's thread, as if the row had been made there).
type Outcome = std::thread::Result<Made>;

/// One batch in work, shared by the jobs making its rows.
struct Work {
    key: Key,
    /// The position after this batch in its epoch's order.
    end: usize,
    source: Arc<TargetSource>,
    spares: Arc<Spares>,
    /// Where a batch made for the device is laid out, when its device is open.
    staging: Option<Arc<StagingPool>>,
    /// Set when the batch is no longer wanted: the rows not yet started are not made.
    dropped: AtomicBool,
    rows: Mutex<Vec<Option<Result<Row, ItemError>>>>,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// Rows not made yet: the job that makes the last one lays the batch out.
    left: AtomicUsize,
    done: Mutex<Option<Outcome>>,
    ready: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Makes row `row` of `work`; the last row made lays the batch out.
fn make_row(work: &Work, row: usize) {
    if work.dropped.load(Ordering::Relaxed) {
        return;
    }
    let k = &work.key;
    // A row loaded while the device's decoders are open leaves its JPEG to them.
    let device = work.staging.as_ref().is_some_and(|s| s.decoders_taking());
    let made = catch_unwind(AssertUnwindSafe(|| {
        prepare(
            &work.source,
            k.recipe,
            (&k.decode, device),
            (k.seed, k.epoch),
            k.indices[row],
            &work.spares.buffers,
        )
    }));
    match made {
        Ok(r) => lock(&work.rows)[row] = Some(r),
        Err(p) => {
            lock(&work.panic).get_or_insert(p);
        }
    }
    if work.left.fetch_sub(1, Ordering::AcqRel) == 1 {
        finish(work);
    }
}

/// Lays out a batch whose rows are all made (the rows' pixels in parallel, on the pool).
fn finish(work: &Work) {
    let panic = lock(&work.panic).take();
    let outcome = match panic {
        Some(p) => Err(p),
        None if work.dropped.load(Ordering::Relaxed) => return,
        None => {
            let rows = std::mem::take(&mut *lock(&work.rows));
            let spare = work.spares.take();
            let k = &work.key;
            catch_unwind(AssertUnwindSafe(|| {
                make_batch(
                    (k.epoch, &k.decode),
                    rows.into_iter().flatten(),
                    (k.divisible, k.pad_fill),
                    (spare, &work.spares.buffers),
                    (k.for_device, work.staging.as_deref()),
                )
            }))
        }
    };
    *lock(&work.done) = Some(outcome);
    work.ready.notify_all();
}

/// Waits for `work`'s batch. A thread of a rayon pool waits by running the pool's pending jobs
/// (its own rows among them: on a pool of one thread, nobody else would).
fn wait(work: &Work) -> Outcome {
    let in_pool = rayon::current_thread_index().is_some();
    let mut done = lock(&work.done);
    loop {
        if let Some(outcome) = done.take() {
            return outcome;
        }
        if !in_pool {
            done = work.ready.wait(done).unwrap_or_else(|e| e.into_inner());
            continue;
        }
        drop(done);
        let ran = rayon::yield_now() == Some(rayon::Yield::Executed);
        done = lock(&work.done);
        if !ran && done.is_none() {
            done = match work.ready.wait_timeout(done, Duration::from_millis(1)) {
                Ok((d, _)) => d,
                Err(e) => e.into_inner().0,
            };
        }
    }
}

/// Buffers of batches handed back, for the next batches to fill, and of rows laid out, for the
/// next rows' decoded pixels and masks.
#[derive(Debug)]
pub(crate) struct Spares {
    free: Mutex<Vec<Spare>>,
    /// The rows' buffers: at most [`Spares::ROW_BUFFER_BYTES`] kept free (a row's buffers
    /// grow while it is made, and a row dropped or skipped keeps its own).
    buffers: BufferPool,
}

impl Default for Spares {
    fn default() -> Spares {
        Spares {
            free: Mutex::default(),
            buffers: BufferPool::free_within(Spares::ROW_BUFFER_BYTES),
        }
    }
}

impl Spares {
    /// Bytes of the rows' buffers kept for reuse: the pixels and semantic masks of about 340
    /// ImageNet-sized or 210 COCO-sized rows, more than a 16-thread pool has in work (96 rows
    /// by default; the rows in work hold their own); larger photos' while they fit.
    const ROW_BUFFER_BYTES: u64 = 256 << 20;

    fn take(&self) -> Spare {
        lock(&self.free).pop().unwrap_or_default()
    }

    /// Keeps `spare` unless `keep` are kept already.
    fn give(&self, spare: Spare, keep: usize) {
        let mut free = lock(&self.free);
        if free.len() < keep {
            free.push(spare);
        }
    }
}

/// The batches in work, oldest first.
#[derive(Default)]
pub(crate) struct Ahead {
    queue: VecDeque<Arc<Work>>,
    spares: Arc<Spares>,
    /// The page-locked buffers batches made for the device are laid out in.
    staging: Option<Arc<StagingPool>>,
}

impl std::fmt::Debug for Ahead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ahead")
            .field("batches", &self.queue.len())
            .finish()
    }
}

impl Ahead {
    /// Batches in work.
    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    /// The position after the last batch in work.
    pub(crate) fn end(&self) -> Option<usize> {
        self.queue.back().map(|w| w.end)
    }

    /// Whether the oldest batch in work is the one of `key` (none in work: true).
    pub(crate) fn front_is(&self, key: &Key) -> bool {
        self.queue.front().is_none_or(|w| w.key == *key)
    }

    /// Starts the batch of `key`, which ends its epoch's order at `end`: one job a row.
    pub(crate) fn push(&mut self, source: &Arc<TargetSource>, key: Key, end: usize) {
        let rows = key.indices.len();
        let staging = match key.for_device {
            true => self.staging.clone(),
            false => None,
        };
        let work = Arc::new(Work {
            key,
            end,
            source: Arc::clone(source),
            spares: Arc::clone(&self.spares),
            staging,
            dropped: AtomicBool::new(false),
            rows: Mutex::new((0..rows).map(|_| None).collect()),
            panic: Mutex::new(None),
            left: AtomicUsize::new(rows),
            done: Mutex::new(None),
            ready: Condvar::new(),
        });
        if rows == 0 {
            finish(&work);
        }
        for row in 0..rows {
            let work = Arc::clone(&work);
            rayon::spawn_fifo(move || make_row(&work, row));
        }
        self.queue.push_back(work);
    }

    /// The oldest batch in work, once made; `None` when none is in work.
    pub(crate) fn take(&mut self) -> Option<Outcome> {
        let work = self.queue.pop_front()?;
        Some(wait(&work))
    }

    /// Drops every batch in work: rows not started are not made, rows being made are dropped
    /// when done. Returns at once.
    pub(crate) fn clear(&mut self) {
        for work in self.queue.drain(..) {
            work.dropped.store(true, Ordering::Relaxed);
        }
    }

    /// Lays the batches made for the device out in `pool`'s page-locked buffers from now on.
    pub(crate) fn stage_in(&mut self, pool: &Arc<StagingPool>) {
        if !self.staging.as_ref().is_some_and(|p| Arc::ptr_eq(p, pool)) {
            self.staging = Some(Arc::clone(pool));
        }
    }

    /// Keeps a handed-out batch's buffers for the next batches (at most `keep` of them).
    pub(crate) fn recycle(&self, spare: Spare, keep: usize) {
        self.spares.give(spare, keep);
    }
}

impl Drop for Ahead {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::AheadPolicy;

    #[test]
    fn batches_ahead_give_each_thread_its_rows() {
        // 16 threads, batches of 16: 96 rows, 6 batches.
        assert_eq!(AheadPolicy::batches(16, 16), 6);
        // Small batches: more of them, the same rows.
        assert_eq!(AheadPolicy::batches(16, 2), 48);
        assert_eq!(AheadPolicy::batches(16, 7), 14);
        // Few threads or large batches: never under three.
        assert_eq!(AheadPolicy::batches(2, 16), 3);
        assert_eq!(AheadPolicy::batches(16, 256), 3);
        assert_eq!(AheadPolicy::batches(1, 0), 6);
        for threads in 1..64 {
            for batch in 1..300 {
                let n = AheadPolicy::batches(threads, batch);
                assert!(n >= AheadPolicy::MIN_BATCHES);
                assert!(n * batch >= threads * AheadPolicy::ROWS_PER_THREAD);
                // No batch more than it takes.
                assert!(n == AheadPolicy::MIN_BATCHES || (n - 1) * batch < threads * 6);
            }
        }
    }
}
