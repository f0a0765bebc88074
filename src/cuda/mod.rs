//! The CUDA side, the only code (with the device tensors) that touches cudarc: finding a usable
//! device, the context and compiled modules kept per device, the pinned staging ring and upload,
//! and the normalize kernel.
//!
//! cudarc loads libcuda and libnvrtc at run time and panics when they are missing, so [`probe`]
//! checks for both before any other call, and the few calls that could still panic on an unusual
//! installation (an old driver lacking a symbol) run under `catch_unwind`.

mod device;
mod normalize;
mod staging;

use std::panic::{catch_unwind, AssertUnwindSafe};

use cudarc::driver::{CudaContext, DriverError};

use crate::error::{panic_message, CudaUnavailable, Error, Result};

pub(crate) use device::Gpu;
pub use normalize::{NormalizeTuning, Normalizer};
pub(crate) use staging::StagingRing;

/// What a machine offers for CUDA work.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CudaInfo {
    /// Number of CUDA devices.
    pub device_count: usize,
}

/// Checks, without panicking, that the CUDA driver library and NVRTC can be loaded and that at
/// least one device exists. The error says which piece is missing.
pub fn probe() -> Result<CudaInfo> {
    // SAFETY: `is_culib_present` only tries to dlopen the library by its usual names and
    // reports whether that worked; it calls nothing inside it.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(CudaUnavailable::NoDriverLibrary.into());
    }
    // SAFETY: as above, for libnvrtc.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(CudaUnavailable::NoNvrtc.into());
    }
    let count = guarded("counting CUDA devices", CudaContext::device_count)?;
    if count <= 0 {
        return Err(CudaUnavailable::NoDevice.into());
    }
    Ok(CudaInfo {
        device_count: count as usize,
    })
}

/// Free and total memory of CUDA device `ordinal`, in bytes.
pub fn device_memory(ordinal: usize) -> Result<(usize, usize)> {
    Gpu::open(ordinal)?.memory()
}

/// A description of CUDA device `ordinal` for reports: its name and compute capability.
pub fn describe_device(ordinal: usize) -> Result<String> {
    Ok(Gpu::open(ordinal)?.describe())
}

/// Opens CUDA device `ordinal` (after [`probe`]) and gives a new stream on its primary context,
/// the context the pipelines of this process share.
pub fn new_stream(ordinal: usize) -> Result<std::sync::Arc<cudarc::driver::CudaStream>> {
    Ok(Gpu::open(ordinal)?.stream().clone())
}

/// Runs a cudarc call that could panic on a broken installation, turning panics and driver
/// errors into [`Error`]s.
fn guarded<T>(
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
