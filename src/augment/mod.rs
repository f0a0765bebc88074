//! The augmentations of modern training recipes, on the `u8` batch after the resize and before
//! the normalize: torchvision v2's automatic policies ([`Augment`]: `TrivialAugmentWide`,
//! `RandAugment`, `AutoAugment`), [`ColorJitter`], [`RandomErasing`], and across the batch
//! `MixUp` and `CutMix` ([`Mix`]) with soft labels.
//!
//! Pure: what each image draws (`AugmentPlan`, from (seed, epoch, source index) alone, like
//! the crops) and what each batch draws (from (seed, epoch, batch number)), the operations as
//! torchvision's functional calls ([`Op`]), and the CPU rendition of the kernels
//! (`kernels/augment.cu`), bit for bit: the oracle the kernels are tested against and what the
//! CPU device runs.

mod mix;
mod ops;
mod policy;

use std::fmt;
use std::str::FromStr;

use rayon::prelude::*;

pub use mix::Mix;
pub use ops::Op;
pub use policy::{Augment, MAX_RAND_AUGMENT_OPS};

pub(crate) use mix::{mix_normalize, soft_labels};
pub(crate) use ops::KernelOp;

use crate::error::{Error, Result};
use crate::options::{DrawRange, ParseOptionError};
use crate::random::Draws;

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

    fn check(&self) -> Result<()> {
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
    fn ranges(&self) -> [Option<(f64, f64)>; 4] {
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
        if !(0.0..=1.0).contains(&self.p)
            || !range_ok(self.scale, 0.0, 1.0)
            || !range_ok(self.ratio, f64::MIN_POSITIVE, f64::MAX)
        {
            return Err(Error::invalid(
                "random_erasing",
                format!(
                    "p {} (0 to 1), scale {:?} (within 0..1), ratio {:?} (> 0): need min <= max",
                    self.p, self.scale, self.ratio
                ),
            ));
        }
        Ok(())
    }

    /// RandomErasing's draws for an image of `width` x `height`: `torch.rand(1) < p`, then
    /// ten tries of an area and a log-uniform ratio (float32 draws) for a box
    /// `h = round(sqrt(area * ratio))`, `w = round(sqrt(area / ratio))` smaller than the
    /// image, at `randint(0, H - h + 1)`, `randint(0, W - w + 1)`.
    fn draw(&self, width: u32, height: u32, draws: &mut Draws) -> Option<Op> {
        if draws.uniform_f32(0.0, 1.0) >= self.p as f32 {
            return None;
        }
        let area = f64::from(width) * f64::from(height);
        let log_ratio = ((self.ratio.min as f32).ln(), (self.ratio.max as f32).ln());
        for _ in 0..10 {
            let erase_area =
                area * f64::from(draws.uniform_f32(self.scale.min as f32, self.scale.max as f32));
            let aspect = f64::from(draws.uniform_f32(log_ratio.0, log_ratio.1).exp());
            let h = (erase_area * aspect).sqrt().round_ties_even() as u64;
            let w = (erase_area / aspect).sqrt().round_ties_even() as u64;
            if !(h < u64::from(height) && w < u64::from(width)) {
                continue;
            }
            let i = draws.below(u64::from(height) - h + 1) as u32;
            let j = draws.below(u64::from(width) - w + 1) as u32;
            return Some(Op::Erase {
                i,
                j,
                h: h as u32,
                w: w as u32,
                v: self.value,
            });
        }
        None
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

    pub(crate) fn validate(&self) -> Result<()> {
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

/// Salts that keep the augmentations' streams apart from the crops' (same seed, epoch and
/// index) and from each other.
const IMAGE_SALT: u64 = 0x6A09_E667_F3BC_C908;
const BATCH_SALT: u64 = 0xBB67_AE85_84CA_A73B;

/// What one image's augmentations drew: torchvision's functional calls, in order.
pub type ImageOps = Vec<Op>;

/// The draws of a pipeline's augmentations: the options, the seed and the output size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Augmenter {
    pub options: AugmentOptions,
    pub seed: u64,
    pub width: u32,
    pub height: u32,
}

impl Augmenter {
    /// The calls image `index` of `epoch` draws: the colour jitter's (in its random order), the
    /// policy's, the erasing.
    pub fn image_ops(&self, index: usize, epoch: u64) -> ImageOps {
        let mut draws = Draws::for_image(self.seed ^ IMAGE_SALT, epoch, index);
        let mut ops = Vec::new();
        let o = &self.options;
        if o.color_jitter.is_on() {
            // torch.randperm(4), then each factor in order b, c, s, h.
            let mut order = [0usize, 1, 2, 3];
            for i in (1..4).rev() {
                let j = draws.below(i as u64 + 1) as usize;
                order.swap(i, j);
            }
            let factors = o
                .color_jitter
                .ranges()
                .map(|r| r.map(|(lo, hi)| f64::from(draws.uniform_f32(lo as f32, hi as f32))));
            for k in order {
                match (k, factors[k]) {
                    (0, Some(f)) => ops.push(Op::Brightness(f)),
                    (1, Some(f)) => ops.push(Op::Contrast(f)),
                    (2, Some(f)) => ops.push(Op::Saturation(f)),
                    (3, Some(f)) => ops.push(Op::Hue(f)),
                    _ => {}
                }
            }
        }
        policy::draw_policy(
            o.policy,
            self.width,
            self.height,
            o.fill,
            &mut draws,
            &mut ops,
            None,
        );
        if let Some(erasing) = &o.random_erasing {
            if let Some(op) = erasing.draw(self.width, self.height, &mut draws) {
                ops.push(op);
            }
        }
        ops
    }

    /// What batch `batch` of `epoch` mixes, when batches are mixed.
    pub fn batch_mix(&self, batch: u64, epoch: u64) -> Option<Mix> {
        let mut draws = Draws::for_image(self.seed ^ BATCH_SALT, epoch, batch as usize);
        mix::draw_mix(
            self.options.mixup,
            self.options.cutmix,
            self.width,
            self.height,
            &mut draws,
        )
    }

    /// The plan of a batch of the images `indices` (source indices), batch number `batch` of
    /// `epoch`.
    pub fn plan(&self, indices: &[usize], epoch: u64, batch: u64) -> AugmentPlan {
        let rows: Vec<ImageOps> = if self.options.per_image() {
            indices
                .iter()
                .map(|&index| self.image_ops(index, epoch))
                .collect()
        } else {
            vec![Vec::new(); indices.len()]
        };
        let (w, h) = (self.width as usize, self.height as usize);
        let mut kernel_ops = Vec::new();
        let mut starts = Vec::with_capacity(rows.len() + 1);
        for ops in &rows {
            starts.push(kernel_ops.len() as u32);
            kernel_ops.extend(ops.iter().filter_map(|op| op.kernel(w, h)));
        }
        starts.push(kernel_ops.len() as u32);
        AugmentPlan {
            rows,
            kernel_ops,
            starts,
            mix: if self.options.mixes() {
                self.batch_mix(batch, epoch)
            } else {
                None
            },
        }
    }
}

/// What a batch's augmentations drew: each row's calls, the kernel's work for them, and the
/// batch's mixing.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AugmentPlan {
    /// Each row's calls.
    pub rows: Vec<ImageOps>,
    /// The kernel's operations, row after row.
    pub kernel_ops: Vec<KernelOp>,
    /// Where each row's operations start in `kernel_ops` (one more entry: the end).
    pub starts: Vec<u32>,
    /// The batch's mixing.
    pub mix: Option<Mix>,
}

impl AugmentPlan {
    /// Whether any row has work for the kernel.
    pub fn has_image_ops(&self) -> bool {
        !self.kernel_ops.is_empty()
    }
}

/// The CPU rendition of `kernels/augment.cu` on a batch: each of the first `n` images of
/// `height` x `width` packed RGB8 in `pixels` gets its row's operations, in order; images in
/// parallel on the current rayon pool.
pub(crate) fn augment_batch(pixels: &mut [u8], height: usize, width: usize, plan: &AugmentPlan) {
    let image = height * width * 3;
    let n = plan.starts.len().saturating_sub(1);
    if image == 0 {
        return;
    }
    pixels[..n * image]
        .par_chunks_mut(image)
        .enumerate()
        .for_each_init(
            || vec![0u8; image],
            |scratch, (row, img)| {
                let ops =
                    &plan.kernel_ops[plan.starts[row] as usize..plan.starts[row + 1] as usize];
                for op in ops {
                    ops::apply(op, img, scratch, height, width);
                }
            },
        );
}

/// Applies `ops` (torchvision calls) to one image of `height` x `width` packed RGB8, as the
/// kernel and the CPU device do: what a test or a user holding `u8` pixels calls to reproduce a
/// row.
pub fn apply_ops(ops: &[Op], pixels: &mut [u8], height: usize, width: usize) -> Result<()> {
    let image = height * width * 3;
    if pixels.len() < image {
        return Err(Error::Mismatch(format!(
            "{} bytes hold no {width}x{height} RGB image",
            pixels.len()
        )));
    }
    let mut scratch = vec![0u8; image];
    for op in ops {
        if let Some(k) = op.kernel(width, height) {
            ops::apply(&k, pixels, &mut scratch, height, width);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
