//! Augmentations of training, on the output pixels after the resize and before the normalize:
//! the automatic policy, colour jitter, random erasing and the batch's MixUp or CutMix, and the
//! recipes that set several at once. What each image draws from them is the augment stage's.

use std::fmt;
use std::str::FromStr;

use super::{DrawRange, ParseOptionError};
use crate::error::{Error, Result};

/// torchvision's `ColorJitter(brightness, contrast, saturation, hue)`: each factor drawn
/// uniformly from `[max(0, 1 - b), 1 + b]` (hue from `[-h, h]`), the four applied in a random
/// order. A zero leaves that adjustment out (default: all zero, no jitter).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ColorJitter {
    /// Brightness spread `b`.
    pub brightness: f64,
    /// Contrast spread.
    pub contrast: f64,
    /// Saturation spread.
    pub saturation: f64,
    /// Hue spread, 0 to 0.5.
    pub hue: f64,
}

impl ColorJitter {
    /// Whether any adjustment is drawn.
    pub fn is_on(&self) -> bool {
        self.brightness > 0.0 || self.contrast > 0.0 || self.saturation > 0.0 || self.hue > 0.0
    }

    pub(super) fn check(&self) -> Result<()> {
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        if !(ok(self.brightness) && ok(self.contrast) && ok(self.saturation)) {
            return Err(Error::invalid(
                "color_jitter",
                format!("{self:?}: brightness, contrast and saturation must be finite and >= 0"),
            ));
        }
        if !(ok(self.hue) && self.hue <= 0.5) {
            return Err(Error::invalid(
                "color_jitter",
                format!("hue {}: must be 0 to 0.5", self.hue),
            ));
        }
        Ok(())
    }

    /// The ranges torchvision's `_check_input` makes of the spreads (`None`: left out).
    pub(crate) fn ranges(&self) -> [Option<(f64, f64)>; 4] {
        let around_one = |v: f64| (v > 0.0).then(|| ((1.0 - v).max(0.0), 1.0 + v));
        [
            around_one(self.brightness),
            around_one(self.contrast),
            around_one(self.saturation),
            (self.hue > 0.0).then_some((-self.hue, self.hue)),
        ]
    }
}

/// torchvision's `RandomErasing(p, scale, ratio, value)` on the `uint8` image: with chance `p`,
/// a box of `scale` of the image's area and aspect ratio (height / width) log-uniform in
/// `ratio` is set to `value` (ten tries; none if no box fits).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct RandomErasing {
    /// Chance an image is erased.
    pub p: f64,
    /// The box's area as a share of the image's (default 0.02 to 0.33).
    pub scale: DrawRange,
    /// The box's aspect ratio (default 0.3 to 3.3).
    pub ratio: DrawRange,
    /// The value the box is set to, per channel (default 0, torchvision's on `uint8`).
    pub value: [u8; 3],
}

impl RandomErasing {
    /// `RandomErasing(p)` with torchvision's defaults.
    pub fn new(p: f64) -> RandomErasing {
        RandomErasing {
            p,
            scale: DrawRange::new(0.02, 0.33),
            ratio: DrawRange::new(0.3, 3.3),
            value: [0; 3],
        }
    }

    /// Sets [`RandomErasing::value`].
    pub fn value(mut self, value: [u8; 3]) -> Self {
        self.value = value;
        self
    }

    /// Sets [`RandomErasing::scale`].
    pub fn scale(mut self, scale: DrawRange) -> Self {
        self.scale = scale;
        self
    }

    /// Sets [`RandomErasing::ratio`].
    pub fn ratio(mut self, ratio: DrawRange) -> Self {
        self.ratio = ratio;
        self
    }

    fn check(&self) -> Result<()> {
        let range_ok = |r: DrawRange, low: f64, high: f64| {
            r.min.is_finite()
                && r.max.is_finite()
                && low <= r.min
                && r.min <= r.max
                && r.max <= high
        };
        let wrong = |reason: String| Err(Error::invalid("random_erasing", reason));
        if !(0.0..=1.0).contains(&self.p) {
            return wrong(format!("{} is not a chance from 0 to 1", self.p));
        }
        if !range_ok(self.scale, 0.0, 1.0) {
            return wrong(format!(
                "scale {}..{}: a range of shares of the image, within 0..1, min <= max",
                self.scale.min, self.scale.max
            ));
        }
        if !range_ok(self.ratio, f64::MIN_POSITIVE, f64::MAX) {
            return wrong(format!(
                "ratio {}..{}: a range of aspect ratios above 0, min <= max",
                self.ratio.min, self.ratio.max
            ));
        }
        Ok(())
    }
}

/// A training recipe: several augmentation options set at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Recipe {
    /// torchvision's ImageNet recipe (`references/classification`, `--auto-augment ta_wide
    /// --random-erase 0.1 --mixup-alpha 0.2 --cutmix-alpha 1.0`): RandomResizedCrop +
    /// RandomHorizontalFlip, TrivialAugmentWide, RandomErasing(0.1) and, per batch, MixUp(0.2)
    /// or CutMix(1.0). The recipe erases after the normalize (to 0, the mean colour); here the
    /// box is set to the mean colour in `uint8`, `(124, 116, 104)`.
    TorchvisionImagenet,
}

impl fmt::Display for Recipe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Recipe::TorchvisionImagenet => f.write_str("torchvision-imagenet"),
        }
    }
}

impl FromStr for Recipe {
    type Err = ParseOptionError;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().replace('_', "-").as_str() {
            "torchvision-imagenet" => Ok(Recipe::TorchvisionImagenet),
            _ => Err(ParseOptionError::new("recipe", s, "torchvision-imagenet")),
        }
    }
}

impl Recipe {
    /// The recipe's augmentations.
    pub fn augment_options(self) -> AugmentOptions {
        match self {
            Recipe::TorchvisionImagenet => AugmentOptions {
                policy: Augment::TrivialAugmentWide,
                random_erasing: Some(RandomErasing::new(0.1).value(ERASE_TO_MEAN)),
                mixup: Some(0.2),
                cutmix: Some(1.0),
                ..AugmentOptions::default()
            },
        }
    }
}

/// ImageNet's mean colour in `uint8`: `round(255 * mean)`.
pub const ERASE_TO_MEAN: [u8; 3] = [124, 116, 104];

/// Augmentations of training, after the resize and before the normalize (default: none).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub struct AugmentOptions {
    /// The automatic augmentation policy (default none).
    pub policy: Augment,
    /// Value of the pixels that geometric operations bring in from outside the image, per
    /// channel (torchvision's `fill`; default 0).
    pub fill: [u8; 3],
    /// Colour jitter, applied before the policy (default none).
    pub color_jitter: ColorJitter,
    /// Random erasing, applied after the policy (default none).
    pub random_erasing: Option<RandomErasing>,
    /// `MixUp(alpha)` across each batch (default none).
    pub mixup: Option<f64>,
    /// `CutMix(alpha)` across each batch (default none); with MixUp too, each batch takes one
    /// of the two, each half the time.
    pub cutmix: Option<f64>,
    /// Classes of the soft labels MixUp and CutMix make; `None`: the source's class count
    /// ([`crate::Source::image_folder`]).
    pub num_classes: Option<usize>,
}

impl AugmentOptions {
    /// Sets [`AugmentOptions::policy`].
    pub fn policy(mut self, policy: Augment) -> Self {
        self.policy = policy;
        self
    }

    /// Sets [`AugmentOptions::color_jitter`].
    pub fn color_jitter(mut self, jitter: ColorJitter) -> Self {
        self.color_jitter = jitter;
        self
    }

    /// Sets [`AugmentOptions::random_erasing`].
    pub fn random_erasing(mut self, erasing: Option<RandomErasing>) -> Self {
        self.random_erasing = erasing;
        self
    }

    /// Sets [`AugmentOptions::mixup`].
    pub fn mixup(mut self, alpha: Option<f64>) -> Self {
        self.mixup = alpha;
        self
    }

    /// Sets [`AugmentOptions::cutmix`].
    pub fn cutmix(mut self, alpha: Option<f64>) -> Self {
        self.cutmix = alpha;
        self
    }

    /// Sets [`AugmentOptions::num_classes`].
    pub fn num_classes(mut self, classes: Option<usize>) -> Self {
        self.num_classes = classes;
        self
    }

    /// Sets [`AugmentOptions::fill`].
    pub fn fill(mut self, fill: [u8; 3]) -> Self {
        self.fill = fill;
        self
    }

    /// Whether each image draws augmentations of its own.
    pub fn per_image(&self) -> bool {
        self.policy != Augment::None || self.color_jitter.is_on() || self.random_erasing.is_some()
    }

    /// Whether batches are mixed.
    pub fn mixes(&self) -> bool {
        self.mixup.is_some() || self.cutmix.is_some()
    }

    /// Whether anything is augmented.
    pub fn is_on(&self) -> bool {
        self.per_image() || self.mixes()
    }

    pub(super) fn validate(&self) -> Result<()> {
        self.policy
            .check()
            .map_err(|reason| Error::invalid("augment", reason))?;
        self.color_jitter.check()?;
        if let Some(e) = &self.random_erasing {
            e.check()?;
        }
        for (name, alpha) in [("mixup", self.mixup), ("cutmix", self.cutmix)] {
            if let Some(alpha) = alpha {
                if !(alpha.is_finite() && alpha > 0.0) {
                    return Err(Error::invalid(name, format!("alpha {alpha}: must be > 0")));
                }
            }
        }
        if self.num_classes == Some(0) {
            return Err(Error::invalid("num_classes", "must be at least 1"));
        }
        Ok(())
    }
}

/// An automatic augmentation policy of torchvision v2, applied to each image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Augment {
    /// No policy (default).
    #[default]
    None,
    /// `TrivialAugmentWide()`: one operation of 14, uniformly, at a magnitude drawn uniformly
    /// from 31 bins of its wide range, its sign a coin flip.
    TrivialAugmentWide,
    /// `RandAugment(num_ops, magnitude)`: `num_ops` operations of 14, each uniformly, at bin
    /// `magnitude` of 31.
    RandAugment {
        /// Operations per image (torchvision's default 2), at most [`MAX_RAND_AUGMENT_OPS`].
        num_ops: u32,
        /// The magnitude bin, 0 to 30 (torchvision's default 9).
        magnitude: u32,
    },
    /// `AutoAugment(AutoAugmentPolicy.IMAGENET)`: one of the 25 sub-policies learned on ImageNet.
    AutoAugment,
}

/// The most operations [`Augment::RandAugment`] applies to one image.
pub const MAX_RAND_AUGMENT_OPS: u32 = 8;

/// RandAugment's magnitude bins (torchvision's `num_magnitude_bins` default).
pub(crate) const RAND_AUGMENT_BINS: usize = 31;

impl fmt::Display for Augment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Augment::None => f.write_str("none"),
            Augment::TrivialAugmentWide => f.write_str("trivial-augment-wide"),
            Augment::RandAugment { num_ops, magnitude } => {
                write!(f, "rand-augment:{num_ops}:{magnitude}")
            }
            Augment::AutoAugment => f.write_str("auto-augment"),
        }
    }
}

impl FromStr for Augment {
    type Err = ParseOptionError;

    /// `none`, `trivial-augment-wide`, `rand-augment` (2 operations at magnitude 9),
    /// `rand-augment:N:M`, or `auto-augment` (its ImageNet policy); `_` for `-` and any case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let fail = || {
            ParseOptionError::new(
                "augmentation",
                s,
                "none trivial-augment-wide rand-augment rand-augment:N:M auto-augment",
            )
        };
        let name = s.trim().to_ascii_lowercase().replace('_', "-");
        let mut parts = name.split(':');
        let head = parts.next().unwrap_or_default();
        let rest: Vec<&str> = parts.collect();
        let number = |t: &str| t.trim().parse::<u32>().map_err(|_| fail());
        match (head, rest.as_slice()) {
            ("none", []) => Ok(Augment::None),
            ("trivial-augment-wide" | "trivialaugmentwide" | "ta-wide", []) => {
                Ok(Augment::TrivialAugmentWide)
            }
            ("rand-augment" | "randaugment", []) => Ok(Augment::RandAugment {
                num_ops: 2,
                magnitude: 9,
            }),
            ("rand-augment" | "randaugment", [n, m]) => Ok(Augment::RandAugment {
                num_ops: number(n)?,
                magnitude: number(m)?,
            }),
            ("auto-augment" | "autoaugment", []) | ("auto-augment", ["imagenet"]) => {
                Ok(Augment::AutoAugment)
            }
            _ => Err(fail()),
        }
    }
}

impl Augment {
    /// Checks the policy's numbers; the error says which is wrong.
    pub(crate) fn check(&self) -> Result<(), String> {
        if let Augment::RandAugment { num_ops, magnitude } = *self {
            if num_ops > MAX_RAND_AUGMENT_OPS {
                return Err(format!(
                    "rand-augment with {num_ops} operations: at most {MAX_RAND_AUGMENT_OPS}"
                ));
            }
            if magnitude as usize >= RAND_AUGMENT_BINS {
                return Err(format!(
                    "rand-augment magnitude {magnitude}: the bins are 0 to {}",
                    RAND_AUGMENT_BINS - 1
                ));
            }
        }
        Ok(())
    }
}
