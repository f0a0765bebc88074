//! What the lane's threads and the pipeline share: the current work, the ranges handed out, the
//! calls prepared, the results by position, and the free slots of the ring.
//!
//! Ranges are handed out in order, to whichever preparing thread is free, as long as their first
//! position is within the lookahead past the batches' cursor and the ring has a slot for each
//! offered image of the range. Prepared calls wait in a queue (at most one per submitting thread)
//! and are taken in order by whichever submitting thread is free. A slot goes back to the free list
//! once the pipeline's stream is past its last reader
//! ([`Runner::release`](super::runner::Runner::release)); the thread that writes it next makes its
//! own stream wait for that point first. Work of an earlier epoch still in flight when a new one
//! begins is dropped: calls still queued at once, calls being decoded once their thread's stream is
//! done with them.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use cudarc::driver::{CudaEvent, CudaStream};

use crate::error::{Error, Result};

use super::call::{Call, EngineCalls, Path};
use super::screen::LaneScreen;
use super::work::{span, wait_for_all, LaneOutput, LaneResult, LaneWork, Work, CHUNK};
use crate::profile::{Stage, Stopwatch};
use crate::schedule::LaneActivity;

/// The sizes the runner is started with, and where its threads' times go.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    /// Where the lane's threads' times go.
    pub stopwatch: Arc<Stopwatch>,
    /// Slots of the ring.
    pub slots: usize,
    /// Bytes of one output image (one slot).
    pub image_bytes: usize,
    /// Positions past the batches' cursor the threads may work on.
    pub lookahead: usize,
    /// Files larger than this are left to the CPU lane.
    pub max_file_bytes: u64,
    /// Calls prepared and waiting for a submitting thread, at most, per path
    /// ([`Path::index`]).
    pub queued_calls: [usize; 2],
    /// How the engines' calls are cut.
    pub engine_calls: EngineCalls,
    /// Of the images of 1 Mpx or more the assisted path may take, the share it is given (0:
    /// none)...
    pub assisted_share: f32,
    /// ...and of the smaller ones (0: the engines take them all).
    pub small_files_assisted_share: f32,
    /// Pixels one assisted call holds at most (its decoders' buffers).
    pub assisted_call_pixels: u64,
    /// Whether the lane serves requests ([`super::GpuLaneConfig::requests`]): a request's
    /// images are then cut into a range for each preparing thread, so that they are read,
    /// planned and decoded side by side (the assisted path's calls on as many submitting
    /// threads) rather than one after another in one range.
    pub requests: bool,
}

/// Of `images` offered images, about how many a range of a request offers: a share for each
/// of `preparing` preparing threads, at most [`CHUNK`].
fn request_range(images: usize, preparing: usize) -> usize {
    images.div_ceil(preparing.max(1)).clamp(1, CHUNK)
}

/// A range handed to a preparing thread: its offered positions (with their source indices) and
/// a ring slot reserved for each.
pub(crate) struct Job {
    pub work: Arc<Work>,
    pub positions: Vec<(usize, usize)>,
    pub slots: Vec<u32>,
}

/// Read buffers kept for reuse, at most this many.
const KEPT_BUFFERS: usize = 512;

struct State {
    work: Option<Arc<Work>>,
    generation: u64,
    /// The next range to hand out (its first position is `next_range * span`).
    next_start: usize,
    /// Ranges starting at or past this position wait.
    limit: usize,
    /// Calls prepared, oldest first, for the submitting threads.
    calls: VecDeque<Call>,
    results: HashMap<usize, LaneResult>,
    free: Vec<u32>,
    /// Read buffers the submitting threads are done with, for the preparing threads.
    buffers: Vec<Vec<u8>>,
    stop: bool,
    /// Preparing and submitting threads still running.
    preparing: usize,
    submitting: usize,
    /// Whether each path ([`Path::index`]) has submitting threads (or will have: the engines'
    /// open beside the first batches); a call of a closed path is refused whole.
    open_paths: [bool; 2],
    /// Submitting threads started on each path ([`Path::index`]).
    path_threads: [usize; 2],
    /// Positions of the current work published decoded, and refused (the CPU lane takes
    /// those), since the lane started.
    decoded: u64,
    refused: u64,
}

/// What the threads and the pipeline share.
pub(crate) struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    /// Recorded on the pipeline's stream after the last use of every slot in the free list.
    released: CudaEvent,
    pub screen: LaneScreen,
    pub limits: Limits,
    /// Address of the ring's first slot.
    pub ring: u64,
    /// Nanoseconds each path's ([`Path::index`]) submitting threads spent on calls.
    call_nanos: [AtomicU64; 2],
    /// Whether the engines' sets decode gray files. Where the engines open beside the lane,
    /// their gray decoders are made after every set's colour one (1-2 s later with four
    /// processes making theirs), and until then the assisted path takes the gray files.
    grays_on_engines: AtomicBool,
    /// The calls that failed, whose images the CPU lane decoded instead.
    failed: Mutex<FailedCalls>,
}

/// Calls of the lane that failed (a driver or kernel error, or a panic) since it opened: their
/// images go to the CPU lane, whose inverse DCT may differ from the JPEG engines'. Counted and
/// the first one's error kept, so that the lane's description says so.
#[derive(Debug, Default)]
pub(crate) struct FailedCalls {
    calls: u64,
    images: u64,
    first: Option<String>,
}

impl FailedCalls {
    /// Counts a call of `images` images that failed with `error`.
    pub fn add(&mut self, images: usize, error: &str) {
        self.calls += 1;
        self.images += images as u64;
        if self.first.is_none() {
            self.first = Some(error.to_string());
        }
    }

    /// The failures in words, for the lane's description (`None`: there were none).
    pub fn note(&self) -> Option<String> {
        let first = self.first.as_deref()?;
        let calls = match self.calls {
            1 => "1 call".to_string(),
            n => format!("{n} calls"),
        };
        Some(format!(
            "{calls} of the GPU lane failed, their {} images decoded by the CPU lane (the first: \
             {first})",
            self.images
        ))
    }
}

impl Shared {
    /// The state of a lane whose ring has `limits.slots` free slots at `ring`, run by
    /// `preparing` preparing threads; its submitting threads, and the paths they open, are
    /// counted in as they start ([`Shared::submitting_thread_added`]).
    pub fn new(
        screen: LaneScreen,
        limits: Limits,
        ring: u64,
        released: CudaEvent,
        preparing: usize,
    ) -> Shared {
        Shared {
            state: Mutex::new(State {
                work: None,
                generation: 0,
                next_start: 0,
                limit: 0,
                calls: VecDeque::new(),
                results: HashMap::new(),
                free: (0..limits.slots as u32).rev().collect(),
                buffers: Vec::new(),
                stop: false,
                preparing,
                submitting: 0,
                open_paths: [false; 2],
                path_threads: [0; 2],
                decoded: 0,
                refused: 0,
            }),
            changed: Condvar::new(),
            released,
            screen,
            limits,
            ring,
            call_nanos: Default::default(),
            grays_on_engines: AtomicBool::new(true),
            failed: Mutex::new(FailedCalls::default()),
        }
    }

    /// Counts a call of `images` images that failed with `error` (the CPU lane takes them).
    pub fn call_failed(&self, images: usize, error: &str) {
        self.failed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .add(images, error);
    }

    /// The lane's failed calls in words (`None`: none failed).
    pub fn failed_calls_note(&self) -> Option<String> {
        self.failed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .note()
    }

    /// Whether gray files go to the engines' calls (their gray decoders made), rather than to
    /// the assisted path.
    pub fn grays_on_engines(&self) -> bool {
        self.grays_on_engines.load(Ordering::Acquire)
    }

    /// Says whether the engines' gray decoders are made (each sent to its set, which takes it
    /// in at its next call of gray files).
    pub fn set_grays_on_engines(&self, made: bool) {
        self.grays_on_engines.store(made, Ordering::Release);
    }

    /// Adds a call's time on `path` to the lane's activity (and to the profile's
    /// [`Stage::GpuCall`]).
    pub fn add_call_time(&self, path: Path, elapsed: Duration) {
        self.limits.stopwatch.add(Stage::GpuCall, elapsed);
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.call_nanos[path.index()].fetch_add(nanos, Ordering::Relaxed);
    }

    /// How busy the lane has been since it started.
    pub fn activity(&self) -> LaneActivity {
        let state = self.lock();
        let calls =
            [0, 1].map(|p| Duration::from_nanos(self.call_nanos[p].load(Ordering::Relaxed)));
        LaneActivity {
            decoded: state.decoded,
            refused: state.refused,
            preparing: self.limits.stopwatch.total(Stage::GpuPrepare),
            preparing_threads: state.preparing,
            calls,
            call_threads: state.path_threads,
            coefficients: self.limits.stopwatch.total(Stage::GpuCoefficients),
        }
    }

    /// Tells every thread to stop.
    pub fn stop(&self) {
        self.lock().stop = true;
        self.changed.notify_all();
    }

    /// Counts in a submitting thread about to start on `path`, which opens the path.
    pub fn submitting_thread_added(&self, path: Path) {
        let mut state = self.lock();
        state.submitting += 1;
        state.open_paths[path.index()] = true;
        state.path_threads[path.index()] += 1;
        self.changed.notify_all();
    }

    /// Whether `path` takes calls (has submitting threads).
    pub fn is_open(&self, path: Path) -> bool {
        self.lock().open_paths[path.index()]
    }

    /// Closes `path` again: its calls are refused.
    pub fn close_path(&self, path: Path) {
        self.lock().open_paths[path.index()] = false;
        self.changed.notify_all();
    }

    /// Counts a thread out (`submitting`: a submitting thread, else a preparing one).
    pub fn thread_ended(&self, submitting: bool) {
        let mut state = self.lock();
        match submitting {
            true => state.submitting = state.submitting.saturating_sub(1),
            false => state.preparing = state.preparing.saturating_sub(1),
        }
        self.changed.notify_all();
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while the lock is held, so a poisoned state is still whole.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed.wait(state).unwrap_or_else(|e| e.into_inner())
    }

    /// The next range for a preparing thread, waiting until there is one; `None` once the lane
    /// stops.
    pub fn next_range(&self) -> Option<Job> {
        let mut state = self.lock();
        loop {
            if state.stop {
                return None;
            }
            // While the engines are open a range offers about a call of theirs (more for large
            // files); else about an assisted call.
            let images = match state.open_paths[Path::Engines.index()] {
                true => self.limits.engine_calls.images,
                false if self.limits.requests => {
                    let offered = state.work.as_ref().map_or(CHUNK, |w| w.lane.order.len());
                    request_range(offered, super::PREPARING_THREADS)
                }
                false => CHUNK,
            };
            if let Some(job) = take_range(&mut state, images) {
                return Some(job);
            }
            state = self.wait(state);
        }
    }

    /// Hands `call` to the submitting threads of its path (waiting while [`Limits::queued_calls`]
    /// of its path wait already) and publishes `refused` (positions of the call's range the engines
    /// will not take, with their slots). A call of stale work is dropped.
    pub fn queue_call(&self, call: Call, refused: Vec<(usize, u32)>) {
        self.refuse(&call.work, refused);
        let mut state = self.lock();
        loop {
            if state.stop {
                return;
            }
            if state.generation != call.work.generation {
                drop_call(&mut state, call);
                self.changed.notify_all();
                return;
            }
            if !state.open_paths[call.path.index()] {
                drop(state);
                self.refuse_call(call);
                return;
            }
            let waiting = state.calls.iter().filter(|c| c.path == call.path).count();
            if waiting < self.limits.queued_calls[call.path.index()] {
                state.calls.push_back(call);
                self.changed.notify_all();
                return;
            }
            state = self.wait(state);
        }
    }

    /// Refuses every image of a call that was never submitted (their slots never written) and
    /// takes its read buffers back.
    fn refuse_call(&self, call: Call) {
        let mut entries = Vec::with_capacity(call.images.len());
        let mut buffers = Vec::with_capacity(call.images.len());
        for image in call.images {
            entries.push((image.position, image.slot, LaneResult::Refused));
            buffers.extend(image.into_buffers());
        }
        self.publish(&call.work, entries, None);
        keep_buffers(&mut self.lock(), buffers);
    }

    /// Publishes positions the engines do not take (their slots never written).
    pub fn refuse(&self, work: &Arc<Work>, refused: Vec<(usize, u32)>) {
        if refused.is_empty() {
            return;
        }
        let entries = refused
            .into_iter()
            .map(|(position, slot)| (position, slot, LaneResult::Refused))
            .collect();
        self.publish(work, entries, None);
    }

    /// Moves read buffers the submitting threads gave back into `into`.
    pub fn take_buffers(&self, into: &mut Vec<Vec<u8>>) {
        let mut state = self.lock();
        let keep = state.buffers.len().saturating_sub(CHUNK);
        into.extend(state.buffers.drain(keep..));
    }

    /// The next prepared call of `path` for the thread of `stream`, waiting until there is one,
    /// and whether `stream` was made to wait for the last readers of the call's slots (if that
    /// wait could not be queued, nothing of the call may be written); `None` once the lane
    /// stops.
    pub fn next_call(&self, stream: &Arc<CudaStream>, path: Path) -> Option<(Call, bool)> {
        let mut state = self.lock();
        loop {
            if state.stop {
                return None;
            }
            let next = state.calls.iter().position(|call| call.path == path);
            if let Some(call) = next.and_then(|at| state.calls.remove(at)) {
                self.changed.notify_all();
                // The slots may have been read by batches until lately: this thread's stream
                // waits for the pipeline's to be past them before writing.
                let ordered = stream.wait(&self.released).is_ok();
                return Some((call, ordered));
            }
            state = self.wait(state);
        }
    }

    /// Publishes a call's results (one per image), or drops them if the work is stale, and
    /// takes its read buffers back.
    pub fn finish_call(&self, call: Call, results: Vec<LaneResult>, stream: &Arc<CudaStream>) {
        let mut entries = Vec::with_capacity(call.images.len());
        let mut buffers = Vec::with_capacity(call.images.len());
        for (image, result) in call.images.into_iter().zip(results) {
            entries.push((image.position, image.slot, result));
            buffers.extend(image.into_buffers());
        }
        self.publish(&call.work, entries, Some(stream));
        keep_buffers(&mut self.lock(), buffers);
    }

    /// Publishes results by position (their slots given back where refused), or drops them
    /// if `work` is stale; `written_on` is the stream that may still write their slots.
    fn publish(
        &self,
        work: &Arc<Work>,
        entries: Vec<(usize, u32, LaneResult)>,
        written_on: Option<&Arc<CudaStream>>,
    ) {
        let mut state = self.lock();
        if state.generation != work.generation {
            if let Some(stream) = written_on {
                drop(state);
                // The slots may still be written by this stream: wait for it before freeing them.
                let _ = stream.synchronize();
                state = self.lock();
            }
            state.free.extend(entries.iter().map(|&(_, slot, _)| slot));
            self.changed.notify_all();
            return;
        }
        let published = entries.len();
        let mut refused = Vec::new();
        for (position, slot, result) in entries {
            if let LaneResult::Refused = result {
                // Never written, or written on the submitting thread's stream only, which the
                // next writer of the slot waits for (its own stream, or `released` after this
                // stream's later work).
                state.free.push(slot);
                refused.push(position);
            }
            state.results.insert(position, result);
        }
        state.refused += refused.len() as u64;
        state.decoded += (published - refused.len()) as u64;
        self.changed.notify_all();
        drop(state);
        if let Some(hand_back) = &work.lane.refused {
            for position in refused {
                hand_back(position);
            }
        }
    }

    /// Starts `work`, dropping the results of earlier work (their slots come back once
    /// `stream` is past the work that made them).
    pub fn begin(&self, stream: &Arc<CudaStream>, work: LaneWork) -> Result<()> {
        let mut state = self.lock();
        let dropped: Vec<LaneOutput> = state
            .results
            .drain()
            .filter_map(|(_, result)| match result {
                LaneResult::Decoded(output) => Some(output),
                _ => None,
            })
            .collect();
        if !dropped.is_empty() {
            wait_for_all(stream, dropped.iter())?;
            self.released
                .record(stream)
                .map_err(|e| Error::cuda("recording the GPU lane's release", e))?;
            state.free.extend(dropped.iter().map(|output| output.slot));
        }
        // Calls prepared for earlier work and not submitted: never written.
        while let Some(call) = state.calls.pop_front() {
            drop_call(&mut state, call);
        }
        state.generation += 1;
        let order_len = work.order.len();
        // The lookahead runs from the first position the lane is offered: where the CPU lane
        // took every position before it (the images it finished while the device opened), the
        // lane works on its own ahead of them while the batches take them.
        let first = work.share.first_offered();
        state.work = Some(Arc::new(Work {
            lane: work,
            generation: state.generation,
        }));
        state.next_start = 0;
        state.limit = first.saturating_add(self.limits.lookahead).min(order_len);
        self.changed.notify_all();
        Ok(())
    }

    /// The batches have taken every position before `position`: the lane works up to its
    /// lookahead past it (or past the first position it is offered, if later), within the
    /// epoch's planned positions (past them only when asked).
    pub fn advance(&self, position: usize) {
        let mut state = self.lock();
        let planned = state.work.as_ref().map_or(0, |w| w.lane.order.len());
        let limit = position.saturating_add(self.limits.lookahead).min(planned);
        if limit > state.limit {
            state.limit = limit;
            self.changed.notify_all();
        }
    }

    /// The result of offered position `position`, waiting for it. A position the lane was not
    /// offered, or any position once its threads have ended, is [`LaneResult::Refused`].
    pub fn result(&self, position: usize) -> LaneResult {
        let mut state = self.lock();
        loop {
            if let Some(result) = state.results.remove(&position) {
                return result;
            }
            let Some(work) = state.work.clone() else {
                return LaneResult::Refused;
            };
            let is_offered = work
                .lane
                .order
                .get(position)
                .is_some_and(|index| work.lane.share.offers(position, index));
            if !is_offered || state.preparing == 0 || state.submitting == 0 || state.stop {
                return LaneResult::Refused;
            }
            if state.limit <= position {
                state.limit = position + 1;
                self.changed.notify_all();
            }
            state = self.wait(state);
        }
    }

    /// Frees the slots of `outputs` once `stream` is past every use of them queued so far.
    pub fn release(
        &self,
        stream: &Arc<CudaStream>,
        outputs: impl IntoIterator<Item = LaneOutput>,
    ) -> Result<()> {
        let slots: Vec<u32> = outputs.into_iter().map(|o| o.slot).collect();
        if slots.is_empty() {
            return Ok(());
        }
        let mut state = self.lock();
        self.released
            .record(stream)
            .map_err(|e| Error::cuda("recording the GPU lane's release", e))?;
        state.free.extend(slots);
        self.changed.notify_all();
        Ok(())
    }
}

/// The next range of the current work within the limit whose offered positions the ring has
/// slots for, about `images` of them, the slots reserved.
fn take_range(state: &mut State, images: usize) -> Option<Job> {
    let work = state.work.clone()?;
    let order = &work.lane.order;
    loop {
        let start = state.next_start;
        if (start >= order.len() && !order.refills()) || start >= state.limit {
            return None;
        }
        let span = span(work.lane.share.at(start), images);
        let end = match order.refills() {
            true => start.saturating_add(span),
            false => start.saturating_add(span).min(order.len()),
        };
        let positions: Vec<(usize, usize)> = (start..end)
            .filter_map(|p| order.get(p).map(|index| (p, index)))
            .filter(|&(p, index)| work.lane.share.offers(p, index))
            .collect();
        if positions.is_empty() {
            state.next_start = end;
            continue;
        }
        if positions.len() > state.free.len() {
            return None;
        }
        let at = state.free.len() - positions.len();
        let slots = state.free.split_off(at);
        state.next_start = end;
        return Some(Job {
            work,
            positions,
            slots,
        });
    }
}

/// Drops a call that was never submitted: its slots were never written.
fn drop_call(state: &mut State, call: Call) {
    let mut buffers = Vec::with_capacity(call.images.len());
    for image in call.images {
        state.free.push(image.slot);
        buffers.extend(image.into_buffers());
    }
    keep_buffers(state, buffers);
}

/// Keeps read buffers for the preparing threads, up to [`KEPT_BUFFERS`].
fn keep_buffers(state: &mut State, buffers: Vec<Vec<u8>>) {
    let room = KEPT_BUFFERS.saturating_sub(state.buffers.len());
    state.buffers.extend(buffers.into_iter().take(room));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_s_images_are_cut_into_a_range_for_each_preparing_thread() {
        assert_eq!(request_range(1, 3), 1);
        assert_eq!(request_range(4, 3), 2);
        assert_eq!(request_range(8, 3), 3);
        assert_eq!(request_range(32, 3), 11);
        assert_eq!(request_range(1_000, 3), CHUNK);
        assert_eq!(request_range(0, 0), 1);
    }

    #[test]
    fn failed_calls_are_counted_and_the_first_error_kept() {
        let mut failed = FailedCalls::default();
        assert_eq!(failed.note(), None);
        failed.add(24, "CUDA failed uploading the coefficients: out of memory");
        assert_eq!(
            failed.note().as_deref(),
            Some(
                "1 call of the GPU lane failed, their 24 images decoded by the CPU lane (the \
                 first: CUDA failed uploading the coefficients: out of memory)"
            )
        );
        failed.add(8, "a call panicked");
        let note = failed.note().unwrap_or_default();
        assert!(
            note.starts_with("2 calls of the GPU lane failed, their 32 images"),
            "{note}"
        );
        assert!(note.ends_with("out of memory)"), "{note}");
    }
}
