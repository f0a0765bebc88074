//! The passes with AVX2, bit-identical to the portable ones.
//!
//! Pillow's weights have 22 fraction bits and do not fit the 16-bit multiplies that make
//! Pillow-SIMD fast (Pillow-SIMD rounds them to fewer bits, and so differs from Pillow). Here each
//! weight is split into two 16-bit halves ([`SplitWeights`]: `w = hi * 65536 + lo`) and every
//! `madd` is done twice, once per half: `sum(s * w) = (sum(s * hi) << 16) + sum(s * lo)` in
//! wrapping `i32` arithmetic, which is Pillow's sum exactly (modulo 2^32, like Pillow's own).
//!
//! - Vertical pass: 16 bytes of a row at a time, two taps per `madd` (the rows interleaved
//!   byte by byte), four accumulators; the tail of a row goes through the portable pass.
//! - Horizontal pass, RGB: four rows at a time (two per register, one per 128-bit lane), four
//!   taps per step, each output's weights broadcast once for the four rows: the
//!   12 bytes of four pixels shuffled into `[r0 r1 g0 g1 b0 b1 0 0]` and `[r2 r3 g2 g3 ...]`,
//!   each `madd`ed with a broadcast pair of weights. Gray: eight taps per step. Each output's
//!   weights are padded with zeros to the step, so a step may read up to three pixels (RGB) or
//!   seven samples (gray) past an output's taps, multiplied by zero; an output whose step would
//!   read past the input goes through the portable pass.

use std::arch::x86_64::*;

use super::super::coefficients::{clip8, HALF, PRECISION_BITS};
use super::portable;
use super::{HorizontalPass, SplitWeights, VerticalPass};

/// The horizontal pass (the caller checked that the CPU has AVX2).
pub(super) fn horizontal(pass: &mut HorizontalPass) {
    // SAFETY: `Kernels::Avx2` is only chosen after `is_x86_feature_detected!("avx2")`.
    unsafe {
        if pass.channels == 3 {
            horizontal_rgb(pass)
        } else {
            horizontal_gray(pass)
        }
    }
}

/// The vertical pass (the caller checked that the CPU has AVX2).
pub(super) fn vertical(pass: &mut VerticalPass) {
    // SAFETY: as for `horizontal`.
    unsafe { vertical_avx2(pass) }
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

/// `clip8` of eight sums given as their two halves: `(HALF + (hi << 16) + lo) >> 22`, as `i32`s
/// (the clamp follows in the saturating packs).
#[inline]
#[target_feature(enable = "avx2")]
fn combine(hi: __m256i, lo: __m256i) -> __m256i {
    let sum = _mm256_add_epi32(
        _mm256_add_epi32(_mm256_slli_epi32::<16>(hi), lo),
        _mm256_set1_epi32(HALF),
    );
    _mm256_srai_epi32::<{ PRECISION_BITS as i32 }>(sum)
}

/// Where output `j`'s taps start in a row (bytes) and how many steps of `step` taps they take.
#[inline]
fn taps_of(pass: &HorizontalPass, j: usize, step: usize) -> (usize, usize) {
    let (start, len) = pass.coefficients.bounds[j];
    let start = (start as usize).saturating_sub(pass.shift) * pass.channels;
    (start, (len as usize).div_ceil(step))
}

/// Bytes of pixels 0, 1 (and 2, 3) of four into 16-bit lanes, channel by channel, in pairs:
/// `[r0 r1 g0 g1 b0 b1 0 0]`; -1 makes a zero byte.
#[inline]
#[target_feature(enable = "avx2")]
fn rgb_shuffles() -> (__m256i, __m256i) {
    (
        _mm256_setr_epi8(
            0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1, 0, -1, 3, -1, 1, -1, 4, -1,
            2, -1, 5, -1, -1, -1, -1, -1,
        ),
        _mm256_setr_epi8(
            6, -1, 9, -1, 7, -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1, 6, -1, 9, -1, 7, -1, 10,
            -1, 8, -1, 11, -1, -1, -1, -1, -1,
        ),
    )
}

/// Four pixels of two rows from byte `off` of each (row `a` in the low lane).
///
/// # Safety
/// `a + off + 16` and `b + off + 16` are at most `input.len()`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load_two(input: &[u8], a: usize, b: usize, off: usize) -> __m256i {
    debug_assert!(a.max(b) + off + 16 <= input.len());
    // SAFETY: as the caller promises.
    unsafe {
        let pa = _mm_loadu_si128(input.as_ptr().add(a + off) as *const __m128i);
        let pb = _mm_loadu_si128(input.as_ptr().add(b + off) as *const __m128i);
        _mm256_set_m128i(pb, pa)
    }
}

/// The two rows' pixels of `acc_hi`/`acc_lo`, clipped: `[r g b _]` of each.
#[inline]
#[target_feature(enable = "avx2")]
fn finish_two(acc_hi: __m256i, acc_lo: __m256i) -> ([u8; 4], [u8; 4]) {
    let v = combine(acc_hi, acc_lo);
    let v = _mm256_packs_epi32(v, v);
    let v = _mm256_packus_epi16(v, v);
    (
        (_mm256_cvtsi256_si32(v) as u32).to_le_bytes(),
        (_mm_cvtsi128_si32(_mm256_extracti128_si256::<1>(v)) as u32).to_le_bytes(),
    )
}

/// Writes one RGB pixel at `at` of `out`.
#[inline]
fn put3(out: &mut [u8], at: usize, px: &[u8; 4]) {
    if let Some(dst) = out.get_mut(at..at + 3) {
        dst.copy_from_slice(&px[..3]);
    }
}

#[target_feature(enable = "avx2")]
unsafe fn horizontal_rgb(pass: &mut HorizontalPass) {
    let (low, high) = rgb_shuffles();
    let SplitWeights { hi, lo, stride } = pass.split;
    let stride = *stride;
    let input = pass.input;
    let bounds = &pass.coefficients.bounds;
    if bounds.len() * stride > hi.len() || bounds.len() * stride > lo.len() {
        portable::horizontal(pass);
        return;
    }
    // The furthest any output's loads reach past its row's start: rows up to `safe_rows` take
    // every load unchecked, the rest go through the portable pass.
    let reach = bounds
        .iter()
        .map(|&(start, len)| {
            let start = (start as usize).saturating_sub(pass.shift) * 3;
            start + 12 * (len as usize).div_ceil(4).saturating_sub(1) + 16
        })
        .max()
        .unwrap_or(0);
    let safe_rows = match input.len().checked_sub(reach) {
        Some(room) if pass.pitch > 0 => (room / pass.pitch + 1).min(pass.rows),
        Some(_) => pass.rows,
        None => 0,
    };
    let (pitch, out_pitch) = (pass.pitch, pass.out_pitch);
    let mut r = 0;
    while r + 4 <= safe_rows {
        let (a, b, c, d) = (r * pitch, (r + 1) * pitch, (r + 2) * pitch, (r + 3) * pitch);
        for (j, &(start, len)) in bounds.iter().enumerate() {
            let start = (start as usize).saturating_sub(pass.shift) * 3;
            let steps = (len as usize).div_ceil(4);
            let w = j * stride;
            let (mut h_ab, mut l_ab) = (_mm256_setzero_si256(), _mm256_setzero_si256());
            let (mut h_cd, mut l_cd) = (_mm256_setzero_si256(), _mm256_setzero_si256());
            for s in 0..steps {
                let off = start + 12 * s;
                // SAFETY: every row below `safe_rows` has `reach` bytes from its start inside
                // the input, and `off + 16 <= reach`; `w + 4 * s + 3 < w + stride <=
                // hi.len() == lo.len()` (weights padded to a multiple of 8, `4 * steps <=
                // stride`).
                let (ab, cd, h01, h23, l01, l23) = unsafe {
                    (
                        load_two(input, a, b, off),
                        load_two(input, c, d, off),
                        pair(hi, w + 4 * s),
                        pair(hi, w + 4 * s + 2),
                        pair(lo, w + 4 * s),
                        pair(lo, w + 4 * s + 2),
                    )
                };
                let (ab01, ab23) = (_mm256_shuffle_epi8(ab, low), _mm256_shuffle_epi8(ab, high));
                let (cd01, cd23) = (_mm256_shuffle_epi8(cd, low), _mm256_shuffle_epi8(cd, high));
                h_ab = _mm256_add_epi32(h_ab, _mm256_madd_epi16(ab01, h01));
                h_ab = _mm256_add_epi32(h_ab, _mm256_madd_epi16(ab23, h23));
                l_ab = _mm256_add_epi32(l_ab, _mm256_madd_epi16(ab01, l01));
                l_ab = _mm256_add_epi32(l_ab, _mm256_madd_epi16(ab23, l23));
                h_cd = _mm256_add_epi32(h_cd, _mm256_madd_epi16(cd01, h01));
                h_cd = _mm256_add_epi32(h_cd, _mm256_madd_epi16(cd23, h23));
                l_cd = _mm256_add_epi32(l_cd, _mm256_madd_epi16(cd01, l01));
                l_cd = _mm256_add_epi32(l_cd, _mm256_madd_epi16(cd23, l23));
            }
            let (pa, pb) = finish_two(h_ab, l_ab);
            let (pc, pd) = finish_two(h_cd, l_cd);
            let at = r * out_pitch + j * pass.out_step;
            put3(pass.output, at, &pa);
            put3(pass.output, at + out_pitch, &pb);
            put3(pass.output, at + 2 * out_pitch, &pc);
            put3(pass.output, at + 3 * out_pitch, &pd);
        }
        r += 4;
    }
    while r + 2 <= safe_rows {
        let (a, b) = (r * pitch, (r + 1) * pitch);
        for (j, &(start, len)) in bounds.iter().enumerate() {
            let start = (start as usize).saturating_sub(pass.shift) * 3;
            let w = j * stride;
            let (mut h, mut l) = (_mm256_setzero_si256(), _mm256_setzero_si256());
            for s in 0..(len as usize).div_ceil(4) {
                // SAFETY: as in the four-row loop.
                let (ab, h01, h23, l01, l23) = unsafe {
                    (
                        load_two(input, a, b, start + 12 * s),
                        pair(hi, w + 4 * s),
                        pair(hi, w + 4 * s + 2),
                        pair(lo, w + 4 * s),
                        pair(lo, w + 4 * s + 2),
                    )
                };
                let (p01, p23) = (_mm256_shuffle_epi8(ab, low), _mm256_shuffle_epi8(ab, high));
                h = _mm256_add_epi32(h, _mm256_madd_epi16(p01, h01));
                h = _mm256_add_epi32(h, _mm256_madd_epi16(p23, h23));
                l = _mm256_add_epi32(l, _mm256_madd_epi16(p01, l01));
                l = _mm256_add_epi32(l, _mm256_madd_epi16(p23, l23));
            }
            let (pa, pb) = finish_two(h, l);
            let at = r * out_pitch + j * pass.out_step;
            put3(pass.output, at, &pa);
            put3(pass.output, at + out_pitch, &pb);
        }
        r += 2;
    }
    portable::horizontal_rows(pass, r, pass.rows);
}

#[target_feature(enable = "avx2")]
unsafe fn horizontal_gray(pass: &mut HorizontalPass) {
    let SplitWeights { hi, lo, stride } = pass.split;
    let stride = *stride;
    let input = pass.input;
    let outputs = pass.coefficients.bounds.len();
    let mut r = 0;
    while r < pass.rows {
        let b_row = if r + 1 < pass.rows { r + 1 } else { r };
        let (a_at, b_at) = (r * pass.pitch, b_row * pass.pitch);
        for j in 0..outputs {
            let (start, steps) = taps_of(pass, j, 8);
            let reach = b_at + start + 8 * steps;
            if steps == 0 || reach > input.len() || (j + 1) * stride > hi.len() {
                for row in [r, b_row] {
                    let line = input.get(row * pass.pitch..).unwrap_or(&[]);
                    let px = portable::horizontal_pixel(pass, line, j);
                    let at = row * pass.out_pitch + j * pass.out_step;
                    portable::write_pixel(pass.output, at, &px[..1], pass.out_step);
                }
                continue;
            }
            let mut acc_hi = _mm256_setzero_si256();
            let mut acc_lo = _mm256_setzero_si256();
            let w = j * stride;
            for s in 0..steps {
                let off = start + 8 * s;
                // SAFETY: `b_at + off + 8 <= reach <= input.len()`, `a_at <= b_at`; the weights
                // `w + 8 * s .. + 8` lie inside output j's padded row of `stride`.
                let (samples, wh, wl) = unsafe {
                    let pa = _mm_loadl_epi64(input.as_ptr().add(a_at + off) as *const __m128i);
                    let pb = _mm_loadl_epi64(input.as_ptr().add(b_at + off) as *const __m128i);
                    let samples = _mm256_set_m128i(_mm_cvtepu8_epi16(pb), _mm_cvtepu8_epi16(pa));
                    let wh = _mm_loadu_si128(hi.as_ptr().add(w + 8 * s) as *const __m128i);
                    let wl = _mm_loadu_si128(lo.as_ptr().add(w + 8 * s) as *const __m128i);
                    (
                        samples,
                        _mm256_broadcastsi128_si256(wh),
                        _mm256_broadcastsi128_si256(wl),
                    )
                };
                acc_hi = _mm256_add_epi32(acc_hi, _mm256_madd_epi16(samples, wh));
                acc_lo = _mm256_add_epi32(acc_lo, _mm256_madd_epi16(samples, wl));
            }
            // Four partial sums a lane; the shift distributes over the wrapping adds.
            let t = _mm256_add_epi32(_mm256_slli_epi32::<16>(acc_hi), acc_lo);
            let t = _mm256_hadd_epi32(t, t);
            let t = _mm256_hadd_epi32(t, t);
            let a = clip8(HALF.wrapping_add(_mm256_cvtsi256_si32(t)));
            let b = clip8(HALF.wrapping_add(_mm_cvtsi128_si32(_mm256_extracti128_si256::<1>(t))));
            let at = r * pass.out_pitch + j * pass.out_step;
            portable::write_pixel(pass.output, at, &[a], pass.out_step);
            if b_row != r {
                let at = b_row * pass.out_pitch + j * pass.out_step;
                portable::write_pixel(pass.output, at, &[b], pass.out_step);
            }
        }
        r += 2;
    }
}

#[target_feature(enable = "avx2")]
unsafe fn vertical_avx2(pass: &mut VerticalPass) {
    let c = pass.coefficients;
    let SplitWeights { hi, lo, stride } = pass.split;
    let stride = *stride;
    // The rows read, `[first, end)` after the shift: every load below lies inside the input
    // when the last of them does.
    let (first, end) = c.span();
    let first = (first as usize).saturating_sub(pass.shift);
    let end = (end as usize).saturating_sub(pass.shift);
    let simd_bytes = pass.row_bytes / 16 * 16;
    let fits = end > first
        && (end - 1) * pass.pitch + pass.row_bytes <= pass.input.len()
        && c.bounds.len() * stride <= hi.len()
        && c.bounds.iter().all(|b| b.0 as usize >= pass.shift);
    if !fits || simd_bytes == 0 {
        portable::vertical(pass);
        return;
    }
    let input = pass.input.as_ptr();
    for j in 0..c.bounds.len() {
        let (start, len) = c.bounds[j];
        let (start, len) = (start as usize - pass.shift, len as usize);
        let w = j * stride;
        let mut x = 0;
        while x < simd_bytes {
            let (mut h0, mut l0) = (_mm256_setzero_si256(), _mm256_setzero_si256());
            let (mut h1, mut l1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
            let mut k = 0;
            while k < len {
                // The second row of the pair; past the taps its weight is zero, so any row
                // inside the input will do.
                let k1 = if k + 1 < len { k + 1 } else { k };
                // SAFETY: rows `start + k` and `start + k1` are below `end` (the taps of output
                // j lie in the span), `x + 16 <= row_bytes`, so both loads end inside the input
                // (checked above); `w + k + 1 < w + stride` (`k < len <= taps <= stride`, and
                // `stride` is even, so `k + 1 < stride` for even `k`).
                let (ra, rb, wh, wl) = unsafe {
                    (
                        _mm_loadu_si128(input.add((start + k) * pass.pitch + x) as *const __m128i),
                        _mm_loadu_si128(input.add((start + k1) * pass.pitch + x) as *const __m128i),
                        pair(hi, w + k),
                        pair(lo, w + k),
                    )
                };
                let e0 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(ra, rb));
                let e1 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(ra, rb));
                h0 = _mm256_add_epi32(h0, _mm256_madd_epi16(e0, wh));
                l0 = _mm256_add_epi32(l0, _mm256_madd_epi16(e0, wl));
                h1 = _mm256_add_epi32(h1, _mm256_madd_epi16(e1, wh));
                l1 = _mm256_add_epi32(l1, _mm256_madd_epi16(e1, wl));
                k += 2;
            }
            let s0 = combine(h0, l0);
            let s1 = combine(h1, l1);
            // packs interleaves the 128-bit lanes: put bytes 0..16 back in order.
            let packed = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(s0, s1));
            let bytes = _mm_packus_epi16(
                _mm256_castsi256_si128(packed),
                _mm256_extracti128_si256::<1>(packed),
            );
            let mut done = [0u8; 16];
            // SAFETY: `done` holds 16 bytes.
            unsafe { _mm_storeu_si128(done.as_mut_ptr() as *mut __m128i, bytes) };
            if pass.spread {
                portable::write_row_part(pass, j, x, &done);
            } else if let Some(dst) = pass
                .output
                .get_mut(j * pass.out_pitch + x..)
                .and_then(|row| row.get_mut(..16))
            {
                dst.copy_from_slice(&done);
            }
            x += 16;
        }
    }
    if simd_bytes < pass.row_bytes {
        portable::vertical_bytes(pass, simd_bytes, pass.row_bytes);
    }
}
