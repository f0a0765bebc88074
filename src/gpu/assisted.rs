//! The assisted path of the GPU lane: JPEGs decoded on the GPU's cores instead of its JPEG
//! engines, exactly as libjpeg-turbo decodes them. For a baseline file a preparing thread parses
//! it and destuffs its entropy-coded data ([`entropy::parse`]), and the GPU does the entropy
//! decoding too; a progressive file (which the engines refuse) has its coefficients decoded and
//! packed by a CPU thread ([`progressive`]). Here a call's images go to a [`GpuDecoder`] on the
//! set's stream: the entropy decoding, libjpeg-turbo's integer inverse DCT, upsampling and colour
//! conversion (`kernels/entropy.cu`, `kernels/idct.cu`) render each image whole, as RGB (or
//! gray), for the set's resize.
//!
//! The engines and the assisted path work side by side: the engines on their own silicon, the
//! assisted path on the cores the resize also uses. Which images take it is fixed by the files
//! alone ([`super::prepare`]), so every run decodes the same image on the same path.
//!
//! [`entropy::parse`]: crate::coefficients::entropy::parse
//! [`progressive`]: crate::coefficients::progressive

use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr};

use super::call::{window_read, AssistedInput, CallImage, MAX_CALL_PIXELS};
use super::error::GpuLaneError;
use crate::coefficients::gpu::{Budget, GpuDecoder};
use crate::coefficients::Window;
use crate::cuda::resize::plan::{SourceImage, SourcePixels};
use crate::error::{Error, Result};

/// Pixels one assisted call holds at most in a lane for small files (a call of
/// [`CHUNK`](super::work::CHUNK) ImageNet-sized images is under 10 Mpx): buffers a quarter of a
/// full call's (about 300 MB of device memory a thread), which allocate beside the first
/// batches without holding them back. A larger image goes to the engines (to the CPU lane while
/// they are not open).
const SMALL_FILES_CALL_PIXELS: u64 = 16 << 20;

/// Pixels one assisted call holds at most: [`MAX_CALL_PIXELS`] for `large_files`, else
/// [`SMALL_FILES_CALL_PIXELS`].
pub(super) fn call_pixels(large_files: bool) -> u64 {
    match large_files {
        true => MAX_CALL_PIXELS,
        false => SMALL_FILES_CALL_PIXELS,
    }
}

/// The most bytes one assisted call stages (its pinned staging and device copy): a call's
/// files are at most [`MAX_CALL_BYTES`](super::call::MAX_CALL_BYTES) (16 MB), and a
/// progressive photo's packed coefficients take 0.3-0.7 MB a megapixel, so a call of 64 Mpx
/// fits in 48 MB unless its photos are denser (it then holds fewer). Page-locking it is most of
/// a decoder set's opening: 2 bytes a pixel (128 MB a set) took 60-80 ms a set on the H200
/// machine.
const MAX_STAGING_BYTES: u64 = 48 << 20;

/// Bytes an assisted call of `call_pixels` pixels stages at most: 2 a pixel, at most
/// [`MAX_STAGING_BYTES`].
pub(super) fn staging_bytes(call_pixels: u64) -> u64 {
    (2 * call_pixels).min(MAX_STAGING_BYTES)
}

/// The buffers of one assisted decoder: a full call of `call_pixels` pixels, its staging
/// [`staging_bytes`].
pub(super) fn budget(call_pixels: u64) -> Budget {
    Budget {
        coefficient_bytes: staging_bytes(call_pixels) as usize,
        ..Budget::for_megapixels(call_pixels as f64 / 1e6, super::work::CHUNK)
    }
}

/// A submitting thread's assisted decoder: its buffers sized once for a full call.
pub(super) struct AssistedDecoder {
    decoder: GpuDecoder,
    /// For each image of the call, its place among the decoder's images and the window of it
    /// rendered (what its resize reads).
    added: Vec<Option<(usize, Window)>>,
}

impl AssistedDecoder {
    /// The decoder on `stream`, its kernels compiled and its buffers allocated for calls of up
    /// to `call_pixels` pixels ([`budget`]).
    pub fn new(
        stream: &Arc<CudaStream>,
        call_pixels: u64,
    ) -> Result<AssistedDecoder, GpuLaneError> {
        let decoder =
            GpuDecoder::new(stream, budget(call_pixels)).map_err(|e| GpuLaneError::Kernel {
                kernel: "entropy.cu",
                source: Box::new(Error::Mismatch(e.to_string())),
            })?;
        Ok(AssistedDecoder {
            decoder,
            added: Vec::new(),
        })
    }

    /// Queues the decode of `images` on the decoder's stream and waits for the entropy
    /// decoding's verdicts: one source image per input, `None` where the file could not be
    /// decoded on this path (not parsed, over the buffers, or found corrupt by the kernels: the
    /// CPU lane then decodes and reports it). The pixels stay valid until the next call.
    pub fn decode(&mut self, images: &[CallImage]) -> Result<Vec<Option<SourceImage>>> {
        let decoder = &mut self.decoder;
        decoder.clear();
        self.added.clear();
        for image in images {
            let place = match &image.assisted {
                Some(AssistedInput::EntropyCoded(parsed, layout)) => {
                    let window = window_read(layout, image.pixels_read());
                    decoder
                        .fits_entropy_coded(parsed, layout, &window)
                        .then(|| decoder.add_entropy_coded(parsed, layout, &window).ok())
                        .flatten()
                        .map(|at| (at, window))
                }
                Some(AssistedInput::Packed(packed, bytes)) => decoder
                    .fits(packed)
                    .then(|| decoder.add(packed, bytes).ok())
                    .flatten()
                    .map(|at| (at, packed.window)),
                None => None,
            };
            self.added.push(place);
        }
        if decoder.is_empty() {
            return Ok(vec![None; images.len()]);
        }
        let failed = |e: crate::coefficients::Error| Error::Mismatch(e.to_string());
        decoder.upload().map_err(failed)?;
        decoder.transform().map_err(failed)?;
        let failures = decoder.entropy_failures().map_err(failed)?;
        let stream = decoder.stream().clone();
        let (base, guard) = decoder.output().device_ptr(&stream);
        drop(guard);
        let rendered = decoder.rendered();
        Ok(self
            .added
            .iter()
            .zip(images)
            .map(|(place, image)| {
                let (at, held) = (*place)?;
                if failures.iter().any(|&(failed, _)| failed == at) {
                    return None;
                }
                let window = rendered.get(at)?;
                let ptr = base + window.offset;
                let pixels = match window.channels {
                    1 => SourcePixels::Gray {
                        ptr,
                        pitch: window.pitch,
                    },
                    _ => SourcePixels::Interleaved {
                        ptr,
                        pitch: window.pitch,
                    },
                };
                let info = image.screened.info;
                Some(SourceImage {
                    pixels,
                    width: info.width,
                    height: info.height,
                    held,
                })
            })
            .collect())
    }
}
