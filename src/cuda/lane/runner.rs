//! The lane's threads and what they share: the current work, the ranges handed out, the calls
//! prepared, the results by position, and the free slots of the ring.
//!
//! Ranges are handed out in order, to whichever preparing thread is free, as long as their first
//! position is within the lookahead past the batches' cursor and the ring has a slot for each
//! offered image of the range. Prepared calls wait in a queue (at most one per submitting thread)
//! and are taken in order by whichever submitting thread is free. A slot goes back to the free
//! list once the pipeline's stream is past its last reader ([`Runner::release`]); the thread that
//! writes it next makes its own stream wait for that point first. Work of an earlier epoch still
//! in flight when a new one begins is dropped: calls still queued at once, calls being decoded
//! once their thread's stream is done with them.

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DevicePtr};

use super::decoders::DecoderSet;
use super::prepare::{Call, Preparer};
use super::{offered, span, LaneOutput, LaneResult, LaneScreen, LaneUnavailable, LaneWork};
use crate::cuda::device::Gpu;
use crate::error::{Error, Result};

/// The sizes the runner is started with.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// Slots of the ring.
    pub slots: usize,
    /// Bytes of one output image (one slot).
    pub image_bytes: usize,
    /// Positions past the batches' cursor the threads may work on.
    pub lookahead: usize,
    /// Files larger than this are left to the CPU lane.
    pub max_file_bytes: u64,
    /// Calls prepared and waiting for a submitting thread, at most.
    pub queued_calls: usize,
}

/// Work of one epoch, with the generation that tells it from earlier work.
pub(super) struct Work {
    pub lane: LaneWork,
    pub generation: u64,
    pub span: usize,
}

/// A range handed to a preparing thread: its offered positions (with their source indices) and
/// a ring slot reserved for each.
pub(super) struct Job {
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
    next_range: usize,
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
}

/// What the threads and the pipeline share.
pub(super) struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    /// Recorded on the pipeline's stream after the last use of every slot in the free list.
    released: CudaEvent,
    pub screen: LaneScreen,
    pub limits: Limits,
    /// Address of the ring's first slot.
    pub ring: u64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while the lock is held, so a poisoned state is still whole.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed.wait(state).unwrap_or_else(|e| e.into_inner())
    }

    /// The next range for a preparing thread, waiting until there is one; `None` once the lane
    /// stops.
    fn next_range(&self) -> Option<Job> {
        let mut state = self.lock();
        loop {
            if state.stop {
                return None;
            }
            if let Some(job) = take_range(&mut state) {
                return Some(job);
            }
            state = self.wait(state);
        }
    }

    /// Hands `call` to the submitting threads (waiting while [`Limits::queued_calls`] wait
    /// already) and publishes `refused` (positions of the call's range the engines will not
    /// take, with their slots). A call of stale work is dropped.
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
            if state.calls.len() < self.limits.queued_calls {
                state.calls.push_back(call);
                self.changed.notify_all();
                return;
            }
            state = self.wait(state);
        }
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
        let keep = state.buffers.len().saturating_sub(super::CHUNK);
        into.extend(state.buffers.drain(keep..));
    }

    /// The next prepared call for the thread of `stream`, waiting until there is one, and
    /// whether `stream` was made to wait for the last readers of the call's slots (if that wait
    /// could not be queued, nothing of the call may be written); `None` once the lane stops.
    fn next_call(&self, stream: &Arc<CudaStream>) -> Option<(Call, bool)> {
        let mut state = self.lock();
        loop {
            if state.stop {
                return None;
            }
            if let Some(call) = state.calls.pop_front() {
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
    fn finish_call(&self, call: Call, results: Vec<LaneResult>, stream: &Arc<CudaStream>) {
        let mut entries = Vec::with_capacity(call.images.len());
        let mut buffers = Vec::with_capacity(call.images.len());
        for (image, result) in call.images.into_iter().zip(results) {
            entries.push((image.position, image.slot, result));
            buffers.push(image.bytes.into_buffer());
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
        self.changed.notify_all();
        drop(state);
        if let Some(hand_back) = &work.lane.refused {
            for position in refused {
                hand_back(position);
            }
        }
    }
}

/// The next range of the current work within the limit whose offered positions the ring has
/// slots for, the slots reserved.
fn take_range(state: &mut State) -> Option<Job> {
    let work = state.work.clone()?;
    let order = &work.lane.order;
    loop {
        let start = state.next_range.checked_mul(work.span)?;
        if (start >= order.len() && !order.refills()) || start >= state.limit {
            return None;
        }
        let end = match order.refills() {
            true => start.saturating_add(work.span),
            false => start.saturating_add(work.span).min(order.len()),
        };
        let positions: Vec<(usize, usize)> = (start..end)
            .filter_map(|p| order.get(p).map(|index| (p, index)))
            .filter(|&(_, index)| offered(index, work.lane.share))
            .collect();
        if positions.is_empty() {
            state.next_range += 1;
            continue;
        }
        if positions.len() > state.free.len() {
            return None;
        }
        let at = state.free.len() - positions.len();
        let slots = state.free.split_off(at);
        state.next_range += 1;
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
        buffers.push(image.bytes.into_buffer());
    }
    keep_buffers(state, buffers);
}

/// Keeps read buffers for the preparing threads, up to [`KEPT_BUFFERS`].
fn keep_buffers(state: &mut State, buffers: Vec<Vec<u8>>) {
    let room = KEPT_BUFFERS.saturating_sub(state.buffers.len());
    state.buffers.extend(buffers.into_iter().take(room));
}

/// The lane's threads and ring.
pub(super) struct Runner {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// The ring of output slots, read by the batches' gathers through its address.
    _ring: CudaSlice<u8>,
}

/// Counts a thread out when it ends, however it ends (`true`: a submitting thread).
struct Alive(Arc<Shared>, bool);

impl Drop for Alive {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        match self.1 {
            true => state.submitting = state.submitting.saturating_sub(1),
            false => state.preparing = state.preparing.saturating_sub(1),
        }
        self.0.changed.notify_all();
    }
}

impl Runner {
    /// Allocates the ring and starts one submitting thread per decoder set and one preparing
    /// thread per preparer.
    pub fn start(
        gpu: &Gpu,
        sets: Vec<DecoderSet>,
        preparers: Vec<Preparer>,
        screen: LaneScreen,
        limits: Limits,
    ) -> std::result::Result<Runner, LaneUnavailable> {
        let stream = gpu.stream();
        let bytes = limits
            .slots
            .checked_mul(limits.image_bytes)
            .ok_or("the ring's size overflows")?;
        // SAFETY: device memory left uninitialized; a slot is read (gathered) only after the
        // resize wrote every byte of it, which the gather's wait on that write orders.
        let ring = unsafe { stream.alloc::<u8>(bytes.max(1)) }
            .map_err(|e| format!("allocating the GPU lane's ring: {e}"))?;
        let (address, guard) = ring.device_ptr(stream);
        drop(guard);
        let released = stream
            .record_event(None)
            .map_err(|e| format!("a CUDA event for the lane: {e}"))?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                work: None,
                generation: 0,
                next_range: 0,
                limit: 0,
                calls: VecDeque::new(),
                results: HashMap::new(),
                free: (0..limits.slots as u32).rev().collect(),
                buffers: Vec::new(),
                stop: false,
                preparing: preparers.len(),
                submitting: sets.len(),
            }),
            changed: Condvar::new(),
            released,
            screen,
            limits,
            ring: address,
        });
        let mut threads = Vec::with_capacity(sets.len() + preparers.len());
        let mut spawn = |name: String, body: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name)
                .spawn(body)
                .map(|handle| threads.push(handle))
        };
        let mut spawned = Ok(());
        for (i, set) in sets.into_iter().enumerate() {
            let shared = shared.clone();
            spawned = spawned.and_then(|_| {
                spawn(
                    format!("gpufeed-jpeg-{i}"),
                    Box::new(move || submit(shared, set)),
                )
            });
        }
        for (i, preparer) in preparers.into_iter().enumerate() {
            let shared = shared.clone();
            spawned = spawned.and_then(|_| {
                spawn(
                    format!("gpufeed-jpeg-read-{i}"),
                    Box::new(move || prepare(shared, preparer)),
                )
            });
        }
        let runner = Runner {
            shared,
            threads,
            _ring: ring,
        };
        match spawned {
            Ok(()) => Ok(runner),
            Err(e) => {
                drop(runner);
                Err(format!("cannot start the lane's threads: {e}"))
            }
        }
    }

    /// Which files the lane takes.
    #[cfg(test)]
    pub fn screen(&self) -> &LaneScreen {
        &self.shared.screen
    }

    /// Threads of the lane, submitting and preparing.
    pub fn threads(&self) -> usize {
        self.threads.len()
    }

    /// Address of the ring's first slot.
    pub fn ring_address(&self) -> u64 {
        self.shared.ring
    }

    /// Starts `work`, dropping the results of earlier work (their slots come back once
    /// `stream` is past the work that made them).
    pub fn begin(&self, stream: &Arc<CudaStream>, work: LaneWork) -> Result<()> {
        let mut state = self.shared.lock();
        let dropped: Vec<LaneOutput> = state
            .results
            .drain()
            .filter_map(|(_, result)| match result {
                LaneResult::Decoded(output) => Some(output),
                _ => None,
            })
            .collect();
        if !dropped.is_empty() {
            super::wait_for_all(stream, dropped.iter())?;
            self.shared
                .released
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
        state.work = Some(Arc::new(Work {
            span: span(work.share),
            lane: work,
            generation: state.generation,
        }));
        state.next_range = 0;
        state.limit = self.shared.limits.lookahead.min(order_len);
        self.shared.changed.notify_all();
        Ok(())
    }

    /// The batches have taken every position before `position`: the lane works up to its
    /// lookahead past it, within the epoch's planned positions (past them only when asked).
    pub fn advance(&self, position: usize) {
        let mut state = self.shared.lock();
        let planned = state.work.as_ref().map_or(0, |w| w.lane.order.len());
        let limit = position
            .saturating_add(self.shared.limits.lookahead)
            .min(planned);
        if limit > state.limit {
            state.limit = limit;
            self.shared.changed.notify_all();
        }
    }

    /// The result of offered position `position`, waiting for it. A position the lane was not
    /// offered, or any position once its threads have ended, is [`LaneResult::Refused`].
    pub fn result(&self, position: usize) -> LaneResult {
        let mut state = self.shared.lock();
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
                .is_some_and(|index| offered(index, work.lane.share));
            if !is_offered || state.preparing == 0 || state.submitting == 0 || state.stop {
                return LaneResult::Refused;
            }
            if state.limit <= position {
                state.limit = position + 1;
                self.shared.changed.notify_all();
            }
            state = self.shared.wait(state);
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
        let mut state = self.shared.lock();
        self.shared
            .released
            .record(stream)
            .map_err(|e| Error::cuda("recording the GPU lane's release", e))?;
        state.free.extend(slots);
        self.shared.changed.notify_all();
        Ok(())
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        {
            let mut state = self.shared.lock();
            state.stop = true;
            self.shared.changed.notify_all();
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// A submitting thread: takes prepared calls and publishes their results until the lane stops.
/// Each thread's stream is synchronized before it ends, so nothing of it runs past the lane.
fn submit(shared: Arc<Shared>, mut set: DecoderSet) {
    let _alive = Alive(shared.clone(), true);
    let stream = set.stream().clone();
    loop {
        let next = shared.next_call(&stream);
        let Some((call, ordered)) = next else { break };
        let results = match catch_unwind(AssertUnwindSafe(|| set.run(&call, &shared, ordered))) {
            Ok(results) if results.len() == call.images.len() => results,
            _ => {
                // Whatever the set queued before it failed is done before the slots are free.
                let _ = stream.synchronize();
                vec![LaneResult::Refused; call.images.len()]
            }
        };
        shared.finish_call(call, results, &stream);
    }
    let _ = stream.synchronize();
}

/// A preparing thread: takes ranges and prepares their calls until the lane stops. Whatever a
/// preparation that panics had not handed over yet is refused (the CPU lane takes it).
fn prepare(shared: Arc<Shared>, mut preparer: Preparer) {
    let _alive = Alive(shared.clone(), false);
    while let Some(job) = shared.next_range() {
        let work = job.work.clone();
        let places: Vec<(usize, u32)> = job
            .positions
            .iter()
            .map(|&(position, _)| position)
            .zip(job.slots.iter().copied())
            .collect();
        let mut handed = vec![false; places.len()];
        let prepared = catch_unwind(AssertUnwindSafe(|| {
            preparer.prepare(job, &shared, &mut handed)
        }));
        if prepared.is_err() {
            let left = places
                .into_iter()
                .zip(handed)
                .filter_map(|(place, handed)| (!handed).then_some(place))
                .collect();
            shared.refuse(&work, left);
        }
    }
}
