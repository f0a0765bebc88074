//! The CPU rendition of the path: dequantization and libjpeg-turbo's integer inverse DCT
//! (`jidctint.c`, `jpeg_idct_islow`), its upsampling (`jdsample.c`) and colour conversion
//! (`jdcolor.c`), written to follow the C line by line with the C's integer types (`JLONG` is
//! 64-bit, the workspace `int`, the multiplier `short`): the test oracle of the GPU kernels
//! (`kernels/idct.cu` mirrors these functions) and a fallback that needs no GPU. Its pixels equal
//! libjpeg-turbo's own decode bit for bit (`tests/coefficients.rs` proves it on every kind of
//! file).
//!
//! It renders a [`Window`] of the image: only the blocks whose samples the window reads are
//! transformed. It allocates one plane per component per call: a reference, not a hot path.

use super::layout::{ComponentLayout, Conversion, Layout, Upsampling, Window};
use super::{CoefficientSource, Error};

// ---- jidctint.c ----

/// `CONST_BITS` for 8-bit samples.
const CONST_BITS: u32 = 13;
/// `PASS1_BITS` for 8-bit samples.
const PASS1_BITS: u32 = 2;

/// The `FIX_*` constants of `jidctint.c` for `CONST_BITS` 13.
const FIX_0_298631336: i64 = 2446;
const FIX_0_390180644: i64 = 3196;
const FIX_0_541196100: i64 = 4433;
const FIX_0_765366865: i64 = 6270;
const FIX_0_899976223: i64 = 7373;
const FIX_1_175875602: i64 = 9633;
const FIX_1_501321110: i64 = 12299;
const FIX_1_847759065: i64 = 15137;
const FIX_1_961570560: i64 = 16069;
const FIX_2_053119869: i64 = 16819;
const FIX_2_562915447: i64 = 20995;
const FIX_3_072711026: i64 = 25172;

/// `DESCALE(x, n)`: `RIGHT_SHIFT(x + (ONE << (n - 1)), n)`, an arithmetic shift.
fn descale(x: i64, n: u32) -> i64 {
    (x + (1i64 << (n - 1))) >> n
}

/// `LEFT_SHIFT(a, b)`: `(JLONG)((unsigned long)(a) << (b))`.
fn left_shift(a: i64, b: u32) -> i64 {
    ((a as u64) << b) as i64
}

/// `DEQUANTIZE(coef, quantval)`: `((ISLOW_MULT_TYPE)(coef)) * (quantval)` with the multiplier
/// type `short` (libjpeg-turbo built with SIMD, as everywhere): an `int` product of two shorts.
fn dequantize(coef: i16, quantval: i16) -> i32 {
    i32::from(coef) * i32::from(quantval)
}

/// The post-IDCT part of libjpeg's `sample_range_limit` table (`jdmaster.c`,
/// `prepare_range_limit_table`), as `jpeg_idct_islow` indexes it: `IDCT_range_limit(cinfo)` is
/// the table shifted by `CENTERJSAMPLE`, indexed by the descaled value `& RANGE_MASK` (1023). So
/// the value, taken modulo 1024 as a signed 10-bit number, plus 128, clamped to 0..=255: entries
/// 0..128 are 128..256, 128..512 are 255, 512..896 are 0, 896..1024 are 0..128.
pub(crate) fn idct_range_limit(x: i32) -> u8 {
    let index = x & 1023;
    if index < 128 {
        (index + 128) as u8
    } else if index < 512 {
        255
    } else if index < 896 {
        0
    } else {
        (index - 896) as u8
    }
}

/// The 1-D inverse DCT both passes of `jpeg_idct_islow` run on eight values `v` (the LL&M
/// butterflies, figure 8 of the paper for the odd part): the eight outputs, in order, before
/// their pass's descale.
fn islow_1d(v: [i64; 8]) -> [i64; 8] {
    // Even part: reverse the even part of the forward DCT.
    let z1 = (v[2] + v[6]) * FIX_0_541196100;
    let tmp2 = z1 + v[6] * -FIX_1_847759065;
    let tmp3 = z1 + v[2] * FIX_0_765366865;
    let tmp0 = left_shift(v[0] + v[4], CONST_BITS);
    let tmp1 = left_shift(v[0] - v[4], CONST_BITS);
    let tmp10 = tmp0 + tmp3;
    let tmp13 = tmp0 - tmp3;
    let tmp11 = tmp1 + tmp2;
    let tmp12 = tmp1 - tmp2;

    // Odd part: y7, y5, y3, y1.
    let (tmp0, tmp1, tmp2, tmp3) = (v[7], v[5], v[3], v[1]);
    let z1 = tmp0 + tmp3;
    let z2 = tmp1 + tmp2;
    let z3 = tmp0 + tmp2;
    let z4 = tmp1 + tmp3;
    let z5 = (z3 + z4) * FIX_1_175875602;
    let z1 = z1 * -FIX_0_899976223;
    let z2 = z2 * -FIX_2_562915447;
    let z3 = z3 * -FIX_1_961570560 + z5;
    let z4 = z4 * -FIX_0_390180644 + z5;
    let tmp0 = tmp0 * FIX_0_298631336 + z1 + z3;
    let tmp1 = tmp1 * FIX_2_053119869 + z2 + z4;
    let tmp2 = tmp2 * FIX_3_072711026 + z2 + z3;
    let tmp3 = tmp3 * FIX_1_501321110 + z1 + z4;

    [
        tmp10 + tmp3,
        tmp11 + tmp2,
        tmp12 + tmp1,
        tmp13 + tmp0,
        tmp13 - tmp0,
        tmp12 - tmp1,
        tmp11 - tmp2,
        tmp10 - tmp3,
    ]
}

/// `jpeg_idct_islow`: dequantizes and inverse-transforms one block (`coef`, natural order) with
/// the multiplier table `quant` (the quantization table as `short`s), writing 8 rows of 8
/// samples `stride` apart from the start of `out`.
pub fn idct_islow(coef: &[i16], quant: &[i16; 64], out: &mut [u8], stride: usize) {
    let mut workspace = [0i32; 64];

    // Pass 1: process columns from input, store into work array.
    for col in 0..8 {
        let inp = |row: usize| coef[8 * row + col];
        let q = |row: usize| quant[8 * row + col];
        if (1..8).all(|row| inp(row) == 0) {
            // AC terms all zero
            let dcval = left_shift(i64::from(dequantize(inp(0), q(0))), PASS1_BITS) as i32;
            for row in 0..8 {
                workspace[8 * row + col] = dcval;
            }
            continue;
        }
        let column = islow_1d(std::array::from_fn(|row| {
            i64::from(dequantize(inp(row), q(row)))
        }));
        for (row, value) in column.into_iter().enumerate() {
            workspace[8 * row + col] = descale(value, CONST_BITS - PASS1_BITS) as i32;
        }
    }

    // Pass 2: process rows from work array, store into output array.
    for row in 0..8 {
        let w = &workspace[8 * row..8 * row + 8];
        let outrow = &mut out[row * stride..row * stride + 8];
        if w[1..].iter().all(|&v| v == 0) {
            // AC terms all zero (the NO_ZERO_ROW_TEST shortcut)
            let dcval = idct_range_limit(descale(i64::from(w[0]), PASS1_BITS + 3) as i32);
            outrow.fill(dcval);
            continue;
        }
        let samples = islow_1d(std::array::from_fn(|k| i64::from(w[k])));
        for (sample, value) in outrow.iter_mut().zip(samples) {
            *sample = idct_range_limit(descale(value, CONST_BITS + PASS1_BITS + 3) as i32);
        }
    }
}

/// The multiplier table `jddctmgr.c` makes for `jpeg_idct_islow`: each entry of the
/// quantization table cast to `ISLOW_MULT_TYPE` (`short`).
pub fn multiplier_table(quant: &[u16; 64]) -> [i16; 64] {
    quant.map(|q| q as i16)
}

// ---- jdsample.c ----

/// One component's samples after the inverse DCT, for the blocks a window needs: sample
/// `(i, j)` of the component at `data[(j - y0) * width + (i - x0)]`.
#[derive(Debug)]
pub(crate) struct Plane {
    pub x0: u32,
    pub y0: u32,
    pub width: u32,
    pub data: Vec<u8>,
}

impl Plane {
    fn at(&self, i: u32, j: u32) -> i32 {
        i32::from(self.data[((j - self.y0) * self.width + (i - self.x0)) as usize])
    }
}

/// The sample of `component` at full-resolution pixel `(x, y)`, as its upsampling routine makes
/// it. The fancy routines' neighbours beyond the component's real samples are the outermost
/// real ones (the special-cased first and last columns; the context rows `jdmainct.c` repeats).
pub(crate) fn upsampled(plane: &Plane, c: &ComponentLayout, x: u32, y: u32) -> i32 {
    let last_i = c.samples_wide - 1;
    let last_j = c.samples_high - 1;
    match c.upsampling {
        // fullsize_upsample
        Upsampling::Full => plane.at(x, y),
        // int_upsample, h2v1_upsample, h2v2_upsample: replication
        Upsampling::Box { h, v } => plane.at(x / u32::from(h), y / u32::from(v)),
        // h2v1_fancy_upsample
        Upsampling::FancyH2V1 => {
            let i = x >> 1;
            let invalue = plane.at(i, y);
            if x & 1 == 0 {
                if i == 0 {
                    invalue // special case for first column
                } else {
                    (invalue * 3 + plane.at(i - 1, y) + 1) >> 2
                }
            } else if i == last_i {
                invalue // special case for last column
            } else {
                (invalue * 3 + plane.at(i + 1, y) + 2) >> 2
            }
        }
        // h1v2_fancy_upsample: the nearer row times 3 plus the farther one (above for the
        // upper output row, bias 1; below for the lower, bias 2)
        Upsampling::FancyH1V2 => {
            let j = y >> 1;
            let (far, bias) = if y & 1 == 0 {
                (j.saturating_sub(1), 1)
            } else {
                ((j + 1).min(last_j), 2)
            };
            let thiscolsum = plane.at(x, j) * 3 + plane.at(x, far);
            (thiscolsum + bias) >> 2
        }
        // h2v2_fancy_upsample: column sums of the nearer and farther rows, then across
        Upsampling::FancyH2V2 => {
            let j = y >> 1;
            let far = if y & 1 == 0 {
                j.saturating_sub(1)
            } else {
                (j + 1).min(last_j)
            };
            let colsum = |i: u32| plane.at(i, j) * 3 + plane.at(i, far);
            let i = x >> 1;
            let thiscolsum = colsum(i);
            if x & 1 == 0 {
                if i == 0 {
                    (thiscolsum * 4 + 8) >> 4 // special case for first column
                } else {
                    (thiscolsum * 3 + colsum(i - 1) + 8) >> 4
                }
            } else if i == last_i {
                (thiscolsum * 4 + 7) >> 4 // special case for last column
            } else {
                (thiscolsum * 3 + colsum(i + 1) + 7) >> 4
            }
        }
    }
}

// ---- jdcolor.c ----

/// `SCALEBITS` of `jdcolor.c`.
const SCALEBITS: u32 = 16;
/// `ONE_HALF`: `1 << (SCALEBITS - 1)`.
const ONE_HALF: i64 = 1 << (SCALEBITS - 1);
/// `FIX(1.40200)`: `(JLONG)(1.40200 * (1 << 16) + 0.5)`.
pub(crate) const FIX_1_40200: i64 = 91881;
/// `FIX(1.77200)`.
pub(crate) const FIX_1_77200: i64 = 116130;
/// `FIX(0.71414)`.
pub(crate) const FIX_0_71414: i64 = 46802;
/// `FIX(0.34414)`.
pub(crate) const FIX_0_34414: i64 = 22554;

/// `range_limit` of the colour converters: `sample_range_limit`'s simple part, a clamp to
/// 0..=255 for the sums they form.
fn range_limit(x: i64) -> u8 {
    x.clamp(0, 255) as u8
}

/// `ycc_rgb_convert` for one pixel, with `build_ycc_rgb_table`'s tables computed in place:
/// `Cr_r_tab[cr] = RIGHT_SHIFT(FIX(1.40200) * x + ONE_HALF, 16)`, `Cb_b_tab` likewise with
/// `FIX(1.77200)`, and green `RIGHT_SHIFT(Cb_g_tab[cb] + Cr_g_tab[cr], 16)` with
/// `Cb_g_tab = -FIX(0.34414) * x + ONE_HALF`, `Cr_g_tab = -FIX(0.71414) * x`, where
/// `x = value - CENTERJSAMPLE`.
pub fn ycc_to_rgb(y: i32, cb: i32, cr: i32) -> [u8; 3] {
    let y = i64::from(y);
    let cb = i64::from(cb) - 128;
    let cr = i64::from(cr) - 128;
    let cr_r = (FIX_1_40200 * cr + ONE_HALF) >> SCALEBITS;
    let cb_b = (FIX_1_77200 * cb + ONE_HALF) >> SCALEBITS;
    let cr_g = -FIX_0_71414 * cr;
    let cb_g = -FIX_0_34414 * cb + ONE_HALF;
    [
        range_limit(y + cr_r),
        range_limit(y + ((cb_g + cr_g) >> SCALEBITS)),
        range_limit(y + cb_b),
    ]
}

// ---- the window ----

/// The planes of `window`'s blocks: each component's needed blocks dequantized and
/// inverse-transformed.
pub(crate) fn planes<S: CoefficientSource + ?Sized>(
    source: &S,
    layout: &Layout,
    window: &Window,
) -> Result<Vec<Plane>, Error> {
    (0..layout.components.len())
        .map(|c| {
            let rect = layout.blocks(c, window);
            let quant = source.quant_table(c).ok_or_else(|| {
                Error::Request(format!("component {c} has no quantization table"))
            })?;
            let quant = multiplier_table(quant);
            let width = rect.width() * 8;
            let mut data = vec![0u8; (width * rect.height() * 8) as usize];
            for by in rect.y0..rect.y1 {
                let row = source.block_row(c, by).ok_or_else(|| {
                    Error::Request(format!("block row {by} of component {c} was not read"))
                })?;
                for bx in rect.x0..rect.x1 {
                    let block = row
                        .get(bx as usize * 64..bx as usize * 64 + 64)
                        .ok_or_else(|| {
                            Error::Request(format!("block {bx} of row {by} of component {c}"))
                        })?;
                    let at = ((by - rect.y0) * 8 * width + (bx - rect.x0) * 8) as usize;
                    idct_islow(block, &quant, &mut data[at..], width as usize);
                }
            }
            Ok(Plane {
                x0: rect.x0 * 8,
                y0: rect.y0 * 8,
                width,
                data,
            })
        })
        .collect()
}

/// Renders `window` of the image into `out`: `window.height` rows `pitch` bytes apart, each
/// `window.width` pixels of [`Layout::channels`] bytes (RGB, or one gray byte).
pub fn render<S: CoefficientSource + ?Sized>(
    source: &S,
    layout: &Layout,
    window: &Window,
    out: &mut [u8],
    pitch: usize,
) -> Result<(), Error> {
    layout.check(window)?;
    let channels = layout.channels();
    let row_bytes = window.width as usize * channels;
    let needed = (window.height as usize - 1) * pitch + row_bytes;
    if pitch < row_bytes || out.len() < needed {
        return Err(Error::Request(format!(
            "an output of {} bytes with pitch {pitch} cannot hold {}x{} pixels of {channels} bytes",
            out.len(),
            window.width,
            window.height
        )));
    }
    let planes = planes(source, layout, window)?;
    let components = &layout.components;
    for row in 0..window.height {
        let y = window.y + row;
        let line = &mut out[row as usize * pitch..][..row_bytes];
        for (col, pixel) in line.chunks_exact_mut(channels).enumerate() {
            let x = window.x + col as u32;
            match layout.conversion {
                Conversion::Gray => {
                    pixel[0] = upsampled(&planes[0], &components[0], x, y) as u8;
                }
                Conversion::Rgb => {
                    for c in 0..3 {
                        pixel[c] = upsampled(&planes[c], &components[c], x, y) as u8;
                    }
                }
                Conversion::YCbCr => {
                    let [y0, cb, cr] =
                        [0, 1, 2].map(|c| upsampled(&planes[c], &components[c], x, y));
                    pixel.copy_from_slice(&ycc_to_rgb(y0, cb, cr));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The post-IDCT table built as `prepare_range_limit_table` builds it, entry for entry.
    #[test]
    fn range_limit_is_libjpegs_table() {
        // table = 5 * 256 + 128 entries; sample_range_limit = table + 256
        let mut table = vec![0u8; 5 * 256 + 128];
        let base = 256usize;
        for i in 0..=255 {
            table[base + i] = i as u8;
        }
        let post = base + 128; // IDCT_range_limit
        for i in 128..512 {
            table[post + i] = 255;
        }
        // second half: zeros, then a copy of sample_range_limit[0..128]
        for i in 0..128 {
            table[post + 4 * 256 - 128 + i] = i as u8;
        }
        for x in -5000i32..5000 {
            assert_eq!(
                idct_range_limit(x),
                table[post + (x & 1023) as usize],
                "{x}"
            );
        }
    }

    /// The `FIX` constants are `jdcolor.c`'s and `jidctint.c`'s formula.
    #[test]
    fn constants_follow_the_fix_formula() {
        let fix16 = |x: f64| (x * 65536.0 + 0.5) as i64;
        assert_eq!(FIX_1_40200, fix16(1.40200));
        assert_eq!(FIX_1_77200, fix16(1.77200));
        assert_eq!(FIX_0_71414, fix16(0.71414));
        assert_eq!(FIX_0_34414, fix16(0.34414));
        let fix13 = |x: f64| (x * 8192.0 + 0.5) as i64;
        for (c, x) in [
            (FIX_0_298631336, 0.298631336),
            (FIX_0_390180644, 0.390180644),
            (FIX_0_541196100, 0.541196100),
            (FIX_0_765366865, 0.765366865),
            (FIX_0_899976223, 0.899976223),
            (FIX_1_175875602, 1.175875602),
            (FIX_1_501321110, 1.501321110),
            (FIX_1_847759065, 1.847759065),
            (FIX_1_961570560, 1.961570560),
            (FIX_2_053119869, 2.053119869),
            (FIX_2_562915447, 2.562915447),
            (FIX_3_072711026, 3.072711026),
        ] {
            assert_eq!(c, fix13(x), "{x}");
        }
    }

    /// A DC-only block is flat at `range_limit(DESCALE(dc * q << 2, 5))`, and the IDCT of a
    /// single AC coefficient is close to the cosine it stands for.
    #[test]
    fn idct_of_simple_blocks() {
        let quant = [1i16; 64];
        let mut out = [0u8; 64];
        let mut coef = [0i16; 64];
        coef[0] = 80; // DC 80: (80 << 2 + 16) >> 5 = 10 above 128
        idct_islow(&coef, &quant, &mut out, 8);
        assert!(out.iter().all(|&v| v == 138));
        coef[1] = 40; // horizontal frequency 1
        idct_islow(&coef, &quant, &mut out, 8);
        for x in 0..8 {
            let c = std::f64::consts::PI * (2.0 * x as f64 + 1.0) / 16.0;
            let expected = 138.0 + 40.0 / 8.0 * 2f64.sqrt() * c.cos();
            assert!((f64::from(out[x]) - expected).abs() <= 1.0, "{x}");
            assert_eq!(out[x], out[56 + x]);
        }
    }
}
