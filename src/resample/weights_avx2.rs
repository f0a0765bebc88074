//! Pillow's weights of four outputs at once with AVX2, bit-identical to the scalar loop of
//! [`super::coefficients`] for the bilinear and bicubic filters (those of the presets and
//! torchvision's default): each lane is one output, so each output's taps are taken in order
//! and its sum stays a sum in tap order, as Pillow's. A tap's position, the filter's value (by
//! both of its pieces, a mask choosing the one the scalar branch takes, each piece the same
//! double operations in the same order), the division by the sum and the rounding to fixed
//! point are the scalar loop's operations, lane by lane. A lane past its output's taps adds
//! `+0.0`, which leaves the sum as it is (the sum starts at `+0.0` and so is never `-0.0`), and
//! writes the weight 0 the scalar loop leaves there. IEEE arithmetic gives the same bits in a
//! lane as in a scalar register; the truncations to `i32` meet only values well inside its range,
//! and four outputs with a value that is not finite are left to the scalar loop.

use std::arch::x86_64::*;

use super::coefficients::Convolution;
use super::coefficients::ONE;
use super::filter::Filter;

/// Whether this CPU computes `filter`'s weights here.
pub(super) fn takes(filter: Filter) -> bool {
    matches!(filter, Filter::Bilinear | Filter::Bicubic)
        && std::arch::is_x86_feature_detected!("avx2")
}

/// The weights of outputs `first..first + 4`: `rows` their four rows of `taps` weights (each
/// output's first `count` weights, zeros after them), `bounds` each one's first sample and
/// `count`. `values` is scratch of `4 * taps` doubles. `false`, with `rows` and `bounds` not to
/// be used, where a value is not finite or a buffer is too short: the scalar loop then computes
/// these outputs.
///
/// # Safety
/// AVX2, and `axis.rule.filter` one [`takes`].
#[target_feature(enable = "avx2")]
pub(super) unsafe fn four_outputs(
    axis: &Convolution,
    first: u32,
    values: &mut [f64],
    rows: &mut [i32],
    bounds: &mut [(u32, u32); 4],
) -> bool {
    let taps = axis.taps;
    if values.len() < 4 * taps || rows.len() < 4 * taps || taps > i32::MAX as usize {
        return false;
    }
    let half = _mm256_set1_pd(0.5);
    let (center, xmin, count) = tap_bounds(axis, first);
    let inv = _mm256_set1_pd(axis.rule.inv_filterscale);
    let mut ww = _mm256_setzero_pd();
    let mut finite = _mm256_setzero_pd();
    for (t, out) in values[..4 * taps].chunks_exact_mut(4).enumerate() {
        let t = _mm_set1_epi32(t as i32);
        // `(double)(x + xmin)`, then `(x - center + 0.5) * inv_filterscale`.
        let x = _mm256_cvtepi32_pd(_mm_add_epi32(xmin, t));
        let at = _mm256_mul_pd(_mm256_add_pd(_mm256_sub_pd(x, center), half), inv);
        let v = match axis.rule.filter {
            Filter::Bicubic => bicubic(at),
            _ => bilinear(at),
        };
        let inside = _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm_cmpgt_epi32(count, t)));
        let v = _mm256_and_pd(v, inside);
        // Infinite or NaN: `v - v` is NaN (else 0), which the unordered check below finds.
        finite = _mm256_or_pd(finite, _mm256_sub_pd(v, v));
        ww = _mm256_add_pd(ww, v);
        // SAFETY: an unaligned store of four doubles into a chunk of four.
        unsafe { _mm256_storeu_pd(out.as_mut_ptr(), v) };
    }
    if _mm256_movemask_pd(_mm256_cmp_pd::<_CMP_UNORD_Q>(finite, finite)) != 0 {
        return false;
    }
    // `if (ww != 0.0)`: divide those lanes.
    let divide = _mm256_cmp_pd::<_CMP_NEQ_UQ>(ww, _mm256_setzero_pd());
    let scale = _mm256_set1_pd(f64::from(ONE));
    let (rows, _) = rows.split_at_mut(4 * taps);
    for (t, v) in values[..4 * taps].chunks_exact(4).enumerate() {
        // SAFETY: an unaligned load of a chunk of four doubles.
        let v = unsafe { _mm256_loadu_pd(v.as_ptr()) };
        let w = _mm256_blendv_pd(v, _mm256_div_pd(v, ww), divide);
        // `normalize_coeffs_8bpc`: `(int)(-0.5 + w * ONE)` below zero, `(int)(0.5 + w * ONE)`
        // else.
        let scaled = _mm256_mul_pd(w, scale);
        let negative = _mm256_cmp_pd::<_CMP_LT_OQ>(w, _mm256_setzero_pd());
        let rounding = _mm256_blendv_pd(half, _mm256_set1_pd(-0.5), negative);
        let fixed = _mm256_cvttpd_epi32(_mm256_add_pd(rounding, scaled));
        let mut lanes = [0i32; 4];
        // SAFETY: an unaligned store of four i32s into an array of four.
        unsafe { _mm_storeu_si128(lanes.as_mut_ptr().cast(), fixed) };
        for (row, &w) in rows.chunks_exact_mut(taps).zip(&lanes) {
            row[t] = w;
        }
    }
    store_bounds(xmin, count, bounds);
    true
}

/// The taps of outputs `first..first + 4`: their centres (`in0 + (xx + 0.5) * scale`), first
/// samples (`(int)(center - support + 0.5)`, at least 0) and counts (up to `(int)(center +
/// support + 0.5)`, at most the image, at most `taps`), as the scalar loop computes them where
/// those values lie inside `i32` (the centres lie within the image).
#[inline]
#[target_feature(enable = "avx2")]
fn tap_bounds(axis: &Convolution, first: u32) -> (__m256d, __m128i, __m128i) {
    let half = _mm256_set1_pd(0.5);
    let xx = _mm256_add_pd(
        _mm256_set1_pd(f64::from(first)),
        _mm256_setr_pd(0.0, 1.0, 2.0, 3.0),
    );
    let center = _mm256_add_pd(
        _mm256_set1_pd(axis.rule.in0),
        _mm256_mul_pd(_mm256_add_pd(xx, half), _mm256_set1_pd(axis.rule.scale)),
    );
    let support = _mm256_set1_pd(axis.rule.support);
    let xmin = _mm_max_epi32(
        _mm256_cvttpd_epi32(_mm256_add_pd(_mm256_sub_pd(center, support), half)),
        _mm_setzero_si128(),
    );
    let xmax = _mm_min_epi32(
        _mm256_cvttpd_epi32(_mm256_add_pd(_mm256_add_pd(center, support), half)),
        _mm_set1_epi32(axis.rule.in_size),
    );
    let count = _mm_min_epi32(
        _mm_max_epi32(_mm_sub_epi32(xmax, xmin), _mm_setzero_si128()),
        _mm_set1_epi32(axis.taps as i32),
    );
    (center, xmin, count)
}

/// The bounds alone of outputs `first..first + 4` (each one's first sample and count), the
/// scalar loop's; `false`, with `bounds` not to be used, where a value truncated is not inside
/// `i32` (the scalar loop then computes them).
///
/// # Safety
/// AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn four_bounds(
    axis: &Convolution,
    first: u32,
    bounds: &mut [(u32, u32); 4],
) -> bool {
    if axis.taps > i32::MAX as usize {
        return false;
    }
    let (center, xmin, count) = tap_bounds(axis, first);
    // Both truncated values strictly inside i32 (and not NaN), as the scalar conversions need
    // to agree with the vector ones.
    let reach = _mm256_add_pd(
        _mm256_andnot_pd(_mm256_set1_pd(-0.0), center),
        _mm256_add_pd(_mm256_set1_pd(axis.rule.support), _mm256_set1_pd(0.5)),
    );
    let inside = _mm256_cmp_pd::<_CMP_LT_OQ>(reach, _mm256_set1_pd(2_147_483_647.0));
    if _mm256_movemask_pd(inside) != 0b1111 {
        return false;
    }
    store_bounds(xmin, count, bounds);
    true
}

/// Four outputs' first samples and counts into `bounds`.
#[inline]
#[target_feature(enable = "avx2")]
fn store_bounds(xmin: __m128i, count: __m128i, bounds: &mut [(u32, u32); 4]) {
    let (mut starts, mut counts) = ([0i32; 4], [0i32; 4]);
    // SAFETY: unaligned stores of four i32s into arrays of four.
    unsafe {
        _mm_storeu_si128(starts.as_mut_ptr().cast(), xmin);
        _mm_storeu_si128(counts.as_mut_ptr().cast(), count);
    }
    for ((b, &start), &count) in bounds.iter_mut().zip(&starts).zip(&counts) {
        *b = (start as u32, count as u32);
    }
}

/// `|x|` (the scalar filters negate a negative `x`: the same magnitude; at `-0.0` either gives
/// the same value).
#[inline]
#[target_feature(enable = "avx2")]
fn magnitude(x: __m256d) -> __m256d {
    _mm256_andnot_pd(_mm256_set1_pd(-0.0), x)
}

/// `bilinear_filter`: `1 - |x|` below 1, else 0.
#[inline]
#[target_feature(enable = "avx2")]
fn bilinear(x: __m256d) -> __m256d {
    let x = magnitude(x);
    let inside = _mm256_cmp_pd::<_CMP_LT_OQ>(x, _mm256_set1_pd(1.0));
    _mm256_and_pd(inside, _mm256_sub_pd(_mm256_set1_pd(1.0), x))
}

/// `bicubic_filter` (a = -0.5), of `x = |x|`: `((a + 2) x - (a + 3)) x x + 1` below 1,
/// `(((x - 5) x + 8) x - 4) a` below 2, else 0.
#[inline]
#[target_feature(enable = "avx2")]
fn bicubic(x: __m256d) -> __m256d {
    const A: f64 = -0.5;
    let x = magnitude(x);
    let c = _mm256_set1_pd;
    let near = _mm256_sub_pd(_mm256_mul_pd(c(A + 2.0), x), c(A + 3.0));
    let near = _mm256_add_pd(_mm256_mul_pd(_mm256_mul_pd(near, x), x), c(1.0));
    let far = _mm256_add_pd(_mm256_mul_pd(_mm256_sub_pd(x, c(5.0)), x), c(8.0));
    let far = _mm256_mul_pd(_mm256_sub_pd(_mm256_mul_pd(far, x), c(4.0)), c(A));
    let below_one = _mm256_cmp_pd::<_CMP_LT_OQ>(x, c(1.0));
    let below_two = _mm256_cmp_pd::<_CMP_LT_OQ>(x, c(2.0));
    _mm256_and_pd(below_two, _mm256_blendv_pd(far, near, below_one))
}
