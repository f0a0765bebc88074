//! The work the lane is given (an epoch, or the positions of a measurement, with the share
//! schedule that says which images it is offered) and what it gives back per offered position.

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaStream};

use crate::error::{Error, Result};
use crate::geometry::CropDraw;
use crate::order::EpochOrder;
use crate::schedule::ShareSchedule;
use crate::source::Source;
use crate::views::ViewDraw;

/// A range never spans more positions than this, however small the share.
pub(crate) const MAX_SPAN: usize = 4 * CHUNK;

/// Most images per call of the assisted path and of the engines on small files, and about how
/// many the lane is offered per range (the engines' calls of large files take more:
/// [`super::call::LARGE_FILES_CALL_IMAGES`]).
pub(crate) const CHUNK: usize = 32;

/// Positions per range under `share`: about `images` offered images each (at most
/// [`MAX_SPAN`] positions).
pub(crate) fn span(share: f32, images: usize) -> usize {
    if share <= 0.0 {
        return MAX_SPAN;
    }
    ((images as f32 / share).floor() as usize).clamp(1, MAX_SPAN)
}

/// The work of one epoch: the order's positions, the files behind them and the share.
#[derive(Clone)]
pub(crate) struct LaneWork {
    pub source: Arc<Source>,
    pub order: Arc<EpochOrder>,
    pub share: Arc<ShareSchedule>,
    pub epoch: u64,
    /// Called from the lane's threads with each offered position the engines do not take, as
    /// soon as that is known.
    pub refused: Option<Arc<dyn Fn(usize) + Send + Sync>>,
}

/// An image the lane made: its output in a slot of the ring, and its random draws.
#[derive(Debug, Clone)]
pub(crate) struct LaneOutput {
    pub slot: u32,
    /// Recorded on the stream that wrote the slot, after the write.
    pub ready: Arc<CudaEvent>,
    /// What the random transforms drew for it.
    pub draw: Option<CropDraw>,
    /// In a pipeline of views, what each of its views drew (its slot holds their record).
    pub views: Option<Vec<ViewDraw>>,
    /// Whether the assisted path decoded it (else the engines).
    pub assisted: bool,
}

/// What became of an offered position.
#[derive(Debug, Clone)]
pub(crate) enum LaneResult {
    /// Decoded and resized into a slot of the ring.
    Decoded(LaneOutput),
    /// Not for the engines (not a baseline JPEG, too large, unreadable, refused or failed):
    /// the CPU lane takes it, and reports any problem with it.
    Refused,
}

/// Work with the generation that tells it from earlier work.
pub(crate) struct Work {
    pub lane: LaneWork,
    pub generation: u64,
}

/// Makes `stream` wait for the work that made each of `outputs` (each event once).
pub(crate) fn wait_for_all<'a>(
    stream: &Arc<CudaStream>,
    outputs: impl Iterator<Item = &'a LaneOutput>,
) -> Result<()> {
    let mut waited: Vec<*const CudaEvent> = Vec::new();
    for output in outputs {
        let event = Arc::as_ptr(&output.ready);
        if !waited.contains(&event) {
            stream
                .wait(&output.ready)
                .map_err(|e| Error::cuda("waiting for the GPU lane's images", e))?;
            waited.push(event);
        }
    }
    Ok(())
}
