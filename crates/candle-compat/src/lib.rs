//! gpufeed and candle in one build: candle-core's `cuda` feature links cudarc against libcuda
//! (`dynamic-linking`), gpufeed loads it at run time unless told otherwise
//! (`fallback-dynamic-loading`). Both use the same cudarc, so a batch's memory is a
//! `cudarc::driver::CudaSlice` that candle's `CudaStorage::wrap_cuda_slice` takes as it is.
//!
//! CI runs `cargo check` on this crate; it needs no CUDA installation to build.

use cudarc::driver::CudaSlice;
use gpufeed::half::f16;
use gpufeed::{Batch, Tensor};

/// The batch's memory as this crate's own cudarc slice type (the type candle wraps), or `None`
/// for a host batch or another element type.
pub fn into_cuda_slice(batch: Batch) -> Option<CudaSlice<f16>> {
    match batch.into_images() {
        Tensor::Device(images) => images.into_slice::<f16>().ok(),
        Tensor::Host(_) => None,
    }
}
