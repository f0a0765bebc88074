//! What an image will cost before it is read: its format, its size from the header, and the
//! bytes its decode will hold. The size limit is checked here, so an image claiming too many
//! pixels is refused before its file is read, and the decode budget is reserved from here.

use std::io::{BufRead, BufReader, Cursor, Seek};

use image::{ImageDecoder, ImageFormat};

use super::png;
use crate::error::ItemErrorKind;
use crate::options::DecodeOptions;
use crate::source::{sniff_format, OpenItem};

/// Encoded bytes whose header can be read: an opened item, or bytes in memory.
pub(crate) trait Encoded {
    /// A reader over all the bytes.
    type Reader<'a>: BufRead + Seek
    where
        Self: 'a;
    /// Encoded size in bytes.
    fn len(&self) -> u64;
    /// The first bytes (enough for any header but a JPEG's or a TIFF's, which are walked).
    fn head(&self) -> &[u8];
    /// Reads `len` bytes at `offset` (fewer at the end) into `out`.
    fn read_at(&self, offset: u64, len: usize, out: &mut Vec<u8>) -> std::io::Result<()>;
    /// A reader from the first byte.
    fn reader(&self) -> Self::Reader<'_>;
}

impl Encoded for OpenItem {
    type Reader<'a> = BufReader<crate::source::ItemReader<'a>>;
    fn len(&self) -> u64 {
        OpenItem::len(self)
    }
    fn head(&self) -> &[u8] {
        OpenItem::head(self)
    }
    fn read_at(&self, offset: u64, len: usize, out: &mut Vec<u8>) -> std::io::Result<()> {
        OpenItem::read_at(self, offset, len, out)
    }
    fn reader(&self) -> Self::Reader<'_> {
        BufReader::new(OpenItem::reader(self))
    }
}

impl Encoded for [u8] {
    type Reader<'a> = Cursor<&'a [u8]>;
    fn len(&self) -> u64 {
        <[u8]>::len(self) as u64
    }
    fn head(&self) -> &[u8] {
        self
    }
    fn read_at(&self, offset: u64, len: usize, out: &mut Vec<u8>) -> std::io::Result<()> {
        let start = offset.min(<[u8]>::len(self) as u64) as usize;
        let end = start.saturating_add(len).min(<[u8]>::len(self));
        out.clear();
        out.extend_from_slice(&self[start..end]);
        Ok(())
    }
    fn reader(&self) -> Self::Reader<'_> {
        Cursor::new(self)
    }
}

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
pub(crate) fn probe<E: Encoded + ?Sized>(
    item: &E,
    options: &DecodeOptions,
) -> Result<Probe, ItemErrorKind> {
    let format = sniff_format(item.head()).ok_or(ItemErrorKind::UnknownFormat)?;
    let (width, height, mut bytes_per_pixel) = match format {
        ImageFormat::Jpeg => jpeg_frame(item)?,
        ImageFormat::Png => png_header(item)?,
        _ => image_header(item, format)?,
    };
    if options.exif_orientation {
        // The turned copy of the decoded image.
        bytes_per_pixel += if format == ImageFormat::Jpeg {
            3
        } else {
            bytes_per_pixel - 3
        };
    }
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

/// Width, height and bytes a pixel held while decoding a JPEG, from its frame header (SOF) and
/// its first scan header (SOS), found by walking the markers with small positioned reads.
fn jpeg_frame<E: Encoded + ?Sized>(item: &E) -> Result<(u64, u64, u64), ItemErrorKind> {
    let fail = |what: &str| ItemErrorKind::Decode(format!("JPEG: {what}"));
    let io = |e: std::io::Error| ItemErrorKind::read(&e, e.to_string());
    // The output (RGB) and, for a file of several scans (progressive, or baseline with its
    // components in separate scans), libjpeg's buffer of every coefficient: 2 bytes a sample,
    // at most every component at full resolution.
    let per_pixel =
        |components: u64, several_scans: bool| 3 + if several_scans { 2 * components } else { 0 };
    let mut buf = Vec::with_capacity(16);
    let mut at = 2u64; // past SOI
    let len = item.len();
    // Width, height, components and whether it is progressive, once the frame header is read.
    let mut frame: Option<(u64, u64, u64, bool)> = None;
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
            0xC0..=0xCF if !matches!(marker, 0xC4 | 0xC8 | 0xCC) && frame.is_none() => {
                let [_, _, l1, l0] = buf[..] else {
                    return Err(ItemErrorKind::Truncated("JPEG: the frame header".into()));
                };
                let segment = u64::from(u16::from_be_bytes([l1, l0]));
                item.read_at(at + 4, 6, &mut buf).map_err(io)?;
                let [_precision, h1, h0, w1, w0, components] = buf[..] else {
                    return Err(ItemErrorKind::Truncated("JPEG: the frame header".into()));
                };
                let height = u64::from(u16::from_be_bytes([h1, h0]));
                let width = u64::from(u16::from_be_bytes([w1, w0]));
                let progressive = matches!(marker, 0xC2 | 0xC6 | 0xCA | 0xCE);
                frame = Some((width, height, u64::from(components.max(1)), progressive));
                at += 2 + segment;
            }
            0xDA => {
                let Some((width, height, components, progressive)) = frame else {
                    return Err(fail("no frame header before the image data"));
                };
                item.read_at(at + 4, 1, &mut buf).map_err(io)?;
                // A first scan without every component means several scans.
                let in_scan = buf.first().map_or(0, |&n| u64::from(n));
                let several = progressive || in_scan < components;
                return Ok((width, height, per_pixel(components, several)));
            }
            0xD9 => break,
            _ => {
                let [_, _, l1, l0] = buf[..] else {
                    return Err(ItemErrorKind::Truncated("JPEG: a marker segment".into()));
                };
                at += 2 + u64::from(u16::from_be_bytes([l1, l0]));
            }
        }
    }
    match frame {
        // No scan header: the decoder will say what is wrong; charged as if it had several.
        Some((width, height, components, _)) => Ok((width, height, per_pixel(components, true))),
        None if at < len => Err(fail("no frame header before the image data")),
        None => Err(ItemErrorKind::Truncated(
            "JPEG: the file ends before the frame header".into(),
        )),
    }
}

/// Width, height and bytes a pixel held while decoding a PNG, from its `IHDR` chunk: the
/// decoder's pixels and their RGB copy (the metadata chunks it could inflate are never read: see
/// [`png::PngView`]).
fn png_header<E: Encoded + ?Sized>(item: &E) -> Result<(u64, u64, u64), ItemErrorKind> {
    let header = png::header(item.head()).ok_or_else(|| {
        if item.head().len() < 33 {
            ItemErrorKind::Truncated("PNG: the file ends inside its header".into())
        } else {
            ItemErrorKind::Decode("PNG: no valid IHDR chunk after the signature".into())
        }
    })?;
    Ok((
        u64::from(header.width),
        u64::from(header.height),
        3 + header.decoded_bytes_per_pixel,
    ))
}

/// Width, height and bytes a pixel held while decoding, through the `image` decoder's header.
fn image_header<E: Encoded + ?Sized>(
    item: &E,
    format: ImageFormat,
) -> Result<(u64, u64, u64), ItemErrorKind> {
    let name = format!("{format:?}").to_uppercase();
    let fail = |e: image::ImageError| super::decode::image_error(&name, e);
    let reader = image::ImageReader::with_format(item.reader(), format);
    let decoder = reader.into_decoder().map_err(fail)?;
    let ((width, height), color) = (decoder.dimensions(), decoder.color_type());
    // The decoder's own buffer, then the RGB8 copy; GIF composes frames on a second canvas;
    // libwebp decodes into a working copy of its own first.
    let native = color.bytes_per_pixel() as u64;
    let per_pixel = 3 + match format {
        ImageFormat::Gif => 2 * native,
        ImageFormat::WebP => native + 4,
        _ => native,
    };
    Ok((u64::from(width), u64::from(height), per_pixel))
}
