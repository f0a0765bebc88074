//! The passes with AVX2, bit-identical to the portable ones.
//!
//! Pillow's weights have 22 fraction bits and do not fit the 16-bit multiplies that make
//! Pillow-SIMD fast (Pillow-SIMD rounds them to fewer bits, and so differs from Pillow). Here each
//! weight is split ([`super::SplitWeights`]: `w = hi * 65536 + lo`, `hi` a signed byte, `lo` a
//! signed 16-bit half) and `sum(s * w) = (sum(s * hi) << 16) + sum(s * lo)` in wrapping `i32`
//! arithmetic, which is Pillow's sum exactly (modulo 2^32, like Pillow's own). The shift leaves
//! only `sum(s * hi)` modulo 2^16 in the result, so that sum is kept in wrapping 16-bit lanes and
//! taken by `maddubs` straight from the 8-bit samples; the `lo` products go through `madd` on the
//! samples widened to 16 bits ([`sum32`]).
//!
//! Both passes sum vectors of samples that share their weights, two taps a step (the two taps'
//! samples interleaved), the rounding half in the sums' start:
//!
//! - vertical ([`vertical`](fn@vertical)): an output row from its input rows, 32 bytes at a time;
//! - horizontal ([`horizontal`](fn@horizontal)): 32 rows at a time, transposed so that the rows'
//!   samples of a pixel are one vector ([`transpose`]), then filtered as the vertical pass filters
//!   rows, and transposed back.
//!
//! Either pass falls back to the portable one for a pass it does not take (rows or outputs
//! shorter than a vector, weights outside the byte multiplies' range, or buffers that do not hold
//! what the coefficients say).

mod horizontal;
#[cfg(test)]
mod tests;
mod transpose;
mod vertical;

use std::arch::x86_64::*;

use super::super::coefficients::{HALF, PRECISION_BITS};
use super::{portable, HorizontalPass, VerticalPass};

pub(super) use horizontal::StripLayout;

/// The horizontal pass (the caller checked that the CPU has AVX2).
pub(super) fn horizontal(pass: &mut HorizontalPass) {
    // SAFETY: `Kernels::Avx2` is only chosen after `is_x86_feature_detected!("avx2")`.
    if !unsafe { horizontal::horizontal(pass) } {
        portable::horizontal(pass);
    }
}

/// The vertical pass (the caller checked that the CPU has AVX2).
pub(super) fn vertical(pass: &mut VerticalPass) {
    // SAFETY: as for `horizontal`.
    if !unsafe { vertical::vertical(pass) } {
        portable::vertical(pass);
    }
}

/// The weights of taps `2 * pair` and `2 * pair + 1` from `hi` and `lo`: their `hi` bytes as one
/// 16-bit lane (for `maddubs`) and their `lo` halves as one 32-bit lane (for `madd`), each
/// broadcast to every lane.
///
/// # Safety
/// AVX2; `2 * pair + 2` weights at each pointer.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn weights(hi: *const i8, lo: *const i16, pair: usize) -> (__m256i, __m256i) {
    // SAFETY: as the caller promises; unaligned reads of two weights each.
    unsafe {
        (
            _mm256_set1_epi16(std::ptr::read_unaligned((hi as *const i16).add(pair))),
            _mm256_set1_epi32(std::ptr::read_unaligned((lo as *const i32).add(pair))),
        )
    }
}

/// Sixteen sums from their parts, shifted down to `i16`s (the clamp to bytes follows in the
/// saturating pack): `hi`, the 16-bit sums of the `hi` products (their value modulo 2^16), and
/// `lo_a`, `lo_b`, the 32-bit sums of the `lo` products with the rounding half, of the same
/// samples in the same lane order as `packs` makes of them (`lo_a`'s four of a lane, then
/// `lo_b`'s).
///
/// The sum is `hi * 2^16 + lo` modulo 2^32, and its bits from 22 up are those of
/// `(hi + (lo >> 16)) >> 6` in wrapping 16-bit arithmetic: the low 16 bits of `lo` only carry
/// into bits the shift drops, and `lo >> 16` fits 16 bits (so `packs` does not saturate it).
#[inline]
#[target_feature(enable = "avx2")]
fn finish(hi: __m256i, lo_a: __m256i, lo_b: __m256i) -> __m256i {
    const SHIFT: i32 = PRECISION_BITS as i32 - 16;
    let lo = _mm256_packs_epi32(_mm256_srai_epi32::<16>(lo_a), _mm256_srai_epi32::<16>(lo_b));
    _mm256_srai_epi16::<SHIFT>(_mm256_add_epi16(hi, lo))
}

/// The clipped sums of 32 samples over `len` rows: byte i is
/// `clip8(HALF + sum(rows[k * pitch + i] * w[k]))`, the weights of row k at `hi + k` and
/// `lo + k` ([`super::SplitWeights`], whose `bytes` hold), two rows a step: their bytes interleaved,
/// the pairs `maddubs`ed with the `hi` bytes into wrapping 16-bit sums and, widened, `madd`ed
/// with the `lo` halves into 32-bit ones (an odd count's last row is paired with itself, its
/// second weight zero).
///
/// # Safety
/// AVX2; the `len` rows at `pitch` apart from `rows` have 32 bytes each; `hi` and `lo` hold
/// `len` weights rounded up to even.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn sum32(
    rows: *const u8,
    pitch: usize,
    len: usize,
    hi: *const i8,
    lo: *const i16,
) -> __m256i {
    let zero = _mm256_setzero_si256();
    let half = _mm256_set1_epi32(HALF);
    let (mut h0, mut h1) = (zero, zero);
    let (mut l0, mut l1, mut l2, mut l3) = (half, half, half, half);
    let mut step = |a: *const u8, b: *const u8, pair: usize| {
        // SAFETY: as the caller promises, for the rows and weights `2 * pair` and
        // `2 * pair + 1`.
        let (a, b, (wh, wl)) = unsafe {
            (
                _mm256_loadu_si256(a as *const __m256i),
                _mm256_loadu_si256(b as *const __m256i),
                weights(hi, lo, pair),
            )
        };
        // Per lane, samples 0..8 and 8..16 of the lane, each beside its pair's next row.
        let i0 = _mm256_unpacklo_epi8(a, b);
        let i1 = _mm256_unpackhi_epi8(a, b);
        h0 = _mm256_add_epi16(h0, _mm256_maddubs_epi16(i0, wh));
        h1 = _mm256_add_epi16(h1, _mm256_maddubs_epi16(i1, wh));
        l0 = _mm256_add_epi32(l0, _mm256_madd_epi16(_mm256_unpacklo_epi8(i0, zero), wl));
        l1 = _mm256_add_epi32(l1, _mm256_madd_epi16(_mm256_unpackhi_epi8(i0, zero), wl));
        l2 = _mm256_add_epi32(l2, _mm256_madd_epi16(_mm256_unpacklo_epi8(i1, zero), wl));
        l3 = _mm256_add_epi32(l3, _mm256_madd_epi16(_mm256_unpackhi_epi8(i1, zero), wl));
    };
    let mut a = rows;
    for pair in 0..len / 2 {
        step(a, a.wrapping_add(pitch), pair);
        a = a.wrapping_add(2 * pitch);
    }
    if len % 2 == 1 {
        step(a, a, len / 2);
    }
    // Per lane, l0..l3 hold samples 0..4, 4..8, 8..12, 12..16, h0 samples 0..8 and h1 8..16:
    // the packs put them back in order.
    _mm256_packus_epi16(finish(h0, l0, l1), finish(h1, l2, l3))
}

/// [`sum32`] for 16 samples.
///
/// # Safety
/// As for [`sum32`], with 16 bytes a row.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn sum16(
    rows: *const u8,
    pitch: usize,
    len: usize,
    hi: *const i8,
    lo: *const i16,
) -> __m128i {
    let zero = _mm256_setzero_si256();
    let half = _mm256_set1_epi32(HALF);
    let mut h = zero;
    let (mut l0, mut l1) = (half, half);
    let mut step = |a: *const u8, b: *const u8, pair: usize| {
        // SAFETY: as the caller promises, for the rows and weights `2 * pair` and
        // `2 * pair + 1`.
        let (a, b, (wh, wl)) = unsafe {
            (
                _mm_loadu_si128(a as *const __m128i),
                _mm_loadu_si128(b as *const __m128i),
                weights(hi, lo, pair),
            )
        };
        // Samples 0..8 in lane 0, 8..16 in lane 1, each beside its pair's next row.
        let i = _mm256_set_m128i(_mm_unpackhi_epi8(a, b), _mm_unpacklo_epi8(a, b));
        h = _mm256_add_epi16(h, _mm256_maddubs_epi16(i, wh));
        l0 = _mm256_add_epi32(l0, _mm256_madd_epi16(_mm256_unpacklo_epi8(i, zero), wl));
        l1 = _mm256_add_epi32(l1, _mm256_madd_epi16(_mm256_unpackhi_epi8(i, zero), wl));
    };
    let mut a = rows;
    for pair in 0..len / 2 {
        step(a, a.wrapping_add(pitch), pair);
        a = a.wrapping_add(2 * pitch);
    }
    if len % 2 == 1 {
        step(a, a, len / 2);
    }
    let s = finish(h, l0, l1);
    _mm_packus_epi16(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s))
}

/// Writes the 16 gray samples of `v` as 16 RGB pixels (48 bytes) at `dst`.
///
/// # Safety
/// AVX2; `dst` has room for 48 bytes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn spread16(v: __m128i, dst: *mut u8) {
    let a = _mm_shuffle_epi8(
        v,
        _mm_setr_epi8(0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 5),
    );
    let b = _mm_shuffle_epi8(
        v,
        _mm_setr_epi8(5, 5, 6, 6, 6, 7, 7, 7, 8, 8, 8, 9, 9, 9, 10, 10),
    );
    let c = _mm_shuffle_epi8(
        v,
        _mm_setr_epi8(
            10, 11, 11, 11, 12, 12, 12, 13, 13, 13, 14, 14, 14, 15, 15, 15,
        ),
    );
    // SAFETY: as the caller promises.
    unsafe {
        _mm_storeu_si128(dst as *mut __m128i, a);
        _mm_storeu_si128(dst.add(16) as *mut __m128i, b);
        _mm_storeu_si128(dst.add(32) as *mut __m128i, c);
    }
}

/// Writes the `n` gray samples at `src` as `n` RGB pixels at `dst`.
///
/// # Safety
/// AVX2; `src` has `n` bytes, `dst` room for `3 * n`, and they do not overlap.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn spread_gray(src: *const u8, n: usize, dst: *mut u8) {
    if n < 16 {
        for i in 0..n {
            // SAFETY: `i < n`.
            unsafe {
                let v = *src.add(i);
                std::ptr::write_bytes(dst.add(3 * i), v, 3);
            }
        }
        return;
    }
    let mut x = 0;
    loop {
        // The last 16 overlap the ones before: the same bytes written again.
        let at = x.min(n - 16);
        // SAFETY: `at + 16 <= n`.
        unsafe {
            spread16(
                _mm_loadu_si128(src.add(at) as *const __m128i),
                dst.add(3 * at),
            )
        };
        if at + 16 >= n {
            break;
        }
        x += 16;
    }
}
