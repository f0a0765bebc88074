//! Many views of one image: what each view draws ([`ViewDraw`]: its crop and flip, and its
//! colour operations as torchvision's calls, [`ViewOp`]) from (seed, epoch, index, view) alone,
//! and the operations' CPU rendition with the arithmetic torchvision runs on a PIL image
//! ([`apply_view_ops`]: Pillow's `ImageEnhance`, HSV conversion, grayscale and `ImageOps`, and
//! torchvision's float32 Gaussian blur).
//!
//! Pure planning and pixel arithmetic: the decode once and the crops of every view are the CPU
//! lane's (`gpufeed::cpu::render_views`).

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod colour_avx2;
mod layout;
mod pillow;

pub use crate::options::{ViewBlur, ViewGroup, ViewOps, Views, ViewsPreset};
pub use layout::{GroupBlock, ViewLayout, RECORD_UNIT};
pub use pillow::apply_view_ops;
pub(crate) use pillow::gaussian_kernel;

use std::sync::Arc;

use crate::geometry::{random_resized_crop, CropDraw, Geometry};
use crate::options::{ResizeMode, ResizeOptions};
use crate::random::Draws;

/// Salt that keeps the views' streams apart from the single crop's and the augmentations'.
const VIEW_SALT: u64 = 0x3C6E_F372_FE94_F82B;

/// The geometry of a group's views: `RandomResizedCrop(size, scale, ratio, interpolation)`.
pub(crate) fn group_geometry(group: &ViewGroup, pillow_version: (u32, u32)) -> Geometry {
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

/// A pipeline's views as its lanes make them: the views, where each lands in a batch
/// ([`ViewLayout`]) and where their colour calls run.
#[derive(Debug, Clone)]
pub(crate) struct LaneViews {
    pub views: Arc<Views>,
    pub layout: ViewLayout,
    pub colour: ViewColour,
}

/// Bytes a lane working ahead writes for one image: an output image of `geometry`, or in a
/// pipeline of `views` the record of its views ([`ViewLayout::record_bytes`]).
pub(crate) fn lane_output_bytes(views: Option<&LaneViews>, geometry: &Geometry) -> usize {
    views.map_or(geometry.image_bytes(), |v| v.layout.record_bytes)
}

/// Where a pipeline's views get their colour calls ([`ViewOp`]s): on the CPU, by the thread
/// that cuts them (the views then leave the CPU finished), or on the device, in place on the
/// uploaded `u8` views before the normalize (the CPU lane then renders the geometry alone: crop,
/// resize, flip).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ViewColour {
    /// The CPU lane applies every call ([`apply_view_ops`]).
    #[default]
    Cpu,
    /// The CPU lane leaves the calls to the device.
    Device,
}

/// One of torchvision's calls on a view (a PIL image), with the arguments it is given.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum ViewOp {
    /// `F.adjust_brightness(img, factor)`: `ImageEnhance.Brightness(img).enhance(factor)`.
    Brightness(f32),
    /// `F.adjust_contrast(img, factor)`: `ImageEnhance.Contrast(img).enhance(factor)`.
    Contrast(f32),
    /// `F.adjust_saturation(img, factor)`: `ImageEnhance.Color(img).enhance(factor)`.
    Saturation(f32),
    /// `F.adjust_hue(img, factor)`: the hue channel of Pillow's HSV shifted by
    /// `uint8(factor * 255)`, wrapping.
    Hue(f32),
    /// `F.rgb_to_grayscale(img, num_output_channels=3)`: Pillow's `convert("L")`, three times.
    Grayscale,
    /// `F.gaussian_blur(img, [kernel_size, kernel_size], [sigma, sigma])`.
    Blur {
        /// The kernel's side.
        kernel_size: u32,
        /// The Gaussian's sigma.
        sigma: f32,
    },
    /// `F.solarize(img, threshold)`: `ImageOps.solarize`, samples at or above `threshold`
    /// inverted.
    Solarize(u8),
}

impl ViewOp {
    /// The call as a JSON array: its name and its arguments (`["brightness", 1.21]`,
    /// `["blur", 9, 0.53]`).
    pub fn json(&self) -> String {
        match self {
            ViewOp::Brightness(f) => format!("[\"brightness\", {}]", json_f32(*f)),
            ViewOp::Contrast(f) => format!("[\"contrast\", {}]", json_f32(*f)),
            ViewOp::Saturation(f) => format!("[\"saturation\", {}]", json_f32(*f)),
            ViewOp::Hue(f) => format!("[\"hue\", {}]", json_f32(*f)),
            ViewOp::Grayscale => "[\"grayscale\"]".to_string(),
            ViewOp::Blur { kernel_size, sigma } => {
                format!("[\"blur\", {kernel_size}, {}]", json_f32(*sigma))
            }
            ViewOp::Solarize(t) => format!("[\"solarize\", {t}]"),
        }
    }
}

/// A float32 as JSON: the shortest decimal that reads back as the same float64 (the float32's
/// exact value), with a decimal point, as Python prints it.
fn json_f32(v: f32) -> String {
    let s = format!("{:?}", f64::from(v));
    if s.contains(['.', 'e', 'E', 'N', 'i']) {
        s
    } else {
        format!("{s}.0")
    }
}

/// What one view of one image drew: its group, output size, box of the source image and flip
/// (`F.resized_crop(img, top, left, height, width, size)` then `F.hflip`), and the calls that
/// follow, in order.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ViewDraw {
    /// The view's number, across the groups.
    pub view: usize,
    /// Its group's number.
    pub group: usize,
    /// Its side.
    pub size: u32,
    /// Its box and flip.
    pub crop: CropDraw,
    /// The calls on it after the crop and flip, in order.
    pub ops: Vec<ViewOp>,
}

impl ViewDraw {
    /// The draw as one JSON object (a line of `--save`'s `.views.jsonl`), with the image's
    /// source index and epoch.
    pub fn json(&self, index: usize, epoch: u64) -> String {
        let c = &self.crop;
        let ops: Vec<String> = self.ops.iter().map(ViewOp::json).collect();
        format!(
            "{{\"index\": {index}, \"epoch\": {epoch}, \"view\": {}, \"group\": {}, \"size\": {}, \
             \"top\": {}, \"left\": {}, \"height\": {}, \"width\": {}, \"flip\": {}, \"ops\": [{}]}}",
            self.view,
            self.group,
            self.size,
            c.top,
            c.left,
            c.height,
            c.width,
            c.flipped,
            ops.join(", ")
        )
    }
}

/// `torch.rand(1) < p` from the view's stream.
fn chance(draws: &mut Draws, p: f64) -> bool {
    f64::from(draws.uniform_f32(0.0, 1.0)) < p
}

/// `ColorJitter.get_params`: `torch.randperm(4)`, then each factor drawn in the order
/// brightness, contrast, saturation, hue (those set), the calls in the permutation's order.
fn draw_jitter(jitter: &crate::options::ColorJitter, draws: &mut Draws, ops: &mut Vec<ViewOp>) {
    let mut order = [0usize, 1, 2, 3];
    for i in (1..4).rev() {
        let j = draws.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    let factors = jitter
        .ranges()
        .map(|r| r.map(|(lo, hi)| draws.uniform_f32(lo as f32, hi as f32)));
    for k in order {
        match (k, factors[k]) {
            (0, Some(f)) => ops.push(ViewOp::Brightness(f)),
            (1, Some(f)) => ops.push(ViewOp::Contrast(f)),
            (2, Some(f)) => ops.push(ViewOp::Saturation(f)),
            (3, Some(f)) => ops.push(ViewOp::Hue(f)),
            _ => {}
        }
    }
}

impl Views {
    /// What view `view` of the image with source index `index` draws in `epoch`, the image
    /// `width` x `height` pixels (after any EXIF turn), in torchvision's order:
    /// `RandomResizedCrop.get_params`, `RandomHorizontalFlip`, `RandomApply(ColorJitter)`,
    /// `RandomGrayscale`, the blur's `RandomApply` and sigma, `RandomSolarize`. `None` for a
    /// view past the last group's.
    pub fn draw(
        &self,
        width: u32,
        height: u32,
        index: usize,
        epoch: u64,
        view: usize,
    ) -> Option<ViewDraw> {
        let mut first = 0usize;
        let (group_at, group) = self.groups.iter().enumerate().find(|(_, g)| {
            let hit = view < first + g.count as usize;
            if !hit {
                first += g.count as usize;
            }
            hit
        })?;
        let mut draws = Draws::for_view(self.seed ^ VIEW_SALT, epoch, index, view);
        let (top, left, h, w) =
            random_resized_crop(width, height, group.scale, group.ratio, &mut draws);
        let o = &group.ops;
        let flipped = chance(&mut draws, o.flip);
        let mut ops = Vec::new();
        if chance(&mut draws, o.jitter_p) && o.jitter.is_on() {
            draw_jitter(&o.jitter, &mut draws, &mut ops);
        }
        if chance(&mut draws, o.grayscale) {
            ops.push(ViewOp::Grayscale);
        }
        if let Some(blur) = &o.blur {
            if chance(&mut draws, blur.p) {
                let sigma = draws.uniform_f32(blur.sigma.min as f32, blur.sigma.max as f32);
                ops.push(ViewOp::Blur {
                    kernel_size: blur.kernel_size,
                    sigma,
                });
            }
        }
        if chance(&mut draws, o.solarize) {
            ops.push(ViewOp::Solarize(128));
        }
        Some(ViewDraw {
            view,
            group: group_at,
            size: group.size,
            crop: CropDraw {
                top,
                left,
                height: h,
                width: w,
                flipped,
            },
            ops,
        })
    }

    /// Every view's draws for one image, view 0 first.
    pub fn draw_all(&self, width: u32, height: u32, index: usize, epoch: u64) -> Vec<ViewDraw> {
        (0..self.count())
            .filter_map(|v| self.draw(width, height, index, epoch, v))
            .collect()
    }
}

#[cfg(test)]
mod tests;
