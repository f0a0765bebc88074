//! The reference recipes of torchvision (`references/detection/presets.py`,
//! `references/segmentation/presets.py`), drawn per image from (seed, epoch, index): what each
//! image's calls are, as [`JointOp`]s. The draws follow torchvision's arithmetic (the `f32`
//! tensors of `ScaleJitter` and `FixedSizeCrop`, Python's `int()` and `/`), from gpufeed's own
//! stream of random numbers.

use crate::random::Draws;
use crate::resample::{letterbox_fit, torchvision_resize};

use super::JointOp;

/// Keeps the recipes' stream apart from the crops' and the augmentations'.
const TARGET_SALT: u64 = 0x3C6E_F372_FE94_F82B;

/// The detection presets' fill: `mean = (123.0, 117.0, 104.0)`.
const DETECTION_MEAN: [u8; 3] = [123, 117, 104];

/// `RandomShortestSize`'s sizes in the `multiscale` preset.
const MULTISCALE: [u32; 11] = [480, 512, 544, 576, 608, 640, 672, 704, 736, 768, 800];

/// A recipe of joint transforms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TargetRecipe {
    /// Nothing: the images as they are (boxes sanitized).
    #[default]
    Plain,
    /// Detection `hflip`: `RandomHorizontalFlip(0.5)`.
    Hflip,
    /// Detection `lsj`: `ScaleJitter((1024, 1024))`, `FixedSizeCrop(1024, fill=mean)`,
    /// `RandomHorizontalFlip(0.5)`.
    Lsj,
    /// Detection `multiscale`: `RandomShortestSize((480, ..., 800), 1333)`,
    /// `RandomHorizontalFlip(0.5)`.
    Multiscale,
    /// Detection `ssdlite`: `RandomIoUCrop()`, `RandomHorizontalFlip(0.5)`.
    Ssdlite,
    /// Detection `ssd`: `RandomPhotometricDistort()` (on the `uint8` tensor, the references'
    /// `--backend tensor`), `RandomZoomOut(fill=mean, masks 0)`, `RandomIoUCrop()`,
    /// `RandomHorizontalFlip(0.5)`.
    Ssd,
    /// Segmentation train: `RandomResize(260, 1040)`, `RandomHorizontalFlip(0.5)`,
    /// `PadIfSmaller(480, fill 0, mask 255)`, `RandomCrop(480)`.
    SegmentationTrain,
    /// Segmentation eval: `Resize(520)`.
    SegmentationEval,
    /// Inference: resized to fit `width` x `height` (aspect kept, `letterbox_fit`), padded on
    /// the right and bottom with `fill`.
    Letterbox {
        /// Output columns.
        width: u32,
        /// Output rows.
        height: u32,
        /// The padding's value.
        fill: u8,
    },
}

impl TargetRecipe {
    /// The names [`TargetRecipe::parse`] takes.
    pub const NAMES: &'static [&'static str] = &[
        "none",
        "hflip",
        "lsj",
        "multiscale",
        "ssd",
        "ssdlite",
        "segmentation-train",
        "segmentation-eval",
        "letterbox:W:H",
    ];

    /// A recipe by name (see [`TargetRecipe::NAMES`]).
    pub fn parse(name: &str) -> Option<TargetRecipe> {
        Some(match name {
            "none" => TargetRecipe::Plain,
            "hflip" => TargetRecipe::Hflip,
            "lsj" => TargetRecipe::Lsj,
            "multiscale" => TargetRecipe::Multiscale,
            "ssdlite" => TargetRecipe::Ssdlite,
            "ssd" => TargetRecipe::Ssd,
            "segmentation-train" => TargetRecipe::SegmentationTrain,
            "segmentation-eval" => TargetRecipe::SegmentationEval,
            _ => {
                let mut parts = name.strip_prefix("letterbox:")?.split(':');
                let width = parts.next()?.parse().ok().filter(|&v| v > 0)?;
                let height = parts.next()?.parse().ok().filter(|&v| v > 0)?;
                if parts.next().is_some() {
                    return None;
                }
                TargetRecipe::Letterbox {
                    width,
                    height,
                    fill: 114,
                }
            }
        })
    }

    /// Whether the recipe ends with `SanitizeBoundingBoxes` (the detection ones).
    fn sanitizes(&self) -> bool {
        !matches!(
            self,
            TargetRecipe::SegmentationTrain | TargetRecipe::SegmentationEval
        )
    }

    /// The calls of image `index` in `epoch` under `seed`, for an image of `width` x `height`
    /// with `boxes` (XYXY; `RandomIoUCrop` looks at them).
    pub fn draw(
        &self,
        width: u32,
        height: u32,
        boxes: &[[f32; 4]],
        seed: u64,
        epoch: u64,
        index: usize,
    ) -> Vec<JointOp> {
        let mut d = Draws::for_image(seed ^ TARGET_SALT, epoch, index);
        let mut ops = Vec::new();
        let flip = |d: &mut Draws, ops: &mut Vec<JointOp>| {
            // `torch.rand(1) >= p` skips the flip.
            if d.uniform_f32(0.0, 1.0) < 0.5 {
                ops.push(JointOp::HorizontalFlip);
            }
        };
        match *self {
            TargetRecipe::Plain => {}
            TargetRecipe::Hflip => flip(&mut d, &mut ops),
            TargetRecipe::Lsj => {
                let (w, h) = scale_jitter(width, height, 1024, &mut d);
                ops.push(JointOp::Resize {
                    height: h,
                    width: w,
                });
                fixed_size_crop(w, h, 1024, &mut d, &mut ops);
                flip(&mut d, &mut ops);
            }
            TargetRecipe::Multiscale => {
                let min_size = MULTISCALE[d.below(MULTISCALE.len() as u64) as usize];
                let r = (f64::from(min_size) / f64::from(width.min(height)))
                    .min(1333.0 / f64::from(width.max(height)));
                let w = ((f64::from(width) * r) as u32).max(1);
                let h = ((f64::from(height) * r) as u32).max(1);
                ops.push(JointOp::Resize {
                    height: h,
                    width: w,
                });
                flip(&mut d, &mut ops);
            }
            TargetRecipe::Ssdlite => {
                ops.extend(iou_crop(width, height, boxes, &mut d));
                flip(&mut d, &mut ops);
            }
            TargetRecipe::Ssd => {
                photometric_distort(&mut d, &mut ops);
                let mut moved = boxes.to_vec();
                let (mut w, mut h) = (width, height);
                if let Some(pad) = zoom_out(width, height, &mut d) {
                    if let JointOp::Pad {
                        left,
                        top,
                        right,
                        bottom,
                        ..
                    } = pad
                    {
                        let (l, t) = (left as f32, top as f32);
                        for b in &mut moved {
                            *b = [b[0] + l, b[1] + t, b[2] + l, b[3] + t];
                        }
                        (w, h) = (w + left + right, h + top + bottom);
                    }
                    ops.push(pad);
                }
                ops.extend(iou_crop(w, h, &moved, &mut d));
                flip(&mut d, &mut ops);
            }
            TargetRecipe::SegmentationTrain => {
                let size = 260 + d.below(1040 - 260) as u32;
                let (w, h) = torchvision_resize(width, height, size);
                ops.push(JointOp::Resize {
                    height: h,
                    width: w,
                });
                flip(&mut d, &mut ops);
                let (right, bottom) = (480u32.saturating_sub(w), 480u32.saturating_sub(h));
                if right > 0 || bottom > 0 {
                    ops.push(JointOp::Pad {
                        left: 0,
                        top: 0,
                        right,
                        bottom,
                        fill: [0; 3],
                        mask_fill: 255,
                    });
                }
                let (pw, ph) = (w.max(480), h.max(480));
                let top = d.below(u64::from(ph - 480) + 1) as u32;
                let left = d.below(u64::from(pw - 480) + 1) as u32;
                ops.push(JointOp::Crop {
                    top,
                    left,
                    height: 480,
                    width: 480,
                });
            }
            TargetRecipe::SegmentationEval => {
                let (w, h) = torchvision_resize(width, height, 520);
                ops.push(JointOp::Resize {
                    height: h,
                    width: w,
                });
            }
            TargetRecipe::Letterbox {
                width: ow,
                height: oh,
                fill,
            } => {
                let (w, h) = letterbox_fit(width, height, ow, oh);
                ops.push(JointOp::Resize {
                    height: h,
                    width: w,
                });
                if w < ow || h < oh {
                    ops.push(JointOp::Pad {
                        left: 0,
                        top: 0,
                        right: ow - w,
                        bottom: oh - h,
                        fill: [fill; 3],
                        mask_fill: 255,
                    });
                }
            }
        }
        if self.sanitizes() {
            ops.push(JointOp::Sanitize);
        }
        ops
    }
}

/// `RandomPhotometricDistort()`'s draws and calls: each of brightness (0.875..1.125),
/// contrast, saturation (0.5..1.5) and hue (-0.05..0.05) with probability 0.5, contrast before
/// or after saturation and hue (a fair draw), then a channel permutation with probability 0.5
/// (`randperm(3)`).
fn photometric_distort(d: &mut Draws, ops: &mut Vec<JointOp>) {
    use crate::augment::Op;
    let factor = |d: &mut Draws, lo: f32, hi: f32| {
        (d.uniform_f32(0.0, 1.0) < 0.5).then(|| f64::from(d.uniform_f32(lo, hi)))
    };
    let brightness = factor(d, 0.875, 1.125);
    let contrast = factor(d, 0.5, 1.5);
    let saturation = factor(d, 0.5, 1.5);
    let hue = factor(d, -0.05, 0.05);
    let contrast_before = d.uniform_f32(0.0, 1.0) < 0.5;
    let permute = d.uniform_f32(0.0, 1.0) < 0.5;
    let mut push = |op: Option<Op>| ops.extend(op.map(JointOp::Color));
    push(brightness.map(Op::Brightness));
    if contrast_before {
        push(contrast.map(Op::Contrast));
    }
    push(saturation.map(Op::Saturation));
    push(hue.map(Op::Hue));
    if !contrast_before {
        push(contrast.map(Op::Contrast));
    }
    if permute {
        let mut p = [0u8, 1, 2];
        for i in (1..3).rev() {
            let j = d.below(i as u64 + 1) as usize;
            p.swap(i, j);
        }
        ops.push(JointOp::PermuteChannels(p));
    }
}

/// `RandomZoomOut(fill=mean, side_range=(1.0, 4.0), p=0.5)`: `rand >= 0.5` skips it; else
/// `r = 1 + 3 * rand` (`f32`), a canvas of `int(side * r)`, the image at
/// `int((canvas - side) * rand)`.
fn zoom_out(width: u32, height: u32, d: &mut Draws) -> Option<JointOp> {
    if d.uniform_f32(0.0, 1.0) >= 0.5 {
        return None;
    }
    let r = 1.0f32 + d.uniform_f32(0.0, 1.0) * 3.0;
    let cw = (width as f32 * r) as u32;
    let ch = (height as f32 * r) as u32;
    let (q0, q1) = (d.uniform_f32(0.0, 1.0), d.uniform_f32(0.0, 1.0));
    let left = ((cw - width) as f32 * q0) as u32;
    let top = ((ch - height) as f32 * q1) as u32;
    Some(JointOp::Pad {
        left,
        top,
        right: cw - (left + width),
        bottom: ch - (top + height),
        fill: DETECTION_MEAN,
        mask_fill: 0,
    })
}

/// `RandomIoUCrop()`'s draws: an option of `[0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 2.0]` (2.0: no
/// crop), then up to 40 trials of a size `int(side * (0.3 + 0.7 * rand))` of aspect 0.5..=2,
/// a place `int((side - new) * rand)`, kept when a box's centre lies inside and the best IoU of
/// those boxes with the window reaches the option (all `f32`); no trial kept: another option.
/// An image whose boxes never qualify ends (as torchvision's loop does, with probability 1) on
/// the no-crop option; after 1000 options gpufeed gives up the crop.
fn iou_crop(width: u32, height: u32, boxes: &[[f32; 4]], d: &mut Draws) -> Option<JointOp> {
    const OPTIONS: [f32; 7] = [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 2.0];
    let span = (1.0f64 - 0.3) as f32;
    for _ in 0..1000 {
        let min_iou = OPTIONS[d.below(OPTIONS.len() as u64) as usize];
        if min_iou >= 1.0 {
            return None;
        }
        for _ in 0..40 {
            let (r0, r1) = (d.uniform_f32(0.0, 1.0), d.uniform_f32(0.0, 1.0));
            let new_w = (width as f32 * (0.3 + span * r0)) as u32;
            let new_h = (height as f32 * (0.3 + span * r1)) as u32;
            if new_h == 0 {
                continue;
            }
            let aspect = f64::from(new_w) / f64::from(new_h);
            if !(0.5..=2.0).contains(&aspect) {
                continue;
            }
            let (q0, q1) = (d.uniform_f32(0.0, 1.0), d.uniform_f32(0.0, 1.0));
            let left = ((width - new_w) as f32 * q0) as u32;
            let top = ((height - new_h) as f32 * q1) as u32;
            if new_w == 0 {
                continue;
            }
            let inside = super::transform::centres_inside(boxes, top, left, new_h, new_w);
            if !inside.iter().any(|&v| v) {
                continue;
            }
            let window = [
                left as f32,
                top as f32,
                (left + new_w) as f32,
                (top + new_h) as f32,
            ];
            let best = boxes
                .iter()
                .zip(&inside)
                .filter(|(_, &i)| i)
                .map(|(b, _)| iou(b, &window))
                .fold(f32::NEG_INFINITY, f32::max);
            if best < min_iou {
                continue;
            }
            return Some(JointOp::IouCrop {
                top,
                left,
                height: new_h,
                width: new_w,
            });
        }
    }
    None
}

/// `box_iou` of two XYXY boxes in `f32`.
fn iou(a: &[f32; 4], b: &[f32; 4]) -> f32 {
    let area = |x: &[f32; 4]| (x[2] - x[0]) * (x[3] - x[1]);
    let w = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let h = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    let inter = w * h;
    inter / (area(a) + area(b) - inter)
}

/// `ScaleJitter(target_size=(t, t))`'s size: `scale = 0.1 + rand * 1.9` (`f32`),
/// `r = min(t / h, t / w) * scale` (`f32`), `int(w * r)`, `int(h * r)`.
fn scale_jitter(width: u32, height: u32, target: u32, d: &mut Draws) -> (u32, u32) {
    let rand = d.uniform_f32(0.0, 1.0);
    let scale = 0.1f32 + rand * (2.0f64 - 0.1) as f32;
    let t = f64::from(target);
    let r = (t / f64::from(height)).min(t / f64::from(width)) as f32 * scale;
    let w = (width as f32 * r) as u32;
    let h = (height as f32 * r) as u32;
    (w.max(1), h.max(1))
}

/// The reference `FixedSizeCrop(size, fill=mean)`: a crop of `min(side, size)` at
/// `int(offset * rand)` (one `rand` for both axes, `f32`), then the right and bottom padded to
/// `size` with the mean.
fn fixed_size_crop(width: u32, height: u32, size: u32, d: &mut Draws, ops: &mut Vec<JointOp>) {
    let (nw, nh) = (width.min(size), height.min(size));
    if nw != width || nh != height {
        let (ow, oh) = (width.saturating_sub(size), height.saturating_sub(size));
        let r = d.uniform_f32(0.0, 1.0);
        let top = (oh as f32 * r) as u32;
        let left = (ow as f32 * r) as u32;
        ops.push(JointOp::Crop {
            top,
            left,
            height: nh,
            width: nw,
        });
    }
    let (right, bottom) = (size - nw, size - nh);
    if right > 0 || bottom > 0 {
        ops.push(JointOp::Pad {
            left: 0,
            top: 0,
            right,
            bottom,
            fill: DETECTION_MEAN,
            mask_fill: 0,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lsj_ends_at_1024_square() {
        for index in 0..50 {
            let ops = TargetRecipe::Lsj.draw(640, 480, &[], 1, 0, index);
            let mut size = (640u32, 480u32);
            for op in &ops {
                match *op {
                    JointOp::Resize { height, width } => size = (width, height),
                    JointOp::Crop { height, width, .. } => size = (width, height),
                    JointOp::Pad {
                        left,
                        top,
                        right,
                        bottom,
                        ..
                    } => size = (size.0 + left + right, size.1 + top + bottom),
                    _ => {}
                }
            }
            assert_eq!(size, (1024, 1024), "{ops:?}");
            assert_eq!(ops, TargetRecipe::Lsj.draw(640, 480, &[], 1, 0, index));
        }
    }

    #[test]
    fn segmentation_train_crops_480() {
        for index in 0..50 {
            let ops = TargetRecipe::SegmentationTrain.draw(500, 375, &[], 3, 1, index);
            assert!(matches!(
                ops.last(),
                Some(JointOp::Crop {
                    height: 480,
                    width: 480,
                    ..
                })
            ));
        }
    }

    #[test]
    fn ssdlite_crops_around_a_box() {
        let boxes = [[100.0, 100.0, 300.0, 250.0]];
        let mut crops = 0;
        for index in 0..100 {
            let ops = TargetRecipe::Ssdlite.draw(640, 480, &boxes, 2, 0, index);
            if let Some(&JointOp::IouCrop {
                top,
                left,
                height,
                width,
            }) = ops.first()
            {
                crops += 1;
                assert!(left < 200 && 200 < left + width && top < 175 && 175 < top + height);
                let aspect = f64::from(width) / f64::from(height);
                assert!((0.5..=2.0).contains(&aspect), "{ops:?}");
            }
        }
        assert!((50..100).contains(&crops), "{crops}");
        // No boxes: the loop ends on the no-crop option.
        let ops = TargetRecipe::Ssdlite.draw(64, 48, &[], 2, 0, 0);
        assert!(!ops.iter().any(|op| matches!(op, JointOp::IouCrop { .. })));
    }

    #[test]
    fn names_parse() {
        assert_eq!(TargetRecipe::parse("lsj"), Some(TargetRecipe::Lsj));
        assert!(matches!(
            TargetRecipe::parse("letterbox:640:480"),
            Some(TargetRecipe::Letterbox {
                width: 640,
                height: 480,
                ..
            })
        ));
        assert_eq!(TargetRecipe::parse("letterbox:0:480"), None);
        assert_eq!(TargetRecipe::parse("nope"), None);
    }
}
