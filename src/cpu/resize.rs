//! Decoded pixels to the output size on the CPU, written straight into the image's slot of the
//! staging buffer.
//!
//! The planner ([`crate::geometry`]) says where the image lands; only the part of the resized
//! image that survives the crop is computed, by handing fast_image_resize the crop box in source
//! coordinates (sample positions and filter support are those of the full resize). Resampling is
//! antialiased like Pillow's.

use fast_image_resize::images::{
    TypedCroppedImage, TypedCroppedImageMut, TypedImage, TypedImageRef,
};
use fast_image_resize::pixels::{U8x3, U8};
use fast_image_resize::{FilterType, PixelTrait, ResizeAlg, ResizeOptions, Resizer};

use super::decode::Decoded;
use crate::error::ItemErrorKind;
use crate::geometry::{CropDraw, Geometry, Placement};
use crate::options::Interpolation;

fn resize_alg(interpolation: Interpolation) -> ResizeAlg {
    match interpolation {
        Interpolation::Bilinear => ResizeAlg::Convolution(FilterType::Bilinear),
        Interpolation::Bicubic => ResizeAlg::Convolution(FilterType::CatmullRom),
        Interpolation::Lanczos => ResizeAlg::Convolution(FilterType::Lanczos3),
        Interpolation::Nearest => ResizeAlg::Nearest,
    }
}

/// Resizes the decoded `pixels` into `slot` (`geometry.width * geometry.height * 3` bytes, RGB8)
/// as the image's random draws say (its box, and a mirror left to right last). Gray images are
/// resized as one channel into `gray`, this thread's scratch, then spread to RGB.
pub(crate) fn resize_into_slot(
    pixels: &[u8],
    decoded: Decoded,
    geometry: &Geometry,
    draw: Option<&CropDraw>,
    resizer: &mut Resizer,
    gray: &mut Vec<u8>,
    slot: &mut [u8],
) -> Result<(), ItemErrorKind> {
    resize_unflipped(pixels, decoded, geometry, draw, resizer, gray, slot)?;
    if draw.is_some_and(|d| d.flipped) {
        let row = geometry.width as usize * 3;
        for line in slot.chunks_exact_mut(row) {
            // Reverse the pixels, then each pixel's reversed channels back.
            line.reverse();
            for pixel in line.chunks_exact_mut(3) {
                pixel.swap(0, 2);
            }
        }
    }
    Ok(())
}

fn resize_unflipped(
    pixels: &[u8],
    decoded: Decoded,
    geometry: &Geometry,
    draw: Option<&CropDraw>,
    resizer: &mut Resizer,
    gray: &mut Vec<u8>,
    slot: &mut [u8],
) -> Result<(), ItemErrorKind> {
    // The geometry is that of the full-size image; a DCT-reduced decode shrinks the source box.
    let r = decoded.reduction.max(1);
    let mut placement = geometry.place(decoded.source_width, decoded.source_height, draw);
    if r > 1 {
        let (w, h) = (decoded.width as f64, decoded.height as f64);
        let scale = 1.0 / r as f64;
        placement.src_left = (placement.src_left * scale).min(w);
        placement.src_top = (placement.src_top * scale).min(h);
        placement.src_width = (placement.src_width * scale).min(w - placement.src_left);
        placement.src_height = (placement.src_height * scale).min(h - placement.src_top);
        // A reduced box is fractional: resized with the filter reaching past it (as close to
        // the full-size crop as a reduced decode gets).
        placement.isolated = false;
    }
    match decoded.channels {
        3 => resample::<U8x3>(pixels, decoded, &placement, geometry, resizer, slot),
        1 => {
            gray.resize(geometry.width as usize * geometry.height as usize, 0);
            resample::<U8>(pixels, decoded, &placement, geometry, resizer, gray)?;
            for (rgb, &g) in slot.chunks_exact_mut(3).zip(gray.iter()) {
                rgb.fill(g);
            }
            Ok(())
        }
        n => Err(ItemErrorKind::Resize(format!("{n} channels a pixel"))),
    }
}

/// Resamples `placement`'s source box of `pixels` into its output box of `out` (the whole
/// output, padded outside the box).
fn resample<P: PixelTrait<Component = u8>>(
    pixels: &[u8],
    decoded: Decoded,
    placement: &Placement,
    geometry: &Geometry,
    resizer: &mut Resizer,
    out: &mut [u8],
) -> Result<(), ItemErrorKind> {
    let fail =
        |what: &str, e: &dyn std::fmt::Display| ItemErrorKind::Resize(format!("{what}: {e}"));
    let src = TypedImageRef::<P>::from_buffer(decoded.width, decoded.height, pixels)
        .map_err(|e| fail("source", &e))?;
    if placement.isolated {
        // torchvision's crop, then resize: the box is an image of its own.
        let boxed = TypedCroppedImage::from_ref(
            &src,
            placement.src_left as u32,
            placement.src_top as u32,
            placement.src_width as u32,
            placement.src_height as u32,
        )
        .map_err(|e| fail("crop box", &e))?;
        let mut dst = TypedImage::<P>::from_buffer(geometry.width, geometry.height, out)
            .map_err(|e| fail("destination", &e))?;
        let options = ResizeOptions::new().resize_alg(resize_alg(geometry.interpolation));
        return resizer
            .resize_typed(&boxed, &mut dst, &options)
            .map_err(|e| fail("resample", &e));
    }
    let covers_all = placement.dst_left == 0
        && placement.dst_top == 0
        && placement.dst_width == geometry.width
        && placement.dst_height == geometry.height;
    if !covers_all {
        out.fill(placement.pad);
    }
    let dst = TypedImage::<P>::from_buffer(geometry.width, geometry.height, out)
        .map_err(|e| fail("destination", &e))?;
    let mut dst = TypedCroppedImageMut::new(
        dst,
        placement.dst_left,
        placement.dst_top,
        placement.dst_width,
        placement.dst_height,
    )
    .map_err(|e| fail("placement", &e))?;
    let options = ResizeOptions::new()
        .resize_alg(resize_alg(geometry.interpolation))
        .crop(
            placement.src_left,
            placement.src_top,
            placement.src_width,
            placement.src_height,
        );
    resizer
        .resize_typed(&src, &mut dst, &options)
        .map_err(|e| fail("resample", &e))
}
