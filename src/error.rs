//! The crate's one error type, and the errors of single images.
//!
//! Errors keep their causes: a failed CUDA call carries cudarc's [`DriverError`] as its
//! [`std::error::Error::source`], an unreadable file its [`std::io::ErrorKind`], a CUDA probe says
//! which piece is missing ([`CudaUnavailable`]), and an option mistake names the option.
//!
//! Errors that concern a single image ([`ItemError`]) carry the image's id (its path, or the id
//! the caller gave in-memory bytes) and the reason; the pipeline either skips such an image and
//! lists it on the batch, or stops with [`Error::Item`], depending on [`crate::OnError`].

use std::fmt;
use std::path::PathBuf;

use std::panic::{catch_unwind, AssertUnwindSafe};

use cudarc::driver::sys::CUresult;
use cudarc::driver::DriverError;

/// Why one image could not be turned into pixels.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ItemErrorKind {
    /// The file could not be read (missing, vanished after listing, a directory, no permission).
    Read {
        /// The operating system's classification of the failure.
        kind: std::io::ErrorKind,
        /// The failure in words.
        reason: String,
    },
    /// The bytes are not in a format this crate decodes.
    UnknownFormat,
    /// The bytes look like an image but could not be decoded (corrupt).
    Decode(String),
    /// The file ends before the image does (Pillow's "image file is truncated"); refused rather
    /// than delivered with its missing part filled in.
    Truncated(String),
    /// The decoded image could not be resized to the output (an inconsistent size).
    Resize(String),
    /// A decoder panicked on these bytes; the panic was caught and fails this image only.
    DecoderPanic(String),
    /// The image claims more pixels than the configured limit; refused before decoding.
    TooLarge {
        /// Width the file claims.
        width: u64,
        /// Height the file claims.
        height: u64,
        /// The configured limit in pixels.
        limit: u64,
    },
    /// The image has a zero dimension.
    Empty,
    /// A part of a tar shard that holds no readable sample (a bad header, a member cut short, a
    /// sample without an image member, a label that is not a number).
    Archive(String),
    /// The file is larger than the configured limit; refused before it is read.
    FileTooLarge {
        /// Size of the file.
        bytes: u64,
        /// The configured limit ([`crate::DecodeOptions::max_file_bytes`]).
        limit: u64,
    },
    /// The image's targets cannot be used (a missing mask, a mask of another size than its
    /// image, an RLE whose runs do not cover its size, a polygon of fewer than three points);
    /// the sample is skipped (see `docs/targets.md`).
    Target(String),
}

impl ItemErrorKind {
    /// A read failure from an I/O error, keeping its kind.
    pub(crate) fn read(error: &std::io::Error, reason: impl Into<String>) -> ItemErrorKind {
        ItemErrorKind::Read {
            kind: error.kind(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for ItemErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ItemErrorKind::Read { reason, .. } => write!(f, "cannot read: {reason}"),
            ItemErrorKind::UnknownFormat => {
                write!(f, "not a JPEG, PNG, WebP, BMP, GIF, TIFF, PPM or PGM image")
            }
            ItemErrorKind::Decode(reason) => write!(f, "cannot decode: {reason}"),
            ItemErrorKind::Truncated(reason) => write!(f, "image file is truncated: {reason}"),
            ItemErrorKind::Resize(reason) => write!(f, "cannot resize: {reason}"),
            ItemErrorKind::DecoderPanic(reason) => write!(f, "the decoder failed: {reason}"),
            ItemErrorKind::TooLarge {
                width,
                height,
                limit,
            } => write!(
                f,
                "{width}x{height} pixels is over the limit of {limit} pixels (see max_pixels)"
            ),
            ItemErrorKind::Empty => write!(f, "image has no pixels"),
            ItemErrorKind::Archive(reason) => write!(f, "{reason}"),
            ItemErrorKind::FileTooLarge { bytes, limit } => write!(
                f,
                "{bytes} bytes is over the limit of {limit} bytes a file (see max_file_bytes)"
            ),
            ItemErrorKind::Target(reason) => write!(f, "bad target: {reason}"),
        }
    }
}

/// One image that could not be processed: which one, where it sits in the source, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemError {
    /// The image's id: its path for files, the caller's id for in-memory bytes.
    pub id: String,
    /// Index of the image in the source's listing.
    pub index: usize,
    /// What went wrong.
    pub kind: ItemErrorKind,
}

impl fmt::Display for ItemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.id, self.kind)
    }
}

impl std::error::Error for ItemError {}

/// Why CUDA cannot be used on this machine, as far as the probe could tell.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaUnavailable {
    /// The driver library could not be loaded.
    #[error(
        "the NVIDIA driver library (libcuda.so) was not found: install the NVIDIA driver, or use \
         the CPU device"
    )]
    NoDriverLibrary,
    /// NVRTC could not be loaded.
    #[error(
        "NVRTC (libnvrtc.so, from the CUDA toolkit) was not found: it compiles the kernels at run \
         time; install the CUDA runtime libraries, or use the CPU device"
    )]
    NoNvrtc,
    /// The driver loaded but reports no device.
    #[error("the driver reports no CUDA device")]
    NoDevice,
    /// The requested ordinal is out of range.
    #[error("no CUDA device {ordinal}: this machine has {count} device(s)")]
    NoSuchDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// Devices present.
        count: usize,
    },
    /// The driver refused to start (not initialized, a stub library, an invalid device).
    #[error("{context}: {source}")]
    Driver {
        /// What was being done.
        context: &'static str,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// A call into the CUDA libraries panicked (an installation lacking a symbol).
    #[error("{context}: {message}")]
    Broken {
        /// What was being done.
        context: &'static str,
        /// The panic's message.
        message: String,
    },
}

/// One option that decides the output and differs between a saved state and the pipeline it is
/// given to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionDifference {
    /// The option, as the builder names it.
    pub option: String,
    /// Its value in the pipeline being resumed.
    pub here: String,
    /// Its value in the saved state.
    pub saved: String,
}

impl fmt::Display for OptionDifference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} is {} here but {} in the state",
            self.option, self.here, self.saved
        )
    }
}

/// Why a saved [`crate::PipelineState`] cannot be read, or does not fit the pipeline it is given
/// to. A pipeline never starts over in its place.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResumeError {
    /// The state file cannot be read or written.
    #[error("{}: {source}", .path.display())]
    File {
        /// The state file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The text is not a pipeline state: not JSON, or a field missing, of the wrong type or
    /// out of range.
    #[error("not a gpufeed pipeline state: {0}")]
    Malformed(String),
    /// The state was written in a format version this build does not read.
    #[error("the state is of format version {found}, and this gpufeed reads version {supported}")]
    Version {
        /// The state's version.
        found: u64,
        /// The version this build reads.
        supported: u64,
    },
    /// The source's listing is not the one the state was saved from (images added, removed,
    /// renamed, reordered or relabelled).
    #[error(
        "the source is not the one the state was saved from: here {here}; in the state {saved}"
    )]
    Source {
        /// This pipeline's listing, in brief.
        here: String,
        /// The state's listing, in brief.
        saved: String,
    },
    /// Options that decide the output differ from the state's.
    #[error("{}", describe_differences(.0))]
    Options(Vec<OptionDifference>),
}

fn describe_differences(differences: &[OptionDifference]) -> String {
    let each: Vec<String> = differences.iter().map(|d| d.to_string()).collect();
    format!(
        "options that decide the output differ from the state's: {}",
        each.join("; ")
    )
}

/// Everything that can go wrong in gpufeed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// One image failed and the pipeline's policy is [`crate::OnError::Fail`].
    #[error("{0}")]
    Item(ItemError),
    /// A source could not be listed (missing folder, unreadable directory, no class folders).
    #[error("cannot list {path}: {reason}")]
    Source {
        /// The folder or file that could not be listed.
        path: PathBuf,
        /// Why, in words.
        reason: String,
        /// The I/O error behind it, if any.
        #[source]
        source: Option<std::io::Error>,
    },
    /// A source in object storage could not be opened: its URL is not one gpufeed reads, the
    /// store refused the credentials, a listing or a shard could not be read after the retries,
    /// or there is nothing to read under it.
    #[error("cannot open {url}: {reason}")]
    Remote {
        /// The URL given, or the object's that failed.
        url: String,
        /// Why, in words (naming the object and what the store said).
        reason: String,
        /// The failure's class: `PermissionDenied` for refused credentials, `NotFound` for a
        /// missing object or an empty prefix, `InvalidInput` for a URL gpufeed does not read.
        kind: std::io::ErrorKind,
    },
    /// An option has a value that cannot work; names the option.
    #[error("invalid option {option}: {reason}")]
    InvalidOption {
        /// The option, as the builder and the command line name it.
        option: &'static str,
        /// What is wrong with its value.
        reason: String,
    },
    /// CUDA was asked for but cannot be used.
    #[error("CUDA is not available: {0}")]
    CudaUnavailable(#[from] CudaUnavailable),
    /// A CUDA driver call failed.
    #[error("CUDA driver error while {context}: {source}")]
    Cuda {
        /// What the pipeline was doing.
        context: &'static str,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// A kernel source failed to compile with NVRTC.
    #[error("NVRTC could not compile kernels/{kernel}: {log}")]
    KernelCompile {
        /// The kernel file.
        kernel: &'static str,
        /// NVRTC's message and log.
        log: String,
    },
    /// The device does not have the memory a batch needs.
    #[error("out of GPU memory while {context}{}", .needed.map_or(String::new(), |(needed, free)| format!(
        ": {:.2} GB needed, {:.2} GB free; use a smaller batch size or prefetch depth",
        needed as f64 / 1e9, free as f64 / 1e9)))]
    OutOfDeviceMemory {
        /// What was being allocated.
        context: &'static str,
        /// Bytes needed and bytes free, when known before allocating.
        needed: Option<(u64, u64)>,
    },
    /// A caller's buffer or tensor does not have the size or type the call needs.
    #[error("{0}")]
    Mismatch(String),
    /// A batch cannot be handed over as asked (DLPack, ONNX Runtime): says why.
    #[error("cannot export the batch: {0}")]
    Export(String),
    /// The GPU decode lane failed: the source is the lane's [`GpuLaneError`](crate::GpuLaneError)
    /// (`downcast_ref` it to match on its cause).
    #[error("the GPU decode lane failed: {0}")]
    GpuLane(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
    /// A saved pipeline state cannot be read or does not fit this pipeline.
    #[error("cannot resume from the saved state: {0}")]
    Resume(#[from] ResumeError),
    /// The prefetch thread stopped unexpectedly.
    #[error("the prefetch thread stopped: {0}")]
    Worker(String),
    /// The pipeline is used in a process forked from the one that built it, where none of its
    /// threads (nor its CUDA context) exist.
    #[error(
        "this pipeline was built in process {built} and is used in process {current}, a fork of \
         it, where its threads do not exist: build the pipeline in the process that uses it \
         (in each DataLoader worker or multiprocessing child, or start them with the \"spawn\" \
         or \"forkserver\" method)"
    )]
    Forked {
        /// The process that built the pipeline.
        built: u32,
        /// This process.
        current: u32,
    },
    /// With equal shards, a batch could not be filled even after going round the rank's images
    /// again: they all fail, and the ranks' batches cannot stay equal.
    #[error(
        "rank {rank} of {world}: {missing} place(s) of a batch cannot be filled, every image of \
         the shard fails (the ranks' batches would no longer be equal)"
    )]
    ShardExhausted {
        /// This process's rank.
        rank: usize,
        /// Number of processes.
        world: usize,
        /// Places of the batch left empty.
        missing: usize,
    },
}

impl Error {
    /// An option mistake.
    pub(crate) fn invalid(option: &'static str, reason: impl Into<String>) -> Error {
        Error::InvalidOption {
            option,
            reason: reason.into(),
        }
    }

    /// A failed driver call: out-of-memory and a missing or unusable device get their own
    /// variants, the rest keep the driver's error as their source.
    pub(crate) fn cuda(context: &'static str, source: DriverError) -> Error {
        match source.0 {
            CUresult::CUDA_ERROR_OUT_OF_MEMORY => Error::OutOfDeviceMemory {
                context,
                needed: None,
            },
            CUresult::CUDA_ERROR_NO_DEVICE
            | CUresult::CUDA_ERROR_INVALID_DEVICE
            | CUresult::CUDA_ERROR_NOT_INITIALIZED
            | CUresult::CUDA_ERROR_STUB_LIBRARY => {
                Error::CudaUnavailable(CudaUnavailable::Driver { context, source })
            }
            _ => Error::Cuda { context, source },
        }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The message a caught panic carried, for the error that replaces it.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown failure".into())
}

/// Runs a cudarc call that could panic on a broken installation, turning panics and driver
/// errors into [`Error`]s.
pub(crate) fn guarded<T>(
    context: &'static str,
    f: impl FnOnce() -> std::result::Result<T, DriverError>,
) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result.map_err(|e| Error::cuda(context, e)),
        Err(panic) => Err(CudaUnavailable::Broken {
            context,
            message: panic_message(panic.as_ref()),
        }
        .into()),
    }
}
