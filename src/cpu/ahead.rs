//! The CPU lane working ahead of the batches, beside the GPU decode lane (hybrid decoding).
//!
//! Its threads walk the epoch's order and prepare, each into a buffer of its own, the images the
//! GPU lane is not offered, and, first of all, those the GPU lane hands back (not a baseline
//! JPEG, refused, failed); a batch takes each image's buffer by its position. Both lanes so keep
//! working while batches are assembled and handed out, up to a lookahead past the batches'
//! cursor, and neither waits for the other at a batch's end. Results of an earlier epoch still
//! in flight when a new one begins are dropped.
//!
//! The buffers are page-locked images ([`PinnedImage`]) once the device has given them
//! ([`CpuAhead::add_pinned`]): a batch uploads each from where its thread wrote it. Before that
//! (while the device opens) and whenever every one of them is in use, they are ordinary memory,
//! which the batch copies into its staging.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::prepare::{ImageTask, Made};
use super::priority;
use super::stage::LaneCore;
use crate::error::{Error, ItemErrorKind, Result};
use crate::memory::{PinnedImage, PositionedImage, PositionedImages};
use crate::order::EpochOrder;
use crate::schedule::{expected_cost, ThreadPriority};
use crate::source::Source;

/// The positions of its own the lane looks at before it starts one: of them, the image expected
/// to take longest starts first.
const EXPENSIVE_FIRST: usize = 16;

/// Whether the image at a position of the order (with its source index) is offered to the GPU
/// lane: `on_gpu(position, index)`.
pub(crate) type OnGpu = Arc<dyn Fn(usize, usize) -> bool + Send + Sync>;

/// The work of one epoch.
#[derive(Clone)]
pub(crate) struct AheadWork {
    pub source: Arc<Source>,
    pub order: Arc<EpochOrder>,
    pub epoch: u64,
    /// The images the GPU lane is offered, which this lane takes only when handed back.
    pub on_gpu: OnGpu,
}

/// What became of a position: its pixels with what its random transforms drew and the bytes
/// written, or why it failed.
pub(crate) type Prepared = std::result::Result<(AheadImage, Made), ItemErrorKind>;

/// The buffer one image is prepared into.
#[derive(Debug)]
pub(crate) enum AheadImage {
    /// Ordinary memory: the batch copies it into its staging.
    Heap(Vec<u8>),
    /// Page-locked memory: the batch uploads it from here.
    Pinned(PinnedImage),
    /// The image's place among the images laid out by position while the device opened
    /// ([`CpuAhead::reach`]): the batch uploads it from there once that memory is page-locked
    /// ([`CpuAhead::positioned`]), and copies it until then.
    Positioned(PositionedImage),
}

impl AheadImage {
    /// The image's bytes.
    pub fn as_slice(&self) -> &[u8] {
        match self {
            AheadImage::Heap(bytes) => bytes,
            AheadImage::Pinned(image) => image.as_slice(),
            AheadImage::Positioned(image) => image.as_slice(),
        }
    }

    /// The image's bytes, to write.
    fn as_mut_slice(&mut self) -> &mut [u8] {
        match self {
            AheadImage::Heap(bytes) => bytes,
            AheadImage::Pinned(image) => image.as_mut_slice(),
            AheadImage::Positioned(image) => image.as_mut_slice(),
        }
    }
}

struct Current {
    work: AheadWork,
    generation: u64,
}

struct State {
    current: Option<Arc<Current>>,
    generation: u64,
    /// The next position to look at for an image the GPU lane is not offered.
    next: usize,
    /// Positions looked at, this lane's, not started yet, with their expected cost: the dearest
    /// starts first ([`EXPENSIVE_FIRST`]).
    pending: BTreeMap<usize, u64>,
    /// Positions at or past this one wait (the lookahead past the batches' cursor).
    limit: usize,
    /// Positions handed back by the GPU lane, not started yet.
    handed_back: BTreeSet<usize>,
    /// Positions handed back, started or done (so none is prepared twice).
    asked: HashSet<usize>,
    results: HashMap<usize, Prepared>,
    /// Ordinary buffers of one output image, free.
    free: Vec<Vec<u8>>,
    /// Ordinary buffers in existence (free, in flight or holding a result).
    buffers: usize,
    /// Page-locked images, free: taken before any ordinary buffer.
    pinned: Vec<PinnedImage>,
    /// Whether the lane has every page-locked image it will be given: ordinary buffers given
    /// back are freed from then on.
    pinned_complete: bool,
    /// At most this many buffers exist: `Shared::max_buffers`, or more while the lane reaches
    /// further ahead ([`CpuAhead::reach`]); buffers over it given back are freed.
    max_buffers: usize,
    /// The position the lane reaches to: once the batches pass it, the lane keeps the
    /// lookahead's buffers again.
    reach: usize,
    /// The images of the reach's positions, laid out by position, while the reach lasts.
    positioned: Option<Arc<PositionedImages>>,
    /// Those images once the reach is over: a thread of the lane lets their memory go once no
    /// image of them is left (unlocking and unmapping it takes milliseconds, which the batches'
    /// thread is spared).
    retired: Option<Arc<PositionedImages>>,
    stop: bool,
    alive: usize,
    /// Threads that may prepare images at once (the others wait), and those preparing now.
    active: usize,
    working: usize,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled when a thread may find a task: positions past the limit, a buffer, a position
    /// handed back, more threads let work, new work, a stop. Events that make one task wake one
    /// thread, so that many threads do not all wake for each image.
    tasks: Condvar,
    /// Signalled when a result is published, a thread ends, or the lane stops: what the batches
    /// wait for.
    results: Condvar,
    core: Arc<LaneCore>,
    image_bytes: usize,
    lookahead: usize,
    max_buffers: usize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while the lock is held, so a poisoned state is still whole.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait_for_task<'a>(&self, state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.tasks.wait(state).unwrap_or_else(|e| e.into_inner())
    }

    fn wait_for_result<'a>(&self, state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.results.wait(state).unwrap_or_else(|e| e.into_inner())
    }

    /// The next position to prepare, with its work and a buffer; `None` once stopping.
    fn next_task(&self) -> Option<(Arc<Current>, usize, AheadImage)> {
        let mut state = self.lock();
        loop {
            if state.stop {
                return None;
            }
            if state
                .retired
                .as_ref()
                .is_some_and(|retired| Arc::strong_count(retired) == 1)
            {
                let retired = state.retired.take();
                drop(state);
                drop(retired);
                state = self.lock();
                continue;
            }
            if state.working < state.active {
                if let Some(task) = self.take(&mut state) {
                    state.working += 1;
                    return Some(task);
                }
            }
            state = self.wait_for_task(state);
        }
    }

    fn take(&self, state: &mut State) -> Option<(Arc<Current>, usize, AheadImage)> {
        let current = state.current.clone()?;
        if state.pinned.is_empty() && state.free.is_empty() && state.buffers >= state.max_buffers {
            return None;
        }
        let position = match state.handed_back.pop_first() {
            Some(position) => position,
            None => Self::dearest_pending(state, &current.work)?,
        };
        let positioned = state.positioned.as_ref().and_then(|p| p.take(position));
        if let Some(image) = positioned {
            return Some((current, position, AheadImage::Positioned(image)));
        }
        let buffer = match state.pinned.pop() {
            Some(image) => AheadImage::Pinned(image),
            None => match state.free.pop() {
                Some(heap) => AheadImage::Heap(heap),
                None => {
                    state.buffers += 1;
                    AheadImage::Heap(vec![0u8; self.image_bytes])
                }
            },
        };
        Some((current, position, buffer))
    }

    /// Looks at positions until [`EXPENSIVE_FIRST`] of this lane's wait (within the limit), and
    /// takes the one expected to take longest (the first of equals): a batch's large WebPs and
    /// PNGs start before its small JPEGs, so that it does not wait on one started last. Which
    /// image goes to which position does not change, only when each starts.
    fn dearest_pending(state: &mut State, work: &AheadWork) -> Option<usize> {
        let order = &work.order;
        while state.pending.len() < EXPENSIVE_FIRST {
            if (state.next >= order.len() && !order.refills()) || state.next >= state.limit {
                break;
            }
            let position = state.next;
            state.next += 1;
            let index = order.get(position);
            if index.is_some_and(|index| (work.on_gpu)(position, index)) {
                continue;
            }
            let cost = index.map_or(0, |index| {
                let item = work.source.item(index);
                expected_cost(item.id(), item.size_hint())
            });
            state.pending.insert(position, cost);
            // A position the order has not planned yet is taken as it comes.
            if index.is_none() {
                break;
            }
        }
        let (&position, _) = state.pending.iter().rev().max_by_key(|(_, &cost)| cost)?;
        state.pending.remove(&position);
        Some(position)
    }

    fn publish(&self, current: &Current, position: usize, result: Prepared) {
        let mut state = self.lock();
        state.working = state.working.saturating_sub(1);
        if state.generation == current.generation {
            state.results.insert(position, result);
        } else if let Ok((buffer, _)) = result {
            // A buffer over the lane's count is freed here, under the lock: only after a
            // `reach`, while work is dropped.
            drop(state.recycle(buffer));
        }
        // The publishing thread looks for its next task itself.
        self.results.notify_all();
    }
}

/// Counts a thread out when it ends, however it ends.
struct Alive(Arc<Shared>);

impl Drop for Alive {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.alive = state.alive.saturating_sub(1);
        self.0.results.notify_all();
    }
}

/// The CPU lane's threads working ahead, and their results by position.
pub(crate) struct CpuAhead {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for CpuAhead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuAhead")
            .field("threads", &self.threads.len())
            .finish_non_exhaustive()
    }
}

impl CpuAhead {
    /// Starts `threads` threads preparing images as `core` says, up to `lookahead` positions past
    /// the batches' cursor, with at most `max_buffers` output buffers, each thread at `priority`.
    pub fn start(
        core: &Arc<LaneCore>,
        threads: usize,
        lookahead: usize,
        max_buffers: usize,
        priority: ThreadPriority,
    ) -> Result<CpuAhead> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                current: None,
                generation: 0,
                next: 0,
                pending: BTreeMap::new(),
                limit: 0,
                handed_back: BTreeSet::new(),
                asked: HashSet::new(),
                results: HashMap::new(),
                free: Vec::new(),
                buffers: 0,
                pinned: Vec::new(),
                pinned_complete: false,
                max_buffers: max_buffers.max(threads),
                reach: 0,
                positioned: None,
                retired: None,
                stop: false,
                alive: threads,
                active: threads,
                working: 0,
            }),
            tasks: Condvar::new(),
            results: Condvar::new(),
            core: core.clone(),
            image_bytes: core.output_bytes(),
            lookahead,
            max_buffers: max_buffers.max(threads),
        });
        let mut ahead = CpuAhead {
            shared: shared.clone(),
            threads: Vec::with_capacity(threads),
        };
        for i in 0..threads {
            let shared = shared.clone();
            let handle = std::thread::Builder::new()
                .name(format!("gpufeed-ahead-{i}"))
                .spawn(move || {
                    priority::apply(priority);
                    run(shared)
                })
                .map_err(|e| Error::invalid("threads", format!("cannot start the threads: {e}")));
            match handle {
                Ok(handle) => ahead.threads.push(handle),
                Err(e) => {
                    // The threads started so far are stopped by the drop.
                    let mut state = ahead.shared.lock();
                    state.alive = ahead.threads.len();
                    drop(state);
                    return Err(e);
                }
            }
        }
        Ok(ahead)
    }

    /// Starts the work of an epoch, dropping what was made for earlier work.
    pub fn begin(&self, work: AheadWork) {
        let mut state = self.shared.lock();
        let returned: Vec<AheadImage> = state
            .results
            .drain()
            .filter_map(|(_, r)| r.ok().map(|(buffer, _)| buffer))
            .collect();
        let freed: Vec<AheadImage> = returned
            .into_iter()
            .filter_map(|buffer| state.recycle(buffer))
            .collect();
        state.generation += 1;
        let order_len = work.order.len();
        state.current = Some(Arc::new(Current {
            work,
            generation: state.generation,
        }));
        state.next = 0;
        state.pending.clear();
        state.limit = self.shared.lookahead.min(order_len);
        let settled = self.shared.settle(&mut state);
        state.handed_back.clear();
        state.asked.clear();
        self.shared.tasks.notify_all();
        drop(state);
        drop(freed);
        drop(settled);
    }

    /// Lets the lane work up to `positions` positions into the current work (within its planned
    /// positions), with a buffer for each, until the batches pass them: while the pipeline's
    /// device opens and no batch can be made, the CPU threads keep working.
    ///
    /// The reach's images are laid out by position in a mapping of their own
    /// ([`PositionedImages`]), which the pipeline page-locks once the device is
    /// open (where it cannot be mapped, they go to buffers like the others).
    pub fn reach(&self, positions: usize) {
        let mut state = self.shared.lock();
        let planned = state.current.as_ref().map_or(0, |c| c.work.order.len());
        let limit = positions.min(planned);
        if state.positioned.is_none() && limit > self.shared.lookahead {
            state.positioned = PositionedImages::new(limit, self.shared.image_bytes).ok();
        }
        state.max_buffers = state.max_buffers.max(limit);
        state.reach = state.reach.max(limit);
        if limit > state.limit {
            state.limit = limit;
            self.shared.tasks.notify_all();
        }
    }

    /// Ends a [`CpuAhead::reach`] with the batches' cursor at `cursor`: the lane works up to its
    /// lookahead past the cursor again, or no further than the positions it has looked at, and
    /// keeps the buffers of their results until the batches pass them.
    pub fn end_reach(&self, cursor: usize) {
        let mut state = self.shared.lock();
        if state.reach == 0 {
            return;
        }
        let planned = state.current.as_ref().map_or(0, |c| c.work.order.len());
        let lookahead = cursor.saturating_add(self.shared.lookahead).min(planned);
        state.limit = lookahead.max(state.next);
        state.reach = state.next.max(1);
    }

    /// The batches have taken every position before `position`: the lane works up to its
    /// lookahead past it, within the epoch's planned positions (past them only when asked).
    /// Once they pass the lane's [`CpuAhead::reach`], the buffers over the lookahead's are freed.
    pub fn advance(&self, position: usize) {
        let mut state = self.shared.lock();
        let planned = state.current.as_ref().map_or(0, |c| c.work.order.len());
        let limit = position.saturating_add(self.shared.lookahead).min(planned);
        if limit > state.limit {
            state.limit = limit;
            self.shared.tasks.notify_all();
        }
        let settled = match state.reach > 0 && position >= state.reach {
            true => Some(self.shared.settle(&mut state)),
            false => None,
        };
        drop(state);
        drop(settled);
    }

    /// Position `position`, which the GPU lane was offered, comes back to this lane: it is
    /// prepared before the images ahead of it.
    pub fn hand_back(&self, position: usize) {
        self.shared.hand_back(None, position);
    }

    /// [`CpuAhead::hand_back`] as a function another lane can call from its threads, for the
    /// work begun last: positions it hands back once later work has begun are dropped (they
    /// belong to an epoch that is over).
    pub fn hand_back_fn(&self) -> Arc<dyn Fn(usize) + Send + Sync> {
        let shared = self.shared.clone();
        let generation = shared.lock().generation;
        Arc::new(move |position| shared.hand_back(Some(generation), position))
    }

    /// The image at `position` (one the GPU lane was not offered, or handed back), waiting for
    /// it; its buffer goes back with [`CpuAhead::give_back`]. `None` if the lane stopped.
    pub fn result(&self, position: usize) -> Option<Prepared> {
        let mut state = self.shared.lock();
        loop {
            if let Some(result) = state.results.remove(&position) {
                return Some(result);
            }
            if state.stop || state.alive == 0 || state.current.is_none() {
                return None;
            }
            if state.limit <= position {
                state.limit = position + 1;
                self.shared.tasks.notify_all();
            }
            state = self.shared.wait_for_result(state);
        }
    }

    /// Bytes of one of the lane's images.
    pub fn image_bytes(&self) -> usize {
        self.shared.image_bytes
    }

    /// The lane's threads.
    pub fn threads(&self) -> usize {
        self.threads.len()
    }

    /// How many of the lane's threads may prepare images at once.
    pub fn active_threads(&self) -> usize {
        self.shared.lock().active
    }

    /// At most `threads` of the lane's threads prepare images at once from now on (the others
    /// wait), so that other work (the GPU lane's host threads) has cores of its own.
    pub fn set_active_threads(&self, threads: usize) {
        let mut state = self.shared.lock();
        state.active = threads.max(1);
        self.shared.tasks.notify_all();
    }

    /// Runs `change` with the first position of the current work the lane's threads have not
    /// looked at yet, holding them from looking at more until it returns: a change of which
    /// positions the GPU lane is offered, made by `change` from that position on, applies to
    /// every position the lane looks at afterwards, and to none it took before.
    pub fn with_first_unseen<R>(&self, change: impl FnOnce(usize) -> R) -> R {
        let state = self.shared.lock();
        change(state.next)
    }

    /// Returns a result's buffer.
    pub fn give_back(&self, buffer: AheadImage) {
        self.shared.give_back(buffer);
    }

    /// The images laid out by position for the reach, with the positions the lane has looked
    /// at: what the pipeline page-locks once the device is open (see
    /// [`PositionedImages::lock`]); `None` without a reach.
    pub fn positioned(&self) -> Option<(Arc<PositionedImages>, usize)> {
        let state = self.shared.lock();
        state
            .positioned
            .clone()
            .map(|positioned| (positioned, state.next))
    }

    /// Gives the lane page-locked images to prepare into, taken before ordinary buffers; once
    /// `complete` (no more to come), the ordinary buffers are freed as they come back.
    pub fn add_pinned(&self, images: Vec<PinnedImage>, complete: bool) {
        let mut state = self.shared.lock();
        state.pinned.extend(images);
        self.shared.tasks.notify_all();
        if !complete {
            return;
        }
        state.pinned_complete = true;
        let freed = std::mem::take(&mut state.free);
        state.buffers -= freed.len();
        drop(state);
        drop(freed);
    }
}

impl Drop for CpuAhead {
    fn drop(&mut self) {
        {
            let mut state = self.shared.lock();
            state.stop = true;
            self.shared.tasks.notify_all();
            self.shared.results.notify_all();
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// One thread: prepares positions and publishes them until the lane stops.
fn run(shared: Arc<Shared>) {
    let _alive = Alive(shared.clone());
    while let Some((current, position, mut buffer)) = shared.next_task() {
        let work = &current.work;
        let result = match work.order.get(position) {
            Some(index) => {
                let task = ImageTask {
                    index,
                    epoch: work.epoch,
                    seq_len: work.order.seq_len_at(position),
                };
                let prepared = catch_unwind(AssertUnwindSafe(|| {
                    shared
                        .core
                        .prepare(&work.source, task, buffer.as_mut_slice())
                }))
                .unwrap_or_else(|_| {
                    Err(ItemErrorKind::DecoderPanic(
                        "the CPU lane panicked preparing it".into(),
                    ))
                });
                match prepared {
                    Ok(made) => Ok((buffer, made)),
                    Err(kind) => {
                        shared.give_back(buffer);
                        Err(kind)
                    }
                }
            }
            None => {
                shared.give_back(buffer);
                Err(ItemErrorKind::DecoderPanic(
                    "a position past the epoch".into(),
                ))
            }
        };
        shared.publish(&current, position, result);
    }
}

impl Shared {
    /// Position `position` back to this lane, for the work of `generation` (the current work if
    /// `None`); ignored once other work has begun.
    fn hand_back(&self, generation: Option<u64>, position: usize) {
        let mut state = self.lock();
        if generation.is_some_and(|g| g != state.generation) {
            return;
        }
        if state.asked.insert(position) {
            state.handed_back.insert(position);
            self.tasks.notify_one();
        }
    }

    /// A buffer back to the free list.
    fn give_back(&self, buffer: AheadImage) {
        let over = self.lock().recycle(buffer);
        match over {
            // Freed once the lock is released.
            Some(over) => drop(over),
            None => self.tasks.notify_one(),
        }
    }

    /// Back to the lookahead's buffers after a [`CpuAhead::reach`]: the free buffers over them,
    /// to be freed once the lock is released (the others as they are given back), and the images
    /// laid out by position retired (with any retired before, to be let go of as well).
    fn settle(&self, state: &mut State) -> Settled {
        state.reach = 0;
        state.max_buffers = self.max_buffers;
        let over = state.buffers.saturating_sub(state.max_buffers);
        let kept = state.free.len() - over.min(state.free.len());
        let freed = state.free.split_off(kept);
        state.buffers -= freed.len();
        let retired = match state.positioned.take() {
            Some(positioned) => state.retired.replace(positioned),
            None => None,
        };
        Settled {
            _freed: freed,
            _retired: retired,
        }
    }
}

/// What a [`Shared::settle`] lets go of, dropped once the lock is released.
struct Settled {
    _freed: Vec<Vec<u8>>,
    _retired: Option<Arc<PositionedImages>>,
}

impl State {
    /// A buffer back to the free list; returned instead, to be freed once the lock is released:
    /// an ordinary one while more of them exist than the lane keeps or once it has all its
    /// page-locked images, and a positioned one (each position serves once).
    fn recycle(&mut self, buffer: AheadImage) -> Option<AheadImage> {
        match buffer {
            AheadImage::Pinned(image) => {
                self.pinned.push(image);
                None
            }
            AheadImage::Heap(buffer) if self.buffers > self.max_buffers || self.pinned_complete => {
                self.buffers -= 1;
                Some(AheadImage::Heap(buffer))
            }
            AheadImage::Heap(buffer) => {
                self.free.push(buffer);
                None
            }
            positioned @ AheadImage::Positioned(_) => Some(positioned),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::options::Options;
    use crate::profile::Stopwatch;

    const LOOKAHEAD: usize = 4;
    const BUFFERS: usize = 8;

    /// The lane's threads on `images` copies of a bundled JPEG, resized to 16 x 16, begun on the
    /// epoch in order, none offered to another lane.
    fn lane(images: usize) -> CpuAhead {
        let mut options = Options::default();
        options.resize.mode = crate::ResizeMode::stretch(16, 16);
        let core = Arc::new(LaneCore::new(
            &options.decode,
            crate::geometry::Geometry::new(&options.resize),
            Arc::new(Stopwatch::default()),
        ));
        let ahead = CpuAhead::start(&core, 2, LOOKAHEAD, BUFFERS, ThreadPriority::Inherited)
            .expect("threads");
        let rocket = "assets/rocket.jpg";
        ahead.begin(AheadWork {
            source: Arc::new(Source::paths(vec![rocket; images])),
            order: Arc::new(EpochOrder::new((0..images).collect())),
            epoch: 0,
            on_gpu: Arc::new(|_, _| false),
        });
        ahead
    }

    /// Waits until the lane's threads have prepared every position they may look at.
    fn settled(ahead: &CpuAhead) -> (usize, usize, usize) {
        let started = Instant::now();
        loop {
            let state = ahead.shared.lock();
            if state.working == 0 && (state.next >= state.limit) {
                return (state.next, state.results.len(), state.buffers);
            }
            drop(state);
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the lane stalled"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Takes positions `from..to` as batches do, returning their buffers.
    fn take(ahead: &CpuAhead, from: usize, to: usize) {
        for position in from..to {
            ahead.advance(position);
            match ahead.result(position) {
                Some(Ok((buffer, _))) => ahead.give_back(buffer),
                other => panic!("position {position}: {:?}", other.map(|r| r.err())),
            }
        }
        ahead.advance(to);
    }

    #[test]
    fn the_dearest_images_looked_at_start_first_and_the_gpu_lanes_are_skipped() {
        let options = Options::default();
        let core = Arc::new(LaneCore::new(
            &options.decode,
            crate::geometry::Geometry::new(&options.resize),
            Arc::new(Stopwatch::default()),
        ));
        // No work begun: the lane's threads take nothing, and the test takes in their place.
        let ahead = CpuAhead::start(&core, 1, 64, 64, ThreadPriority::Inherited).expect("threads");
        let files = [
            "assets/rocket.jpg",         // 113 kB of JPEG
            "assets/chelsea.png",        // 241 kB of PNG
            "tests/fixtures/lossy.webp", // 11 kB of WebP
            "assets/retina.jpg",         // 270 kB of JPEG, the GPU lane's
            "assets/hubble_deep_field.jpg",
            "assets/rocket.jpg",
        ];
        let n = files.len();
        let work = AheadWork {
            source: Arc::new(Source::paths(files.to_vec())),
            order: Arc::new(EpochOrder::new((0..n).collect())),
            epoch: 0,
            on_gpu: Arc::new(|_, index| index == 3),
        };
        let cost = |k: usize| {
            let size = std::fs::metadata(files[k]).expect("file").len();
            expected_cost(files[k], size)
        };
        let mut expected: Vec<usize> = (0..n).filter(|&k| k != 3).collect();
        // Dearest first; equal ones in the order's.
        expected.sort_by_key(|&k| (std::cmp::Reverse(cost(k)), k));
        assert_eq!(expected, [4, 1, 0, 5, 2]);
        let mut state = ahead.shared.lock();
        state.limit = n;
        let taken: Vec<usize> =
            std::iter::from_fn(|| Shared::dearest_pending(&mut state, &work)).collect();
        assert_eq!(taken, expected);
        assert_eq!(state.next, n);
        // A limit stops the looking: only what lies before it competes.
        state.next = 0;
        state.limit = 2;
        assert_eq!(Shared::dearest_pending(&mut state, &work), Some(1));
        assert_eq!(Shared::dearest_pending(&mut state, &work), Some(0));
        assert_eq!(Shared::dearest_pending(&mut state, &work), None);
    }

    #[test]
    fn the_lane_works_its_lookahead_ahead_of_the_batches() {
        let ahead = lane(40);
        assert_eq!(settled(&ahead), (LOOKAHEAD, LOOKAHEAD, LOOKAHEAD));
    }

    #[test]
    fn a_reach_works_past_the_lookahead_laid_out_by_position_and_goes_once_the_batches_pass_it() {
        let ahead = lane(40);
        ahead.reach(30);
        assert_eq!(
            settled(&ahead),
            (30, 30, 0),
            "every position reached, laid out by position, no buffer"
        );
        let image = |position: usize| -> Vec<u8> {
            ahead.advance(position);
            match ahead.result(position) {
                Some(Ok((AheadImage::Positioned(image), _))) => {
                    let bytes = image.as_slice().to_vec();
                    ahead.give_back(AheadImage::Positioned(image));
                    bytes
                }
                Some(Ok((AheadImage::Heap(bytes), _))) if position >= 30 => {
                    let copy = bytes.clone();
                    ahead.give_back(AheadImage::Heap(bytes));
                    copy
                }
                other => panic!("position {position}: {:?}", other.map(|r| r.err())),
            }
        };
        let laid_out: Vec<Vec<u8>> = (0..30).map(image).collect();
        ahead.advance(30);
        {
            let state = ahead.shared.lock();
            assert_eq!(state.reach, 0, "the reach is over");
            assert!(state.positioned.is_none());
            assert!(state.buffers <= BUFFERS, "{} buffers kept", state.buffers);
            assert!(state.free.len() <= state.buffers);
        }
        // Past the reach, images go to buffers, and come out the same.
        let buffered = image(30);
        assert!(laid_out.iter().all(|bytes| *bytes == buffered));
        // No image of the reach is left: a thread of the lane lets their memory go.
        let started = Instant::now();
        while ahead.shared.lock().retired.is_some() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the reach's images were kept"
            );
            ahead.advance(31);
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_reach_ended_works_no_further_than_the_lane_had_looked() {
        let ahead = lane(40);
        ahead.reach(30);
        // Ended once the lane is past its lookahead: it takes no new position until the
        // batches come within the lookahead of the ones it has looked at.
        let started = Instant::now();
        while ahead.shared.lock().next <= LOOKAHEAD {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the lane stalled"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        ahead.end_reach(0);
        let (looked, results, _) = settled(&ahead);
        assert!((LOOKAHEAD + 1..=30).contains(&looked), "{looked}");
        assert_eq!(results, looked);
        take(&ahead, 0, looked);
        // Past the positions it had looked at, the lane works its lookahead again.
        assert_eq!(settled(&ahead).0, looked + LOOKAHEAD);
        let state = ahead.shared.lock();
        assert!(state.buffers <= BUFFERS, "{} buffers kept", state.buffers);
    }

    #[test]
    fn a_new_epoch_drops_the_reach() {
        let ahead = lane(40);
        ahead.reach(30);
        settled(&ahead);
        let rocket = "assets/rocket.jpg";
        ahead.begin(AheadWork {
            source: Arc::new(Source::paths(vec![rocket; 10])),
            order: Arc::new(EpochOrder::new((0..10).collect())),
            epoch: 1,
            on_gpu: Arc::new(|_, _| false),
        });
        assert_eq!(settled(&ahead).0, LOOKAHEAD);
        let state = ahead.shared.lock();
        assert_eq!(state.reach, 0);
        assert!(state.buffers <= BUFFERS, "{} buffers kept", state.buffers);
    }
}
