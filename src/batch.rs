//! What [`crate::Pipeline::next_batch`] returns, and the per-epoch account of every image.

use crate::augment::{ImageOps, Mix};
use crate::error::ItemError;
use crate::geometry::CropDraw;
use crate::source::ReadReport;
use crate::tensor::Tensor;

/// How many images of a batch each decode lane made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct DecodedBy {
    pub cpu: usize,
    pub gpu: usize,
    /// Of the GPU lane's, those its assisted path decoded.
    pub assisted: usize,
}

/// One batch: the images as a tensor, and which source images they are.
#[derive(Debug)]
pub struct Batch {
    pub(crate) images: Tensor,
    pub(crate) indices: Vec<usize>,
    pub(crate) ids: Vec<String>,
    pub(crate) labels: Option<Vec<u32>>,
    pub(crate) padded: Vec<bool>,
    pub(crate) crops: Option<Vec<CropDraw>>,
    pub(crate) augmentations: Option<Vec<ImageOps>>,
    pub(crate) mix: Option<Mix>,
    pub(crate) soft_labels: Option<Tensor>,
    pub(crate) skipped: Vec<ItemError>,
    pub(crate) epoch: u64,
    pub(crate) uploaded_bytes: usize,
    pub(crate) decoded_by: DecodedBy,
    /// The position in the epoch's order where the next batch begins.
    pub(crate) next_position: usize,
}

impl Batch {
    /// The images, `[N, 3, H, W]` (NCHW) or `[N, H, W, 3]` (NHWC), on the device the pipeline
    /// was built for.
    pub fn images(&self) -> &Tensor {
        &self.images
    }

    /// Takes the images out of the batch.
    pub fn into_images(self) -> Tensor {
        self.images
    }

    /// Number of images in the batch.
    pub fn len(&self) -> usize {
        self.indices.len()
    }

    /// Whether the batch has no images (never the case for batches the pipeline yields).
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }

    /// Index in the source's listing of each image, in batch order.
    pub fn indices(&self) -> &[usize] {
        &self.indices
    }

    /// Id (path, or the caller's id for bytes) of each image, in batch order.
    pub fn ids(&self) -> &[String] {
        &self.ids
    }

    /// Class label of each image, in batch order, when the source has labels.
    pub fn labels(&self) -> Option<&[u32]> {
        self.labels.as_deref()
    }

    /// Whether each row pads this rank's shard: a repeat of an image, there so that every rank
    /// yields the same number of batches ([`crate::ShardBalance::Pad`]); mask these rows when
    /// evaluating.
    pub fn padded(&self) -> &[bool] {
        &self.padded
    }

    /// What the random transforms drew for each row (its box and flip, as torchvision's
    /// `F.resized_crop` and `F.hflip` take them), when the pipeline draws any.
    pub fn crops(&self) -> Option<&[CropDraw]> {
        self.crops.as_deref()
    }

    /// What each row's augmentations drew, when the pipeline augments: torchvision's functional
    /// calls, in the order they were applied (after the crop and flip of [`Batch::crops`], before
    /// the batch's [`Batch::mix`]).
    pub fn augmentations(&self) -> Option<&[ImageOps]> {
        self.augmentations.as_deref()
    }

    /// How the batch's rows were mixed (MixUp or CutMix; row `i` with row `i - 1`, row 0 with
    /// the last), when the pipeline mixes.
    pub fn mix(&self) -> Option<Mix> {
        self.mix
    }

    /// The soft labels of a mixed batch, `[N, num_classes, 1, 1]` float32 on the batch's
    /// device (`.flatten(1)` in PyTorch gives `[N, num_classes]`): each row's one-hot label
    /// times `lam` plus the previous row's times `1 - lam`, as torchvision's `MixUp` and
    /// `CutMix` make them.
    pub fn soft_labels(&self) -> Option<&Tensor> {
        self.soft_labels.as_ref()
    }

    /// Takes the soft labels out of the batch (for a consumer that keeps them apart from it).
    pub fn take_soft_labels(&mut self) -> Option<Tensor> {
        self.soft_labels.take()
    }

    /// Images that were skipped while this batch was filled (policy [`crate::OnError::Skip`]),
    /// each with its id and reason; the last batch of an epoch also lists those skipped after
    /// its last image, so every skipped image is on a batch.
    pub fn skipped(&self) -> &[ItemError] {
        &self.skipped
    }

    /// The epoch this batch belongs to.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// How many of the batch's images the CPU threads decoded and how many the GPU's JPEG
    /// engines (with [`crate::Decode::Hybrid`]), as `(cpu, gpu)`.
    pub fn decoded_by(&self) -> (usize, usize) {
        (self.decoded_by.cpu, self.decoded_by.gpu)
    }

    /// Bytes this batch moved from host to device: `N * H * W * 3` as u8 on a CUDA device,
    /// 0 on the CPU device.
    pub fn uploaded_bytes(&self) -> usize {
        self.uploaded_bytes
    }
}

/// Where every image of one epoch went: `images - padded + skipped.len() + dropped` equals the
/// number of images this process's shard holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EpochReport {
    /// The epoch.
    pub epoch: u64,
    /// Images delivered in batches (padding rows included).
    pub images: usize,
    /// Rows delivered that pad this rank's shard (repeats).
    pub padded: usize,
    /// Batches delivered.
    pub batches: usize,
    /// Every image skipped in the epoch, in order (each also listed on a batch, unless the
    /// epoch yielded no batch at all).
    pub skipped: Vec<ItemError>,
    /// Good images left out because the last batch was partial and [`crate::LastBatch::Drop`].
    pub dropped: usize,
    /// Whether the epoch ran to its end (false if it was abandoned or stopped by an error).
    pub complete: bool,
    /// Images of the delivered batches decoded by the CPU threads.
    pub decoded_by_cpu: usize,
    /// Images of the delivered batches decoded by the GPU decode lane (its JPEG engines and its
    /// assisted path).
    pub decoded_by_gpu: usize,
    /// Of those, the images the GPU lane's assisted path decoded (on the GPU's cores, exactly as
    /// libjpeg-turbo does) rather than the JPEG engines.
    pub decoded_by_assisted: usize,
    /// For a source in object storage, what reading the epoch took (`None` for local sources;
    /// filled in when the epoch ends).
    pub reads: Option<ReadReport>,
}
