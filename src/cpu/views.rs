//! The CPU rendition of views: one image decoded once, whole, then each view cut from the same
//! pixels with its own box, resized with Pillow's resampling from the planner's integer plan,
//! flipped, and given its colour calls ([`crate::views::apply_view_ops`]).

use rayon::prelude::*;

use super::decode::{decode, DecodeWindow, Decoded};
use super::probe::probe;
use super::resize::resize_into_slot;
use crate::error::{panic_message, Error, ItemError, ItemErrorKind, Result};
use crate::geometry::Geometry;
use crate::memory::BufferPool;
use crate::options::{DecodeOptions, ResizeMode, ResizeOptions};
use crate::resample::{ImagePlan, Kernels};
use crate::views::{apply_view_ops, ViewDraw, ViewGroup, Views};

/// One view of an image: what it drew and its pixels, `size` x `size` packed RGB8.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ViewImage {
    /// What the view drew.
    pub draw: ViewDraw,
    /// Its pixels, `draw.size` x `draw.size` x 3, rows first.
    pub pixels: Vec<u8>,
}

/// The geometry of a group's views: `RandomResizedCrop(size, scale, ratio, interpolation)`.
fn group_geometry(group: &ViewGroup, pillow_version: (u32, u32)) -> Geometry {
    let resize = ResizeOptions::default()
        .pillow_version(pillow_version.0, pillow_version.1)
        .mode(ResizeMode::RandomResizedCrop {
            height: group.size,
            width: group.size,
            scale: group.scale,
            ratio: group.ratio,
        })
        .interpolation(group.interpolation);
    Geometry::new(&resize)
}

/// One view cut from the decoded `pixels`.
fn cut_view(
    pixels: &[u8],
    decoded: Decoded,
    group: &ViewGroup,
    pillow_version: (u32, u32),
    draw: ViewDraw,
    kernels: Kernels,
) -> std::result::Result<ViewImage, ItemErrorKind> {
    let geometry = group_geometry(group, pillow_version);
    let (x, y) = geometry.axis_plans(
        decoded.source_width,
        decoded.source_height,
        Some(&draw.crop),
    );
    let mut plan = ImagePlan::default();
    geometry
        .plan_axes(&x, &y, 1, decoded.width, decoded.height, &mut plan)
        .map_err(|e| ItemErrorKind::Resize(e.to_string()))?;
    let size = group.size as usize;
    let mut out = vec![0u8; size * size * 3];
    let mut intermediate = Vec::new();
    resize_into_slot(
        pixels,
        decoded,
        (group.size, group.size, 0),
        &plan,
        draw.crop.flipped,
        (kernels, 1),
        &mut intermediate,
        &mut out,
    )?;
    apply_view_ops(&draw.ops, &mut out, size, size)
        .map_err(|e| ItemErrorKind::Resize(e.to_string()))?;
    Ok(ViewImage { draw, pixels: out })
}

/// Decodes `bytes` once, whole, and cuts every view of `views` from it.
fn render_unguarded(
    bytes: &[u8],
    decode_options: &DecodeOptions,
    views: &Views,
    index: usize,
    epoch: u64,
) -> std::result::Result<Vec<ViewImage>, ItemErrorKind> {
    let header = probe(bytes, decode_options)?;
    let pool = BufferPool::new(0);
    let whole = |_: u32, _: u32| DecodeWindow {
        reduction: 1,
        region: None,
    };
    let mut pixels = Vec::new();
    let decoded = decode(
        bytes,
        decode_options,
        &whole,
        &mut pixels,
        &pool,
        header.bytes_in_flight,
    )?;
    let draws = views.draw_all(decoded.source_width, decoded.source_height, index, epoch);
    let kernels = Kernels::detect();
    draws
        .into_par_iter()
        .map(|draw| {
            let group = views
                .groups
                .get(draw.group)
                .ok_or_else(|| ItemErrorKind::Resize(format!("no view group {}", draw.group)))?;
            cut_view(&pixels, decoded, group, views.pillow_version, draw, kernels)
        })
        .collect()
}

/// Every view of `views` of one encoded image (source index `index`, `epoch`): the image
/// decoded once (whole, as a PIL image is), each view cut from it with its own draws, in view
/// order. Exactly what torchvision's transforms give on the same image loaded with Pillow
/// (see `docs/views.md` for the one exception, the blur's float32 sums). A bad image is
/// [`Error::Item`] with the id `"<memory>"`.
///
/// ```
/// use gpufeed::views::Views;
/// let bytes = std::fs::read("assets/rocket.jpg")?;
/// let views = gpufeed::cpu::render_views(&bytes, &Default::default(), &Views::dinov2(), 0, 0)?;
/// assert_eq!(views.len(), 10);
/// assert_eq!(views[9].pixels.len(), 96 * 96 * 3);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn render_views(
    bytes: &[u8],
    decode_options: &DecodeOptions,
    views: &Views,
    index: usize,
    epoch: u64,
) -> Result<Vec<ViewImage>> {
    views.validate()?;
    let item_error = |kind| {
        Error::Item(ItemError {
            id: "<memory>".into(),
            index,
            kind,
        })
    };
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        render_unguarded(bytes, decode_options, views, index, epoch)
    }))
    .unwrap_or_else(|panic| Err(ItemErrorKind::DecoderPanic(panic_message(panic.as_ref()))))
    .map_err(item_error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::{DrawRange, Interpolation};
    use crate::views::ViewOps;

    fn rocket() -> Vec<u8> {
        std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/assets/rocket.jpg")).expect("rocket")
    }

    #[test]
    fn a_bad_image_is_an_item_error_not_a_panic() {
        for bytes in [&b""[..], b"not an image", &rocket()[..300]] {
            match render_views(bytes, &DecodeOptions::default(), &Views::dinov2(), 3, 0) {
                Err(Error::Item(e)) => assert_eq!((e.id.as_str(), e.index), ("<memory>", 3)),
                other => panic!("{:?}", other.map(|v| v.len())),
            }
        }
        let mut bad = Views::dinov2();
        bad.groups[0].count = 0;
        assert!(render_views(&rocket(), &DecodeOptions::default(), &bad, 0, 0).is_err());
    }

    #[test]
    fn a_view_of_the_whole_image_is_the_plain_resize() {
        // Scale 1 and the image's own ratio: the box is the whole image, as a stretch resize.
        let bytes = rocket();
        let group = ViewGroup {
            size: 64,
            scale: DrawRange::new(1.0, 1.0),
            ratio: DrawRange::new(640.0 / 427.0, 640.0 / 427.0),
            interpolation: Interpolation::Bicubic,
            count: 2,
            ops: ViewOps::none(),
        };
        let views = render_views(
            &bytes,
            &DecodeOptions::default(),
            &Views::new(vec![group]),
            0,
            0,
        )
        .expect("views");
        let resize = ResizeOptions::default()
            .mode(ResizeMode::stretch(64, 64))
            .interpolation(Interpolation::Bicubic);
        let mut want = vec![0u8; 64 * 64 * 3];
        crate::cpu::prepare_image(&bytes, &DecodeOptions::default(), &resize, &mut want)
            .expect("resize");
        for v in &views {
            assert_eq!((v.draw.crop.top, v.draw.crop.left), (0, 0), "{:?}", v.draw);
            assert_eq!(v.pixels, want);
        }
    }
}
