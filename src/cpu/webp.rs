//! Still WebP images through libwebp, Pillow's decoder (the same pixels): decoded straight to
//! packed RGB into the lane's reusable buffer, with no RGBA round trip and no copy, and only the
//! window the resize reads (libwebp's cropping: no row below it is decoded, and a lossy file's
//! colour conversion skips the columns beside it). An image with alpha loses it, as Pillow's
//! `convert("RGB")` drops it (libwebp's RGB output is the RGBA output's colour channels).

use super::decode::{DecodeWindow, Decoded, WindowFor};
use super::probe::check_size;
use crate::error::ItemErrorKind;
use crate::geometry::SourceRect;
use crate::options::DecodeOptions;

/// Decodes a still WebP into `pixels` as packed RGB8. `None` for what libwebp's simple decoder
/// does not take (animations, damaged files): the `image` crate decodes those, or says what is
/// wrong with them.
///
/// Only the [`DecodeWindow`] `window` gives at full size is decoded (with a margin, see
/// [`crop_of`]); the rest of `pixels` is stale, as after a JPEG's partial decode.
pub(crate) fn decode_webp(
    bytes: &[u8],
    options: &DecodeOptions,
    window: WindowFor,
    pixels: &mut Vec<u8>,
) -> Option<Result<Decoded, ItemErrorKind>> {
    let features = webp::BitstreamFeatures::new(bytes)?;
    if features.has_animation() {
        return None;
    }
    let (width, height) = (features.width(), features.height());
    if let Err(e) = check_size(u64::from(width), u64::from(height), options) {
        return Some(Err(e));
    }
    let stride = (width as usize).checked_mul(3)?;
    let len = stride.checked_mul(height as usize)?;
    pixels.resize(len, 0);
    let crop = match window(width, height) {
        DecodeWindow {
            reduction: 1,
            region: Some(rect),
        } => crop_of(rect, width, height),
        _ => None,
    };
    match crop {
        Some(crop) => decode_rgb_cropped(bytes, stride, crop, &mut pixels[..len])?,
        None => decode_rgb_into(bytes, stride, &mut pixels[..len])?,
    }
    Some(Ok(Decoded::full(width, height)))
}

/// The pixels a WebP decode is cut to: left, top, width, height.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Crop {
    left: u32,
    top: u32,
    width: u32,
    height: u32,
}

/// Rows and columns kept beyond the window: libwebp's fancy chroma upsampling reads the
/// neighbouring chroma sample (two pixels away at most), which at a crop's edge it mirrors; two
/// more pixels on each side keep the window's own pixels those of the whole decode.
const CROP_MARGIN: u32 = 2;

/// The crop of a `width` x `height` image that decodes `rect` as the whole decode would: `rect`
/// widened by [`CROP_MARGIN`], its top-left corner on even coordinates (libwebp snaps a lossy
/// file's crop there). `None` when that is the whole image.
fn crop_of(rect: SourceRect, width: u32, height: u32) -> Option<Crop> {
    let left = rect.x0.saturating_sub(CROP_MARGIN) & !1;
    let top = rect.y0.saturating_sub(CROP_MARGIN) & !1;
    let right = rect.x1.saturating_add(CROP_MARGIN).min(width);
    let bottom = rect.y1.saturating_add(CROP_MARGIN).min(height);
    let crop = Crop {
        left,
        top,
        width: right.checked_sub(left).filter(|&w| w > 0)?,
        height: bottom.checked_sub(top).filter(|&h| h > 0)?,
    };
    let whole = crop.width == width && crop.height == height;
    (!whole).then_some(crop)
}

/// libwebp's `WebPDecode` of `crop` only, as packed RGB written where those pixels lie in the
/// whole image's rows of `stride` bytes in `out`; `None` when libwebp refuses the file.
#[allow(unsafe_code)]
fn decode_rgb_cropped(bytes: &[u8], stride: usize, crop: Crop, out: &mut [u8]) -> Option<()> {
    use libwebp_sys::{VP8StatusCode, WebPDecoderConfig, WEBP_CSP_MODE};
    let int = |v: usize| std::ffi::c_int::try_from(v).ok();
    let offset = (crop.top as usize)
        .checked_mul(stride)?
        .checked_add(crop.left as usize * 3)?;
    // The crop's rows must lie in `out` (checked again by libwebp against the size given).
    let last_row_end = (crop.top as usize + crop.height as usize - 1)
        .checked_mul(stride)?
        .checked_add((crop.left as usize + crop.width as usize) * 3)?;
    if last_row_end > out.len() {
        return None;
    }
    let target = out.get_mut(offset..)?;
    let mut config = WebPDecoderConfig::new().ok()?;
    config.options.use_cropping = 1;
    config.options.crop_left = int(crop.left as usize)?;
    config.options.crop_top = int(crop.top as usize)?;
    config.options.crop_width = int(crop.width as usize)?;
    config.options.crop_height = int(crop.height as usize)?;
    config.output.colorspace = WEBP_CSP_MODE::MODE_RGB;
    config.output.is_external_memory = 1;
    config.output.u.RGBA = libwebp_sys::WebPRGBABuffer {
        rgba: target.as_mut_ptr(),
        stride: int(stride)?,
        size: target.len(),
    };
    // SAFETY: `bytes` is a live slice passed with its length, which libwebp reads no further
    // than. The output is `target`, a live slice of `out` borrowed for the call, given with its
    // length: libwebp checks that the crop's rows of `stride` bytes fit in that size before it
    // writes, and writes nowhere else (the memory is external: it allocates none for the
    // pixels). The config lives on this stack frame for the call; libwebp keeps no pointer into
    // it, the input or the output after returning, and `WebPFreeDecBuffer` frees only what it
    // allocated itself (nothing for external memory).
    let status = unsafe {
        let status = libwebp_sys::WebPDecode(bytes.as_ptr(), bytes.len(), &mut config);
        libwebp_sys::WebPFreeDecBuffer(&mut config.output);
        status
    };
    (status == VP8StatusCode::VP8_STATUS_OK).then_some(())
}

/// libwebp's `WebPDecodeRGBInto`: the whole image as packed RGB rows of `stride` bytes into
/// `out`; `None` when libwebp refuses the file (or `out` does not hold the image).
#[allow(unsafe_code)]
fn decode_rgb_into(bytes: &[u8], stride: usize, out: &mut [u8]) -> Option<()> {
    let stride = std::ffi::c_int::try_from(stride).ok()?;
    // SAFETY: `bytes` and `out` are live slices whose pointers and lengths are passed together;
    // libwebp reads at most `bytes.len()` bytes, and writes only inside `out.len()` bytes (it
    // checks that `stride * height` fits in the size given and fails otherwise). It keeps
    // neither pointer after returning.
    let written = unsafe {
        libwebp_sys::WebPDecodeRGBInto(
            bytes.as_ptr(),
            bytes.len(),
            out.as_mut_ptr(),
            out.len(),
            stride,
        )
    };
    (!written.is_null()).then_some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lossy and a lossless WebP of a photo's odd-sized crop, without and with alpha.
    fn webps() -> Vec<(String, Vec<u8>, u32, u32)> {
        let photo = image::open("assets/astronaut.png")
            .expect("photo")
            .to_rgba8();
        let (w, h) = (301, 227);
        let mut crop = image::imageops::crop_imm(&photo, 37, 51, w, h).to_image();
        let rgb = image::DynamicImage::ImageRgba8(crop.clone()).to_rgb8();
        let opaque = webp::Encoder::from_rgb(rgb.as_raw(), w, h);
        let mut files = vec![
            ("lossy".into(), opaque.encode(80.0).to_vec(), w, h),
            ("lossless".into(), opaque.encode_lossless().to_vec(), w, h),
        ];
        for (k, pixel) in crop.pixels_mut().enumerate() {
            pixel[3] = (k * 7 % 256) as u8;
        }
        let alpha = webp::Encoder::from_rgba(crop.as_raw(), w, h);
        files.push(("lossy, alpha".into(), alpha.encode(80.0).to_vec(), w, h));
        files.push((
            "lossless, alpha".into(),
            alpha.encode_lossless().to_vec(),
            w,
            h,
        ));
        files
    }

    #[test]
    fn a_cropped_decode_gives_the_whole_decodes_pixels_in_its_window() {
        let options = DecodeOptions::default();
        let mut compared = 0;
        for (name, bytes, w, h) in webps() {
            let whole_window = |_, _| DecodeWindow {
                reduction: 1,
                region: None,
            };
            let mut whole = Vec::new();
            let decoded = decode_webp(&bytes, &options, &whole_window, &mut whole);
            assert_eq!(decoded, Some(Ok(Decoded::full(w, h))), "{name}");
            // Windows at odd and even offsets, at the edges and inside.
            for (x0, y0, x1, y1) in [
                (1, 1, 40, 30),
                (0, 0, 300, 200),
                (57, 33, 158, 101),
                (100, 100, w, h),
                (3, 120, 299, 226),
                (150, 0, 151, 1),
            ] {
                let rect = SourceRect { x0, y0, x1, y1 };
                let window = move |_, _| DecodeWindow {
                    reduction: 1,
                    region: Some(rect),
                };
                let mut part = vec![7u8; whole.len()];
                let decoded = decode_webp(&bytes, &options, &window, &mut part);
                assert_eq!(decoded, Some(Ok(Decoded::full(w, h))), "{name}");
                for y in y0..y1 {
                    let row = (y * w * 3) as usize;
                    let span = row + x0 as usize * 3..row + x1 as usize * 3;
                    assert!(
                        part[span.clone()] == whole[span],
                        "{name}: row {y} of {rect:?} differs"
                    );
                }
                compared += 1;
            }
        }
        assert_eq!(compared, 24);
    }

    #[test]
    fn the_crop_keeps_a_margin_on_even_coordinates() {
        let rect = |x0, y0, x1, y1| SourceRect { x0, y0, x1, y1 };
        let crop = |left, top, width, height| Crop {
            left,
            top,
            width,
            height,
        };
        assert_eq!(
            crop_of(rect(5, 9, 50, 60), 100, 100),
            Some(crop(2, 6, 50, 56))
        );
        assert_eq!(crop_of(rect(1, 0, 99, 98), 100, 100), None);
        assert_eq!(
            crop_of(rect(10, 10, 99, 99), 100, 100),
            Some(crop(8, 8, 92, 92))
        );
    }
}
