//! The vertical pass with AVX2: an output row is the weighted sum of its input rows
//! ([`super::sum32`]), 32 bytes at a time (16 at the end of a row, the last block overlapping the
//! one before), written straight into the output (gray spread to RGB by byte shuffles).

use std::arch::x86_64::*;

use super::super::{SplitWeights, VerticalPass};
use super::{spread16, sum16, sum32};

/// The pass; `false` when it does not fit this path (rows shorter than 16 bytes, weights outside
/// the byte multiplies' range, or input, output or weights too short for the coefficients), and
/// nothing was written.
///
/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn vertical(pass: &mut VerticalPass) -> bool {
    let c = pass.coefficients;
    let SplitWeights {
        hi,
        lo,
        stride,
        bytes: fit,
    } = pass.split;
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
    let fits = *fit
        && bytes >= 16
        && c.bounds.len() * stride <= hi.len().min(lo.len())
        && c.bounds
            .iter()
            .all(|b| (b.1 as usize).next_multiple_of(2) <= stride)
        && c.bounds
            .iter()
            .all(|b| b.1 == 0 || b.0 as usize >= pass.shift)
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
    for (j, &(start, len)) in c.bounds.iter().enumerate() {
        let len = len as usize;
        // Output j's first input row (any row when it has none), and its weights.
        let first = if len == 0 {
            0
        } else {
            start as usize - pass.shift
        };
        // SAFETY: the row `first` lies inside the input and output j's weights inside `hi` and
        // `lo` (checked above).
        let (input, wh, wl) = unsafe {
            (
                pass.input.as_ptr().add(first * pass.pitch),
                hi.as_ptr().add(j * stride),
                lo.as_ptr().add(j * stride),
            )
        };
        // SAFETY: output row j has `bytes * step` bytes inside the output (checked above).
        let out = unsafe { pass.output.as_mut_ptr().add(j * pass.out_pitch) };
        let mut x = 0;
        while x + 32 <= bytes {
            // SAFETY: output j's rows end at or before `last`, whose `bytes` bytes lie inside the
            // input; `x + 32 <= bytes`; the weights are inside output j's row (checked above).
            let v = unsafe { sum32(input.add(x), pass.pitch, len, wh, wl) };
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
                let v = unsafe { sum16(input.add(at16), pass.pitch, len, wh, wl) };
                // SAFETY: `at16 + 16 <= bytes` of output row j.
                unsafe { store16(v, out, at16, pass.spread) };
                at += 16;
            }
        }
    }
    true
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
