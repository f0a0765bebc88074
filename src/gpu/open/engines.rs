//! The lane's JPEG engines when they open beside it. Creating the engines' decoders (nvJPEG's
//! hardware backend: one handle shared by all of them, then a state and pools for each) is most
//! of the lane's setup: 1.3-2.5 s, against about 0.3 s for the assisted path. A lane opened for
//! a pipeline already making batches therefore starts with its assisted path and creates the
//! engines' decoder sets on a thread of its own ([`EngineRecipe::open_beside`]); the lane takes
//! each in as soon as it is ready, and until the first joins the assisted path takes every file
//! it can (the CPU lane the rest). nvJPEG makes a process's decoder states one at a time, so
//! every set's colour decoder comes first and the gray decoders after, on a thread of their own
//! ([`GrayOrder`]), the assisted path taking the gray files until they are made. A run too
//! short to repay the engines' opening, and an epoch of large files the assisted path takes, do
//! not open them at all.

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};

use cudarc::driver::CudaModule;

use super::joining::{Joining, SetSender, SetsComing};
use crate::background::Background;
use crate::cuda::Gpu;
use crate::geometry::Geometry;
use crate::gpu::decoders::{DecoderSet, EngineDecoders, GrayOrder};
use crate::gpu::error::GpuLaneError;
use crate::gpu::nvjpeg::{DecoderOpening, HardwareHandle, NvJpeg};
use crate::resample::Filter;

/// What the lane's description adds about its engines, if anything.
pub(in crate::gpu) fn note(engines: &Joining<DecoderSet>) -> Option<String> {
    engines.note(
        "its JPEG engines opening beside the first batches",
        |reason| {
            format!("the JPEG engines are off ({reason}): the assisted path takes their images")
        },
    )
}

/// What opening a lane's JPEG engines takes: each submitting thread's decoder set.
pub(in crate::gpu) struct EngineRecipe {
    pub gpu: Gpu,
    pub nvjpeg: NvJpeg,
    pub module: Arc<CudaModule>,
    /// What each set opens, and how many sets
    /// ([`EngineCalls::threads`](crate::gpu::call::EngineCalls::threads)).
    pub decoders: EngineDecoders,
    pub geometry: Geometry,
    pub filter: Filter,
}

impl EngineRecipe {
    /// The engines' decoder sets, one per submitting thread, each created on a thread of its
    /// own (creating a hardware decoder is most of the lane's setup, and the sets do not depend
    /// on each other), their gray decoders made before they are handed over.
    pub fn open(&self) -> Result<Vec<DecoderSet>, GpuLaneError> {
        let (sender, sets) = mpsc::channel();
        let grays = self.open_each(&sender)?;
        drop(sender);
        let sets = sets.into_iter().collect::<Result<Vec<_>, _>>()?;
        for gray in grays {
            gray.make();
        }
        Ok(sets)
    }

    /// Creates the sets as [`EngineRecipe::open`] does, sending each to `sets` as soon as its
    /// colour decoder is ready (the first came 0.1-0.9 s before the last on the 4-H200
    /// machine), and returns what their gray decoders take. An error here is the library
    /// handle's, which every set needs.
    fn open_each(&self, sets: &SetSender<DecoderSet>) -> Result<Vec<GrayOrder>, GpuLaneError> {
        // One library handle for every decoder: creating it is the longest step.
        let handle = HardwareHandle::new(
            &self.nvjpeg,
            self.gpu.stream().context(),
            self.decoders.colour.upsampling_with_interpolation,
        )?;
        let grays = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..self.decoders.calls.threads)
                .map(|_| {
                    let sets = sets.clone();
                    let handle = &handle;
                    scope.spawn(move || {
                        let opened = DecoderSet::open(
                            &self.gpu,
                            handle,
                            &self.module,
                            &self.decoders,
                            self.geometry,
                            self.filter,
                        );
                        let (set, gray) = match opened {
                            Ok((set, gray)) => (Ok(set), gray),
                            Err(reason) => (Err(reason), None),
                        };
                        // Sent once made: the receiver gone (the lane dropped), the set is
                        // dropped here.
                        let _ = sets.send(set);
                        gray
                    })
                })
                .collect();
            let mut grays = Vec::new();
            for thread in threads {
                match thread.join() {
                    Ok(gray) => grays.extend(gray),
                    Err(_) => {
                        let panicked = GpuLaneError::Opening("creating a decoder panicked".into());
                        let _ = sets.send(Err(panicked));
                    }
                }
            }
            grays
        });
        Ok(grays)
    }

    /// Opens the engines on a thread of their own, each set taken in as soon as its colour
    /// decoder is ready (none once their lane is dropped before the thread begins), and their
    /// gray decoders after them on another ([`GrayDecoders`]), which calls `grays_made` once
    /// every set's is made.
    pub fn open_beside(
        self,
        grays_made: impl FnOnce() + Send + 'static,
    ) -> Result<(SetsComing<DecoderSet>, GrayDecoders), GpuLaneError> {
        let (orders, grays) = mpsc::channel::<GrayOrder>();
        let expected = match self.decoders.gray {
            Some(_) => self.decoders.calls.threads,
            None => 0,
        };
        let making = Background::start(
            "gpufeed-jpeg-engines-gray",
            || (),
            move |cancel| {
                let mut made = 0;
                for gray in grays {
                    if cancel.load(Ordering::Relaxed) {
                        return;
                    }
                    made += usize::from(gray.make());
                }
                // A set without its gray decoder would refuse them: the assisted path keeps
                // them.
                if expected > 0 && made == expected {
                    grays_made();
                }
            },
        )
        .map_err(GpuLaneError::Threads)?;
        let sets = SetsComing::start(
            "gpufeed-jpeg-engines-open",
            self.decoders.calls.threads,
            move |sets, cancel| {
                let opened = match cancel.load(Ordering::Relaxed) {
                    true => Err(GpuLaneError::Opening("the lane was dropped".into())),
                    false => self.open_each(sets),
                };
                match opened {
                    Ok(grays) => {
                        for gray in grays {
                            let _ = orders.send(gray);
                        }
                    }
                    Err(reason) => {
                        let _ = sets.send(Err(reason));
                    }
                }
            },
        )?;
        Ok((
            sets,
            GrayDecoders {
                making: Some(making),
            },
        ))
    }
}

/// The engines' gray decoders being made beside the lane, once every set's colour decoder is:
/// each is sent to its set, which takes it in at its next call of gray files. Until every set
/// has its own, the assisted path takes the gray files (the CPU lane, where the assisted path
/// is off). Dropped, the thread gives up before its next decoder and is waited for.
pub(in crate::gpu) struct GrayDecoders {
    making: Option<Background<()>>,
}

impl GrayDecoders {
    /// None to make.
    pub fn none() -> GrayDecoders {
        GrayDecoders { making: None }
    }

    /// Waits until every gray decoder has been sent to its set (or could not be made), so that
    /// each set's next call of gray files decodes them.
    pub fn wait(&mut self) {
        if let Some(mut making) = self.making.take() {
            making.wait();
        }
    }
}

/// The engines of a set of decoders, in words ("7 JPEG engines x 1").
pub(in crate::gpu) fn engine_count(sets: &[DecoderSet]) -> Option<String> {
    let (engines, cores) = sets.first()?.engines()?;
    Some(format!("{engines} JPEG engines x {cores}"))
}

/// How long the engines' opening took, in words: their shared handle, then the slowest of
/// `sets`' colour decoders at each step (the sets open side by side): " (handle 540 ms; states
/// 680 ms, pools 22 ms, buffers 33 ms a thread)".
pub(in crate::gpu) fn opening_note(sets: &[DecoderSet]) -> String {
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
