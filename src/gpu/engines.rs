//! The lane's JPEG engines when they open beside it. Creating the engines' decoders (nvJPEG's
//! hardware backend: one handle shared by all of them, then a state and pools for each) is most
//! of the lane's setup: 1.3-2.5 s, against about 0.3 s for the assisted path. A lane opened for
//! a pipeline already making batches therefore starts with its assisted path and creates the
//! engines' decoder sets on a thread of its own ([`EngineRecipe::open_beside`]); the lane takes
//! each in as soon as it is ready, and until the first joins the assisted path takes every file
//! it can (the CPU lane the rest). A run too short to repay the engines' opening, and an epoch of
//! large files the assisted path takes, do not open them at all.

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};

use cudarc::driver::CudaModule;

use super::decoders::{DecoderSet, EngineDecoders};
use super::error::GpuLaneError;
use super::joining::{Joining, SetSender, SetsComing};
use super::nvjpeg::{DecoderOpening, HardwareHandle, NvJpeg};
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
    /// Not at all, for the reason given (a run that ends before they could open, or an epoch of
    /// large files, which the assisted path takes): the assisted path alone.
    Never(&'static str),
}

/// What the lane's description adds about its engines, if anything.
pub(super) fn note(engines: &Joining) -> Option<String> {
    engines.note(
        "its JPEG engines opening beside the first batches",
        |reason| {
            format!("the JPEG engines are off ({reason}): the assisted path takes their images")
        },
    )
}

/// What opening a lane's JPEG engines takes: each submitting thread's decoder set.
pub(super) struct EngineRecipe {
    pub gpu: Gpu,
    pub nvjpeg: NvJpeg,
    pub module: Arc<CudaModule>,
    /// What each set opens, and how many sets
    /// ([`EngineCalls::threads`](super::call::EngineCalls::threads)).
    pub decoders: EngineDecoders,
    pub geometry: Geometry,
    pub filter: Filter,
}

impl EngineRecipe {
    /// The engines' decoder sets, one per submitting thread, each created on a thread of its
    /// own: creating a hardware decoder is most of the lane's setup, and the sets do not depend
    /// on each other.
    pub fn open(&self) -> Result<Vec<DecoderSet>, GpuLaneError> {
        let (sender, sets) = mpsc::channel();
        self.open_each(&sender)?;
        drop(sender);
        sets.into_iter().collect()
    }

    /// Creates the sets as [`EngineRecipe::open`] does, sending each to `sets` as soon as it is
    /// ready (the first came 0.1-0.9 s before the last on the 4-H200 machine). An error here is
    /// the library handle's, which every set needs.
    fn open_each(&self, sets: &SetSender) -> Result<(), GpuLaneError> {
        // One library handle for every decoder: creating it is the longest step.
        let handle = HardwareHandle::new(
            &self.nvjpeg,
            self.gpu.stream().context(),
            self.decoders.colour.upsampling_with_interpolation,
        )?;
        std::thread::scope(|scope| {
            let threads: Vec<_> = (0..self.decoders.calls.threads)
                .map(|_| {
                    let sets = sets.clone();
                    let handle = &handle;
                    scope.spawn(move || {
                        let set = DecoderSet::open(
                            &self.gpu,
                            handle,
                            &self.module,
                            &self.decoders,
                            self.geometry,
                            self.filter,
                        );
                        // Sent once made: the receiver gone (the lane dropped), the set is
                        // dropped here.
                        let _ = sets.send(set);
                    })
                })
                .collect();
            for thread in threads {
                if thread.join().is_err() {
                    let panicked = GpuLaneError::Opening("creating a decoder panicked".into());
                    let _ = sets.send(Err(panicked));
                }
            }
        });
        Ok(())
    }

    /// Opens the engines on a thread of their own, each set taken in as soon as it is ready
    /// (none once their lane is dropped before the thread begins).
    pub fn open_beside(self) -> Result<SetsComing, GpuLaneError> {
        SetsComing::start(
            "gpufeed-jpeg-engines-open",
            self.decoders.calls.threads,
            move |sets, cancel| {
                let opened = match cancel.load(Ordering::Relaxed) {
                    true => Err(GpuLaneError::Opening("the lane was dropped".into())),
                    false => self.open_each(sets),
                };
                if let Err(reason) = opened {
                    let _ = sets.send(Err(reason));
                }
            },
        )
    }
}

/// The engines of a set of decoders, in words ("7 JPEG engines x 1").
pub(super) fn engine_count(sets: &[DecoderSet]) -> Option<String> {
    let (engines, cores) = sets.first()?.engines()?;
    Some(format!("{engines} JPEG engines x {cores}"))
}

/// How long the engines' opening took, in words: their shared handle, then the slowest of
/// `sets`' decoders at each step (the sets open side by side): " (handle 540 ms; states 680 ms,
/// pools 22 ms, buffers 33 ms a thread)".
pub(super) fn opening_note(sets: &[DecoderSet]) -> String {
    let handle = sets.iter().find_map(DecoderSet::handle_created_in);
    let decoders = sets
        .iter()
        .filter_map(DecoderSet::opening)
        .reduce(DecoderOpening::longest);
    match (handle, decoders) {
        (Some(handle), Some(decoders)) => format!(
            " (handle {:.0} ms; {decoders} a thread)",
            handle.as_secs_f64() * 1000.0
        ),
        _ => String::new(),
    }
}
