//! The horizontal pass with AVX2, eight rows at a time through their transpose.
//!
//! Output pixel j of a row reads the `len_j` pixels from `start_j` on with output j's weights,
//! the same for every row. A strip of eight rows is transposed ([`super::transpose`]) so that
//! each byte column's eight samples are contiguous: pixel p's samples for all eight rows and all
//! channels are then one vector of `8 * channels` bytes (`[channel][row]`), and output j of the
//! strip is the weighted sum of the consecutive vectors of its taps, as an output row of the
//! vertical pass is of its input rows: every lane used, each output's weights loaded once per
//! strip. The sums come out as columns too (`[output byte][row]`, written in order), and are
//! transposed back into the strip's eight output rows.
//!
//! Each tap is `sample * (hi << 16) + sample * lo` ([`super::SplitWeights`]): two taps' samples
//! interleaved as 16-bit pairs go through one `madd` per half.

use std::arch::x86_64::*;

use super::super::{HorizontalPass, SplitWeights};
use super::transpose::{columns_to_rows, rows_to_columns};
use super::{finish, pair, spread_gray};
use crate::resample::coefficients::{AxisCoefficients, HALF};

/// Rows per strip.
const STRIP: usize = 8;

/// Where a pass's strip buffers lie in its scratch, and what it reads and writes. Bytes count
/// in samples (pixels times channels).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::resample::cpu) struct StripLayout {
    /// The first input pixel any output reads (bounds less the pass's shift).
    first: usize,
    /// Input bytes per row read, from `first` on.
    in_bytes: usize,
    /// Output bytes per row (outputs times channels), before any spread to RGB.
    out_bytes: usize,
    /// Bytes of the transposed input strip (with the room the last taps' loads reach).
    columns: usize,
    /// Bytes of the transposed output strip.
    sums: usize,
    /// Bytes of the strip's output rows when they are spread to RGB on the way out, else 0.
    rows: usize,
}

impl StripLayout {
    /// The layout of a horizontal pass over `channels`-sample pixels with `coefficients` (bounds
    /// less `shift`) writing pixels `out_step` bytes apart; `None` when the pass is not one this
    /// path takes (it then runs the portable pass).
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
        if end == 0 {
            return None;
        }
        // The furthest tap vector any output's pairs read (a pair may run one tap past the
        // taps, multiplied by zero).
        let reach = coefficients
            .bounds
            .iter()
            .filter(|b| b.1 > 0)
            .map(|&(start, len)| start as usize - shift - first + (len as usize).next_multiple_of(2))
            .max()
            .unwrap_or(0);
        let in_bytes = (end - first) * channels;
        let out_bytes = coefficients.bounds.len() * channels;
        let spread = out_step != channels;
        Some(StripLayout {
            first,
            in_bytes,
            out_bytes,
            columns: STRIP * (reach * channels).max(in_bytes).max(32) + 32,
            sums: STRIP * out_bytes.max(32) + 32,
            rows: if spread {
                STRIP * out_bytes.max(32)
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

/// The pass (the caller checked that the CPU has AVX2); `false` when it does not fit this path
/// (its layout, its input, output or scratch too short for the coefficients), and nothing was
/// written.
///
/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn horizontal(pass: &mut HorizontalPass) -> bool {
    let c = pass.channels;
    let Some(layout) = StripLayout::of(pass.coefficients, c, pass.shift, pass.out_step) else {
        return false;
    };
    let SplitWeights { hi, lo, stride } = pass.split;
    let bounds = &pass.coefficients.bounds;
    let written = layout.out_bytes / c * pass.out_step;
    let fits = pass.rows > 0
        && pass.strips.len() >= layout.bytes()
        && bounds.len() * stride <= hi.len().min(lo.len())
        && bounds.iter().all(|b| (b.1 as usize).next_multiple_of(2) <= *stride)
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
    let input = pass.input.as_ptr().wrapping_add(layout.first * c);
    let output = pass.output.as_mut_ptr();
    let mut r0 = 0;
    while r0 < pass.rows {
        let strip_rows = (pass.rows - r0).min(STRIP);
        // SAFETY (all three): rows below `pass.rows` hold `layout.in_bytes` bytes from `input`
        // on (checked above), the strip buffers are the layout's sizes, and the weights of
        // every output's pairs lie inside its padded row of `stride` (checked above).
        unsafe {
            let row_at: [usize; STRIP] =
                std::array::from_fn(|i| (r0 + i.min(strip_rows - 1)) * pass.pitch);
            transpose_in(input, &row_at, layout.in_bytes, columns);
            if c == 3 {
                filter_rgb(bounds, origin, columns, sums, hi, lo, *stride);
            } else {
                filter_gray(bounds, origin, columns, sums, hi, lo, *stride);
            }
            if pass.out_step == c {
                let dest: [*mut u8; STRIP] =
                    std::array::from_fn(|i| output.wrapping_add((r0 + i) * pass.out_pitch));
                transpose_out(sums, layout.out_bytes, &dest, strip_rows);
            } else {
                let pitch = layout.out_bytes.max(32);
                let dest: [*mut u8; STRIP] =
                    std::array::from_fn(|i| rows.as_mut_ptr().wrapping_add(i * pitch));
                transpose_out(sums, layout.out_bytes, &dest, strip_rows);
                for i in 0..strip_rows {
                    spread_gray(
                        rows.as_ptr().add(i * pitch),
                        layout.out_bytes,
                        output.add((r0 + i) * pass.out_pitch),
                    );
                }
            }
        }
        r0 += STRIP;
    }
    true
}

/// Transposes `bytes` bytes of the eight rows at `input + row_at[i]` into `columns` (byte
/// column x at `8 * x`, row i at `+ i`).
///
/// # Safety
/// AVX2; each row has `bytes` bytes; `columns` holds `8 * max(bytes, 32)`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn transpose_in(input: *const u8, row_at: &[usize; STRIP], bytes: usize, columns: &mut [u8]) {
    debug_assert!(columns.len() >= STRIP * bytes.max(32));
    let out = columns.as_mut_ptr();
    if bytes < 32 {
        for x in 0..bytes {
            for (i, &at) in row_at.iter().enumerate() {
                // SAFETY: `x < bytes` inside row i; `8 * x + i < 8 * bytes`.
                unsafe { *out.add(STRIP * x + i) = *input.add(at + x) };
            }
        }
        return;
    }
    let mut x = 0;
    loop {
        // The last block overlaps the one before: the same bytes written again.
        let at = x.min(bytes - 32);
        // SAFETY: `at + 32 <= bytes`.
        let t = rows_to_columns(std::array::from_fn(|i| unsafe {
            _mm256_loadu_si256(input.add(row_at[i] + at) as *const __m256i)
        }));
        for k in (0..8).step_by(2) {
            let low = _mm256_permute2x128_si256::<0x20>(t[k], t[k + 1]);
            let high = _mm256_permute2x128_si256::<0x31>(t[k], t[k + 1]);
            // SAFETY: columns `at + 2k .. at + 2k + 4`, and 16 on, lie below `bytes`.
            unsafe {
                _mm256_storeu_si256(out.add(STRIP * (at + 2 * k)) as *mut __m256i, low);
                _mm256_storeu_si256(out.add(STRIP * (at + 16 + 2 * k)) as *mut __m256i, high);
            }
        }
        if at + 32 >= bytes {
            break;
        }
        x += 32;
    }
}

/// Transposes the `bytes` byte columns of `sums` (column x at `8 * x`) back into rows: row i at
/// `dest[i]`, for the first `rows` rows.
///
/// # Safety
/// AVX2; `sums` holds `8 * max(bytes, 32)` bytes; `dest[i]` has room for `bytes` bytes for
/// `i < rows`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn transpose_out(sums: &[u8], bytes: usize, dest: &[*mut u8; STRIP], rows: usize) {
    debug_assert!(sums.len() >= STRIP * bytes.max(32));
    let src = sums.as_ptr();
    if bytes < 32 {
        for (i, &row) in dest.iter().enumerate().take(rows) {
            for x in 0..bytes {
                // SAFETY: `x < bytes`.
                unsafe { *row.add(x) = *src.add(STRIP * x + i) };
            }
        }
        return;
    }
    let mut x = 0;
    loop {
        let at = x.min(bytes - 32);
        let mut columns = [_mm256_setzero_si256(); 8];
        for k in (0..8).step_by(2) {
            // SAFETY: columns `at .. at + 32` lie below `bytes`.
            let (low, high) = unsafe {
                (
                    _mm256_loadu_si256(src.add(STRIP * (at + 2 * k)) as *const __m256i),
                    _mm256_loadu_si256(src.add(STRIP * (at + 16 + 2 * k)) as *const __m256i),
                )
            };
            columns[k] = _mm256_permute2x128_si256::<0x20>(low, high);
            columns[k + 1] = _mm256_permute2x128_si256::<0x31>(low, high);
        }
        let t = columns_to_rows(columns);
        for (i, &row) in dest.iter().enumerate().take(rows) {
            // SAFETY: `at + 32 <= bytes`.
            unsafe { _mm256_storeu_si256(row.add(at) as *mut __m256i, t[i]) };
        }
        if at + 32 >= bytes {
            break;
        }
        x += 32;
    }
}

/// Every output of the strip, RGB: 24-byte vectors (three channels of eight rows). Output j
/// reads the columns of pixels `bounds[j].0 - origin ..`.
///
/// # Safety
/// AVX2; `columns` and `sums` are the sizes of the pass's [`StripLayout`], every output's taps
/// start at or after `origin`, and its pairs of weights lie inside its row of `stride`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn filter_rgb(
    bounds: &[(u32, u32)],
    origin: usize,
    columns: &[u8],
    sums: &mut [u8],
    hi: &[i16],
    lo: &[i16],
    stride: usize,
) {
    const V: usize = 3 * STRIP;
    let base = columns.as_ptr();
    let out = sums.as_mut_ptr();
    for (j, &(start, len)) in bounds.iter().enumerate() {
        let pairs = (len as usize).div_ceil(2);
        let taps = if pairs == 0 {
            base
        } else {
            base.wrapping_add(V * (start as usize - origin))
        };
        let w = j * stride;
        let (zero, half) = (_mm256_setzero_si256(), _mm256_set1_epi32(HALF));
        let (mut h0, mut h1, mut h2) = (zero, zero, zero);
        let (mut l0, mut l1, mut l2) = (half, half, half);
        for p in 0..pairs {
            // SAFETY: taps `2p` and `2p + 1` of output j lie inside the transposed strip
            // (`layout.columns` reaches every output's last pair); the weights `w + 2p,
            // w + 2p + 1` inside its row.
            unsafe {
                let a = taps.add(2 * V * p);
                let b = a.add(V);
                let wa = _mm256_cvtepu8_epi16(_mm_loadu_si128(a as *const __m128i));
                let wb = _mm256_cvtepu8_epi16(_mm_loadu_si128(b as *const __m128i));
                // Bytes 16..24: channel 2 of the eight rows, paired at once.
                let tail = _mm_unpacklo_epi8(
                    _mm_loadl_epi64(a.add(16) as *const __m128i),
                    _mm_loadl_epi64(b.add(16) as *const __m128i),
                );
                let p0 = _mm256_unpacklo_epi16(wa, wb);
                let p1 = _mm256_unpackhi_epi16(wa, wb);
                let p2 = _mm256_cvtepu8_epi16(tail);
                let wh = pair(hi, w + 2 * p);
                let wl = pair(lo, w + 2 * p);
                h0 = _mm256_add_epi32(h0, _mm256_madd_epi16(p0, wh));
                h1 = _mm256_add_epi32(h1, _mm256_madd_epi16(p1, wh));
                h2 = _mm256_add_epi32(h2, _mm256_madd_epi16(p2, wh));
                l0 = _mm256_add_epi32(l0, _mm256_madd_epi16(p0, wl));
                l1 = _mm256_add_epi32(l1, _mm256_madd_epi16(p1, wl));
                l2 = _mm256_add_epi32(l2, _mm256_madd_epi16(p2, wl));
            }
        }
        // p0 held bytes 0..4 and 8..12 of the vector, p1 bytes 4..8 and 12..16: `packs`
        // puts them back in order.
        let s01 = _mm256_packs_epi32(finish(h0, l0), finish(h1, l1));
        let s2 = finish(h2, l2);
        let s2 = _mm_packs_epi32(_mm256_castsi256_si128(s2), _mm256_extracti128_si256::<1>(s2));
        let b01 = _mm_packus_epi16(
            _mm256_castsi256_si128(s01),
            _mm256_extracti128_si256::<1>(s01),
        );
        let b2 = _mm_packus_epi16(s2, s2);
        // SAFETY: output j's 24 bytes lie inside `sums` (`8 * out_bytes` of them).
        unsafe {
            _mm_storeu_si128(out.add(V * j) as *mut __m128i, b01);
            _mm_storel_epi64(out.add(V * j + 16) as *mut __m128i, b2);
        }
    }
}

/// Every output of the strip, gray: 8-byte vectors, the two taps of a pair in one load.
///
/// # Safety
/// As for [`filter_rgb`].
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn filter_gray(
    bounds: &[(u32, u32)],
    origin: usize,
    columns: &[u8],
    sums: &mut [u8],
    hi: &[i16],
    lo: &[i16],
    stride: usize,
) {
    let base = columns.as_ptr();
    let out = sums.as_mut_ptr();
    for (j, &(start, len)) in bounds.iter().enumerate() {
        let pairs = (len as usize).div_ceil(2);
        let taps = if pairs == 0 {
            base
        } else {
            base.wrapping_add(STRIP * (start as usize - origin))
        };
        let w = j * stride;
        let (mut h, mut l) = (_mm256_setzero_si256(), _mm256_set1_epi32(HALF));
        for p in 0..pairs {
            // SAFETY: as in `filter_rgb`.
            unsafe {
                let v = _mm_loadu_si128(taps.add(2 * STRIP * p) as *const __m128i);
                let paired = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(v, _mm_srli_si128::<8>(v)));
                h = _mm256_add_epi32(h, _mm256_madd_epi16(paired, pair(hi, w + 2 * p)));
                l = _mm256_add_epi32(l, _mm256_madd_epi16(paired, pair(lo, w + 2 * p)));
            }
        }
        let s = finish(h, l);
        let s = _mm_packs_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
        // SAFETY: output j's 8 bytes lie inside `sums`.
        unsafe { _mm_storel_epi64(out.add(STRIP * j) as *mut __m128i, _mm_packus_epi16(s, s)) };
    }
}
