//! The lane's JPEG engines when they open beside it. Creating the engines' decoders (nvJPEG's
//! hardware backend, its pools and arenas) is most of the lane's setup: 1.5-2.5 s, against about
//! 0.2 s for the assisted path. A lane opened for a pipeline already making batches, on an epoch
//! of large files, therefore starts with its assisted path and creates the engines' decoder sets
//! on a thread of its own ([`EnginesComing`]); the lane takes them in when they are ready, and
//! until then refuses the calls of the engines' path (the CPU lane takes their images).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cudarc::driver::CudaModule;

use super::decoders::DecoderSet;
use super::error::GpuLaneError;
use super::nvjpeg::{DecoderConfig, NvJpeg};
use super::SUBMITTING_THREADS;
use crate::cuda::Gpu;
use crate::geometry::Geometry;
use crate::resample::Filter;

/// When a lane's JPEG engines open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum EnginesOpen {
    /// Before the lane is handed over: every image goes where the files say from the start.
    BeforeTheLane,
    /// On a thread of their own once the lane runs with its assisted path.
    BesideTheLane,
}

/// A lane's JPEG engines.
pub(super) enum Engines {
    /// Opened with the lane.
    Open,
    /// Opening on a thread of their own.
    Coming(EnginesComing),
    /// Opened beside the lane and taken in (how long it took, in words).
    Joined(String),
    /// Could not open (why).
    Off(String),
}

impl Engines {
    /// What the lane's description adds about its engines, if anything.
    pub fn note(&self) -> Option<String> {
        match self {
            Engines::Open => None,
            Engines::Coming(_) => Some("its JPEG engines opening beside the first batches".into()),
            Engines::Joined(note) => Some(note.clone()),
            Engines::Off(reason) => Some(format!(
                "the JPEG engines are off ({reason}): the CPU lane takes their images"
            )),
        }
    }
}

/// What opening a lane's JPEG engines takes: each submitting thread's decoder set.
pub(super) struct EngineRecipe {
    pub gpu: Gpu,
    pub nvjpeg: NvJpeg,
    pub module: Arc<CudaModule>,
    pub colour: DecoderConfig,
    pub gray: Option<DecoderConfig>,
    pub geometry: Geometry,
    pub filter: Filter,
}

impl EngineRecipe {
    /// The engines' decoder sets, one per submitting thread, each created on a thread of its
    /// own: creating a hardware decoder is most of the lane's setup, and the sets do not depend
    /// on each other.
    pub fn open(&self) -> Result<Vec<DecoderSet>, GpuLaneError> {
        std::thread::scope(|scope| {
            let threads: Vec<_> = (0..SUBMITTING_THREADS)
                .map(|_| {
                    scope.spawn(|| {
                        DecoderSet::open(
                            &self.gpu,
                            &self.nvjpeg,
                            &self.module,
                            &self.colour,
                            self.gray.as_ref(),
                            self.geometry,
                            self.filter,
                        )
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|thread| {
                    thread.join().unwrap_or_else(|_| {
                        Err(GpuLaneError::Opening("creating a decoder panicked".into()))
                    })
                })
                .collect()
        })
    }
}

/// JPEG engines opening on a thread of their own. Dropped before they are taken, it waits for
/// the thread: no nvJPEG call is under way on it when the process exits (the CUDA runtime's
/// teardown at exit deadlocks with a call in flight on another thread).
pub(super) struct EnginesComing {
    receiver: Receiver<Result<Vec<DecoderSet>, GpuLaneError>>,
    thread: Option<JoinHandle<()>>,
    /// Raised when dropped: the thread gives up if it has not begun.
    cancel: Arc<AtomicBool>,
    started: Instant,
}

impl EnginesComing {
    /// Opens the engines `recipe` describes on a thread of their own.
    pub fn start(recipe: EngineRecipe) -> Result<EnginesComing, GpuLaneError> {
        let (sender, receiver) = mpsc::channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let flag = cancel.clone();
        let thread = std::thread::Builder::new()
            .name("gpufeed-jpeg-engines-open".into())
            .spawn(move || {
                let opened = match flag.load(Ordering::Relaxed) {
                    true => Err(GpuLaneError::Opening("the lane was dropped".into())),
                    false => recipe.open(),
                };
                // Sets made after the lane is gone are dropped here, on this thread.
                let _ = sender.send(opened);
            })
            .map_err(GpuLaneError::Threads)?;
        Ok(EnginesComing {
            receiver,
            thread: Some(thread),
            cancel,
            started: Instant::now(),
        })
    }

    /// The engines' decoder sets (or why there are none) if their opening has ended.
    pub fn try_take(&mut self) -> Option<Result<Vec<DecoderSet>, GpuLaneError>> {
        match self.receiver.try_recv() {
            Ok(opened) => Some(opened),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => Some(Err(engines_stopped())),
        }
    }

    /// The engines' decoder sets (or why there are none), waiting for their opening to end.
    pub fn wait(&mut self) -> Result<Vec<DecoderSet>, GpuLaneError> {
        self.receiver
            .recv()
            .unwrap_or_else(|_| Err(engines_stopped()))
    }

    /// How long ago the opening began.
    pub fn waited(&self) -> Duration {
        self.started.elapsed()
    }
}

impl Drop for EnginesComing {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The engines of a set of decoders, in words ("7 JPEG engines x 1").
pub(super) fn engine_count(sets: &[DecoderSet]) -> Option<String> {
    let (engines, cores) = sets.first()?.engines()?;
    Some(format!("{engines} JPEG engines x {cores}"))
}

/// Why no engines came from a thread that stopped before sending them.
fn engines_stopped() -> GpuLaneError {
    GpuLaneError::Opening("the thread opening the JPEG engines stopped".into())
}
