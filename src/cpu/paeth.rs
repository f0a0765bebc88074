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
//! channels of a pixel travel side by side in 16-bit lanes; where Paeth rows follow each other,
//! the next row's pixels ride in the next lanes two pixels behind the row above's, so that
//! several chains share the instructions: four rows in a 256-bit register (AVX2), else two in
//! a 128-bit one (SSE4.1).

/// Whether this processor runs [`paeth_rgb_row`], [`paeth_two_rgb_rows`] and
/// [`paeth_rgba_row_in_place`].
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
    let pixels = out.len() / 3;
    // SAFETY: SSE4.1 is present (checked above); the three slices are checked to hold the
    // same whole pixels, all that `paeth_span` reads and writes, and `out`, borrowed
    // mutably, overlaps neither of the others.
    unsafe {
        paeth_span::<3>(
            previous.as_ptr(),
            filtered.as_ptr(),
            out.as_mut_ptr(),
            (0, pixels),
            pixels,
        )
    }
}

/// Undoes the Paeth filter on two consecutive rows of 3-byte pixels, both filtered with Paeth:
/// `filtered` and `second_filtered` hold their filtered bytes, `previous` the row above the
/// first as reconstructed, and `out` (two rows long) receives both reconstructed rows. Faster
/// than [`paeth_rgb_row`] on each: the two rows' chains share the instructions.
///
/// # Panics
/// If the lengths differ or are not whole pixels, or where [`available`] is false.
#[cfg(target_arch = "x86_64")]
pub(crate) fn paeth_two_rgb_rows(
    previous: &[u8],
    (filtered, second_filtered): (&[u8], &[u8]),
    out: &mut [u8],
) {
    let row = previous.len();
    assert!(filtered.len() == row && second_filtered.len() == row && out.len() == 2 * row);
    assert!(row.is_multiple_of(3));
    assert!(available());
    let (first, second) = out.split_at_mut(row);
    // SAFETY: SSE4.1 is present (checked above); every row is checked to hold the same whole
    // pixels, all that `two_rgb_rows_sse41` reads and writes, and the two output rows, borrowed
    // mutably and split, overlap nothing else.
    unsafe {
        two_rgb_rows_sse41(
            previous.as_ptr(),
            (filtered.as_ptr(), second_filtered.as_ptr()),
            (first.as_mut_ptr(), second.as_mut_ptr()),
            row / 3,
        )
    }
}

/// Whether this processor runs [`paeth_four_rgb_rows`] (AVX2).
pub(crate) fn four_rows_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Undoes the Paeth filter on four consecutive rows of 3-byte pixels, all filtered with Paeth:
/// `filtered` holds their filtered bytes, `previous` the row above the first as reconstructed,
/// and `out` (four rows long) receives the reconstructed rows. Each row rides in its quarter of
/// a 256-bit register, two pixels behind the row above it.
///
/// # Panics
/// If the lengths differ or are not whole pixels, or where [`four_rows_available`] is false.
#[cfg(target_arch = "x86_64")]
pub(crate) fn paeth_four_rgb_rows(previous: &[u8], filtered: [&[u8]; 4], out: &mut [u8]) {
    let row = previous.len();
    assert!(filtered.iter().all(|f| f.len() == row) && out.len() == 4 * row);
    assert!(row.is_multiple_of(3));
    assert!(four_rows_available() && available());
    let (first, rest) = out.split_at_mut(row);
    let (second, rest) = rest.split_at_mut(row);
    let (third, fourth) = rest.split_at_mut(row);
    // SAFETY: AVX2 (and so SSE4.1) is present (checked above); every row is checked to hold the
    // same whole pixels, all that `four_rgb_rows_avx2` reads and writes, and the four output
    // rows, borrowed mutably and split, overlap nothing else.
    unsafe {
        four_rgb_rows_avx2(
            previous.as_ptr(),
            filtered.map(<[u8]>::as_ptr),
            [
                first.as_mut_ptr(),
                second.as_mut_ptr(),
                third.as_mut_ptr(),
                fourth.as_mut_ptr(),
            ],
            row / 3,
        )
    }
}

/// [`paeth_four_rgb_rows`] where the processor is not x86-64: never called.
#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn paeth_four_rgb_rows(_previous: &[u8], _filtered: [&[u8]; 4], _out: &mut [u8]) {
    unreachable!("the vector Paeth path runs on x86-64 only")
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
    // whole pixels, all that `paeth_span` reads and writes; with 4-byte pixels it reads
    // each pixel of the row before it writes that pixel and nothing after it.
    unsafe { paeth_span::<4>(previous.as_ptr(), at, at, (0, row.len() / 4), row.len() / 4) }
}

/// [`paeth_rgb_row`] where the processor is not x86-64: never called ([`available`] is false).
#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn paeth_rgb_row(_previous: &[u8], _filtered: &[u8], _out: &mut [u8]) {
    unreachable!("the vector Paeth path runs on x86-64 only")
}

/// [`paeth_two_rgb_rows`] where the processor is not x86-64: never called.
#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn paeth_two_rgb_rows(_previous: &[u8], _filtered: (&[u8], &[u8]), _out: &mut [u8]) {
    unreachable!("the vector Paeth path runs on x86-64 only")
}

/// [`paeth_rgba_row_in_place`] where the processor is not x86-64: never called.
#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn paeth_rgba_row_in_place(_previous: &[u8], _row: &mut [u8]) {
    unreachable!("the vector Paeth path runs on x86-64 only")
}

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Defines a reconstruction function over one vector width: `x` (the filtered bytes) plus the
/// prediction from `a` (left), `b` (above) and `c` (above left), one byte a 16-bit lane, the
/// result in the same lanes, modulo 256. The intrinsics are passed in by width.
macro_rules! reconstruction {
    (
        $(#[$doc:meta])* $name:ident, $vector:ty, $feature:literal,
        add16: $add16:ident, sub16: $sub16:ident, min16: $min16:ident, max16: $max16:ident,
        greater16: $greater16:ident, halve16: $halve16:ident, splat16: $splat16:ident,
        select: $select:ident, add8: $add8:ident, and: $and:ident
    ) => {
        $(#[$doc])*
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feature)]
        fn $name(a: $vector, b: $vector, c: $vector, x: $vector) -> $vector {
            // Off the chain: the two intervals the row above decides. The prediction is `c`
            // for `a` strictly inside the inner one, `b` for `a` inside the outer one but not
            // the inner one, `a` elsewhere.
            let c3 = $add16($add16(c, c), c);
            let far = $sub16($sub16(c3, b), b); // 3c - 2b
            let middle = $sub16(c3, b); // 3c - b
            let (outer_low, outer_high) = ($min16(b, far), $max16(b, far));
            // Where b < c the inner interval runs from (3c - b) / 2 rounded down to 3c - 2b;
            // where b >= c from 3c - 2b to (3c - b) / 2 rounded up.
            let b_below_c = $greater16(c, b);
            let half_down = $halve16(middle, 1);
            let half_up = $halve16($add16(middle, $splat16(1)), 1);
            let inner_low = $select(far, half_down, b_below_c);
            let inner_high = $select(half_up, far, b_below_c);
            // The sums in bytes, so each wraps within its lane's low byte.
            let x_plus_b = $add8(x, b);
            let x_plus_c = $add8(x, c);
            // On the chain: where `a` lies.
            let x_plus_a = $add8(x, a);
            let outer = $and($greater16(a, outer_low), $greater16(outer_high, a));
            let inner = $and($greater16(a, inner_low), $greater16(inner_high, a));
            $select($select(x_plus_a, x_plus_b, outer), x_plus_c, inner)
        }
    };
}

reconstruction!(
    /// A pixel's reconstruction, or two pixels', one in each half of a 128-bit register.
    reconstruct, __m128i, "sse4.1",
    add16: _mm_add_epi16, sub16: _mm_sub_epi16, min16: _mm_min_epi16, max16: _mm_max_epi16,
    greater16: _mm_cmpgt_epi16, halve16: _mm_srai_epi16, splat16: _mm_set1_epi16,
    select: _mm_blendv_epi8, add8: _mm_add_epi8, and: _mm_and_si128
);

reconstruction!(
    /// Four pixels' reconstruction, one in each quarter of a 256-bit register.
    reconstruct_four, __m256i, "avx2",
    add16: _mm256_add_epi16, sub16: _mm256_sub_epi16, min16: _mm256_min_epi16,
    max16: _mm256_max_epi16, greater16: _mm256_cmpgt_epi16, halve16: _mm256_srai_epi16,
    splat16: _mm256_set1_epi16, select: _mm256_blendv_epi8, add8: _mm256_add_epi8,
    and: _mm256_and_si256
);

/// Four pixels' bytes, four from each of `p` (widened to 16-bit lanes, a quarter each).
///
/// # Safety
/// Each pointer must be valid for reading four bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn load_four(p: [*const u8; 4]) -> __m256i {
    // SAFETY: the caller's guarantee.
    let [w0, w1, w2, w3] = p.map(|q| unsafe { q.cast::<i32>().read_unaligned() });
    _mm256_cvtepu8_epi16(_mm_set_epi32(w3, w2, w1, w0))
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

/// The Paeth loop over pixels `from..to` of a row of `pixels` pixels of `BPP` bytes (3 or 4) at
/// raw pointers, pixel `from - 1` already reconstructed in `out` where `from > 0`.
///
/// # Safety
/// SSE4.1 must be present; `from <= to <= pixels`; `previous`, `filtered` and `out` must each
/// be valid for `pixels * BPP` bytes, `out` not overlapping `previous` and, where `BPP` is 3,
/// not `filtered` (with 4-byte pixels `out` may be `filtered`). With 3-byte pixels the byte
/// after pixel `to - 1` in `out`, where `to < pixels`, is overwritten.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.1")]
unsafe fn paeth_span<const BPP: usize>(
    previous: *const u8,
    filtered: *const u8,
    out: *mut u8,
    (from, to): (usize, usize),
    pixels: usize,
) {
    if from >= to {
        return;
    }
    let (mut a, mut c) = match from {
        0 => (_mm_setzero_si128(), _mm_setzero_si128()),
        // SAFETY: pixel `from - 1` is not the row's last, so four bytes from it lie within.
        _ => unsafe {
            (
                load4(out.add((from - 1) * BPP)),
                load4(previous.add((from - 1) * BPP)),
            )
        },
    };
    // Four bytes are read and written a pixel: with 3-byte pixels, every pixel but the row's
    // last, whose fourth byte would lie past the row.
    let wide = if BPP == 4 {
        to
    } else {
        to.min(pixels.saturating_sub(1))
    };
    for i in from..wide {
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
    for i in wide.max(from)..to {
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

/// Two consecutive Paeth rows of `pixels` 3-byte pixels at once: the first row's pixel `i` in
/// the low lanes beside the second row's pixel `i - 2` in the high ones, two chains through
/// the same instructions. The second row's bytes above are the first row's, two and three
/// pixels back, still in registers.
///
/// # Safety
/// SSE4.1 must be present; `previous`, `filtered`, `second_filtered`, `out` and `second_out`
/// must each be valid for `pixels * 3` bytes; `out` and `second_out` overlap none of the others
/// nor each other, except that `second_out` may begin right after `out` ends.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.1")]
unsafe fn two_rgb_rows_sse41(
    previous: *const u8,
    (filtered, second_filtered): (*const u8, *const u8),
    (out, second_out): (*mut u8, *mut u8),
    pixels: usize,
) {
    if pixels < 4 {
        // SAFETY: the caller's bounds, the second row's bytes above being the first row's.
        unsafe {
            paeth_span::<3>(previous, filtered, out, (0, pixels), pixels);
            paeth_span::<3>(out, second_filtered, second_out, (0, pixels), pixels);
        }
        return;
    }
    // The first row's pixels 0 and 1 alone (the byte after pixel 1, pixel 2's first, is
    // written again below).
    // SAFETY: the caller's bounds; 2 < `pixels`.
    unsafe { paeth_span::<3>(previous, filtered, out, (0, 2), pixels) };
    // `one_back` holds the pixels to the left (the second row's before its first: zeros),
    // `two_back` the first row's pixel above the second row's next, `above_left` the bytes
    // above left of both (the second row's: zeros for its first pixel).
    // SAFETY: pixels 0 and 1 are not the row's last (4 pixels or more), so read whole.
    let (mut two_back, mut one_back, mut above_left) =
        unsafe { (load4(out), load4(out.add(3)), load4(previous.add(3))) };
    for i in 2..pixels - 1 {
        let j = i - 2;
        // SAFETY: the first row's pixel `i` and the second row's pixel `j` (below `i`) are
        // neither row's last, so their four bytes lie within the rows.
        let (x, above) = unsafe {
            (
                _mm_unpacklo_epi64(
                    load4(filtered.add(i * 3)),
                    load4(second_filtered.add(j * 3)),
                ),
                _mm_unpacklo_epi64(load4(previous.add(i * 3)), two_back),
            )
        };
        let r = reconstruct(one_back, above, above_left, x);
        let bytes = _mm_packus_epi16(r, r);
        // SAFETY: as the loads; each store's fourth byte is the next pixel's first of its own
        // row, written after.
        unsafe {
            out.add(i * 3)
                .cast::<i32>()
                .write_unaligned(_mm_cvtsi128_si32(bytes));
            second_out
                .add(j * 3)
                .cast::<i32>()
                .write_unaligned(_mm_extract_epi32::<1>(bytes));
        }
        (two_back, one_back, above_left) = (one_back, r, above);
    }
    // The first row's last pixel, then the second row's last three, above them the first row
    // whole.
    // SAFETY: the caller's bounds, the second row's bytes above being the first row's.
    unsafe {
        paeth_span::<3>(previous, filtered, out, (pixels - 1, pixels), pixels);
        paeth_span::<3>(
            out,
            second_filtered,
            second_out,
            (pixels - 3, pixels),
            pixels,
        );
    }
}

/// Four consecutive Paeth rows of `pixels` 3-byte pixels at once: row `r`'s pixel `i - 2r` in
/// the register's quarter `r`. Each row's bytes above are the row above's, two pixels back
/// (moved up a quarter), its bytes above left the last pixel's bytes above.
///
/// # Safety
/// AVX2 must be present; `previous` and every row of `filtered` and `out` must be valid for
/// `pixels * 3` bytes; the rows of `out` overlap none of the others nor each other, except that
/// each may begin right after the one before ends.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn four_rgb_rows_avx2(
    previous: *const u8,
    filtered: [*const u8; 4],
    out: [*mut u8; 4],
    pixels: usize,
) {
    // The row above each row of `out`.
    let above_row = [
        previous,
        out[0].cast_const(),
        out[1].cast_const(),
        out[2].cast_const(),
    ];
    if pixels < 8 {
        for r in 0..4 {
            // SAFETY: the caller's bounds; the rows above are done first.
            unsafe { paeth_span::<3>(above_row[r], filtered[r], out[r], (0, pixels), pixels) };
        }
        return;
    }
    // The staggered start: row r's first 6 - 2r pixels (the byte after each span's last pixel is
    // written again below).
    for r in 0..3 {
        // SAFETY: the caller's bounds; 6 - 2r < `pixels`, the row above done that far.
        unsafe { paeth_span::<3>(above_row[r], filtered[r], out[r], (0, 6 - 2 * r), pixels) };
    }
    let at = |p: *const u8, pixel: usize| p.wrapping_add(pixel * 3);
    let (o0, o1, o2) = (
        out[0].cast_const(),
        out[1].cast_const(),
        out[2].cast_const(),
    );
    // SAFETY (the three loads): pixels 0-5 are none of them a row's last (8 pixels or more).
    // `one_back`: the pixels to the left (the fourth row's before its first: zeros).
    let mut one_back = unsafe { load_four([at(o0, 5), at(o1, 3), at(o2, 1), at(o2, 1)]) };
    one_back = _mm256_blend_epi32::<0b1100_0000>(one_back, _mm256_setzero_si256());
    // `two_back`: the pixels two to the left; quarters 0-2 are the rows below's bytes above.
    let mut two_back = unsafe { load_four([at(o0, 4), at(o1, 2), at(o2, 0), at(o2, 0)]) };
    // `above_left`: the bytes above left (the fourth row's first pixel's: zeros).
    let mut above_left = unsafe { load_four([at(previous, 5), at(o0, 3), at(o1, 1), at(o1, 1)]) };
    above_left = _mm256_blend_epi32::<0b1100_0000>(above_left, _mm256_setzero_si256());
    for i in 6..pixels - 1 {
        let pixel = [i, i - 2, i - 4, i - 6];
        // SAFETY: pixel `i` of the first row and the pixels behind it of the others are no
        // row's last, so their four bytes lie within the rows.
        let (x, top) = unsafe {
            (
                load_four(std::array::from_fn(|r| at(filtered[r], pixel[r]))),
                load_four([at(previous, i); 4]),
            )
        };
        let above = _mm256_blend_epi32::<0b0000_0011>(
            _mm256_permute4x64_epi64::<0b10_01_00_00>(two_back),
            top,
        );
        let r = reconstruct_four(one_back, above, above_left, x);
        let bytes = _mm256_packus_epi16(r, r);
        let words = [
            _mm256_extract_epi32::<0>(bytes),
            _mm256_extract_epi32::<1>(bytes),
            _mm256_extract_epi32::<4>(bytes),
            _mm256_extract_epi32::<5>(bytes),
        ];
        for (row, word) in words.into_iter().enumerate() {
            // SAFETY: as the loads; each store's fourth byte is the next pixel's first of its
            // own row, written after.
            unsafe {
                out[row]
                    .add(pixel[row] * 3)
                    .cast::<i32>()
                    .write_unaligned(word)
            };
        }
        (two_back, one_back, above_left) = (one_back, r, above);
    }
    // The staggered end: row r's last 1 + 2r pixels, the rows above whole by then.
    for r in 0..4 {
        // SAFETY: the caller's bounds; 1 + 2r < `pixels`.
        unsafe {
            paeth_span::<3>(
                above_row[r],
                filtered[r],
                out[r],
                (pixels - 1 - 2 * r, pixels),
                pixels,
            )
        };
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::super::png_direct::paeth_specification as specification;
    use super::*;

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

    /// Row `filtered` reconstructed byte by byte with the specification's predictor, given the
    /// row above, `above`, in pixels of `bpp` bytes.
    fn reconstructed(above: &[u8], filtered: &[u8], bpp: usize) -> Vec<u8> {
        let mut row = filtered.to_vec();
        for i in 0..row.len() {
            let (left, above_left) = if i >= bpp {
                (row[i - bpp], above[i - bpp])
            } else {
                (0, 0)
            };
            row[i] = filtered[i].wrapping_add(specification(left, above[i], above_left));
        }
        row
    }

    /// Rows of random bytes, and rows whose bytes sit near each other (where the predictor's
    /// ties lie), one, two and four at a time, against the specification's reconstruction,
    /// into outputs poisoned first.
    #[test]
    fn rows_equal_the_specifications_reconstruction() {
        if !available() {
            eprintln!("skipped: no SSE4.1");
            return;
        }
        let mut draws = crate::random::Draws::new(0x2545_f491_4f6c_dd1d);
        for pixels in [1usize, 2, 3, 4, 5, 6, 7, 8, 9, 10, 17, 64, 333] {
            for smooth in [false, true] {
                let mut row = |bpp: usize| -> Vec<u8> {
                    (0..pixels * bpp)
                        .map(|_| {
                            let r = draws.next();
                            match smooth {
                                true => (120 + (r % 5) as u8).wrapping_sub(2),
                                false => r as u8,
                            }
                        })
                        .collect()
                };
                // One row of 4-byte pixels, in place.
                let (previous, filtered) = (row(4), row(4));
                let mut got = filtered.clone();
                paeth_rgba_row_in_place(&previous, &mut got);
                let want = reconstructed(&previous, &filtered, 4);
                assert_eq!(got, want, "{pixels} pixels of 4 bytes, smooth {smooth}");
                // Four rows of 3-byte pixels: the first alone, the first two, all four.
                let n = pixels * 3;
                let previous = row(3);
                let rows: Vec<Vec<u8>> = (0..4).map(|_| row(3)).collect();
                let mut wanted = vec![reconstructed(&previous, &rows[0], 3)];
                for k in 1..4 {
                    wanted.push(reconstructed(&wanted[k - 1], &rows[k], 3));
                }
                let mut got = vec![0xA5u8; n];
                paeth_rgb_row(&previous, &rows[0], &mut got);
                assert_eq!(got, wanted[0], "one row, {pixels} pixels, smooth {smooth}");
                let mut both = vec![0xA5u8; 2 * n];
                paeth_two_rgb_rows(&previous, (&rows[0], &rows[1]), &mut both);
                for (r, want_row) in wanted[..2].iter().enumerate() {
                    let got_row = &both[r * n..(r + 1) * n];
                    assert_eq!(got_row, &want_row[..], "row {r} of two, {pixels} pixels");
                }
                if four_rows_available() {
                    let mut four = vec![0x5Au8; 4 * n];
                    let filtered_rows = [&rows[0][..], &rows[1], &rows[2], &rows[3]];
                    paeth_four_rgb_rows(&previous, filtered_rows, &mut four);
                    for (r, want_row) in wanted.iter().enumerate() {
                        let got_row = &four[r * n..(r + 1) * n];
                        assert_eq!(got_row, &want_row[..], "row {r} of four, {pixels} pixels");
                    }
                }
            }
        }
    }
}
