//! The vertical pass with AVX2: an output row is the weighted sum of its input rows, 32 bytes at
//! a time (16 at the end of a row, the last block overlapping the one before), the weights of a
//! pair of rows broadcast to every lane: the two rows' samples widened to 16 bits and
//! interleaved, one `madd` per half of the weights ([`super::SplitWeights`]).

use std::arch::x86_64::*;

use super::super::{SplitWeights, VerticalPass};
use super::{finish, pair, spread16};
use crate::resample::coefficients::HALF;

/// The pass (the caller checked that the CPU has AVX2); `false` when it does not fit this path
/// (rows shorter than 16 bytes, or input, output or weights too short for the coefficients), and
/// nothing was written.
///
/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn vertical(pass: &mut VerticalPass) -> bool {
    let c = pass.coefficients;
    let SplitWeights { hi, lo, stride } = pass.split;
    let stride = *stride;
    let bytes = pass.row_bytes;
    let step = if pass.spread { 3 } else { 1 };
    // The last input row any output reads; a pair past an output's taps reads its last row
    // again, with weight zero.
    let last = c
        .bounds
        .iter()
        .filter(|b| b.1 > 0)
        .map(|&(start, len)| (start as usize + len as usize).checked_sub(pass.shift + 1))
        .try_fold(0, |m, end| end.map(|e| m.max(e)));
    let fits = bytes >= 16
        && c.bounds.len() * stride <= hi.len().min(lo.len())
        && c.bounds.iter().all(|b| (b.1 as usize).next_multiple_of(2) <= stride)
        && c.bounds.iter().all(|b| b.1 == 0 || b.0 as usize >= pass.shift)
        && last
            .and_then(|r| r.checked_mul(pass.pitch))
            .and_then(|at| at.checked_add(bytes))
            .is_some_and(|end| end <= pass.input.len())
        && c.bounds.len().checked_sub(1).is_some_and(|rows| {
            rows.checked_mul(pass.out_pitch)
                .and_then(|at| at.checked_add(bytes * step))
                .is_some_and(|end| end <= pass.output.len())
        });
    if !fits {
        return false;
    }
    let input = pass.input.as_ptr();
    for (j, &(start, len)) in c.bounds.iter().enumerate() {
        let rows = if len == 0 {
            0..0
        } else {
            start as usize - pass.shift..start as usize - pass.shift + len as usize
        };
        let weights = j * stride;
        // SAFETY: output row j has `bytes * step` bytes inside the output (checked above).
        let out = unsafe { pass.output.as_mut_ptr().add(j * pass.out_pitch) };
        let mut x = 0;
        while x + 32 <= bytes {
            // SAFETY: rows `rows` end at or before `last`, whose `bytes` bytes lie inside the
            // input; `x + 32 <= bytes`; the weights are inside output j's row (checked above).
            let v = unsafe { sum32(input, pass.pitch, x, rows.clone(), hi, lo, weights) };
            // SAFETY: `x + 32 <= bytes` of output row j.
            unsafe { store(v, out, x, pass.spread) };
            x += 32;
        }
        if x < bytes {
            // The rest of the row: 16 bytes, the last ones overlapping what is done.
            let mut at = x.min(bytes - 16);
            while at < bytes {
                let at16 = at.min(bytes - 16);
                // SAFETY: as above, with `at16 + 16 <= bytes`.
                let v = unsafe { sum16(input, pass.pitch, at16, rows.clone(), hi, lo, weights) };
                // SAFETY: `at16 + 16 <= bytes` of output row j.
                unsafe { store16(v, out, at16, pass.spread) };
                at += 16;
            }
        }
    }
    true
}

/// Bytes `x..x + 32` of the output row whose taps are input rows `rows`, clipped.
///
/// # Safety
/// AVX2; rows `rows` (at `pitch` apart from `input`) have `x + 32` bytes; the weights at `w..`
/// cover `rows.len()` rounded up to even.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn sum32(
    input: *const u8,
    pitch: usize,
    x: usize,
    rows: std::ops::Range<usize>,
    hi: &[i16],
    lo: &[i16],
    w: usize,
) -> __m256i {
    let (zero, half) = (_mm256_setzero_si256(), _mm256_set1_epi32(HALF));
    let (mut h0, mut h1, mut h2, mut h3) = (zero, zero, zero, zero);
    let (mut l0, mut l1, mut l2, mut l3) = (half, half, half, half);
    let mut k = rows.start;
    while k < rows.end {
        let k1 = if k + 1 < rows.end { k + 1 } else { k };
        // SAFETY: as the caller promises.
        let (a0, a1, b0, b1, wh, wl) = unsafe {
            let a = input.add(k * pitch + x);
            let b = input.add(k1 * pitch + x);
            (
                _mm256_cvtepu8_epi16(_mm_loadu_si128(a as *const __m128i)),
                _mm256_cvtepu8_epi16(_mm_loadu_si128(a.add(16) as *const __m128i)),
                _mm256_cvtepu8_epi16(_mm_loadu_si128(b as *const __m128i)),
                _mm256_cvtepu8_epi16(_mm_loadu_si128(b.add(16) as *const __m128i)),
                pair(hi, w + k - rows.start),
                pair(lo, w + k - rows.start),
            )
        };
        let (p0, p1) = (_mm256_unpacklo_epi16(a0, b0), _mm256_unpackhi_epi16(a0, b0));
        let (p2, p3) = (_mm256_unpacklo_epi16(a1, b1), _mm256_unpackhi_epi16(a1, b1));
        h0 = _mm256_add_epi32(h0, _mm256_madd_epi16(p0, wh));
        h1 = _mm256_add_epi32(h1, _mm256_madd_epi16(p1, wh));
        h2 = _mm256_add_epi32(h2, _mm256_madd_epi16(p2, wh));
        h3 = _mm256_add_epi32(h3, _mm256_madd_epi16(p3, wh));
        l0 = _mm256_add_epi32(l0, _mm256_madd_epi16(p0, wl));
        l1 = _mm256_add_epi32(l1, _mm256_madd_epi16(p1, wl));
        l2 = _mm256_add_epi32(l2, _mm256_madd_epi16(p2, wl));
        l3 = _mm256_add_epi32(l3, _mm256_madd_epi16(p3, wl));
        k += 2;
    }
    // The unpacks split each 16 samples as 0..4, 8..12 (lo) and 4..8, 12..16 (hi): `packs`
    // restores the order within each 16, `packus` interleaves the two 16s' halves by lane.
    let s0 = _mm256_packs_epi32(finish(h0, l0), finish(h1, l1));
    let s1 = _mm256_packs_epi32(finish(h2, l2), finish(h3, l3));
    _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi16(s0, s1))
}

/// Bytes `x..x + 16` of the output row whose taps are input rows `rows`, clipped.
///
/// # Safety
/// As for [`sum32`], with `x + 16` bytes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn sum16(
    input: *const u8,
    pitch: usize,
    x: usize,
    rows: std::ops::Range<usize>,
    hi: &[i16],
    lo: &[i16],
    w: usize,
) -> __m128i {
    let (zero, half) = (_mm256_setzero_si256(), _mm256_set1_epi32(HALF));
    let (mut h0, mut h1) = (zero, zero);
    let (mut l0, mut l1) = (half, half);
    let mut k = rows.start;
    while k < rows.end {
        let k1 = if k + 1 < rows.end { k + 1 } else { k };
        // SAFETY: as the caller promises.
        let (a, b, wh, wl) = unsafe {
            (
                _mm256_cvtepu8_epi16(_mm_loadu_si128(input.add(k * pitch + x) as *const __m128i)),
                _mm256_cvtepu8_epi16(_mm_loadu_si128(input.add(k1 * pitch + x) as *const __m128i)),
                pair(hi, w + k - rows.start),
                pair(lo, w + k - rows.start),
            )
        };
        let (p0, p1) = (_mm256_unpacklo_epi16(a, b), _mm256_unpackhi_epi16(a, b));
        h0 = _mm256_add_epi32(h0, _mm256_madd_epi16(p0, wh));
        h1 = _mm256_add_epi32(h1, _mm256_madd_epi16(p1, wh));
        l0 = _mm256_add_epi32(l0, _mm256_madd_epi16(p0, wl));
        l1 = _mm256_add_epi32(l1, _mm256_madd_epi16(p1, wl));
        k += 2;
    }
    let s = _mm256_packs_epi32(finish(h0, l0), finish(h1, l1));
    _mm_packus_epi16(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s))
}

/// Writes 32 output bytes at byte `x` of the row at `out` (spread to RGB at `3 * x`).
///
/// # Safety
/// AVX2; the row has room for `x + 32` bytes (times three when `spread`).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn store(v: __m256i, out: *mut u8, x: usize, spread: bool) {
    // SAFETY: as the caller promises.
    unsafe {
        if spread {
            store16(_mm256_castsi256_si128(v), out, x, true);
            store16(_mm256_extracti128_si256::<1>(v), out, x + 16, true);
        } else {
            _mm256_storeu_si256(out.add(x) as *mut __m256i, v);
        }
    }
}

/// Writes 16 output bytes at byte `x` of the row at `out` (spread to RGB at `3 * x`).
///
/// # Safety
/// AVX2; the row has room for `x + 16` bytes (times three when `spread`).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn store16(v: __m128i, out: *mut u8, x: usize, spread: bool) {
    // SAFETY: as the caller promises.
    unsafe {
        if spread {
            spread16(v, out.add(3 * x));
        } else {
            _mm_storeu_si128(out.add(x) as *mut __m128i, v);
        }
    }
}
