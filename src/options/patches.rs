//! The patch-sequence output ([`Patches`]): a model family's rule for sizing each image near its
//! own size and aspect ratio and cutting it into patches, with the settings its configuration
//! changes. The planning it implies (sizes, grids, draws, token order, arithmetic) is
//! `gpufeed::patches`'; this file holds the options alone, as the other option groups.

use std::fmt;
use std::str::FromStr;

use super::{DrawRange, Interpolation, ParseOptionError};
use crate::error::{Error, Result};

/// OpenAI CLIP's channel means (transformers' `OPENAI_CLIP_MEAN`), Qwen2-VL's too.
pub const OPENAI_CLIP_MEAN: [f64; 3] = [0.48145466, 0.4578275, 0.40821073];
/// OpenAI CLIP's channel standard deviations (`OPENAI_CLIP_STD`).
pub const OPENAI_CLIP_STD: [f64; 3] = [0.26862954, 0.26130258, 0.27577711];
/// timm's `IMAGENET_DEFAULT_MEAN`, as the Python floats.
pub const TIMM_IMAGENET_MEAN: [f64; 3] = [0.485, 0.456, 0.406];
/// timm's `IMAGENET_DEFAULT_STD`, as the Python floats.
pub const TIMM_IMAGENET_STD: [f64; 3] = [0.229, 0.224, 0.225];

/// Which reference's arithmetic turns a `u8` sample into a token value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Arithmetic {
    /// transformers' PIL (NumPy) processors: `float32(x * (1/255 as float64))`, then
    /// `(v - mean) / std` in `float32`.
    NumpyRescale,
    /// transformers' torchvision processors: `(float32(x) - float32(mean) * 255) / (float32(std)
    /// * 255)` in `float32`.
    TorchFused,
    /// timm's NaFlex prefetcher: `(float32(x) - float32(mean * 255)) / float32(std * 255)`.
    TimmPrefetcher,
}

/// The most sequence lengths [`Patches::seq_lens`] holds.
pub const MAX_SEQ_LENS: usize = 16;

/// timm's sequence lengths (`train_seq_lens`): up to [`MAX_SEQ_LENS`] of them, kept in a value
/// that copies like the other options.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SeqLens {
    lens: [u32; MAX_SEQ_LENS],
    /// How many were given (more than [`MAX_SEQ_LENS`] is refused by [`Patches::validate`]).
    given: usize,
}

impl SeqLens {
    /// No sequence length.
    pub const EMPTY: SeqLens = SeqLens {
        lens: [0; MAX_SEQ_LENS],
        given: 0,
    };

    /// The lengths `lens`, in the order given (the first [`MAX_SEQ_LENS`] kept).
    pub fn new(lens: &[u32]) -> SeqLens {
        let mut kept = [0; MAX_SEQ_LENS];
        for (slot, &len) in kept.iter_mut().zip(lens) {
            *slot = len;
        }
        SeqLens {
            lens: kept,
            given: lens.len(),
        }
    }

    /// The lengths kept.
    pub fn as_slice(&self) -> &[u32] {
        &self.lens[..self.given.min(MAX_SEQ_LENS)]
    }

    /// How many lengths were given.
    pub fn given(&self) -> usize {
        self.given
    }

    /// The longest length (0 for none).
    pub fn longest(&self) -> u32 {
        self.as_slice().iter().copied().max().unwrap_or(0)
    }

    /// The shortest length (0 for none).
    pub fn shortest(&self) -> u32 {
        self.as_slice().iter().copied().min().unwrap_or(0)
    }
}

impl fmt::Debug for SeqLens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl Default for SeqLens {
    fn default() -> SeqLens {
        SeqLens::EMPTY
    }
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
#[derive(Debug, Clone, Copy, PartialEq)]
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
    /// timm: the sequence lengths a batch draws from (`train_seq_lens`), at most
    /// [`MAX_SEQ_LENS`].
    pub seq_lens: SeqLens,
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
            seq_lens: SeqLens::EMPTY,
            tokens_per_batch: 0,
            batch_divisor: 1,
            crop_scale: super::RANDOM_CROP_SCALE,
            crop_ratio: super::RANDOM_CROP_RATIO,
            horizontal_flip: 0.0,
            interpolation: Interpolation::Bicubic,
            resize: PatchResize::Pillow,
            pillow_version: super::resize::PILLOW_VERSION,
            mean: OPENAI_CLIP_MEAN,
            std: OPENAI_CLIP_STD,
            arithmetic: Arithmetic::NumpyRescale,
            packed: true,
            composite_alpha: true,
        }
    }

    /// Qwen3-VL's image processor: transformers' `Qwen2VLImageProcessor` with the settings
    /// Qwen3-VL's checkpoints publish (`preprocessor_config.json`): patches of 16, temporal
    /// patch 2, merge 2 (sizes in multiples of 32), `min_pixels` 256 x 256 (`shortest_edge`
    /// 65,536), `max_pixels` 4096 x 4096 (`longest_edge` 16,777,216), mean and std 0.5, bicubic,
    /// packed. Its `max_pixels` lets one image reach 16.7 Mpx: a pipeline sizes its batches for
    /// that bound, so give a smaller `max_pixels` for batches of many images.
    pub fn qwen3_vl() -> Patches {
        Patches {
            patch_size: 16,
            min_pixels: 256 * 256,
            max_pixels: 4096 * 4096,
            mean: [0.5; 3],
            std: [0.5; 3],
            ..Patches::qwen2_vl()
        }
    }

    /// Whether these are Qwen3-VL's model settings on the Qwen2-VL rule ([`Patches::qwen3_vl`]:
    /// patches of 16 merged 2 x 2 over 2 frames, mean and std 0.5), whatever the pixel budget.
    fn is_qwen3_vl(&self) -> bool {
        let qwen3 = Patches::qwen3_vl();
        self.preset == Preset::Qwen2Vl
            && (self.patch_size, self.merge_size, self.temporal_patch_size)
                == (
                    qwen3.patch_size,
                    qwen3.merge_size,
                    qwen3.temporal_patch_size,
                )
            && (self.mean, self.std) == (qwen3.mean, qwen3.std)
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
            seq_lens: SeqLens::new(&[128, 256, 576, 784, 1024]),
            tokens_per_batch: 32 * 1024,
            batch_divisor: 8,
            horizontal_flip: super::RANDOM_FLIP_CHANCE,
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

    /// Every name [`Patches::from_name`] takes, the torchvision variants of transformers'
    /// processors beside their PIL ones; the command line's `--patches` and Python's
    /// `patches=` take the same.
    pub const NAMES: [&'static str; 7] = [
        "qwen2-vl",
        "qwen2-vl-torchvision",
        "qwen3-vl",
        "qwen3-vl-torchvision",
        "siglip2-naflex",
        "siglip2-naflex-torchvision",
        "timm-naflex",
    ];

    /// The preset of a name of [`Patches::NAMES`] with its defaults (case and `_` for `-`
    /// aside): `qwen2-vl`, `qwen3-vl` ([`Patches::qwen3_vl`]), `siglip2-naflex`, `timm-naflex`,
    /// and `qwen2-vl-torchvision`, `qwen3-vl-torchvision` or `siglip2-naflex-torchvision` for
    /// transformers' torchvision processor ([`Patches::torchvision`]).
    pub fn from_name(name: &str) -> std::result::Result<Patches, ParseOptionError> {
        let canonical = name.trim().to_ascii_lowercase().replace('_', "-");
        let (base, torchvision) = match canonical.strip_suffix("-torchvision") {
            Some(base) => (base, true),
            None => (canonical.as_str(), false),
        };
        let refused = || {
            ParseOptionError::new(
                "patch preset",
                name,
                "qwen2-vl, qwen2-vl-torchvision, qwen3-vl, qwen3-vl-torchvision, siglip2-naflex, \
                 siglip2-naflex-torchvision, timm-naflex",
            )
        };
        let patches = match base {
            "qwen3-vl" => Patches::qwen3_vl(),
            base => Patches::preset(base.parse().map_err(|_| refused())?),
        };
        match (patches.preset, torchvision) {
            (Preset::TimmNaflex, true) => Err(refused()),
            (_, true) => Ok(patches.torchvision()),
            (_, false) => Ok(patches),
        }
    }

    /// The model's preset these settings are, arithmetic aside: `qwen3-vl` for the Qwen2-VL
    /// rule with Qwen3-VL's model settings, else the rule's name ([`Preset::name`]).
    pub fn preset_name(&self) -> &'static str {
        if self.is_qwen3_vl() {
            "qwen3-vl"
        } else {
            self.preset.name()
        }
    }

    /// The name of [`Patches::NAMES`] this preset's rule and arithmetic go by: the preset's
    /// (`qwen3-vl` for the Qwen2-VL rule with Qwen3-VL's model settings), with `-torchvision`
    /// for transformers' torchvision arithmetic.
    pub fn name(&self) -> String {
        let base = self.preset_name();
        match self.resize {
            PatchResize::TorchvisionUint8 => format!("{base}-torchvision"),
            PatchResize::Pillow => base.to_string(),
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
        self.seq_lens = SeqLens::new(lens);
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
        let lens = self.seq_lens.as_slice();
        let longest = lens.iter().copied().max().unwrap_or(0);
        if lens.is_empty() || lens.contains(&0) || self.seq_lens.given() > MAX_SEQ_LENS {
            return Err(Error::invalid(
                "seq_lens",
                format!("need 1 to {MAX_SEQ_LENS} sequence lengths, each at least 1"),
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_to_their_presets_and_print_back() {
        for name in Patches::NAMES {
            let patches = Patches::from_name(name).expect(name);
            assert_eq!(patches.name(), name);
            assert!(patches.validate().is_ok(), "{name}");
        }
        let torchvision = Patches::from_name("Qwen2_VL-torchvision").expect("alias");
        assert_eq!(torchvision, Patches::qwen2_vl().torchvision());
        let qwen3 = Patches::from_name("Qwen3_VL").expect("alias");
        assert_eq!(qwen3, Patches::qwen3_vl());
        assert_eq!(
            (qwen3.preset, qwen3.patch_size, qwen3.patch_dim()),
            (Preset::Qwen2Vl, 16, 1536)
        );
        // A smaller budget keeps the model's name; other model settings are Qwen2-VL's rule.
        assert_eq!(qwen3.max_pixels(1 << 20).name(), "qwen3-vl");
        let other = Patches {
            patch_size: 14,
            ..qwen3
        };
        assert_eq!(other.name(), "qwen2-vl");
        assert_eq!(
            Patches::from_name("siglip2-naflex"),
            Ok(Patches::siglip2_naflex())
        );
        let error = Patches::from_name("timm-naflex-torchvision").expect_err("no such variant");
        assert!(
            error.to_string().contains("qwen2-vl-torchvision"),
            "{error}"
        );
        assert!(Patches::from_name("clip").is_err());
    }
}
