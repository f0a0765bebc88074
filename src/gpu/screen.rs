//! Which files the lane's decoders take: a walk over each file's markers, on the CPU, before any
//! GPU work. The engines take baseline JPEGs; the assisted path takes those and progressive ones.

use super::nvjpeg::{
    inspect_markers, inspect_progressive, DecoderConfig, JpegInfo, Refusal, Staging,
};

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
    /// The screen of a lane whose colour files go to decoders with `colour`'s settings and gray
    /// ones (when it has a gray decoder) to decoders with `gray`'s.
    pub fn for_decoders(
        colour: &DecoderConfig,
        gray: Option<&DecoderConfig>,
        exif_orientation: bool,
    ) -> LaneScreen {
        LaneScreen {
            checks: DecoderConfig {
                gray: gray.is_some(),
                // Only gray files' staging matters to the checks: a gray decoder that stages
                // rewrites unusual gray sampling factors in its copy, and so takes them.
                staging: gray.map_or(Staging::Pinned, |g| g.staging),
                ..colour.clone()
            },
            exif_orientation,
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    /// A gray JPEG whose frame says 2x2 sampling factors, as Pillow writes gray asked for 4:2:0.
    fn gray_with_factors() -> Vec<u8> {
        let gray = image::GrayImage::from_fn(96, 64, |x, y| image::Luma([(x * 2 + y) as u8]));
        let mut bytes = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut bytes, 90)
            .encode_image(&gray)
            .expect("encode");
        let at = super::super::nvjpeg::header::scan(&bytes)
            .expect("header")
            .frame_at
            + 7;
        bytes[at] = 0x22;
        bytes
    }

    #[test]
    fn gray_files_are_screened_by_the_gray_decoders_staging() {
        let file = gray_with_factors();
        let in_place = DecoderConfig {
            staging: Staging::InPlace,
            ..DecoderConfig::default()
        };
        let staged = DecoderConfig::default();
        // Colour calls read in place, gray ones staged: the factors are rewritten in the copy.
        let screen = LaneScreen::for_decoders(&in_place, Some(&staged), false);
        let taken = screen.take(&file).expect("the gray decoder takes it");
        assert!(taken.gray && taken.engines);
        // A gray decoder reading in place could not rewrite them.
        let screen = LaneScreen::for_decoders(&in_place, Some(&in_place), false);
        assert!(screen.take(&file).is_none());
        // Without a gray decoder no gray file is taken.
        let screen = LaneScreen::for_decoders(&staged, None, false);
        assert!(screen.take(&file).is_none());
    }
}
