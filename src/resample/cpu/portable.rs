//! The passes in plain Rust, for every CPU: loops the compiler vectorises where it can, each
//! sum exactly Pillow's (`HALF` plus `sample * weight` in wrapping `i32`, then [`clip8`]).

use super::super::coefficients::{clip8, HALF};
use super::{HorizontalPass, VerticalPass};

/// Bytes the vertical pass sums at once, on the stack.
const CHUNK: usize = 256;

/// The horizontal pass: for each of `pass.rows` rows, every output pixel from its taps along the
/// row.
pub(super) fn horizontal(pass: &mut HorizontalPass) {
    for r in 0..pass.rows {
        horizontal_rows(pass, r, r + 1);
    }
}

/// Rows `[from, to)` of the horizontal pass (also the tail the vectorised pass leaves).
pub(super) fn horizontal_rows(pass: &mut HorizontalPass, from: usize, to: usize) {
    let c = pass.channels;
    for r in from..to {
        let row = pass.input.get(r * pass.pitch..).unwrap_or(&[]);
        for j in 0..pass.coefficients.bounds.len() {
            let px = horizontal_pixel(pass, row, j);
            let at = r * pass.out_pitch + j * pass.out_step;
            write_pixel(pass.output, at, &px[..c], pass.out_step);
        }
    }
}

/// Output pixel `j` of one row: up to 3 channels.
#[inline]
pub(super) fn horizontal_pixel(pass: &HorizontalPass, row: &[u8], j: usize) -> [u8; 3] {
    let c = pass.channels;
    let ((start, len), weights) = pass.coefficients.output(j);
    let start = (start as usize).saturating_sub(pass.shift) * c;
    let taps = row.get(start..start + len as usize * c).unwrap_or(&[]);
    let mut px = [0u8; 3];
    if c == 3 {
        let (mut r, mut g, mut b) = (HALF, HALF, HALF);
        for (s, &w) in taps.chunks_exact(3).zip(weights) {
            r = r.wrapping_add(i32::from(s[0]).wrapping_mul(w));
            g = g.wrapping_add(i32::from(s[1]).wrapping_mul(w));
            b = b.wrapping_add(i32::from(s[2]).wrapping_mul(w));
        }
        px = [clip8(r), clip8(g), clip8(b)];
    } else {
        let mut v = HALF;
        for (&s, &w) in taps.iter().zip(weights) {
            v = v.wrapping_add(i32::from(s).wrapping_mul(w));
        }
        px[0] = clip8(v);
    }
    px
}

/// Writes `px` (1 or 3 channels) at `at`; one channel spread to `step` (3) equal ones.
#[inline]
pub(super) fn write_pixel(out: &mut [u8], at: usize, px: &[u8], step: usize) {
    let Some(dst) = out.get_mut(at..at + step) else {
        return;
    };
    if px.len() == step {
        dst.copy_from_slice(px);
    } else {
        dst.fill(px[0]);
    }
}

/// The vertical pass: for each output row, every byte of it from its taps down the column.
pub(super) fn vertical(pass: &mut VerticalPass) {
    vertical_bytes(pass, 0, pass.row_bytes);
}

/// Bytes `[from, to)` of every output row of the vertical pass (also the tail the vectorised
/// pass leaves).
pub(super) fn vertical_bytes(pass: &mut VerticalPass, from: usize, to: usize) {
    let mut acc = [0i32; CHUNK];
    let mut done = [0u8; CHUNK];
    for j in 0..pass.coefficients.bounds.len() {
        let ((start, _), weights) = pass.coefficients.output(j);
        let mut x = from;
        while x < to {
            let n = (to - x).min(CHUNK);
            let acc = &mut acc[..n];
            acc.fill(HALF);
            for (k, &w) in weights.iter().enumerate() {
                let at = ((start as usize).saturating_sub(pass.shift) + k) * pass.pitch + x;
                let Some(row) = pass.input.get(at..at + n) else {
                    continue;
                };
                for (a, &s) in acc.iter_mut().zip(row) {
                    *a = a.wrapping_add(i32::from(s).wrapping_mul(w));
                }
            }
            let done = &mut done[..n];
            for (d, &a) in done.iter_mut().zip(acc.iter()) {
                *d = clip8(a);
            }
            write_row_part(pass, j, x, done);
            x += n;
        }
    }
}

/// Writes bytes `x..x + done.len()` of output row `j` (spread to RGB for a gray pass).
#[inline]
pub(super) fn write_row_part(pass: &mut VerticalPass, j: usize, x: usize, done: &[u8]) {
    let step = if pass.spread { 3 } else { 1 };
    let at = j * pass.out_pitch + x * step;
    let Some(dst) = pass.output.get_mut(at..at + done.len() * step) else {
        return;
    };
    if pass.spread {
        for (d, &v) in dst.chunks_exact_mut(3).zip(done) {
            d.fill(v);
        }
    } else {
        dst.copy_from_slice(done);
    }
}
