//! The views' colour calls with AVX2, bit-identical to the scalar arithmetic of
//! [`super::pillow`]: `F.adjust_hue` eight pixels a step ([`hue_step`]: `rgb_to_hsv` and
//! `HsvSteps::rgb`) and `ImagingBlend` 32 samples a step ([`blend_step`]). The same float and
//! double operations, each on eight (float) or four (double) lanes at once, every branch of a
//! pixel computed and the one it takes chosen by masks. IEEE division, conversion and rounding
//! give the same bits in a vector lane as in a scalar register, and the truncations here only
//! meet values inside 0..=255 (or a NaN or a grey pixel's, which the masks drop).

use std::arch::x86_64::*;

/// Pixels a hue step takes.
pub(super) const STEP: usize = 8;

/// Samples a blend step takes.
pub(super) const BLEND_STEP: usize = 32;

/// Whether this CPU runs [`hue_step`] and [`blend_step`].
pub(super) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
}

/// The hue of `STEP` packed RGB pixels shifted by `shift`: each pixel to HSV, `shift` added to
/// its hue byte (wrapping), back to RGB.
///
/// # Safety
/// AVX2 ([`available`]).
#[target_feature(enable = "avx2")]
pub(super) unsafe fn hue_step(pixels: &mut [u8; 3 * STEP], shift: u8) {
    let mut channels = [[0i32; STEP]; 3];
    for (i, px) in pixels.chunks_exact(3).enumerate() {
        for c in 0..3 {
            channels[c][i] = i32::from(px[c]);
        }
    }
    // SAFETY: unaligned loads of eight i32s each from arrays of eight.
    let [r, g, b] = channels.map(|c| unsafe { _mm256_loadu_si256(c.as_ptr().cast()) });
    let (h, s, v) = to_hsv(r, g, b);
    let h = _mm256_and_si256(
        _mm256_add_epi32(h, _mm256_set1_epi32(i32::from(shift))),
        _mm256_set1_epi32(255),
    );
    let rgb = to_rgb(h, s, v);
    let mut out = [[0i32; STEP]; 3];
    for (o, v) in out.iter_mut().zip(rgb) {
        // SAFETY: an unaligned store of eight i32s into an array of eight.
        unsafe { _mm256_storeu_si256(o.as_mut_ptr().cast(), v) };
    }
    for (i, px) in pixels.chunks_exact_mut(3).enumerate() {
        for c in 0..3 {
            px[c] = out[c][i] as u8;
        }
    }
}

/// Eight floats as two halves of four doubles.
#[inline]
#[target_feature(enable = "avx2")]
fn widen(v: __m256) -> [__m256d; 2] {
    [
        _mm256_cvtps_pd(_mm256_castps256_ps128(v)),
        _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(v)),
    ]
}

/// Two halves of four doubles rounded to eight floats.
#[inline]
#[target_feature(enable = "avx2")]
fn narrow([lo, hi]: [__m256d; 2]) -> __m256 {
    _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo))
}

/// `f(x)` on both halves.
#[inline]
#[target_feature(enable = "avx2")]
fn each(x: [__m256d; 2], f: impl Fn(__m256d) -> __m256d) -> [__m256d; 2] {
    [f(x[0]), f(x[1])]
}

/// Eight whole numbers as two halves of doubles.
#[inline]
#[target_feature(enable = "avx2")]
fn whole(v: __m256i) -> [__m256d; 2] {
    [
        _mm256_cvtepi32_pd(_mm256_castsi256_si128(v)),
        _mm256_cvtepi32_pd(_mm256_extracti128_si256::<1>(v)),
    ]
}

/// C's `(int)` of both halves (truncation), as eight integers.
#[inline]
#[target_feature(enable = "avx2")]
fn truncate([lo, hi]: [__m256d; 2]) -> __m256i {
    _mm256_set_m128i(_mm256_cvttpd_epi32(hi), _mm256_cvttpd_epi32(lo))
}

/// `(int)v` clamped to 0..=255.
#[inline]
#[target_feature(enable = "avx2")]
fn clip(v: [__m256d; 2]) -> __m256i {
    _mm256_min_epi32(
        _mm256_max_epi32(truncate(v), _mm256_setzero_si256()),
        _mm256_set1_epi32(255),
    )
}

/// `Convert.c`'s `rgb2hsv_row` of eight pixels (`rgb_to_hsv`).
#[inline]
#[target_feature(enable = "avx2")]
fn to_hsv(r: __m256i, g: __m256i, b: __m256i) -> (__m256i, __m256i, __m256i) {
    let maxc = _mm256_max_epi32(_mm256_max_epi32(r, g), b);
    let minc = _mm256_min_epi32(_mm256_min_epi32(r, g), b);
    let grey = _mm256_cmpeq_epi32(maxc, minc);
    let greyf = _mm256_castsi256_ps(grey);
    let one = _mm256_set1_ps(1.0);
    // A grey pixel divides by 1s: its values are not kept.
    let cr = _mm256_blendv_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(maxc, minc)), one, greyf);
    let s = _mm256_div_ps(cr, _mm256_blendv_ps(_mm256_cvtepi32_ps(maxc), one, greyf));
    let part = |c: __m256i| _mm256_div_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(maxc, c)), cr);
    let (rc, gc, bc) = (part(r), part(g), part(b));
    let from_r = _mm256_sub_ps(bc, gc);
    let (rd, gd, bd) = (widen(rc), widen(gc), widen(bc));
    let two = _mm256_set1_pd(2.0);
    let four = _mm256_set1_pd(4.0);
    let from_g = narrow([0, 1].map(|i| _mm256_sub_pd(_mm256_add_pd(two, rd[i]), bd[i])));
    let from_b = narrow([0, 1].map(|i| _mm256_sub_pd(_mm256_add_pd(four, gd[i]), rd[i])));
    let is_r = _mm256_castsi256_ps(_mm256_cmpeq_epi32(r, maxc));
    let is_g = _mm256_castsi256_ps(_mm256_cmpeq_epi32(g, maxc));
    let h = _mm256_blendv_ps(_mm256_blendv_ps(from_b, from_g, is_g), from_r, is_r);
    // `fmod(h / 6.0 + 1.0, 1.0)`: `h / 6 + 1` lies in [5/6, 11/6], where it is `x - 1` from 1 on.
    let x = each(widen(h), |h| {
        let x = _mm256_add_pd(_mm256_div_pd(h, _mm256_set1_pd(6.0)), _mm256_set1_pd(1.0));
        let over = _mm256_cmp_pd::<_CMP_GE_OQ>(x, _mm256_set1_pd(1.0));
        _mm256_sub_pd(x, _mm256_and_pd(over, _mm256_set1_pd(1.0)))
    });
    let scale = |v: [__m256d; 2]| each(v, |v| _mm256_mul_pd(v, _mm256_set1_pd(255.0)));
    let hue = clip(scale(widen(narrow(x))));
    let sat = clip(scale(widen(s)));
    (
        _mm256_andnot_si256(grey, hue),
        _mm256_andnot_si256(grey, sat),
        maxc,
    )
}

/// C's `round` (halves away from zero) of four doubles at least 0 clipped to 0..=255, as
/// `round_clip` takes it: the truncation, plus one where the remainder is a half or more; 0 for
/// values not above 0 (and NaNs), 255 from 255 on.
#[inline]
#[target_feature(enable = "avx2")]
fn round_clip(x: [__m256d; 2]) -> __m256i {
    let t = truncate(x);
    let whole_t = whole(t);
    // Where the remainder `x - trunc(x)` (exact) is a half or more: one more.
    let up = lanes(|i| {
        _mm256_cmp_pd::<_CMP_GE_OQ>(_mm256_sub_pd(x[i], whole_t[i]), _mm256_set1_pd(0.5))
    });
    let rounded = _mm256_sub_epi32(t, up);
    let positive = lanes(|i| _mm256_cmp_pd::<_CMP_GT_OQ>(x[i], _mm256_setzero_pd()));
    let top = lanes(|i| _mm256_cmp_pd::<_CMP_GE_OQ>(x[i], _mm256_set1_pd(255.0)));
    let rounded = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(255), top);
    _mm256_and_si256(rounded, positive)
}

/// The masks `test` gives for both halves, as eight 32-bit masks.
#[inline]
#[target_feature(enable = "avx2")]
fn lanes(test: impl Fn(usize) -> __m256d) -> __m256i {
    truncate_mask([test(0), test(1)])
}

/// Two halves of double masks (all ones or zeros) as eight 32-bit masks.
#[inline]
#[target_feature(enable = "avx2")]
fn truncate_mask([lo, hi]: [__m256d; 2]) -> __m256i {
    let pick = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    let lo = _mm256_permutevar8x32_epi32(_mm256_castpd_si256(lo), pick);
    let hi = _mm256_permutevar8x32_epi32(_mm256_castpd_si256(hi), pick);
    _mm256_permute2x128_si256::<0x20>(lo, hi)
}

/// `Convert.c`'s `hsv2rgb` of eight pixels (`HsvSteps::rgb`).
#[inline]
#[target_feature(enable = "avx2")]
fn to_rgb(h: __m256i, s: __m256i, v: __m256i) -> [__m256i; 3] {
    let hd = each(whole(h), |h| {
        _mm256_div_pd(_mm256_mul_pd(h, _mm256_set1_pd(6.0)), _mm256_set1_pd(255.0))
    });
    // The sector: the truncation of a value in 0..=6, its floor.
    let i = truncate(hd);
    let f = narrow([0, 1].map(|k| _mm256_sub_pd(hd[k], whole(i)[k])));
    let fs = narrow(each(whole(s), |s| _mm256_div_pd(s, _mm256_set1_pd(255.0))));
    let vf = whole(v);
    let (fsd, fd) = (widen(fs), widen(f));
    let one = _mm256_set1_pd(1.0);
    let p = round_clip([0, 1].map(|k| _mm256_mul_pd(vf[k], _mm256_sub_pd(one, fsd[k]))));
    let fsf = widen(_mm256_mul_ps(fs, f));
    let q = round_clip([0, 1].map(|k| _mm256_mul_pd(vf[k], _mm256_sub_pd(one, fsf[k]))));
    let t = round_clip([0, 1].map(|k| {
        let rest = _mm256_mul_pd(fsd[k], _mm256_sub_pd(one, fd[k]));
        _mm256_mul_pd(vf[k], _mm256_sub_pd(one, rest))
    }));
    // Sector 6 (a hue of 255) is sector 0.
    let sector = |n: i32| {
        let m = _mm256_cmpeq_epi32(i, _mm256_set1_epi32(n));
        if n == 0 {
            _mm256_or_si256(m, _mm256_cmpeq_epi32(i, _mm256_set1_epi32(6)))
        } else {
            m
        }
    };
    let masks = [0, 1, 2, 3, 4, 5].map(sector);
    let pick = |choices: [__m256i; 6]| {
        let mut out = _mm256_setzero_si256();
        for (m, c) in masks.iter().zip(choices) {
            out = _mm256_blendv_epi8(out, c, *m);
        }
        out
    };
    let grey = _mm256_cmpeq_epi32(s, _mm256_setzero_si256());
    [
        pick([v, q, p, p, t, v]),
        pick([t, v, v, q, p, p]),
        pick([p, p, t, v, v, q]),
    ]
    .map(|c| _mm256_blendv_epi8(c, v, grey))
}

/// `ImagingBlend(grey, sample, alpha)` of `BLEND_STEP` samples, each toward its own grey level
/// (`blend`): `grey + alpha * (sample - grey)` in float32 (the difference taken in integers),
/// clamped to 0..=255 (a NaN to 0), truncated.
///
/// # Safety
/// AVX2 ([`available`]).
#[target_feature(enable = "avx2")]
pub(super) unsafe fn blend_step(
    samples: &mut [u8; BLEND_STEP],
    greys: &[u8; BLEND_STEP],
    alpha: f32,
) {
    let alpha = _mm256_set1_ps(alpha);
    let top = _mm256_set1_ps(255.0);
    let mut out = [_mm256_setzero_si256(); BLEND_STEP / 8];
    for (i, o) in out.iter_mut().enumerate() {
        // SAFETY: unaligned loads of eight bytes at 8i < BLEND_STEP of each array.
        let (s, g) = unsafe {
            (
                _mm256_cvtepu8_epi32(_mm_loadl_epi64(samples.as_ptr().add(8 * i).cast())),
                _mm256_cvtepu8_epi32(_mm_loadl_epi64(greys.as_ptr().add(8 * i).cast())),
            )
        };
        let difference = _mm256_cvtepi32_ps(_mm256_sub_epi32(s, g));
        let t = _mm256_add_ps(_mm256_cvtepi32_ps(g), _mm256_mul_ps(alpha, difference));
        // `min(255, t)` keeps a NaN (its second operand), `max(NaN, 0)` gives 0.
        let clamped = _mm256_max_ps(_mm256_min_ps(top, t), _mm256_setzero_ps());
        *o = _mm256_cvttps_epi32(clamped);
    }
    // Four vectors of eight i32s in 0..=255 to 32 bytes in order: the packs work within 128-bit
    // lanes, the permute puts the quarters back in order.
    let words_lo = _mm256_packus_epi32(out[0], out[1]);
    let words_hi = _mm256_packus_epi32(out[2], out[3]);
    let bytes = _mm256_packus_epi16(words_lo, words_hi);
    let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    // SAFETY: an unaligned store of 32 bytes into an array of 32.
    unsafe { _mm256_storeu_si256(samples.as_mut_ptr().cast(), bytes) };
}
