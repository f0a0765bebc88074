//! The passes with AVX2, bit-identical to the portable ones.
//!
//! Pillow's weights have 22 fraction bits and do not fit the 16-bit multiplies that make
//! Pillow-SIMD fast (Pillow-SIMD rounds them to fewer bits, and so differs from Pillow). Here each
//! weight is split into two 16-bit halves ([`super::SplitWeights`]: `w = hi * 65536 + lo`) and every
//! `madd` is done twice, once per half: `sum(s * w) = (sum(s * hi) << 16) + sum(s * lo)` in
//! wrapping `i32` arithmetic, which is Pillow's sum exactly (modulo 2^32, like Pillow's own).
//!
//! Both passes sum vectors of samples that share their weights, two taps per `madd` (the two
//! taps' samples interleaved as 16-bit pairs), the rounding half in the sums' start:
//!
//! - vertical ([`vertical`]): an output row from its input rows, 32 bytes at a time;
//! - horizontal ([`horizontal`]): eight rows at a time, transposed so that the eight rows'
//!   samples of a pixel are one vector ([`transpose`]), then filtered as the vertical pass
//!   filters rows, and transposed back.
//!
//! Either pass falls back to the portable one for a pass it does not take (rows shorter than a
//! vector, or buffers that do not hold what the coefficients say).

mod horizontal;
mod transpose;
mod vertical;

use std::arch::x86_64::*;

use super::super::coefficients::PRECISION_BITS;
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

/// The pair of 16-bit weights `(w[k], w[k + 1])` at `at`, broadcast to every 32-bit lane.
///
/// # Safety
/// `at + 1 < weights.len()`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn pair(weights: &[i16], at: usize) -> __m256i {
    debug_assert!(at + 1 < weights.len());
    // SAFETY: the caller keeps `at + 1` inside `weights`; unaligned read of two i16s.
    _mm256_set1_epi32(unsafe { std::ptr::read_unaligned(weights.as_ptr().add(at) as *const i32) })
}

/// Eight sums given as their two halves, the rounding half already in `lo`, shifted down:
/// `((hi << 16) + lo) >> 22` as `i32`s (the clamp follows in the saturating packs).
#[inline]
#[target_feature(enable = "avx2")]
fn finish(hi: __m256i, lo: __m256i) -> __m256i {
    let sum = _mm256_add_epi32(_mm256_slli_epi32::<16>(hi), lo);
    _mm256_srai_epi32::<{ PRECISION_BITS as i32 }>(sum)
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
        _mm_setr_epi8(10, 11, 11, 11, 12, 12, 12, 13, 13, 13, 14, 14, 14, 15, 15, 15),
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
        unsafe { spread16(_mm_loadu_si128(src.add(at) as *const __m128i), dst.add(3 * at)) };
        if at + 16 >= n {
            break;
        }
        x += 16;
    }
}
