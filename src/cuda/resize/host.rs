//! kernels/resize.cu run on the host, statement for statement: the same grid walk, block
//! search, index arithmetic and integer sums over a planned batch, with "device memory" a host
//! buffer. It checks the planner's descriptors (addresses, offsets, shifted bounds, the prefix sum)
//! against the CPU rendition without a GPU, and lets `resize_check --host` run its whole suite
//! anywhere; on the GPU, the kernels must agree with it and with [`crate::resample::resample`].

use thiserror::Error;

use crate::cuda::resize::plan::{BatchPlan, PassDescriptor, ResizeDescriptor, THREADS_PER_BLOCK};
use crate::resample::{clip8, HALF};

/// Why a host run stopped: the plan reads or writes outside the buffers given (a bad address).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum HostRunError {
    /// A source sample outside `memory`.
    #[error("image {image} reads source address {address}, outside the memory given")]
    Source {
        /// The descriptor's index.
        image: usize,
        /// The address read.
        address: u64,
    },
    /// A coefficient or intermediate offset of the plan outside its buffers (a plan not made by
    /// [`crate::plan_batch`]).
    #[error("image {image}: the plan's coefficient or intermediate offsets are out of range")]
    Plan {
        /// The descriptor's index.
        image: usize,
    },
    /// The output is smaller than the slots the batch writes.
    #[error("the output holds {actual} bytes, the batch writes up to byte {needed}")]
    Output {
        /// Bytes the batch's slots span.
        needed: u64,
        /// Bytes of the output.
        actual: u64,
    },
}

/// Runs both kernels of `plan` on the host. Source addresses are `memory_base` + an offset into
/// `memory`; `out` is the batch buffer (slot `s` at `s * plan.slot_len`).
pub fn run_batch(
    plan: &BatchPlan,
    memory: &[u8],
    memory_base: u64,
    out: &mut [u8],
) -> Result<(), HostRunError> {
    if (out.len() as u64) < plan.output_bytes() {
        return Err(HostRunError::Output {
            needed: plan.output_bytes(),
            actual: out.len() as u64,
        });
    }
    let mut tmp = vec![0u8; plan.intermediate_bytes as usize];
    let sources = Memory {
        bytes: memory,
        base: memory_base,
    };
    for block in 0..plan.first_pass_blocks {
        first_pass_block(plan, &sources, &mut tmp, block)?;
    }
    let (blocks_x, blocks_y) = plan.last_pass_grid();
    for block_y in 0..blocks_y {
        for block_x in 0..blocks_x {
            last_pass_block(plan, &sources, &tmp, (block_x, block_y), blocks_y, out)?;
        }
    }
    Ok(())
}

/// The "device" memory the sources live in.
struct Memory<'a> {
    bytes: &'a [u8],
    base: u64,
}

/// gf_block_owner: of the first pass's blocks, or (`last`) of the last pass's.
fn block_owner(images: &[ResizeDescriptor], block: u32, last: bool) -> usize {
    let (mut lo, mut hi) = (0, images.len());
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        let first_block = match last {
            true => images[mid].last_block0,
            false => images[mid].block0,
        };
        if first_block <= block {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// One block of gpufeed_resize_first.
fn first_pass_block(
    plan: &BatchPlan,
    sources: &Memory,
    tmp: &mut [u8],
    block: u32,
) -> Result<(), HostRunError> {
    let n = block_owner(&plan.descriptors, block, false);
    let Some(im) = plan.descriptors.get(n) else {
        return Ok(());
    };
    let width = im.tmp_width;
    for thread in 0..THREADS_PER_BLOCK {
        let unit = (block - im.block0) * THREADS_PER_BLOCK + thread;
        if unit >= im.tmp_height * width {
            return Ok(());
        }
        let j = unit / width;
        let i = unit - j * width;
        let v = pass_pixel(n, im, &im.first, &plan.coefficients, sources, tmp, i, j)?;
        let channels = im.channels.min(3) as usize;
        let at = im.tmp as usize + unit as usize * channels;
        tmp.get_mut(at..at + channels)
            .ok_or(HostRunError::Plan { image: n })?
            .copy_from_slice(&v[..channels]);
    }
    Ok(())
}

/// Block `(block_x, block_y)` of gpufeed_resize_last, whose grid is `grid_y` rows high.
fn last_pass_block(
    plan: &BatchPlan,
    sources: &Memory,
    tmp: &[u8],
    (block_x, block_y): (u32, u32),
    grid_y: u32,
    out: &mut [u8],
) -> Result<(), HostRunError> {
    let per_image = grid_y as usize == plan.descriptors.len();
    let n = match per_image {
        true => block_y as usize,
        false => block_owner(&plan.descriptors, block_x, true),
    };
    let Some(im) = plan.descriptors.get(n) else {
        return Ok(());
    };
    let block = match per_image {
        true => block_x,
        false => block_x - im.last_block0,
    };
    let (width, pixels) = (im.out_w, im.out_w * im.out_h);
    for thread in 0..THREADS_PER_BLOCK {
        let pixel = block * THREADS_PER_BLOCK + thread;
        if pixel >= pixels {
            return Ok(());
        }
        let y = pixel / width;
        let written = pixel - y * width;
        let x = if im.flip != 0 {
            width - 1 - written
        } else {
            written
        };
        let dst = im.slot as usize * plan.slot_len as usize + pixel as usize * 3;
        let i = x.wrapping_sub(im.dst_x);
        let j = y.wrapping_sub(im.dst_y);
        let v = if i >= im.dst_w || j >= im.dst_h {
            let [r, g, b, _] = im.pad.to_le_bytes();
            [r, g, b]
        } else {
            let mut v = pass_pixel(n, im, &im.last, &plan.coefficients, sources, tmp, i, j)?;
            if im.channels == 1 {
                v = [v[0]; 3];
            }
            v
        };
        out.get_mut(dst..dst + 3)
            .ok_or(HostRunError::Plan { image: n })?
            .copy_from_slice(&v);
    }
    Ok(())
}

/// gf_pass_pixel: output (i, j) of `pass` of image `im`.
#[allow(clippy::too_many_arguments)]
fn pass_pixel(
    n: usize,
    im: &ResizeDescriptor,
    pass: &PassDescriptor,
    coeffs: &[i32],
    sources: &Memory,
    tmp: &[u8],
    i: u32,
    j: u32,
) -> Result<[u8; 3], HostRunError> {
    let plan_error = HostRunError::Plan { image: n };
    let vertical = pass.vertical != 0;
    let index = if vertical { j } else { i } as usize;
    let coeff = |at: usize| coeffs.get(at).copied().ok_or(plan_error.clone());
    let start = coeff(pass.bounds as usize + 2 * index)?;
    let len = coeff(pass.bounds as usize + 2 * index + 1)?;
    let weights = pass.weights as usize + index * pass.taps as usize;
    let x = if vertical {
        pass.fixed_first as u64 + u64::from(i)
    } else {
        start as u64
    };
    let y = if vertical {
        start as u64
    } else {
        pass.fixed_first as u64 + u64::from(j)
    };
    let mut v = [0u8; 3];
    for (c, out) in v.iter_mut().enumerate().take(im.channels as usize) {
        let mut sum = HALF;
        for k in 0..len.max(0) as u64 {
            let sample = if pass.from_tmp != 0 {
                let pitch = u64::from(im.tmp_width) * u64::from(im.channels);
                let stride = if vertical {
                    pitch
                } else {
                    u64::from(im.channels)
                };
                let at = im.tmp + y * pitch + x * u64::from(im.channels) + c as u64 + k * stride;
                *tmp.get(at as usize).ok_or(plan_error.clone())?
            } else {
                // Interleaved: channel c lies c bytes after channel 0.
                let pitch = u64::from(im.src_pitch[0]);
                let step = u64::from(im.src_step);
                let stride = if vertical { pitch } else { step };
                let address = im.src[0] + y * pitch + x * step + k * stride + c as u64;
                address
                    .checked_sub(sources.base)
                    .and_then(|at| sources.bytes.get(at as usize).copied())
                    .ok_or(HostRunError::Source { image: n, address })?
            };
            let w = coeff(weights + k as usize)?;
            sum = sum.wrapping_add(i32::from(sample).wrapping_mul(w));
        }
        *out = clip8(sum);
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::resize::plan::{plan_batch, ResizeJob, SourceImage, SourcePixels};
    use crate::resample::{AxisPlan, Filter, PassOrder};

    fn job(ptr: u64) -> ResizeJob {
        ResizeJob {
            source: SourceImage::whole(SourcePixels::Gray { ptr, pitch: 4 }, 4, 4),
            x: AxisPlan::stretch(4, 2),
            y: AxisPlan::stretch(4, 2),
            filter: Filter::Box,
            order: PassOrder::default(),
            pad: [0; 3],
            flip: false,
            slot: 0,
        }
    }

    #[test]
    fn box_halving_averages_two_by_two() {
        let memory: Vec<u8> = (0..16).map(|v| v * 10).collect();
        let plan = plan_batch(&[job(100)], 2, 2).expect("plan");
        let mut out = vec![0u8; 12];
        run_batch(&plan, &memory, 100, &mut out).expect("run");
        // (0 + 10 + 40 + 50) / 4 = 25, and so on; gray spread to RGB.
        assert_eq!(out, [25, 25, 25, 45, 45, 45, 105, 105, 105, 125, 125, 125]);
    }

    #[test]
    fn the_pad_colour_surrounds_the_kept_rectangle_mirrored_with_it() {
        let memory: Vec<u8> = (0..16).map(|v| v * 10).collect();
        let mut padded = job(100);
        // The 2 x 2 box halving kept at column 1 of a 3 x 2 slot, the slot mirrored.
        padded.x = AxisPlan {
            dst_offset: 1,
            ..AxisPlan::stretch(4, 2)
        };
        padded.pad = [7, 8, 9];
        padded.flip = true;
        let plan = plan_batch(&[padded], 3, 2).expect("plan");
        let mut out = vec![0u8; 18];
        run_batch(&plan, &memory, 100, &mut out).expect("run");
        let row = |a: u8, b: u8| [a, a, a, b, b, b, 7, 8, 9];
        assert_eq!(out[..9], row(45, 25));
        assert_eq!(out[9..], row(125, 105));
    }

    #[test]
    fn reads_outside_the_memory_are_errors() {
        let plan = plan_batch(&[job(100)], 2, 2).expect("plan");
        let mut out = vec![0u8; 12];
        let short = run_batch(&plan, &[0u8; 8], 100, &mut out);
        assert!(matches!(short, Err(HostRunError::Source { image: 0, .. })));
        let below = run_batch(&plan, &[0u8; 16], 200, &mut out);
        assert!(matches!(below, Err(HostRunError::Source { .. })));
        let small = run_batch(&plan, &[0u8; 16], 100, &mut out[..11]);
        assert!(matches!(small, Err(HostRunError::Output { .. })));
    }
}
