//! Which files the lane's decoders take: a walk over each file's markers, on the CPU, before any
//! GPU work.

use super::nvjpeg::{inspect_markers, DecoderConfig, JpegInfo};

/// Largest compressed file the lane takes (others go to the CPU lane).
pub(crate) const MAX_COMPRESSED: usize = 16 << 20;

/// Which files the GPU lane's decoders take: their marker checks, callable from any thread.
#[derive(Debug, Clone)]
pub(crate) struct LaneScreen {
    /// The decoders' checks and limits, taking colour files and (when the lane has a gray
    /// decoder) gray ones: one marker walk says which decoder a file goes to.
    pub checks: DecoderConfig,
    pub exif_orientation: bool,
}

/// A file the lane takes: its header facts and which decoder it goes to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Screened {
    pub info: JpegInfo,
    pub gray: bool,
}

impl LaneScreen {
    /// Whether the hardware decodes `jpeg` (its markers read; microseconds, no GPU work), and how.
    pub fn take(&self, jpeg: &[u8]) -> Option<Screened> {
        if jpeg.len() > MAX_COMPRESSED {
            return None;
        }
        let info = inspect_markers(&self.checks, jpeg).ok()?;
        let screened = Screened {
            info,
            gray: info.components == 1,
        };
        // An image the EXIF tag may turn is left to the CPU lane, which turns it.
        (!(self.exif_orientation && screened.info.exif)).then_some(screened)
    }
}
