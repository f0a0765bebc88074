//! Byte transposes between eight rows and columns of eight: the horizontal pass turns a strip of
//! eight rows into columns (each byte column's eight samples contiguous, so the taps of an output
//! are contiguous vectors, as rows are for the vertical pass), filters, and turns its output back.
//!
//! Both work on 128-bit lanes; the 256-bit forms do two blocks of 16 columns at once, one per
//! lane (lane 0: columns `0..16`, lane 1: columns `16..32` of 32-byte rows).

use std::arch::x86_64::*;

/// Eight rows of 16 bytes (`rows[i]`: row i, per lane) to 16 columns of eight, two per
/// register: `out[k]` holds column `2k` (rows 0 to 7), then column `2k + 1`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn rows_to_columns(rows: [__m256i; 8]) -> [__m256i; 8] {
    let r = rows;
    // Byte pairs of rows (0, 1), (2, 3), ...: columns 0..8 in `lo`, 8..16 in `hi`.
    let a0 = _mm256_unpacklo_epi8(r[0], r[1]);
    let a1 = _mm256_unpackhi_epi8(r[0], r[1]);
    let a2 = _mm256_unpacklo_epi8(r[2], r[3]);
    let a3 = _mm256_unpackhi_epi8(r[2], r[3]);
    let a4 = _mm256_unpacklo_epi8(r[4], r[5]);
    let a5 = _mm256_unpackhi_epi8(r[4], r[5]);
    let a6 = _mm256_unpacklo_epi8(r[6], r[7]);
    let a7 = _mm256_unpackhi_epi8(r[6], r[7]);
    // Rows 0..4 and 4..8 of four columns each.
    let b0 = _mm256_unpacklo_epi16(a0, a2);
    let b1 = _mm256_unpackhi_epi16(a0, a2);
    let b2 = _mm256_unpacklo_epi16(a1, a3);
    let b3 = _mm256_unpackhi_epi16(a1, a3);
    let b4 = _mm256_unpacklo_epi16(a4, a6);
    let b5 = _mm256_unpackhi_epi16(a4, a6);
    let b6 = _mm256_unpacklo_epi16(a5, a7);
    let b7 = _mm256_unpackhi_epi16(a5, a7);
    // All eight rows of two columns each.
    [
        _mm256_unpacklo_epi32(b0, b4),
        _mm256_unpackhi_epi32(b0, b4),
        _mm256_unpacklo_epi32(b1, b5),
        _mm256_unpackhi_epi32(b1, b5),
        _mm256_unpacklo_epi32(b2, b6),
        _mm256_unpackhi_epi32(b2, b6),
        _mm256_unpacklo_epi32(b3, b7),
        _mm256_unpackhi_epi32(b3, b7),
    ]
}

/// The inverse of [`rows_to_columns`]: `columns[k]` holds columns `2k` and `2k + 1` (eight
/// bytes each, rows 0 to 7), the result row i of the 16 columns (per lane).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn columns_to_rows(columns: [__m256i; 8]) -> [__m256i; 8] {
    // Taken as eight rows of 16 bytes, the columns transpose into registers whose first four
    // hold the even columns of rows (0, 1), (2, 3), ... and whose last four the odd ones;
    // interleaving even and odd bytes gives the rows.
    let t = rows_to_columns(columns);
    [
        _mm256_unpacklo_epi8(t[0], t[4]),
        _mm256_unpackhi_epi8(t[0], t[4]),
        _mm256_unpacklo_epi8(t[1], t[5]),
        _mm256_unpackhi_epi8(t[1], t[5]),
        _mm256_unpacklo_epi8(t[2], t[6]),
        _mm256_unpackhi_epi8(t[2], t[6]),
        _mm256_unpacklo_epi8(t[3], t[7]),
        _mm256_unpackhi_epi8(t[3], t[7]),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lanes(v: __m256i) -> [u8; 32] {
        // SAFETY: plain bit copy between equally sized types.
        unsafe { std::mem::transmute(v) }
    }

    fn vector(b: [u8; 32]) -> __m256i {
        // SAFETY: as above.
        unsafe { std::mem::transmute(b) }
    }

    #[test]
    fn transposes_invert_each_other_and_match_the_definition() {
        if !std::is_x86_feature_detected!("avx2") {
            println!("skipped: byte transposes: this CPU has no AVX2");
            return;
        }
        // rows[i] lane L byte c = row i, column 16 L + c.
        let mut rows = [[0u8; 32]; 8];
        for (i, row) in rows.iter_mut().enumerate() {
            for (c, b) in row.iter_mut().enumerate() {
                *b = (i * 32 + c) as u8 ^ 0x5A;
            }
        }
        let input = rows.map(vector);
        // SAFETY: AVX2 checked above.
        let columns = unsafe { rows_to_columns(input) }.map(lanes);
        for (k, reg) in columns.iter().enumerate() {
            for lane in 0..2 {
                for half in 0..2 {
                    for row in 0..8 {
                        let column = 16 * lane + 2 * k + half;
                        assert_eq!(
                            reg[16 * lane + 8 * half + row],
                            rows[row][column],
                            "column {column} row {row}"
                        );
                    }
                }
            }
        }
        // SAFETY: AVX2 checked above.
        let back = unsafe { columns_to_rows(columns.map(vector)) }.map(lanes);
        assert_eq!(back, rows);
    }
}
