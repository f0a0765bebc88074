//! What a pipeline does, grouped by the stage that uses it: [`DecodeOptions`] (bytes to pixels),
//! [`ResizeOptions`] (pixels to the output size), [`OutputOptions`] (normalize, dtype, layout),
//! [`BatchOptions`] (batches and their order) and [`RuntimeOptions`] (device, threads, prefetch).
//! [`Options`] holds one of each; every stage takes exactly its part.
//!
//! The option enums parse from and print as the names the command line and the Python package
//! use (`"f16".parse::<DType>()`, `DType::F16.to_string() == "f16"`).

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// ImageNet channel means in 0..1 units, RGB order (torchvision's `Normalize` defaults).
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
/// ImageNet channel standard deviations in 0..1 units, RGB order.
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// Default pixel limit: Pillow's decompression-bomb error threshold (2 x 89,478,485), so every
/// image Pillow opens opens here too, and a forged header cannot make us allocate gigabytes.
pub const DEFAULT_MAX_PIXELS: u64 = 178_956_970;

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

/// Element type of the output tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// IEEE half precision (`half::f16`).
    F16,
    /// bfloat16 (`half::bf16`).
    BF16,
    /// IEEE single precision.
    F32,
}

named_choices!(
    DType,
    "dtype",
    [
        (DType::F16, ["f16", "float16", "half"]),
        (DType::BF16, ["bf16", "bfloat16"]),
        (DType::F32, ["f32", "float32", "float"]),
    ]
);

impl DType {
    /// Bytes per element.
    pub fn size_of(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 => 4,
        }
    }
}

/// Memory layout of the output batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Layout {
    /// `[N, C, H, W]`, PyTorch's default.
    Nchw,
    /// `[N, H, W, C]`, channels last.
    Nhwc,
}

named_choices!(
    Layout,
    "layout",
    [(Layout::Nchw, ["nchw"]), (Layout::Nhwc, ["nhwc"]),]
);

impl Layout {
    /// Shape of a batch of `n` images of `height` x `width` with 3 channels in this layout.
    pub fn shape(self, n: usize, height: usize, width: usize) -> [usize; 4] {
        match self {
            Layout::Nchw => [n, 3, height, width],
            Layout::Nhwc => [n, height, width, 3],
        }
    }
}

/// Order of the colour channels in the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ChannelOrder {
    /// Red, green, blue (torchvision, timm).
    #[default]
    Rgb,
    /// Blue, green, red (Caffe- and OpenCV-style models).
    Bgr,
}

named_choices!(
    ChannelOrder,
    "channel order",
    [(ChannelOrder::Rgb, ["rgb"]), (ChannelOrder::Bgr, ["bgr"]),]
);

impl ChannelOrder {
    /// The output channel that source channel `c` (RGB order) goes to; the map is its own
    /// inverse.
    pub fn output_channel(self, c: usize) -> usize {
        match self {
            ChannelOrder::Rgb => c,
            ChannelOrder::Bgr => 2 - c,
        }
    }
}

/// Where the output tensor lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Device {
    /// The CUDA device with this ordinal: u8 upload and the NVRTC kernel.
    Cuda(usize),
    /// Host memory: the same CPU stage, normalized on the CPU. Works anywhere.
    Cpu,
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cuda(ordinal) => write!(f, "cuda:{ordinal}"),
            Device::Cpu => f.write_str("cpu"),
        }
    }
}

impl FromStr for Device {
    type Err = ParseOptionError;

    /// `cpu`, `cuda` (device 0) or `cuda:N`, as PyTorch writes devices.
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        let s = s.trim();
        let fail = || ParseOptionError {
            what: "device",
            given: s.to_string(),
            expected: "cpu, cuda, cuda:N".to_string(),
        };
        if s.eq_ignore_ascii_case("cpu") {
            return Ok(Device::Cpu);
        }
        if s.eq_ignore_ascii_case("cuda") {
            return Ok(Device::Cuda(0));
        }
        let (prefix, ordinal) = s.split_once(':').ok_or_else(fail)?;
        if !prefix.eq_ignore_ascii_case("cuda") {
            return Err(fail());
        }
        ordinal.parse().map(Device::Cuda).map_err(|_| fail())
    }
}

/// What happens when one image cannot be read or decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum OnError {
    /// Fill the batch with the next good images and list the bad one in [`crate::Batch::skipped`].
    #[default]
    Skip,
    /// Stop: `next_batch` returns [`Error::Item`] naming the image.
    Fail,
}

named_choices!(
    OnError,
    "error policy",
    [(OnError::Skip, ["skip"]), (OnError::Fail, ["fail"]),]
);

/// What happens to a last batch smaller than the batch size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum LastBatch {
    /// Yield it (PyTorch's `drop_last=False`).
    #[default]
    Keep,
    /// Leave it out (PyTorch's `drop_last=True`).
    Drop,
}

named_choices!(
    LastBatch,
    "last-batch policy",
    [(LastBatch::Keep, ["keep"]), (LastBatch::Drop, ["drop"]),]
);

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

impl Interpolation {
    /// Radius of the filter at scale 1, in source pixels (Nearest reads the pixel under each
    /// sample position).
    pub fn support(self) -> f64 {
        match self {
            Interpolation::Bilinear | Interpolation::Hamming => 1.0,
            Interpolation::Bicubic => 2.0,
            Interpolation::Lanczos => 3.0,
            Interpolation::Nearest | Interpolation::Box => 0.5,
        }
    }
}

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

/// Which decoders fill the batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Decode {
    /// The fastest the machine offers: [`Decode::Hybrid`] on a CUDA device whose JPEG engines
    /// nvJPEG can drive, [`Decode::Cpu`] otherwise. The pipeline says which it runs and why
    /// ([`crate::Pipeline::decode_description`]).
    #[default]
    Auto,
    /// The CPU threads decode every image (libjpeg-turbo for JPEG): torchvision's decoder.
    Cpu,
    /// The GPU's hardware JPEG engines (nvJPEG) beside the CPU threads: baseline colour JPEGs
    /// can go to the GPU lane, resized there exactly as Pillow resizes; everything else, and any
    /// image the GPU lane cannot take, goes to the CPU threads. Needs a CUDA device; where the
    /// engines or nvJPEG are missing, the CPU threads decode everything and the pipeline's
    /// device description says why.
    Hybrid,
}

named_choices!(
    Decode,
    "decode lanes",
    [
        (Decode::Auto, ["auto"]),
        (Decode::Cpu, ["cpu"]),
        (Decode::Hybrid, ["hybrid"]),
    ]
);

/// How 16-bit gray images (Pillow's `I;16`) become 8-bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Gray16 {
    /// Values over 255 become 255, as Pillow's `convert("RGB")` (and so torchvision) does.
    #[default]
    Clip,
    /// `v * 255 / 65535`, rounded: the whole 16-bit range kept, unlike torchvision.
    Scale,
}

named_choices!(
    Gray16,
    "16-bit gray conversion",
    [(Gray16::Clip, ["clip"]), (Gray16::Scale, ["scale"]),]
);

/// Default [`DecodeOptions::max_file_bytes`]: 1 GiB, twice the largest uncompressed 8-bit RGB
/// file at [`DEFAULT_MAX_PIXELS`].
pub const DEFAULT_MAX_FILE_BYTES: u64 = 1 << 30;

/// Default [`DecodeOptions::memory_limit`]: 4 GiB.
pub const DEFAULT_DECODE_MEMORY: u64 = 4 << 30;

/// Bytes to pixels: limits and decoder choices.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct DecodeOptions {
    /// Images that claim more pixels than this are refused from their header, before decoding
    /// (default [`DEFAULT_MAX_PIXELS`]).
    pub max_pixels: u64,
    /// Apply the EXIF orientation tag of JPEG, PNG, WebP and TIFF files (default off, like
    /// torchvision, whose PIL loader ignores the tag).
    pub exif_orientation: bool,
    /// Decode large JPEGs at 1/2, 1/4 or 1/8 size in the DCT domain when the part the output
    /// uses keeps at least twice the output's pixels along each axis: faster on photos much
    /// larger than the output, at a small cost in fidelity to torchvision (which decodes at full
    /// size). Default off.
    pub dct_scaling: bool,
    /// Decode only the part of a JPEG the resize reads (default on). The output is the same bit
    /// for bit; turning it off only serves to measure what it saves.
    pub partial_decode: bool,
    /// Files larger than this are refused before they are read (default
    /// [`DEFAULT_MAX_FILE_BYTES`]).
    pub max_file_bytes: u64,
    /// The most memory the decode threads of a pipeline hold together for images in flight
    /// (their encoded bytes and decoded pixels), whatever the number of threads: an image
    /// reserves its share from its header before it is read, and waits while others hold too
    /// much; one larger than the whole limit is decoded alone (default
    /// [`DEFAULT_DECODE_MEMORY`]). While a CUDA device opens at build, the CPU threads also keep
    /// up to an eighth of it of finished images ahead of the first batch.
    pub memory_limit: u64,
    /// 16-bit gray to 8 bits: clipped like torchvision (default) or scaled.
    pub gray16: Gray16,
    /// Which decoders fill the batches (default: [`Decode::Auto`]).
    pub lanes: Decode,
    /// With hybrid or automatic decoding, the share of the images the GPU lane can take that it
    /// is offered, 0 to 1. `None` (default): it starts at 1 (every image) once the GPU lane has
    /// opened and follows the lanes' measured rates; the pipeline reports it
    /// ([`crate::Pipeline::gpu_share`]), and giving a share makes every run decode every image
    /// in the same lane, so its output is the same bit for bit.
    pub gpu_share: Option<f32>,
    /// With the share following the rates, the least it may fall to, 0 to 1. Default `None` (no
    /// floor), and [`SHARED_MACHINE_MIN_GPU_SHARE`] for a process that shares its machine with
    /// [`SHARED_MACHINE_MIN_RANKS`] ranks of its job or more
    /// ([`DecodeOptions::ranks_on_machine`]): each rank's CPU lane slows the others' decodes and
    /// calls to their engines (what the cores share), which its own lanes' rates do not show.
    pub min_gpu_share: Option<f32>,
    /// Of the GPU lane's baseline JPEGs of 1 Mpx or more, the share its assisted path decodes
    /// (entropy decoding, inverse DCT, upsampling and colour on the GPU's cores, exactly as
    /// libjpeg-turbo does) beside the JPEG engines, 0 to 1 (default
    /// [`DEFAULT_ASSISTED_SHARE`]). Of the smaller ones it decodes three in four, at most this
    /// share, unless a [`DecodeOptions::gpu_share`] below 1 is given (the engines then take
    /// them all). Which images take it depends on the files alone. The path also takes every
    /// progressive JPEG the GPU lane is offered, unless this is 0 (which turns it off: the CPU
    /// threads then decode those).
    pub assisted_share: f32,
    /// How many epochs the run will take, when known (default `None`: unknown, as many as the
    /// caller asks for): the run ends before epoch `planned_epochs` (counting from 0, epochs
    /// before a resumed state included). With [`Decode::Auto`], a run the CPU threads would
    /// decode in less time than the GPU lane takes to open (about 0.3 s) is left to the CPU
    /// threads, and one they would decode in under four seconds (the JPEG engines' opening and
    /// as long again to repay their joining) opens the lane's assisted path alone; so does
    /// [`Decode::Hybrid`] for such a run, unless [`DecodeOptions::gpu_share`] is given (the
    /// lane then opens whole before the first batch) or the assisted path is off. The lanes do
    /// not start on the epoch after the last one ahead of its asking. The command line gives
    /// its `--epochs`.
    pub planned_epochs: Option<u64>,
}

/// [`DecodeOptions::min_gpu_share`] of a rank sharing its machine with others: the GPU lane
/// takes every image it can (its assisted path until the JPEG engines join, then the engines),
/// and its CPU threads only the files it refuses. On the 4-H200 machine (64 epochs of 8,192
/// ImageNet-sized files a rank, in turn) four ranks ran 1.31-1.34x faster once the engines had
/// joined (109,561 and 105,854 images/s together against 83,867 and 79,037 with the share
/// following each rank's rates) and ended 1.20-1.31x sooner; holding it from the start, before
/// the engines join too, made four ranks 1.10-1.14x faster from the first batch on two later
/// starts (106,700 and 103,281 images/s against 93,581 and 94,268 over 32 epochs). A floor of
/// 0.9, which leaves the CPU threads a tenth of the images, was measured no faster on another
/// start.
pub const SHARED_MACHINE_MIN_GPU_SHARE: f32 = 1.0;

/// The fewest ranks on one machine that put [`SHARED_MACHINE_MIN_GPU_SHARE`] under each one's
/// share. Two ranks on the 2-H200 machine (16 cores each, 16 epochs of 16,384 files a rank,
/// in turn, four rounds on two starts) kept 0.85-0.89 of twice one alone with the floor and
/// 0.92-0.97 without it (on the second start 55,401-55,665 images/s together against
/// 60,289-63,470): with half as many cores busy, a rank's CPU threads add more than they cost
/// the other.
pub const SHARED_MACHINE_MIN_RANKS: usize = 4;

/// Default [`DecodeOptions::assisted_share`]: all of them. On camera-size baseline photos the
/// assisted path alone was faster than any split with the engines (H200 machine: 1,790-1,910
/// images/s, against 1,720 with three quarters and 1,100 with the engines alone); the engines
/// keep the smaller files, whose cost is per image.
pub const DEFAULT_ASSISTED_SHARE: f32 = 1.0;

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions {
            max_pixels: DEFAULT_MAX_PIXELS,
            exif_orientation: false,
            dct_scaling: false,
            partial_decode: true,
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            memory_limit: DEFAULT_DECODE_MEMORY,
            gray16: Gray16::Clip,
            lanes: Decode::Auto,
            gpu_share: None,
            min_gpu_share: None,
            assisted_share: DEFAULT_ASSISTED_SHARE,
            planned_epochs: None,
        }
    }
}

impl DecodeOptions {
    /// Sets [`DecodeOptions::max_pixels`].
    pub fn max_pixels(mut self, max_pixels: u64) -> Self {
        self.max_pixels = max_pixels;
        self
    }

    /// Sets [`DecodeOptions::exif_orientation`].
    pub fn exif_orientation(mut self, apply: bool) -> Self {
        self.exif_orientation = apply;
        self
    }

    /// Sets [`DecodeOptions::dct_scaling`].
    pub fn dct_scaling(mut self, on: bool) -> Self {
        self.dct_scaling = on;
        self
    }

    /// Sets [`DecodeOptions::partial_decode`].
    pub fn partial_decode(mut self, on: bool) -> Self {
        self.partial_decode = on;
        self
    }

    /// Sets [`DecodeOptions::max_file_bytes`].
    pub fn max_file_bytes(mut self, bytes: u64) -> Self {
        self.max_file_bytes = bytes;
        self
    }

    /// Sets [`DecodeOptions::memory_limit`].
    pub fn memory_limit(mut self, bytes: u64) -> Self {
        self.memory_limit = bytes;
        self
    }

    /// Sets [`DecodeOptions::lanes`].
    pub fn lanes(mut self, lanes: Decode) -> Self {
        self.lanes = lanes;
        self
    }

    /// Sets [`DecodeOptions::gpu_share`].
    pub fn gpu_share(mut self, share: Option<f32>) -> Self {
        self.gpu_share = share;
        self
    }

    /// Sets [`DecodeOptions::min_gpu_share`].
    pub fn min_gpu_share(mut self, share: Option<f32>) -> Self {
        self.min_gpu_share = share;
        self
    }

    /// For a process one of `ranks` of its job on this machine (its launcher's
    /// `LOCAL_WORLD_SIZE`): with [`SHARED_MACHINE_MIN_RANKS`] or more,
    /// [`DecodeOptions::min_gpu_share`] becomes [`SHARED_MACHINE_MIN_GPU_SHARE`] unless it was
    /// set.
    pub fn ranks_on_machine(mut self, ranks: usize) -> Self {
        if ranks >= SHARED_MACHINE_MIN_RANKS && self.min_gpu_share.is_none() {
            self.min_gpu_share = Some(SHARED_MACHINE_MIN_GPU_SHARE);
        }
        self
    }

    /// Sets [`DecodeOptions::assisted_share`].
    pub fn assisted_share(mut self, share: f32) -> Self {
        self.assisted_share = share;
        self
    }

    /// Sets [`DecodeOptions::gray16`].
    pub fn gray16(mut self, conversion: Gray16) -> Self {
        self.gray16 = conversion;
        self
    }

    /// Sets [`DecodeOptions::planned_epochs`].
    pub fn planned_epochs(mut self, epochs: Option<u64>) -> Self {
        self.planned_epochs = epochs;
        self
    }

    fn validate(&self) -> Result<()> {
        if self.max_pixels == 0 {
            return Err(Error::invalid("max_pixels", "must be at least 1"));
        }
        if self.max_file_bytes == 0 {
            return Err(Error::invalid("max_file_bytes", "must be at least 1"));
        }
        if self.memory_limit == 0 {
            // Named as the builder, the command line and Python name it.
            return Err(Error::invalid("decode_memory", "must be at least 1"));
        }
        for (name, share) in [
            ("gpu_share", self.gpu_share),
            ("min_gpu_share", self.min_gpu_share),
        ] {
            if let Some(share) = share {
                if !(0.0..=1.0).contains(&share) {
                    return Err(Error::invalid(
                        name,
                        format!("{share} is not a share from 0 to 1"),
                    ));
                }
            }
        }
        if !(0.0..=1.0).contains(&self.assisted_share) {
            return Err(Error::invalid(
                "assisted_share",
                format!("{} is not a share from 0 to 1", self.assisted_share),
            ));
        }
        Ok(())
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

    /// What the random transforms draw for the image with source index `index` in `epoch`,
    /// `width` x `height` pixels (after any EXIF turn): exactly what a pipeline with these
    /// options draws for it, on any lane. `None` when nothing is random.
    pub fn draw(
        &self,
        width: u32,
        height: u32,
        index: usize,
        epoch: u64,
    ) -> Option<crate::CropDraw> {
        crate::geometry::Geometry::new(self).draw(width, height, index, epoch)
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

    fn validate(&self) -> Result<()> {
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

/// Per-channel `y = x * scale + bias`, RGB order: torchvision's `Normalize` on `x / 255`, folded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Affine {
    /// Multiplier of the u8 value, per source channel.
    pub scale: [f32; 3],
    /// Offset, per source channel.
    pub bias: [f32; 3],
}

impl Affine {
    /// The value one u8 sample of source channel `c` normalizes to, computed as one fused
    /// multiply-add in f32: the CUDA kernel uses `fmaf`, so the two agree bit for bit.
    pub fn apply(&self, c: usize, x: u8) -> f32 {
        (x as f32).mul_add(self.scale[c], self.bias[c])
    }
}

/// What the normalize step makes of a u8 HWC batch: the one description both the CUDA kernel
/// and the CPU normalize follow.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NormalizeSpec {
    /// Per-channel multiply-add, RGB order.
    pub affine: Affine,
    /// Output element type.
    pub dtype: DType,
    /// Output layout.
    pub layout: Layout,
    /// Output channel order.
    pub channel_order: ChannelOrder,
}

/// The output tensor: normalization, element type, layout, channel order.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct OutputOptions {
    /// Per-channel mean, 0..1 units, RGB order (default ImageNet's).
    pub mean: [f32; 3],
    /// Per-channel standard deviation, 0..1 units, RGB order (default ImageNet's).
    pub std: [f32; 3],
    /// Element type (default f16).
    pub dtype: DType,
    /// Layout (default NCHW).
    pub layout: Layout,
    /// Channel order (default RGB). Mean and std name colours, whatever the order.
    pub channel_order: ChannelOrder,
}

impl Default for OutputOptions {
    fn default() -> Self {
        OutputOptions {
            mean: IMAGENET_MEAN,
            std: IMAGENET_STD,
            dtype: DType::F16,
            layout: Layout::Nchw,
            channel_order: ChannelOrder::Rgb,
        }
    }
}

impl OutputOptions {
    /// Sets mean and standard deviation, 0..1 units, RGB order.
    pub fn mean_std(mut self, mean: [f32; 3], std: [f32; 3]) -> Self {
        self.mean = mean;
        self.std = std;
        self
    }

    /// Sets [`OutputOptions::dtype`].
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }

    /// Sets [`OutputOptions::layout`].
    pub fn layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }

    /// Sets [`OutputOptions::channel_order`].
    pub fn channel_order(mut self, order: ChannelOrder) -> Self {
        self.channel_order = order;
        self
    }

    /// The normalization folded into one multiply-add per channel: `y = x * scale + bias` with
    /// `x` the u8 value, `scale = 1 / (255 std)` and `bias = -mean / std`, RGB order.
    pub fn affine(&self) -> Affine {
        let mut a = Affine {
            scale: [0.0; 3],
            bias: [0.0; 3],
        };
        for c in 0..3 {
            a.scale[c] = 1.0 / (255.0 * self.std[c]);
            a.bias[c] = -self.mean[c] / self.std[c];
        }
        a
    }

    /// What the normalize step makes of these options.
    pub fn spec(&self) -> NormalizeSpec {
        NormalizeSpec {
            affine: self.affine(),
            dtype: self.dtype,
            layout: self.layout,
            channel_order: self.channel_order,
        }
    }

    fn validate(&self) -> Result<()> {
        let ok = (0..3).all(|c| self.std[c].is_finite() && self.std[c] > 0.0)
            && self.mean.iter().all(|m| m.is_finite());
        if !ok {
            return Err(Error::invalid(
                "mean/std",
                format!(
                    "mean {:?} / std {:?}: every mean must be finite and every std finite and > 0",
                    self.mean, self.std
                ),
            ));
        }
        Ok(())
    }
}

/// How the shards of the ranks are evened out when a source is shared by several processes
/// (data-parallel training needs every rank to yield the same number of batches, or a collective
/// waits forever).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ShardBalance {
    /// Every rank gets the same number of images: the epoch's order is padded by wrapping around
    /// it, as PyTorch's `DistributedSampler` does, and padded rows are flagged on the batch
    /// ([`crate::Batch::padded`]) so evaluation code can mask them. Images that fail are
    /// replaced by the next ones (padding past the end), so batches stay equal too.
    #[default]
    Pad,
    /// Every rank gets the same number of images: the order is cut to a multiple of the world
    /// (`DistributedSampler(drop_last=True)`); failed images are replaced as with `Pad`.
    Drop,
    /// Every `world`-th image, no more: shards differ in length by up to one image and nothing
    /// is padded or replaced past the end.
    Uneven,
}

named_choices!(
    ShardBalance,
    "shard balance",
    [
        (ShardBalance::Pad, ["pad"]),
        (ShardBalance::Drop, ["drop"]),
        (ShardBalance::Uneven, ["uneven"]),
    ]
);

/// This process's part of a source shared by `world` processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Shard {
    /// This process's index, `0..world`.
    pub rank: usize,
    /// Number of processes.
    pub world: usize,
}

impl Shard {
    /// Process `rank` of `world`.
    pub const fn new(rank: usize, world: usize) -> Shard {
        Shard { rank, world }
    }
}

impl Default for Shard {
    /// The whole source: rank 0 of 1.
    fn default() -> Self {
        Shard::new(0, 1)
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.rank, self.world)
    }
}

impl FromStr for Shard {
    type Err = ParseOptionError;

    /// `RANK/WORLD`, as [`Shard`] prints (e.g. `0/4`); the rank is checked against the world
    /// when the options are validated.
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        let fail = || ParseOptionError {
            what: "shard",
            given: s.to_string(),
            expected: "RANK/WORLD (e.g. 0/4)".to_string(),
        };
        let (rank, world) = s.trim().split_once('/').ok_or_else(fail)?;
        let number = |n: &str| n.trim().parse::<usize>().map_err(|_| fail());
        Ok(Shard::new(number(rank)?, number(world)?))
    }
}

/// Batches and their order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchOptions {
    /// Images per batch (default 256).
    pub batch_size: usize,
    /// Keep or drop a last partial batch (default keep).
    pub last_batch: LastBatch,
    /// What a bad image does (default: skip it and list it on the batch).
    pub on_error: OnError,
    /// Seed of the per-epoch shuffle; `None` (default) keeps the source's order.
    pub shuffle_seed: Option<u64>,
    /// This process's part: every `world`-th image of the (shuffled) order starting at `rank`.
    pub shard: Shard,
    /// How the ranks' shards are evened out (default: padded to equal length).
    pub shard_balance: ShardBalance,
}

impl Default for BatchOptions {
    fn default() -> Self {
        BatchOptions {
            batch_size: 256,
            last_batch: LastBatch::Keep,
            on_error: OnError::Skip,
            shuffle_seed: None,
            shard: Shard::default(),
            shard_balance: ShardBalance::Pad,
        }
    }
}

impl BatchOptions {
    /// Sets [`BatchOptions::batch_size`].
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }

    /// Sets [`BatchOptions::last_batch`].
    pub fn last_batch(mut self, policy: LastBatch) -> Self {
        self.last_batch = policy;
        self
    }

    /// Sets [`BatchOptions::on_error`].
    pub fn on_error(mut self, policy: OnError) -> Self {
        self.on_error = policy;
        self
    }

    /// Sets [`BatchOptions::shuffle_seed`].
    pub fn shuffle_seed(mut self, seed: Option<u64>) -> Self {
        self.shuffle_seed = seed;
        self
    }

    /// Sets [`BatchOptions::shard`].
    pub fn shard(mut self, shard: Shard) -> Self {
        self.shard = shard;
        self
    }

    /// Sets [`BatchOptions::shard_balance`].
    pub fn shard_balance(mut self, balance: ShardBalance) -> Self {
        self.shard_balance = balance;
        self
    }

    fn validate(&self) -> Result<()> {
        if self.batch_size == 0 {
            return Err(Error::invalid("batch_size", "must be at least 1"));
        }
        let Shard { rank, world } = self.shard;
        if world == 0 || rank >= world {
            return Err(Error::invalid(
                "shard",
                format!("rank {rank} of world {world}: need rank < world"),
            ));
        }
        Ok(())
    }
}

/// Where and how the pipeline runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RuntimeOptions {
    /// Where the output lives (default `Device::Cuda(0)`).
    pub device: Device,
    /// Threads of the CPU stage (default 0: one per core, less the GPU decode lane's
    /// submitting threads when hybrid decoding runs).
    pub threads: usize,
    /// Batches prepared ahead of the consumer (default 2). One of them waits in the prefetch
    /// thread until the next is made (so that images skipped at the end of an epoch are listed
    /// on its last batch), so a depth of 1 holds two as well.
    pub prefetch: usize,
    /// With a CUDA [`RuntimeOptions::device`] that cannot be used for want of the driver,
    /// NVRTC or the device (a [`crate::CudaUnavailable`] error), run on the CPU instead of
    /// failing: [`crate::Pipeline::cpu_fallback`] then says why (default off). The CPU threads
    /// start before the device is looked for, so the driver's start (about 0.1 s) overlaps their
    /// work instead of coming before it.
    pub cpu_fallback: bool,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            device: Device::Cuda(0),
            threads: 0,
            prefetch: 2,
            cpu_fallback: false,
        }
    }
}

/// The most batches a pipeline prepares ahead of its consumer.
pub const MAX_PREFETCH: usize = 1024;

/// The most CPU threads a pipeline starts: eight per core, and at least 64.
pub fn max_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .saturating_mul(8)
        .max(64)
}

impl RuntimeOptions {
    /// Sets [`RuntimeOptions::device`].
    pub fn device(mut self, device: Device) -> Self {
        self.device = device;
        self
    }

    /// Sets [`RuntimeOptions::cpu_fallback`].
    pub fn cpu_fallback(mut self, fall_back: bool) -> Self {
        self.cpu_fallback = fall_back;
        self
    }

    /// Sets [`RuntimeOptions::threads`].
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    /// Sets [`RuntimeOptions::prefetch`].
    pub fn prefetch(mut self, depth: usize) -> Self {
        self.prefetch = depth;
        self
    }

    fn validate(&self) -> Result<()> {
        if self.prefetch == 0 || self.prefetch > MAX_PREFETCH {
            return Err(Error::invalid(
                "prefetch",
                format!("{} batches: must be 1 to {MAX_PREFETCH}", self.prefetch),
            ));
        }
        let max = max_threads();
        if self.threads > max {
            return Err(Error::invalid(
                "threads",
                format!(
                    "{} threads is over the limit of {max} (eight per core, at least 64); 0 \
                     means one per core",
                    self.threads
                ),
            ));
        }
        Ok(())
    }
}

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
    pub augment: crate::augment::AugmentOptions,
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
    pub fn augment(mut self, augment: crate::augment::AugmentOptions) -> Self {
        self.augment = augment;
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
