//! The planner: where an image of a given size lands in the output, as one integer plan per
//! axis ([`AxisPlan`]), from which everything else follows: the coefficients both lanes resample
//! with, the DCT scaling a JPEG decode may take, and the window of it the resize reads. Pure
//! arithmetic, shared by every decode lane, so what is decoded and what is read are decided in
//! one place.
//!
//! The default reproduces torchvision's `Resize(s)` + `CenterCrop(h, w)` on PIL images exactly
//! (the sizes and crop offsets are [`crate::resample`]'s: `int(s * long / short)`,
//! `int(round((resized - crop) / 2))` with Python's round, zero padding before
//! `(crop - resized) // 2` pixels). Training's `RandomResizedCrop` and `RandomHorizontalFlip`
//! draw each image's box and flip here too ([`Geometry::draw`]), with torchvision's algorithm,
//! from (seed, epoch, source index) alone; the box is cropped, then resized
//! (`F.resized_crop`), and the flip comes last.
//!
//! A patch-sequence output ([`crate::patches`]) plans each image's own size by the preset's rule
//! instead ([`patches`]): the same integer plans, of a size that differs from image to image.
//!
//! A JPEG decoded at 1/2, 1/4 or 1/8 of its size (`--dct-scaling`, an approximation) is
//! resized as Pillow resizes after `Image.draft`: the plans' region becomes a fractional box of
//! the reduced image ([`AxisPlan::reduced`]).

mod patches;

pub(crate) use patches::{PatchSizing, Placement};

use crate::options::{DrawRange, Interpolation, ResizeMode, ResizeOptions};
use crate::random::Draws;
use crate::resample::{
    letterbox_fit, torchvision_resize, AxisPlan, Filter, ImagePlan, PassOrder, PlanError,
    Resampling,
};

/// What was drawn for one image by the random transforms of training: the box of the source
/// image (in its pixels, after any EXIF turn) that torchvision's
/// `F.resized_crop(img, top, left, height, width, size)` takes, and whether `F.hflip` follows.
/// For modes other than [`ResizeMode::RandomResizedCrop`] the box is the whole image and the
/// mode's own geometry applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct CropDraw {
    /// First row of the box.
    pub top: u32,
    /// First column of the box.
    pub left: u32,
    /// Rows in the box.
    pub height: u32,
    /// Columns in the box.
    pub width: u32,
    /// Whether the output is mirrored left to right.
    pub flipped: bool,
}

/// A rectangle of an image in full-size pixels, end exclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SourceRect {
    pub x0: u32,
    pub y0: u32,
    pub x1: u32,
    pub y1: u32,
}

/// Decoded pixels a partial JPEG decode adds around the samples the resize reads: libjpeg-turbo
/// may compute the first row or column of a region differently (its fancy upsampling sees no
/// neighbour there), so one more, and one to spare.
const WINDOW_MARGIN: u32 = 2;

/// The output geometry of a pipeline: the resize mode (with the output size), the filter and the
/// random transforms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Geometry {
    pub mode: ResizeMode,
    pub width: u32,
    pub height: u32,
    pub interpolation: Interpolation,
    pub horizontal_flip: f64,
    pub seed: u64,
    /// The pass order of the Pillow version reproduced.
    pub pass_order: PassOrder,
    /// A patch-sequence output: each image's size from its preset's rule ([`patches`]).
    pub patches: Option<PatchSizing>,
}

impl ResizeOptions {
    /// What the random transforms draw for the image with source index `index` in `epoch`,
    /// `width` x `height` pixels (after any EXIF turn): exactly what a pipeline with these
    /// options draws for it, on any lane. `None` when nothing is random.
    pub fn draw(&self, width: u32, height: u32, index: usize, epoch: u64) -> Option<CropDraw> {
        Geometry::new(self).draw(width, height, index, epoch)
    }
}

impl Geometry {
    pub fn new(resize: &ResizeOptions) -> Geometry {
        let (height, width) = resize.output_size();
        Geometry {
            mode: resize.mode,
            width,
            height,
            interpolation: resize.interpolation,
            horizontal_flip: resize.horizontal_flip,
            seed: resize.seed,
            pass_order: PassOrder::for_pillow(resize.pillow_version.0, resize.pillow_version.1),
            patches: None,
        }
    }

    /// The same geometry with another seed.
    #[cfg(test)]
    pub fn with_seed(self, seed: u64) -> Geometry {
        Geometry { seed, ..self }
    }

    /// Whether images draw random transforms.
    pub fn is_random(&self) -> bool {
        self.mode.is_random() || self.horizontal_flip > 0.0
    }

    /// The random transforms of the image with source index `index` in `epoch`, `width` x
    /// `height` pixels: torchvision's `RandomResizedCrop.get_params` then
    /// `RandomHorizontalFlip`, in that order, from the image's own stream of draws. `None` when
    /// nothing is random.
    pub fn draw(&self, width: u32, height: u32, index: usize, epoch: u64) -> Option<CropDraw> {
        if !self.is_random() {
            return None;
        }
        let mut draws = Draws::for_image(self.seed, epoch, index);
        let (top, left, h, w) = match self.mode {
            ResizeMode::RandomResizedCrop { scale, ratio, .. } => {
                random_resized_crop(width, height, scale, ratio, &mut draws)
            }
            _ => (0, 0, height, width),
        };
        // torchvision: `torch.rand(1) < p`.
        let flipped = f64::from(draws.uniform_f32(0.0, 1.0)) < self.horizontal_flip;
        Some(CropDraw {
            top,
            left,
            height: h,
            width: w,
            flipped,
        })
    }

    /// Bytes of one output image as u8 RGB; of a patch-sequence output, the most an image's
    /// resized size takes (its place in a batch's staging).
    pub fn image_bytes(&self) -> usize {
        match &self.patches {
            Some(sizing) => sizing.image_bytes(),
            None => self.width as usize * self.height as usize * 3,
        }
    }

    /// The value of the output outside the image (a letterbox's bands; torchvision's zeros
    /// around a crop larger than the resize).
    pub fn pad(&self) -> u8 {
        match self.mode {
            ResizeMode::Letterbox { pad, .. } => pad,
            _ => 0,
        }
    }

    /// Pillow's resampling of the interpolation chosen.
    pub fn resampling(&self) -> Resampling {
        match self.interpolation {
            Interpolation::Nearest => Resampling::Nearest,
            Interpolation::Bicubic => Resampling::Filter(Filter::Bicubic),
            Interpolation::Lanczos => Resampling::Filter(Filter::Lanczos),
            Interpolation::Box => Resampling::Filter(Filter::Box),
            Interpolation::Hamming => Resampling::Filter(Filter::Hamming),
            Interpolation::Bilinear => Resampling::Filter(Filter::Bilinear),
        }
    }

    /// Where an image of `width` x `height` (full size, after any EXIF turn) lands in the
    /// output, given its random draws, as one integer plan per axis (x, y) in Pillow's terms:
    /// what is resized to how many samples, which of them are kept, where they land.
    pub fn axis_plans(
        &self,
        width: u32,
        height: u32,
        draw: Option<&CropDraw>,
    ) -> (AxisPlan, AxisPlan) {
        let (out_w, out_h) = (self.width, self.height);
        match self.mode {
            ResizeMode::RandomResizedCrop { .. } => {
                let b = draw.copied().unwrap_or(CropDraw {
                    top: 0,
                    left: 0,
                    height,
                    width,
                    flipped: false,
                });
                (
                    AxisPlan::crop_then_resize(b.left, b.width, out_w),
                    AxisPlan::crop_then_resize(b.top, b.height, out_h),
                )
            }
            ResizeMode::ShorterSideThenCenterCrop { shorter_side, .. } => {
                let (nw, nh) = torchvision_resize(width, height, shorter_side);
                (
                    AxisPlan::center_crop(width, nw, out_w),
                    AxisPlan::center_crop(height, nh, out_h),
                )
            }
            ResizeMode::Stretch { .. } => (
                AxisPlan::stretch(width, out_w),
                AxisPlan::stretch(height, out_h),
            ),
            ResizeMode::Letterbox { .. } => {
                let (nw, nh) = letterbox_fit(width, height, out_w, out_h);
                (
                    AxisPlan::letterbox(width, nw, out_w),
                    AxisPlan::letterbox(height, nh, out_h),
                )
            }
        }
    }

    /// The largest DCT-domain reduction (2, 4 or 8; 1 for none) that leaves the box each plan
    /// resizes with at least twice the output's samples along each axis (`len >= 2 * r *
    /// resized`), so the antialiased resize that follows still has a margin to filter.
    pub fn max_reduction(x: &AxisPlan, y: &AxisPlan) -> u32 {
        let fits = |p: &AxisPlan, r: u32| {
            let b = p.source_box();
            let len = u64::from(b.end.saturating_sub(b.start));
            len >= 2 * u64::from(r) * u64::from(p.resized) * u64::from(b.divisor)
        };
        [8, 4, 2]
            .into_iter()
            .find(|&r| fits(x, r) && fits(y, r))
            .unwrap_or(1)
    }

    /// Plans the resample of an image of `width` x `height` (full size) decoded at
    /// 1/`reduction` into `decoded_width` x `decoded_height` pixels, into `plan`.
    #[cfg(test)]
    #[allow(clippy::too_many_arguments)]
    pub fn plan_image(
        &self,
        width: u32,
        height: u32,
        draw: Option<&CropDraw>,
        reduction: u32,
        decoded_width: u32,
        decoded_height: u32,
        plan: &mut ImagePlan,
    ) -> Result<(), PlanError> {
        let (x, y) = self.axis_plans(width, height, draw);
        self.plan_axes(&x, &y, reduction, decoded_width, decoded_height, plan)
    }

    /// [`Geometry::plan_image`] of an image whose axes `x` and `y` plan
    /// ([`Geometry::axis_plans`]), planned once for the decode and the resize alike.
    pub fn plan_axes(
        &self,
        x: &AxisPlan,
        y: &AxisPlan,
        reduction: u32,
        decoded_width: u32,
        decoded_height: u32,
        plan: &mut ImagePlan,
    ) -> Result<(), PlanError> {
        let (x, y) = (
            x.reduced(reduction, decoded_width),
            y.reduced(reduction, decoded_height),
        );
        match (&self.patches, self.resampling()) {
            (Some(sizing), Resampling::Filter(filter)) if sizing.is_torchvision() => {
                plan.plan_torchvision(&x, &y, filter)
            }
            (_, resampling) => plan.plan(&x, &y, resampling, self.pass_order),
        }
    }

    /// The part of an image of `width` x `height` (full size), decoded at 1/`reduction`, that
    /// `plan`'s resample reads: the source samples of every kept output's taps, plus
    /// [`WINDOW_MARGIN`] decoded pixels on each side, in full-size pixels. `None` when that is
    /// the whole image.
    pub fn decode_window(
        plan: &ImagePlan,
        reduction: u32,
        width: u32,
        height: u32,
    ) -> Option<SourceRect> {
        let r = reduction.max(1);
        let (xs, ys) = plan.source_span();
        let widen = |span: std::ops::Range<u32>, len: u32| {
            let first = span.start.saturating_sub(WINDOW_MARGIN).saturating_mul(r);
            let end = span.end.saturating_add(WINDOW_MARGIN).saturating_mul(r);
            (first.min(len), end.min(len))
        };
        let (x0, x1) = widen(xs, width);
        let (y0, y1) = widen(ys, height);
        let whole = x0 == 0 && y0 == 0 && x1 == width && y1 == height;
        (!whole && x1 > x0 && y1 > y0).then_some(SourceRect { x0, y0, x1, y1 })
    }
}

/// Python's `round` of a non-negative float: halves go to the even neighbour.
fn round_half_even(v: f64) -> u64 {
    v.round_ties_even() as u64
}

/// torchvision's `RandomResizedCrop.get_params(img, scale, ratio)` for a `width` x `height`
/// image: ten tries of an area `A * U(scale)` and a ratio `exp(U(log ratio))` (single precision,
/// as PyTorch draws them), `w = round(sqrt(area * ratio))`, `h = round(sqrt(area / ratio))`,
/// kept if it fits, at `randint(0, H - h)`, `randint(0, W - w)`; else the centre box with the
/// ratio clamped into the range. Returns `(top, left, height, width)`.
pub(crate) fn random_resized_crop(
    width: u32,
    height: u32,
    scale: DrawRange,
    ratio: DrawRange,
    draws: &mut Draws,
) -> (u32, u32, u32, u32) {
    let (w, h) = (u64::from(width), u64::from(height));
    let area = (w * h) as f64;
    // torch.log(torch.tensor(ratio)): the bounds as float32, their logarithms in float32.
    let log_ratio = ((ratio.min as f32).ln(), (ratio.max as f32).ln());
    for _ in 0..10 {
        let target_area = area * f64::from(draws.uniform_f32(scale.min as f32, scale.max as f32));
        let aspect = f64::from(draws.uniform_f32(log_ratio.0, log_ratio.1).exp());
        let cw = round_half_even((target_area * aspect).sqrt());
        let ch = round_half_even((target_area / aspect).sqrt());
        if 0 < cw && cw <= w && 0 < ch && ch <= h {
            let top = draws.below(h - ch + 1);
            let left = draws.below(w - cw + 1);
            return (top as u32, left as u32, ch as u32, cw as u32);
        }
    }
    // The centre fallback.
    let in_ratio = w as f64 / h as f64;
    let (cw, ch) = if in_ratio < ratio.min {
        (w, round_half_even(w as f64 / ratio.min).clamp(1, h))
    } else if in_ratio > ratio.max {
        (round_half_even(h as f64 * ratio.max).clamp(1, w), h)
    } else {
        (w, h)
    };
    (
        ((h - ch) / 2) as u32,
        ((w - cw) / 2) as u32,
        ch as u32,
        cw as u32,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn torchvision(shorter_side: u32, crop: u32) -> Geometry {
        Geometry::new(&ResizeOptions::default().mode(ResizeMode::center_crop(shorter_side, crop)))
    }

    fn plan(g: &Geometry, w: u32, h: u32, draw: Option<&CropDraw>, r: u32) -> ImagePlan {
        let mut p = ImagePlan::default();
        g.plan_image(w, h, draw, r, w.div_ceil(r), h.div_ceil(r), &mut p)
            .expect("plan");
        p
    }

    #[test]
    fn torchvision_geometry() {
        // 500x375 -> Resize(256) -> 341x256; CenterCrop(224): left = round(58.5) = 58 (ties to even).
        let (x, y) = torchvision(256, 224).axis_plans(500, 375, None);
        assert_eq!(
            (x.resized, x.out_first, x.out_len, x.dst_offset),
            (341, 58, 224, 0)
        );
        assert_eq!(
            (y.resized, y.out_first, y.out_len, y.dst_offset),
            (256, 16, 224, 0)
        );
        // 375x500 -> 256x341: top = round(58.5) = 58.
        let (_, y) = torchvision(256, 224).axis_plans(375, 500, None);
        assert_eq!(y.out_first, 58);
        // 256x333 stays 256x333; CenterCrop(202): top = round(65.5) = 66 (ties to even).
        let (x, y) = torchvision(256, 202).axis_plans(256, 333, None);
        assert!(!x.is_resampled() && !y.is_resampled());
        assert_eq!(y.out_first, 66);
        // 256x331: top = round(64.5) = 64, not 65.
        assert_eq!(
            torchvision(256, 202).axis_plans(256, 331, None).1.out_first,
            64
        );
    }

    #[test]
    fn crop_larger_than_resized_pads_like_torchvision() {
        // Resize(100) of 100x100 then CenterCrop(111): 5 zeros before (11 // 2), 6 after.
        let (x, y) = torchvision(100, 111).axis_plans(100, 100, None);
        for p in [x, y] {
            assert_eq!((p.dst_offset, p.out_len, p.out_first), (5, 100, 0));
        }
    }

    #[test]
    fn dct_reduction_keeps_a_twofold_margin() {
        let g = torchvision(256, 224);
        let r = |w, h| {
            let (x, y) = g.axis_plans(w, h, None);
            Geometry::max_reduction(&x, &y)
        };
        assert_eq!(r(500, 375), 1);
        assert_eq!(r(1411, 1411), 2); // 1411 px to 256: 5.5x, 2.76x of 2
        assert_eq!(r(4000, 3000), 4); // 3000 to 256: 11.7x
        assert_eq!(r(12000, 9000), 8);
        // A random crop's box decides, not the image.
        let t = train(224);
        let d = CropDraw {
            top: 0,
            left: 0,
            height: 900,
            width: 1000,
            flipped: false,
        };
        let (x, y) = t.axis_plans(4000, 3000, Some(&d));
        assert_eq!(Geometry::max_reduction(&x, &y), 2);
    }

    #[test]
    fn letterbox_and_stretch_plans() {
        let g = Geometry::new(&ResizeOptions::default().mode(ResizeMode::letterbox(640, 640, 114)));
        let (x, y) = g.axis_plans(1280, 720, None);
        assert_eq!((x.dst_offset, x.out_len), (0, 640));
        assert_eq!((y.dst_offset, y.out_len, y.resized), (140, 360, 360));
        assert_eq!(g.pad(), 114);
        let s = Geometry::new(&ResizeOptions::default().mode(ResizeMode::stretch(224, 160)));
        let (x, y) = s.axis_plans(10, 600, None);
        assert_eq!((x.resized, y.resized), (160, 224));
    }

    fn train(size: u32) -> Geometry {
        Geometry::new(&ResizeOptions::imagenet_train(size, 7))
    }

    #[test]
    fn random_crops_fit_and_depend_on_seed_epoch_and_index_alone() {
        let g = train(224);
        let mut flipped = 0;
        let mut fallbacks = 0;
        for index in 0..20_000 {
            let (w, h) = (
                100 + (index * 37 % 900) as u32,
                80 + (index * 53 % 700) as u32,
            );
            let d = g.draw(w, h, index, 3).expect("random");
            assert_eq!(Some(d), g.draw(w, h, index, 3), "the same draw again");
            assert!(d.width >= 1 && d.height >= 1);
            assert!(
                d.left + d.width <= w && d.top + d.height <= h,
                "{d:?} in {w}x{h}"
            );
            let area = (d.width * d.height) as f64 / (w * h) as f64;
            let ratio = d.width as f64 / d.height as f64;
            // Up to rounding, inside torchvision's ranges (or its centre fallback).
            if !(0.07..=1.0).contains(&area) || !(0.70..=1.45).contains(&ratio) {
                fallbacks += 1;
            }
            flipped += usize::from(d.flipped);
        }
        assert!(fallbacks < 200, "{fallbacks} draws outside the ranges");
        assert!(
            (9_600..10_400).contains(&flipped),
            "{flipped} of 20000 flipped"
        );
        // Another epoch, index or seed draws another box.
        let a = g.draw(500, 375, 1, 0);
        assert_ne!(a, g.draw(500, 375, 1, 1));
        assert_ne!(a, g.draw(500, 375, 2, 0));
        assert_ne!(a, train(224).with_seed(8).draw(500, 375, 1, 0));
    }

    #[test]
    fn an_image_too_narrow_for_the_ratios_takes_the_centre_fallback() {
        // 4000x10 can fit no box of ratio 3/4..4/3 with 8% of its area: torchvision's fallback
        // keeps the height and clamps the ratio to 4/3: w = round(10 * 4 / 3) = 13, centred.
        let d = train(64).draw(4000, 10, 0, 0).expect("random");
        assert_eq!((d.top, d.height, d.width), (0, 10, 13));
        assert_eq!(d.left, (4000 - 13) / 2);
        let d = train(64).draw(10, 600, 5, 0).expect("random");
        assert_eq!((d.left, d.width, d.height), (0, 10, 13));
    }

    #[test]
    fn a_random_crop_is_planned_and_windowed_as_its_box() {
        let g = train(224);
        let d = g.draw(1000, 800, 4, 0).expect("random");
        let (x, y) = g.axis_plans(1000, 800, Some(&d));
        assert_eq!((x.src_offset, x.src_len, x.resized), (d.left, d.width, 224));
        assert_eq!((y.src_offset, y.src_len, y.resized), (d.top, d.height, 224));
        // The taps never leave the box (crop, then resize); the window is the box and the margin.
        let p = plan(&g, 1000, 800, Some(&d), 1);
        let (xs, ys) = p.source_span();
        assert_eq!((xs.start, xs.end), (d.left, d.left + d.width));
        assert_eq!((ys.start, ys.end), (d.top, d.top + d.height));
        if let Some(w) = Geometry::decode_window(&p, 1, 1000, 800) {
            assert_eq!(w.x0, d.left.saturating_sub(2));
            assert_eq!(w.x1, (d.left + d.width + 2).min(1000));
            assert_eq!(w.y1, (d.top + d.height + 2).min(800));
        }
        assert!(Geometry::new(&ResizeOptions::default())
            .draw(500, 375, 0, 0)
            .is_none());
    }

    #[test]
    fn the_window_is_what_the_taps_read() {
        let g = torchvision(256, 224);
        let p = plan(&g, 1000, 500, None, 1);
        let w = Geometry::decode_window(&p, 1, 1000, 500).expect("a partial window");
        // 1000x500 -> 512x256, crop 224 from x = 144: source x from 144 * 500 / 256 = 281.25,
        // the bilinear filter (support 1.95) reaching two more samples, and the margin.
        let (xs, ys) = p.source_span();
        assert_eq!((w.x0, w.x1), (xs.start - 2, xs.end + 2));
        assert!((278..281).contains(&xs.start), "{xs:?}");
        assert!(ys.start <= 1 + 31 * 2 && w.y0 < ys.start);
        assert!(
            w.x0 > 0 && w.x1 < 1000,
            "the sides of the long axis are skipped"
        );
        // At 1/2 the span is counted in reduced pixels and scaled back.
        let big = plan(&g, 4000, 2000, None, 2);
        let w2 = Geometry::decode_window(&big, 2, 4000, 2000).expect("window");
        let (xs, _) = big.source_span();
        assert_eq!((w2.x0, w2.x1), ((xs.start - 2) * 2, (xs.end + 2) * 2));
        let stretch = Geometry::new(&ResizeOptions::default().mode(ResizeMode::stretch(100, 100)));
        let p = plan(&stretch, 300, 200, None, 1);
        assert_eq!(
            Geometry::decode_window(&p, 1, 300, 200),
            None,
            "a stretch reads everything"
        );
    }
}
