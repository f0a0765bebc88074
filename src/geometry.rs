//! The planner: where an image of a given size lands in the output, which part of it the resize
//! reads, and how much of it a JPEG decode may skip. Pure arithmetic, shared by every decode
//! lane, so what is decoded and what is read are decided in one place.
//!
//! The default reproduces torchvision's `Resize(s)` + `CenterCrop(h, w)` on PIL images exactly:
//! the long side is `int(s * long / short)`, the crop offset `int(round((resized - crop) / 2))`
//! with Python's round (ties to even), and a crop larger than the resized image pads with zeros
//! before `(crop - resized) // 2` pixels. Training's `RandomResizedCrop` and
//! `RandomHorizontalFlip` draw each image's box and flip here too ([`Geometry::draw`]), with
//! torchvision's algorithm, from (seed, epoch, source index) alone.

use crate::options::{DrawRange, Interpolation, ResizeMode, ResizeOptions};
use crate::pillow::{torchvision_resize, AxisPlan};
use crate::random::Draws;

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

/// A source rectangle (fractional, source pixels) and the output rectangle it is resized into;
/// the output outside it is filled with `pad`. An `isolated` rectangle (a random crop's box) is
/// resized as an image of its own: the filter reads nothing outside it (torchvision's crop, then
/// resize); otherwise the filter reaches past its edges as far as the image goes (a resize of
/// the whole image, of which a part is kept).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Placement {
    pub src_left: f64,
    pub src_top: f64,
    pub src_width: f64,
    pub src_height: f64,
    pub dst_left: u32,
    pub dst_top: u32,
    pub dst_width: u32,
    pub dst_height: u32,
    pub pad: u8,
    pub isolated: bool,
}

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

    /// Bytes of one output image as u8 RGB.
    pub fn image_bytes(&self) -> usize {
        self.width as usize * self.height as usize * 3
    }

    /// Where an image of `width` x `height` lands in the output, given its random draws.
    pub fn place(&self, width: u32, height: u32, draw: Option<&CropDraw>) -> Placement {
        let (w, h) = (width as f64, height as f64);
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
                Placement {
                    src_left: b.left as f64,
                    src_top: b.top as f64,
                    src_width: b.width as f64,
                    src_height: b.height as f64,
                    dst_left: 0,
                    dst_top: 0,
                    dst_width: out_w,
                    dst_height: out_h,
                    pad: 0,
                    isolated: true,
                }
            }
            ResizeMode::ShorterSideThenCenterCrop { shorter_side, .. } => {
                let s = shorter_side as u64;
                // torchvision: the long side is int(s * long / short), computed in floating point.
                let long =
                    |side: u32, short: f64| (((s * side as u64) as f64 / short) as u64).max(1);
                let (nw, nh) = if width <= height {
                    (s, long(height, w))
                } else {
                    (long(width, h), s)
                };
                let (src_left, src_width, dst_left, dst_width) = center_crop_axis(w, nw, out_w);
                let (src_top, src_height, dst_top, dst_height) = center_crop_axis(h, nh, out_h);
                Placement {
                    src_left,
                    src_top,
                    src_width,
                    src_height,
                    dst_left,
                    dst_top,
                    dst_width,
                    dst_height,
                    pad: 0,
                    isolated: false,
                }
            }
            ResizeMode::Stretch { .. } => Placement {
                src_left: 0.0,
                src_top: 0.0,
                src_width: w,
                src_height: h,
                dst_left: 0,
                dst_top: 0,
                dst_width: out_w,
                dst_height: out_h,
                pad: 0,
                isolated: false,
            },
            ResizeMode::Letterbox { pad, .. } => {
                let scale = (out_w as f64 / w).min(out_h as f64 / h);
                let nw = ((w * scale).round() as u32).clamp(1, out_w);
                let nh = ((h * scale).round() as u32).clamp(1, out_h);
                Placement {
                    src_left: 0.0,
                    src_top: 0.0,
                    src_width: w,
                    src_height: h,
                    dst_left: (out_w - nw) / 2,
                    dst_top: (out_h - nh) / 2,
                    dst_width: nw,
                    dst_height: nh,
                    pad,
                    isolated: false,
                }
            }
        }
    }

    /// The placement of an image of `width` x `height` as integer plans per axis, in Pillow's
    /// terms (what is resized to how many samples, which of them are kept, where they land): the
    /// form the GPU lane's resize takes. The same arithmetic as [`Geometry::place`].
    pub fn axis_plans(
        &self,
        width: u32,
        height: u32,
        draw: Option<&CropDraw>,
    ) -> (AxisPlan, AxisPlan) {
        let (out_w, out_h) = (self.width, self.height);
        match self.mode {
            ResizeMode::RandomResizedCrop { .. } => {
                let p = self.place(width, height, draw);
                (
                    AxisPlan::crop_then_resize(p.src_left as u32, p.src_width as u32, out_w),
                    AxisPlan::crop_then_resize(p.src_top as u32, p.src_height as u32, out_h),
                )
            }
            ResizeMode::ShorterSideThenCenterCrop { shorter_side, .. } => {
                let (nw, nh) = torchvision_resize(width, height, shorter_side);
                (
                    AxisPlan::center_crop(width, nw.max(1), out_w),
                    AxisPlan::center_crop(height, nh.max(1), out_h),
                )
            }
            ResizeMode::Stretch { .. } => (
                AxisPlan::stretch(width, out_w),
                AxisPlan::stretch(height, out_h),
            ),
            ResizeMode::Letterbox { .. } => {
                let p = self.place(width, height, None);
                (
                    AxisPlan::letterbox(width, p.dst_width, out_w),
                    AxisPlan::letterbox(height, p.dst_height, out_h),
                )
            }
        }
    }

    /// The largest DCT-domain reduction (2, 4 or 8; 1 for none) that leaves the part of an image
    /// of `width` x `height` the output uses with at least twice the output's pixels along each
    /// axis, so the antialiased resize that follows still has a margin to filter.
    pub fn max_reduction(&self, width: u32, height: u32, draw: Option<&CropDraw>) -> u32 {
        let p = self.place(width, height, draw);
        let margin_x = p.src_width / (2.0 * p.dst_width.max(1) as f64);
        let margin_y = p.src_height / (2.0 * p.dst_height.max(1) as f64);
        let margin = margin_x.min(margin_y);
        [8, 4, 2]
            .into_iter()
            .find(|&r| margin >= r as f64)
            .unwrap_or(1)
    }

    /// The part of an image of `width` x `height`, decoded at 1/`reduction`, that the resize
    /// reads: the placement's source box widened by the filter's reach plus two pixels (one for
    /// the border a partial JPEG decode may compute differently, one to spare), in full-size
    /// pixels. `None` when that is the whole image. An isolated box (a random crop's) decoded
    /// at full size needs only itself and the two pixels.
    pub fn source_window(
        &self,
        width: u32,
        height: u32,
        reduction: u32,
        draw: Option<&CropDraw>,
    ) -> Option<SourceRect> {
        let p = self.place(width, height, draw);
        let r = reduction.max(1) as f64;
        let isolated = p.isolated && reduction <= 1;
        let support = self.interpolation.support();
        // The filter's reach, in pixels of the reduced image, back in full-size pixels.
        let reach = |src: f64, dst: u32| {
            if isolated {
                return 2.0;
            }
            let scale = src / r / dst.max(1) as f64;
            ((support * scale.max(1.0)).ceil() + 2.0) * r
        };
        let (mx, my) = (
            reach(p.src_width, p.dst_width),
            reach(p.src_height, p.dst_height),
        );
        let clip = |v: f64, len: u32| v.clamp(0.0, len as f64);
        let rect = SourceRect {
            x0: clip((p.src_left - mx).floor(), width) as u32,
            y0: clip((p.src_top - my).floor(), height) as u32,
            x1: clip((p.src_left + p.src_width + mx).ceil(), width) as u32,
            y1: clip((p.src_top + p.src_height + my).ceil(), height) as u32,
        };
        let whole = rect.x0 == 0 && rect.y0 == 0 && rect.x1 == width && rect.y1 == height;
        (!whole && rect.x1 > rect.x0 && rect.y1 > rect.y0).then_some(rect)
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
fn random_resized_crop(
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

/// One axis of torchvision's `CenterCrop(out)` applied to a source axis of length `src` resized
/// to `resized`: returns (source start, source length, output start, output length).
fn center_crop_axis(src: f64, resized: u64, out: u32) -> (f64, f64, u32, u32) {
    let scale = src / resized as f64;
    let out_len = out as u64;
    if resized >= out_len {
        // top = int(round((resized - out) / 2.0)), Python's round: ties to even.
        let start = ((resized - out_len) as f64 / 2.0).round_ties_even();
        (start * scale, out as f64 * scale, 0, out)
    } else {
        // torchvision pads (out - resized) // 2 zeros before the image and crops at 0.
        let before = ((out_len - resized) / 2) as u32;
        (0.0, src, before, resized as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn torchvision(shorter_side: u32, crop: u32) -> Geometry {
        Geometry::new(&ResizeOptions::default().mode(ResizeMode::center_crop(shorter_side, crop)))
    }

    #[test]
    fn torchvision_geometry() {
        // 500x375 -> Resize(256) -> 341x256; CenterCrop(224): left = round(58.5) = 58 (ties to even).
        let p = torchvision(256, 224).place(500, 375, None);
        let scale = 375.0 / 256.0;
        assert_eq!(
            (p.dst_left, p.dst_top, p.dst_width, p.dst_height),
            (0, 0, 224, 224)
        );
        assert!((p.src_left - 58.0 * 500.0 / 341.0).abs() < 1e-9);
        assert!((p.src_top - 16.0 * scale).abs() < 1e-9);
        // 375x500 -> 256x341: top = round(58.5) = 58.
        let p = torchvision(256, 224).place(375, 500, None);
        assert!((p.src_top - 58.0 * 500.0 / 341.0).abs() < 1e-9);
        // 256x333 stays 256x333; CenterCrop(202): top = round(65.5) = 66 (ties to even).
        let p = torchvision(256, 202).place(256, 333, None);
        assert_eq!(p.src_top, 66.0);
        // 256x331: top = round(64.5) = 64, not 65.
        let p = torchvision(256, 202).place(256, 331, None);
        assert_eq!(p.src_top, 64.0);
    }

    #[test]
    fn crop_larger_than_resized_pads_like_torchvision() {
        // Resize(100) of 100x100 then CenterCrop(111): 5 zeros before (11 // 2), 6 after.
        let p = torchvision(100, 111).place(100, 100, None);
        assert_eq!(
            (p.dst_left, p.dst_top, p.dst_width, p.dst_height),
            (5, 5, 100, 100)
        );
        assert_eq!((p.src_left, p.src_width), (0.0, 100.0));
    }

    #[test]
    fn dct_reduction_keeps_a_twofold_margin() {
        let g = torchvision(256, 224);
        assert_eq!(g.max_reduction(500, 375, None), 1);
        assert_eq!(g.max_reduction(1411, 1411, None), 2); // crop spans 1235 px: 2.76x of 2 * 224
        assert_eq!(g.max_reduction(4000, 3000, None), 4); // 2625 px: 5.9x
        assert_eq!(g.max_reduction(12000, 9000, None), 8);
    }

    #[test]
    fn axis_plans_agree_with_the_placement() {
        for (mode, sizes) in [
            (
                ResizeMode::center_crop(256, 224),
                [(500, 375), (375, 500), (100, 100), (256, 333)],
            ),
            (
                ResizeMode::stretch(224, 160),
                [(500, 375), (10, 600), (224, 160), (1, 1)],
            ),
            (
                ResizeMode::letterbox(224, 224, 114),
                [(1280, 720), (300, 301), (5, 900), (224, 224)],
            ),
        ] {
            let g = Geometry::new(&ResizeOptions::default().mode(mode));
            for (w, h) in sizes {
                let p = g.place(w, h, None);
                let (x, y) = g.axis_plans(w, h, None);
                assert_eq!(
                    (x.dst_offset, x.out_len),
                    (p.dst_left, p.dst_width),
                    "{mode} {w}x{h}"
                );
                assert_eq!(
                    (y.dst_offset, y.out_len),
                    (p.dst_top, p.dst_height),
                    "{mode} {w}x{h}"
                );
                // The kept part starts where the placement's source box does.
                let scale_x = w as f64 / x.resized as f64;
                assert!((x.out_first as f64 * scale_x - p.src_left).abs() < 1e-6);
                let scale_y = h as f64 / y.resized as f64;
                assert!((y.out_first as f64 * scale_y - p.src_top).abs() < 1e-6);
            }
        }
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
    fn a_random_crop_is_placed_and_windowed_as_its_box() {
        let g = train(224);
        let d = g.draw(1000, 800, 4, 0).expect("random");
        let p = g.place(1000, 800, Some(&d));
        assert!(p.isolated);
        assert_eq!(
            (p.src_left, p.src_top, p.src_width, p.src_height),
            (d.left as f64, d.top as f64, d.width as f64, d.height as f64)
        );
        assert_eq!((p.dst_width, p.dst_height), (224, 224));
        let (x, y) = g.axis_plans(1000, 800, Some(&d));
        assert_eq!((x.src_offset, x.src_len, x.resized), (d.left, d.width, 224));
        assert_eq!((y.src_offset, y.src_len, y.resized), (d.top, d.height, 224));
        // The decode window is the box and two pixels, no filter reach.
        if let Some(w) = g.source_window(1000, 800, 1, Some(&d)) {
            assert_eq!(w.x0, d.left.saturating_sub(2));
            assert_eq!(w.x1, (d.left + d.width + 2).min(1000));
            assert_eq!(w.y1, (d.top + d.height + 2).min(800));
        }
        assert!(Geometry::new(&ResizeOptions::default())
            .draw(500, 375, 0, 0)
            .is_none());
    }

    #[test]
    fn letterbox_keeps_aspect() {
        let g = Geometry::new(&ResizeOptions::default().mode(ResizeMode::letterbox(640, 640, 114)));
        let p = g.place(1280, 720, None);
        assert_eq!(
            (p.dst_left, p.dst_top, p.dst_width, p.dst_height),
            (0, 140, 640, 360)
        );
        assert_eq!(p.pad, 114);
    }

    #[test]
    fn the_window_covers_the_crop_and_the_filter_reach() {
        let g = torchvision(256, 224);
        let w = g
            .source_window(1000, 500, 1, None)
            .expect("a partial window");
        let p = g.place(1000, 500, None);
        // Bilinear at a scale of ~1.95 reaches 2 pixels beyond the box, plus 2 to spare.
        assert!(w.x0 as f64 <= p.src_left - 4.0 && w.x1 as f64 >= p.src_left + p.src_width + 4.0);
        assert!(w.y0 as f64 <= p.src_top - 4.0 && w.y1 as f64 >= p.src_top + p.src_height + 4.0);
        assert!(
            w.x0 > 0 && w.x1 < 1000,
            "the sides of the long axis are skipped"
        );
        let stretch = Geometry::new(&ResizeOptions::default().mode(ResizeMode::stretch(100, 100)));
        assert_eq!(
            stretch.source_window(300, 200, 1, None),
            None,
            "a stretch reads everything"
        );
    }
}
