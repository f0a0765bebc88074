//! Which files the lane's decoders take: a walk over each file's markers, on the CPU, before any
//! GPU work. The engines take baseline JPEGs; the assisted path takes those and progressive ones.

use super::nvjpeg::{inspect_markers, inspect_progressive, DecoderConfig, JpegInfo, Refusal};

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
    /// Whether the engines decode it; if not, it is a progressive JPEG, which only the
    /// assisted path takes, its coefficients decoded by a CPU thread.
    pub engines: bool,
}

/// A marker walk saying whether one of the lane's paths takes a file.
type Inspect = fn(&DecoderConfig, &[u8]) -> Result<JpegInfo, Refusal>;

impl LaneScreen {
    /// Whether the hardware decodes `jpeg` (its markers read; microseconds, no GPU work), and how.
    pub fn take(&self, jpeg: &[u8]) -> Option<Screened> {
        self.screen(jpeg, inspect_markers, true)
    }

    /// Whether `jpeg` is a progressive JPEG the assisted path may take (its coefficients decoded
    /// on a CPU thread), which the engines refuse.
    pub fn take_progressive(&self, jpeg: &[u8]) -> Option<Screened> {
        self.screen(jpeg, inspect_progressive, false)
    }

    /// `jpeg` as `inspect` screens it for the engines or not, unless it is too large or the
    /// EXIF tag may turn it (the CPU lane, which turns it, takes those).
    fn screen(&self, jpeg: &[u8], inspect: Inspect, engines: bool) -> Option<Screened> {
        if jpeg.len() > MAX_COMPRESSED {
            return None;
        }
        let info = inspect(&self.checks, jpeg).ok()?;
        let screened = Screened {
            info,
            gray: info.components == 1,
            engines,
        };
        (!(self.exif_orientation && screened.info.exif)).then_some(screened)
    }
}
