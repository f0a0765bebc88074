//! The integer plan of one axis of one output ([`AxisPlan`]): which source samples form the image
//! Pillow resizes, which box of it is resized to how many samples, which of those are kept and
//! where they land. torchvision's sizes and crop offsets are computed here and nowhere else.

use std::fmt;

use thiserror::Error;

/// The largest source or output side this module accepts. Pillow keeps sizes in `int` and box
/// edges in `float`; below 2^24 both are exact, and this limit keeps every intermediate size, tap
/// count and coefficient table far inside `i32` and memory.
pub const MAX_SIDE: u32 = 1 << 20;

/// A fractional box of the region, Pillow's `resize(size, box=...)` along one axis: samples
/// `[start / divisor, end / divisor)` of the region are resized. Pillow takes box edges as C
/// `float`s; with `divisor` a power of two and edges below 2^24 they are exact.
///
/// A JPEG decoded at 1/`r` of its size in the DCT domain (libjpeg's scaling, Pillow's
/// `Image.draft`) is resized with the box `(left / r, (left + width) / r)` of the full-size one
/// (`draft` returns `(0, 0, width / r, height / r)` for the whole image).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SourceBox {
    /// The box's first edge, in 1/`divisor` samples of the region.
    pub start: u32,
    /// The box's last edge (exclusive), in 1/`divisor` samples.
    pub end: u32,
    /// The denominator of both edges (1, 2, 4 or 8).
    pub divisor: u32,
}

impl SourceBox {
    /// The box's edges as Pillow holds them: Python floats converted to C `float`.
    pub fn edges(&self) -> (f32, f32) {
        let d = f64::from(self.divisor.max(1));
        (
            (f64::from(self.start) / d) as f32,
            (f64::from(self.end) / d) as f32,
        )
    }
}

/// One axis of an output: the source region `[src_offset, src_offset + src_len)` of the decoded
/// image is treated as an image of its own (Pillow clamps filter taps at ITS edges); its box
/// ([`AxisPlan::src_box`], the whole region unless set) is resized by Pillow to `resized`
/// samples; outputs `[out_first, out_first + out_len)` of that resize are kept and written at
/// `[dst_offset, dst_offset + out_len)` of the output axis.
///
/// torchvision's `Resize(256)` + `CenterCrop(224)` of a 500x375 image is x = {0, 500, 341, 58,
/// 224, 0}, y = {0, 375, 256, 16, 224, 0}; `resized_crop(top, left, h, w, size)` (crop, then
/// resize) is x = {left, w, size, 0, size, 0}; a letterbox is {0, W, nw, 0, nw, (out - nw) / 2}.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AxisPlan {
    /// First source sample of the region.
    pub src_offset: u32,
    /// Source samples in the region.
    pub src_len: u32,
    /// The part of the region that is resized (Pillow's `box`); `None`: all of it.
    pub src_box: Option<SourceBox>,
    /// Samples the box is resized to.
    pub resized: u32,
    /// First kept sample of the resize.
    pub out_first: u32,
    /// Kept samples.
    pub out_len: u32,
    /// Where the first kept sample lands in the output.
    pub dst_offset: u32,
}

impl AxisPlan {
    /// The whole source axis of `src_len` samples resized to the whole output axis of `out_len`.
    pub fn stretch(src_len: u32, out_len: u32) -> AxisPlan {
        AxisPlan {
            src_len,
            resized: out_len,
            out_len,
            ..AxisPlan::default()
        }
    }

    /// torchvision's `CenterCrop(crop)` of the whole source axis resized to `resized`: the kept
    /// samples start at `int(round((resized - crop) / 2))` (Python's round: ties to even); a crop
    /// larger than the resize keeps it all, after `(crop - resized) // 2` pad samples.
    pub fn center_crop(src_len: u32, resized: u32, crop: u32) -> AxisPlan {
        let (out_first, out_len, dst_offset) = if resized >= crop {
            (round_half_even_half(resized - crop), crop, 0)
        } else {
            (0, resized, (crop - resized) / 2)
        };
        AxisPlan {
            src_len,
            resized,
            out_first,
            out_len,
            dst_offset,
            ..AxisPlan::default()
        }
    }

    /// torchvision's `resized_crop`: the source samples `[offset, offset + len)` cropped, then
    /// resized to the whole output axis of `size`.
    pub fn crop_then_resize(offset: u32, len: u32, size: u32) -> AxisPlan {
        AxisPlan {
            src_offset: offset,
            ..AxisPlan::stretch(len, size)
        }
    }

    /// A letterbox: the whole source axis resized to `fitted` samples, centred (rounding down)
    /// on an output axis of `out_len`.
    pub fn letterbox(src_len: u32, fitted: u32, out_len: u32) -> AxisPlan {
        AxisPlan {
            dst_offset: out_len.saturating_sub(fitted) / 2,
            ..AxisPlan::stretch(src_len, fitted)
        }
    }

    /// The same output from the axis decoded at 1/`reduction` of its size (`decoded_len`
    /// samples, libjpeg's `ceil(len / reduction)`): the whole decoded axis is the image, the
    /// region becomes a fractional box of it, as Pillow's `Image.draft` + `resize(box=...)`
    /// resizes. The same plan for a reduction of 1.
    pub fn reduced(&self, reduction: u32, decoded_len: u32) -> AxisPlan {
        if reduction <= 1 {
            return *self;
        }
        let own = self.source_box();
        let offset = self.src_offset.saturating_mul(own.divisor);
        AxisPlan {
            src_offset: 0,
            src_len: decoded_len,
            src_box: Some(SourceBox {
                start: offset.saturating_add(own.start),
                end: offset.saturating_add(own.end),
                divisor: own.divisor.saturating_mul(reduction),
            }),
            ..*self
        }
    }

    /// The box that is resized, explicit.
    pub fn source_box(&self) -> SourceBox {
        self.src_box.unwrap_or(SourceBox {
            start: 0,
            end: self.src_len,
            divisor: 1,
        })
    }

    /// Whether Pillow resamples this axis (`need_horizontal` / `need_vertical`): when the size
    /// changes or the box is not `(0, resized)`. Otherwise the samples are copied.
    pub fn is_resampled(&self) -> bool {
        let (start, end) = self.source_box().edges();
        self.resized != self.src_len || start != 0.0 || end != self.resized as f32
    }

    /// Checks the plan against a source axis of `source_len` and an output axis of `output_len`
    /// samples.
    pub fn check(&self, axis: Axis, source_len: u32, output_len: u32) -> Result<(), PlanError> {
        self.check_own(axis)?;
        let src_end = u64::from(self.src_offset) + u64::from(self.src_len);
        if src_end > u64::from(source_len) {
            return Err(PlanError::SourceOutOfBounds {
                axis,
                end: src_end,
                len: source_len,
            });
        }
        let dst_end = u64::from(self.dst_offset) + u64::from(self.out_len);
        if dst_end > u64::from(output_len) {
            return Err(PlanError::OutputOutOfBounds {
                axis,
                end: dst_end,
                len: output_len,
            });
        }
        Ok(())
    }

    /// The checks that need no image: sizes non-zero and within [`MAX_SIDE`], the box inside the
    /// region, the kept samples inside the resize.
    pub(super) fn check_own(&self, axis: Axis) -> Result<(), PlanError> {
        if self.src_len == 0 || self.resized == 0 || self.out_len == 0 {
            return Err(PlanError::Empty { axis });
        }
        if self.src_len > MAX_SIDE || self.resized > MAX_SIDE {
            return Err(PlanError::TooLarge { axis });
        }
        let b = self.source_box();
        let box_fits = b.divisor.is_power_of_two()
            && b.divisor <= 8
            && b.start < b.end
            && u64::from(b.end) <= u64::from(self.src_len) * u64::from(b.divisor);
        if !box_fits {
            return Err(PlanError::BadBox { axis });
        }
        let kept_end = u64::from(self.out_first) + u64::from(self.out_len);
        if kept_end > u64::from(self.resized) {
            return Err(PlanError::KeptOutOfBounds {
                axis,
                end: kept_end,
                resized: self.resized,
            });
        }
        Ok(())
    }
}

/// `int(round(d / 2))` in Python for a non-negative integer `d`: halves go to the even neighbour.
fn round_half_even_half(d: u32) -> u32 {
    let lower = d / 2;
    if d % 2 == 1 && lower % 2 == 1 {
        lower + 1
    } else {
        lower
    }
}

/// torchvision's `Resize(shorter_side)` of a `width` x `height` image: the shorter side becomes
/// `shorter_side`, the longer `int(shorter_side * long / short)` (a float division, truncated),
/// at least 1. Returns the new (width, height).
pub fn torchvision_resize(width: u32, height: u32, shorter_side: u32) -> (u32, u32) {
    let long_side = |long: u32, short: u32| {
        // Exact operands (both below 2^53) and one correctly rounded division: Python's `/`.
        let v = (u64::from(shorter_side) * u64::from(long)) as f64 / f64::from(short.max(1));
        (v as u32).max(1)
    };
    if width <= height {
        (shorter_side, long_side(height, width))
    } else {
        (long_side(width, height), shorter_side)
    }
}

#[cfg(test)]
/// The plans of torchvision's `Resize(shorter_side)` + `CenterCrop((crop_height, crop_width))`
/// of a `width` x `height` image, as (x, y).
pub fn torchvision_center_crop(
    width: u32,
    height: u32,
    shorter_side: u32,
    crop_width: u32,
    crop_height: u32,
) -> (AxisPlan, AxisPlan) {
    let (rw, rh) = torchvision_resize(width, height, shorter_side);
    (
        AxisPlan::center_crop(width, rw, crop_width),
        AxisPlan::center_crop(height, rh, crop_height),
    )
}

/// The size of a `width` x `height` image fitted inside `out_width` x `out_height` with its
/// aspect kept (a letterbox): each side scaled by the smaller ratio, rounded half up, between 1
/// and the output's side.
pub fn letterbox_fit(width: u32, height: u32, out_width: u32, out_height: u32) -> (u32, u32) {
    let (w, h) = (f64::from(width.max(1)), f64::from(height.max(1)));
    let scale = (f64::from(out_width) / w).min(f64::from(out_height) / h);
    let side = |v: f64, out: u32| ((v * scale).round() as u32).clamp(1, out.max(1));
    (side(w, out_width), side(h, out_height))
}

/// An axis of the image, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Axis {
    /// Horizontal.
    X,
    /// Vertical.
    Y,
}

impl fmt::Display for Axis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Axis::X => "x",
            Axis::Y => "y",
        })
    }
}

/// Why a resample cannot be done as asked: the plans and buffers disagree.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PlanError {
    /// A source region, resize or kept range of zero samples.
    #[error("{axis} axis: a source region, resize or kept range is empty")]
    Empty {
        /// The axis.
        axis: Axis,
    },
    /// A side over [`MAX_SIDE`].
    #[error("{axis} axis: a side is over {MAX_SIDE} samples")]
    TooLarge {
        /// The axis.
        axis: Axis,
    },
    /// A box that is empty, reaches past the region or has a divisor other than 1, 2, 4 or 8.
    #[error("{axis} axis: the box is empty, reaches past the region or has a bad divisor")]
    BadBox {
        /// The axis.
        axis: Axis,
    },
    /// The source region ends past the image.
    #[error("{axis} axis: the source region ends at {end}, the image has {len} samples")]
    SourceOutOfBounds {
        /// The axis.
        axis: Axis,
        /// One past the region's last sample.
        end: u64,
        /// The image's samples along the axis.
        len: u32,
    },
    /// The kept samples end past the resize.
    #[error("{axis} axis: the kept samples end at {end}, the resize has {resized}")]
    KeptOutOfBounds {
        /// The axis.
        axis: Axis,
        /// One past the last kept sample.
        end: u64,
        /// Samples of the resize.
        resized: u32,
    },
    /// The kept samples land past the output.
    #[error("{axis} axis: the kept samples land up to {end}, the output has {len}")]
    OutputOutOfBounds {
        /// The axis.
        axis: Axis,
        /// One past the last written output sample.
        end: u64,
        /// The output's samples along the axis.
        len: u32,
    },
    /// Neither 1 (gray) nor 3 (RGB) channels.
    #[error("{0} channels: only 1 (gray) and 3 (RGB) are resampled")]
    Channels(u32),
    /// A buffer's length does not match the sizes given with it.
    #[error("the {what} buffer holds {actual} bytes, its sizes need {expected}")]
    BufferSize {
        /// Which buffer.
        what: &'static str,
        /// The length the sizes imply.
        expected: u64,
        /// The buffer's length.
        actual: u64,
    },
}

/// A rectangle of output pixels: columns `x..x + width`, rows `y..y + height`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Left column.
    pub x: u32,
    /// Top row.
    pub y: u32,
    /// Columns.
    pub width: u32,
    /// Rows.
    pub height: u32,
}

impl Window {
    /// The whole of a `width` x `height` image.
    pub fn whole(width: u32, height: u32) -> Window {
        Window {
            x: 0,
            y: 0,
            width,
            height,
        }
    }

    /// Pixels in the window.
    pub fn pixels(&self) -> u64 {
        u64::from(self.width) * u64::from(self.height)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn center_crop_rounds_like_python() {
        // 341 - 224 = 117: round(58.5) = 58; 333 - 202 = 131: round(65.5) = 66.
        assert_eq!(AxisPlan::center_crop(500, 341, 224).out_first, 58);
        assert_eq!(AxisPlan::center_crop(256, 333, 202).out_first, 66);
        assert_eq!(AxisPlan::center_crop(256, 331, 202).out_first, 64);
        let padded = AxisPlan::center_crop(100, 100, 111);
        assert_eq!(
            (padded.out_first, padded.out_len, padded.dst_offset),
            (0, 100, 5)
        );
        assert_eq!(torchvision_resize(500, 375, 256), (341, 256));
        assert_eq!(torchvision_resize(375, 500, 256), (256, 341));
        assert_eq!(torchvision_resize(4000, 10, 256), (102_400, 256));
        assert_eq!(torchvision_resize(1, 1000, 1), (1, 1000));
        let (x, y) = torchvision_center_crop(500, 375, 256, 224, 224);
        assert_eq!(
            x,
            AxisPlan {
                src_offset: 0,
                src_len: 500,
                src_box: None,
                resized: 341,
                out_first: 58,
                out_len: 224,
                dst_offset: 0
            }
        );
        assert_eq!((y.resized, y.out_first, y.out_len), (256, 16, 224));
    }

    #[test]
    fn a_reduced_plan_resizes_the_box_draft_gives() {
        // A 1411-sample axis decoded at 1/2 is 706 samples; Pillow's draft box is (0, 705.5).
        let (x, _) = torchvision_center_crop(1411, 1411, 256, 224, 224);
        let r = x.reduced(2, 706);
        assert_eq!((r.src_offset, r.src_len), (0, 706));
        assert_eq!(r.source_box().edges(), (0.0, 705.5));
        assert_eq!((r.resized, r.out_first, r.out_len), (256, 16, 224));
        assert!(r.is_resampled());
        // A crop [101, 101 + 600) at 1/4: the box (25.25, 175.25) of the 250-sample axis.
        let c = AxisPlan::crop_then_resize(101, 600, 224).reduced(4, 250);
        assert_eq!(c.source_box().edges(), (25.25, 175.25));
        assert_eq!(c.check(Axis::X, 250, 224), Ok(()));
        assert_eq!(x.reduced(1, 1411), x);
        // A box ending past the region is refused.
        let bad = AxisPlan {
            src_box: Some(SourceBox {
                start: 0,
                end: 2 * 706 + 1,
                divisor: 2,
            }),
            ..r
        };
        assert_eq!(
            bad.check_own(Axis::X),
            Err(PlanError::BadBox { axis: Axis::X })
        );
    }

    #[test]
    fn an_unchanged_box_is_copied() {
        assert!(!AxisPlan::stretch(10, 10).is_resampled());
        assert!(AxisPlan::stretch(10, 11).is_resampled());
        let shifted = AxisPlan {
            src_box: Some(SourceBox {
                start: 1,
                end: 21,
                divisor: 2,
            }),
            ..AxisPlan::stretch(11, 10)
        };
        assert!(shifted.is_resampled(), "box (0.5, 10.5): Pillow resamples");
    }

    #[test]
    fn letterbox_fits_and_rounds_half_up() {
        assert_eq!(letterbox_fit(1280, 720, 640, 640), (640, 360));
        assert_eq!(letterbox_fit(5, 900, 224, 224), (1, 224));
        assert_eq!(letterbox_fit(300, 301, 224, 224), (223, 224));
    }
}
