//! What can keep the GPU decode lane from opening, or fail a call of it, with its cause.

use cudarc::driver::DriverError;

use super::nvjpeg::{NvjpegError, NvjpegUnavailable};
use crate::cuda::resize::ResizeError;
use crate::options::Interpolation;

/// Why the GPU decode lane cannot run, or why one of its calls failed (its images then go to
/// the CPU lane). Every variant keeps its cause.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GpuLaneError {
    /// libnvjpeg could not be found or loaded.
    #[error("nvJPEG could not be loaded: {0}")]
    Library(#[from] NvjpegUnavailable),
    /// An nvJPEG call failed (or the GPU has no JPEG engines).
    #[error(transparent)]
    Nvjpeg(#[from] NvjpegError),
    /// A CUDA driver call of the lane failed.
    #[error("CUDA failed {context}: {source}")]
    Cuda {
        /// What the lane was doing.
        context: &'static str,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// A lane kernel could not be compiled or loaded.
    #[error("the {kernel} kernel: {source}")]
    Kernel {
        /// The kernel file under `kernels/`.
        kernel: &'static str,
        /// What compiling or loading it gave.
        #[source]
        source: Box<crate::Error>,
    },
    /// The resize of a call could not be planned or launched.
    #[error(transparent)]
    Resize(#[from] ResizeError),
    /// The lane resizes with Pillow's filters only.
    #[error("the {0} filter has no GPU resize")]
    Filter(Interpolation),
    /// A buffer's size overflows.
    #[error("the size of {0} overflows")]
    TooLarge(&'static str),
    /// The lane could not be opened beside the pipeline.
    #[error("the lane could not be opened: {0}")]
    Opening(String),
    /// The lane's threads could not be started.
    #[error("cannot start the lane's threads: {0}")]
    Threads(#[source] std::io::Error),
}

impl GpuLaneError {
    /// A failed driver call, `context` saying what the lane was doing.
    pub(crate) fn cuda(context: &'static str) -> impl FnOnce(DriverError) -> GpuLaneError {
        move |source| GpuLaneError::Cuda { context, source }
    }

    /// A kernel that could not be compiled or loaded.
    pub(crate) fn kernel(kernel: &'static str) -> impl FnOnce(crate::Error) -> GpuLaneError {
        move |source| GpuLaneError::Kernel {
            kernel,
            source: Box::new(source),
        }
    }
}

/// The crate's error for a failure of the lane, which it keeps as its source.
impl From<GpuLaneError> for crate::Error {
    fn from(error: GpuLaneError) -> crate::Error {
        crate::Error::GpuLane(Box::new(error))
    }
}
