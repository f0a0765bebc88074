//! Images as patch sequences for vision transformers and vision-language models: per image a
//! size chosen by the model's rule (keeping the aspect ratio within a patch budget), then
//! patches in the model's order, normalized with the reference's own float arithmetic, packed
//! one image after another (`cu_seqlens`) or padded with a mask and patch coordinates.
//!
//! The presets ([`Preset`]) follow their references exactly:
//!
//! - `qwen2-vl`: transformers' `Qwen2VLImageProcessor` (its PIL processor; the torchvision one
//!   with [`PatchResize::TorchvisionUint8`] and [`Arithmetic::TorchFused`]): `smart_resize`
//!   to multiples of 28 between `min_pixels` and `max_pixels`, bicubic, patches of 14, a
//!   temporal patch of 2 (the still image repeated), 2 x 2 merged; `pixel_values` and
//!   `image_grid_thw`;
//! - `siglip2-naflex`: transformers' `Siglip2ImageProcessor`: the largest size of at most
//!   `max_patches` patches of 16 keeping the aspect ratio, bilinear; `pixel_values` padded to
//!   `max_patches`, `pixel_attention_mask`, `spatial_shapes`;
//! - `timm-naflex`: timm's NaFlex training ([`naflex`]'s module doc says what is reproduced):
//!   a sequence length per batch, the batch size from a token budget, a random resized crop to
//!   that length's patch grid, a flip, patch coordinates and a valid mask.
//!
//! This module is the pure planning: sizes, grids, draws, the token order, the batch layout and
//! the arithmetic. The CPU lane renders it (`crate::cpu::patches`), `kernels/patches.cu` lays
//! tokens out on the GPU from resized images.

mod eval;
mod layout;
pub mod naflex;
mod normalize;
mod qwen2_vl;
mod siglip2;

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::options::{DrawRange, Interpolation, ParseOptionError};
use crate::random::Draws;

pub use eval::EvalPreset;
pub use layout::{BatchLayout, ImageTokens, Packing, TokenOrder};
pub use naflex::{NaflexBatch, NaflexCrop, NaflexSchedule};
pub use normalize::{Arithmetic, NormalizeConstants, RESCALE};
pub use qwen2_vl::{smart_resize, MAX_ASPECT_RATIO};
pub use siglip2::size_for_max_patches;

/// OpenAI CLIP's channel means (transformers' `OPENAI_CLIP_MEAN`), Qwen2-VL's too.
pub const OPENAI_CLIP_MEAN: [f64; 3] = [0.48145466, 0.4578275, 0.40821073];
/// OpenAI CLIP's channel standard deviations (`OPENAI_CLIP_STD`).
pub const OPENAI_CLIP_STD: [f64; 3] = [0.26862954, 0.26130258, 0.27577711];
/// timm's `IMAGENET_DEFAULT_MEAN`, as the Python floats.
pub const TIMM_IMAGENET_MEAN: [f64; 3] = [0.485, 0.456, 0.406];
/// timm's `IMAGENET_DEFAULT_STD`, as the Python floats.
pub const TIMM_IMAGENET_STD: [f64; 3] = [0.229, 0.224, 0.225];

/// Why an image cannot be planned as patches (the caller names the image).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PatchError {
    /// The image has no pixels.
    #[error("the image has no pixels")]
    Empty,
    /// Qwen2-VL's `smart_resize` refuses this aspect ratio.
    #[error(
        "{width}x{height}: aspect ratio {ratio:.1} is over the limit of {limit} that Qwen2-VL's \
         smart_resize accepts"
    )]
    AspectRatio {
        /// Image width.
        width: u32,
        /// Image height.
        height: u32,
        /// `max / min` of the sides.
        ratio: f64,
        /// The limit.
        limit: f64,
    },
    /// A resized side would not fit 32 bits.
    #[error("a resized side of {side} pixels is too large")]
    TooLarge {
        /// The side.
        side: u64,
    },
    /// timm's bisection found no scale (an image far too large for the sequence).
    #[error("{width}x{height}: no scale fits the sequence length")]
    NoScale {
        /// Width of the region.
        width: u32,
        /// Height of the region.
        height: u32,
    },
    /// A schedule without a sequence length.
    #[error("no sequence length above zero")]
    NoSequenceLength,
    /// An image with more tokens than the padded length.
    #[error("{tokens} tokens do not fit a padded length of {len}")]
    OverLength {
        /// The image's tokens.
        tokens: usize,
        /// The length.
        len: u32,
    },
}

/// A model family's patch rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Preset {
    /// transformers' `Qwen2VLImageProcessor`.
    Qwen2Vl,
    /// transformers' `Siglip2ImageProcessor`.
    Siglip2Naflex,
    /// timm's NaFlex training loader.
    TimmNaflex,
}

impl Preset {
    /// The name this value prints as and parses from: `qwen2-vl`, `siglip2-naflex`,
    /// `timm-naflex`.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Qwen2Vl => "qwen2-vl",
            Preset::Siglip2Naflex => "siglip2-naflex",
            Preset::TimmNaflex => "timm-naflex",
        }
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Preset {
    type Err = ParseOptionError;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        [Preset::Qwen2Vl, Preset::Siglip2Naflex, Preset::TimmNaflex]
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                ParseOptionError::new("patch preset", s, "qwen2-vl, siglip2-naflex, timm-naflex")
            })
    }
}

/// How the reference resizes the `u8` image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum PatchResize {
    /// Pillow's `Image.resize` (transformers' PIL processors, timm on PIL images).
    #[default]
    Pillow,
    /// torchvision's `resize` of a `uint8` tensor on the CPU, antialiased (transformers'
    /// torchvision processors on their default device): PyTorch's `uint8` kernels, weights in
    /// 16-bit fixed point at a precision chosen per axis, width first.
    TorchvisionUint8,
}

/// A patch-sequence output: the preset's rule with its settings. Start from a preset
/// ([`Patches::qwen2_vl`], [`Patches::siglip2_naflex`], [`Patches::timm_naflex`]) and change
/// what the model's configuration changes.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Patches {
    /// The rule.
    pub preset: Preset,
    /// Pixels per patch side.
    pub patch_size: u32,
    /// Qwen2-VL: patches merged per side (`merge_size`).
    pub merge_size: u32,
    /// Qwen2-VL: frames per temporal patch (`temporal_patch_size`).
    pub temporal_patch_size: u32,
    /// Qwen2-VL: the fewest pixels of a resized image (`min_pixels`, `shortest_edge`).
    pub min_pixels: u64,
    /// Qwen2-VL: the most pixels of a resized image (`max_pixels`, `longest_edge`).
    pub max_pixels: u64,
    /// SigLIP2: the most patches of an image, and the padded length (`max_num_patches`).
    pub max_patches: u32,
    /// timm: the sequence lengths a batch draws from (`train_seq_lens`).
    pub seq_lens: Vec<u32>,
    /// timm: tokens per batch (`batch_size * max(train_seq_lens)`).
    pub tokens_per_batch: u64,
    /// timm: batch sizes are multiples of this (`batch_divisor`).
    pub batch_divisor: u32,
    /// timm: the crop's area as a share of the image's.
    pub crop_scale: DrawRange,
    /// timm: the crop's aspect ratio relative to the image's, drawn log-uniformly.
    pub crop_ratio: DrawRange,
    /// timm: the chance of a left-right flip.
    pub horizontal_flip: f64,
    /// The resampling filter.
    pub interpolation: Interpolation,
    /// Whose resize arithmetic.
    pub resize: PatchResize,
    /// The Pillow version (major, minor) whose pass order [`PatchResize::Pillow`] reproduces
    /// (default 13.0; see `ResizeOptions::pillow_version`).
    pub pillow_version: (u32, u32),
    /// Channel means, 0..1 units, RGB.
    pub mean: [f64; 3],
    /// Channel standard deviations, 0..1 units, RGB.
    pub std: [f64; 3],
    /// Whose float arithmetic turns samples into values.
    pub arithmetic: Arithmetic,
    /// Images one after another with `cu_seqlens`, rather than padded with a mask.
    pub packed: bool,
    /// Transparent pixels composited onto white (transformers' `convert_to_rgb`) rather than
    /// their alpha dropped (Pillow's `convert("RGB")`, as timm's datasets load images).
    pub composite_alpha: bool,
}

impl Patches {
    /// transformers' `Qwen2VLImageProcessor` (and Qwen2.5-VL's) with its defaults:
    /// `min_pixels` 56 x 56, `max_pixels` 28 x 28 x 1280, patch 14, temporal patch 2, merge 2,
    /// bicubic, CLIP's mean and std, packed.
    pub fn qwen2_vl() -> Patches {
        Patches {
            preset: Preset::Qwen2Vl,
            patch_size: 14,
            merge_size: 2,
            temporal_patch_size: 2,
            min_pixels: 56 * 56,
            max_pixels: 28 * 28 * 1280,
            max_patches: 0,
            seq_lens: Vec::new(),
            tokens_per_batch: 0,
            batch_divisor: 1,
            crop_scale: crate::options::RANDOM_CROP_SCALE,
            crop_ratio: crate::options::RANDOM_CROP_RATIO,
            horizontal_flip: 0.0,
            interpolation: Interpolation::Bicubic,
            resize: PatchResize::Pillow,
            pillow_version: crate::options::PILLOW_VERSION,
            mean: OPENAI_CLIP_MEAN,
            std: OPENAI_CLIP_STD,
            arithmetic: Arithmetic::NumpyRescale,
            packed: true,
            composite_alpha: true,
        }
    }

    /// transformers' `Siglip2ImageProcessor`: 256 patches of 16, bilinear, mean and std 0.5,
    /// padded to `max_patches` with a mask.
    pub fn siglip2_naflex() -> Patches {
        Patches {
            preset: Preset::Siglip2Naflex,
            patch_size: 16,
            merge_size: 1,
            temporal_patch_size: 1,
            max_patches: 256,
            interpolation: Interpolation::Bilinear,
            mean: [0.5; 3],
            std: [0.5; 3],
            packed: false,
            ..Patches::qwen2_vl()
        }
    }

    /// timm's NaFlex training loader (`create_naflex_loader(is_training=True)`) with its
    /// defaults: patches of 16, sequence lengths 128, 256, 576, 784 and 1024, 32 x 1024 tokens a
    /// batch, batch sizes multiples of 8, crops of 8-100% of the area with ratios 3/4-4/3 of the
    /// image's, bilinear, half the images flipped, ImageNet's mean and std, padded to the
    /// batch's sequence length.
    pub fn timm_naflex() -> Patches {
        Patches {
            preset: Preset::TimmNaflex,
            patch_size: 16,
            merge_size: 1,
            temporal_patch_size: 1,
            seq_lens: vec![128, 256, 576, 784, 1024],
            tokens_per_batch: 32 * 1024,
            batch_divisor: 8,
            horizontal_flip: crate::options::RANDOM_FLIP_CHANCE,
            interpolation: Interpolation::Bilinear,
            mean: TIMM_IMAGENET_MEAN,
            std: TIMM_IMAGENET_STD,
            arithmetic: Arithmetic::TimmPrefetcher,
            packed: false,
            composite_alpha: false,
            ..Patches::qwen2_vl()
        }
    }

    /// The preset of `preset` with its defaults.
    pub fn preset(preset: Preset) -> Patches {
        match preset {
            Preset::Qwen2Vl => Patches::qwen2_vl(),
            Preset::Siglip2Naflex => Patches::siglip2_naflex(),
            Preset::TimmNaflex => Patches::timm_naflex(),
        }
    }

    /// Sets [`Patches::min_pixels`].
    pub fn min_pixels(mut self, pixels: u64) -> Self {
        self.min_pixels = pixels;
        self
    }

    /// Sets [`Patches::max_pixels`].
    pub fn max_pixels(mut self, pixels: u64) -> Self {
        self.max_pixels = pixels;
        self
    }

    /// Sets [`Patches::max_patches`].
    pub fn max_patches(mut self, patches: u32) -> Self {
        self.max_patches = patches;
        self
    }

    /// Sets [`Patches::seq_lens`].
    pub fn seq_lens(mut self, lens: &[u32]) -> Self {
        self.seq_lens = lens.to_vec();
        self
    }

    /// Sets [`Patches::tokens_per_batch`].
    pub fn tokens_per_batch(mut self, tokens: u64) -> Self {
        self.tokens_per_batch = tokens;
        self
    }

    /// Sets [`Patches::mean`] and [`Patches::std`].
    pub fn mean_std(mut self, mean: [f64; 3], std: [f64; 3]) -> Self {
        self.mean = mean;
        self.std = std;
        self
    }

    /// Sets [`Patches::resize`].
    pub fn resize(mut self, resize: PatchResize) -> Self {
        self.resize = resize;
        self
    }

    /// Sets [`Patches::arithmetic`].
    pub fn arithmetic(mut self, arithmetic: Arithmetic) -> Self {
        self.arithmetic = arithmetic;
        self
    }

    /// transformers' torchvision processor instead of its PIL one: PyTorch's `uint8` resize and
    /// the fused normalize.
    pub fn torchvision(self) -> Self {
        self.resize(PatchResize::TorchvisionUint8)
            .arithmetic(Arithmetic::TorchFused)
    }

    /// Sets [`Patches::packed`].
    pub fn packed(mut self, packed: bool) -> Self {
        self.packed = packed;
        self
    }

    /// Sets [`Patches::interpolation`].
    pub fn interpolation(mut self, interpolation: Interpolation) -> Self {
        self.interpolation = interpolation;
        self
    }

    /// Sets [`Patches::horizontal_flip`].
    pub fn horizontal_flip(mut self, chance: f64) -> Self {
        self.horizontal_flip = chance;
        self
    }

    /// Checks that the settings can work: a budget of at least one (merged) patch, sizes above
    /// zero, mean and std finite with std above zero.
    pub fn validate(&self) -> Result<()> {
        let p = u64::from(self.patch_size);
        if self.patch_size == 0 || self.patch_size > 1024 {
            return Err(Error::invalid("patch_size", "must be 1 to 1024"));
        }
        if self.merge_size == 0 || self.temporal_patch_size == 0 {
            return Err(Error::invalid(
                "merge_size",
                "merge_size and temporal_patch_size must be at least 1",
            ));
        }
        let ok = (0..3).all(|c| self.std[c].is_finite() && self.std[c] > 0.0)
            && self.mean.iter().all(|m| m.is_finite());
        if !ok {
            return Err(Error::invalid(
                "mean/std",
                "every mean must be finite and every std finite and > 0",
            ));
        }
        match self.preset {
            Preset::Qwen2Vl => {
                let unit = (p * u64::from(self.merge_size)).pow(2);
                if self.max_pixels < unit {
                    return Err(Error::invalid(
                        "max_pixels",
                        format!(
                            "{} is less than one merged patch ({unit} pixels)",
                            self.max_pixels
                        ),
                    ));
                }
                if self.min_pixels > self.max_pixels {
                    return Err(Error::invalid(
                        "min_pixels",
                        format!("{} is over max_pixels {}", self.min_pixels, self.max_pixels),
                    ));
                }
            }
            Preset::Siglip2Naflex if self.max_patches == 0 => {
                return Err(Error::invalid("max_patches", "must be at least 1"));
            }
            Preset::Siglip2Naflex => {}
            Preset::TimmNaflex => self.validate_timm()?,
        }
        Ok(())
    }

    fn validate_timm(&self) -> Result<()> {
        let longest = self.seq_lens.iter().copied().max().unwrap_or(0);
        if self.seq_lens.is_empty() || self.seq_lens.contains(&0) {
            return Err(Error::invalid(
                "seq_lens",
                "need at least one sequence length, each at least 1",
            ));
        }
        if self.tokens_per_batch < u64::from(longest) {
            return Err(Error::invalid(
                "tokens_per_batch",
                format!(
                    "{} is less than one sequence of {longest} tokens",
                    self.tokens_per_batch
                ),
            ));
        }
        let range_ok =
            |r: DrawRange| r.min.is_finite() && r.max.is_finite() && 0.0 < r.min && r.min <= r.max;
        if !range_ok(self.crop_scale) || !range_ok(self.crop_ratio) {
            return Err(Error::invalid(
                "crop_scale/crop_ratio",
                "need 0 < min <= max, both finite",
            ));
        }
        if !(0.0..=1.0).contains(&self.horizontal_flip) {
            return Err(Error::invalid(
                "horizontal_flip",
                "must be a chance from 0 to 1",
            ));
        }
        Ok(())
    }

    /// The order of tokens and values.
    pub fn token_order(&self) -> TokenOrder {
        match self.preset {
            Preset::Qwen2Vl => TokenOrder::Merged {
                merge: self.merge_size,
                temporal: self.temporal_patch_size,
            },
            Preset::Siglip2Naflex | Preset::TimmNaflex => TokenOrder::RowMajorChannelsLast,
        }
    }

    /// Values per token.
    pub fn patch_dim(&self) -> usize {
        self.token_order().patch_dim(self.patch_size)
    }

    /// The arithmetic's per-channel constants.
    pub fn constants(&self) -> NormalizeConstants {
        NormalizeConstants::new(self.arithmetic, self.mean, self.std)
    }

    /// The value of a padding token's elements, per channel: 0 where the reference pads after
    /// normalizing (SigLIP2), a black pixel's value where it pads before (timm's collator pads
    /// `uint8` patches that its prefetcher then normalizes).
    pub fn pad_values(&self) -> [f32; 3] {
        match self.preset {
            Preset::TimmNaflex => {
                let k = self.constants();
                [0, 1, 2].map(|c| k.value(c, 0))
            }
            Preset::Qwen2Vl | Preset::Siglip2Naflex => [0.0; 3],
        }
    }

    /// How a batch whose longest image has `longest` tokens, cut for sequences of `seq_len`
    /// (timm), is laid out.
    pub fn packing(&self, longest: u32, seq_len: Option<u32>) -> Packing {
        if self.packed {
            return Packing::Packed;
        }
        let len = match self.preset {
            Preset::Qwen2Vl => longest,
            Preset::Siglip2Naflex => self.max_patches,
            Preset::TimmNaflex => seq_len
                .or_else(|| self.seq_lens.iter().copied().max())
                .unwrap_or(longest),
        };
        Packing::Padded {
            len: len.max(longest),
        }
    }

    /// The plan of a `width` x `height` image without random draws: Qwen2-VL's and SigLIP2's
    /// sizes, and timm's evaluation resize (`ResizeToSequence` at the longest sequence length).
    pub fn plan(&self, width: u32, height: u32) -> std::result::Result<PatchPlan, PatchError> {
        if width == 0 || height == 0 {
            return Err(PatchError::Empty);
        }
        let p = self.patch_size;
        let (rh, rw) = match self.preset {
            Preset::Qwen2Vl => smart_resize(
                height,
                width,
                p * self.merge_size,
                self.min_pixels,
                self.max_pixels,
            )?,
            Preset::Siglip2Naflex => size_for_max_patches(height, width, p, self.max_patches),
            Preset::TimmNaflex => {
                let longest = self.seq_lens.iter().copied().max().unwrap_or(1);
                naflex::size_for_seq(height, width, p, longest)?.1
            }
        };
        Ok(PatchPlan::whole(width, height, rw, rh, p))
    }

    /// timm's training plan of image `index` of `epoch` (`width` x `height`) for a batch of
    /// sequences of `seq_len`: the random resized crop and flip drawn from (`seed`, `epoch`,
    /// `index`).
    pub fn plan_random(
        &self,
        width: u32,
        height: u32,
        seq_len: u32,
        (seed, epoch, index): (u64, u64, usize),
    ) -> std::result::Result<PatchPlan, PatchError> {
        let mut draws = Draws::for_image(seed, epoch, index);
        let ranges = (self.crop_scale, self.crop_ratio, self.horizontal_flip);
        let c = naflex::draw_crop(width, height, self.patch_size, seq_len, ranges, &mut draws)?;
        Ok(PatchPlan {
            left: c.left,
            top: c.top,
            crop_width: c.width,
            crop_height: c.height,
            flipped: c.flipped,
            ..PatchPlan::whole(
                width,
                height,
                c.resized_width,
                c.resized_height,
                self.patch_size,
            )
        })
    }

    /// timm's schedule of batches for `images` images an epoch under `seed`.
    pub fn schedule(
        &self,
        seed: u64,
        images: usize,
    ) -> std::result::Result<NaflexSchedule, PatchError> {
        NaflexSchedule::new(
            seed,
            images,
            &self.seq_lens,
            self.tokens_per_batch,
            self.batch_divisor,
        )
    }
}

/// One image's plan: the region of the source resized, the resized size, the flip, the grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PatchPlan {
    /// First column of the region of the source that is resized.
    pub left: u32,
    /// First row of the region.
    pub top: u32,
    /// Columns of the region.
    pub crop_width: u32,
    /// Rows of the region.
    pub crop_height: u32,
    /// Width of the resized image, a multiple of the patch.
    pub width: u32,
    /// Height of the resized image, a multiple of the patch.
    pub height: u32,
    /// Mirrored left to right after the resize.
    pub flipped: bool,
    /// Temporal patches (Qwen2-VL's `grid_t`: 1 for a still image).
    pub grid_t: u32,
    /// Patches down.
    pub grid_h: u32,
    /// Patches across.
    pub grid_w: u32,
}

impl PatchPlan {
    fn whole(width: u32, height: u32, rw: u32, rh: u32, patch: u32) -> PatchPlan {
        PatchPlan {
            left: 0,
            top: 0,
            crop_width: width,
            crop_height: height,
            width: rw,
            height: rh,
            flipped: false,
            grid_t: 1,
            grid_h: rh / patch,
            grid_w: rw / patch,
        }
    }

    /// Tokens of the image.
    pub fn tokens(&self) -> usize {
        self.grid_t as usize * self.grid_h as usize * self.grid_w as usize
    }
}

#[cfg(test)]
mod tests;
