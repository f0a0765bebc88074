//! Pillow's passes on the CPU, written straight into an output slot: a portable rendition and an
//! AVX2 one, chosen at run time, bit-identical to each other and to Pillow.
//!
//! An [`ImagePlan`] runs as Pillow runs it: `NEAREST` and unchanged axes are a gather; one
//! resampled axis is one pass from the source; two are two passes through an 8-bit intermediate
//! in Pillow's order (the horizontal one over only the rows the vertical one reads). The last
//! pass writes the kept rectangle of the slot, gray spread to three equal channels there.
//!
//! A large pass may be cut into bands of its output rows run side by side on threads of their
//! own ([`resample_into`]'s `threads`): each band is the very arithmetic of the whole pass on its
//! rows, so the bytes do not depend on the cut.

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx2;
mod portable;

use super::coefficients::AxisCoefficients;
use super::image::ImagePlan;
use super::plan::{Axis, AxisPlan, PlanError};

/// The instruction sets the passes can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernels {
    /// Plain Rust, any CPU.
    Portable,
    /// x86-64 with AVX2 (checked at run time).
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

impl Kernels {
    /// The fastest this CPU runs.
    pub fn detect() -> Kernels {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") {
            return Kernels::Avx2;
        }
        Kernels::Portable
    }
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

/// An output image: `width` x `height` packed RGB8 pixels.
#[derive(Debug)]
pub struct Slot<'a> {
    /// The bytes, `width * height * 3`.
    pub bytes: &'a mut [u8],
    /// Pixels per row.
    pub width: u32,
    /// Rows.
    pub height: u32,
}

/// A horizontal pass over `rows` rows of `input` (row `r` at `r * pitch`; a bound's start less
/// `shift` counts pixels from the row's start) into `output` (row `r` at `r * out_pitch`, pixel `j` at
/// `j * out_step`; `out_step` 3 with one channel spreads gray to RGB).
pub(super) struct HorizontalPass<'a> {
    pub input: &'a [u8],
    pub pitch: usize,
    pub rows: usize,
    pub channels: usize,
    pub coefficients: &'a AxisCoefficients,
    pub shift: usize,
    /// The weights split for 16-bit multiplies (used by the AVX2 pass).
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused))]
    pub split: &'a SplitWeights,
    pub output: &'a mut [u8],
    pub out_pitch: usize,
    pub out_step: usize,
    /// Scratch for the AVX2 pass's strips ([`strip_bytes`] of them).
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused))]
    pub strips: &'a mut [u8],
}

/// A vertical pass: output row `j` is the weighted sum of input rows `start_j - shift..` (`len_j`
/// of them, row `i` at `i * pitch`), over the first `row_bytes` bytes of each, written at
/// `j * out_pitch` of `output` (each byte three times when `spread`).
pub(super) struct VerticalPass<'a> {
    pub input: &'a [u8],
    pub pitch: usize,
    pub row_bytes: usize,
    pub coefficients: &'a AxisCoefficients,
    pub shift: usize,
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused))]
    pub split: &'a SplitWeights,
    pub output: &'a mut [u8],
    pub out_pitch: usize,
    pub spread: bool,
}

/// An axis's weights split for 8- and 16-bit multiplies: `w = hi * 65536 + lo` with `lo` in
/// `i16`'s range. `sample * w` is then `(sample * hi) << 16` plus `sample * lo`, and since only
/// `sum(sample * hi)` modulo 2^16 counts after the shift (sums are modulo 2^32, like Pillow's
/// `int`), it may be summed in wrapping 16-bit lanes, two taps at a time by `maddubs` (unsigned
/// samples times signed bytes), while the `lo` products go through `madd`. That is exact as long
/// as each `hi` fits a signed byte and no pair of taps `(2k, 2k + 1)` saturates `maddubs`
/// (`|hi_2k| + |hi_2k+1| <= 128`: `255 * 128 < 2^15`), which Pillow's weights (at most about
/// 1.x in 22-bit fixed point, so `|hi| <= 64` or so) always do; [`SplitWeights::bytes`] says
/// whether they do. Each output's row of `stride` weights is padded with zeros to a multiple of 8.
#[derive(Debug, Clone, Default)]
pub(crate) struct SplitWeights {
    pub hi: Vec<i8>,
    pub lo: Vec<i16>,
    pub stride: usize,
    /// Every `hi` fits a signed byte and every pair of them `maddubs` without saturation.
    pub bytes: bool,
}

impl SplitWeights {
    /// The split weights of outputs `from..to` (those of a band of a pass's outputs); empty
    /// where they were not split.
    fn rows(&self, from: usize, to: usize) -> SplitWeights {
        let (a, b) = (from * self.stride, to * self.stride);
        SplitWeights {
            hi: self.hi.get(a..b).map_or_else(Vec::new, <[i8]>::to_vec),
            lo: self.lo.get(a..b).map_or_else(Vec::new, <[i16]>::to_vec),
            stride: self.stride,
            bytes: self.bytes,
        }
    }

    /// Splits `c`'s weights into `self`, reusing its buffers.
    pub fn split(&mut self, c: &AxisCoefficients) {
        let stride = c.taps.max(1).next_multiple_of(8);
        self.stride = stride;
        let n = c.bounds.len() * stride;
        self.hi.clear();
        self.lo.clear();
        self.hi.resize(n, 0);
        self.lo.resize(n, 0);
        let mut bytes = true;
        let rows = c.weights.chunks_exact(c.taps.max(1));
        let hi_rows = self.hi.chunks_exact_mut(stride);
        let lo_rows = self.lo.chunks_exact_mut(stride);
        for (((row, hi_row), lo_row), &(_, len)) in rows.zip(hi_rows).zip(lo_rows).zip(&c.bounds) {
            // Past an output's taps its weights are zero, and so are their halves.
            let len = (len as usize).min(row.len());
            let mut pair = 0;
            for (k, ((&w, hi), lo)) in row[..len].iter().zip(hi_row).zip(lo_row).enumerate() {
                *lo = w as i16;
                let h = w.wrapping_sub(i32::from(*lo)) >> 16;
                *hi = h as i8;
                pair = if k % 2 == 0 { h.abs() } else { pair + h.abs() };
                bytes &= i8::try_from(h).is_ok() && pair <= 128;
            }
        }
        self.bytes = bytes;
    }
}

/// Output bytes a band of a pass holds at least: a smaller one saves less than its thread's
/// start costs (a band of 256 KiB is a few hundred microseconds of a pass).
const BAND_BYTES: usize = 1 << 18;

/// How many bands of rows a pass writing `rows` rows `row_bytes` apart is cut into: at most
/// `threads`, and none under [`BAND_BYTES`].
fn band_count(threads: usize, rows: usize, row_bytes: usize) -> usize {
    (rows.saturating_mul(row_bytes) / BAND_BYTES)
        .min(threads)
        .min(rows)
        .max(1)
}

/// Resamples `source` by `plan` into `slot`: the kept outputs at the plans' destination, `pad`
/// everywhere else, with `kernels`, each pass cut into bands of rows on up to `threads` threads
/// (the calling one and others started for it; 1: all on the calling thread). `scratch` holds
/// the intermediate and the horizontal pass's strips (grown, never shrunk).
pub(crate) fn resample_into(
    plan: &ImagePlan,
    source: &HostImage,
    pad: u8,
    slot: &mut Slot,
    kernels: Kernels,
    scratch: &mut Vec<u8>,
    threads: usize,
) -> Result<(), PlanError> {
    let channels = source.channels;
    if channels != 1 && channels != 3 {
        return Err(PlanError::Channels(channels));
    }
    check_len(
        "source",
        source.pixels.len(),
        [source.width, source.height, channels],
    )?;
    check_len("output", slot.bytes.len(), [slot.width, slot.height, 3])?;
    let (x, y) = (&plan.x, &plan.y);
    x.check(Axis::X, source.width, slot.width)?;
    y.check(Axis::Y, source.height, slot.height)?;
    pad_outside(slot, x, y, pad);
    let c = channels as usize;
    let pitch = source.width as usize * c;
    // The source region starts at its top-left sample; the coefficients count from there.
    let corner = y.src_offset as usize * pitch + x.src_offset as usize * c;
    let region = source.pixels.get(corner..).unwrap_or(&[]);
    let out_pitch = slot.width as usize * 3;
    let out_at = y.dst_offset as usize * out_pitch + x.dst_offset as usize * 3;
    let output = slot.bytes.get_mut(out_at..).unwrap_or(&mut []);
    let (xc, yc) = (&plan.xc, &plan.yc);
    match (xc.resampled, yc.resampled) {
        (false, false) => gather(region, pitch, c, xc, yc, output, out_pitch),
        (true, false) => {
            // One horizontal pass over the rows the kept outputs copy (consecutive).
            let rows = yc.span().0 as usize;
            let (_, strips) = carve(scratch, 0, strip_bytes(kernels, xc, c, 0, 3));
            let mut pass = HorizontalPass {
                input: region.get(rows * pitch..).unwrap_or(&[]),
                pitch,
                rows: yc.bounds.len(),
                channels: c,
                coefficients: xc,
                shift: 0,
                split: &plan.x_split,
                output,
                out_pitch,
                out_step: 3,
                strips,
            };
            horizontal_in_bands(&mut pass, kernels, threads);
        }
        (false, true) => {
            let columns = xc.span().0 as usize;
            let mut pass = VerticalPass {
                input: region.get(columns * c..).unwrap_or(&[]),
                pitch,
                row_bytes: xc.bounds.len() * c,
                coefficients: yc,
                shift: 0,
                split: &plan.y_split,
                output,
                out_pitch,
                spread: c == 1,
            };
            vertical_in_bands(&mut pass, kernels, threads);
        }
        (true, true) if plan.vertical_first => {
            // The vertical pass over the columns the horizontal one reads, into the
            // intermediate; then the horizontal pass from it.
            let (first, end) = xc.span();
            let width = (end - first) as usize;
            let tmp_pitch = width * c;
            let strips = strip_bytes(kernels, xc, c, first as usize, 3);
            let (intermediate, strips) = carve(scratch, tmp_pitch * yc.bounds.len(), strips);
            let mut pass = VerticalPass {
                input: region.get(first as usize * c..).unwrap_or(&[]),
                pitch,
                row_bytes: tmp_pitch,
                coefficients: yc,
                shift: 0,
                split: &plan.y_split,
                output: intermediate,
                out_pitch: tmp_pitch,
                spread: false,
            };
            vertical_in_bands(&mut pass, kernels, threads);
            let mut pass = HorizontalPass {
                input: intermediate,
                pitch: tmp_pitch,
                rows: yc.bounds.len(),
                channels: c,
                coefficients: &plan.xc,
                shift: first as usize,
                split: &plan.x_split,
                output,
                out_pitch,
                out_step: 3,
                strips,
            };
            horizontal_in_bands(&mut pass, kernels, threads);
        }
        (true, true) => {
            // The horizontal pass over the rows the vertical one reads, into the
            // intermediate; then the vertical pass from it.
            let (first, end) = yc.span();
            let rows = (end - first) as usize;
            let tmp_pitch = xc.bounds.len() * c;
            let strips = strip_bytes(kernels, xc, c, 0, c);
            let (intermediate, strips) = carve(scratch, tmp_pitch * rows, strips);
            let mut pass = HorizontalPass {
                input: region.get(first as usize * pitch..).unwrap_or(&[]),
                pitch,
                rows,
                channels: c,
                coefficients: xc,
                shift: 0,
                split: &plan.x_split,
                output: intermediate,
                out_pitch: tmp_pitch,
                out_step: c,
                strips,
            };
            horizontal_in_bands(&mut pass, kernels, threads);
            let mut pass = VerticalPass {
                input: intermediate,
                pitch: tmp_pitch,
                row_bytes: tmp_pitch,
                coefficients: &plan.yc,
                shift: first as usize,
                split: &plan.y_split,
                output,
                out_pitch,
                spread: c == 1,
            };
            vertical_in_bands(&mut pass, kernels, threads);
        }
    }
    Ok(())
}

/// Fills with `pad` every byte of `slot` outside the kept outputs' rectangle (`x` and `y`
/// checked against it); the passes write every byte inside it.
fn pad_outside(slot: &mut Slot, x: &AxisPlan, y: &AxisPlan, pad: u8) {
    let pitch = slot.width as usize * 3;
    let (top, rows) = (y.dst_offset as usize, y.out_len as usize);
    let left = (x.dst_offset as usize * 3).min(pitch);
    let right = (left + x.out_len as usize * 3).min(pitch);
    for (r, row) in slot.bytes.chunks_exact_mut(pitch.max(1)).enumerate() {
        if r < top || r >= top + rows {
            row.fill(pad);
        } else {
            row[..left].fill(pad);
            row[right..].fill(pad);
        }
    }
}

/// Runs `bands` (each a band's work), the first on the calling thread and the others on
/// threads of their own, and returns once all are done.
fn run_bands<F: FnOnce() + Send>(bands: Vec<F>) {
    std::thread::scope(|scope| {
        let mut bands = bands.into_iter();
        let first = bands.next();
        for band in bands {
            scope.spawn(band);
        }
        if let Some(first) = first {
            first();
        }
    });
}

/// `pass` cut into bands of its rows on up to `threads` threads (each band with strips of its
/// own), or whole on the calling thread where one band is enough.
fn horizontal_in_bands(pass: &mut HorizontalPass, kernels: Kernels, threads: usize) {
    let bands = band_count(threads, pass.rows, pass.out_pitch);
    if bands <= 1 || pass.out_pitch == 0 {
        horizontal(pass, kernels);
        return;
    }
    let per = pass.rows.div_ceil(bands);
    let (input, pitch, rows, channels) = (pass.input, pass.pitch, pass.rows, pass.channels);
    let (coefficients, shift, split) = (pass.coefficients, pass.shift, pass.split);
    let (out_pitch, out_step, strip_len) = (pass.out_pitch, pass.out_step, pass.strips.len());
    let work: Vec<_> = pass
        .output
        .chunks_mut(per * out_pitch)
        .enumerate()
        .map(|(band, output)| (band * per, output))
        .take_while(|&(from, _)| from < rows)
        .map(|(from, output)| {
            move || {
                let mut strips = vec![0u8; strip_len];
                let mut part = HorizontalPass {
                    input: input.get(from * pitch..).unwrap_or(&[]),
                    pitch,
                    rows: per.min(rows - from),
                    channels,
                    coefficients,
                    shift,
                    split,
                    output,
                    out_pitch,
                    out_step,
                    strips: &mut strips,
                };
                horizontal(&mut part, kernels);
            }
        })
        .collect();
    run_bands(work);
}

/// `pass` cut into bands of its output rows on up to `threads` threads (each band with its
/// rows' coefficients), or whole on the calling thread where one band is enough.
fn vertical_in_bands(pass: &mut VerticalPass, kernels: Kernels, threads: usize) {
    let rows = pass.coefficients.bounds.len();
    let bands = band_count(threads, rows, pass.out_pitch);
    if bands <= 1 || pass.out_pitch == 0 {
        vertical(pass, kernels);
        return;
    }
    let per = rows.div_ceil(bands);
    let parts: Vec<(AxisCoefficients, SplitWeights)> = (0..rows)
        .step_by(per)
        .map(|from| {
            let to = (from + per).min(rows);
            (pass.coefficients.rows(from, to), pass.split.rows(from, to))
        })
        .collect();
    let (input, pitch, row_bytes, shift) = (pass.input, pass.pitch, pass.row_bytes, pass.shift);
    let (out_pitch, spread) = (pass.out_pitch, pass.spread);
    let work: Vec<_> = parts
        .iter()
        .zip(pass.output.chunks_mut(per * out_pitch))
        .map(|((coefficients, split), output)| {
            move || {
                let mut part = VerticalPass {
                    input,
                    pitch,
                    row_bytes,
                    coefficients,
                    shift,
                    split,
                    output,
                    out_pitch,
                    spread,
                };
                vertical(&mut part, kernels);
            }
        })
        .collect();
    run_bands(work);
}

/// The scratch bytes `kernels`' horizontal pass needs for `coefficients` over `channels`-sample
/// pixels (bounds less `shift`), writing pixels `out_step` bytes apart.
fn strip_bytes(
    kernels: Kernels,
    coefficients: &AxisCoefficients,
    channels: usize,
    shift: usize,
    out_step: usize,
) -> usize {
    match kernels {
        Kernels::Portable => 0,
        #[cfg(target_arch = "x86_64")]
        Kernels::Avx2 => avx2::StripLayout::of(coefficients, channels, shift, out_step)
            .map_or(0, |layout| layout.bytes()),
    }
}

/// `scratch` as two buffers of `first` and `second` bytes. It grows when short and is never
/// shrunk or cleared: every pass writes all of its output before the next reads it.
fn carve(scratch: &mut Vec<u8>, first: usize, second: usize) -> (&mut [u8], &mut [u8]) {
    let total = first + second;
    if scratch.len() < total {
        scratch.resize(total, 0);
    }
    let (a, b) = scratch.split_at_mut(first);
    (a, &mut b[..second])
}

fn horizontal(pass: &mut HorizontalPass, kernels: Kernels) {
    match kernels {
        Kernels::Portable => portable::horizontal(pass),
        #[cfg(target_arch = "x86_64")]
        Kernels::Avx2 => avx2::horizontal(pass),
    }
}

fn vertical(pass: &mut VerticalPass, kernels: Kernels) {
    match kernels {
        Kernels::Portable => portable::vertical(pass),
        #[cfg(target_arch = "x86_64")]
        Kernels::Avx2 => avx2::vertical(pass),
    }
}

/// Neither axis filtered (`NEAREST`, or a copy): each output pixel is one source pixel, or 0
/// where a nearest position falls past the image.
fn gather(
    region: &[u8],
    pitch: usize,
    c: usize,
    xc: &AxisCoefficients,
    yc: &AxisCoefficients,
    output: &mut [u8],
    out_pitch: usize,
) {
    for (j, &(row, rows)) in yc.bounds.iter().enumerate() {
        let Some(out) = output.get_mut(j * out_pitch..j * out_pitch + xc.bounds.len() * 3) else {
            return;
        };
        if rows == 0 {
            out.fill(0);
            continue;
        }
        let line = region.get(row as usize * pitch..).unwrap_or(&[]);
        for (px, &(col, cols)) in out.chunks_exact_mut(3).zip(&xc.bounds) {
            let at = col as usize * c;
            match line.get(at..at + c) {
                Some(s) if cols > 0 && c == 3 => px.copy_from_slice(s),
                Some(s) if cols > 0 => px.fill(s[0]),
                _ => px.fill(0),
            }
        }
    }
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
