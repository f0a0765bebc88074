//! The normalize of packed RGB8 into planes (NCHW) with AVX2, FMA and F16C, bit-identical to the
//! table ([`super::NormalizeTable`]): each value is `fma(x, scale, bias)` in `f32` (one rounding,
//! as `f32::mul_add`), then rounded to nearest-even into `f16` by `vcvtps2ph` (as
//! `half::f16::from_f32`), or stored as it is.
//!
//! Sixteen pixels a step: three 16-byte loads, each channel's sixteen samples gathered by byte
//! shuffles and widened to `f32` eight at a time. The pixels after the last whole step are the
//! caller's (the table writes them).

use std::arch::x86_64::*;

use half::f16;

use super::PlaneAffine;

/// Pixels a step takes.
const STEP: usize = 16;

/// Per channel and per 16-byte load of a step's 48 bytes, the byte shuffle that moves the load's
/// samples of the channel to their places among its sixteen (-1 where the load has none).
const SHUFFLES: [[[i8; 16]; 3]; 3] = {
    let mut masks = [[[-1i8; 16]; 3]; 3];
    let mut c = 0;
    while c < 3 {
        let mut i = 0;
        while i < STEP {
            let at = 3 * i + c;
            masks[c][at / 16][i] = (at % 16) as i8;
            i += 1;
        }
        c += 1;
    }
    masks
};

/// An element type the steps write.
pub(super) trait Element: Sized {
    /// Writes sixteen values, `lo` then `hi`, from `out` on.
    ///
    /// # Safety
    /// AVX2, FMA and F16C ([`available`]); 16 values from `out` on are the caller's to write.
    unsafe fn store(out: *mut Self, lo: __m256, hi: __m256);
}

impl Element for f16 {
    #[inline]
    unsafe fn store(out: *mut f16, lo: __m256, hi: __m256) {
        // SAFETY: the caller's CPU features and 16 values (32 bytes) from `out` on.
        unsafe {
            let lo = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(lo);
            let hi = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(hi);
            let out = out.cast::<__m128i>();
            _mm_storeu_si128(out, lo);
            _mm_storeu_si128(out.add(1), hi);
        }
    }
}

impl Element for f32 {
    #[inline]
    unsafe fn store(out: *mut f32, lo: __m256, hi: __m256) {
        // SAFETY: the caller's CPU features and 16 values from `out` on.
        unsafe {
            _mm256_storeu_ps(out, lo);
            _mm256_storeu_ps(out.add(8), hi);
        }
    }
}

/// Whether this CPU runs the steps.
pub(super) fn available() -> bool {
    std::is_x86_feature_detected!("avx2")
        && std::is_x86_feature_detected!("fma")
        && std::is_x86_feature_detected!("f16c")
}

/// Writes the values of the whole steps of `pixels` into `planes`, plane `k` from source
/// channel `source[k]`: returns the pixels written, none where this CPU lacks the instructions
/// ([`available`]), a plane holds fewer values or a source channel is not 0, 1 or 2.
pub(super) fn planes<T: Element>(
    pixels: &[u8],
    planes: [&mut [T]; 3],
    source: [usize; 3],
    affine: &PlaneAffine,
) -> usize {
    match available() {
        // SAFETY: the CPU has the instructions.
        true => unsafe { steps(pixels, planes, source, affine) },
        false => 0,
    }
}

/// [`planes`] on a CPU with the instructions.
///
/// # Safety
/// [`available`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn steps<T: Element>(
    pixels: &[u8],
    planes: [&mut [T]; 3],
    source: [usize; 3],
    affine: &PlaneAffine,
) -> usize {
    let steps = pixels.len() / (3 * STEP);
    let shortest = planes.iter().map(|p| p.len()).min().unwrap_or(0);
    if shortest < steps * STEP || source.iter().any(|&c| c > 2) {
        return 0;
    }
    let scales = affine.scale.map(|s| _mm256_set1_ps(s));
    let biases = affine.bias.map(|b| _mm256_set1_ps(b));
    // SAFETY: each mask is 16 bytes, read unaligned.
    let masks = SHUFFLES.map(|m| m.map(|m| unsafe { _mm_loadu_si128(m.as_ptr().cast()) }));
    let outs = planes.map(|p| p.as_mut_ptr());
    for (step, bytes) in pixels.chunks_exact(3 * STEP).enumerate() {
        // SAFETY: `bytes` holds 48 bytes.
        let loads = [0, 16, 32].map(|at| unsafe { _mm_loadu_si128(bytes.as_ptr().add(at).cast()) });
        for plane in 0..3 {
            let m = &masks[source[plane]];
            let x = _mm_or_si128(
                _mm_or_si128(
                    _mm_shuffle_epi8(loads[0], m[0]),
                    _mm_shuffle_epi8(loads[1], m[1]),
                ),
                _mm_shuffle_epi8(loads[2], m[2]),
            );
            let value = |x: __m128i| {
                let x = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(x));
                _mm256_fmadd_ps(x, scales[plane], biases[plane])
            };
            let (lo, hi) = (value(x), value(_mm_unpackhi_epi64(x, x)));
            // SAFETY: the caller's CPU features; values `step * 16..step * 16 + 16` of the plane,
            // which holds every step's (checked above).
            unsafe { T::store(outs[plane].add(step * STEP), lo, hi) };
        }
    }
    steps * STEP
}
