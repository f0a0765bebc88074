//! The output tensor's options: normalization, element type, layout, channel order.

use std::fmt;
use std::str::FromStr;

use super::ParseOptionError;
use crate::error::{Error, Result};

/// ImageNet channel means in 0..1 units, RGB order (torchvision's `Normalize` defaults).
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];

/// ImageNet channel standard deviations in 0..1 units, RGB order.
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// Element type of a tensor: the output's (images or tokens) is one of the three float types;
/// the integers are those of a patch sequence's side tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DType {
    /// IEEE half precision (`half::f16`).
    F16,
    /// bfloat16 (`half::bf16`).
    BF16,
    /// IEEE single precision.
    F32,
    /// 32-bit signed integers (`cu_seqlens`, masks).
    I32,
    /// 64-bit signed integers (grids, spatial shapes, patch coordinates).
    I64,
    /// Unsigned bytes (dense targets' masks).
    U8,
}

named_choices!(
    DType,
    "dtype",
    [
        (DType::F16, ["f16", "float16", "half"]),
        (DType::BF16, ["bf16", "bfloat16"]),
        (DType::F32, ["f32", "float32", "float"]),
        (DType::I32, ["i32", "int32"]),
        (DType::I64, ["i64", "int64"]),
        (DType::U8, ["u8", "uint8"]),
    ]
);

impl DType {
    /// Bytes per element.
    pub fn size_of(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::I64 => 8,
            DType::U8 => 1,
        }
    }

    /// Whether it is a float type (what an output can be).
    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32)
    }

    /// The error of an output asked for in this type when it is not a float type (integers are
    /// a patch sequence's side tensors').
    pub(crate) fn not_an_output(self) -> Error {
        Error::invalid("dtype", format!("{self}: the output is f16, bf16 or f32"))
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

    pub(super) fn validate(&self) -> Result<()> {
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
        if !self.dtype.is_float() {
            return Err(self.dtype.not_an_output());
        }
        Ok(())
    }
}
