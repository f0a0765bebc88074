//! Decoded pixels to the output size on the CPU, written straight into the image's slot of the
//! staging buffer, exactly as Pillow resizes them.
//!
//! The planner ([`crate::geometry`]) gives the image's [`ImagePlan`] (made once, when its decode
//! window was chosen); [`crate::resample`] runs Pillow's passes from it, computing only the part
//! of the resize that survives the crop. Gray images are resampled as one channel and spread to
//! RGB by the last pass's write. A random crop's flip mirrors the slot last, as `F.hflip` after
//! `F.resized_crop`.

use super::decode::Decoded;
use crate::error::ItemErrorKind;
use crate::resample::{HostImage, ImagePlan, Kernels, Slot};

/// Resamples the decoded `pixels` by `plan` into `slot` (`width * height * 3` bytes, RGB8,
/// `pad` outside the plan's rectangle), mirrored left to right last when `flipped`.
/// `intermediate` is this thread's buffer for the 8-bit intermediate of two passes. A large
/// pass is cut into bands of rows on up to `kernels.1` threads (1: the calling thread alone).
#[allow(clippy::too_many_arguments)]
pub(crate) fn resize_into_slot(
    pixels: &[u8],
    decoded: Decoded,
    (width, height, pad): (u32, u32, u8),
    plan: &ImagePlan,
    flipped: bool,
    (kernels, threads): (Kernels, usize),
    intermediate: &mut Vec<u8>,
    slot: &mut [u8],
) -> Result<(), ItemErrorKind> {
    let source = HostImage {
        pixels,
        width: decoded.width,
        height: decoded.height,
        channels: decoded.channels,
    };
    let mut out = Slot {
        bytes: slot,
        width,
        height,
    };
    plan.resample_into_bands(&source, pad, &mut out, kernels, intermediate, threads)
        .map_err(|e| ItemErrorKind::Resize(e.to_string()))?;
    if flipped {
        let row = width as usize * 3;
        for line in out.bytes.chunks_exact_mut(row) {
            // Reverse the pixels, then each pixel's reversed channels back.
            line.reverse();
            for pixel in line.chunks_exact_mut(3) {
                pixel.swap(0, 2);
            }
        }
    }
    Ok(())
}
