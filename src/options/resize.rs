//! Pixels to the output size: the resize mode (which owns the output size), the filter, and the
//! random crop and flip of training.

use std::fmt;
use std::str::FromStr;

use super::ParseOptionError;
use crate::error::{Error, Result};

/// Resampling filter used when resizing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Interpolation {
    /// Antialiased bilinear, like Pillow's `BILINEAR` (torchvision's default).
    #[default]
    Bilinear,
    /// Antialiased bicubic (Catmull-Rom, a = -0.5), like Pillow's `BICUBIC`.
    Bicubic,
    /// Nearest neighbour, like Pillow's `NEAREST`.
    Nearest,
    /// Antialiased Lanczos-3, like Pillow's `LANCZOS`.
    Lanczos,
    /// Antialiased box (each output the mean of the samples it covers), like Pillow's `BOX`.
    Box,
    /// Antialiased Hamming-windowed sinc, like Pillow's `HAMMING`.
    Hamming,
}

named_choices!(
    Interpolation,
    "interpolation",
    [
        (Interpolation::Bilinear, ["bilinear"]),
        (Interpolation::Bicubic, ["bicubic"]),
        (Interpolation::Nearest, ["nearest"]),
        (Interpolation::Lanczos, ["lanczos"]),
        (Interpolation::Box, ["box"]),
        (Interpolation::Hamming, ["hamming"]),
    ]
);

/// A range `min..=max` a random draw is taken from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DrawRange {
    /// The smallest value.
    pub min: f64,
    /// The largest value.
    pub max: f64,
}

impl DrawRange {
    /// `min..=max`.
    pub const fn new(min: f64, max: f64) -> DrawRange {
        DrawRange { min, max }
    }

    fn check(&self, option: &'static str) -> Result<()> {
        if self.min.is_finite() && self.max.is_finite() && 0.0 < self.min && self.min <= self.max {
            return Ok(());
        }
        Err(Error::invalid(
            option,
            format!(
                "({}, {}): need 0 < min <= max, both finite",
                self.min, self.max
            ),
        ))
    }
}

/// torchvision's `RandomResizedCrop` defaults: the crop's area 8% to 100% of the image's.
pub const RANDOM_CROP_SCALE: DrawRange = DrawRange::new(0.08, 1.0);

/// torchvision's `RandomResizedCrop` defaults: the crop's aspect ratio 3/4 to 4/3.
pub const RANDOM_CROP_RATIO: DrawRange = DrawRange::new(3.0 / 4.0, 4.0 / 3.0);

/// torchvision's `RandomHorizontalFlip` default: half the images mirrored.
pub const RANDOM_FLIP_CHANCE: f64 = 0.5;

/// How an image becomes an output of `height` x `width` pixels. The output size is part of the
/// mode, so no other option can change it.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum ResizeMode {
    /// torchvision's `Resize(shorter_side)` then `CenterCrop((height, width))`: the shorter side
    /// becomes `shorter_side`, the longer keeps the aspect ratio, and the centre is cut out
    /// (padded with zeros where the crop is larger than the resized image, as torchvision does).
    ShorterSideThenCenterCrop {
        /// Target length of the shorter side.
        shorter_side: u32,
        /// Output height.
        height: u32,
        /// Output width.
        width: u32,
    },
    /// Resize straight to `height` x `width`, ignoring the aspect ratio.
    Stretch {
        /// Output height.
        height: u32,
        /// Output width.
        width: u32,
    },
    /// Keep the aspect ratio, fit the whole image inside `height` x `width`, and pad the rest
    /// with `pad` (detection models' letterbox).
    Letterbox {
        /// Output height.
        height: u32,
        /// Output width.
        width: u32,
        /// Value of every padded channel, 0..=255.
        pad: u8,
    },
    /// torchvision's `RandomResizedCrop((height, width), scale, ratio)` for training: a box of
    /// the image whose area is a random share (`scale`) of the image's and whose aspect ratio
    /// is log-uniform in `ratio` (torchvision's ten tries, then its centre fallback), cropped,
    /// then resized to `height` x `width` (antialiased, as `resized_crop` does). The box is
    /// drawn anew for every image and epoch from the seed ([`ResizeOptions::seed`]), the
    /// epoch and the image's index in the source alone; only the part of a JPEG inside it is
    /// decoded.
    RandomResizedCrop {
        /// Output height.
        height: u32,
        /// Output width.
        width: u32,
        /// The crop's area as a share of the image's.
        scale: DrawRange,
        /// The crop's aspect ratio (width / height), drawn log-uniformly.
        ratio: DrawRange,
    },
}

impl ResizeMode {
    /// torchvision's `Resize(shorter_side)` + `CenterCrop(crop)`, a square output.
    pub const fn center_crop(shorter_side: u32, crop: u32) -> ResizeMode {
        ResizeMode::ShorterSideThenCenterCrop {
            shorter_side,
            height: crop,
            width: crop,
        }
    }

    /// A plain resize to `height` x `width`.
    pub const fn stretch(height: u32, width: u32) -> ResizeMode {
        ResizeMode::Stretch { height, width }
    }

    /// Fit inside `height` x `width`, padding with `pad`.
    pub const fn letterbox(height: u32, width: u32, pad: u8) -> ResizeMode {
        ResizeMode::Letterbox { height, width, pad }
    }

    /// torchvision's `RandomResizedCrop(size)` with its default scale and ratio: a square output.
    pub const fn random_resized_crop(size: u32) -> ResizeMode {
        ResizeMode::RandomResizedCrop {
            height: size,
            width: size,
            scale: RANDOM_CROP_SCALE,
            ratio: RANDOM_CROP_RATIO,
        }
    }

    /// Output `(height, width)` in pixels.
    pub fn output_size(self) -> (u32, u32) {
        match self {
            ResizeMode::ShorterSideThenCenterCrop { height, width, .. }
            | ResizeMode::Stretch { height, width }
            | ResizeMode::Letterbox { height, width, .. }
            | ResizeMode::RandomResizedCrop { height, width, .. } => (height, width),
        }
    }

    /// The mode's name: `center-crop`, `stretch`, `letterbox` or `random-resized-crop`.
    pub fn name(self) -> &'static str {
        match self {
            ResizeMode::ShorterSideThenCenterCrop { .. } => "center-crop",
            ResizeMode::Stretch { .. } => "stretch",
            ResizeMode::Letterbox { .. } => "letterbox",
            ResizeMode::RandomResizedCrop { .. } => "random-resized-crop",
        }
    }

    /// Whether each image's box is drawn at random.
    pub fn is_random(self) -> bool {
        matches!(self, ResizeMode::RandomResizedCrop { .. })
    }
}

impl Default for ResizeMode {
    /// torchvision's evaluation transform: `Resize(256)` + `CenterCrop(224)`.
    fn default() -> Self {
        ResizeMode::center_crop(256, 224)
    }
}

impl fmt::Display for ResizeMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ResizeMode::ShorterSideThenCenterCrop {
                shorter_side,
                height,
                width,
            } => write!(f, "resize {shorter_side}, center crop {height}x{width}"),
            ResizeMode::Stretch { height, width } => write!(f, "stretch to {height}x{width}"),
            ResizeMode::Letterbox { height, width, pad } => {
                write!(f, "letterbox {height}x{width}, pad {pad}")
            }
            ResizeMode::RandomResizedCrop {
                height,
                width,
                scale,
                ratio,
            } => write!(
                f,
                "random resized crop to {height}x{width}, scale {}-{}, ratio {:.4}-{:.4}",
                scale.min, scale.max, ratio.min, ratio.max
            ),
        }
    }
}

/// Pixels to the output size: the resize mode (which owns the output size), the filter and the
/// random transforms of training.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct ResizeOptions {
    /// How an image reaches the output size (default `Resize(256)` + `CenterCrop(224)`).
    pub mode: ResizeMode,
    /// Resampling filter (default antialiased bilinear).
    pub interpolation: Interpolation,
    /// torchvision's `RandomHorizontalFlip(p)`: the chance, 0 to 1, that an image is mirrored
    /// left to right after it is resized (default 0: never).
    pub horizontal_flip: f64,
    /// Seed of the random transforms (a random crop's box, a flip): each image's draws depend on
    /// this seed, the epoch and its index in the source alone (default 0).
    pub seed: u64,
    /// The Pillow version (major, minor) whose rounding to reproduce (default 13.0). Pillow
    /// rounds to 8 bits between its horizontal and vertical pass, and chose which runs first
    /// differently before 12.2, in 12.2 and 12.3, and from 13.0 on; a level of difference at
    /// places. The GPU lane resamples as Pillow 13 does, so hybrid decoding takes only 13.0 or
    /// later.
    pub pillow_version: (u32, u32),
}

impl Default for ResizeOptions {
    fn default() -> ResizeOptions {
        ResizeOptions {
            mode: ResizeMode::default(),
            interpolation: Interpolation::default(),
            horizontal_flip: 0.0,
            seed: 0,
            pillow_version: PILLOW_VERSION,
        }
    }
}

/// The Pillow version gpufeed reproduces by default: the latest, 13.0.
pub const PILLOW_VERSION: (u32, u32) = (13, 0);

impl ResizeOptions {
    /// Sets [`ResizeOptions::pillow_version`].
    pub fn pillow_version(mut self, major: u32, minor: u32) -> Self {
        self.pillow_version = (major, minor);
        self
    }

    /// torchvision's ImageNet training transform, `RandomResizedCrop(size)` +
    /// `RandomHorizontalFlip()`, drawn from `seed`.
    pub fn imagenet_train(size: u32, seed: u64) -> ResizeOptions {
        ResizeOptions::default()
            .mode(ResizeMode::random_resized_crop(size))
            .horizontal_flip(RANDOM_FLIP_CHANCE)
            .seed(seed)
    }

    /// Sets [`ResizeOptions::horizontal_flip`].
    pub fn horizontal_flip(mut self, chance: f64) -> Self {
        self.horizontal_flip = chance;
        self
    }

    /// Sets [`ResizeOptions::seed`].
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Whether each image draws random transforms (a random crop, or a chance of a flip).
    pub fn is_random(&self) -> bool {
        self.mode.is_random() || self.horizontal_flip > 0.0
    }

    /// Sets [`ResizeOptions::mode`].
    pub fn mode(mut self, mode: ResizeMode) -> Self {
        self.mode = mode;
        self
    }

    /// Sets [`ResizeOptions::interpolation`].
    pub fn interpolation(mut self, interpolation: Interpolation) -> Self {
        self.interpolation = interpolation;
        self
    }

    /// Output `(height, width)`.
    pub fn output_size(&self) -> (u32, u32) {
        self.mode.output_size()
    }

    /// Bytes of one output image as u8 RGB (`height * width * 3`), or an error naming the
    /// option when that does not fit in memory's address space.
    pub fn image_bytes(&self) -> Result<usize> {
        let (h, w) = self.output_size();
        (h as usize)
            .checked_mul(w as usize)
            .and_then(|p| p.checked_mul(3))
            .ok_or_else(|| {
                Error::invalid(
                    "resize",
                    format!("an output of {h}x{w} (height x width) is too large"),
                )
            })
    }

    pub(super) fn validate(&self) -> Result<()> {
        let (h, w) = self.output_size();
        if h == 0 || w == 0 {
            return Err(Error::invalid(
                "resize",
                format!("output size {h}x{w} (height x width) has no pixels"),
            ));
        }
        if let ResizeMode::ShorterSideThenCenterCrop {
            shorter_side: 0, ..
        } = self.mode
        {
            return Err(Error::invalid(
                "resize",
                "resize to a shorter side of 0 pixels",
            ));
        }
        if let ResizeMode::RandomResizedCrop { scale, ratio, .. } = self.mode {
            scale.check("scale")?;
            ratio.check("ratio")?;
        }
        if !(0.0..=1.0).contains(&self.horizontal_flip) {
            return Err(Error::invalid(
                "horizontal_flip",
                format!("{} is not a chance from 0 to 1", self.horizontal_flip),
            ));
        }
        self.image_bytes().map(|_| ())
    }
}
