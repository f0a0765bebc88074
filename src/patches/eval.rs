//! The fixed-size evaluation transforms of CLIP, SigLIP and DINOv2, by name, in the pipeline's
//! own options: each is a resize (and crop) with its filter and its mean and std.
//!
//! | name | reference | transform |
//! | --- | --- | --- |
//! | `clip` | open_clip's OpenAI models, transformers' `CLIPImageProcessor` | `Resize(224, bicubic)` + `CenterCrop(224)`, CLIP's mean/std |
//! | `siglip-384` | SigLIP so400m-patch14-384 (transformers' `SiglipImageProcessor`, timm, open_clip) | `Resize((384, 384), bicubic)`, no crop, mean/std 0.5 |
//! | `siglip-224` | SigLIP base-patch16-224 | `Resize((224, 224), bicubic)`, no crop, mean/std 0.5 |
//! | `dinov2` | DINOv2's evaluation (`make_classification_eval_transform`), transformers' `BitImageProcessor` config | `Resize(256, bicubic)` + `CenterCrop(224)`, ImageNet's mean/std |
//!
//! The resize and crop are torchvision's on PIL images, so the pixels are Pillow's bit for bit;
//! the normalize is the pipeline's (`x * a + b` in `float32`, within a unit in the last place of
//! `(x / 255 - mean) / std`). transformers' processors cut the centre crop at
//! `(height - crop) // 2` where torchvision rounds half to even: one pixel apart for about a
//! quarter of image sizes (docs/patches.md).

use std::fmt;
use std::str::FromStr;

use crate::options::{
    Interpolation, OutputOptions, ParseOptionError, ResizeMode, ResizeOptions, IMAGENET_MEAN,
    IMAGENET_STD,
};

/// A fixed-size evaluation transform by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EvalPreset {
    /// OpenAI CLIP at 224.
    Clip,
    /// SigLIP at 384 (so400m-patch14-384).
    Siglip384,
    /// SigLIP at 224 (base-patch16-224).
    Siglip224,
    /// DINOv2's evaluation at 224.
    Dinov2,
}

impl EvalPreset {
    /// Every preset.
    pub const ALL: [EvalPreset; 4] = [
        EvalPreset::Clip,
        EvalPreset::Siglip384,
        EvalPreset::Siglip224,
        EvalPreset::Dinov2,
    ];

    /// The name it prints as and parses from.
    pub fn name(self) -> &'static str {
        match self {
            EvalPreset::Clip => "clip",
            EvalPreset::Siglip384 => "siglip-384",
            EvalPreset::Siglip224 => "siglip-224",
            EvalPreset::Dinov2 => "dinov2",
        }
    }

    /// The resize: mode, output size and filter.
    pub fn resize(self) -> ResizeOptions {
        let mode = match self {
            EvalPreset::Clip => ResizeMode::center_crop(224, 224),
            EvalPreset::Siglip384 => ResizeMode::stretch(384, 384),
            EvalPreset::Siglip224 => ResizeMode::stretch(224, 224),
            EvalPreset::Dinov2 => ResizeMode::center_crop(256, 224),
        };
        ResizeOptions::default()
            .mode(mode)
            .interpolation(Interpolation::Bicubic)
    }

    /// The output: mean and std (the dtype and layout stay the caller's).
    pub fn output(self, output: OutputOptions) -> OutputOptions {
        let f = |v: [f64; 3]| v.map(|x| x as f32);
        match self {
            EvalPreset::Clip => {
                output.mean_std(f(super::OPENAI_CLIP_MEAN), f(super::OPENAI_CLIP_STD))
            }
            EvalPreset::Siglip384 | EvalPreset::Siglip224 => output.mean_std([0.5; 3], [0.5; 3]),
            EvalPreset::Dinov2 => output.mean_std(IMAGENET_MEAN, IMAGENET_STD),
        }
    }
}

impl fmt::Display for EvalPreset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for EvalPreset {
    type Err = ParseOptionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EvalPreset::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                ParseOptionError::new("eval preset", s, "clip, siglip-384, siglip-224, dinov2")
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_name_their_transforms() {
        for p in EvalPreset::ALL {
            assert_eq!(p.name().parse::<EvalPreset>(), Ok(p));
            assert_eq!(p.resize().interpolation, Interpolation::Bicubic);
        }
        assert_eq!(
            EvalPreset::Dinov2.resize().mode,
            ResizeMode::center_crop(256, 224)
        );
        assert_eq!(EvalPreset::Siglip384.resize().output_size(), (384, 384));
        let clip = EvalPreset::Clip.output(OutputOptions::default());
        assert_eq!(clip.mean[0], 0.48145466);
        assert!("vit".parse::<EvalPreset>().is_err());
    }
}
