//! The common PNGs decoded directly: 8-bit RGB, RGBA, gray and gray with alpha, not interlaced,
//! without a transparency chunk. Their image data is inflated in one call by libdeflate (1.27x
//! the `png` crate's inflater on 1-2 Mpx photos) into a buffer of the lane's pool, its rows
//! unfiltered and written as RGB8 (alpha dropped and gray spread, as Pillow's `convert("RGB")`
//! does): RGB rows straight into the pixels, the others in place first. Rows filtered with
//! Paeth, the filter most encoders choose for photos, are undone in vector registers where the
//! processor has SSE4.1, four rows at a time with AVX2 where four follow each other
//! ([`super::paeth`]; 1.8x the scalar loop's PNG decode on 1-2 Mpx photos). PNG is lossless:
//! any correct decoder gives these bytes.
//!
//! Anything else, and any file this path finds amiss (a checksum, a chunk out of order, data
//! that inflates to another size or fails its own checksum, an unknown filter), is left to the
//! `image` crate's decoder ([`super::decode`]), which then decodes it or says what is wrong as
//! before. The tests hold both to the same pixels on every filter and layout this path takes.

use std::cell::RefCell;

use libdeflater::Decompressor;

use crate::error::ItemErrorKind;
use crate::memory::BufferPool;
use crate::options::DecodeOptions;

use super::decode::Decoded;
use super::paeth;
use super::probe::check_size;

/// The PNG signature.
const SIGNATURE: &[u8; 8] = b"\x89PNG\r\n\x1a\n";

thread_local! {
    /// This thread's inflater, created on first use.
    static INFLATER: RefCell<Option<Decompressor>> = const { RefCell::new(None) };
}

/// What this path needs of a PNG: its size, bytes a pixel, and where its image data lies.
struct Layout<'a> {
    width: usize,
    height: usize,
    /// Samples a pixel: 1 gray, 2 gray and alpha, 3 RGB, 4 RGBA (8 bits each).
    channels: usize,
    /// The `IDAT` chunks' data, in order.
    data: Vec<&'a [u8]>,
}

/// Reads the chunks of `bytes`: `None` unless it is a PNG this path takes, every chunk whole
/// with its checksum right, `IHDR` first, the `IDAT` chunks consecutive, `IEND` last.
/// `exif_orientation`: a file with an `eXIf` chunk is left to the other decoder, which turns it.
fn layout(bytes: &[u8], exif_orientation: bool) -> Option<Layout<'_>> {
    if bytes.get(..8)? != SIGNATURE {
        return None;
    }
    let mut at = 8;
    let mut header = None;
    let mut data = Vec::new();
    let mut data_ended = false;
    loop {
        let length = u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?) as usize;
        let kind: [u8; 4] = bytes.get(at + 4..at + 8)?.try_into().ok()?;
        let body = bytes.get(at + 8..(at + 8).checked_add(length)?)?;
        let crc = bytes.get(at + 8 + length..at + 12 + length)?;
        if crc32fast::hash(&bytes[at + 4..at + 8 + length]).to_be_bytes() != crc {
            return None;
        }
        at += 12 + length;
        match &kind {
            b"IHDR" if header.is_none() && length == 13 => {
                let be =
                    |i: usize| u32::from_be_bytes([body[i], body[i + 1], body[i + 2], body[i + 3]]);
                let channels = match body[9] {
                    0 => 1,
                    2 => 3,
                    4 => 2,
                    6 => 4,
                    _ => return None,
                };
                // 8 bits, deflate, the one filter method, no interlacing.
                if body[8] != 8 || body[10..13] != [0, 0, 0] {
                    return None;
                }
                header = Some((be(0) as usize, be(4) as usize, channels));
            }
            _ if header.is_none() => return None,
            b"IDAT" if !data_ended => data.push(body),
            b"IEND" => break,
            // Transparency, animation and a palette for an image that needs one are the other
            // decoder's; so is an orientation to apply.
            b"tRNS" | b"acTL" | b"fcTL" | b"fdAT" => return None,
            b"eXIf" if exif_orientation => return None,
            // A suggested palette of an RGB image is skipped; other critical chunks, and a
            // palette where none belongs, are the other decoder's.
            b"PLTE" if header.is_some_and(|(_, _, channels)| channels >= 3) => {}
            other if other[0].is_ascii_uppercase() => return None,
            _ => data_ended |= !data.is_empty(),
        }
    }
    let (width, height, channels) = header?;
    if data.is_empty() || width == 0 || height == 0 {
        return None;
    }
    Some(Layout {
        width,
        height,
        channels,
        data,
    })
}

/// Decodes `bytes` into `pixels` as packed RGB8 when it is a PNG this path takes (see the
/// module), using at most `memory` bytes beside `pixels` for its inflated rows; a size past the
/// pixel limit is refused before anything is allocated. `None` leaves the file to the other
/// decoder, `pixels` then unspecified.
pub(crate) fn decode_png(
    bytes: &[u8],
    options: &DecodeOptions,
    pixels: &mut Vec<u8>,
    pool: &BufferPool,
    memory: u64,
) -> Option<Result<Decoded, ItemErrorKind>> {
    let Layout {
        width,
        height,
        channels,
        data,
    } = layout(bytes, options.exif_orientation)?;
    if let Err(e) = check_size(width as u64, height as u64, options) {
        return Some(Err(e));
    }
    let row = width.checked_mul(channels)?;
    let inflated_len = row.checked_add(1)?.checked_mul(height)?;
    let joined: usize = if data.len() > 1 {
        data.iter().map(|d| d.len()).sum()
    } else {
        0
    };
    if inflated_len.checked_add(joined)? as u64 > memory {
        return None;
    }
    let (u32_width, u32_height) = (u32::try_from(width).ok()?, u32::try_from(height).ok()?);
    let mut inflated = pool.take(inflated_len);
    let lent = inflated.capacity();
    let decoded = inflate(&data, joined, &mut inflated, inflated_len, pool).and_then(|()| {
        unfilter_into_rgb(&mut inflated, width, height, channels, pixels)?;
        Some(Decoded::full(u32_width, u32_height))
    });
    pool.give(inflated, lent);
    decoded.map(Ok)
}

/// Inflates the zlib stream split over `data` (`joined` bytes in all when more than one chunk)
/// into `out`, which must come to exactly `len` bytes.
fn inflate(
    data: &[&[u8]],
    joined: usize,
    out: &mut Vec<u8>,
    len: usize,
    pool: &BufferPool,
) -> Option<()> {
    // Stale bytes are overwritten: the inflate must fill all of them (checked below).
    out.resize(len, 0);
    let mut whole = Vec::new();
    let mut lent = 0;
    let stream: &[u8] = if data.len() == 1 {
        data[0]
    } else {
        whole = pool.take(joined);
        lent = whole.capacity();
        whole.clear();
        for part in data {
            whole.extend_from_slice(part);
        }
        &whole
    };
    let inflated = INFLATER.with(|cell| {
        let mut slot = cell.borrow_mut();
        let inflater = slot.get_or_insert_with(Decompressor::new);
        inflater.zlib_decompress(stream, out).ok()
    });
    if data.len() > 1 {
        pool.give(whole, lent);
    }
    (inflated? == len).then_some(())
}

/// Unfilters the rows of `inflated` (each a filter byte and `width * channels` samples) in place
/// and writes them to `pixels` as RGB8; `None` at a filter type PNG does not define.
fn unfilter_into_rgb(
    inflated: &mut [u8],
    width: usize,
    height: usize,
    channels: usize,
    pixels: &mut Vec<u8>,
) -> Option<()> {
    let row = width * channels;
    pixels.resize(width * height * 3, 0);
    if channels == 3 {
        return unfilter_rgb(inflated, width, height, pixels);
    }
    let vector_paeth = paeth::available();
    for (y, out) in pixels.chunks_exact_mut(width * 3).enumerate().take(height) {
        let (done, rest) = inflated.split_at_mut(y * (row + 1));
        let (filter, current) = rest.get_mut(..row + 1)?.split_first_mut()?;
        match done.len().checked_sub(row) {
            Some(start) if *filter == 4 && channels == 4 && vector_paeth => {
                paeth::paeth_rgba_row_in_place(&done[start..], current)
            }
            Some(start) => unfilter(*filter, channels, &done[start..], current)?,
            None => unfilter_first(*filter, channels, current)?,
        }
        match channels {
            4 => {
                for (rgb, rgba) in out.chunks_exact_mut(3).zip(current.chunks_exact(4)) {
                    rgb.copy_from_slice(&rgba[..3]);
                }
            }
            _ => {
                for (rgb, gray) in out.chunks_exact_mut(3).zip(current.chunks_exact(channels)) {
                    rgb.fill(gray[0]);
                }
            }
        }
    }
    Some(())
}

/// [`unfilter_into_rgb`] for RGB rows, reconstructed straight into `pixels` (sized): each row's
/// filtered bytes are read from `inflated`, the row above from `pixels`.
fn unfilter_rgb(inflated: &[u8], width: usize, height: usize, pixels: &mut [u8]) -> Option<()> {
    let row = width * 3;
    let vector_paeth = paeth::available();
    let four_rows = vector_paeth && paeth::four_rows_available();
    let filtered_row = |y: usize| -> Option<(u8, &[u8])> {
        let (filter, bytes) = inflated
            .get(y * (row + 1)..(y + 1) * (row + 1))?
            .split_first()?;
        Some((*filter, bytes))
    };
    // The filtered bytes of row `y` where it is a Paeth row.
    let paeth_row = |y: usize| {
        filtered_row(y)
            .filter(|(filter, _)| *filter == 4)
            .map(|(_, bytes)| bytes)
    };
    let mut y = 0;
    while y < height {
        let (filter, current) = filtered_row(y)?;
        let (done, rest) = pixels.split_at_mut(y * row);
        // Paeth rows that follow each other are undone four or two at a time.
        if let (Some(start), true) = (done.len().checked_sub(row), vector_paeth) {
            let above = &done[start..];
            let rows = [0, 1, 2, 3].map(|k| (y + k < height).then(|| paeth_row(y + k)).flatten());
            if let (true, [Some(a), Some(b), Some(c), Some(d)]) = (four_rows, rows) {
                paeth::paeth_four_rgb_rows(above, [a, b, c, d], rest.get_mut(..4 * row)?);
                y += 4;
                continue;
            }
            if let [Some(a), Some(b), ..] = rows {
                paeth::paeth_two_rgb_rows(above, (a, b), rest.get_mut(..2 * row)?);
                y += 2;
                continue;
            }
        }
        let out = rest.get_mut(..row)?;
        match done.len().checked_sub(row) {
            Some(start) if filter == 4 && vector_paeth => {
                paeth::paeth_rgb_row(&done[start..], current, out)
            }
            Some(start) => {
                out.copy_from_slice(current);
                unfilter(filter, 3, &done[start..], out)?
            }
            None => {
                out.copy_from_slice(current);
                unfilter_first(filter, 3, out)?
            }
        }
        y += 1;
    }
    Some(())
}

/// Undoes filter `filter` on the first row, `current` (pixels of `bpp` bytes): the row above
/// counts as zeros, so Up leaves the bytes as they are and Paeth predicts from the left alone.
fn unfilter_first(filter: u8, bpp: usize, current: &mut [u8]) -> Option<()> {
    match filter {
        0 | 2 => {}
        1 | 4 => {
            for i in bpp..current.len() {
                current[i] = current[i].wrapping_add(current[i - bpp]);
            }
        }
        3 => {
            for i in bpp..current.len() {
                current[i] = current[i].wrapping_add(current[i - bpp] >> 1);
            }
        }
        _ => return None,
    }
    Some(())
}

/// Undoes filter `filter` on `current` (pixels of `bpp` bytes, 1 to 4) given the row above,
/// `previous`, already unfiltered: the PNG specification's reconstruction, bytes taken modulo
/// 256.
fn unfilter(filter: u8, bpp: usize, previous: &[u8], current: &mut [u8]) -> Option<()> {
    match bpp {
        1 => unfilter_pixels::<1>(filter, previous, current),
        2 => unfilter_pixels::<2>(filter, previous, current),
        3 => unfilter_pixels::<3>(filter, previous, current),
        _ => unfilter_pixels::<4>(filter, previous, current),
    }
}

/// [`unfilter`] for pixels of `BPP` bytes: Sub, Average and Paeth carry the pixel to the left
/// in registers from one pixel to the next (each depends on the one before it), not through
/// memory.
fn unfilter_pixels<const BPP: usize>(
    filter: u8,
    previous: &[u8],
    current: &mut [u8],
) -> Option<()> {
    let pixels = current
        .chunks_exact_mut(BPP)
        .zip(previous.chunks_exact(BPP));
    match filter {
        0 => {}
        1 => {
            let mut left = [0u8; BPP];
            for (x, _) in pixels {
                for i in 0..BPP {
                    left[i] = x[i].wrapping_add(left[i]);
                }
                x.copy_from_slice(&left);
            }
        }
        2 => {
            for (x, b) in current.iter_mut().zip(previous) {
                *x = x.wrapping_add(*b);
            }
        }
        3 => {
            let mut left = [0u8; BPP];
            for (x, b) in pixels {
                for i in 0..BPP {
                    let average = (u16::from(left[i]) + u16::from(b[i])) >> 1;
                    left[i] = x[i].wrapping_add(average as u8);
                }
                x.copy_from_slice(&left);
            }
        }
        4 => {
            let (mut left, mut above_left) = ([0u8; BPP], [0u8; BPP]);
            for (x, b) in pixels {
                for i in 0..BPP {
                    left[i] = x[i].wrapping_add(paeth(left[i], b[i], above_left[i]));
                }
                above_left.copy_from_slice(b);
                x.copy_from_slice(&left);
            }
        }
        _ => return None,
    }
    Some(())
}

/// The Paeth predictor of a byte from the one to its left (`a`), above (`b`) and above left
/// (`c`), in stb_image's branch-free form (the specification's on every input: see the tests),
/// which compiles to selects.
pub(super) fn paeth(a: u8, b: u8, c: u8) -> u8 {
    let (a16, b16, c16) = (i16::from(a), i16::from(b), i16::from(c));
    let threshold = c16 * 3 - (a16 + b16);
    let (low, high) = (a16.min(b16), a16.max(b16));
    let nearer = if high <= threshold { low } else { c16 };
    (if threshold <= low { high } else { nearer }) as u8
}

/// The PNG specification's Paeth predictor, as it is written there (for the tests).
#[cfg(test)]
pub(super) fn paeth_specification(a: u8, b: u8, c: u8) -> u8 {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paeth_equals_the_specification_on_every_input() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                for c in 0..=255u8 {
                    assert_eq!(paeth(a, b, c), paeth_specification(a, b, c), "{a} {b} {c}");
                }
            }
        }
    }
}
