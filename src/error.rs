//! The crate's one error type.
//!
//! Errors that concern a single image ([`ItemError`]) carry the image's id (its path, or the id the
//! caller gave in-memory bytes) and the reason; the pipeline either skips such an image and lists
//! it on the batch, or stops with [`Error::Item`], depending on [`crate::OnError`].

use std::fmt;
use std::path::PathBuf;

/// Why one image could not be turned into pixels.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ItemErrorKind {
    /// The file could not be read (missing, vanished after listing, a directory, no permission).
    Read(String),
    /// The bytes are not in a format this crate decodes.
    UnknownFormat,
    /// The bytes look like an image but could not be decoded (truncated, corrupt).
    Decode(String),
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
}

impl fmt::Display for ItemErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ItemErrorKind::Read(reason) => write!(f, "cannot read: {reason}"),
            ItemErrorKind::UnknownFormat => {
                write!(f, "not a JPEG, PNG, WebP, BMP, GIF or TIFF image")
            }
            ItemErrorKind::Decode(reason) => write!(f, "cannot decode: {reason}"),
            ItemErrorKind::TooLarge {
                width,
                height,
                limit,
            } => write!(
                f,
                "{width}x{height} pixels is over the limit of {limit} pixels (see max_pixels)"
            ),
            ItemErrorKind::Empty => write!(f, "image has no pixels"),
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

/// Everything that can go wrong in gpufeed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// One image failed and the pipeline's policy is [`crate::OnError::Fail`].
    #[error("{0}")]
    Item(ItemError),
    /// A source could not be listed (missing folder, unreadable directory).
    #[error("cannot list {path}: {reason}")]
    Source {
        /// The folder or file that could not be listed.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The pipeline's options do not make sense together.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// CUDA was asked for but cannot be used: no driver library, no device, no NVRTC.
    #[error("CUDA is not available: {0}")]
    CudaUnavailable(String),
    /// A CUDA driver call failed.
    #[error("CUDA driver error during {context}: {reason}")]
    Cuda {
        /// What the pipeline was doing.
        context: &'static str,
        /// The driver's message.
        reason: String,
    },
    /// The kernel source failed to compile with NVRTC.
    #[error("NVRTC could not compile kernels/{0}")]
    KernelCompile(String),
    /// The device does not have the memory a batch needs.
    #[error("out of GPU memory: {0}")]
    OutOfDeviceMemory(String),
    /// The prefetch thread stopped unexpectedly.
    #[error("the prefetch thread stopped: {0}")]
    Worker(String),
    /// Writing an output file failed.
    #[error("cannot write {path}: {reason}")]
    Write {
        /// The file being written.
        path: PathBuf,
        /// Why.
        reason: String,
    },
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
