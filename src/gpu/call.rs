//! A call: the images one submitting thread decodes in one round of `nvjpegDecodeBatched` calls,
//! as a preparing thread read and planned them.

use std::ops::Range;
use std::sync::Arc;

use super::screen::Screened;
use super::work::Work;
use crate::coefficients::entropy::ParsedJpeg;
use crate::coefficients::pack::PackedImage;
use crate::coefficients::{Layout, Window};
use crate::geometry::CropDraw;
use crate::resample::{AxisPlan, PassPlan};
use crate::source::ItemBytes;

/// The most compressed bytes one call takes (a larger file alone): what one call holds read.
pub(crate) const MAX_CALL_BYTES: usize = 16 << 20;

/// Pixels one call decodes at most (an image larger alone): what sizes each submitting thread's
/// decode buffers once. Large enough for several camera-size photos a call: the engines work on
/// a call's images side by side, and on the H200 machine calls of 12 Mpx (one to five photos of
/// 2-12 Mpx) kept them at 0.6x the rate calls of 64 Mpx reached.
pub(crate) const MAX_CALL_PIXELS: u64 = 64 << 20;

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
    /// What the assisted path decodes, when that path takes it.
    pub assisted: Option<AssistedInput>,
}

/// An image made ready for the assisted path.
pub(super) enum AssistedInput {
    /// A baseline file parsed for the GPU's entropy decoding, with what libjpeg-turbo does with
    /// its components.
    EntropyCoded(ParsedJpeg, Layout),
    /// A progressive file whose coefficients a CPU thread decoded and packed (the window its
    /// resize reads): the packed image and its bytes.
    Packed(PackedImage, Vec<u8>),
}

impl CallImage {
    /// Pixels the engines decode for it.
    pub fn pixels(&self) -> u64 {
        let info = self.screened.info;
        u64::from(info.width) * u64::from(info.height)
    }

    /// Its buffers, for reuse: the file's bytes, and its packed coefficients if it has them.
    pub fn into_buffers(self) -> impl Iterator<Item = Vec<u8>> {
        let packed = match self.assisted {
            Some(AssistedInput::Packed(_, bytes)) => Some(bytes),
            _ => None,
        };
        std::iter::once(self.bytes.into_buffer()).chain(packed)
    }

    /// The pixels its resize reads: columns, rows.
    pub fn pixels_read(&self) -> (Range<u32>, Range<u32>) {
        let passes = &self.passes;
        (passes.source_columns.clone(), passes.source_rows.clone())
    }
}

/// The window of an image of `layout` holding the pixels `read` (columns, rows: a resize's
/// [`PassPlan::source_columns`] and [`PassPlan::source_rows`]): the whole image if they are
/// empty or not inside it.
pub(super) fn window_read(layout: &Layout, (columns, rows): (Range<u32>, Range<u32>)) -> Window {
    let window = Window {
        x: columns.start,
        y: rows.start,
        width: columns.end.saturating_sub(columns.start),
        height: rows.end.saturating_sub(rows.start),
    };
    match layout.check(&window) {
        Ok(()) => window,
        Err(_) => Window::whole(layout.width, layout.height),
    }
}

/// Which decoder a call goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Path {
    /// The hardware JPEG engines (nvJPEG's hardware backend), then `kernels/ycc.cu`.
    Engines,
    /// The GPU-assisted decode: the entropy decoding, inverse DCT, upsampling and colour
    /// conversion in kernels of the crate's own (`gpufeed::coefficients`), on the GPU's cores.
    Assisted,
}

impl Path {
    /// The path's place in per-path arrays.
    pub fn index(self) -> usize {
        match self {
            Path::Engines => 0,
            Path::Assisted => 1,
        }
    }
}

/// The images one submitting thread decodes in one round: for the engines, one round of
/// `nvjpegDecodeBatched` calls (colour and gray ones in calls of their own); for the assisted
/// path, one batch of its kernels. At most [`super::work::CHUNK`] images, [`MAX_CALL_PIXELS`]
/// pixels and [`MAX_CALL_BYTES`] compressed bytes, unless one image alone is larger.
pub(super) struct Call {
    pub work: Arc<Work>,
    pub images: Vec<CallImage>,
    pub path: Path,
}
