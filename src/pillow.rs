//! Pillow's antialiased 8-bit resampling (`libImaging/Resample.c`), ported bit for bit, with the
//! geometry of one output expressed per axis as an integer [`AxisPlan`].
//!
//! What is ported, and must stay as it is for the results to match Pillow's:
//!
//! - `precompute_coeffs`: the filter is centred on `(i + 0.5) * scale`, stretched by
//!   `max(scale, 1)` (antialiasing when shrinking), its taps clamped to the source's edges and the
//!   clamped weights renormalised to sum to one, all in `f64` in Pillow's order of operations;
//! - `normalize_coeffs_8bpc`: each weight becomes an `i32` with [`PRECISION_BITS`] = 22 fraction
//!   bits, rounded half away from zero;
//! - the passes: a sum starts at `1 << 21` (one half), adds `sample * weight` in `i32`, and is
//!   shifted right by 22 and clamped to 0..=255 (`clip8`). An axis whose size does not change is
//!   not resampled at all (`ImagingResampleInner`'s `need_horizontal` / `need_vertical`): its
//!   samples are copied. When both axes are resampled, the first pass writes an 8-bit
//!   intermediate (rounded and clamped between the passes), so which pass runs first shows in
//!   the result; Pillow changed that order in 12.2 and again in 13.0 ([`PassOrder`]). With the
//!   horizontal pass first, only the source rows the vertical pass reads are resampled.
//!
//! The region an [`AxisPlan`] names is resized as if it were an image of its own (Pillow's
//! `crop` then `resize`), and only the outputs the plan keeps are computed: every output sample
//! depends on its own taps only, so the kept ones equal those of the full resize.
//! [`resample`] is the CPU rendition; [`plan_passes`] gives the same coefficients and pass
//! structure to the batched GPU kernel (`crate::batch`).
// The whole of what it ports is kept, used by the pipeline or not (tests, other filters).
#![allow(dead_code)]

use std::f64::consts::PI;
use std::fmt;

use thiserror::Error;

/// Fraction bits of the integer weights: 32 bits less 8 for the sample, less 2 for headroom
/// (weights can sum above one, or below zero, before the final clamp).
pub const PRECISION_BITS: u32 = 32 - 8 - 2;

/// The rounding half every sum starts from: `clip8` then rounds to nearest.
pub const HALF: i32 = 1 << (PRECISION_BITS - 1);

/// The weight of a copied sample: 1.0 in [`PRECISION_BITS`] fixed point.
pub const ONE: i32 = 1 << PRECISION_BITS;

/// The largest source or output side this module accepts. Pillow keeps sizes in `int` and box
/// edges in `float`; below 2^24 both are exact, and this limit keeps every intermediate size, tap
/// count and coefficient table far inside `i32` and memory.
pub const MAX_SIDE: u32 = 1 << 20;

/// A resampling filter of Pillow's (`PIL.Image.Resampling`), NEAREST aside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Filter {
    /// `BOX`: each output is the mean of the source samples it covers (support 0.5).
    Box,
    /// `BILINEAR`: the triangle filter (support 1); torchvision's default.
    Bilinear,
    /// `HAMMING`: a Hamming-windowed sinc (support 1).
    Hamming,
    /// `BICUBIC`: Keys' cubic with a = -0.5 (support 2).
    Bicubic,
    /// `LANCZOS`: a 3-lobed Lanczos-windowed sinc (support 3).
    Lanczos,
}

impl Filter {
    /// Every filter, in Pillow's order of support.
    pub const ALL: [Filter; 5] = [
        Filter::Box,
        Filter::Bilinear,
        Filter::Hamming,
        Filter::Bicubic,
        Filter::Lanczos,
    ];

    /// How far the filter reaches, in source samples, at scale 1.
    pub fn support(self) -> f64 {
        match self {
            Filter::Box => 0.5,
            Filter::Bilinear | Filter::Hamming => 1.0,
            Filter::Bicubic => 2.0,
            Filter::Lanczos => 3.0,
        }
    }

    /// The filter's value at `x`, exactly as Resample.c computes it.
    pub fn weight(self, x: f64) -> f64 {
        match self {
            Filter::Box => box_filter(x),
            Filter::Bilinear => bilinear_filter(x),
            Filter::Hamming => hamming_filter(x),
            Filter::Bicubic => bicubic_filter(x),
            Filter::Lanczos => lanczos_filter(x),
        }
    }

    /// The filter's number in `PIL.Image.Resampling`.
    pub fn pillow_id(self) -> u32 {
        match self {
            Filter::Lanczos => 1,
            Filter::Bilinear => 2,
            Filter::Bicubic => 3,
            Filter::Box => 4,
            Filter::Hamming => 5,
        }
    }

    /// The filter with number `id` in `PIL.Image.Resampling`; `None` for NEAREST (0) and others.
    pub fn from_pillow_id(id: u32) -> Option<Filter> {
        Filter::ALL.into_iter().find(|f| f.pillow_id() == id)
    }

    /// Pillow's name of the filter.
    pub fn name(self) -> &'static str {
        match self {
            Filter::Box => "BOX",
            Filter::Bilinear => "BILINEAR",
            Filter::Hamming => "HAMMING",
            Filter::Bicubic => "BICUBIC",
            Filter::Lanczos => "LANCZOS",
        }
    }
}

impl fmt::Display for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

// The filters of Resample.c, operation for operation (no fused multiply-add: Rust does not
// contract, and neither does a C compiler for x86-64 without -mfma).

fn box_filter(x: f64) -> f64 {
    if x > -0.5 && x <= 0.5 {
        1.0
    } else {
        0.0
    }
}

fn bilinear_filter(x: f64) -> f64 {
    let x = if x < 0.0 { -x } else { x };
    if x < 1.0 {
        1.0 - x
    } else {
        0.0
    }
}

fn hamming_filter(x: f64) -> f64 {
    let x = if x < 0.0 { -x } else { x };
    if x == 0.0 {
        return 1.0;
    }
    if x >= 1.0 {
        return 0.0;
    }
    let x = x * PI;
    // `0.54f + 0.46f * cos(x)`: single-precision constants, widened to double.
    x.sin() / x * (f64::from(0.54f32) + f64::from(0.46f32) * x.cos())
}

fn bicubic_filter(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = if x < 0.0 { -x } else { x };
    if x < 1.0 {
        return ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
    }
    if x < 2.0 {
        return (((x - 5.0) * x + 8.0) * x - 4.0) * A;
    }
    0.0
}

fn sinc_filter(x: f64) -> f64 {
    if x == 0.0 {
        return 1.0;
    }
    let x = x * PI;
    x.sin() / x
}

fn lanczos_filter(x: f64) -> f64 {
    if (-3.0..3.0).contains(&x) {
        sinc_filter(x) * sinc_filter(x / 3.0)
    } else {
        0.0
    }
}

/// One axis of an output: the source region `[src_offset, src_offset + src_len)` of the decoded
/// image is treated as an image of its own (Pillow clamps filter taps at ITS edges), resized by
/// Pillow to `resized` samples; outputs `[out_first, out_first + out_len)` of that resize are kept
/// and written at `[dst_offset, dst_offset + out_len)` of the output axis.
///
/// torchvision's `Resize(256)` + `CenterCrop(224)` of a 500x375 image is x = {0, 500, 341, 58,
/// 224, 0}, y = {0, 375, 256, 16, 224, 0}; `resized_crop(top, left, h, w, size)` (crop, then
/// resize) is x = {left, w, size, 0, size, 0}; a letterbox is {0, W, nw, 0, nw, (out - nw) / 2}.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AxisPlan {
    /// First source sample of the region.
    pub src_offset: u32,
    /// Source samples in the region.
    pub src_len: u32,
    /// Samples the region is resized to.
    pub resized: u32,
    /// First kept sample of the resize.
    pub out_first: u32,
    /// Kept samples.
    pub out_len: u32,
    /// Where the first kept sample lands in the output.
    pub dst_offset: u32,
}

impl AxisPlan {
    /// The whole source axis of `src_len` samples resized to the whole output axis of `out_len`.
    pub fn stretch(src_len: u32, out_len: u32) -> AxisPlan {
        AxisPlan {
            src_offset: 0,
            src_len,
            resized: out_len,
            out_first: 0,
            out_len,
            dst_offset: 0,
        }
    }

    /// torchvision's `CenterCrop(crop)` of the whole source axis resized to `resized`: the kept
    /// samples start at `int(round((resized - crop) / 2))` (Python's round: ties to even); a crop
    /// larger than the resize keeps it all, after `(crop - resized) // 2` pad samples.
    pub fn center_crop(src_len: u32, resized: u32, crop: u32) -> AxisPlan {
        let (out_first, out_len, dst_offset) = if resized >= crop {
            (round_half_even_half(resized - crop), crop, 0)
        } else {
            (0, resized, (crop - resized) / 2)
        };
        AxisPlan {
            src_offset: 0,
            src_len,
            resized,
            out_first,
            out_len,
            dst_offset,
        }
    }

    /// torchvision's `resized_crop`: the source samples `[offset, offset + len)` cropped, then
    /// resized to the whole output axis of `size`.
    pub fn crop_then_resize(offset: u32, len: u32, size: u32) -> AxisPlan {
        AxisPlan {
            src_offset: offset,
            src_len: len,
            resized: size,
            out_first: 0,
            out_len: size,
            dst_offset: 0,
        }
    }

    /// A letterbox: the whole source axis resized to `fitted` samples, centred (rounding down)
    /// on an output axis of `out_len`.
    pub fn letterbox(src_len: u32, fitted: u32, out_len: u32) -> AxisPlan {
        AxisPlan {
            src_offset: 0,
            src_len,
            resized: fitted,
            out_first: 0,
            out_len: fitted,
            dst_offset: out_len.saturating_sub(fitted) / 2,
        }
    }

    /// Whether Pillow resamples this axis (`need_horizontal` / `need_vertical`): only when the
    /// size changes. Otherwise the samples are copied.
    pub fn is_resampled(&self) -> bool {
        self.resized != self.src_len
    }

    /// Checks the plan against a source axis of `source_len` and an output axis of `output_len`
    /// samples.
    pub fn check(&self, axis: Axis, source_len: u32, output_len: u32) -> Result<(), PlanError> {
        self.check_own(axis)?;
        let src_end = u64::from(self.src_offset) + u64::from(self.src_len);
        if src_end > u64::from(source_len) {
            return Err(PlanError::SourceOutOfBounds {
                axis,
                end: src_end,
                len: source_len,
            });
        }
        let dst_end = u64::from(self.dst_offset) + u64::from(self.out_len);
        if dst_end > u64::from(output_len) {
            return Err(PlanError::OutputOutOfBounds {
                axis,
                end: dst_end,
                len: output_len,
            });
        }
        Ok(())
    }

    /// The checks that need no image: sizes non-zero and within [`MAX_SIDE`], the kept samples
    /// inside the resize.
    fn check_own(&self, axis: Axis) -> Result<(), PlanError> {
        if self.src_len == 0 || self.resized == 0 || self.out_len == 0 {
            return Err(PlanError::Empty { axis });
        }
        if self.src_len > MAX_SIDE || self.resized > MAX_SIDE {
            return Err(PlanError::TooLarge { axis });
        }
        let kept_end = u64::from(self.out_first) + u64::from(self.out_len);
        if kept_end > u64::from(self.resized) {
            return Err(PlanError::KeptOutOfBounds {
                axis,
                end: kept_end,
                resized: self.resized,
            });
        }
        Ok(())
    }
}

/// `int(round(d / 2))` in Python for a non-negative integer `d`: halves go to the even neighbour.
fn round_half_even_half(d: u32) -> u32 {
    let lower = d / 2;
    if d % 2 == 1 && lower % 2 == 1 {
        lower + 1
    } else {
        lower
    }
}

/// torchvision's `Resize(shorter_side)` of a `width` x `height` image: the shorter side becomes
/// `shorter_side`, the longer `int(shorter_side * long / short)` (a float division, truncated).
/// Returns the new (width, height).
pub fn torchvision_resize(width: u32, height: u32, shorter_side: u32) -> (u32, u32) {
    let long_side = |long: u32, short: u32| {
        // Exact operands (both below 2^53) and one correctly rounded division: Python's `/`.
        let v = (u64::from(shorter_side) * u64::from(long)) as f64 / f64::from(short.max(1));
        v as u32
    };
    if width <= height {
        (shorter_side, long_side(height, width))
    } else {
        (long_side(width, height), shorter_side)
    }
}

/// The plans of torchvision's `Resize(shorter_side)` + `CenterCrop((crop_height, crop_width))`
/// of a `width` x `height` image, as (x, y).
pub fn torchvision_center_crop(
    width: u32,
    height: u32,
    shorter_side: u32,
    crop_width: u32,
    crop_height: u32,
) -> (AxisPlan, AxisPlan) {
    let (rw, rh) = torchvision_resize(width, height, shorter_side);
    (
        AxisPlan::center_crop(width, rw, crop_width),
        AxisPlan::center_crop(height, rh, crop_height),
    )
}

/// An axis of the image, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Axis {
    /// Horizontal.
    X,
    /// Vertical.
    Y,
}

impl fmt::Display for Axis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Axis::X => "x",
            Axis::Y => "y",
        })
    }
}

/// Why a resample cannot be done as asked: the plans and buffers disagree.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PlanError {
    /// A source region, resize or kept range of zero samples.
    #[error("{axis} axis: a source region, resize or kept range is empty")]
    Empty {
        /// The axis.
        axis: Axis,
    },
    /// A side over [`MAX_SIDE`].
    #[error("{axis} axis: a side is over {MAX_SIDE} samples")]
    TooLarge {
        /// The axis.
        axis: Axis,
    },
    /// The source region ends past the image.
    #[error("{axis} axis: the source region ends at {end}, the image has {len} samples")]
    SourceOutOfBounds {
        /// The axis.
        axis: Axis,
        /// One past the region's last sample.
        end: u64,
        /// The image's samples along the axis.
        len: u32,
    },
    /// The kept samples end past the resize.
    #[error("{axis} axis: the kept samples end at {end}, the resize has {resized}")]
    KeptOutOfBounds {
        /// The axis.
        axis: Axis,
        /// One past the last kept sample.
        end: u64,
        /// Samples of the resize.
        resized: u32,
    },
    /// The kept samples land past the output.
    #[error("{axis} axis: the kept samples land up to {end}, the output has {len}")]
    OutputOutOfBounds {
        /// The axis.
        axis: Axis,
        /// One past the last written output sample.
        end: u64,
        /// The output's samples along the axis.
        len: u32,
    },
    /// Neither 1 (gray) nor 3 (RGB) channels.
    #[error("{0} channels: only 1 (gray) and 3 (RGB) are resampled")]
    Channels(u32),
    /// A buffer's length does not match the sizes given with it.
    #[error("the {what} buffer holds {actual} bytes, its sizes need {expected}")]
    BufferSize {
        /// Which buffer.
        what: &'static str,
        /// The length the sizes imply.
        expected: u64,
        /// The buffer's length.
        actual: u64,
    },
}

/// The coefficients of one axis for its kept outputs: output `j` (the resize's sample
/// `out_first + j`) is `clip8(HALF + sum(sample[start + k] * weights[j * taps + k]))` over
/// `k < len`, with `(start, len) = bounds[j]` in samples of the source region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AxisCoefficients {
    /// Whether Pillow resamples this axis. When it does not (the size is unchanged), the
    /// coefficients copy: one tap of weight [`ONE`] at the output's own position.
    pub resampled: bool,
    /// Weights per output (Pillow's `ksize`, the most taps any output of the resize may have;
    /// 1 for a copied axis); weights past an output's `len` are zero.
    pub taps: usize,
    /// Per kept output: the first source sample it reads and how many it reads.
    pub bounds: Vec<(u32, u32)>,
    /// `taps` weights per kept output, [`PRECISION_BITS`] fraction bits.
    pub weights: Vec<i32>,
}

impl AxisCoefficients {
    /// The source samples the kept outputs read, `[first, end)`.
    pub fn span(&self) -> (u32, u32) {
        let first = self.bounds.iter().map(|b| b.0).min().unwrap_or(0);
        let end = self.bounds.iter().map(|b| b.0 + b.1).max().unwrap_or(first);
        (first, end.max(first))
    }

    /// The same coefficients with every bound's start moved `by` samples back: for an input
    /// that starts `by` samples into the region (Pillow's "shift bounds for vertical pass").
    pub fn shifted(mut self, by: u32) -> AxisCoefficients {
        for b in &mut self.bounds {
            b.0 = b.0.saturating_sub(by);
        }
        self
    }

    /// Output `j`'s bounds and weights.
    fn output(&self, j: usize) -> ((u32, u32), &[i32]) {
        let bounds = self.bounds.get(j).copied().unwrap_or((0, 0));
        let start = j * self.taps;
        let weights = self.weights.get(start..start + self.taps).unwrap_or(&[]);
        (bounds, weights)
    }
}

/// The coefficients of `plan`'s kept outputs under `filter`: Pillow's `precompute_coeffs` and
/// `normalize_coeffs_8bpc` for a resampled axis, a copy for an axis whose size is unchanged.
pub fn axis_coefficients(
    plan: &AxisPlan,
    filter: Filter,
    axis: Axis,
) -> Result<AxisCoefficients, PlanError> {
    plan.check_own(axis)?;
    let kept = plan.out_first..plan.out_first + plan.out_len;
    if !plan.is_resampled() {
        return Ok(AxisCoefficients {
            resampled: false,
            taps: 1,
            bounds: kept.map(|i| (i, 1)).collect(),
            weights: vec![ONE; plan.out_len as usize],
        });
    }
    let in_size = plan.src_len as i32;
    // The box is (0, src_len) in C floats: `(double)(in1 - in0) / outSize`.
    let scale = f64::from(plan.src_len as f32 - 0.0f32) / f64::from(plan.resized);
    let filterscale = scale.max(1.0);
    let support = filter.support() * filterscale;
    let taps = (support.ceil() as usize) * 2 + 1;
    let inv_filterscale = 1.0 / filterscale;
    let mut bounds = Vec::with_capacity(plan.out_len as usize);
    let mut weights = vec![0i32; plan.out_len as usize * taps];
    let mut prekk = vec![0f64; taps];
    for (xx, row) in kept.zip(weights.chunks_exact_mut(taps)) {
        let center = 0.0 + (f64::from(xx) + 0.5) * scale;
        // `(int)` truncates toward zero; Rust's `as` does too (and saturates instead of UB).
        let xmin = ((center - support + 0.5) as i32).max(0);
        let xmax = ((center + support + 0.5) as i32).min(in_size);
        let len = (xmax - xmin).max(0) as usize;
        let k = &mut prekk[..len.min(taps)];
        let mut ww = 0.0;
        for (x, w) in k.iter_mut().enumerate() {
            let v = filter.weight((f64::from(x as i32 + xmin) - center + 0.5) * inv_filterscale);
            *w = v;
            ww += v;
        }
        if ww != 0.0 {
            k.iter_mut().for_each(|w| *w /= ww);
        }
        for (dst, &w) in row.iter_mut().zip(k.iter()) {
            *dst = to_fixed(w);
        }
        bounds.push((xmin as u32, k.len() as u32));
    }
    Ok(AxisCoefficients {
        resampled: true,
        taps,
        bounds,
        weights,
    })
}

/// `normalize_coeffs_8bpc` for one weight: rounded half away from zero (then truncated by the
/// conversion, as `(int)` does).
fn to_fixed(w: f64) -> i32 {
    let scaled = w * f64::from(ONE);
    if w < 0.0 {
        (-0.5 + scaled) as i32
    } else {
        (0.5 + scaled) as i32
    }
}

/// `clip8`: the sum shifted down to 8 bits (arithmetic shift, so negative sums floor) and
/// clamped to 0..=255, as Pillow's lookup table does.
pub fn clip8(sum: i32) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

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

/// Which Pillow's choice of first pass to reproduce when both axes are resampled. The passes
/// round to 8 bits in between, so the order shows in the output: a level up or down at places.
/// Pillow has changed it twice; [`PassOrder::for_pillow`] picks the one of a version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[allow(clippy::enum_variant_names)]
pub enum PassOrder {
    /// Pillow 13.0 and later (`ImagingResampleInner`): the vertical pass first when the height
    /// shrinks by more than twice as many samples as the width
    /// (`src_h - h > 0 && src_h - h > 2 * (src_w - w)`, sizes of the region and its resize).
    #[default]
    ShrinkVerticalFirst,
    /// Pillow 12.2 and 12.3 (`Image.resize`): the vertical pass first for an image more than 100
    /// times taller than wide whose height shrinks (`src_h > 100 * src_w && h < src_h`).
    TallVerticalFirst,
    /// Pillow 12.1 and earlier: the horizontal pass first, always.
    HorizontalFirst,
}

impl PassOrder {
    /// The pass order of Pillow `major.minor`.
    pub fn for_pillow(major: u32, minor: u32) -> PassOrder {
        match (major, minor) {
            (13.., _) => PassOrder::ShrinkVerticalFirst,
            (12, 2..) => PassOrder::TallVerticalFirst,
            _ => PassOrder::HorizontalFirst,
        }
    }

    /// Whether Pillow runs the vertical pass first for the region of plans `x` and `y` (when
    /// both axes are resampled; a lone pass needs no order).
    pub fn vertical_first(self, x: &AxisPlan, y: &AxisPlan) -> bool {
        let (src_w, src_h) = (i64::from(x.src_len), i64::from(y.src_len));
        let (w, h) = (i64::from(x.resized), i64::from(y.resized));
        match self {
            PassOrder::ShrinkVerticalFirst => src_h - h > 0 && src_h - h > (src_w - w) * 2,
            PassOrder::TallVerticalFirst => src_h > src_w * 100 && h < src_h,
            PassOrder::HorizontalFirst => false,
        }
    }
}

/// The direction a pass filters along.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Along rows (`ImagingResampleHorizontal_8bpc`).
    Horizontal,
    /// Along columns (`ImagingResampleVertical_8bpc`).
    Vertical,
}

/// One pass over a rectangle of its input. Output pixel (i, j), channel c, is
/// `clip8(HALF + sum(input[..] * weight))` over the taps of output i (horizontal: input row
/// `fixed_first + j`, columns `start_i..start_i + len_i`) or of output j (vertical: input column
/// `fixed_first + i`, rows `start_j..start_j + len_j`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pass {
    /// The direction of the taps.
    pub direction: Direction,
    /// Bounds and weights per output column (horizontal) or row (vertical), in input columns or
    /// rows.
    pub coefficients: AxisCoefficients,
    /// The input row read by output row 0 (horizontal) or column read by output column 0
    /// (vertical); the others follow one for one.
    pub fixed_first: u32,
}

/// Pillow's passes for the output of two plans (`ImagingResampleInner`): each resampled axis is
/// one pass, in Pillow's order; only the rows (or columns) the second pass reads go through the
/// first, as Pillow does for the horizontal-first order (the vertical-first order resamples every
/// column, of which the kept ones are the same).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassPlan {
    /// The pass from the source region into the 8-bit intermediate, when both axes are
    /// resampled.
    pub first: Option<Pass>,
    /// The intermediate's width and height in pixels; zero without a first pass.
    pub intermediate: (u32, u32),
    /// The pass into the kept rectangle of the output, from the intermediate after a first pass,
    /// else from the source region. With neither axis resampled it is a vertical copy (one tap
    /// of weight [`ONE`] per row).
    pub last: Pass,
}

impl PassPlan {
    /// Whether the horizontal pass runs first (both axes resampled, horizontal first).
    pub fn horizontal_first(&self) -> bool {
        self.first
            .as_ref()
            .is_some_and(|p| p.direction == Direction::Horizontal)
    }
}

/// Pillow's pass structure for the output of plans `x` and `y` under `filter`, in the pass
/// order of `order`.
pub fn plan_passes(
    x: &AxisPlan,
    y: &AxisPlan,
    filter: Filter,
    order: PassOrder,
) -> Result<PassPlan, PlanError> {
    let xc = axis_coefficients(x, filter, Axis::X)?;
    let yc = axis_coefficients(y, filter, Axis::Y)?;
    let pass = |direction, coefficients, fixed_first| Pass {
        direction,
        coefficients,
        fixed_first,
    };
    let plan = match (xc.resampled, yc.resampled) {
        (true, true) if order.vertical_first(x, y) => {
            let (first, end) = xc.span();
            PassPlan {
                first: Some(pass(Direction::Vertical, yc, first)),
                intermediate: (end - first, y.out_len),
                last: pass(Direction::Horizontal, xc.shifted(first), 0),
            }
        }
        (true, true) => {
            let (first, end) = yc.span();
            PassPlan {
                first: Some(pass(Direction::Horizontal, xc, first)),
                intermediate: (x.out_len, end - first),
                last: pass(Direction::Vertical, yc.shifted(first), 0),
            }
        }
        (true, false) => PassPlan {
            first: None,
            intermediate: (0, 0),
            last: pass(Direction::Horizontal, xc, y.out_first),
        },
        (false, _) => PassPlan {
            first: None,
            intermediate: (0, 0),
            last: pass(Direction::Vertical, yc, x.out_first),
        },
    };
    Ok(plan)
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
        filter,
        PassOrder::default(),
        pad,
        out,
        out_width,
        out_height,
    )
}

/// A decoded image in host memory: `width` x `height` pixels of `channels` (1 or 3)
/// interleaved 8-bit samples, rows packed.
#[derive(Debug, Clone, Copy)]
pub struct HostImage<'a> {
    /// The samples.
    pub pixels: &'a [u8],
    /// Pixels per row.
    pub width: u32,
    /// Rows.
    pub height: u32,
    /// Samples per pixel: 1 (gray) or 3 (RGB).
    pub channels: u32,
}

/// [`resample`] with the pass order of a chosen Pillow version ([`PassOrder::for_pillow`]).
#[allow(clippy::too_many_arguments)]
pub fn resample_with(
    source: &HostImage,
    x: &AxisPlan,
    y: &AxisPlan,
    filter: Filter,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(src_len: u32, resized: u32) -> AxisPlan {
        AxisPlan::stretch(src_len, resized)
    }

    #[test]
    fn fixed_point_constants_are_pillows() {
        assert_eq!(PRECISION_BITS, 22);
        assert_eq!(HALF, 1 << 21);
        assert_eq!(clip8(HALF + 200 * ONE), 200);
        assert_eq!(clip8(-1), 0, "negative sums floor, then clamp to 0");
        assert_eq!(clip8(i32::MAX), 255);
    }

    #[test]
    fn weights_round_half_away_from_zero() {
        assert_eq!(to_fixed(1.0), ONE);
        assert_eq!(to_fixed(0.5 / f64::from(ONE)), 1);
        assert_eq!(to_fixed(-0.5 / f64::from(ONE)), -1);
        assert_eq!(to_fixed(0.49 / f64::from(ONE)), 0);
        assert_eq!(to_fixed(-0.0), 0);
    }

    #[test]
    fn bilinear_halving_averages_pairs() {
        // Scale 2: support 2, ksize 5; output 0 is centred on 1.0 and reads samples 0..3 with
        // weights 3/8, 3/8... normalised over the clamped taps.
        let c = axis_coefficients(&plan(4, 2), Filter::Bilinear, Axis::X).expect("plan");
        assert!(c.resampled);
        assert_eq!(c.taps, 5);
        assert_eq!(c.bounds, vec![(0, 3), (1, 3)]);
        let sum: i64 = c.weights[..5].iter().map(|&w| i64::from(w)).sum();
        assert!((sum - i64::from(ONE)).abs() <= 2);
    }

    #[test]
    fn an_unchanged_axis_is_copied() {
        let p = AxisPlan {
            src_offset: 3,
            src_len: 10,
            resized: 10,
            out_first: 2,
            out_len: 5,
            dst_offset: 0,
        };
        let c = axis_coefficients(&p, Filter::Lanczos, Axis::Y).expect("plan");
        assert!(!c.resampled);
        assert_eq!(c.taps, 1);
        assert_eq!(c.bounds, vec![(2, 1), (3, 1), (4, 1), (5, 1), (6, 1)]);
        assert!(c.weights.iter().all(|&w| w == ONE));
    }

    #[test]
    fn center_crop_rounds_like_python() {
        // 341 - 224 = 117: round(58.5) = 58; 333 - 202 = 131: round(65.5) = 66.
        assert_eq!(AxisPlan::center_crop(500, 341, 224).out_first, 58);
        assert_eq!(AxisPlan::center_crop(256, 333, 202).out_first, 66);
        assert_eq!(AxisPlan::center_crop(256, 331, 202).out_first, 64);
        let padded = AxisPlan::center_crop(100, 100, 111);
        assert_eq!(
            (padded.out_first, padded.out_len, padded.dst_offset),
            (0, 100, 5)
        );
        assert_eq!(torchvision_resize(500, 375, 256), (341, 256));
        assert_eq!(torchvision_resize(375, 500, 256), (256, 341));
        let (x, y) = torchvision_center_crop(500, 375, 256, 224, 224);
        assert_eq!(
            x,
            AxisPlan {
                src_offset: 0,
                src_len: 500,
                resized: 341,
                out_first: 58,
                out_len: 224,
                dst_offset: 0
            }
        );
        assert_eq!((y.resized, y.out_first, y.out_len), (256, 16, 224));
    }

    #[test]
    fn the_first_pass_covers_only_what_the_second_reads() {
        let (x, y) = torchvision_center_crop(500, 375, 256, 224, 224);
        let p =
            plan_passes(&x, &y, Filter::Bilinear, PassOrder::ShrinkVerticalFirst).expect("plan");
        assert!(
            p.horizontal_first(),
            "119 rows less is not twice 159 columns less"
        );
        let first = p.first.as_ref().expect("both axes are resampled");
        let rows = first.fixed_first;
        assert!(
            rows > 0 && rows + p.intermediate.1 < 375,
            "{rows} + {}",
            p.intermediate.1
        );
        assert_eq!(p.intermediate.0, 224);
        assert_eq!(p.last.direction, Direction::Vertical);
        assert_eq!(
            p.last.coefficients.bounds[0].0, 0,
            "bounds shifted to the intermediate"
        );
    }

    #[test]
    fn pillow_13_shrinks_tall_images_vertically_first() {
        // 100x1000 -> 50x300: 700 rows less is more than twice 50 columns less.
        let (x, y) = (AxisPlan::stretch(100, 50), AxisPlan::stretch(1000, 300));
        let p = plan_passes(&x, &y, Filter::Bicubic, PassOrder::ShrinkVerticalFirst).expect("plan");
        let first = p.first.as_ref().expect("both axes are resampled");
        assert_eq!(first.direction, Direction::Vertical);
        assert_eq!(p.intermediate, (100, 300));
        assert_eq!(p.last.direction, Direction::Horizontal);
        let p12 = plan_passes(&x, &y, Filter::Bicubic, PassOrder::HorizontalFirst).expect("plan");
        assert!(p12.horizontal_first());
        // Growing the height never goes vertical first; neither does shrinking it by exactly
        // twice the width's shrink.
        let order = PassOrder::ShrinkVerticalFirst;
        assert!(!order.vertical_first(&x, &AxisPlan::stretch(1000, 1200)));
        assert!(!order.vertical_first(&x, &AxisPlan::stretch(1000, 900)));
        assert!(order.vertical_first(&x, &AxisPlan::stretch(1000, 899)));
    }

    #[test]
    fn pillow_12_2_shrinks_only_very_tall_images_vertically_first() {
        let order = PassOrder::for_pillow(12, 3);
        assert_eq!(order, PassOrder::TallVerticalFirst);
        let (x, y) = (AxisPlan::stretch(3, 2), AxisPlan::stretch(301, 100));
        assert!(
            order.vertical_first(&x, &y),
            "301 > 100 * 3, and the height shrinks"
        );
        assert!(!order.vertical_first(&x, &AxisPlan::stretch(300, 100)));
        assert!(!order.vertical_first(&x, &AxisPlan::stretch(301, 400)));
        assert_eq!(PassOrder::for_pillow(12, 1), PassOrder::HorizontalFirst);
        assert_eq!(PassOrder::for_pillow(11, 3), PassOrder::HorizontalFirst);
        assert_eq!(PassOrder::for_pillow(13, 0), PassOrder::default());
    }

    #[test]
    fn a_lone_resampled_axis_is_one_pass_from_the_source() {
        let x = AxisPlan {
            src_offset: 0,
            src_len: 40,
            resized: 40,
            out_first: 7,
            out_len: 20,
            dst_offset: 0,
        };
        let y = AxisPlan::stretch(30, 12);
        let p = plan_passes(&x, &y, Filter::Lanczos, PassOrder::ShrinkVerticalFirst).expect("plan");
        assert!(p.first.is_none());
        assert_eq!(
            (p.last.direction, p.last.fixed_first),
            (Direction::Vertical, 7)
        );
        let p = plan_passes(&y, &x, Filter::Lanczos, PassOrder::ShrinkVerticalFirst).expect("plan");
        assert_eq!(
            (p.last.direction, p.last.fixed_first),
            (Direction::Horizontal, 7)
        );
    }

    #[test]
    fn bad_plans_are_errors_not_panics() {
        let mut out = vec![0u8; 4 * 4 * 3];
        let src = vec![0u8; 8 * 8 * 3];
        let good = AxisPlan::stretch(8, 4);
        let cases = [
            AxisPlan { src_len: 0, ..good },
            AxisPlan { resized: 0, ..good },
            AxisPlan { out_len: 0, ..good },
            AxisPlan {
                src_offset: 1,
                ..good
            },
            AxisPlan {
                out_first: 1,
                ..good
            },
            AxisPlan {
                dst_offset: 1,
                ..good
            },
            AxisPlan {
                src_offset: u32::MAX,
                ..good
            },
            AxisPlan {
                resized: u32::MAX,
                out_first: u32::MAX,
                ..good
            },
            AxisPlan {
                src_len: u32::MAX,
                ..good
            },
        ];
        for bad in cases {
            let r = resample(
                &src,
                8,
                8,
                3,
                &bad,
                &good,
                Filter::Lanczos,
                0,
                &mut out,
                4,
                4,
            );
            assert!(r.is_err(), "{bad:?}");
            let r = resample(
                &src,
                8,
                8,
                3,
                &good,
                &bad,
                Filter::Lanczos,
                0,
                &mut out,
                4,
                4,
            );
            assert!(r.is_err(), "{bad:?}");
        }
        let r = resample(&src, 8, 8, 2, &good, &good, Filter::Box, 0, &mut out, 4, 4);
        assert_eq!(r, Err(PlanError::Channels(2)));
        let r = resample(
            &src[1..],
            8,
            8,
            3,
            &good,
            &good,
            Filter::Box,
            0,
            &mut out,
            4,
            4,
        );
        assert!(matches!(r, Err(PlanError::BufferSize { .. })));
    }

    #[test]
    fn a_copy_is_exact_and_pads_around() {
        // 2x2 RGB copied into the middle of a 4x4 output padded with 7.
        let src: Vec<u8> = (1..=12).collect();
        let mut out = vec![0u8; 4 * 4 * 3];
        let x = AxisPlan::letterbox(2, 2, 4);
        let y = AxisPlan::letterbox(2, 2, 4);
        resample(&src, 2, 2, 3, &x, &y, Filter::Bicubic, 7, &mut out, 4, 4).expect("copy");
        let at = |px: usize, py: usize| &out[(py * 4 + px) * 3..(py * 4 + px) * 3 + 3];
        assert_eq!(at(1, 1), &[1, 2, 3]);
        assert_eq!(at(2, 2), &[10, 11, 12]);
        assert_eq!(at(0, 0), &[7, 7, 7]);
        assert_eq!(at(3, 3), &[7, 7, 7]);
    }

    #[test]
    fn gray_is_spread_to_rgb() {
        let src = [0u8, 255, 255, 0];
        let mut out = vec![0u8; 3 * 3 * 3];
        let p = AxisPlan::stretch(2, 3);
        resample(&src, 2, 2, 1, &p, &p, Filter::Bilinear, 0, &mut out, 3, 3).expect("gray");
        assert!(out.chunks(3).all(|px| px[0] == px[1] && px[1] == px[2]));
    }

    /// The port reproduces Pillow itself: on every golden of tests/golden/ whose input decodes
    /// losslessly (PNG), the CPU rendition with the planner's plans gives Pillow's bytes exactly
    /// (torchvision's Resize + CenterCrop, other sizes, stretch, letterbox, bicubic, Lanczos).
    #[test]
    fn equals_pillow_on_the_png_goldens() {
        use crate::geometry::Geometry;
        use crate::options::{Interpolation, ResizeMode, ResizeOptions};
        let manifest = std::fs::read_to_string("tests/golden/MANIFEST.txt").expect("manifest");
        let mut compared = 0;
        for line in manifest.lines().filter(|l| !l.starts_with('#')) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (input, golden, variant) = (f[0], f[1], f.get(3).copied().unwrap_or("default"));
            // 16-bit files go through Pillow's own 16-bit conversion first; nearest is not a
            // filter of the port.
            if !input.ends_with(".png") || input.contains("16") || variant == "nearest" {
                continue;
            }
            let (mode, filter, interpolation) = match variant {
                "default" => (
                    ResizeMode::center_crop(256, 224),
                    Filter::Bilinear,
                    Interpolation::Bilinear,
                ),
                "bicubic" => (
                    ResizeMode::center_crop(256, 224),
                    Filter::Bicubic,
                    Interpolation::Bicubic,
                ),
                "lanczos" => (
                    ResizeMode::center_crop(256, 224),
                    Filter::Lanczos,
                    Interpolation::Lanczos,
                ),
                "r160c128" => (
                    ResizeMode::center_crop(160, 128),
                    Filter::Bilinear,
                    Interpolation::Bilinear,
                ),
                "stretch224" => (
                    ResizeMode::stretch(224, 224),
                    Filter::Bilinear,
                    Interpolation::Bilinear,
                ),
                "letterbox224" => (
                    ResizeMode::letterbox(224, 224, 114),
                    Filter::Bilinear,
                    Interpolation::Bilinear,
                ),
                _ => continue,
            };
            let pad = match mode {
                ResizeMode::Letterbox { pad, .. } => pad,
                _ => 0,
            };
            let geometry = Geometry::new(
                &ResizeOptions::default()
                    .mode(mode)
                    .interpolation(interpolation),
            );
            let source = image::open(input).expect("input").to_rgb8();
            let (w, h) = source.dimensions();
            let (x, y) = geometry.axis_plans(w, h, None);
            let (ow, oh) = (geometry.width, geometry.height);
            let mut out = vec![0xA5; ow as usize * oh as usize * 3];
            resample(
                source.as_raw(),
                w,
                h,
                3,
                &x,
                &y,
                filter,
                pad,
                &mut out,
                ow,
                oh,
            )
            .expect("resample");
            let want = image::open(format!("tests/golden/{golden}"))
                .expect("golden")
                .to_rgb8();
            let differing = want
                .as_raw()
                .iter()
                .zip(&out)
                .filter(|(a, b)| a != b)
                .count();
            assert_eq!(
                differing, 0,
                "{input} {variant}: {differing} bytes differ from Pillow"
            );
            compared += 1;
        }
        assert!(compared >= 12, "only {compared} goldens compared");
    }
}
