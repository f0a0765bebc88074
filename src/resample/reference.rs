//! The scalar rendition of Pillow's resample, statement for statement and slow: the reference
//! the fast passes ([`super::cpu`]) and the GPU kernels are checked against. A sample at a time,
//! every read bounds-checked, the passes planned by [`plan_passes`] as the GPU's are.

use super::coefficients::{axis_coefficients, clip8, HALF};
use super::cpu::HostImage;
use super::filter::{Filter, Resampling};
use super::passes::{plan_passes, Direction, Pass, PassOrder};
use super::plan::{Axis, AxisPlan, PlanError};

/// One filtered sample: `clip8(HALF + sum(samples[k * stride] * weights[k]))` over the first
/// `len` weights, the sum kept in `i32` with wrapping adds like Pillow's `int` (it never wraps:
/// the headroom bits are there for that).
#[inline]
fn filter_sample(samples: &[u8], stride: usize, weights: &[i32]) -> u8 {
    let mut sum = HALF;
    for (k, &w) in weights.iter().enumerate() {
        let v = samples.get(k * stride).copied().unwrap_or(0);
        sum = sum.wrapping_add(i32::from(v).wrapping_mul(w));
    }
    clip8(sum)
}

/// An 8-bit image in host memory, channels interleaved.
#[derive(Debug, Clone, Copy)]
struct Samples<'a> {
    data: &'a [u8],
    /// Bytes per row.
    pitch: usize,
    channels: usize,
}

impl Samples<'_> {
    /// The samples of channel `c` from (x, y) on, for a walk along rows (stride `channels`) or
    /// down columns (stride `pitch`).
    fn from(&self, x: usize, y: usize, c: usize) -> &[u8] {
        let at = y * self.pitch + x * self.channels + c;
        self.data.get(at..).unwrap_or(&[])
    }

    /// Output pixel (i, j) of `pass` over these samples, into `px[..channels]`.
    fn filter(&self, pass: &Pass, i: usize, j: usize, px: &mut [u8; 3]) {
        let fixed = pass.fixed_first as usize;
        let (index, stride) = match pass.direction {
            Direction::Horizontal => (i, self.channels),
            Direction::Vertical => (j, self.pitch),
        };
        let ((start, len), weights) = pass.coefficients.output(index);
        let weights = weights.get(..len as usize).unwrap_or(&[]);
        let (x, y) = match pass.direction {
            Direction::Horizontal => (start as usize, fixed + j),
            Direction::Vertical => (fixed + i, start as usize),
        };
        for (c, v) in px.iter_mut().enumerate().take(self.channels) {
            *v = filter_sample(self.from(x, y, c), stride, weights);
        }
    }
}

/// Resamples the source region `x` x `y` of `src` (`width` x `height` pixels of `channels`
/// interleaved 8-bit samples, 1 or 3, rows packed) with `filter` exactly as Pillow 13 does
/// ([`PassOrder::ShrinkVerticalFirst`]), into `out`, an `out_width` x `out_height` RGB8 image (rows
/// packed): the kept outputs at the plans' destination, `pad` everywhere else. A gray source is
/// resampled as one channel and spread to three equal ones at the end, as Pillow's
/// `convert("RGB")` does.
#[allow(clippy::too_many_arguments)]
pub fn resample(
    src: &[u8],
    width: u32,
    height: u32,
    channels: u32,
    x: &AxisPlan,
    y: &AxisPlan,
    filter: Filter,
    pad: u8,
    out: &mut [u8],
    out_width: u32,
    out_height: u32,
) -> Result<(), PlanError> {
    let source = HostImage {
        pixels: src,
        width,
        height,
        channels,
    };
    resample_with(
        &source,
        x,
        y,
        Resampling::Filter(filter),
        PassOrder::default(),
        pad,
        out,
        out_width,
        out_height,
    )
}

/// [`resample`] with the pass order of a chosen Pillow version ([`PassOrder::for_pillow`]).
#[allow(clippy::too_many_arguments)]
pub fn resample_with(
    source: &HostImage,
    x: &AxisPlan,
    y: &AxisPlan,
    resampling: Resampling,
    order: PassOrder,
    pad: u8,
    out: &mut [u8],
    out_width: u32,
    out_height: u32,
) -> Result<(), PlanError> {
    let channels = source.channels;
    if channels != 1 && channels != 3 {
        return Err(PlanError::Channels(channels));
    }
    let dims = [source.width, source.height, channels];
    check_len("source", source.pixels.len(), dims)?;
    check_len("output", out.len(), [out_width, out_height, 3])?;
    x.check(Axis::X, source.width, out_width)?;
    y.check(Axis::Y, source.height, out_height)?;
    let filter = match resampling {
        Resampling::Filter(filter) => filter,
        Resampling::Nearest => return nearest(source, x, y, pad, out, out_width, out_height),
    };
    let passes = plan_passes(x, y, filter, order)?;

    let pitch = source.width as usize * channels as usize;
    let corner = y.src_offset as usize * pitch + x.src_offset as usize * channels as usize;
    let region = Samples {
        data: source.pixels.get(corner..).unwrap_or(&[]),
        pitch,
        channels: channels as usize,
    };
    if x.out_len != out_width || y.out_len != out_height {
        out.fill(pad);
    }
    let intermediate;
    let input = match &passes.first {
        Some(first) => {
            let (w, h) = passes.intermediate;
            intermediate = first_pass(&region, first, w as usize, h as usize);
            Samples {
                data: &intermediate,
                pitch: w as usize * region.channels,
                channels: region.channels,
            }
        }
        None => region,
    };
    let dst = Placement {
        out_width: out_width as usize,
        left: x.dst_offset as usize,
        top: y.dst_offset as usize,
        width: x.out_len as usize,
        height: y.out_len as usize,
    };
    last_pass(&input, &passes.last, &dst, out);
    Ok(())
}

/// Checks that a buffer holds exactly the product of `dims` bytes.
fn check_len(what: &'static str, len: usize, dims: [u32; 3]) -> Result<(), PlanError> {
    let expected = dims.iter().map(|&d| u64::from(d)).product::<u64>();
    if len as u64 != expected {
        return Err(PlanError::BufferSize {
            what,
            expected,
            actual: len as u64,
        });
    }
    Ok(())
}

/// The first pass into a `width` x `height` intermediate of the region's channel count: 8-bit,
/// rounded and clamped, as Pillow's `imTemp`.
fn first_pass(region: &Samples, pass: &Pass, width: usize, height: usize) -> Vec<u8> {
    let c = region.channels;
    let mut out = vec![0u8; width * height * c];
    for (j, row) in out.chunks_exact_mut(width * c).enumerate() {
        for (i, px_out) in row.chunks_exact_mut(c).enumerate() {
            let mut px = [0u8; 3];
            region.filter(pass, i, j, &mut px);
            px_out.copy_from_slice(&px[..c]);
        }
    }
    out
}

/// Where the kept outputs land in the RGB8 output.
struct Placement {
    out_width: usize,
    left: usize,
    top: usize,
    width: usize,
    height: usize,
}

/// The last pass into the output's kept rectangle, gray spread to RGB.
fn last_pass(input: &Samples, pass: &Pass, dst: &Placement, out: &mut [u8]) {
    for j in 0..dst.height {
        let row_start = ((dst.top + j) * dst.out_width + dst.left) * 3;
        let Some(row) = out.get_mut(row_start..row_start + dst.width * 3) else {
            return;
        };
        for (i, px_out) in row.chunks_exact_mut(3).enumerate() {
            let mut px = [0u8; 3];
            input.filter(pass, i, j, &mut px);
            if input.channels == 1 {
                px = [px[0]; 3];
            }
            px_out.copy_from_slice(&px);
        }
    }
}

/// `NEAREST` (`ImagingScaleAffine`): output pixel (i, j) is the source pixel under its centre,
/// 0 where the centre falls past the image.
fn nearest(
    source: &HostImage,
    x: &AxisPlan,
    y: &AxisPlan,
    pad: u8,
    out: &mut [u8],
    out_width: u32,
    out_height: u32,
) -> Result<(), PlanError> {
    let xc = axis_coefficients(x, Resampling::Nearest, Axis::X)?;
    let yc = axis_coefficients(y, Resampling::Nearest, Axis::Y)?;
    if x.out_len != out_width || y.out_len != out_height {
        out.fill(pad);
    }
    let c = source.channels as usize;
    let pitch = source.width as usize * c;
    for (j, &(row, rows)) in yc.bounds.iter().enumerate() {
        for (i, &(col, cols)) in xc.bounds.iter().enumerate() {
            let mut px = [0u8; 3];
            if rows == 1 && cols == 1 {
                let at = (y.src_offset + row) as usize * pitch + (x.src_offset + col) as usize * c;
                for (ch, v) in px.iter_mut().enumerate() {
                    *v = source.pixels[at + ch.min(c - 1)];
                }
            }
            let o =
                ((y.dst_offset as usize + j) * out_width as usize + x.dst_offset as usize + i) * 3;
            out[o..o + 3].copy_from_slice(&px);
        }
    }
    Ok(())
}
