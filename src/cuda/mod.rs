//! The device stage: finding a usable CUDA device, its context and the modules compiled for it
//! (one NVRTC module cache for every kernel of the crate), the pinned staging ring and upload, and
//! the normalize kernel. With the GPU decode lane, the page-locked host memory below the lanes and
//! the device tensors, the only code that touches cudarc; it knows nothing of decoding.
//!
//! cudarc loads libcuda and libnvrtc at run time and panics when they are missing, so [`probe`]
//! checks for both before any other call, and the few calls that could still panic on an unusual
//! installation (an old driver lacking a symbol) run under `catch_unwind`.

mod augment;
mod device;
#[cfg(test)]
pub(crate) mod emulation;
mod gather;
mod image_staging;
mod kernel_cache;
mod normalize;
mod page_locked_upload;
mod patches;
pub(crate) mod resize;
mod staging;
mod views;

use std::sync::{Mutex, OnceLock};

use cudarc::driver::CudaContext;

use crate::error::{guarded, CudaUnavailable, Result};

pub(crate) use augment::DeviceAugmenter;
pub use device::DeviceOpening;
#[cfg(test)]
pub(crate) use device::{compile_ptx, compile_through, Compiled};
pub(crate) use device::{upload_reusing, Gpu};
#[cfg(test)]
pub(crate) use gather::gather_on_host;
pub(crate) use gather::{GatherPlane, PlaneGather};
pub(crate) use image_staging::{upload_images, upload_positioned, ImagesInFlight};
pub(crate) use kernel_cache::KernelSource;
pub use normalize::{NormalizeTuning, Normalizer};
pub(crate) use page_locked_upload::PageLockedUpload;
pub use patches::{PatchKernel, PlacedImage};
pub(crate) use staging::{SlotsComing, StagingRing, TouchedSlots};
pub(crate) use views::ViewUnpack;
pub use views::{KernelFootprint, ViewColourKernel};

/// What a machine offers for CUDA work.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CudaInfo {
    /// Number of CUDA devices.
    pub device_count: usize,
}

/// Checks, without panicking, that the CUDA driver library and NVRTC can be loaded and that at
/// least one device exists. The error says which piece is missing. A check that passed is not
/// made again (loading the libraries takes about 10 ms), and one under way on another thread
/// (`Device::open_early`'s) is waited for rather than made beside it.
pub fn probe() -> Result<CudaInfo> {
    static FOUND: OnceLock<CudaInfo> = OnceLock::new();
    static LOOKING: Mutex<()> = Mutex::new(());
    if let Some(found) = FOUND.get() {
        return Ok(found.clone());
    }
    let _looking = LOOKING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(found) = FOUND.get() {
        return Ok(found.clone());
    }
    let found = look_for_cuda()?;
    Ok(FOUND.get_or_init(|| found).clone())
}

fn look_for_cuda() -> Result<CudaInfo> {
    if !library_loads(&["cuda", "nvcuda"]) {
        return Err(CudaUnavailable::NoDriverLibrary.into());
    }
    // NVRTC (5-8 ms to load) is looked for beside the driver's start, which it does not need.
    let (nvrtc, count) = std::thread::scope(|scope| {
        let nvrtc = std::thread::Builder::new()
            .name("gpufeed-nvrtc-probe".into())
            .spawn_scoped(scope, || library_loads(&["nvrtc"]));
        let count = guarded("counting CUDA devices", CudaContext::device_count);
        let nvrtc = match nvrtc {
            Ok(thread) => thread.join().unwrap_or(false),
            Err(_) => library_loads(&["nvrtc"]),
        };
        (nvrtc, count)
    });
    if !nvrtc {
        return Err(CudaUnavailable::NoNvrtc.into());
    }
    let count = count?;
    if count <= 0 {
        return Err(CudaUnavailable::NoDevice.into());
    }
    Ok(CudaInfo {
        device_count: count as usize,
    })
}

/// Whether one of the libraries named (`"cuda"` for libcuda) can be loaded under one of the
/// file names cudarc tries. cudarc's own check (`is_culib_present`) exists only when cudarc
/// loads the libraries at run time; this one also works when a crate beside this one (candle)
/// has cudarc link them at build time, where they are loaded already and the check passes.
fn library_loads(names: &[&str]) -> bool {
    // The CUDA version of the `cuda-13000` feature, as cudarc's candidate names use it.
    const MAJOR: &str = "13";
    const MINOR: &str = "0";
    use std::env::consts::{DLL_PREFIX as PRE, DLL_SUFFIX as SUF};
    let bits = usize::BITS;
    names
        .iter()
        .flat_map(|name| {
            [
                format!("{PRE}{name}{SUF}"),
                format!("{PRE}{name}{bits}{SUF}"),
                format!("{PRE}{name}{bits}_{MAJOR}{SUF}"),
                format!("{PRE}{name}{bits}_{MAJOR}{MINOR}{SUF}"),
                format!("{PRE}{name}{bits}_{MAJOR}{MINOR}_0{SUF}"),
                format!("{PRE}{name}{bits}_{MAJOR}0_{MINOR}{SUF}"),
                format!("{PRE}{name}{bits}_10{SUF}"),
                format!("{PRE}{name}{bits}_11{SUF}"),
                format!("{PRE}{name}{bits}_12{SUF}"),
                format!("{PRE}{name}{bits}_{MAJOR}0_0{SUF}"),
                format!("{PRE}{name}{bits}_9{SUF}"),
                format!("{PRE}{name}{SUF}.{MAJOR}"),
                format!("{PRE}{name}{SUF}.12"),
                format!("{PRE}{name}{SUF}.11"),
                format!("{PRE}{name}{SUF}.10"),
                format!("{PRE}{name}{SUF}.9"),
                format!("{PRE}{name}{SUF}.1"),
            ]
        })
        // SAFETY: loading the CUDA driver or NVRTC runs their initializers, exactly as cudarc
        // does when it loads them; nothing inside is called, and the handle is closed at once.
        .any(|file| unsafe { libloading::Library::new(file) }.is_ok())
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

/// Device 0 for a GPU test, or `None` when there is none, said on stderr past the test
/// harness's capture (so a skipped test shows), unless `GPUFEED_REQUIRE_GPU=1`, which turns a
/// missing GPU into a failure.
#[cfg(test)]
pub(crate) fn test_gpu(test: &str) -> Option<Gpu> {
    use std::io::Write as _;
    match Gpu::open(0) {
        Ok(gpu) => Some(gpu),
        Err(e) => {
            assert!(
                std::env::var("GPUFEED_REQUIRE_GPU").as_deref() != Ok("1"),
                "GPUFEED_REQUIRE_GPU=1 but {e}"
            );
            let _ = writeln!(std::io::stderr(), "skipped: {test}: no CUDA device ({e})");
            None
        }
    }
}
