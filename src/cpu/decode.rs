//! Encoded bytes to RGB8 pixels.
//!
//! The format is sniffed from the bytes, never the file name. JPEG goes straight into the caller's
//! reusable buffer through libjpeg-turbo (the decoder Pillow uses, SIMD, with one decompressor per
//! thread; baseline files' Huffman decoding made faster, to the same coefficients: see
//! `turbojpeg_region::Decoder`), and only the [`DecodeWindow`] the resize will read: rows above it are entropy-decoded
//! but not transformed, rows below it not decoded at all, columns beside it skip the inverse DCT
//! and colour conversion. Gray JPEGs stay one channel. CMYK/YCCK JPEGs are decoded whole to
//! CMYK and turned into RGB as Pillow turns them; JPEGs libjpeg-turbo refuses (truncated or
//! slightly corrupt files it reports instead of concealing) go through zune-jpeg, whole.
//! Still WebPs go through libwebp ([`super::webp`]), only the window the resize reads, as
//! JPEGs. The common PNGs (8-bit RGB, RGBA, gray, gray with alpha) are inflated in one call and
//! unfiltered here ([`super::png_direct`]); other PNGs, animated WebP, BMP, GIF (first frame)
//! and TIFF go through `image`. Gray,
//! alpha (dropped, as Pillow's `convert("RGB")` does), palette and 16-bit images become RGB8.
//! The pixel limit is checked against the header before any pixel buffer is allocated, and
//! these decoders may allocate no more than the memory reserved for the image from its header;
//! a PNG's metadata chunks, which could inflate beyond that, are never read
//! ([`super::png::PngView`]).

use std::cell::RefCell;
use std::io::{BufRead, Cursor, Seek};

use image::metadata::Orientation;
use image::{DynamicImage, ImageDecoder, ImageFormat};
use zune_core::bytestream::ZCursor;
use zune_core::colorspace::ColorSpace;
use zune_core::options::DecoderOptions;
use zune_jpeg::JpegDecoder;

use turbojpeg_region::{Colorspace, Format, Region, Request};

use super::png::PngView;
use super::png_direct::decode_png;
use super::probe::check_size;
use super::webp::decode_webp;
use crate::error::ItemErrorKind;
use crate::geometry::SourceRect;
use crate::memory::BufferPool;
use crate::options::{DecodeOptions, Gray16, MAX_PROGRESSIVE_SCANS};
use crate::source::sniff_format;

/// A decoded image; its pixels are in the caller's buffer, rows packed, `channels` bytes a
/// pixel. After a partial decode only the [`DecodeWindow`] holds this image's pixels; the rest of
/// the buffer is stale, and the resize never reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Decoded {
    pub width: u32,
    pub height: u32,
    /// 3 (RGB) or 1 (gray, from a gray JPEG).
    pub channels: u32,
    /// The image was decoded at 1/`reduction` of its size in the DCT domain (1: full size);
    /// pixel `i` covers source pixels `[i * reduction, (i + 1) * reduction)`.
    pub reduction: u32,
    /// Width of the full-size image (the geometry is computed on it).
    pub source_width: u32,
    /// Height of the full-size image.
    pub source_height: u32,
}

impl Decoded {
    pub(crate) fn full(width: u32, height: u32) -> Decoded {
        Decoded {
            width,
            height,
            channels: 3,
            reduction: 1,
            source_width: width,
            source_height: height,
        }
    }
}

/// What of a JPEG to decode: how much smaller than full size (1, 2, 4 or 8; see
/// [`crate::DecodeOptions::dct_scaling`]) and which part (`None`: all of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DecodeWindow {
    pub reduction: u32,
    pub region: Option<SourceRect>,
}

#[cfg(test)]
impl DecodeWindow {
    /// The whole image at full size.
    pub const WHOLE: DecodeWindow = DecodeWindow {
        reduction: 1,
        region: None,
    };
}

/// The [`DecodeWindow`] for a JPEG of the given full-size width and height; the CPU stage asks
/// the resize geometry.
pub(crate) type WindowFor<'a> = &'a dyn Fn(u32, u32) -> DecodeWindow;

/// Decodes `bytes` into `pixels` (resized to fit) as packed RGB8, or gray for gray JPEGs. The
/// `image` crate's decoders may allocate at most `memory` bytes (what was reserved for the
/// image: see [`super::probe::Probe::bytes_in_flight`]).
pub(crate) fn decode(
    bytes: &[u8],
    options: &DecodeOptions,
    window: WindowFor,
    pixels: &mut Vec<u8>,
    pool: &BufferPool,
    memory: u64,
) -> Result<Decoded, ItemErrorKind> {
    if bytes.is_empty() {
        return Err(ItemErrorKind::Decode("file is empty".into()));
    }
    let with_image = |format, pixels: &mut Vec<u8>| {
        let decoder = Decoder {
            format,
            options,
            memory,
            pool,
        };
        match format {
            ImageFormat::Png => {
                decoder.decode(PngView::new(bytes, options.exif_orientation), pixels)
            }
            _ => decoder.decode(Cursor::new(bytes), pixels),
        }
    };
    match sniff_format(bytes).ok_or(ItemErrorKind::UnknownFormat)? {
        ImageFormat::Jpeg => decode_jpeg(bytes, options, window, pixels),
        ImageFormat::WebP if !options.exif_orientation => {
            match decode_webp(bytes, options, window, pixels) {
                Some(decoded) => decoded,
                None => with_image(ImageFormat::WebP, pixels),
            }
        }
        ImageFormat::Png => match decode_png(bytes, options, pixels, pool, memory) {
            Some(decoded) => decoded,
            None => with_image(ImageFormat::Png, pixels),
        },
        format => with_image(format, pixels),
    }
}

/// Decodes all of `bytes` at full size as packed RGB8 (a gray JPEG spread to three equal
/// channels, as Pillow's `convert("RGB")`): what the dense targets' transforms start from.
/// The pixels go into a buffer of `buffers` (the smallest that holds them, its stale bytes
/// overwritten: no zeroing, no fresh pages), to be given back once used. Returns the pixels,
/// the width and the height.
pub(crate) fn decode_whole(
    bytes: &[u8],
    options: &DecodeOptions,
    buffers: &BufferPool,
) -> Result<(Vec<u8>, u32, u32), ItemErrorKind> {
    let header = super::probe::probe(bytes, options)?;
    let rgb_len = (header.width as usize)
        .saturating_mul(header.height as usize)
        .saturating_mul(3);
    let mut pixels = buffers.take(rgb_len);
    let lent = pixels.capacity();
    let whole = |_, _| DecodeWindow {
        reduction: 1,
        region: None,
    };
    let d = decode(
        bytes,
        options,
        &whole,
        &mut pixels,
        &BufferPool::new(0),
        header.bytes_in_flight,
    );
    let d = match d {
        Ok(d) => d,
        Err(e) => {
            buffers.give(pixels, lent);
            return Err(e);
        }
    };
    let (w, h) = (d.width as usize, d.height as usize);
    if d.reduction != 1 || pixels.len() < w * h * d.channels as usize {
        buffers.give(pixels, lent);
        return Err(ItemErrorKind::Decode(
            "decoder gave fewer pixels than the image has".into(),
        ));
    }
    if d.channels == 1 {
        // Spread in place, from the last pixel back, so no gray value is overwritten before
        // it is read.
        pixels.resize(w * h * 3, 0);
        for i in (0..w * h).rev() {
            let v = pixels[i];
            pixels[i * 3..i * 3 + 3].fill(v);
        }
    } else {
        pixels.truncate(w * h * 3);
    }
    Ok((pixels, d.width, d.height))
}

thread_local! {
    /// This thread's libjpeg-turbo decompressor, created on first use.
    static TURBO: RefCell<Option<turbojpeg_region::Decoder>> = const { RefCell::new(None) };
}

fn decode_jpeg(
    bytes: &[u8],
    options: &DecodeOptions,
    window: WindowFor,
    pixels: &mut Vec<u8>,
) -> Result<Decoded, ItemErrorKind> {
    // An image the EXIF tag turns is decoded whole and in RGB, then turned: a region would be
    // computed for the image as stored.
    let orientation = if options.exif_orientation {
        let mut headers = JpegDecoder::new(ZCursor::new(bytes));
        headers
            .decode_headers()
            .ok()
            .and_then(|()| headers.exif().and_then(|e| Orientation::from_exif_chunk(e)))
            .unwrap_or(Orientation::NoTransforms)
    } else {
        Orientation::NoTransforms
    };
    let upright = orientation == Orientation::NoTransforms;
    // Decoded whole; the DCT reduction planned for the image as it will stand once turned.
    let quarter_turn = matches!(
        orientation,
        Orientation::Rotate90
            | Orientation::Rotate270
            | Orientation::Rotate90FlipH
            | Orientation::Rotate270FlipH
    );
    let whole_window = |w, h| DecodeWindow {
        region: None,
        ..if quarter_turn {
            window(h, w)
        } else {
            window(w, h)
        }
    };
    let window: WindowFor = if upright { window } else { &whole_window };
    match decode_jpeg_turbo(bytes, options, window, upright, pixels)? {
        Some(decoded) if upright => Ok(decoded),
        Some(decoded) => orient(decoded, orientation, pixels),
        None => decode_jpeg_zune(bytes, options, pixels),
    }
}

/// libjpeg-turbo: `Ok(None)` hands the file to zune-jpeg (refused).
fn decode_jpeg_turbo(
    bytes: &[u8],
    options: &DecodeOptions,
    window: WindowFor,
    allow_gray: bool,
    pixels: &mut Vec<u8>,
) -> Result<Option<Decoded>, ItemErrorKind> {
    TURBO.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            let Ok(mut decoder) = turbojpeg_region::Decoder::new() else {
                return Ok(None);
            };
            if decoder.set_scan_limit(MAX_PROGRESSIVE_SCANS).is_err() {
                return Ok(None);
            }
            *slot = Some(decoder);
        }
        let Some(decoder) = slot.as_mut() else {
            return Ok(None);
        };
        let Ok(header) = decoder.read_header(bytes) else {
            return Ok(None);
        };
        check_size(header.width as u64, header.height as u64, options)?;
        if matches!(header.colorspace, Colorspace::Cmyk | Colorspace::Ycck) {
            return decode_cmyk(decoder, bytes, &header, pixels);
        }
        let window = window(header.width, header.height);
        let reduction = match window.reduction {
            r @ (2 | 4 | 8) if !header.lossless => r,
            _ => 1,
        };
        let region = window.region.filter(|_| !header.lossless).map(|rect| {
            let (x0, y0) = (rect.x0 / reduction, rect.y0 / reduction);
            let (x1, y1) = (rect.x1.div_ceil(reduction), rect.y1.div_ceil(reduction));
            Region::aligned(&header, reduction, x0, y0, x1 - x0, y1 - y0)
        });
        let gray = allow_gray && header.colorspace == Colorspace::Gray;
        let request = Request {
            format: if gray { Format::Gray } else { Format::Rgb },
            reduction,
            region,
        };
        pixels.resize(request.output_len(&header), 0);
        // A region libjpeg-turbo cannot cut where asked (unusual sampling factors) is decoded
        // whole before the file goes to the other decoder.
        let mut decoded = decoder.decompress(bytes, &request, pixels);
        if decoded.is_err() && region.is_some() {
            let whole = Request {
                region: None,
                ..request
            };
            decoded = decoder.decompress(bytes, &whole, pixels);
        }
        let Ok(decoded) = decoded else {
            return Ok(None);
        };
        // libjpeg fills a truncated file's missing rows and says so; Pillow (and so torchvision)
        // refuses such a file, and so does gpufeed. Other warnings (corrupt data libjpeg steps
        // over) leave an image Pillow delivers too.
        if decoded.premature_end {
            return Err(truncated_jpeg());
        }
        Ok(Some(Decoded {
            width: decoded.width,
            height: decoded.height,
            channels: request.format.bytes_per_pixel() as u32,
            reduction,
            source_width: header.width,
            source_height: header.height,
        }))
    })
}

/// A JPEG whose data ended before the image, in libjpeg's words.
fn truncated_jpeg() -> ItemErrorKind {
    ItemErrorKind::Truncated("JPEG: Premature end of JPEG file".into())
}

/// A CMYK or YCCK JPEG, whole, as Pillow decodes it: libjpeg's CMYK samples taken as Adobe's
/// inverted ones (`CMYK;I`), then Pillow's `convert("RGB")` (`cmyk2rgb`:
/// `nk - nk * c / 255` per channel with `nk = 255 - k`, rounded as `MULDIV255`).
fn decode_cmyk(
    decoder: &mut turbojpeg_region::Decoder,
    bytes: &[u8],
    header: &turbojpeg_region::Header,
    pixels: &mut Vec<u8>,
) -> Result<Option<Decoded>, ItemErrorKind> {
    let request = Request {
        format: Format::Cmyk,
        reduction: 1,
        region: None,
    };
    let mut cmyk = vec![0u8; request.output_len(header)];
    let Ok(decoded) = decoder.decompress(bytes, &request, &mut cmyk) else {
        return Ok(None);
    };
    if decoded.premature_end {
        return Err(truncated_jpeg());
    }
    pixels.clear();
    pixels.reserve(cmyk.len() / 4 * 3);
    let muldiv255 = |a: u32, b: u32| {
        let t = a * b + 128;
        ((t >> 8) + t) >> 8
    };
    for px in cmyk.chunks_exact(4) {
        let nk = u32::from(px[3]);
        for &v in &px[..3] {
            // Inverted: c = 255 - v, and 255 - k = the stored k.
            pixels.push(nk.saturating_sub(muldiv255(255 - u32::from(v), nk)) as u8);
        }
    }
    Ok(Some(Decoded::full(decoded.width, decoded.height)))
}

fn decode_jpeg_zune(
    bytes: &[u8],
    options: &DecodeOptions,
    pixels: &mut Vec<u8>,
) -> Result<Decoded, ItemErrorKind> {
    let zune_options = DecoderOptions::default()
        .jpeg_set_out_colorspace(ColorSpace::RGB)
        .set_strict_mode(false)
        .set_max_width(usize::MAX)
        .set_max_height(usize::MAX);
    let mut decoder = JpegDecoder::new_with_options(ZCursor::new(bytes), zune_options);
    decoder.decode_headers().map_err(|e| jpeg_error(&e))?;
    let (width, height) = decoder
        .dimensions()
        .ok_or_else(|| ItemErrorKind::Decode("JPEG: no frame header".into()))?;
    check_size(width as u64, height as u64, options)?;
    let len = decoder
        .output_buffer_size()
        .ok_or_else(|| ItemErrorKind::Decode("JPEG: size overflows".into()))?;
    if len != width * height * 3 {
        return Err(ItemErrorKind::Decode(format!(
            "JPEG: decoder gives {len} bytes for {width}x{height} RGB"
        )));
    }
    pixels.resize(len, 0);
    decoder.decode_into(pixels).map_err(|e| jpeg_error(&e))?;
    let decoded = Decoded::full(width as u32, height as u32);
    if options.exif_orientation {
        if let Some(orientation) = decoder.exif().and_then(|e| Orientation::from_exif_chunk(e)) {
            return orient(decoded, orientation, pixels);
        }
    }
    Ok(decoded)
}

/// zune-jpeg's error in words: its `Display` quotes and escapes the message of its most common
/// errors, so those are taken as they are.
fn jpeg_error(e: &zune_jpeg::errors::DecodeErrors) -> ItemErrorKind {
    use zune_jpeg::errors::DecodeErrors;
    let text = match e {
        DecodeErrors::Format(message) => message.clone(),
        DecodeErrors::FormatStatic(message) => (*message).to_string(),
        other => other.to_string(),
    };
    ItemErrorKind::Decode(format!("JPEG: {}", text.trim().replace('\n', " ")))
}

/// A decode through the `image` crate: the format, and the memory its decoder may allocate.
struct Decoder<'a> {
    format: ImageFormat,
    options: &'a DecodeOptions,
    memory: u64,
    pool: &'a BufferPool,
}

impl Decoder<'_> {
    fn decode(
        &self,
        input: impl BufRead + Seek,
        pixels: &mut Vec<u8>,
    ) -> Result<Decoded, ItemErrorKind> {
        let Decoder {
            format,
            options,
            memory,
            pool,
        } = *self;
        let name = format!("{format:?}").to_uppercase();
        let fail = |e: image::ImageError| image_error(&name, e);
        let mut reader = image::ImageReader::with_format(input, format);
        let mut limits = image::Limits::default();
        limits.max_alloc = Some(memory);
        reader.limits(limits);
        let mut decoder = reader.into_decoder().map_err(fail)?;
        let (width, height) = decoder.dimensions();
        check_size(width as u64, height as u64, options)?;
        let orientation = if options.exif_orientation {
            decoder.orientation().unwrap_or(Orientation::NoTransforms)
        } else {
            Orientation::NoTransforms
        };
        if orientation != Orientation::NoTransforms {
            let mut image = DynamicImage::from_decoder(decoder).map_err(fail)?;
            image.apply_orientation(orientation);
            return Ok(into_rgb8(image, options.gray16, pixels));
        }
        let color = decoder.color_type();
        let total = usize::try_from(decoder.total_bytes())
            .map_err(|_| ItemErrorKind::Decode(format!("{name}: too large for memory")))?;
        if color == image::ColorType::Rgb8 {
            pixels.resize(total, 0);
            decoder.read_image(pixels).map_err(fail)?;
        } else {
            // The decoder's own pixels, in a buffer of the lane's pool, then RGB8 from them.
            let mut native = pool.take(total);
            let lent = native.capacity();
            native.resize(total, 0);
            let converted = decoder
                .read_image(&mut native)
                .map_err(fail)
                .and_then(|()| native_to_rgb8(color, &native, options.gray16, pixels));
            pool.give(native, lent);
            converted?;
        }
        Ok(Decoded::full(width, height))
    }
}

/// Packed RGB8 from a decoder's pixels of `color` (16-bit samples in native byte order), as
/// Pillow's `convert("RGB")` does: see [`into_rgb8`].
fn native_to_rgb8(
    color: image::ColorType,
    native: &[u8],
    gray16: Gray16,
    pixels: &mut Vec<u8>,
) -> Result<(), ItemErrorKind> {
    use image::ColorType;
    let channels = usize::from(color.channel_count());
    let sample = usize::from(color.bytes_per_pixel()) / channels.max(1);
    let n = native.len() / (channels * sample).max(1);
    pixels.clear();
    pixels.reserve(n * 3);
    let u16_at = |px: &[u8], c: usize| u16::from_ne_bytes([px[2 * c], px[2 * c + 1]]);
    let f32_at = |px: &[u8], c: usize| {
        let v = f32::from_ne_bytes([px[4 * c], px[4 * c + 1], px[4 * c + 2], px[4 * c + 3]]);
        (v.clamp(0.0, 1.0) * 255.0).round() as u8
    };
    let px_bytes = channels * sample;
    for px in native.chunks_exact(px_bytes) {
        let rgb = match color {
            ColorType::L8 | ColorType::La8 => [px[0]; 3],
            ColorType::Rgb8 | ColorType::Rgba8 => [px[0], px[1], px[2]],
            ColorType::L16 => {
                let v = u16_at(px, 0);
                [match gray16 {
                    Gray16::Clip => v.min(255) as u8,
                    Gray16::Scale => ((u32::from(v) * 255 + 32767) / 65535) as u8,
                }; 3]
            }
            ColorType::La16 => [(u16_at(px, 0) >> 8) as u8; 3],
            ColorType::Rgb16 | ColorType::Rgba16 => [
                (u16_at(px, 0) >> 8) as u8,
                (u16_at(px, 1) >> 8) as u8,
                (u16_at(px, 2) >> 8) as u8,
            ],
            ColorType::Rgb32F | ColorType::Rgba32F => [f32_at(px, 0), f32_at(px, 1), f32_at(px, 2)],
            other => {
                return Err(ItemErrorKind::Decode(format!(
                    "pixels of type {other:?} are not supported"
                )))
            }
        };
        pixels.extend_from_slice(&rgb);
    }
    Ok(())
}

/// A decoder's error: a file that ends early is truncated, as Pillow says.
pub(crate) fn image_error(format: &str, e: image::ImageError) -> ItemErrorKind {
    let ends_early = match &e {
        image::ImageError::IoError(io) => io.kind() == std::io::ErrorKind::UnexpectedEof,
        other => {
            let text = other.to_string().to_lowercase();
            text.contains("unexpected end") || text.contains("unexpected eof")
        }
    };
    if ends_early {
        ItemErrorKind::Truncated(format!("{format}: {e}"))
    } else {
        ItemErrorKind::Decode(format!("{format}: {e}"))
    }
}

/// Converts to packed RGB8 into `pixels` as Pillow's `convert("RGB")` does: alpha dropped,
/// 16-bit colour and gray-with-alpha samples cut to their high byte, and 16-bit gray (Pillow's
/// `I;16`) clipped to 255 or, on request, scaled.
fn into_rgb8(image: DynamicImage, gray16: Gray16, pixels: &mut Vec<u8>) -> Decoded {
    let (width, height) = (image.width(), image.height());
    let high_byte = |v: u16| (v >> 8) as u8;
    let rgb: Vec<u8> = match image {
        DynamicImage::ImageRgb16(img) => img.into_raw().into_iter().map(high_byte).collect(),
        DynamicImage::ImageRgba16(img) => img
            .into_raw()
            .chunks_exact(4)
            .flat_map(|p| [high_byte(p[0]), high_byte(p[1]), high_byte(p[2])])
            .collect(),
        DynamicImage::ImageLumaA16(img) => img
            .into_raw()
            .chunks_exact(2)
            .flat_map(|p| [high_byte(p[0]); 3])
            .collect(),
        DynamicImage::ImageLuma16(img) => img
            .into_raw()
            .into_iter()
            .flat_map(|v| {
                let g = match gray16 {
                    Gray16::Clip => v.min(255) as u8,
                    Gray16::Scale => ((u32::from(v) * 255 + 32767) / 65535) as u8,
                };
                [g; 3]
            })
            .collect(),
        other => other.into_rgb8().into_raw(),
    };
    *pixels = rgb;
    Decoded::full(width, height)
}

fn orient(
    decoded: Decoded,
    orientation: Orientation,
    pixels: &mut Vec<u8>,
) -> Result<Decoded, ItemErrorKind> {
    if orientation == Orientation::NoTransforms {
        return Ok(decoded);
    }
    let rgb = image::RgbImage::from_raw(decoded.width, decoded.height, std::mem::take(pixels))
        .ok_or_else(|| ItemErrorKind::Decode("pixel buffer does not match its size".into()))?;
    let mut image = DynamicImage::ImageRgb8(rgb);
    image.apply_orientation(orientation);
    let oriented = into_rgb8(image, Gray16::Clip, pixels);
    // A quarter turn swaps the sides of the full-size image too.
    let turned = oriented.width != decoded.width;
    Ok(Decoded {
        reduction: decoded.reduction,
        source_width: if turned {
            decoded.source_height
        } else {
            decoded.source_width
        },
        source_height: if turned {
            decoded.source_width
        } else {
            decoded.source_height
        },
        ..oriented
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> DecodeOptions {
        DecodeOptions::default()
    }

    /// `bytes` decoded whole with the default options into `buf`, with memory to spare.
    fn decode_whole_into(bytes: &[u8], buf: &mut Vec<u8>) -> Result<Decoded, ItemErrorKind> {
        decode(
            bytes,
            &options(),
            &|_, _| DecodeWindow::WHOLE,
            buf,
            &BufferPool::new(1 << 30),
            1 << 30,
        )
    }

    #[test]
    fn garbage_and_empty_are_errors() {
        let mut buf = Vec::new();
        assert!(matches!(
            decode_whole_into(b"", &mut buf),
            Err(ItemErrorKind::Decode(_))
        ));
        assert_eq!(
            decode_whole_into(b"hello, I am text", &mut buf),
            Err(ItemErrorKind::UnknownFormat)
        );
    }

    /// A JPEG cut short is refused as Pillow refuses it, also when libjpeg's first warning is
    /// about other damage (here a stray marker inside the first restart interval).
    #[test]
    fn a_cut_jpeg_is_truncated_whatever_warning_comes_first() {
        use turbojpeg_region::{encode, EncodeOptions, Restart};
        let (w, h) = (96u32, 64u32);
        let pixels: Vec<u8> = (0..w * h * 3).map(|i| (i * 37 % 251) as u8).collect();
        let options_restart = EncodeOptions {
            restart: Restart::Rows(1),
            ..EncodeOptions::default()
        };
        let jpeg = encode(&pixels, w, h, Format::Rgb, &options_restart).expect("encode");
        let sos = jpeg
            .windows(2)
            .position(|p| p == [0xFF, 0xDA])
            .expect("a scan");
        let first_restart = sos
            + jpeg[sos..]
                .windows(2)
                .position(|p| p[0] == 0xFF && (0xD0..=0xD7).contains(&p[1]))
                .expect("a restart marker");
        let mut damaged = jpeg.clone();
        damaged.splice(first_restart - 4..first_restart - 4, [0xFF, 0xD7]);
        damaged.truncate(damaged.len() * 3 / 4);
        let mut buf = Vec::new();
        let outcome = decode_whole_into(&damaged, &mut buf);
        assert!(
            matches!(outcome, Err(ItemErrorKind::Truncated(_))),
            "{outcome:?}"
        );
        // The same file whole decodes, stray marker and all.
        let mut whole = jpeg.clone();
        whole.splice(first_restart - 4..first_restart - 4, [0xFF, 0xD7]);
        assert!(decode_whole_into(&whole, &mut buf).is_ok());
    }

    #[test]
    fn forged_png_header_is_refused_before_allocating() {
        // A 60-byte PNG whose header claims 70000 x 70000 pixels.
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        let mut ihdr = Vec::new();
        ihdr.extend_from_slice(b"IHDR");
        ihdr.extend_from_slice(&70000u32.to_be_bytes());
        ihdr.extend_from_slice(&70000u32.to_be_bytes());
        ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
        png.extend_from_slice(&13u32.to_be_bytes());
        png.extend_from_slice(&ihdr);
        png.extend_from_slice(&crc32fast::hash(&ihdr).to_be_bytes());
        for (name, data) in [
            (&b"IDAT"[..], &[0x78, 0x9c, 0x03, 0x00][..]),
            (b"IEND", &[]),
        ] {
            let mut chunk = name.to_vec();
            chunk.extend_from_slice(data);
            png.extend_from_slice(&(data.len() as u32).to_be_bytes());
            png.extend_from_slice(&chunk);
            png.extend_from_slice(&crc32fast::hash(&chunk).to_be_bytes());
        }
        let mut buf = Vec::new();
        match decode_whole_into(&png, &mut buf) {
            Err(ItemErrorKind::TooLarge { width, height, .. }) => {
                assert_eq!((width, height), (70000, 70000))
            }
            other => panic!("expected TooLarge, got {other:?}"),
        }
        assert!(buf.capacity() < 1 << 20);
    }

    /// `bytes` through the `image` crate's PNG decoder alone: the pixels or the error.
    fn png_through_image(bytes: &[u8]) -> Result<Vec<u8>, ItemErrorKind> {
        let options = options();
        let decoder = Decoder {
            format: ImageFormat::Png,
            options: &options,
            memory: 1 << 30,
            pool: &BufferPool::new(1 << 30),
        };
        let mut pixels = vec![0xA5; 7];
        decoder.decode(PngView::new(bytes, false), &mut pixels)?;
        Ok(pixels)
    }

    /// A PNG of `samples` (`w` x `h` pixels of `color`), rows filtered with `filter`, its image
    /// data in chunks of at most `chunk` bytes.
    fn encode_png(
        samples: &[u8],
        (w, h): (u32, u32),
        color: png::ColorType,
        filter: png::Filter,
        chunk: usize,
    ) -> Vec<u8> {
        let mut out = Vec::new();
        let mut encoder = png::Encoder::new(&mut out, w, h);
        encoder.set_color(color);
        encoder.set_depth(png::BitDepth::Eight);
        encoder.set_filter(filter);
        let mut writer = encoder.write_header().expect("header");
        let mut stream = writer.stream_writer_with_size(chunk).expect("stream");
        std::io::Write::write_all(&mut stream, samples).expect("data");
        stream.finish().expect("finish");
        drop(writer);
        out
    }

    /// Photo-like samples: gradients, edges and noise, so that every filter predicts badly and
    /// well somewhere.
    fn png_samples(len: usize, seed: u32) -> Vec<u8> {
        let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..len)
            .map(|i| {
                state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                let noise = (state >> 16) as usize % 23;
                ((i / 3 + i / 97 * 5 + noise + if i % 41 < 7 { 120 } else { 0 }) % 256) as u8
            })
            .collect()
    }

    #[test]
    fn common_pngs_decode_directly_to_the_image_crate_pixels() {
        use png::{ColorType, Filter};
        let pool = BufferPool::new(1 << 30);
        let mut taken = 0;
        for (k, (color, channels)) in [
            (ColorType::Rgb, 3),
            (ColorType::Rgba, 4),
            (ColorType::Grayscale, 1),
            (ColorType::GrayscaleAlpha, 2),
        ]
        .into_iter()
        .enumerate()
        {
            for (w, h) in [(1, 1), (1, 9), (17, 1), (37, 29), (64, 48)] {
                let samples = png_samples(w * h * channels, (k * 131 + w * 7 + h) as u32);
                for filter in [
                    Filter::NoFilter,
                    Filter::Sub,
                    Filter::Up,
                    Filter::Avg,
                    Filter::Paeth,
                    Filter::Adaptive,
                ] {
                    for chunk in [1 << 20, 97] {
                        let png = encode_png(&samples, (w as u32, h as u32), color, filter, chunk);
                        let what = format!("{color:?} {w}x{h} {filter:?}, chunks of {chunk}");
                        let expected = png_through_image(&png).expect(&what);
                        let mut direct = vec![0x5A; 11];
                        let decoded = decode_png(&png, &options(), &mut direct, &pool, 1 << 30)
                            .unwrap_or_else(|| panic!("{what}: not taken"))
                            .expect(&what);
                        assert_eq!(decoded, Decoded::full(w as u32, h as u32), "{what}");
                        assert!(direct == expected, "{what}: the pixels differ");
                        let mut whole = Vec::new();
                        decode_whole_into(&png, &mut whole).expect(&what);
                        assert!(whole == expected, "{what}: decode differs");
                        taken += 1;
                    }
                }
            }
        }
        assert_eq!(taken, 4 * 5 * 6 * 2);
    }

    #[test]
    fn other_and_damaged_pngs_are_left_to_the_image_crate() {
        let pool = BufferPool::new(1 << 30);
        let (w, h) = (23u32, 19u32);
        let rgb = png_samples((w * h * 3) as usize, 5);
        let good = encode_png(&rgb, (w, h), png::ColorType::Rgb, png::Filter::Paeth, 64);
        let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
        // Files it does not take: 16 bits, a palette, a transparent colour.
        let encode_with = |samples: &[u8], setup: &dyn Fn(&mut png::Encoder<&mut Vec<u8>>)| {
            let mut out = Vec::new();
            let mut encoder = png::Encoder::new(&mut out, w, h);
            setup(&mut encoder);
            let mut writer = encoder.write_header().expect("header");
            writer.write_image_data(samples).expect("data");
            drop(writer);
            out
        };
        let wide = encode_with(&png_samples((w * h * 6) as usize, 6), &|e| {
            e.set_color(png::ColorType::Rgb);
            e.set_depth(png::BitDepth::Sixteen);
        });
        cases.push(("16 bits".into(), wide));
        let indexed = encode_with(&png_samples((w * h) as usize, 8), &|e| {
            e.set_color(png::ColorType::Indexed);
            e.set_palette(png_samples(256 * 3, 7));
        });
        cases.push(("a palette".into(), indexed));
        let keyed = encode_with(&rgb, &|e| {
            e.set_color(png::ColorType::Rgb);
            e.set_trns(vec![0, 1, 0, 2, 0, 3]);
        });
        cases.push(("a transparent colour".into(), keyed));
        let mut interlaced = good.clone();
        interlaced[28] = 1;
        let crc = crc32fast::hash(&interlaced[12..29]);
        interlaced[29..33].copy_from_slice(&crc.to_be_bytes());
        cases.push(("interlaced".into(), interlaced));
        // Damage: a changed byte (its checksum then wrong), the same with the checksum
        // mended (the data then inflates wrong or to another size), cuts.
        let idat = good.windows(4).position(|c| c == b"IDAT").expect("IDAT") + 4;
        for offset in [2, 10, 40] {
            let mut changed = good.clone();
            changed[idat + offset] ^= 0x21;
            cases.push((
                format!("byte {offset} of the data changed"),
                changed.clone(),
            ));
            let length = u32::from_be_bytes(good[idat - 8..idat - 4].try_into().expect("4"));
            let end = idat + length as usize;
            let crc = crc32fast::hash(&changed[idat - 4..end]);
            changed[end..end + 4].copy_from_slice(&crc.to_be_bytes());
            cases.push((format!("byte {offset} changed, checksum mended"), changed));
        }
        for cut in [good.len() - 12, good.len() - 1, idat + 30, idat] {
            cases.push((format!("cut at {cut}"), good[..cut].to_vec()));
        }
        for (what, png) in cases {
            let mut direct = Vec::new();
            assert!(
                decode_png(&png, &options(), &mut direct, &pool, 1 << 30).is_none(),
                "{what}: taken"
            );
            let mut whole = Vec::new();
            let decoded = decode_whole_into(&png, &mut whole).map(|_| whole);
            assert_eq!(decoded, png_through_image(&png), "{what}");
        }
        // An orientation to apply leaves the file to the other decoder too.
        let mut oriented = good[..good.len() - 12].to_vec();
        let exif = b"MM\x00\x2a\x00\x00\x00\x08\x00\x01\x01\x12\x00\x03\x00\x00\x00\x01\x00\x06\x00\x00\x00\x00\x00\x00";
        let mut chunk = b"eXIf".to_vec();
        chunk.extend_from_slice(exif);
        oriented.extend_from_slice(&(exif.len() as u32).to_be_bytes());
        oriented.extend_from_slice(&chunk);
        oriented.extend_from_slice(&crc32fast::hash(&chunk).to_be_bytes());
        oriented.extend_from_slice(&good[good.len() - 12..]);
        let mut direct = Vec::new();
        let turned = DecodeOptions {
            exif_orientation: true,
            ..options()
        };
        assert!(decode_png(&oriented, &turned, &mut direct, &pool, 1 << 30).is_none());
        assert!(decode_png(&oriented, &options(), &mut direct, &pool, 1 << 30).is_some());
    }
}
