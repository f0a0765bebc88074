//! What a pipeline produces and how: output geometry, normalization, dtype, layout, device,
//! batching and the error policy. [`crate::PipelineBuilder`] fills a [`Config`].

use crate::error::{Error, Result};

/// ImageNet channel means in 0..1 units, RGB order (torchvision's `Normalize` defaults).
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
/// ImageNet channel standard deviations in 0..1 units, RGB order.
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// Element type of the output tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE half precision (`half::f16`).
    F16,
    /// bfloat16 (`half::bf16`).
    BF16,
    /// IEEE single precision.
    F32,
}

impl DType {
    /// Bytes per element.
    pub fn size_of(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 => 4,
        }
    }

    /// Lower-case name (`f16`, `bf16`, `f32`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
        }
    }
}

/// Memory layout of the output batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// `[N, C, H, W]`, PyTorch's default.
    Nchw,
    /// `[N, H, W, C]`, channels last.
    Nhwc,
}

impl Layout {
    /// Shape of a batch of `n` images of `height` x `width` with 3 channels in this layout.
    pub fn shape(self, n: usize, height: usize, width: usize) -> [usize; 4] {
        match self {
            Layout::Nchw => [n, 3, height, width],
            Layout::Nhwc => [n, height, width, 3],
        }
    }

    /// Lower-case name (`nchw`, `nhwc`).
    pub fn name(self) -> &'static str {
        match self {
            Layout::Nchw => "nchw",
            Layout::Nhwc => "nhwc",
        }
    }
}

/// Order of the colour channels in the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ChannelOrder {
    /// Red, green, blue (torchvision, timm).
    #[default]
    Rgb,
    /// Blue, green, red (Caffe- and OpenCV-style models).
    Bgr,
}

/// Where the output tensor lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    /// The CUDA device with this ordinal: u8 upload and the NVRTC kernel.
    Cuda(usize),
    /// Host memory: the same CPU stage, normalized by the CPU reference. Works anywhere.
    Cpu,
}

/// What happens when one image cannot be read or decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum OnError {
    /// Fill the batch with the next good images and list the bad one in [`crate::Batch::skipped`].
    #[default]
    Skip,
    /// Stop: `next_batch` returns [`Error::Item`] naming the image.
    Fail,
}

/// What happens to a last batch smaller than the batch size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LastBatch {
    /// Yield it (PyTorch's `drop_last=False`).
    #[default]
    Keep,
    /// Leave it out (PyTorch's `drop_last=True`).
    Drop,
}

/// Resampling filter used when resizing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
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
}

/// How an image becomes an output of `height` x `width` pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResizeMode {
    /// torchvision's `Resize(shorter_side)` then `CenterCrop`: the shorter side becomes
    /// `shorter_side`, the longer keeps the aspect ratio, and the centre is cut out (padded with
    /// zeros when the crop is larger than the resized image, as torchvision does).
    ShorterSideThenCenterCrop {
        /// Target length of the shorter side.
        shorter_side: u32,
    },
    /// Resize straight to the output size, ignoring the aspect ratio.
    Stretch,
    /// Keep the aspect ratio, fit the whole image inside the output, and pad the rest with
    /// `pad` (detection models' letterbox).
    Letterbox {
        /// Value of every padded channel, 0..=255.
        pad: u8,
    },
}

/// Everything a pipeline needs to know besides its source.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// How images are brought to the output size.
    pub resize_mode: ResizeMode,
    /// Output height in pixels.
    pub height: u32,
    /// Output width in pixels.
    pub width: u32,
    /// Resampling filter.
    pub interpolation: Interpolation,
    /// Per-channel mean, 0..1 units, RGB order.
    pub mean: [f32; 3],
    /// Per-channel standard deviation, 0..1 units, RGB order.
    pub std: [f32; 3],
    /// Output element type.
    pub dtype: DType,
    /// Output layout.
    pub layout: Layout,
    /// Output channel order.
    pub channel_order: ChannelOrder,
    /// Images per batch.
    pub batch_size: usize,
    /// Batches prepared ahead of the one being consumed.
    pub prefetch: usize,
    /// Threads of the CPU stage (0: one per core).
    pub threads: usize,
    /// Where the output lives.
    pub device: Device,
    /// Bad-image policy.
    pub on_error: OnError,
    /// Last partial batch policy.
    pub last_batch: LastBatch,
    /// Seed of the per-epoch shuffle; `None` keeps the source's order.
    pub shuffle_seed: Option<u64>,
    /// `(rank, world)`: this process takes every `world`-th image starting at `rank`.
    pub shard: (usize, usize),
    /// Images that claim more pixels than this are refused before decoding.
    pub max_pixels: u64,
    /// Apply the EXIF orientation tag of JPEG, PNG, WebP and TIFF files.
    pub exif_orientation: bool,
    /// Decode large JPEGs at 1/2, 1/4 or 1/8 size in the DCT domain when the part the output
    /// uses keeps at least twice the output's pixels along each axis: several times faster on
    /// photos much larger than the output, at a small cost in fidelity to torchvision (which
    /// decodes at full size). Off by default.
    pub dct_scaling: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            resize_mode: ResizeMode::ShorterSideThenCenterCrop { shorter_side: 256 },
            height: 224,
            width: 224,
            interpolation: Interpolation::Bilinear,
            mean: IMAGENET_MEAN,
            std: IMAGENET_STD,
            dtype: DType::F16,
            layout: Layout::Nchw,
            channel_order: ChannelOrder::Rgb,
            batch_size: 256,
            prefetch: 2,
            threads: 0,
            device: Device::Cuda(0),
            on_error: OnError::Skip,
            last_batch: LastBatch::Keep,
            shuffle_seed: None,
            shard: (0, 1),
            max_pixels: DEFAULT_MAX_PIXELS,
            exif_orientation: false,
            dct_scaling: false,
        }
    }
}

/// Default pixel limit: Pillow's decompression-bomb error threshold (2 x 89,478,485), so every
/// image Pillow opens opens here too, and a forged header cannot make us allocate gigabytes.
pub const DEFAULT_MAX_PIXELS: u64 = 178_956_970;

impl Config {
    /// Bytes of one image in the u8 staging buffer (`height * width * 3`).
    pub fn image_bytes(&self) -> usize {
        self.height as usize * self.width as usize * 3
    }

    /// Checks that the options make sense together.
    pub fn validate(&self) -> Result<()> {
        let fail = |msg: String| Err(Error::Config(msg));
        if self.height == 0 || self.width == 0 {
            return fail(format!(
                "output size {}x{} has no pixels",
                self.width, self.height
            ));
        }
        if let ResizeMode::ShorterSideThenCenterCrop { shorter_side: 0 } = self.resize_mode {
            return fail("resize to a shorter side of 0 pixels".into());
        }
        if self.batch_size == 0 {
            return fail("batch size must be at least 1".into());
        }
        if self.prefetch == 0 {
            return fail("prefetch depth must be at least 1".into());
        }
        let (rank, world) = self.shard;
        if world == 0 || rank >= world {
            return fail(format!(
                "shard rank {rank} of world {world}: need rank < world"
            ));
        }
        for c in 0..3 {
            if !(self.std[c].is_finite() && self.std[c] > 0.0 && self.mean[c].is_finite()) {
                return fail(format!(
                    "mean {:?} / std {:?}: every std must be finite and > 0",
                    self.mean, self.std
                ));
            }
        }
        if self.max_pixels == 0 {
            return fail("max_pixels must be at least 1".into());
        }
        Ok(())
    }

    /// The normalization folded into one multiply-add per channel: `y = x * scale + bias` with
    /// `x` the u8 value, `scale = 1 / (255 std)` and `bias = -mean / std`, in RGB order.
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
    /// multiply-add in f32: the CUDA kernel uses `fmaf` so the two agree bit for bit.
    pub fn apply(&self, c: usize, x: u8) -> f32 {
        (x as f32).mul_add(self.scale[c], self.bias[c])
    }
}
