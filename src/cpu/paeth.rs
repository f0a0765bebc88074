//! PNG's Paeth filter undone a pixel at a time in vector registers, for 3- and 4-byte pixels.
//!
//! Each pixel's prediction depends on the pixel reconstructed just before it, so a row is a
//! chain that no vector width shortens; what is left to shorten is the chain's length per
//! pixel. The predictor is rewritten so that everything taken from the row above (the bytes
//! above, `b`, and above left, `c`) is worked out off the chain, and only a few compares and
//! selects wait on the byte to the left, `a`:
//!
//! - the prediction is `a` unless `a` lies strictly between `b` and `3c - 2b` (there
//!   `|b - c| > |a - c|` or `|b - c| > |a + b - 2c|`);
//! - between them it is `c` where `a` lies strictly between `3c - 2b` and half of `3c - b`
//!   (rounded towards `b`), nearer `2c - b` than `c`; else `b`.
//!
//! So two compares against bounds known in advance, two selects, and the sum are all that wait
//! on `a`.
//!
//! That is the specification's choice on every input (the tests try all 2^24 of them). The
//! channels of a pixel travel side by side in 16-bit lanes.

/// Whether this processor runs [`paeth_rgb_row`] and [`paeth_rgba_row_in_place`].
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("sse4.1")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Undoes the Paeth filter on one row of 3-byte pixels: `filtered` holds the row's filtered
/// bytes, `previous` the row above as reconstructed, and `out` receives the reconstructed row,
/// all three of the same length, whole pixels.
///
/// # Panics
/// If the lengths differ or are not whole pixels, or where [`available`] is false.
#[cfg(target_arch = "x86_64")]
pub(crate) fn paeth_rgb_row(previous: &[u8], filtered: &[u8], out: &mut [u8]) {
    assert!(
        previous.len() == out.len() && filtered.len() == out.len() && out.len().is_multiple_of(3)
    );
    assert!(available());
    // SAFETY: SSE4.1 is present (checked above); the three slices are checked to hold the
    // same whole pixels, all that `paeth_row_sse41` reads and writes, and `out`, borrowed
    // mutably, overlaps neither of the others.
    unsafe {
        paeth_row_sse41::<3>(
            previous.as_ptr(),
            filtered.as_ptr(),
            out.as_mut_ptr(),
            out.len() / 3,
        )
    }
}

/// Undoes the Paeth filter on one row of 4-byte pixels in place: `row` holds the filtered
/// bytes and receives the reconstructed ones, `previous` the row above as reconstructed.
///
/// # Panics
/// If the lengths differ or are not whole pixels, or where [`available`] is false.
#[cfg(target_arch = "x86_64")]
pub(crate) fn paeth_rgba_row_in_place(previous: &[u8], row: &mut [u8]) {
    assert!(previous.len() == row.len() && row.len().is_multiple_of(4));
    assert!(available());
    let at = row.as_mut_ptr();
    // SAFETY: SSE4.1 is present (checked above); both slices are checked to hold the same
    // whole pixels, all that `paeth_row_sse41` reads and writes; with 4-byte pixels it reads
    // each pixel of the row before it writes that pixel and nothing after it.
    unsafe { paeth_row_sse41::<4>(previous.as_ptr(), at, at, row.len() / 4) }
}

/// [`paeth_rgb_row`] where the processor is not x86-64: never called ([`available`] is false).
#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn paeth_rgb_row(_previous: &[u8], _filtered: &[u8], _out: &mut [u8]) {
    unreachable!("the vector Paeth path runs on x86-64 only")
}

/// [`paeth_rgba_row_in_place`] where the processor is not x86-64: never called.
#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn paeth_rgba_row_in_place(_previous: &[u8], _row: &mut [u8]) {
    unreachable!("the vector Paeth path runs on x86-64 only")
}

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// One pixel's reconstruction: `x` (the filtered bytes) plus the prediction from `a` (left),
/// `b` (above) and `c` (above left), each a pixel's bytes in the low 16-bit lanes; the result in
/// the same lanes, modulo 256.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.1")]
fn reconstruct(a: __m128i, b: __m128i, c: __m128i, x: __m128i) -> __m128i {
    // Off the chain: the two intervals the row above decides. The prediction is `c` for `a`
    // strictly inside the inner one, `b` for `a` inside the outer one but not the inner one,
    // `a` elsewhere.
    let c3 = _mm_add_epi16(_mm_add_epi16(c, c), c);
    let far = _mm_sub_epi16(_mm_sub_epi16(c3, b), b); // 3c - 2b
    let middle = _mm_sub_epi16(c3, b); // 3c - b
    let (outer_low, outer_high) = (_mm_min_epi16(b, far), _mm_max_epi16(b, far));
    // Where b < c the inner interval runs from (3c - b) / 2 rounded down to 3c - 2b; where
    // b >= c from 3c - 2b to (3c - b) / 2 rounded up.
    let b_below_c = _mm_cmpgt_epi16(c, b);
    let half_down = _mm_srai_epi16(middle, 1);
    let half_up = _mm_srai_epi16(_mm_add_epi16(middle, _mm_set1_epi16(1)), 1);
    let inner_low = _mm_blendv_epi8(far, half_down, b_below_c);
    let inner_high = _mm_blendv_epi8(half_up, far, b_below_c);
    // The sums in bytes, so each wraps within its lane's low byte.
    let x_plus_b = _mm_add_epi8(x, b);
    let x_plus_c = _mm_add_epi8(x, c);
    // On the chain: where `a` lies.
    let x_plus_a = _mm_add_epi8(x, a);
    let outer = _mm_and_si128(
        _mm_cmpgt_epi16(a, outer_low),
        _mm_cmpgt_epi16(outer_high, a),
    );
    let inner = _mm_and_si128(
        _mm_cmpgt_epi16(a, inner_low),
        _mm_cmpgt_epi16(inner_high, a),
    );
    _mm_blendv_epi8(_mm_blendv_epi8(x_plus_a, x_plus_b, outer), x_plus_c, inner)
}

/// Four bytes at `p` widened to the low 16-bit lanes.
///
/// # Safety
/// `p` must be valid for reading four bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.1")]
unsafe fn load4(p: *const u8) -> __m128i {
    // SAFETY: the caller's guarantee.
    let word = unsafe { p.cast::<i32>().read_unaligned() };
    _mm_unpacklo_epi8(_mm_cvtsi32_si128(word), _mm_setzero_si128())
}

/// The Paeth rows' loop over `pixels` pixels of `BPP` bytes (3 or 4) at raw pointers.
///
/// # Safety
/// SSE4.1 must be present; `previous`, `filtered` and `out` must each be valid for
/// `pixels * BPP` bytes, `out` not overlapping `previous` and, where `BPP` is 3, not
/// `filtered` (with 4-byte pixels `out` may be `filtered`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.1")]
unsafe fn paeth_row_sse41<const BPP: usize>(
    previous: *const u8,
    filtered: *const u8,
    out: *mut u8,
    pixels: usize,
) {
    let zero = _mm_setzero_si128();
    let (mut a, mut c) = (zero, zero);
    // Four bytes are read and written a pixel: with 3-byte pixels, every pixel but the last,
    // whose fourth byte would lie past the row.
    let wide = if BPP == 4 {
        pixels
    } else {
        pixels.saturating_sub(1)
    };
    for i in 0..wide {
        // SAFETY: pixel `i` is not the last of a 3-byte row, so its four bytes lie within
        // the rows the caller vouches for.
        let (b, x) = unsafe { (load4(previous.add(i * BPP)), load4(filtered.add(i * BPP))) };
        a = reconstruct(a, b, c, x);
        // The fourth byte of a 3-byte pixel lands on the next pixel's first, written next.
        let word = _mm_cvtsi128_si32(_mm_packus_epi16(a, a));
        // SAFETY: as the loads; `out` does not overlap `previous`, and where it is
        // `filtered` (4-byte pixels) this pixel was read above and no later one is touched.
        unsafe { out.add(i * BPP).cast::<i32>().write_unaligned(word) };
        c = b;
    }
    for i in wide..pixels {
        for k in 0..BPP {
            let at = i * BPP + k;
            // SAFETY: `at` and `at - BPP` lie within the rows the caller vouches for.
            unsafe {
                let (left, above_left) = if i == 0 {
                    (0, 0)
                } else {
                    (*out.add(at - BPP), *previous.add(at - BPP))
                };
                let predicted = super::png_direct::paeth(left, *previous.add(at), above_left);
                *out.add(at) = (*filtered.add(at)).wrapping_add(predicted);
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// The specification's predictor.
    fn specification(a: u8, b: u8, c: u8) -> u8 {
        let p = i16::from(a) + i16::from(b) - i16::from(c);
        let (pa, pb, pc) = (
            (p - i16::from(a)).abs(),
            (p - i16::from(b)).abs(),
            (p - i16::from(c)).abs(),
        );
        if pa <= pb && pa <= pc {
            a
        } else if pb <= pc {
            b
        } else {
            c
        }
    }

    #[test]
    fn the_vector_predictor_is_the_specifications_on_every_input() {
        if !available() {
            eprintln!("skipped: no SSE4.1");
            return;
        }
        // Eight lanes a call: lane k takes c = 8j + k; x = 7 so the wrap is exercised.
        for a in 0..=255u16 {
            for b in 0..=255u16 {
                for block in 0..32u16 {
                    let cs: [i16; 8] = std::array::from_fn(|k| (block * 8 + k as u16) as i16);
                    // SAFETY: SSE4.1 is present (checked above).
                    let lanes: [i16; 8] = unsafe {
                        std::mem::transmute(reconstruct(
                            _mm_set1_epi16(a as i16),
                            _mm_set1_epi16(b as i16),
                            std::mem::transmute::<[i16; 8], __m128i>(cs),
                            _mm_set1_epi16(7),
                        ))
                    };
                    for (k, &c) in cs.iter().enumerate() {
                        let want = specification(a as u8, b as u8, c as u8).wrapping_add(7);
                        assert_eq!(lanes[k], i16::from(want), "a {a} b {b} c {c}");
                    }
                }
            }
        }
    }

    /// Rows of random bytes, and rows whose bytes sit near each other (where the predictor's
    /// ties lie), reconstructed as the scalar loop does.
    #[test]
    fn rows_equal_the_scalar_reconstruction() {
        if !available() {
            eprintln!("skipped: no SSE4.1");
            return;
        }
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for pixels in [1usize, 2, 3, 5, 17, 64, 333] {
            for smooth in [false, true] {
                let byte = |next: &mut dyn FnMut() -> u64| {
                    let r = next();
                    if smooth {
                        (120 + (r % 5) as u8).wrapping_sub(2)
                    } else {
                        r as u8
                    }
                };
                for bpp in [3usize, 4] {
                    let n = pixels * bpp;
                    let previous: Vec<u8> = (0..n).map(|_| byte(&mut next)).collect();
                    let filtered: Vec<u8> = (0..n).map(|_| byte(&mut next)).collect();
                    let mut want = filtered.clone();
                    for i in 0..n {
                        let left = if i >= bpp { want[i - bpp] } else { 0 };
                        let above_left = if i >= bpp { previous[i - bpp] } else { 0 };
                        want[i] =
                            filtered[i].wrapping_add(specification(left, previous[i], above_left));
                    }
                    let mut got = vec![0u8; n];
                    if bpp == 3 {
                        paeth_rgb_row(&previous, &filtered, &mut got);
                    } else {
                        got.copy_from_slice(&filtered);
                        paeth_rgba_row_in_place(&previous, &mut got);
                    }
                    assert_eq!(got, want, "{pixels} pixels of {bpp} bytes, smooth {smooth}");
                }
            }
        }
    }
}
