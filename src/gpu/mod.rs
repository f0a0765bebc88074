//! The only part of gpufeed that touches CUDA (through cudarc): finding a usable device, the
//! pinned staging ring, the upload, the NVRTC-compiled kernel and the device tensors it writes.
//!
//! cudarc loads libcuda and libnvrtc at run time and panics when they are missing, so
//! [`probe`] checks for both before any other call, and the few calls that could still panic on an
//! unusual installation (an old driver lacking a symbol) run under `catch_unwind`.

pub mod bench;
mod kernel;
mod staging;
mod tensor;

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaStream, DriverError};

use crate::error::{panic_message, Error, Result};

pub(crate) use kernel::NormalizeKernel;
pub(crate) use staging::StagingRing;
pub use tensor::DeviceTensor;

/// What a machine offers for CUDA work.
#[derive(Debug, Clone, PartialEq, Eq)]
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
        return Err(Error::CudaUnavailable(
            "the NVIDIA driver library (libcuda.so) was not found: install the NVIDIA driver, \
             or use the CPU device"
                .into(),
        ));
    }
    // SAFETY: as above, for libnvrtc.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(Error::CudaUnavailable(
            "NVRTC (libnvrtc.so, from the CUDA toolkit) was not found: it compiles \
             kernels/normalize.cu at run time; install the CUDA runtime libraries, or use the CPU \
             device"
                .into(),
        ));
    }
    let count = guarded("counting CUDA devices", CudaContext::device_count)?;
    if count <= 0 {
        return Err(Error::CudaUnavailable(
            "the driver reports no CUDA device".into(),
        ));
    }
    Ok(CudaInfo {
        device_count: count as usize,
    })
}

/// Free and total memory of CUDA device `ordinal`, in bytes.
pub fn device_memory(ordinal: usize) -> Result<(usize, usize)> {
    Gpu::open(ordinal)?.memory()
}

/// Runs a cudarc call that could panic on a broken installation, turning panics and driver
/// errors into [`Error`]s.
fn guarded<T>(
    context: &'static str,
    f: impl FnOnce() -> std::result::Result<T, DriverError>,
) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result.map_err(|e| driver_error(context, e)),
        Err(panic) => Err(Error::CudaUnavailable(format!(
            "{context}: {}",
            panic_message(panic.as_ref())
        ))),
    }
}

/// A driver error as an [`Error`]: out-of-memory and missing devices get their own variants.
pub(crate) fn driver_error(context: &'static str, e: DriverError) -> Error {
    use cudarc::driver::sys::CUresult;
    match e.0 {
        CUresult::CUDA_ERROR_OUT_OF_MEMORY => Error::OutOfDeviceMemory(format!(
            "{context}: the device has too little free memory (try a smaller batch size or \
             prefetch depth)"
        )),
        CUresult::CUDA_ERROR_NO_DEVICE
        | CUresult::CUDA_ERROR_INVALID_DEVICE
        | CUresult::CUDA_ERROR_NOT_INITIALIZED
        | CUresult::CUDA_ERROR_STUB_LIBRARY => Error::CudaUnavailable(format!("{context}: {e}")),
        _ => Error::Cuda {
            context,
            reason: e.to_string(),
        },
    }
}

/// The device's primary context, created once per process and kept: pipelines built one after
/// another (train and validation, one per epoch) then pay the context's creation (~0.3 s) once,
/// and nothing the driver keeps per context is set up again and again.
fn shared_context(ordinal: usize) -> Result<Arc<CudaContext>> {
    static CONTEXTS: OnceLock<Mutex<HashMap<usize, Arc<CudaContext>>>> = OnceLock::new();
    let mut contexts = CONTEXTS
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(context) = contexts.get(&ordinal) {
        return Ok(context.clone());
    }
    let context = guarded("creating the CUDA context", || CudaContext::new(ordinal))?;
    contexts.insert(ordinal, context.clone());
    Ok(context)
}

/// One CUDA device as a pipeline uses it: its context and the one stream all uploads and kernels
/// of the pipeline go to, created once.
#[derive(Debug, Clone)]
pub(crate) struct Gpu {
    stream: Arc<CudaStream>,
}

impl Gpu {
    /// Opens device `ordinal` after [`probe`] found CUDA usable.
    pub fn open(ordinal: usize) -> Result<Gpu> {
        let info = probe()?;
        if ordinal >= info.device_count {
            return Err(Error::CudaUnavailable(format!(
                "no CUDA device {ordinal}: this machine has {} device(s)",
                info.device_count
            )));
        }
        let context = shared_context(ordinal)?;
        let stream = guarded("creating the pipeline's stream", || context.new_stream())?;
        Ok(Gpu { stream })
    }

    /// The pipeline's stream.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Free and total device memory, in bytes.
    pub fn memory(&self) -> Result<(usize, usize)> {
        self.stream
            .context()
            .mem_get_info()
            .map_err(|e| driver_error("reading device memory", e))
    }

    /// Device name and compute capability, for reports.
    pub fn describe(&self) -> String {
        let ctx = self.stream.context();
        let name = ctx.name().unwrap_or_else(|_| "CUDA device".into());
        match ctx.compute_capability() {
            Ok((major, minor)) => format!("{name} (sm_{major}{minor})"),
            Err(_) => name,
        }
    }
}

/// For tests: device 0, or `None` (printing why) when there is none, unless
/// `GPUFEED_REQUIRE_GPU=1`, which turns a missing GPU into a failure.
#[cfg(test)]
pub(crate) fn test_gpu() -> Option<Gpu> {
    match Gpu::open(0) {
        Ok(gpu) => Some(gpu),
        Err(e) => {
            assert!(
                std::env::var("GPUFEED_REQUIRE_GPU").as_deref() != Ok("1"),
                "GPUFEED_REQUIRE_GPU=1 but {e}"
            );
            println!("skipped: no CUDA device ({e})");
            None
        }
    }
}
