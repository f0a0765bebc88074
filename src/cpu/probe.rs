//! What an image will cost before it is read: its format, its size from the header, and the
//! bytes its decode will hold. The size limit is checked here, so an image claiming too many
//! pixels is refused before its file is read, and the decode budget is reserved from here.

use std::io::BufReader;

use image::{ImageDecoder, ImageFormat};

use crate::error::ItemErrorKind;
use crate::options::DecodeOptions;
use crate::source::{sniff_format, OpenItem};

/// An image's header, read before the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Probe {
    /// Width the header claims.
    pub width: u64,
    /// Height the header claims.
    pub height: u64,
    /// Bytes decoding it holds at most: the encoded bytes, the decoder's output and what it
    /// keeps meanwhile.
    pub bytes_in_flight: u64,
}

/// Room for the decoders' own tables and row buffers.
const DECODER_SLACK: u64 = 1 << 20;

/// Reads the header of `item` and checks the pixel limit.
pub(crate) fn probe(item: &OpenItem, options: &DecodeOptions) -> Result<Probe, ItemErrorKind> {
    let format = sniff_format(item.head()).ok_or(ItemErrorKind::UnknownFormat)?;
    let (width, height, bytes_per_pixel) = match format {
        ImageFormat::Jpeg => jpeg_frame(item)?,
        _ => image_header(item, format, options)?,
    };
    check_size(width, height, options)?;
    let pixels = width.saturating_mul(height);
    Ok(Probe {
        width,
        height,
        bytes_in_flight: item
            .len()
            .saturating_add(pixels.saturating_mul(bytes_per_pixel))
            .saturating_add(DECODER_SLACK),
    })
}

/// Refuses an image with no pixels or more than `max_pixels`.
pub(crate) fn check_size(
    width: u64,
    height: u64,
    options: &DecodeOptions,
) -> Result<(), ItemErrorKind> {
    if width == 0 || height == 0 {
        return Err(ItemErrorKind::Empty);
    }
    if width.saturating_mul(height) > options.max_pixels {
        return Err(ItemErrorKind::TooLarge {
            width,
            height,
            limit: options.max_pixels,
        });
    }
    Ok(())
}

/// Width, height and bytes a pixel held while decoding a JPEG, from its frame header (SOF),
/// found by walking the markers with small positioned reads.
fn jpeg_frame(item: &OpenItem) -> Result<(u64, u64, u64), ItemErrorKind> {
    let fail = |what: &str| ItemErrorKind::Decode(format!("JPEG: {what}"));
    let io = |e: std::io::Error| ItemErrorKind::read(&e, e.to_string());
    let mut buf = Vec::with_capacity(16);
    let mut at = 2u64; // past SOI
    let len = item.len();
    while at < len {
        item.read_at(at, 4, &mut buf).map_err(io)?;
        let [0xFF, marker, ..] = buf[..] else {
            return Err(fail("a marker is missing before the frame header"));
        };
        match marker {
            // Fill bytes before a marker.
            0xFF => at += 1,
            // Markers without a length.
            0x01 | 0xD0..=0xD8 => at += 2,
            0xC0..=0xCF if !matches!(marker, 0xC4 | 0xC8 | 0xCC) => {
                item.read_at(at + 4, 6, &mut buf).map_err(io)?;
                let [_precision, h1, h0, w1, w0, components] = buf[..] else {
                    return Err(ItemErrorKind::Truncated("JPEG: the frame header".into()));
                };
                let height = u64::from(u16::from_be_bytes([h1, h0]));
                let width = u64::from(u16::from_be_bytes([w1, w0]));
                let progressive = matches!(marker, 0xC2 | 0xC6 | 0xCA | 0xCE);
                let components = u64::from(components.max(1));
                // The output (RGB), and a progressive file's coefficients (2 bytes a sample,
                // at most every component at full resolution).
                let per_pixel = 3 + if progressive { 2 * components } else { 0 };
                return Ok((width, height, per_pixel));
            }
            0xD9 | 0xDA => return Err(fail("no frame header before the image data")),
            _ => {
                let [_, _, l1, l0] = buf[..] else {
                    return Err(ItemErrorKind::Truncated("JPEG: a marker segment".into()));
                };
                at += 2 + u64::from(u16::from_be_bytes([l1, l0]));
            }
        }
    }
    Err(ItemErrorKind::Truncated(
        "JPEG: the file ends before the frame header".into(),
    ))
}

/// Width, height and bytes a pixel held while decoding, through the `image` decoder's header.
fn image_header(
    item: &OpenItem,
    format: ImageFormat,
    options: &DecodeOptions,
) -> Result<(u64, u64, u64), ItemErrorKind> {
    let name = format!("{format:?}").to_uppercase();
    let fail = |e: image::ImageError| super::decode::image_error(&name, e);
    let mut limits = image::Limits::default();
    limits.max_alloc = Some(options.max_pixels.saturating_mul(8).saturating_add(1 << 26));
    let mut reader = image::ImageReader::with_format(BufReader::new(item.reader()), format);
    reader.limits(limits);
    let decoder = reader.into_decoder().map_err(fail)?;
    let dims = (decoder.dimensions(), decoder.color_type());
    let ((width, height), color) = dims;
    // The decoder's own buffer, then the RGB8 copy; GIF composes frames on a second canvas.
    let native = color.bytes_per_pixel() as u64;
    let per_pixel = 3 + if format == ImageFormat::Gif {
        2 * native
    } else {
        native
    };
    Ok((u64::from(width), u64::from(height), per_pixel))
}
