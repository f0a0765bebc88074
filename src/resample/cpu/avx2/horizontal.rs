//! The horizontal pass with AVX2, 32 rows at a time through their transpose.
//!
//! Output pixel j of a row reads the `len_j` pixels from `start_j` on with output j's weights,
//! the same for every row. A strip of 32 rows is transposed ([`super::transpose`]) so that
//! each byte column's 32 samples are contiguous: pixel p's samples for all the rows and all
//! channels are then one vector of `32 * channels` bytes (`[channel][row]`), and output j of the
//! strip is the weighted sum of the consecutive vectors of its taps, exactly as an output row of
//! the vertical pass is of its input rows ([`super::sum32`]): every lane used, each output's
//! weights broadcast once per 32 samples instead of once per pixel. The sums come out as columns
//! too (`[output byte][row]`, written in order) and are transposed back into the strip's output
//! rows. A strip's transposed input stays in the first levels of cache (32 times the bytes of a
//! row the outputs read).

use std::arch::x86_64::*;

use super::super::{HorizontalPass, SplitWeights};
use super::transpose::{columns_to_rows, rows_to_columns};
use super::{spread_gray, sum32};
use crate::resample::coefficients::AxisCoefficients;

/// Rows per strip: four transposes of eight.
const STRIP: usize = 32;

/// Where a pass's strip buffers lie in its scratch, and what it reads and writes. Bytes count
/// samples (pixels times channels).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::resample::cpu) struct StripLayout {
    /// The first input pixel any output reads (bounds less the pass's shift).
    first: usize,
    /// Input bytes per row read, from `first` on.
    in_bytes: usize,
    /// Output bytes per row (outputs times channels), before any spread to RGB.
    out_bytes: usize,
    /// Bytes of the transposed input strip.
    columns: usize,
    /// Bytes of the transposed output strip.
    sums: usize,
    /// Bytes of the strip's output rows when they are spread to RGB on the way out, else 0.
    rows: usize,
}

impl StripLayout {
    /// The layout of a horizontal pass over `channels`-sample pixels with `coefficients` (bounds
    /// less `shift`) writing pixels `out_step` bytes apart; `None` when the pass is not one this
    /// path takes (it then runs the portable pass): rows or outputs under 32 bytes, gray spread
    /// to RGB or neither.
    pub fn of(
        coefficients: &AxisCoefficients,
        channels: usize,
        shift: usize,
        out_step: usize,
    ) -> Option<StripLayout> {
        if !(channels == 3 && out_step == 3 || channels == 1 && (out_step == 1 || out_step == 3)) {
            return None;
        }
        let mut first = usize::MAX;
        let mut end = 0;
        for &(start, len) in coefficients.bounds.iter().filter(|b| b.1 > 0) {
            let start = (start as usize).checked_sub(shift)?;
            first = first.min(start);
            end = end.max(start + len as usize);
        }
        let in_bytes = end.checked_sub(first)? * channels;
        let out_bytes = coefficients.bounds.len() * channels;
        if in_bytes < 32 || out_bytes < 32 {
            return None;
        }
        Some(StripLayout {
            first,
            in_bytes,
            out_bytes,
            columns: STRIP * in_bytes,
            sums: STRIP * out_bytes,
            rows: if out_step != channels {
                STRIP * out_bytes
            } else {
                0
            },
        })
    }

    /// Scratch bytes the pass needs.
    pub fn bytes(&self) -> usize {
        self.columns + self.sums + self.rows
    }
}

/// The pass; `false` when it does not fit this path (its layout, or its input, output, weights
/// or scratch too short for the coefficients), and nothing was written.
///
/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn horizontal(pass: &mut HorizontalPass) -> bool {
    let c = pass.channels;
    let Some(layout) = StripLayout::of(pass.coefficients, c, pass.shift, pass.out_step) else {
        return false;
    };
    let SplitWeights {
        hi,
        lo,
        stride,
        bytes,
    } = pass.split;
    let bounds = &pass.coefficients.bounds;
    let written = layout.out_bytes / c * pass.out_step;
    let fits = *bytes
        && pass.rows > 0
        && pass.strips.len() >= layout.bytes()
        && bounds.len() * stride <= hi.len().min(lo.len())
        && bounds
            .iter()
            .all(|b| (b.1 as usize).next_multiple_of(2) <= *stride)
        && (pass.rows - 1)
            .checked_mul(pass.pitch)
            .and_then(|at| at.checked_add(layout.first * c + layout.in_bytes))
            .is_some_and(|end| end <= pass.input.len())
        && (pass.rows - 1)
            .checked_mul(pass.out_pitch)
            .and_then(|at| at.checked_add(written))
            .is_some_and(|end| end <= pass.output.len());
    if !fits {
        return false;
    }
    // Bounds count from the pass's input less its shift; the strip from `layout.first` on.
    let origin = pass.shift + layout.first;
    let (columns, rest) = pass.strips.split_at_mut(layout.columns);
    let (sums, rows) = rest.split_at_mut(layout.sums);
    let (columns, sums) = (columns.as_mut_ptr(), sums.as_mut_ptr());
    let input = pass.input.as_ptr().wrapping_add(layout.first * c);
    let output = pass.output.as_mut_ptr();
    let filter = Filter {
        columns,
        sums,
        vector: STRIP * c,
        origin,
        hi: hi.as_ptr(),
        lo: lo.as_ptr(),
        stride: *stride,
    };
    // The byte columns an output's taps read up to (none without taps).
    let reach = |&(start, len): &(u32, u32)| {
        if len == 0 {
            0
        } else {
            (start as usize - origin + len as usize) * c
        }
    };
    let spread = pass.out_step != c;
    let mut r0 = 0;
    while r0 < pass.rows {
        let strip_rows = (pass.rows - r0).min(STRIP);
        let row_at: [*const u8; STRIP] =
            std::array::from_fn(|i| input.wrapping_add((r0 + i.min(strip_rows - 1)) * pass.pitch));
        let dest: [*mut u8; STRIP] = std::array::from_fn(|i| {
            if spread {
                rows.as_mut_ptr().wrapping_add(i * layout.out_bytes)
            } else {
                output.wrapping_add((r0 + i) * pass.out_pitch)
            }
        });
        // Block by block of 32 byte columns: transpose in, filter every output whose taps are
        // in, transpose back every 32 output bytes filtered, while all of them are in cache.
        let mut next = 0;
        let mut flushed = 0;
        let mut at = 0;
        // SAFETY (throughout): rows below `pass.rows` hold `layout.in_bytes` bytes from `input`
        // on and `written` output bytes (checked above; the last strip's missing rows repeat
        // its last row, and are not written back); the strip buffers are the layout's sizes;
        // every output's taps lie in `[origin, origin + in_bytes / c)` (the layout's span) and
        // its pairs of weights inside its padded row of `stride` (checked above).
        unsafe {
            loop {
                let block = at.min(layout.in_bytes - 32);
                transpose_in(&row_at, block, columns);
                while next < bounds.len() && reach(&bounds[next]) <= block + 32 {
                    filter.output(next, bounds[next]);
                    next += 1;
                }
                while flushed + 32 <= next * c {
                    transpose_out(sums, flushed, &dest, strip_rows);
                    flushed += 32;
                }
                if block + 32 >= layout.in_bytes {
                    break;
                }
                at += 32;
            }
            for (j, &b) in bounds.iter().enumerate().skip(next) {
                filter.output(j, b);
            }
            while flushed < layout.out_bytes {
                // The last block overlaps the one before: the same bytes written again.
                transpose_out(sums, flushed.min(layout.out_bytes - 32), &dest, strip_rows);
                flushed += 32;
            }
            if spread {
                for (i, &row) in dest.iter().enumerate().take(strip_rows) {
                    spread_gray(row, layout.out_bytes, output.add((r0 + i) * pass.out_pitch));
                }
            }
        }
        r0 += STRIP;
    }
    true
}

/// Filters outputs of a strip: the transposed input at `columns` (byte column x at
/// `STRIP * x`, its pixels' vectors `vector` bytes apart), the sums to `sums` (output j's vector
/// at `vector * j`).
struct Filter {
    columns: *mut u8,
    sums: *mut u8,
    vector: usize,
    /// The input pixel at `columns`.
    origin: usize,
    hi: *const i8,
    lo: *const i16,
    stride: usize,
}

impl Filter {
    /// Output j, whose bounds are `(start, len)`.
    ///
    /// # Safety
    /// AVX2; the output's taps are transposed, its sums inside `sums`, its weights inside the
    /// pass's.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn output(&self, j: usize, (start, len): (u32, u32)) {
        let len = len as usize;
        // SAFETY: as the caller promises.
        unsafe {
            let from = if len == 0 {
                self.columns
            } else {
                self.columns
                    .add(self.vector * (start as usize - self.origin))
            };
            let to = self.sums.add(self.vector * j);
            let (wh, wl) = (self.hi.add(j * self.stride), self.lo.add(j * self.stride));
            for x in (0..self.vector).step_by(32) {
                let v = sum32(from.add(x), self.vector, len, wh, wl);
                _mm256_storeu_si256(to.add(x) as *mut __m256i, v);
            }
        }
    }
}

/// Transposes byte columns `at..at + 32` of the 32 rows at `rows` into `columns`: byte column
/// x's 32 samples at `32 * x`.
///
/// # Safety
/// AVX2; each row has `at + 32` bytes; `columns` has room for `32 * (at + 32)`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn transpose_in(rows: &[*const u8; STRIP], at: usize, columns: *mut u8) {
    // Rows 8q..8q + 8 of the 32 columns as columns of eight (lane 0: the first 16 columns),
    // gathered by column pair: `pairs[k][q]` holds columns 2k and 2k + 1 of rows 8q...
    let mut pairs = [[_mm256_setzero_si256(); 4]; 8];
    for q in 0..4 {
        let mut block = [_mm256_setzero_si256(); 8];
        for (i, row) in block.iter_mut().enumerate() {
            // SAFETY: as the caller promises.
            *row = unsafe { _mm256_loadu_si256(rows[8 * q + i].add(at) as *const __m256i) };
        }
        for (pair, columns) in pairs.iter_mut().zip(rows_to_columns(block)) {
            pair[q] = columns;
        }
    }
    for (k, [q0, q1, q2, q3]) in pairs.into_iter().enumerate() {
        // Columns 2k and 2k + 1 (16 + 2k and 17 + 2k in lane 1), rows 0..16 and 16..32.
        let even_top = _mm256_unpacklo_epi64(q0, q1);
        let odd_top = _mm256_unpackhi_epi64(q0, q1);
        let even_bottom = _mm256_unpacklo_epi64(q2, q3);
        let odd_bottom = _mm256_unpackhi_epi64(q2, q3);
        // SAFETY: columns `at + 2k`, `at + 2k + 1` and 16 on lie below `at + 32`.
        unsafe {
            let to = columns.add(STRIP * (at + 2 * k));
            let store =
                |at: usize, v: __m256i| _mm256_storeu_si256(to.add(STRIP * at) as *mut __m256i, v);
            store(0, _mm256_permute2x128_si256::<0x20>(even_top, even_bottom));
            store(1, _mm256_permute2x128_si256::<0x20>(odd_top, odd_bottom));
            store(16, _mm256_permute2x128_si256::<0x31>(even_top, even_bottom));
            store(17, _mm256_permute2x128_si256::<0x31>(odd_top, odd_bottom));
        }
    }
}

/// Transposes byte columns `at..at + 32` of `columns` (column x's 32 rows at `32 * x`) back
/// into rows: row i's 32 bytes at `dest[i] + at`, for the first `rows` rows.
///
/// # Safety
/// AVX2; `columns` has `32 * (at + 32)` bytes; `dest[i]` has room for `at + 32` for `i < rows`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn transpose_out(columns: *const u8, at: usize, dest: &[*mut u8; STRIP], rows: usize) {
    // `eights[q]`: the 32 columns of rows 8q.., as columns of eight (lane 0: the first 16), two
    // columns a register.
    let mut eights = [[_mm256_setzero_si256(); 8]; 4];
    for k in 0..8 {
        // SAFETY: columns `at .. at + 32` are inside `columns`.
        let (even, odd, even16, odd16) = unsafe {
            let from = columns.add(STRIP * (at + 2 * k));
            let load = |c: usize| _mm256_loadu_si256(from.add(STRIP * c) as *const __m256i);
            (load(0), load(1), load(16), load(17))
        };
        // Columns 2k (lane 0) and 16 + 2k (lane 1), rows 0..16, then 16..32; the same of the
        // odd columns.
        let even_top = _mm256_permute2x128_si256::<0x20>(even, even16);
        let even_bottom = _mm256_permute2x128_si256::<0x31>(even, even16);
        let odd_top = _mm256_permute2x128_si256::<0x20>(odd, odd16);
        let odd_bottom = _mm256_permute2x128_si256::<0x31>(odd, odd16);
        let quarters = [
            _mm256_unpacklo_epi64(even_top, odd_top),
            _mm256_unpackhi_epi64(even_top, odd_top),
            _mm256_unpacklo_epi64(even_bottom, odd_bottom),
            _mm256_unpackhi_epi64(even_bottom, odd_bottom),
        ];
        for (eight, quarter) in eights.iter_mut().zip(quarters) {
            eight[k] = quarter;
        }
    }
    for (q, eight) in eights.into_iter().enumerate() {
        for (i, v) in columns_to_rows(eight).into_iter().enumerate() {
            if 8 * q + i < rows {
                // SAFETY: as the caller promises.
                unsafe { _mm256_storeu_si256(dest[8 * q + i].add(at) as *mut __m256i, v) };
            }
        }
    }
}
