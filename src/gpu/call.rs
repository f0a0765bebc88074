//! A call: the images one submitting thread decodes in one round of `nvjpegDecodeBatched` calls,
//! as a preparing thread read and planned them.

use std::sync::Arc;

use super::screen::Screened;
use super::work::Work;
use crate::geometry::CropDraw;
use crate::resample::{AxisPlan, PassPlan};
use crate::source::ItemBytes;

/// The most compressed bytes one call takes (a larger file alone): what one call holds read.
pub(crate) const MAX_CALL_BYTES: usize = 16 << 20;

/// Pixels one call decodes at most (an image larger alone): what sizes each submitting thread's
/// decode buffers once.
pub(crate) const MAX_CALL_PIXELS: u64 = 12 << 20;

/// An image of a call: where it goes, its compressed bytes and header facts, what the random
/// transforms drew for it and how it is resized.
pub(super) struct CallImage {
    /// Its position in the epoch's order.
    pub position: usize,
    /// The ring slot reserved for it.
    pub slot: u32,
    pub bytes: ItemBytes,
    pub screened: Screened,
    pub draw: Option<CropDraw>,
    /// The source region and output placement along each axis.
    pub x: AxisPlan,
    pub y: AxisPlan,
    /// The resize passes with their coefficients.
    pub passes: PassPlan,
}

impl CallImage {
    /// Pixels the engines decode for it.
    pub fn pixels(&self) -> u64 {
        let info = self.screened.info;
        u64::from(info.width) * u64::from(info.height)
    }
}

/// The images of one round of `nvjpegDecodeBatched` calls (colour and gray ones in calls of their
/// own): at most [`super::work::CHUNK`] images, [`MAX_CALL_PIXELS`] pixels and [`MAX_CALL_BYTES`]
/// compressed bytes, unless one image alone is larger.
pub(super) struct Call {
    pub work: Arc<Work>,
    pub images: Vec<CallImage>,
}
