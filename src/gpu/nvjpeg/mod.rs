//! A second decode lane: baseline JPEGs decoded by the GPU's hardware JPEG engines (A100, A30,
//! H100, ...) through nvJPEG's hardware backend, into device memory that cudarc owns.
//!
//! [`NvJpeg::load`] finds and opens `libnvjpeg.so.13` (or `.12`) at run time; it never panics and
//! says which paths it tried. A [`HardwareDecoder`] is created once for a maximum batch size and
//! reused: its nvJPEG state, parse object, pinned staging for the compressed bytes and device
//! output arena are kept between batches and only grown, up to caps, when a larger batch or image
//! arrives, so the hot path allocates nothing.
//!
//! # What happens in one [`HardwareDecoder::decode_inspected`]
//!
//! 1. Each image was inspected on the CPU beforehand, on any thread ([`inspect_markers`]): this
//!    crate's marker walk ([`header::scan`]) refuses what the hardware does not take
//!    (progressive, lossless, hierarchical, arithmetic-coded, 12-bit, CMYK/YCCK, RGB-coded, 4:1:1
//!    and odd subsamplings, several scans, truncated files). A refused image is reported as
//!    [`Outcome::Refused`] with its [`Refusal`]; it never reaches the hardware, so it cannot fail
//!    the batch. Send it to the CPU lane.
//! 2. The accepted images are laid out in the output arena (each image 256-byte aligned) and their
//!    compressed bytes are copied into one of two pinned staging buffers, so they cross PCIe from
//!    page-locked memory (DALI stages its hardware-decoder input the same way).
//! 3. The host waits for the previous batch's decode to finish (an event recorded after it): the
//!    nvJPEG state is reused, and NVIDIA's own integrations (DALI, nvImageCodec) never queue a
//!    batch on a state whose previous batch is still running.
//! 4. `nvjpegDecodeBatchedInitialize(handle, state, n, 1, format)` when `n` or the format changed
//!    since the last call (or after a failed batch, which the header says it resets), then
//!    `nvjpegDecodeBatched(handle, state, data, lengths, destinations, stream)` on the caller's
//!    stream, and an event is recorded on that stream. Before a call's first batch the host waits
//!    for everything queued on the stream before the call (see below).
//!
//! # Buffer lifetimes and asynchrony
//!
//! `nvjpegDecodeBatched` queues work on the stream and may return before the hardware has read the
//! compressed bytes. So everything one call hands it (the pinned compressed bytes and the host
//! arrays `data`, `lengths` and `destinations`) lives in one of two staging slots that is not
//! written again until that batch's event has completed; the next `decode` fills the other slot
//! while the batch runs, and the one after waits for the event. The nvJPEG state, handle and parse
//! object live as long as the decoder, whose `Drop` waits for outstanding work before destroying
//! them.
//!
//! The hardware backend writes its output when `nvjpegDecodeBatched` is called, not when the
//! stream gets to it: work queued on the stream before the call may still be reading the arena
//! while the engines overwrite it (torchcodec found the same, pytorch/torchcodec#1634: a
//! `cudaStreamWaitEvent` does not gate the write, a host wait does). So each call records an event
//! on the stream as it starts and the host waits for it just before the call's first batch goes to
//! the hardware (the staging copy overlaps the wait). The output of a batch therefore stays valid
//! until the next `decode` on the same decoder: queue the work that reads it on the same stream
//! before calling `decode` again, or make another stream wait for an event recorded after it on
//! that stream and finish before the next `decode`. Growing the output arena (rare: only for a
//! batch larger than any before) waits for the stream. With the hardware backend,
//! `nvjpegDecodeBatched` keeps the calling thread busy for most of the decode (measured on the
//! H100 machine: about 45 µs of host time an image, one thread alone).
//!
//! # CUDA runtime and context
//!
//! `libnvjpeg.so.13` links the CUDA runtime statically (its only `NEEDED` libraries are libc,
//! libm, libdl, librt, libpthread and libgcc_s; it opens `libcuda.so.1` itself): no `libcudart.so`
//! is needed, with or without custom allocators. With null allocators (what this module passes)
//! nvJPEG allocates its internal buffers with that runtime's `cudaMalloc` / `cudaHostAlloc`. The
//! runtime uses the context current on the calling thread; every call here first binds the context
//! of the caller's stream (the device's primary context, which `CudaContext::new` retains), so
//! nvJPEG's buffers, the output arena and the staging memory all belong to one context. The
//! library also names the driver's `libnvcuvid.so.1`, which the hardware backend presumably drives
//! the JPEG engines through: in a container, `NVIDIA_DRIVER_CAPABILITIES` should include `video`.
//!
//! # Output
//!
//! [`OutputFormat::Interleaved`] (`NVJPEG_OUTPUT_RGBI`, the default): one plane of R,G,B bytes per
//! pixel, the HWC u8 layout gpufeed's normalize kernel already reads; a pixel's channel `c` is at
//! `ptr + y * pitch + x * pixel_stride + c * channel_stride` ([`DecodedImage`]), and gray JPEGs
//! come out with the gray value in all three channels. [`OutputFormat::Yuv`] (`NVJPEG_OUTPUT_YUV`):
//! the Y, Cb and Cr planes at their stored size ([`DecodedImage::chroma`]), what the GPU lane
//! converts as libjpeg-turbo does; [`OutputFormat::Y`] (`NVJPEG_OUTPUT_Y`): the Y plane alone, for
//! gray JPEGs. EXIF orientation is not applied (as `image`'s plain decode).

pub mod header;
pub mod sys;

use std::ffi::{c_int, c_uint};
use std::fmt;
use std::sync::{Arc, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use cudarc::driver::{
    CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtrMut, DriverError, PinnedHostSlice,
};

pub use header::{HeaderError, JpegHeader, Subsampling};
pub use sys::NvjpegUnavailable;

/// An nvJPEG status code (`nvjpegStatus_t`), other than success.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NvjpegStatus {
    /// `NVJPEG_STATUS_NOT_INITIALIZED`.
    NotInitialized,
    /// `NVJPEG_STATUS_INVALID_PARAMETER`.
    InvalidParameter,
    /// `NVJPEG_STATUS_BAD_JPEG`.
    BadJpeg,
    /// `NVJPEG_STATUS_JPEG_NOT_SUPPORTED`.
    JpegNotSupported,
    /// `NVJPEG_STATUS_ALLOCATOR_FAILURE`.
    AllocatorFailure,
    /// `NVJPEG_STATUS_EXECUTION_FAILED`.
    ExecutionFailed,
    /// `NVJPEG_STATUS_ARCH_MISMATCH`: what the hardware backend gives on a GPU without JPEG
    /// engines.
    ArchMismatch,
    /// `NVJPEG_STATUS_INTERNAL_ERROR`.
    InternalError,
    /// `NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED`.
    ImplementationNotSupported,
    /// `NVJPEG_STATUS_INCOMPLETE_BITSTREAM`.
    IncompleteBitstream,
    /// A value `nvjpeg.h` does not name.
    Other(i32),
}

impl NvjpegStatus {
    /// `Ok` for `NVJPEG_STATUS_SUCCESS`, else the status.
    pub(crate) fn of(status: c_int) -> Result<(), NvjpegStatus> {
        Err(match status {
            sys::NVJPEG_STATUS_SUCCESS => return Ok(()),
            sys::NVJPEG_STATUS_NOT_INITIALIZED => NvjpegStatus::NotInitialized,
            sys::NVJPEG_STATUS_INVALID_PARAMETER => NvjpegStatus::InvalidParameter,
            sys::NVJPEG_STATUS_BAD_JPEG => NvjpegStatus::BadJpeg,
            sys::NVJPEG_STATUS_JPEG_NOT_SUPPORTED => NvjpegStatus::JpegNotSupported,
            sys::NVJPEG_STATUS_ALLOCATOR_FAILURE => NvjpegStatus::AllocatorFailure,
            sys::NVJPEG_STATUS_EXECUTION_FAILED => NvjpegStatus::ExecutionFailed,
            sys::NVJPEG_STATUS_ARCH_MISMATCH => NvjpegStatus::ArchMismatch,
            sys::NVJPEG_STATUS_INTERNAL_ERROR => NvjpegStatus::InternalError,
            sys::NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED => {
                NvjpegStatus::ImplementationNotSupported
            }
            sys::NVJPEG_STATUS_INCOMPLETE_BITSTREAM => NvjpegStatus::IncompleteBitstream,
            other => NvjpegStatus::Other(other),
        })
    }

    /// The name `nvjpeg.h` gives the status.
    pub fn name(self) -> &'static str {
        match self {
            NvjpegStatus::NotInitialized => "NVJPEG_STATUS_NOT_INITIALIZED",
            NvjpegStatus::InvalidParameter => "NVJPEG_STATUS_INVALID_PARAMETER",
            NvjpegStatus::BadJpeg => "NVJPEG_STATUS_BAD_JPEG",
            NvjpegStatus::JpegNotSupported => "NVJPEG_STATUS_JPEG_NOT_SUPPORTED",
            NvjpegStatus::AllocatorFailure => "NVJPEG_STATUS_ALLOCATOR_FAILURE",
            NvjpegStatus::ExecutionFailed => "NVJPEG_STATUS_EXECUTION_FAILED",
            NvjpegStatus::ArchMismatch => "NVJPEG_STATUS_ARCH_MISMATCH",
            NvjpegStatus::InternalError => "NVJPEG_STATUS_INTERNAL_ERROR",
            NvjpegStatus::ImplementationNotSupported => {
                "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED"
            }
            NvjpegStatus::IncompleteBitstream => "NVJPEG_STATUS_INCOMPLETE_BITSTREAM",
            NvjpegStatus::Other(_) => "an nvjpegStatus_t nvjpeg.h does not name",
        }
    }
}

impl fmt::Display for NvjpegStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NvjpegStatus::Other(code) => write!(f, "{} ({code})", self.name()),
            _ => f.write_str(self.name()),
        }
    }
}

/// What can go wrong in a call of the hardware decoder.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NvjpegError {
    /// An nvJPEG call failed.
    #[error("{call} returned {status}")]
    Call {
        /// The call, as written in C.
        call: &'static str,
        /// What it returned.
        status: NvjpegStatus,
    },
    /// A CUDA driver call (through cudarc) failed.
    #[error("CUDA failed {context}: {source}")]
    Cuda {
        /// What was being done.
        context: &'static str,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// The GPU has no JPEG engine, or nvJPEG cannot drive it (no `libnvcuvid.so.1`, say).
    #[error("no hardware JPEG decoder: {call} returned {status}")]
    NoHardware {
        /// The call that said so.
        call: &'static str,
        /// What it returned.
        status: NvjpegStatus,
    },
    /// nvJPEG reports a hardware decoder with no engines.
    #[error("no hardware JPEG decoder: nvjpegGetHardwareDecoderInfo reports 0 engines")]
    NoEngines,
    /// More images than the decoder was created for.
    #[error("a batch of {len} images is over the decoder's max_batch of {max}")]
    BatchTooLarge {
        /// Images given.
        len: usize,
        /// The decoder's `max_batch`.
        max: usize,
    },
    /// The decoder's configuration, or a call's arguments, make no sense.
    #[error("invalid decoder use: {0}")]
    Config(String),
}

fn cuda(context: &'static str) -> impl Fn(DriverError) -> NvjpegError {
    move |source| NvjpegError::Cuda { context, source }
}

/// The result layer of every nvJPEG call: `Ok` for success, else the call and its status.
fn check(call: &'static str, status: c_int) -> Result<(), NvjpegError> {
    NvjpegStatus::of(status).map_err(|status| NvjpegError::Call { call, status })
}

/// A loaded nvJPEG library. Cheap to clone (the function table is shared).
#[derive(Clone)]
pub struct NvJpeg {
    functions: Arc<sys::Functions>,
    version: (i32, i32, i32),
}

impl fmt::Debug for NvJpeg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NvJpeg")
            .field("path", &self.functions.path)
            .field("version", &self.version)
            .finish()
    }
}

impl NvJpeg {
    /// Finds and opens libnvjpeg (see [`sys::candidates`] for where it looks; `GPUFEED_NVJPEG`
    /// names a file or folder to try first) and resolves the functions this module calls. Needs no
    /// GPU. Never panics: a missing library or symbol is an [`NvjpegUnavailable`] listing what was
    /// tried.
    pub fn load() -> Result<NvJpeg, NvjpegUnavailable> {
        // Loaded once and never unloaded: nvJPEG carries a static CUDA runtime, which is not
        // meant to be torn down while the process runs.
        static LOADED: OnceLock<NvJpeg> = OnceLock::new();
        if let Some(loaded) = LOADED.get() {
            return Ok(loaded.clone());
        }
        let loaded = Self::load_uncached()?;
        Ok(LOADED.get_or_init(|| loaded).clone())
    }

    fn load_uncached() -> Result<NvJpeg, NvjpegUnavailable> {
        let functions = sys::load()?;
        let property = |get: sys::GetPropertyFn| -> Option<(i32, i32, i32)> {
            let mut v = [0 as c_int; 3];
            for (kind, slot) in [sys::MAJOR_VERSION, sys::MINOR_VERSION, sys::PATCH_LEVEL]
                .into_iter()
                .zip(v.iter_mut())
            {
                // SAFETY: `get` is nvjpegGetProperty or nvjpegGetCudartProperty from the loaded
                // library (alive in `functions`); it writes one int through a valid pointer.
                let status = unsafe { get(kind, slot) };
                if status != sys::NVJPEG_STATUS_SUCCESS {
                    return None;
                }
            }
            Some((v[0], v[1], v[2]))
        };
        let Some(version) = property(functions.get_property) else {
            return Err(NvjpegUnavailable {
                reason: format!(
                    "{} was loaded but nvjpegGetProperty failed",
                    functions.path.display()
                ),
                tried: Vec::new(),
                searched: Vec::new(),
            });
        };
        if version.0 < 12 {
            return Err(NvjpegUnavailable {
                reason: format!(
                    "{} is nvJPEG {}.{}.{}; the hardware lane needs nvJPEG 12 or 13",
                    functions.path.display(),
                    version.0,
                    version.1,
                    version.2
                ),
                tried: Vec::new(),
                searched: Vec::new(),
            });
        }
        Ok(NvJpeg {
            functions: Arc::new(functions),
            version,
        })
    }

    /// nvJPEG's version (major, minor, patch).
    pub fn version(&self) -> (i32, i32, i32) {
        self.version
    }
}

/// How decoded pixels are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutputFormat {
    /// `NVJPEG_OUTPUT_RGBI`: R,G,B bytes per pixel in one plane (HWC).
    Interleaved,
    /// `NVJPEG_OUTPUT_YUV`: the Y plane, then the Cb and Cr planes at their stored
    /// (subsampled) size: what libjpeg's own chroma upsampling and colour conversion start from.
    Yuv,
    /// `NVJPEG_OUTPUT_Y`: the Y plane alone (gray JPEGs).
    Y,
}

impl OutputFormat {
    fn nvjpeg(self) -> sys::nvjpegOutputFormat_t {
        match self {
            OutputFormat::Interleaved => sys::NVJPEG_OUTPUT_RGBI,
            OutputFormat::Yuv => sys::NVJPEG_OUTPUT_YUV,
            OutputFormat::Y => sys::NVJPEG_OUTPUT_Y,
        }
    }
}

impl fmt::Display for OutputFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OutputFormat::Interleaved => "interleaved RGB (NVJPEG_OUTPUT_RGBI)",
            OutputFormat::Yuv => "Y, Cb and Cr planes as stored (NVJPEG_OUTPUT_YUV)",
            OutputFormat::Y => "the Y plane (NVJPEG_OUTPUT_Y)",
        })
    }
}

/// Where nvJPEG reads the compressed bytes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Staging {
    /// Copied into the decoder's pinned buffers first (the default).
    Pinned,
    /// Read where they lie, in the caller's slices, whatever memory they are in. `decode` then
    /// waits for the batch to finish before returning, since nothing else keeps those slices
    /// alive. `nvjpegDecodeBatched` holds its thread until the engines have done most of the
    /// call, so a copy into staging comes between calls, with the engines idle: on the H200
    /// machine one call of 256 camera photos decoded at 13.9 Gpx/s read in place and at 8.9-10.0
    /// copied first.
    InPlace,
}

/// Settings of a [`HardwareDecoder`].
#[derive(Debug, Clone)]
pub struct DecoderConfig {
    /// Most images per `nvjpegDecodeBatched`: a [`HardwareDecoder::decode_inspected`] call with
    /// more decodes them in chunks of this many.
    pub max_batch: usize,
    /// Pixel layout of the output.
    pub output: OutputFormat,
    /// Images with more pixels are refused ([`Refusal::TooLarge`]).
    pub max_image_pixels: u64,
    /// Cap on the device output arena; images of a batch that do not fit are refused
    /// ([`Refusal::NoRoom`]).
    pub max_output_bytes: usize,
    /// Cap on each of the two pinned staging buffers; likewise.
    pub max_staging_bytes: usize,
    /// Pinned bytes allocated up front for each staging buffer.
    pub initial_staging_bytes: usize,
    /// Device bytes allocated up front for the output arena.
    pub initial_output_bytes: usize,
    /// `(width, height)` for `nvjpegDecodeBatchedPreAllocate(max_batch, width, height, chroma)`,
    /// with 4:4:4 chroma (gray for a decoder of gray JPEGs only); DALI and nvImageCodec call it
    /// (with 1x1 when given no hint) because it makes nvJPEG keep a memory pool for the hardware
    /// decoder. Images up to that size then need no allocation inside nvJPEG: measured on the
    /// H100 machine, a 1x1 hint left the first epoch of an 8,192-file corpus at half the speed of
    /// the next ones while nvJPEG's pool grew.
    pub preallocate: Option<(u32, u32)>,
    /// `NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION`: smooth chroma upsampling, as libjpeg's
    /// "fancy" upsampling.
    pub upsampling_with_interpolation: bool,
    /// Where the compressed bytes are read from.
    pub staging: Staging,
    /// Take turns with the other decoders of the same [`HardwareHandle`] that do: one
    /// `nvjpegDecodeBatched` of theirs at a time (calls side by side decoded less together than
    /// one large call alone: 10.4-11.9 Gpx/s against 13.9 on camera photos).
    pub take_turns: bool,
    /// Call `nvjpegDecodeBatchedInitialize` before every batch, as DALI and nvImageCodec do,
    /// rather than only when the batch size or format changes (the header says once per size is
    /// enough).
    pub reinitialize_every_batch: bool,
    /// Diagnostics: fill the whole output arena with this byte before every batch, so that bytes
    /// the decoder does not write stand out.
    pub poison: Option<u8>,
    /// Send one-component (gray) JPEGs to the hardware (by [`inspect_markers`]).
    pub gray: bool,
    /// Send three-component (colour) JPEGs to the hardware (by [`inspect_markers`]).
    pub colour: bool,
}

impl Default for DecoderConfig {
    fn default() -> Self {
        DecoderConfig {
            max_batch: 256,
            output: OutputFormat::Interleaved,
            max_image_pixels: 64 << 20,
            max_output_bytes: 4 << 30,
            max_staging_bytes: 512 << 20,
            initial_staging_bytes: 16 << 20,
            initial_output_bytes: 0,
            preallocate: Some((1, 1)),
            upsampling_with_interpolation: false,
            staging: Staging::Pinned,
            take_turns: false,
            reinitialize_every_batch: false,
            poison: None,
            gray: true,
            colour: true,
        }
    }
}

/// Header facts of one JPEG the hardware will decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JpegInfo {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Components in the file: 1 (gray) or 3.
    pub components: u32,
    /// Chroma subsampling.
    pub subsampling: Subsampling,
    /// Compressed size in bytes.
    pub compressed_bytes: usize,
    /// Where a gray frame's sampling factors are rewritten as 1x1 in the staged copy
    /// ([`header::JpegHeader::gray_factors_at`]).
    pub gray_factors_at: Option<usize>,
    /// Whether the file has an Exif APP1 segment (which may turn the image).
    pub exif: bool,
}

impl JpegInfo {
    /// The facts the marker walk found in a file of `compressed_bytes`.
    fn from_header(h: &header::JpegHeader, compressed_bytes: usize) -> JpegInfo {
        JpegInfo {
            width: h.width as u32,
            height: h.height as u32,
            components: h.components as u32,
            subsampling: h.subsampling(),
            compressed_bytes,
            gray_factors_at: h.gray_factors_at(),
            exif: h.exif,
        }
    }
}

/// Why an image is not sent to the hardware decoder. Decode it on the CPU instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// No SOI marker.
    NotJpeg,
    /// The file ends before its end-of-image marker.
    Truncated,
    /// The markers make no sense.
    Malformed(&'static str),
    /// Progressive DCT.
    Progressive,
    /// Lossless JPEG.
    Lossless,
    /// Hierarchical JPEG.
    Hierarchical,
    /// Arithmetic entropy coding.
    Arithmetic,
    /// Not 8 bits per sample.
    Precision(u8),
    /// Four components: CMYK or YCCK.
    Cmyk,
    /// Neither 1 nor 3 (nor 4) components.
    Components(u32),
    /// Three components stored as RGB, not YCbCr.
    RgbColorspace,
    /// A subsampling the hardware does not decode.
    Subsampling(Subsampling),
    /// Sampling factors other than the usual ones for the subsampling (see
    /// [`header::JpegHeader::standard_factors`]).
    SamplingFactors,
    /// More than one scan (non-interleaved sequential).
    MultipleScans(u16),
    /// A zero dimension (or a height only given by a DNL marker).
    Empty,
    /// More pixels than [`DecoderConfig::max_image_pixels`].
    TooLarge {
        /// Width.
        width: u32,
        /// Height.
        height: u32,
    },
    /// nvJPEG's parser and this module's marker walk disagree on the size.
    HeaderMismatch,
    /// The batch's output or compressed bytes are over the decoder's caps.
    NoRoom,
}

impl Refusal {}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NotJpeg => f.write_str("not a JPEG file"),
            Refusal::Truncated => f.write_str("truncated (no end-of-image marker)"),
            Refusal::Malformed(what) => write!(f, "malformed JPEG: {what}"),
            Refusal::Progressive => f.write_str("progressive JPEG"),
            Refusal::Lossless => f.write_str("lossless JPEG"),
            Refusal::Hierarchical => f.write_str("hierarchical JPEG"),
            Refusal::Arithmetic => f.write_str("arithmetic-coded JPEG"),
            Refusal::Precision(bits) => write!(f, "{bits}-bit samples"),
            Refusal::Cmyk => f.write_str("CMYK or YCCK JPEG"),
            Refusal::Components(n) => write!(f, "{n} components"),
            Refusal::RgbColorspace => f.write_str("RGB-coded JPEG (not YCbCr)"),
            Refusal::Subsampling(s) => write!(f, "{s} subsampling"),
            Refusal::SamplingFactors => f.write_str("unusual sampling factors"),
            Refusal::MultipleScans(n) => write!(f, "{n} scans"),
            Refusal::Empty => f.write_str("zero width or height"),
            Refusal::TooLarge { width, height } => {
                write!(f, "{width}x{height} is over max_image_pixels")
            }
            Refusal::HeaderMismatch => f.write_str("nvJPEG reads a different size"),
            Refusal::NoRoom => f.write_str("over the decoder's output or staging cap"),
        }
    }
}

/// One decoded image in device memory.
///
/// Channel `c` (0 = R, 1 = G, 2 = B) of pixel `(x, y)` is the byte at
/// `ptr + y * pitch + x * pixel_stride + c * channel_stride`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodedImage {
    /// Header facts.
    pub info: JpegInfo,
    /// Device address (`CUdeviceptr`) of pixel (0, 0), channel 0.
    pub ptr: u64,
    /// Offset of `ptr` in the decoder's output arena.
    pub offset: usize,
    /// Layout.
    pub format: OutputFormat,
    /// Bytes from one row to the next.
    pub pitch: usize,
    /// Bytes from one pixel to the next in a row: 3 interleaved, 1 planar.
    pub pixel_stride: usize,
    /// Bytes from one channel to the next: 1 interleaved, the plane size planar.
    pub channel_stride: usize,
    /// Bytes from `ptr` that hold this image (all channels, padding between planes included).
    pub span: usize,
    /// With [`OutputFormat::Yuv`], the Cb and Cr planes.
    pub chroma: Option<ChromaPlanes>,
}

/// Where the Cb and Cr planes of a [`OutputFormat::Yuv`] image are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChromaPlanes {
    /// Offsets of the Cb and Cr planes from the image's `ptr`.
    pub offsets: [usize; 2],
    /// Bytes from one row to the next in each.
    pub pitch: usize,
    /// Samples per row and rows of each.
    pub width: usize,
    /// Rows of each.
    pub height: usize,
}

impl DecodedImage {}

/// What became of one image of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Decoded (once the batch's work has run on its stream).
    Decoded(DecodedImage),
    /// Not sent to the hardware.
    Refused(Refusal),
}

const ALIGN: usize = 256;

fn align_up(n: usize, to: usize) -> Option<usize> {
    n.checked_add(to - 1).map(|v| v / to * to)
}

/// Bytes an image of `width` x `height` takes in `format`, with its pitch and channel stride.
fn layout(format: OutputFormat, width: u32, height: u32) -> Option<(usize, usize, usize, usize)> {
    let (w, h) = (width as usize, height as usize);
    match format {
        OutputFormat::Yuv | OutputFormat::Y => None,
        OutputFormat::Interleaved => {
            let pitch = w.checked_mul(3)?;
            Some((pitch.checked_mul(h)?, pitch, 3, 1))
        }
    }
}

/// The planes of a [`OutputFormat::Yuv`] or [`OutputFormat::Y`] image of `width` x `height`
/// stored with `subsampling`: (bytes, Y pitch, chroma planes).
pub(crate) fn plane_layout(
    format: OutputFormat,
    width: u32,
    height: u32,
    subsampling: Subsampling,
) -> Option<(usize, usize, Option<ChromaPlanes>)> {
    let (w, h) = (width as usize, height as usize);
    let y_plane = align_up(w.checked_mul(h)?, ALIGN)?;
    if format == OutputFormat::Y || subsampling == Subsampling::Gray {
        return Some((y_plane, w, None));
    }
    let (cw, ch) = match subsampling {
        Subsampling::S444 => (w, h),
        Subsampling::S422 => (w.div_ceil(2), h),
        Subsampling::S420 => (w.div_ceil(2), h.div_ceil(2)),
        Subsampling::S440 => (w, h.div_ceil(2)),
        _ => return None,
    };
    let c_plane = align_up(cw.checked_mul(ch)?, ALIGN)?;
    let bytes = y_plane.checked_add(c_plane.checked_mul(2)?)?;
    Some((
        bytes,
        w,
        Some(ChromaPlanes {
            offsets: [y_plane, y_plane + c_plane],
            pitch: cw,
            width: cw,
            height: ch,
        }),
    ))
}

/// What one batch hands to `nvjpegDecodeBatched`, kept untouched until that batch's event has
/// completed: the pinned compressed bytes and the host arrays that point into them and into the
/// output arena. Two of these alternate, so the next batch can be staged while one decodes.
struct StagingSlot {
    host: Option<PinnedHostSlice<u8>>,
    ptr: *mut u8,
    capacity: usize,
    data: Vec<*const u8>,
    lengths: Vec<usize>,
    destinations: Vec<sys::nvjpegImage_t>,
    /// Recorded after the batch that read this slot.
    done: CudaEvent,
    pending: bool,
}

impl StagingSlot {
    fn wait(&mut self) -> Result<(), NvjpegError> {
        if self.pending {
            self.done
                .synchronize()
                .map_err(cuda("waiting for a batch's decode"))?;
            self.pending = false;
        }
        Ok(())
    }
}

/// Most images one [`HardwareDecoder::decode_inspected`] call takes.
pub const MAX_IMAGES_PER_CALL: usize = 1 << 16;

/// Decodes batches of baseline JPEGs on the GPU's hardware JPEG engines. See the module docs.
///
/// Not `Sync`: one thread at a time (nvJPEG's state and parse objects are per thread).
pub struct HardwareDecoder {
    functions: Arc<sys::Functions>,
    ctx: Arc<CudaContext>,
    /// The library handle, perhaps shared with other decoders.
    handle: Arc<HardwareHandle>,
    state: sys::nvjpegJpegState_t,
    /// The batch size and format the state was initialized for.
    initialized_for: Option<(usize, sys::nvjpegOutputFormat_t)>,
    config: DecoderConfig,
    slots: [StagingSlot; 2],
    next_slot: usize,
    last_slot: Option<usize>,
    /// The slot of the last batch that `decode` returned successfully with hardware work.
    ready: Option<usize>,
    arena: Option<CudaSlice<u8>>,
    /// Recorded on the stream as a call starts (after the arena's poison, if any): the host
    /// waits for it before the call's first batch goes to the hardware, whose writes do not
    /// wait for the stream (see the module docs).
    queued: CudaEvent,
    /// Whether the next batch submitted is a call's first (the host waits for `queued`).
    wait_for_queued: bool,
    stream: Option<Arc<CudaStream>>,
    outcomes: Vec<Outcome>,
    /// Indices of the call's images sent to the hardware.
    accepted: Vec<usize>,
    /// How long its creation's steps took.
    opening: DecoderOpening,
}

/// How long each step of a [`HardwareDecoder`]'s creation took.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DecoderOpening {
    /// `nvjpegJpegStateCreate`.
    pub state: Duration,
    /// `nvjpegDecodeBatchedPreAllocate`: nvJPEG's pools.
    pub pools: Duration,
    /// The two pinned staging buffers and the device output arena.
    pub buffers: Duration,
}

impl DecoderOpening {
    /// The longer of each step in `self` and `other`.
    pub fn longest(self, other: DecoderOpening) -> DecoderOpening {
        DecoderOpening {
            state: self.state.max(other.state),
            pools: self.pools.max(other.pools),
            buffers: self.buffers.max(other.buffers),
        }
    }
}

impl fmt::Display for DecoderOpening {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        write!(
            f,
            "states {:.0} ms, pools {:.0} ms, buffers {:.0} ms",
            ms(self.state),
            ms(self.pools),
            ms(self.buffers)
        )
    }
}

/// An nvJPEG library handle on the hardware backend (`nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE)`),
/// which any number of [`HardwareDecoder`]s may share: nvJPEG's handle is thread safe (each
/// decoder has a state of its own), and creating one is the longest step of opening the engines
/// (0.2-0.7 s on the H200 machine).
pub struct HardwareHandle {
    functions: Arc<sys::Functions>,
    ctx: Arc<CudaContext>,
    raw: sys::nvjpegHandle_t,
    /// `NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION` given at creation.
    upsampling_with_interpolation: bool,
    engines: Option<(u32, u32)>,
    created_in: Duration,
    /// Held through a decode call by decoders that take turns ([`DecoderConfig::take_turns`]).
    turn: std::sync::Mutex<()>,
}

// SAFETY: nvJPEG's library handle is thread safe (its guide's "Thread Safety": only states,
// streams and buffers must be one a thread); it is destroyed once, on drop, after every decoder
// holding it has destroyed its state.
unsafe impl Send for HardwareHandle {}
// SAFETY: as above: every thread may call nvJPEG with the handle at once.
unsafe impl Sync for HardwareHandle {}

impl fmt::Debug for HardwareHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HardwareHandle")
            .field("engines", &self.engines)
            .field("created_in", &self.created_in)
            .finish_non_exhaustive()
    }
}

impl HardwareHandle {
    /// Creates the handle on `ctx` and asks for the engine count (`nvjpegGetHardwareDecoderInfo`).
    ///
    /// [`NvjpegError::NoHardware`] when the GPU has no JPEG engine (`NVJPEG_STATUS_ARCH_MISMATCH`,
    /// or no engines reported).
    pub fn new(
        nvjpeg: &NvJpeg,
        ctx: &Arc<CudaContext>,
        upsampling_with_interpolation: bool,
    ) -> Result<Arc<HardwareHandle>, NvjpegError> {
        let creating = Instant::now();
        ctx.bind_to_thread()
            .map_err(cuda("binding the CUDA context"))?;
        let f = nvjpeg.functions.clone();
        let flags = if upsampling_with_interpolation {
            sys::NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION
        } else {
            sys::NVJPEG_FLAGS_DEFAULT
        };
        let mut raw: sys::nvjpegHandle_t = std::ptr::null_mut();
        // SAFETY: null allocators are allowed (nvJPEG then uses its runtime's allocators); the
        // handle is written through a valid pointer; the context is current on this thread.
        let status = unsafe {
            (f.create_ex)(
                sys::NVJPEG_BACKEND_HARDWARE,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                flags,
                &mut raw,
            )
        };
        match status {
            sys::NVJPEG_STATUS_SUCCESS => {}
            sys::NVJPEG_STATUS_ARCH_MISMATCH
            | sys::NVJPEG_STATUS_JPEG_NOT_SUPPORTED
            | sys::NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED => {
                let call = "nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE)";
                return Err(match NvjpegStatus::of(status) {
                    Err(status) => NvjpegError::NoHardware { call, status },
                    Ok(()) => NvjpegError::NoEngines,
                });
            }
            other => check("nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE)", other)?,
        }
        // From here on, the handle's Drop destroys it if a step fails.
        let mut handle = HardwareHandle {
            functions: f.clone(),
            ctx: ctx.clone(),
            raw,
            upsampling_with_interpolation,
            engines: None,
            created_in: Duration::ZERO,
            turn: std::sync::Mutex::new(()),
        };
        if let Some(info) = f.get_hardware_decoder_info {
            let (mut engines, mut cores) = (0 as c_uint, 0 as c_uint);
            // SAFETY: valid handle and out-pointers.
            let status = unsafe { info(raw, &mut engines, &mut cores) };
            if status == sys::NVJPEG_STATUS_SUCCESS {
                if engines == 0 {
                    return Err(NvjpegError::NoEngines);
                }
                handle.engines = Some((engines, cores));
            }
            // Otherwise the count is unknown; the handle exists and decodes.
        }
        handle.created_in = creating.elapsed();
        Ok(Arc::new(handle))
    }
}

impl Drop for HardwareHandle {
    fn drop(&mut self) {
        // Errors cannot be reported from here. The context must be current for nvJPEG to free
        // what the handle holds.
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: created by nvjpegCreateEx; every decoder sharing it has destroyed its state
            // (each holds the handle until then).
            unsafe { (self.functions.destroy)(self.raw) };
        }
    }
}

// SAFETY: the nvJPEG handle, state and parse object are plain heap objects that nvJPEG lets any
// thread use as long as no two threads use them at once, which `&mut self` guarantees (the type is
// not `Sync`). The raw pointers into pinned memory are owned by this decoder. Every method binds
// the CUDA context to the calling thread before calling nvJPEG or CUDA.
unsafe impl Send for HardwareDecoder {}

impl fmt::Debug for HardwareDecoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HardwareDecoder")
            .field("library", &self.functions.path)
            .field("engines", &self.engines())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl HardwareDecoder {
    /// Creates the decoder on the context of `stream` with `handle` (which may be shared):
    /// `nvjpegJpegStateCreate`, `nvjpegDecodeBatchedPreAllocate`, and the staging buffers. The
    /// configuration's upsampling must be the handle's.
    ///
    /// [`NvjpegError::NoHardware`] comes from [`HardwareHandle::new`] when the GPU has no JPEG
    /// engine.
    pub fn with_handle(
        handle: &Arc<HardwareHandle>,
        stream: &Arc<CudaStream>,
        config: DecoderConfig,
    ) -> Result<HardwareDecoder, NvjpegError> {
        if config.max_batch == 0 || config.max_batch > i32::MAX as usize {
            return Err(NvjpegError::Config(format!(
                "max_batch must be 1 to {}, not {}",
                i32::MAX,
                config.max_batch
            )));
        }
        if config.upsampling_with_interpolation != handle.upsampling_with_interpolation {
            return Err(NvjpegError::Config(
                "the decoder's upsampling differs from its handle's".into(),
            ));
        }
        let ctx = stream.context().clone();
        ctx.bind_to_thread()
            .map_err(cuda("binding the CUDA context"))?;
        let new_event = || ctx.new_event(None).map_err(cuda("creating a CUDA event"));
        let max_batch = config.max_batch;
        let slot = |done| StagingSlot {
            host: None,
            ptr: std::ptr::null_mut(),
            capacity: 0,
            data: Vec::with_capacity(max_batch),
            lengths: Vec::with_capacity(max_batch),
            destinations: Vec::with_capacity(max_batch),
            done,
            pending: false,
        };
        let mut decoder = HardwareDecoder {
            functions: handle.functions.clone(),
            ctx: ctx.clone(),
            handle: handle.clone(),
            state: std::ptr::null_mut(),
            initialized_for: None,
            slots: [slot(new_event()?), slot(new_event()?)],
            next_slot: 0,
            last_slot: None,
            ready: None,
            arena: None,
            queued: new_event()?,
            wait_for_queued: false,
            stream: None,
            outcomes: Vec::with_capacity(max_batch),
            accepted: Vec::with_capacity(max_batch),
            config,
            opening: DecoderOpening::default(),
        };
        let mut step = Instant::now();
        let mut lap = || {
            let now = Instant::now();
            std::mem::replace(&mut step, now).elapsed()
        };
        // From here on, `decoder`'s Drop releases whatever was created if a step fails.
        let f = decoder.functions.clone();
        let mut state: sys::nvjpegJpegState_t = std::ptr::null_mut();
        // SAFETY: valid handle and out-pointer.
        check("nvjpegJpegStateCreate", unsafe {
            (f.jpeg_state_create)(decoder.handle.raw, &mut state)
        })?;
        decoder.state = state;
        decoder.opening.state = lap();
        if let (Some((w, h)), Some(pre)) =
            (decoder.config.preallocate, f.decode_batched_pre_allocate)
        {
            let (w, h) = (w.clamp(1, i32::MAX as u32), h.clamp(1, i32::MAX as u32));
            let chroma = if decoder.config.gray && !decoder.config.colour {
                sys::NVJPEG_CSS_GRAY
            } else {
                sys::NVJPEG_CSS_444
            };
            // SAFETY: valid handle and state; plain integer arguments.
            // A pre-allocation that fails only costs speed (decoding allocates on demand), so its
            // status is not checked.
            unsafe {
                pre(
                    decoder.handle.raw,
                    decoder.state,
                    max_batch as c_int,
                    w as c_int,
                    h as c_int,
                    chroma,
                    decoder.config.output.nvjpeg(),
                )
            };
        }
        decoder.opening.pools = lap();
        if decoder.config.staging == Staging::Pinned {
            let initial = decoder
                .config
                .initial_staging_bytes
                .min(decoder.config.max_staging_bytes);
            for i in 0..2 {
                decoder.grow_staging(i, initial)?;
            }
        }
        if decoder.config.initial_output_bytes > 0 {
            let bytes = decoder
                .config
                .initial_output_bytes
                .min(decoder.config.max_output_bytes);
            decoder.grow_arena(stream, bytes)?;
        }
        decoder.opening.buffers = lap();
        Ok(decoder)
    }

    /// JPEG engines and cores per engine, from `nvjpegGetHardwareDecoderInfo`.
    pub fn engines(&self) -> Option<(u32, u32)> {
        self.handle.engines
    }

    /// How long its library handle took to create (shared or not).
    pub fn handle_created_in(&self) -> Duration {
        self.handle.created_in
    }

    /// How long the decoder's creation took, step by step.
    pub fn opening(&self) -> DecoderOpening {
        self.opening
    }

    /// Bytes of the device output arena now.
    fn output_capacity(&self) -> usize {
        self.arena.as_ref().map_or(0, |a| a.len())
    }

    /// Decodes `jpegs` (at most `max_batch`) on `stream`, already inspected: `infos[i]` is what
    /// [`inspect_markers`] returned for `jpegs[i]` with this decoder's configuration. Sends the
    /// accepted ones to the hardware in one `nvjpegDecodeBatched` and returns one [`Outcome`] per
    /// input, in order. The pixels are ready once the batch's work on `stream` has run.
    ///
    /// Blocks until the previous batch has finished on the GPU. An `Err` concerns the whole batch
    /// (an nvJPEG or CUDA call failed); the next call starts afresh.
    pub fn decode_inspected<'d>(
        &'d mut self,
        stream: &Arc<CudaStream>,
        jpegs: &[&[u8]],
        infos: &[JpegInfo],
    ) -> Result<DecodedBatch<'d>, NvjpegError> {
        if infos.len() != jpegs.len() {
            return Err(NvjpegError::Config(format!(
                "{} infos for {} files",
                infos.len(),
                jpegs.len()
            )));
        }
        self.decode_with(stream, jpegs, infos)
    }

    fn decode_with<'d>(
        &'d mut self,
        stream: &Arc<CudaStream>,
        jpegs: &[&[u8]],
        infos: &[JpegInfo],
    ) -> Result<DecodedBatch<'d>, NvjpegError> {
        if jpegs.len() > MAX_IMAGES_PER_CALL {
            return Err(NvjpegError::BatchTooLarge {
                len: jpegs.len(),
                max: MAX_IMAGES_PER_CALL,
            });
        }
        if stream.context() != &self.ctx {
            return Err(NvjpegError::Config(
                "the stream belongs to another CUDA context than the decoder".into(),
            ));
        }
        self.ctx
            .bind_to_thread()
            .map_err(cuda("binding the CUDA context"))?;
        self.ready = None;

        // 1. Inspect and lay out.
        self.outcomes.clear();
        self.accepted.clear();
        let format = self.config.output;
        let chunk = self.config.max_batch;
        let mut output_bytes = 0usize;
        // Pinned staging of the chunk being laid out: its images and bytes so far.
        let (mut chunk_images, mut chunk_staged) = (0usize, 0usize);
        for (i, jpeg) in jpegs.iter().enumerate() {
            // The caller's facts; the limit is this decoder's.
            let inspected = match infos.get(i) {
                Some(info) if info.compressed_bytes == jpeg.len() => {
                    within_limit(*info, &self.config)
                }
                _ => Err(Refusal::HeaderMismatch),
            };
            let info = match inspected {
                Ok(info) => info,
                Err(refusal) => {
                    self.outcomes.push(Outcome::Refused(refusal));
                    continue;
                }
            };
            let planes = match format {
                OutputFormat::Yuv | OutputFormat::Y => {
                    plane_layout(format, info.width, info.height, info.subsampling)
                        .map(|(bytes, pitch, chroma)| (bytes, pitch, 1, 0, chroma))
                }
                _ => layout(format, info.width, info.height)
                    .map(|(bytes, pitch, ps, cs)| (bytes, pitch, ps, cs, None)),
            };
            let Some((bytes, pitch, pixel_stride, channel_stride, chroma)) = planes else {
                self.outcomes.push(Outcome::Refused(Refusal::TooLarge {
                    width: info.width,
                    height: info.height,
                }));
                continue;
            };
            let out_end = align_up(output_bytes, ALIGN).and_then(|o| o.checked_add(bytes));
            let fits_output = out_end.is_some_and(|end| end <= self.config.max_output_bytes);
            // Chunks are staged one at a time, each within the cap, laid out as `submit_chunk`
            // lays them out.
            if chunk_images == chunk {
                (chunk_images, chunk_staged) = (0, 0);
            }
            let staged = chunk_staged.next_multiple_of(64).saturating_add(jpeg.len());
            let fits_staging =
                self.config.staging == Staging::InPlace || staged <= self.config.max_staging_bytes;
            let (Some(out_end), true, true) = (out_end, fits_output, fits_staging) else {
                self.outcomes.push(Outcome::Refused(Refusal::NoRoom));
                continue;
            };
            (chunk_images, chunk_staged) = (chunk_images + 1, staged);
            let offset = out_end - bytes;
            self.accepted.push(i);
            output_bytes = out_end;
            self.outcomes.push(Outcome::Decoded(DecodedImage {
                info,
                ptr: 0, // set once the arena exists
                offset,
                format,
                pitch,
                pixel_stride,
                channel_stride,
                span: bytes,
                chroma,
            }));
        }
        let n = self.accepted.len();
        let fmt = format.nvjpeg();
        self.stream = Some(stream.clone());
        if n == 0 {
            return Ok(DecodedBatch {
                decoder: self,
                slot: None,
            });
        }

        // 2. The previous call's batches must be done before the arena and state are reused.
        for slot in self.slots.iter_mut() {
            slot.wait()?;
        }
        if self.output_capacity() < output_bytes {
            let grown = output_bytes
                .saturating_add(output_bytes / 4)
                .min(self.config.max_output_bytes.max(output_bytes))
                .max(output_bytes);
            self.grow_arena(stream, grown)?;
        }
        let Some(arena) = self.arena.as_mut() else {
            return Err(NvjpegError::Config("no output arena".into()));
        };
        let arena_len = arena.len();
        let (base, arena_guard) = arena.device_ptr_mut(stream);
        if let Some(value) = self.config.poison {
            // SAFETY: `base` is the start of this arena's `arena_len` bytes, alive while the
            // guard borrows it; the memset is queued on `stream`, which the guard orders after
            // earlier uses of the arena.
            unsafe {
                cudarc::driver::result::memset_d8_async(base, value, arena_len, stream.cu_stream())
            }
            .map_err(cuda("poisoning the output arena"))?;
        }
        for outcome in self.outcomes.iter_mut() {
            if let Outcome::Decoded(image) = outcome {
                image.ptr = base + image.offset as u64;
            }
        }
        drop(arena_guard);
        // Everything queued on the stream so far: the work that reads the previous call's
        // output, and the poison. The host waits for it before the engines write the arena.
        self.queued
            .record(stream)
            .map_err(cuda("recording the work queued before the decode"))?;
        self.wait_for_queued = true;

        // 3. The chunks, each staged in the slot the previous one does not use and sent to the
        // hardware in one `nvjpegDecodeBatched`.
        let mut last = None;
        for start in (0..n).step_by(chunk.max(1)) {
            let images = start..(start + chunk).min(n);
            last = Some(self.submit_chunk(stream, jpegs, images, fmt)?);
        }
        self.ready = last;
        Ok(DecodedBatch {
            decoder: self,
            slot: last,
        })
    }

    /// Stages the accepted images `images` (indices into `self.accepted`) and queues their
    /// decode on `stream`; returns the slot used.
    fn submit_chunk(
        &mut self,
        stream: &Arc<CudaStream>,
        jpegs: &[&[u8]],
        images: std::ops::Range<usize>,
        fmt: sys::nvjpegOutputFormat_t,
    ) -> Result<usize, NvjpegError> {
        let format = self.config.output;
        let slot_index = self.next_slot;
        self.slots[slot_index].wait()?;
        // Staging layout: the images, 64-byte aligned (within the cap: `decode_with` laid the
        // chunk out so).
        let mut staged = 0usize;
        for &i in &self.accepted[images.clone()] {
            staged = staged.next_multiple_of(64).saturating_add(jpegs[i].len());
        }
        if self.config.staging == Staging::Pinned && self.slots[slot_index].capacity < staged {
            let grown = staged
                .saturating_add(staged / 4)
                .min(self.config.max_staging_bytes)
                .max(staged);
            self.grow_staging(slot_index, grown)?;
        }
        let slot = &mut self.slots[slot_index];
        slot.data.clear();
        slot.lengths.clear();
        slot.destinations.clear();
        let mut at = 0usize;
        let sources = self.accepted[images.clone()].iter().map(|&i| {
            let factors = match &self.outcomes[i] {
                Outcome::Decoded(d) => d.info.gray_factors_at,
                _ => None,
            };
            (jpegs[i], factors)
        });
        for (jpeg, factors) in sources {
            let src = match self.config.staging {
                Staging::Pinned => {
                    at = at.next_multiple_of(64);
                    // SAFETY: `slot.ptr` points to `capacity >= staged` bytes of pinned memory
                    // owned by this slot, which no queued work reads (waited above); `[at, at +
                    // len)` lies within `staged` (laid out the same way above), the source is a
                    // separate host slice, and the factor byte is written only inside the copy.
                    let dst = unsafe {
                        let dst = slot.ptr.add(at);
                        std::ptr::copy_nonoverlapping(jpeg.as_ptr(), dst, jpeg.len());
                        if let Some(byte) = factors.filter(|&b| b < jpeg.len()) {
                            *dst.add(byte) = 0x11;
                        }
                        dst.cast_const()
                    };
                    at += jpeg.len();
                    dst
                }
                Staging::InPlace => jpeg.as_ptr(),
            };
            slot.data.push(src);
            slot.lengths.push(jpeg.len());
        }
        // Destinations: each image's place in the arena.
        for &i in &self.accepted[images] {
            if let Outcome::Decoded(image) = &self.outcomes[i] {
                slot.destinations
                    .push(destination(format, image.ptr, image.pitch, image.chroma));
            }
        }

        let batch_len = slot.data.len();
        // The previous chunk must be done before the state is reused.
        if let Some(last) = self.last_slot {
            self.slots[last].wait()?;
        }
        if self.config.reinitialize_every_batch || self.initialized_for != Some((batch_len, fmt)) {
            self.initialized_for = None;
            // SAFETY: valid handle and state, not used by queued work (previous chunk waited
            // for); plain integer arguments (batch_len <= max_batch <= i32::MAX).
            check("nvjpegDecodeBatchedInitialize", unsafe {
                (self.functions.decode_batched_initialize)(
                    self.handle.raw,
                    self.state,
                    batch_len as c_int,
                    1,
                    fmt,
                )
            })?;
            self.initialized_for = Some((batch_len, fmt));
        }
        // The engines write the arena as soon as the batch is submitted, whatever the stream
        // still holds: the work that reads the previous call's output must be done (once per
        // call; a call's later batches write other parts of the arena). Waited for before the
        // turn, so that a decoder waiting on its own stream leaves the engines to the other.
        if std::mem::take(&mut self.wait_for_queued) {
            self.queued
                .synchronize()
                .map_err(cuda("waiting for the work queued before the decode"))?;
        }
        // Held to the end of the call: through the wait for its batch when read in place.
        let handle = self.handle.clone();
        let _turn = self
            .config
            .take_turns
            .then(|| handle.turn.lock().unwrap_or_else(PoisonError::into_inner));
        let slot = &mut self.slots[slot_index];
        // SAFETY: the slot's `data`/`lengths`/`destinations` hold `batch_len` entries each,
        // matching the size given to nvjpegDecodeBatchedInitialize, and, like the bytes `data[i]`
        // points to (`lengths[i]` of them), stay untouched until this chunk's event has completed
        // (pinned staging: the slot is not written again before `wait`; read in place: we wait
        // below before returning). Each destination addresses its image's bytes inside the
        // arena, which lives until the decoder is dropped or grows it after waiting for every
        // slot. The stream belongs to the current context.
        let status = unsafe {
            (self.functions.decode_batched)(
                self.handle.raw,
                self.state,
                slot.data.as_ptr(),
                slot.lengths.as_ptr(),
                slot.destinations.as_mut_ptr(),
                stream.cu_stream() as sys::cudaStream_t,
            )
        };
        let recorded = slot.done.record(stream);
        slot.pending = recorded.is_ok();
        self.last_slot = Some(slot_index);
        self.next_slot = 1 - slot_index;
        if status != sys::NVJPEG_STATUS_SUCCESS {
            // The header: nvjpegDecodeBatchedInitialize also "resets failed batches".
            self.initialized_for = None;
            if self.config.staging == Staging::InPlace {
                let _ = self.slots[slot_index].wait();
            }
            return check("nvjpegDecodeBatched", status).map(|()| slot_index);
        }
        recorded.map_err(cuda("recording the batch's event"))?;
        if self.config.staging == Staging::InPlace {
            self.slots[slot_index].wait()?;
        }
        Ok(slot_index)
    }

    /// Waits for outstanding work, then destroys the nvJPEG objects, reporting the first failure
    /// (dropping the decoder does the same, silently).
    fn release(&mut self) -> Result<(), NvjpegError> {
        let mut first: Result<(), NvjpegError> = Ok(());
        let mut keep = |r: Result<(), NvjpegError>| {
            if first.is_ok() {
                first = r;
            }
        };
        keep(
            self.ctx
                .bind_to_thread()
                .map_err(cuda("binding the CUDA context")),
        );
        for slot in self.slots.iter_mut() {
            keep(slot.wait());
        }
        let f = self.functions.clone();
        if !self.state.is_null() {
            // SAFETY: created by nvjpegJpegStateCreate; no queued work uses it (waited above).
            keep(check("nvjpegJpegStateDestroy", unsafe {
                (f.jpeg_state_destroy)(self.state)
            }));
            self.state = std::ptr::null_mut();
        }
        // The handle is destroyed when the last decoder sharing it is dropped.
        first
    }

    fn grow_staging(&mut self, index: usize, bytes: usize) -> Result<(), NvjpegError> {
        let slot = &mut self.slots[index];
        slot.wait()?;
        // Drop the old buffer first: no queued work reads it (waited above).
        slot.host = None;
        slot.ptr = std::ptr::null_mut();
        slot.capacity = 0;
        let bytes = align_up(bytes.max(1), 1 << 20).unwrap_or(bytes.max(1));
        // Flags 0: ordinary page-locked memory. Not write-combined: nvJPEG reads the headers back
        // on the CPU, and CPU reads of write-combined memory are very slow.
        // SAFETY: the memory is uninitialized u8, only written by `decode` before nvJPEG reads
        // the written range.
        let mut host = unsafe { self.ctx.alloc_pinned_with_flags::<u8>(bytes, 0) }
            .map_err(cuda("allocating pinned staging memory"))?;
        let ptr = host
            .as_mut_ptr()
            .map_err(cuda("mapping pinned staging memory"))?;
        slot.ptr = ptr;
        slot.capacity = bytes;
        slot.host = Some(host);
        Ok(())
    }

    fn grow_arena(&mut self, stream: &Arc<CudaStream>, bytes: usize) -> Result<(), NvjpegError> {
        // Dropping the old arena queues its release behind the work cudarc knows about; nothing
        // of ours uses it any more (the previous batch was waited for).
        self.arena = None;
        let bytes = align_up(bytes.max(1), 2 << 20)
            .unwrap_or(bytes.max(1))
            .min(self.config.max_output_bytes.max(bytes));
        // SAFETY: uninitialized device bytes; nvJPEG writes every byte of an image before it is
        // reported decoded, and u8 has no invalid values for the diagnostics that read the rest.
        let arena = unsafe { stream.alloc::<u8>(bytes) }
            .map_err(cuda("allocating the device output arena"))?;
        // Stream-ordered allocations are only usable in stream order; waiting once here makes the
        // arena plain device memory for nvJPEG's engines, whatever they synchronize with.
        stream
            .synchronize()
            .map_err(cuda("waiting for the output arena's allocation"))?;
        self.arena = Some(arena);
        Ok(())
    }
}

impl Drop for HardwareDecoder {
    fn drop(&mut self) {
        // Errors cannot be reported from here; `close` reports them.
        let _ = self.release();
    }
}

/// nvJPEG's descriptor of an output at `ptr` laid out in `format`.
fn destination(
    format: OutputFormat,
    ptr: u64,
    pitch: usize,
    chroma: Option<ChromaPlanes>,
) -> sys::nvjpegImage_t {
    let ptr = ptr as usize;
    let mut d = sys::nvjpegImage_t::EMPTY;
    match format {
        OutputFormat::Interleaved => {
            d.channel[0] = ptr as *mut u8;
            d.pitch[0] = pitch;
        }
        OutputFormat::Yuv | OutputFormat::Y => {
            d.channel[0] = ptr as *mut u8;
            d.pitch[0] = pitch;
            if let Some(chroma) = chroma {
                for c in 0..2 {
                    d.channel[c + 1] = (ptr + chroma.offsets[c]) as *mut u8;
                    d.pitch[c + 1] = chroma.pitch;
                }
            }
        }
    }
    d
}

/// Maps nvJPEG's subsampling value.
fn classify(h: &JpegHeader) -> Result<(), Refusal> {
    if h.hierarchical() {
        return Err(Refusal::Hierarchical);
    }
    if h.progressive() {
        return Err(Refusal::Progressive);
    }
    if h.lossless() {
        return Err(Refusal::Lossless);
    }
    if h.arithmetic() {
        return Err(Refusal::Arithmetic);
    }
    if h.precision != 8 {
        return Err(Refusal::Precision(h.precision));
    }
    match h.components {
        1 | 3 => {}
        4 => return Err(Refusal::Cmyk),
        n => return Err(Refusal::Components(n as u32)),
    }
    if h.rgb_colorspace() {
        return Err(Refusal::RgbColorspace);
    }
    let s = h.subsampling();
    if !s.hardware_supported() {
        return Err(Refusal::Subsampling(s));
    }
    if !h.standard_factors() {
        return Err(Refusal::SamplingFactors);
    }
    if h.scans != 1 {
        return Err(Refusal::MultipleScans(h.scans));
    }
    if !h.complete {
        return Err(Refusal::Truncated);
    }
    if h.width == 0 || h.height == 0 {
        return Err(Refusal::Empty);
    }
    Ok(())
}

fn refusal_of(e: HeaderError) -> Refusal {
    match e {
        HeaderError::NotJpeg => Refusal::NotJpeg,
        HeaderError::Truncated => Refusal::Truncated,
        HeaderError::Malformed(what) => Refusal::Malformed(what),
    }
}

/// Whether a decoder with `config` takes `data`, from this module's marker walk alone
/// ([`header::scan`]): everything it refuses nvJPEG refuses too, and it costs microseconds where
/// nvJPEG's parse of the whole stream costs tens. Callable from any thread (no nvJPEG
/// object is involved), so that many files can be screened in parallel before
/// [`HardwareDecoder::decode_inspected`].
pub fn inspect_markers(config: &DecoderConfig, data: &[u8]) -> Result<JpegInfo, Refusal> {
    let h = header::scan(data).map_err(refusal_of)?;
    classify(&h)?;
    if (h.components == 1 && !config.gray) || (h.components != 1 && !config.colour) {
        return Err(Refusal::Components(h.components as u32));
    }
    within_limit(JpegInfo::from_header(&h, data.len()), config)
}

/// What [`inspect_markers`] finds in a progressive Huffman JPEG of 8-bit samples and 1 or 3
/// components within `config`'s pixel limit, which the engines refuse but whose coefficients a
/// CPU thread can decode for the GPU; the reason otherwise.
pub fn inspect_progressive(config: &DecoderConfig, data: &[u8]) -> Result<JpegInfo, Refusal> {
    let h = header::scan(data).map_err(refusal_of)?;
    if h.frame_marker != 0xC2 {
        return Err(match classify(&h) {
            Err(refusal) => refusal,
            Ok(()) => Refusal::Malformed("not a progressive JPEG"),
        });
    }
    if h.precision != 8 {
        return Err(Refusal::Precision(h.precision));
    }
    if h.components != 1 && h.components != 3 {
        return Err(Refusal::Components(h.components as u32));
    }
    within_pixels(JpegInfo::from_header(&h, data.len()), config)
}

fn within_limit(info: JpegInfo, config: &DecoderConfig) -> Result<JpegInfo, Refusal> {
    if info.gray_factors_at.is_some() && config.staging == Staging::InPlace {
        // The factors are rewritten in the staged copy; the caller's bytes are left alone.
        return Err(Refusal::SamplingFactors);
    }
    within_pixels(info, config)
}

/// `info` unless its image has more than `config`'s pixels.
fn within_pixels(info: JpegInfo, config: &DecoderConfig) -> Result<JpegInfo, Refusal> {
    if info.width as u64 * info.height as u64 > config.max_image_pixels {
        return Err(Refusal::TooLarge {
            width: info.width,
            height: info.height,
        });
    }
    Ok(info)
}

/// The result of one [`HardwareDecoder::decode_inspected`]: one [`Outcome`] per input image.
/// Borrows the decoder, whose output arena holds the pixels, until dropped.
pub struct DecodedBatch<'d> {
    decoder: &'d HardwareDecoder,
    slot: Option<usize>,
}

impl fmt::Debug for DecodedBatch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DecodedBatch")
            .field("outcomes", &self.decoder.outcomes.len())
            .field("slot", &self.slot)
            .finish()
    }
}

impl<'d> DecodedBatch<'d> {
    /// One outcome per input image, in input order.
    pub fn outcomes(&self) -> &'d [Outcome] {
        &self.decoder.outcomes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_typed_with_their_header_names() {
        assert_eq!(NvjpegStatus::of(sys::NVJPEG_STATUS_SUCCESS), Ok(()));
        let arch = NvjpegStatus::of(sys::NVJPEG_STATUS_ARCH_MISMATCH);
        assert_eq!(arch, Err(NvjpegStatus::ArchMismatch));
        assert_eq!(
            NvjpegStatus::IncompleteBitstream.to_string(),
            "NVJPEG_STATUS_INCOMPLETE_BITSTREAM"
        );
        assert_eq!(NvjpegStatus::of(42), Err(NvjpegStatus::Other(42)));
        let failed = check("nvjpegDecodeBatched", sys::NVJPEG_STATUS_EXECUTION_FAILED);
        let message = failed.map_err(|e| e.to_string()).err();
        assert_eq!(
            message.as_deref(),
            Some("nvjpegDecodeBatched returned NVJPEG_STATUS_EXECUTION_FAILED")
        );
    }

    #[test]
    fn layouts_address_every_channel() {
        let (bytes, pitch, ps, cs) = layout(OutputFormat::Interleaved, 37, 23).unwrap();
        assert_eq!((bytes, pitch, ps, cs), (37 * 3 * 23, 111, 3, 1));
        assert!(layout(OutputFormat::Interleaved, u32::MAX, u32::MAX).is_none());
    }

    /// A 4:2:0 JPEG of `side` x `side` noise from `seed`.
    fn noise_jpeg(side: u32, seed: u32) -> Vec<u8> {
        use turbojpeg_region::{encode, EncodeOptions, Format};
        let mut state = seed.wrapping_mul(2_654_435_761) | 1;
        let pixels: Vec<u8> = (0..side * side * 3)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                (state >> 24) as u8
            })
            .collect();
        encode(&pixels, side, side, Format::Rgb, &EncodeOptions::default()).expect("encode")
    }

    /// The engines write a batch's pixels as the batch is submitted, whatever the stream still
    /// holds (pytorch/torchcodec#1634): the decoder waits for the work queued before a call, so
    /// that work reads the previous call's pixels, not the next one's.
    #[test]
    fn work_queued_before_a_call_reads_the_previous_calls_pixels() {
        use cudarc::driver::{LaunchConfig, PushKernelArg};
        let Some(gpu) = crate::cuda::test_gpu(module_path!()) else {
            return;
        };
        let skip = |why: String| eprintln!("skipped: {}: {why}", module_path!());
        let nvjpeg = match NvJpeg::load() {
            Ok(nvjpeg) => nvjpeg,
            Err(e) => return skip(e.to_string()),
        };
        let stream = gpu.stream().context().new_stream().expect("a stream");
        let handle = match HardwareHandle::new(&nvjpeg, stream.context(), false) {
            Ok(handle) => handle,
            Err(e @ (NvjpegError::NoHardware { .. } | NvjpegError::NoEngines)) => {
                return skip(e.to_string())
            }
            Err(e) => panic!("the handle: {e}"),
        };
        let config = DecoderConfig::default();
        let mut decoder =
            HardwareDecoder::with_handle(&handle, &stream, config.clone()).expect("the decoder");
        let (first, second) = (noise_jpeg(512, 1), noise_jpeg(512, 2));
        let mut decode = |jpeg: &[u8]| -> DecodedImage {
            let info = inspect_markers(&config, jpeg).expect("a baseline JPEG");
            let batch = decoder
                .decode_inspected(&stream, &[jpeg], &[info])
                .expect("decode");
            match batch.outcomes() {
                [Outcome::Decoded(image)] => *image,
                other => panic!("{other:?}"),
            }
        };
        // A kernel that spins for about 0.1 s, then copies the pixels: the work queued
        // before the second call.
        let ptx = cudarc::nvrtc::compile_ptx(
            "extern \"C\" __global__ void spin_then_copy(const unsigned char *from, \
             unsigned char *to, unsigned long long n, long long cycles) {\n\
             if (threadIdx.x == 0) { long long start = clock64(); \
             while (clock64() - start < cycles) {} }\n\
             __syncthreads();\n\
             for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x) to[i] = from[i];\n}\n",
        )
        .expect("compile");
        let module = stream.context().load_module(ptx).expect("load");
        let spin_then_copy = module.load_function("spin_then_copy").expect("the kernel");

        let image = decode(&first);
        stream.synchronize().expect("sync");
        let mut want = stream.alloc_zeros::<u8>(image.span).expect("alloc");
        let mut got = stream.alloc_zeros::<u8>(image.span).expect("alloc");
        let (span, none) = (image.span as u64, 0i64);
        let mut launch = stream.launch_builder(&spin_then_copy);
        launch.arg(&image.ptr).arg(&mut want).arg(&span).arg(&none);
        let one_block = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: `image.ptr` addresses `span` bytes of the decoder's arena, `want` holds
        // `span` bytes, and the kernel copies `span` bytes and nothing else.
        unsafe { launch.launch(one_block) }.expect("launch");
        let want = stream.clone_dtoh(&want).expect("download");

        let image = decode(&first);
        let cycles = 200_000_000i64;
        let mut launch = stream.launch_builder(&spin_then_copy);
        launch.arg(&image.ptr).arg(&mut got).arg(&span).arg(&cycles);
        // SAFETY: as above.
        unsafe { launch.launch(one_block) }.expect("launch");
        let next = decode(&second);
        assert_eq!(
            next.ptr, image.ptr,
            "the second call reuses the first's place"
        );
        let got = stream.clone_dtoh(&got).expect("download");
        assert!(
            got == want,
            "the pixels read after the spin are another image's ({} of {} bytes differ)",
            got.iter().zip(&want).filter(|(a, b)| a != b).count(),
            want.len()
        );
    }

    fn fixture(name: &str) -> Vec<u8> {
        let path = format!("tests/jpeg-lane/{name}");
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn the_marker_walk_refuses_what_the_hardware_cannot_take() {
        let verdict = |name: &str| {
            header::scan(&fixture(name))
                .map_err(refusal_of)
                .and_then(|h| classify(&h))
        };
        for ok in [
            "ok_444.jpg",
            "ok_422.jpg",
            "ok_420.jpg",
            "ok_440.jpg",
            "ok_gray.jpg",
            "ok_420_odd_37x23.jpg",
            "ok_gray_odd_37x23.jpg",
            "ok_420_1x1.jpg",
            "ok_420_restart.jpg",
            "ok_420_optimized.jpg",
        ] {
            assert_eq!(verdict(ok), Ok(()), "{ok}");
        }
        assert_eq!(verdict("bad_progressive.jpg"), Err(Refusal::Progressive));
        assert_eq!(verdict("bad_arithmetic.jpg"), Err(Refusal::Arithmetic));
        assert_eq!(
            verdict("bad_411.jpg"),
            Err(Refusal::Subsampling(Subsampling::S411))
        );
        assert_eq!(
            verdict("bad_rgb_colorspace.jpg"),
            Err(Refusal::RgbColorspace)
        );
        assert_eq!(verdict("bad_multiscan.jpg"), Err(Refusal::MultipleScans(3)));
        assert_eq!(verdict("bad_cmyk.jpg"), Err(Refusal::Cmyk));
        assert_eq!(verdict("bad_truncated.jpg"), Err(Refusal::Truncated));
        assert_eq!(verdict("bad_truncated_header.jpg"), Err(Refusal::Truncated));
        assert_eq!(verdict("bad_12bit_header.jpg"), Err(Refusal::Precision(12)));
        assert_eq!(verdict("bad_lossless_header.jpg"), Err(Refusal::Lossless));
        assert_eq!(verdict("bad_not_jpeg.png"), Err(Refusal::NotJpeg));
    }
}
