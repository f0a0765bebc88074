//! What a pipeline does, grouped by the stage that uses it, one file each: [`DecodeOptions`]
//! (bytes to pixels), [`ResizeOptions`] (pixels to the output size), [`AugmentOptions`] (the
//! augmentations of training), [`OutputOptions`] (normalize, dtype, layout), [`BatchOptions`]
//! (batches and their order) and [`RuntimeOptions`] (device, threads, prefetch). [`Options`]
//! holds one of each; every stage takes exactly its part.
//!
//! The option enums parse from and print as the names the command line and the Python package
//! use (`"f16".parse::<DType>()`, `DType::F16.to_string() == "f16"`). Options sit at the bottom
//! of the crate: they import the errors and nothing else.

use crate::error::{Error, Result};

/// An option value that does not name one of the choices; says which were expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {given:?}: expected one of {expected}")]
pub struct ParseOptionError {
    what: &'static str,
    given: String,
    /// Every name accepted, aliases in parentheses.
    expected: String,
}

impl ParseOptionError {
    /// `given` is not one of the names of `what`, which are `expected`.
    pub(crate) fn new(what: &'static str, given: &str, expected: &'static str) -> ParseOptionError {
        ParseOptionError {
            what,
            given: given.to_string(),
            expected: expected.to_string(),
        }
    }
}

/// `FromStr` and `Display` for an option enum from one table of (variant, names); the first
/// name is the one printed, the others are accepted aliases (compared without case).
macro_rules! named_choices {
    ($ty:ty, $what:literal, [$(($variant:path, [$first:literal $(, $alias:literal)*])),+ $(,)?]) => {
        impl $ty {
            /// The name this value prints as and parses from.
            pub fn name(self) -> &'static str {
                match self {
                    $($variant => $first,)+
                }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }

        impl FromStr for $ty {
            type Err = ParseOptionError;

            fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
                $(if [$first $(, $alias)*].iter().any(|n| n.eq_ignore_ascii_case(s.trim())) {
                    return Ok($variant);
                })+
                let names: &[&[&str]] = &[$(&[$first $(, $alias)*]),+];
                let expected = names
                    .iter()
                    .map(|names| match names {
                        [first, aliases @ ..] if !aliases.is_empty() => {
                            format!("{first} (or {})", aliases.join(", "))
                        }
                        _ => names.join(""),
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                Err(ParseOptionError {
                    what: $what,
                    given: s.to_string(),
                    expected,
                })
            }
        }
    };
}

mod augment;
mod batch;
mod decode;
mod output;
mod patches;
mod resize;
mod runtime;
mod views;
mod views_json;

pub(crate) use augment::RAND_AUGMENT_BINS;
pub use augment::{Augment, MAX_RAND_AUGMENT_OPS};
pub use augment::{AugmentOptions, ColorJitter, RandomErasing, Recipe, ERASE_TO_MEAN};
pub use batch::{BatchOptions, LastBatch, OnError, Shard, ShardBalance};
pub(crate) use decode::MAX_PROGRESSIVE_SCANS;
pub use decode::{
    Decode, DecodeOptions, Gray16, DEFAULT_ASSISTED_SHARE, DEFAULT_DECODE_MEMORY,
    DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_PIXELS, SHARED_MACHINE_MIN_GPU_SHARE,
    SHARED_MACHINE_MIN_RANKS,
};
pub use output::{
    Affine, ChannelOrder, DType, Layout, NormalizeSpec, OutputOptions, IMAGENET_MEAN, IMAGENET_STD,
};
pub use patches::{
    Arithmetic, PatchResize, Patches, Preset, SeqLens, MAX_SEQ_LENS, OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD, TIMM_IMAGENET_MEAN, TIMM_IMAGENET_STD,
};
pub use resize::{
    DrawRange, Interpolation, ResizeMode, ResizeOptions, RANDOM_CROP_RATIO, RANDOM_CROP_SCALE,
    RANDOM_FLIP_CHANCE,
};
pub use runtime::{Device, RuntimeOptions};
pub use views::{ViewBlur, ViewGroup, ViewOps, Views, ViewsPreset};

/// Every option of a pipeline, one group per stage; the defaults are torchvision's evaluation
/// transform on ImageNet (`Resize(256)`, `CenterCrop(224)`, ImageNet mean and std), f16 NCHW on
/// CUDA device 0, batches of 256.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub struct Options {
    /// Bytes to pixels.
    pub decode: DecodeOptions,
    /// Pixels to the output size.
    pub resize: ResizeOptions,
    /// The output tensor.
    pub output: OutputOptions,
    /// Batches and their order.
    pub batching: BatchOptions,
    /// Device, threads, prefetch.
    pub runtime: RuntimeOptions,
    /// Augmentations of training, on the output pixels before the normalize.
    pub augment: AugmentOptions,
    /// A patch-sequence output in place of fixed-size images (`None`: images): each image
    /// sized by the preset's rule, cut into patches, normalized and laid out as tokens.
    pub patches: Option<Patches>,
}

impl Options {
    /// Sets the decode options.
    pub fn decode(mut self, decode: DecodeOptions) -> Self {
        self.decode = decode;
        self
    }

    /// Sets the resize options.
    pub fn resize(mut self, resize: ResizeOptions) -> Self {
        self.resize = resize;
        self
    }

    /// Sets the output options.
    pub fn output(mut self, output: OutputOptions) -> Self {
        self.output = output;
        self
    }

    /// Sets the batch options.
    pub fn batching(mut self, batching: BatchOptions) -> Self {
        self.batching = batching;
        self
    }

    /// Sets the runtime options.
    pub fn runtime(mut self, runtime: RuntimeOptions) -> Self {
        self.runtime = runtime;
        self
    }

    /// Sets the augmentation options.
    pub fn augment(mut self, augment: AugmentOptions) -> Self {
        self.augment = augment;
        self
    }

    /// Sets the patch-sequence output.
    pub fn patches(mut self, patches: Option<Patches>) -> Self {
        self.patches = patches;
        self
    }

    /// Checks every group; the error names the first option that is wrong.
    pub fn validate(&self) -> Result<()> {
        self.decode.validate()?;
        self.resize.validate()?;
        self.output.validate()?;
        self.batching.validate()?;
        self.runtime.validate()?;
        self.augment.validate()?;
        if self.decode.lanes == Decode::Hybrid && self.runtime.device == Device::Cpu {
            return Err(Error::invalid(
                "decode",
                "hybrid decoding uses the GPU's JPEG engines: it needs a CUDA device",
            ));
        }
        if let Some(patches) = &self.patches {
            patches.validate()?;
            self.validate_patch_output()?;
        }
        let (h, w) = self.resize.output_size();
        if u64::from(h) * u64::from(w) > self.decode.max_pixels {
            return Err(Error::invalid(
                "resize",
                format!(
                    "an output of {h}x{w} (height x width) pixels is over max_pixels ({})",
                    self.decode.max_pixels
                ),
            ));
        }
        Ok(())
    }
}

impl Options {
    /// Refuses, beside a patch-sequence output, the options of fixed-size images it replaces or
    /// that would change its pixels: each names what to do instead.
    fn validate_patch_output(&self) -> Result<()> {
        let images = ResizeOptions::default();
        let output = OutputOptions::default();
        let conflict = if self.resize.mode != images.mode {
            Some((
                "resize",
                "a patch-sequence output sizes each image by its preset's rule: leave the resize \
                 mode and crop size unset",
            ))
        } else if self.resize.horizontal_flip != 0.0 {
            Some((
                "horizontal_flip",
                "set the patch output's own flip (Patches::horizontal_flip, timm-naflex)",
            ))
        } else if self.resize.interpolation != images.interpolation {
            Some((
                "interpolation",
                "set the patch output's own filter (Patches::interpolation)",
            ))
        } else if self.resize.pillow_version != images.pillow_version {
            Some((
                "pillow_version",
                "set the patch output's own Pillow version (Patches::pillow_version)",
            ))
        } else if self.augment.is_on() {
            Some((
                "augment",
                "the augmentations of fixed-size images do not apply to patch sequences",
            ))
        } else if self.output.mean != output.mean || self.output.std != output.std {
            Some((
                "mean/std",
                "set the patch output's own mean and std (Patches::mean_std)",
            ))
        } else if self.output.layout != output.layout
            || self.output.channel_order != output.channel_order
        {
            Some((
                "layout",
                "tokens have the model's own order of values: leave the layout and channel \
                 order unset",
            ))
        } else if self.decode.dct_scaling {
            Some((
                "dct_scaling",
                "patch sequences reproduce their references exactly; DCT scaling does not",
            ))
        } else {
            None
        };
        match conflict {
            Some((option, reason)) => Err(Error::invalid(option, reason)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enums_print_and_parse_the_same_names() {
        for d in [DType::F16, DType::BF16, DType::F32] {
            assert_eq!(d.to_string().parse::<DType>(), Ok(d));
        }
        assert_eq!("float16".parse::<DType>(), Ok(DType::F16));
        assert_eq!("BFloat16".parse::<DType>(), Ok(DType::BF16));
        for l in [Layout::Nchw, Layout::Nhwc] {
            assert_eq!(l.to_string().parse::<Layout>(), Ok(l));
        }
        for i in [
            Interpolation::Bilinear,
            Interpolation::Bicubic,
            Interpolation::Nearest,
            Interpolation::Lanczos,
        ] {
            assert_eq!(i.to_string().parse::<Interpolation>(), Ok(i));
        }
        for d in [Device::Cpu, Device::Cuda(0), Device::Cuda(3)] {
            assert_eq!(d.to_string().parse::<Device>(), Ok(d));
        }
        assert_eq!("cuda".parse::<Device>(), Ok(Device::Cuda(0)));
        let err = "f64".parse::<DType>().expect_err("not a dtype");
        assert!(err.to_string().contains("f16"), "{err}");
        assert!("gpu:1".parse::<Device>().is_err());
        assert_eq!("drop".parse::<LastBatch>(), Ok(LastBatch::Drop));
        assert_eq!("fail".parse::<OnError>(), Ok(OnError::Fail));
        assert_eq!("bgr".parse::<ChannelOrder>(), Ok(ChannelOrder::Bgr));
        let shard = Shard::new(2, 8);
        assert_eq!(shard.to_string().parse::<Shard>(), Ok(shard));
        assert_eq!(" 1 / 4 ".parse::<Shard>(), Ok(Shard::new(1, 4)));
        for bad in ["1", "1/", "a/4", "1/4/2", "-1/4"] {
            let err = bad.parse::<Shard>().expect_err(bad);
            assert!(err.to_string().contains("RANK/WORLD"), "{err}");
        }
    }

    #[test]
    fn mistakes_name_the_option() {
        let name = |o: Options| match o.validate() {
            Err(Error::InvalidOption { option, .. }) => option,
            other => panic!("expected an invalid option, got {other:?}"),
        };
        let d = Options::default();
        assert_eq!(name(d.batching(d.batching.batch_size(0))), "batch_size");
        assert_eq!(name(d.runtime(d.runtime.prefetch(0))), "prefetch");
        assert_eq!(
            name(d.batching(d.batching.shard(Shard::new(2, 2)))),
            "shard"
        );
        assert_eq!(
            name(d.output(d.output.mean_std([0.5; 3], [0.0, 1.0, 1.0]))),
            "mean/std"
        );
        assert_eq!(
            name(d.resize(d.resize.mode(ResizeMode::stretch(0, 3)))),
            "resize"
        );
        assert_eq!(name(d.decode(d.decode.max_pixels(0))), "max_pixels");
        assert_eq!(name(d.decode(d.decode.memory_limit(0))), "decode_memory");
        assert_eq!(
            name(d.decode(d.decode.assisted_share(1.5))),
            "assisted_share"
        );
        assert_eq!(
            name(d.decode(d.decode.assisted_share(f32::NAN))),
            "assisted_share"
        );
        assert_eq!(
            name(d.runtime(d.runtime.prefetch(10_000_000_000))),
            "prefetch"
        );
        assert_eq!(name(d.runtime(d.runtime.threads(20_000))), "threads");
        assert_eq!(
            name(d.resize(d.resize.mode(ResizeMode::center_crop(256, 100_000)))),
            "resize"
        );
        assert!(d.validate().is_ok());
    }
}
