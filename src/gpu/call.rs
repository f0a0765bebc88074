//! A call: the images one submitting thread decodes in one round of `nvjpegDecodeBatched` calls,
//! as a preparing thread read and planned them.

use std::ops::Range;
use std::sync::Arc;

use super::nvjpeg::{plane_layout, OutputFormat, Staging};
use super::screen::Screened;
use super::work::{Work, CHUNK};
use crate::coefficients::entropy::ParsedJpeg;
use crate::coefficients::pack::PackedImage;
use crate::coefficients::{Layout, Window};
use crate::geometry::CropDraw;
use crate::resample::{AxisPlan, Filter, PassOrder, PassPlan};
use crate::source::ItemBytes;
use crate::views::ViewDraw;

/// The most compressed bytes one call takes (a larger file alone): what one call holds read.
pub(crate) const MAX_CALL_BYTES: usize = 16 << 20;

/// Pixels one call of the assisted path decodes at most for large files, one gray call of the
/// engines holds, and the engines' colour conversion makes RGB at once for small files (an
/// image larger alone): what sizes those buffers once. Large enough for several camera-size
/// photos: on the H200 machine, the engines' calls of 12 Mpx (one to five photos of 2-12 Mpx)
/// kept them at 0.6x the rate calls of 64 Mpx reached.
pub(crate) const MAX_CALL_PIXELS: u64 = 64 << 20;

/// Compressed bytes of a call of gray images at most: 64 Mpx of gray photos' files are far less.
const GRAY_CALL_BYTES: u64 = 48 << 20;

/// Images an engines' call of large files takes at most.
pub(crate) const LARGE_FILES_CALL_IMAGES: usize = 2 * CHUNK;

/// The engines' submitting threads, for large files and small alike ([`EngineCalls`]).
pub(crate) const ENGINE_THREADS: usize = 2;

/// How the engines' calls are cut and how many threads submit them, for an epoch's files.
///
/// The engines decode a call's images side by side, one image an engine, and a call ends with
/// its largest image: a call of a few camera photos leaves most engines idle while its last one
/// decodes. And `nvjpegDecodeBatched` holds its thread until the engines have done most of the
/// call, so whatever the thread does between calls (copying the next call's files into
/// staging) leaves them idle, and calls side by side from several threads decode less together
/// than one large call. Measured on the H200 machine with 2-12 Mpx baseline photos, the
/// decoder driven alone: one call of 256 photos read in place 13.9 Gpx/s; copied into staging
/// first 8.9-10.0; calls of 32 from three threads 10.4-10.6 either way; two threads' calls of
/// 128 read in place 11.9; NVIDIA nvImageCodec's hardware decoder 12.7. So for large files a
/// call takes up to 64 photos (768 MB of planes), largest first, read in place, and the two
/// submitting threads take turns at the engines: while one thread's call decodes, the other
/// queues its conversion and resize. In the lane (the engines alone, later epochs, in turn in
/// one run) calls of 64 decoded as many images a second as calls of 128 at batch 256
/// (1,590-1,635 against 1,562-1,634), and at batch 32 too (1,445-1,628, where calls of 128 fell
/// to 1,223-1,347: the lookahead held two of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EngineCalls {
    /// Submitting threads, each with its decoders and stream.
    pub threads: usize,
    /// Images one call takes at most; also about how many the lane is offered per range while
    /// the engines are open.
    pub images: usize,
    /// Where the engines read a call's files: in place, one call at a time, or copied by each
    /// thread into page-locked staging, calls side by side.
    pub staging: Staging,
    /// Bytes of decoded planes one call holds at most (a larger image alone): what sizes each
    /// thread's output arena once.
    pub plane_bytes: u64,
    /// Compressed bytes one call holds at most (a larger file alone): what sizes each thread's
    /// page-locked staging.
    pub compressed_bytes: u64,
    /// Bytes of each thread's RGB buffer: the colour conversion and the resize take a call a
    /// part of this size at a time (an image larger alone grows it).
    pub rgb_bytes: u64,
}

impl EngineCalls {
    /// The calls for an epoch of large files (camera photos) or of small ones.
    pub fn for_files(large_files: bool) -> EngineCalls {
        match large_files {
            // 512 Mpx of 4:2:0 photos (256 Mpx of 4:4:4), about 64 photos' files, made RGB
            // 128 Mpx at a time.
            true => EngineCalls {
                threads: ENGINE_THREADS,
                images: LARGE_FILES_CALL_IMAGES,
                staging: Staging::InPlace,
                plane_bytes: 768 << 20,
                compressed_bytes: 128 << 20,
                rgb_bytes: 3 * (128 << 20),
            },
            // Small files fill a call with images long before its pixels: two threads keep the
            // engines busy, and a third gave less on the H100 machine. Their calls are copied
            // (about 3.5 MB, half a millisecond) and go side by side: read in place, taking
            // turns, the engines alone decoded 22,215-29,995 images/s against 29,204-29,658.
            false => EngineCalls {
                threads: ENGINE_THREADS,
                images: CHUNK,
                staging: Staging::Pinned,
                plane_bytes: 3 * MAX_CALL_PIXELS,
                compressed_bytes: MAX_CALL_BYTES as u64,
                rgb_bytes: 3 * MAX_CALL_PIXELS,
            },
        }
    }

    /// The calls of gray images (their own, one plane): 64 Mpx at most, their files (staged,
    /// see [`Staging`]) 48 MB at most.
    pub fn gray(self) -> EngineCalls {
        EngineCalls {
            plane_bytes: MAX_CALL_PIXELS,
            compressed_bytes: self.compressed_bytes.min(GRAY_CALL_BYTES),
            ..self
        }
    }

    /// Device bytes of one submitting thread's buffers: its colour and gray decoders' arenas and
    /// the RGB its conversion writes.
    pub fn device_bytes(self) -> u64 {
        self.plane_bytes + self.gray().plane_bytes + self.rgb_bytes
    }
}

/// An image of a call: where it goes, its compressed bytes and header facts, and what the call
/// makes of it.
pub(super) struct CallImage {
    /// Its position in the epoch's order.
    pub position: usize,
    /// The ring slot reserved for it.
    pub slot: u32,
    pub bytes: ItemBytes,
    pub screened: Screened,
    pub output: ImageOutput,
    /// What the assisted path decodes, when that path takes it.
    pub assisted: Option<AssistedInput>,
}

/// What a call makes of an image in its ring slot.
pub(super) enum ImageOutput {
    /// One output image (boxed: its passes are most of a call image's size, and a pipeline of
    /// views has none).
    Image(Box<ImageResize>),
    /// A pipeline of views: each view's resize into the image's record of views, and what the
    /// views drew (handed on with the image).
    Views {
        jobs: Vec<ViewJob>,
        draws: Vec<ViewDraw>,
    },
}

/// An output image's resize: what the random transforms drew for it, the source region and
/// output placement along each axis, the passes with their coefficients.
pub(super) struct ImageResize {
    pub draw: Option<CropDraw>,
    pub x: AxisPlan,
    pub y: AxisPlan,
    pub passes: PassPlan,
}

/// One view of an image: its resize (box, size, filter, passes) and flip, and where it lies in
/// the image's record, in units of [`crate::views::RECORD_UNIT`] bytes.
pub(super) struct ViewJob {
    pub x: AxisPlan,
    pub y: AxisPlan,
    pub passes: PassPlan,
    pub filter: Filter,
    pub order: PassOrder,
    pub flip: bool,
    pub size: u32,
    pub offset_units: u32,
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

    /// Bytes of its planes in a decoder's arena as the engines decode them: Y, and Cb and Cr at
    /// their stored size, or Y alone for a gray image (none for a sampling they refuse).
    pub fn plane_bytes(&self) -> u64 {
        let info = self.screened.info;
        let format = match self.screened.gray {
            true => OutputFormat::Y,
            false => OutputFormat::Yuv,
        };
        plane_layout(format, info.width, info.height, info.subsampling)
            .map_or(0, |(bytes, _, _)| bytes as u64)
    }

    /// Its buffers, for reuse: the file's bytes, and its packed coefficients if it has them.
    pub fn into_buffers(self) -> impl Iterator<Item = Vec<u8>> {
        let packed = match self.assisted {
            Some(AssistedInput::Packed(_, bytes)) => Some(bytes),
            _ => None,
        };
        std::iter::once(self.bytes.into_buffer()).chain(packed)
    }

    /// The pixels its resize reads (every view's, in a pipeline of views): columns, rows.
    pub fn pixels_read(&self) -> (Range<u32>, Range<u32>) {
        match &self.output {
            ImageOutput::Image(resize) => {
                let passes = &resize.passes;
                (passes.source_columns.clone(), passes.source_rows.clone())
            }
            ImageOutput::Views { jobs, .. } => jobs.iter().fold((0..0, 0..0), |(c, r), view| {
                let p = &view.passes;
                (span(c, &p.source_columns), span(r, &p.source_rows))
            }),
        }
    }
}

/// The smallest range holding `a` and `b` (either alone if the other is empty).
fn span(a: Range<u32>, b: &Range<u32>) -> Range<u32> {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.clone(),
        (_, true) => a,
        _ => a.start.min(b.start)..a.end.max(b.end),
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
