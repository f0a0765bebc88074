//! The assisted path's decoder sets as they open: all before the lane starts, or the first
//! before and the others beside the running lane.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cudarc::driver::CudaModule;

use super::joining::{Joining, SetsComing};
use crate::cuda::Gpu;
use crate::geometry::Geometry;
use crate::gpu::decoders::DecoderSet;
use crate::gpu::error::GpuLaneError;
use crate::resample::Filter;

/// What opening the assisted path's decoder sets takes. Most of a set's opening is its pinned
/// staging (2 bytes a pixel of a call), which the driver page-locks one set at a time: a lane
/// opened beside running batches opens one set before it starts and the others on a thread of
/// their own ([`AssistedRecipe::open_beside`]), so its first calls do not wait for all four.
pub(in crate::gpu) struct AssistedRecipe {
    pub gpu: Gpu,
    pub module: Arc<CudaModule>,
    pub geometry: Geometry,
    pub filter: Filter,
    pub call_pixels: u64,
}

impl AssistedRecipe {
    /// `sets` decoder sets, each on a new stream, given up between two once `cancel` is raised.
    pub fn open(&self, sets: usize, cancel: &AtomicBool) -> Result<Vec<DecoderSet>, GpuLaneError> {
        (0..sets).map(|_| self.open_one(cancel)).collect()
    }

    /// One decoder set on a new stream, unless `cancel` is raised.
    fn open_one(&self, cancel: &AtomicBool) -> Result<DecoderSet, GpuLaneError> {
        match cancel.load(Ordering::Relaxed) {
            true => Err(GpuLaneError::Opening("the lane was dropped".into())),
            false => DecoderSet::open_assisted(
                &self.gpu,
                &self.module,
                self.geometry,
                self.filter,
                self.call_pixels,
            ),
        }
    }

    /// Opens `sets` decoder sets on a thread of their own, one after another, each taken in as
    /// soon as it is ready (none once their lane is dropped).
    pub fn open_beside(self, sets: usize) -> Result<SetsComing<DecoderSet>, GpuLaneError> {
        SetsComing::start("gpufeed-assisted-open", sets, move |opened, cancel| {
            for _ in 0..sets {
                let set = self.open_one(cancel);
                let failed = set.is_err();
                if opened.send(set).is_err() || failed {
                    return;
                }
            }
        })
    }
}

/// What the lane's description adds about the assisted path's sets after its first, if
/// anything.
pub(in crate::gpu) fn later_sets_note(sets: &Joining<DecoderSet>) -> Option<String> {
    sets.note(
        "the assisted path's other decoders still being made",
        |reason| format!("the assisted path's other decoders could not open ({reason})"),
    )
}
