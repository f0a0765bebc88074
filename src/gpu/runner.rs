//! The lane's threads and ring: preparing threads take ranges and prepare their calls, submitting
//! threads decode them; the pipeline asks for results by position and gives slots back.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use super::decoders::DecoderSet;
use super::error::GpuLaneError;
use super::prepare::Preparer;
use super::screen::LaneScreen;
use super::shared::{Limits, Shared};
use super::work::{LaneOutput, LaneResult, LaneWork};
use crate::cuda::Gpu;
use crate::error::Result;
use crate::schedule::LaneActivity;

/// The lane's threads and ring.
pub(super) struct Runner {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// Submitting threads started so far (their names' numbers).
    submitting_started: usize,
    /// The ring of output slots, read by the batches' gathers through its address.
    _ring: CudaSlice<u8>,
}

/// Counts a thread out when it ends, however it ends (`true`: a submitting thread).
struct Alive(Arc<Shared>, bool);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.thread_ended(self.1);
    }
}

impl Runner {
    /// Allocates the ring and starts one submitting thread per decoder set and one preparing
    /// thread per preparer. The calls of a path no set takes are refused (the CPU lane takes
    /// their images) until [`Runner::add_sets`] brings sets for it.
    pub fn start(
        gpu: &Gpu,
        sets: Vec<DecoderSet>,
        preparers: Vec<Preparer>,
        screen: LaneScreen,
        limits: Limits,
    ) -> Result<Runner, GpuLaneError> {
        let stream = gpu.stream();
        let bytes = limits
            .slots
            .checked_mul(limits.image_bytes)
            .ok_or(GpuLaneError::TooLarge("the ring"))?;
        // SAFETY: device memory left uninitialized; a slot is read (gathered) only after the
        // resize wrote every byte of it, which the gather's wait on that write orders.
        let ring = unsafe { stream.alloc::<u8>(bytes.max(1)) }
            .map_err(GpuLaneError::cuda("allocating the ring"))?;
        let (address, guard) = ring.device_ptr(stream);
        drop(guard);
        let released = stream
            .record_event(None)
            .map_err(GpuLaneError::cuda("creating the ring's release event"))?;
        let shared = Arc::new(Shared::new(
            screen,
            limits,
            address,
            released,
            preparers.len(),
        ));
        // From here on a thread that cannot start drops the runner: its threads stop and are
        // waited for.
        let mut runner = Runner {
            shared,
            threads: Vec::with_capacity(sets.len() + preparers.len()),
            submitting_started: 0,
            _ring: ring,
        };
        runner.add_sets(sets)?;
        for (i, preparer) in preparers.into_iter().enumerate() {
            let shared = runner.shared.clone();
            let thread = std::thread::Builder::new()
                .name(format!("gpufeed-jpeg-read-{i}"))
                .spawn(move || prepare(shared, preparer))
                .map_err(GpuLaneError::Threads)?;
            runner.threads.push(thread);
        }
        Ok(runner)
    }

    /// Starts a submitting thread for each of `sets` (at the start, and later for the engines'
    /// when they open beside the first batches), which opens their paths. A thread that
    /// cannot start leaves its path as it was (closed, if no thread of it started here).
    pub fn add_sets(&mut self, sets: Vec<DecoderSet>) -> Result<(), GpuLaneError> {
        let mut started = 0;
        for set in sets {
            let path = set.path();
            self.shared.submitting_thread_added(path);
            let shared = self.shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("gpufeed-jpeg-{}", self.submitting_started))
                .spawn(move || submit(shared, set));
            match spawned {
                Ok(handle) => {
                    self.threads.push(handle);
                    self.submitting_started += 1;
                    started += 1;
                }
                Err(e) => {
                    self.shared.thread_ended(true);
                    if started == 0 {
                        self.shared.close_path(path);
                    }
                    return Err(GpuLaneError::Threads(e));
                }
            }
        }
        Ok(())
    }

    /// The lane's failed calls in words (`None`: none failed).
    pub fn failed_calls_note(&self) -> Option<String> {
        self.shared.failed_calls_note()
    }

    /// Says the engines' gray decoders are being made: gray files take the assisted path until
    /// the call returned here says they are all made.
    pub fn grays_coming(&self) -> impl FnOnce() + Send + 'static {
        self.shared.set_grays_on_engines(false);
        let shared = self.shared.clone();
        move || shared.set_grays_on_engines(true)
    }

    /// Which files the lane takes.
    #[cfg(test)]
    pub fn screen(&self) -> &LaneScreen {
        &self.shared.screen
    }

    /// How busy the lane has been since it started.
    pub fn activity(&self) -> LaneActivity {
        self.shared.activity()
    }

    /// Address of the ring's first slot.
    pub fn ring_address(&self) -> u64 {
        self.shared.ring
    }

    /// Starts `work`, dropping the results of earlier work (their slots come back once
    /// `stream` is past the work that made them).
    pub fn begin(&self, stream: &Arc<CudaStream>, work: LaneWork) -> Result<()> {
        self.shared.begin(stream, work)
    }

    /// The batches have taken every position before `position`: the lane works up to its
    /// lookahead past it.
    pub fn advance(&self, position: usize) {
        self.shared.advance(position);
    }

    /// The result of offered position `position`, waiting for it.
    pub fn result(&self, position: usize) -> LaneResult {
        self.shared.result(position)
    }

    /// Frees the slots of `outputs` once `stream` is past every use of them queued so far.
    pub fn release(
        &self,
        stream: &Arc<CudaStream>,
        outputs: impl IntoIterator<Item = LaneOutput>,
    ) -> Result<()> {
        self.shared.release(stream, outputs)
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        self.shared.stop();
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
        let next = shared.next_call(&stream, set.path());
        let Some((mut call, ordered)) = next else {
            break;
        };
        let calling = Instant::now();
        let ran = catch_unwind(AssertUnwindSafe(|| set.run(&mut call, &shared, ordered)));
        shared.add_call_time(set.path(), calling.elapsed());
        let results = match ran {
            Ok(results) if results.len() == call.images.len() => results,
            ran => {
                let why = match ran {
                    Ok(_) => "a call gave another number of results than it had images",
                    Err(_) => "a call panicked",
                };
                shared.call_failed(call.images.len(), why);
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
