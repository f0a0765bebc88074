//! The lane's threads and what they share: the current work, the ranges handed out, the results
//! by position, and the free slots of the ring.
//!
//! Ranges are handed out in order, to whichever thread is free, as long as their first position
//! is within the lookahead past the batches' cursor and the ring has a slot for each offered
//! image of the range. A slot goes back to the free list once the pipeline's stream is past its
//! last reader ([`Runner::release`]); the thread that writes it next makes its own stream wait
//! for that point first. Work of an earlier epoch still in flight when a new one begins is
//! finished and dropped: its thread waits for its stream before freeing the slots.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DevicePtr};

use super::decoders::{DecoderSet, Job};
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
}

/// Work of one epoch, with the generation that tells it from earlier work.
pub(super) struct Work {
    pub lane: LaneWork,
    pub generation: u64,
    pub span: usize,
}

struct State {
    work: Option<Arc<Work>>,
    generation: u64,
    /// The next range to hand out (its first position is `next_range * span`).
    next_range: usize,
    /// Ranges starting at or past this position wait.
    limit: usize,
    results: HashMap<usize, LaneResult>,
    free: Vec<u32>,
    stop: bool,
    /// Threads still running.
    alive: usize,
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

    /// The next range for the thread of `stream`, waiting until there is one; `None` once the
    /// lane stops.
    fn next_job(&self, stream: &Arc<CudaStream>) -> Option<Job> {
        let mut state = self.lock();
        loop {
            if state.stop {
                return None;
            }
            if let Some(job) = self.take_range(&mut state, stream) {
                return Some(job);
            }
            state = self.wait(state);
        }
    }

    fn take_range(&self, state: &mut State, stream: &Arc<CudaStream>) -> Option<Job> {
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
            // The slots may have been read by batches until lately: this thread's stream waits
            // for the pipeline's to be past them before writing.
            let ordered = stream.wait(&self.released).is_ok();
            return Some(Job {
                work,
                positions,
                slots,
                ordered,
            });
        }
    }

    /// Publishes a job's results (one per position), or drops them if the work is stale.
    fn publish(&self, job: Job, results: Vec<LaneResult>, stream: &Arc<CudaStream>) {
        let mut state = self.lock();
        if state.generation != job.work.generation {
            drop(state);
            // The slots may still be written by this stream: wait for it before freeing them.
            let _ = stream.synchronize();
            state = self.lock();
            state.free.extend(job.slots);
            self.changed.notify_all();
            return;
        }
        let mut refused = Vec::new();
        for ((&(position, _), &slot), result) in job.positions.iter().zip(&job.slots).zip(results) {
            if let LaneResult::Refused = result {
                // Never written, or written on this thread's stream only, which the next writer
                // of the slot waits for (its own stream, or `released` after this stream's
                // later work).
                state.free.push(slot);
                refused.push(position);
            }
            state.results.insert(position, result);
        }
        self.changed.notify_all();
        drop(state);
        if let Some(hand_back) = &job.work.lane.refused {
            for position in refused {
                hand_back(position);
            }
        }
    }
}

/// The lane's threads and ring.
pub(super) struct Runner {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// The ring of output slots, read by the batches' gathers through its address.
    _ring: CudaSlice<u8>,
}

/// Counts a thread out when it ends, however it ends.
struct Alive(Arc<Shared>);

impl Drop for Alive {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.alive = state.alive.saturating_sub(1);
        self.0.changed.notify_all();
    }
}

impl Runner {
    /// Allocates the ring and starts one thread per decoder set.
    pub fn start(
        gpu: &Gpu,
        sets: Vec<DecoderSet>,
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
                results: HashMap::new(),
                free: (0..limits.slots as u32).rev().collect(),
                stop: false,
                alive: sets.len(),
            }),
            changed: Condvar::new(),
            released,
            screen,
            limits,
            ring: address,
        });
        let mut threads = Vec::with_capacity(sets.len());
        for (i, set) in sets.into_iter().enumerate() {
            let shared_for_thread = shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("gpufeed-jpeg-{i}"))
                .spawn(move || run(shared_for_thread, set));
            match spawned {
                Ok(handle) => threads.push(handle),
                Err(e) => {
                    let runner = Runner {
                        shared,
                        threads,
                        _ring: ring,
                    };
                    drop(runner);
                    return Err(format!("cannot start the lane's threads: {e}"));
                }
            }
        }
        Ok(Runner {
            shared,
            threads,
            _ring: ring,
        })
    }

    /// Which files the lane takes.
    #[cfg(test)]
    pub fn screen(&self) -> &LaneScreen {
        &self.shared.screen
    }

    /// Threads submitting to the engines.
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
            if !is_offered || state.alive == 0 || state.stop {
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

/// A submitting thread: takes ranges and publishes their results until the lane stops. Each
/// thread's stream is synchronized before it ends, so nothing of it runs past the lane.
fn run(shared: Arc<Shared>, mut set: DecoderSet) {
    let _alive = Alive(shared.clone());
    let stream = set.stream().clone();
    while let Some(job) = shared.next_job(&stream) {
        let results = match catch_unwind(AssertUnwindSafe(|| set.run(&job, &shared))) {
            Ok(results) if results.len() == job.positions.len() => results,
            _ => {
                // Whatever the set queued before it failed is done before the slots are free.
                let _ = stream.synchronize();
                vec![LaneResult::Refused; job.positions.len()]
            }
        };
        shared.publish(job, results, &stream);
    }
    let _ = stream.synchronize();
}
