//! What [`crate::Pipeline::next_batch`] returns, and the per-epoch account of every image.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::augment::{ImageOps, Mix};
use crate::error::{ItemError, Result};
use crate::geometry::CropDraw;
use crate::options::Layout;
use crate::patches::{BatchLayout, Packing, PatchPlan, Preset, TokenOrder};
use crate::source::ReadReport;
use crate::tensor::{DeviceTensor, HostData, HostTensor, Tensor};
use crate::views::ViewDraw;

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
    /// A patch-sequence batch's description (its tokens are `images`).
    pub(crate) patches: Option<BatchPatches>,
    /// A pipeline of views' tensors, one a view group (`images` is then empty).
    pub(crate) views: Option<Vec<Tensor>>,
    /// What each image's views drew, in a pipeline of views.
    pub(crate) view_draws: Option<Vec<Vec<ViewDraw>>>,
}

impl Batch {
    /// The images, `[N, 3, H, W]` (NCHW) or `[N, H, W, 3]` (NHWC), on the device the pipeline
    /// was built for; for a patch-sequence pipeline, the tokens ([`Batch::tokens`]); for a
    /// pipeline of views, an empty host tensor (the views are [`Batch::views`]).
    pub fn images(&self) -> &Tensor {
        &self.images
    }

    /// A patch-sequence pipeline's tokens ([`crate::PipelineBuilder::patches`]): `[rows,
    /// patch_dim]` packed (`cu_seqlens` says where each image's rows begin) or `[images, length,
    /// patch_dim]` padded, f16, bf16 or f32, on the batch's device; `None` for images.
    pub fn tokens(&self) -> Option<&Tensor> {
        self.patches.as_ref().map(|_| &self.images)
    }

    /// A patch-sequence batch's description: its layout, each image's plan and grid, and the
    /// side tensors the models take with the tokens; `None` for images.
    pub fn patches(&self) -> Option<&BatchPatches> {
        self.patches.as_ref()
    }

    /// A pipeline of views' views ([`crate::PipelineBuilder::views`]), one tensor per view
    /// group, in group order: `[count, N, 3, size, size]` (NCHW) or `[count, N, size, size, 3]`
    /// (NHWC), view `j` of the group for every image of the batch, then view `j + 1`; of the
    /// pipeline's dtype, normalized with its mean and std, on its device. `None` for images
    /// (and [`Batch::images`] is empty for views).
    pub fn views(&self) -> Option<&[Tensor]> {
        self.views.as_deref()
    }

    /// Takes the views out of the batch.
    pub fn take_views(&mut self) -> Option<Vec<Tensor>> {
        self.views.take()
    }

    /// What each image's views drew, in batch order, each image's views in view order (across
    /// the groups): the box, flip and colour calls, [`ViewDraw::json`] giving `--save`'s line.
    /// `None` for images.
    pub fn view_draws(&self) -> Option<&[Vec<ViewDraw>]> {
        self.view_draws.as_deref()
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

    /// How many of the batch's images the CPU threads decoded and how many the GPU decode lane
    /// (its JPEG engines or its assisted path; a [`crate::PatchServer`]'s, its assisted path),
    /// as `(cpu, gpu)`.
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

/// What describes a patch-sequence batch beside its tokens ([`Batch::tokens`]): where each
/// image's rows are, its plan (the box of the source resized, its size, its flip, its grid), and
/// the side tensors the references give with their `pixel_values`, as Rust vectors and as
/// tensors on the batch's device.
///
/// | reference's name | here | shape, type |
/// | --- | --- | --- |
/// | `image_grid_thw` (Qwen2-VL) | [`BatchPatches::grids`] | `[n, 3]` i64 |
/// | `cu_seqlens` (packed) | [`BatchPatches::cu_seqlens`] | `[n + 1]` i32 |
/// | `pixel_attention_mask` (SigLIP2), `patch_valid` (timm) | [`BatchPatches::mask`] | `[n, length]` i32 |
/// | `spatial_shapes` (SigLIP2) | [`BatchPatches::spatial_shapes`] | `[n, 2]` i64 |
/// | `patch_coord` (timm) | [`BatchPatches::coordinates`] | `[n, length, 2]` i64 |
///
/// Packed, the mask and coordinates are per row, `[rows]` and `[rows, 2]`.
#[derive(Debug, Clone)]
pub struct BatchPatches {
    pub(crate) preset: Preset,
    pub(crate) order: TokenOrder,
    pub(crate) patch_dim: usize,
    pub(crate) layout: BatchLayout,
    pub(crate) plans: Vec<PatchPlan>,
    pub(crate) seq_len: Option<u32>,
    /// The stream of a CUDA batch, which the side tensors are uploaded on.
    pub(crate) stream: Option<Arc<CudaStream>>,
}

impl BatchPatches {
    /// The preset.
    pub fn preset(&self) -> Preset {
        self.preset
    }

    /// Where each image's tokens are, packed or padded.
    pub fn layout(&self) -> &BatchLayout {
        &self.layout
    }

    /// Packed (`[rows, patch_dim]`) or padded (`[images, length, patch_dim]`).
    pub fn packing(&self) -> Packing {
        self.layout.packing
    }

    /// Values per token.
    pub fn patch_dim(&self) -> usize {
        self.patch_dim
    }

    /// Each image's plan, in batch order: the box of the source it resized (the whole image
    /// but for timm's crops), its resized size, whether it was flipped, its patch grid.
    pub fn plans(&self) -> &[PatchPlan] {
        &self.plans
    }

    /// The sequence length the batch was cut for (timm's), if any.
    pub fn seq_len(&self) -> Option<u32> {
        self.seq_len
    }

    /// Each image's tokens (padding aside).
    pub fn tokens_per_image(&self) -> Vec<usize> {
        self.plans.iter().map(PatchPlan::tokens).collect()
    }

    /// Each image's first row, then the rows: flash attention's `cu_seqlens` (padded, the
    /// padded starts).
    pub fn cu_seqlens(&self) -> Vec<i32> {
        self.layout.cu_seqlens()
    }

    /// Qwen2-VL's `image_grid_thw`: (t, h, w) patches per image.
    pub fn grids(&self) -> Vec<[i64; 3]> {
        self.plans
            .iter()
            .map(|p| [p.grid_t, p.grid_h, p.grid_w].map(i64::from))
            .collect()
    }

    /// SigLIP2's `spatial_shapes`: (h, w) patches per image.
    pub fn spatial_shapes(&self) -> Vec<[i64; 2]> {
        self.plans
            .iter()
            .map(|p| [p.grid_h, p.grid_w].map(i64::from))
            .collect()
    }

    /// Per row: 1 for an image's token, 0 for padding (SigLIP2's `pixel_attention_mask`,
    /// timm's `patch_valid`).
    pub fn mask(&self) -> Vec<i32> {
        self.layout.mask().into_iter().map(i32::from).collect()
    }

    /// Per row: the token's patch (row, column) in its image, (0, 0) for padding (timm's
    /// `patch_coord`).
    pub fn coordinates(&self) -> Vec<[i64; 2]> {
        self.layout
            .coordinates(self.order)
            .into_iter()
            .map(|c| c.map(i64::from))
            .collect()
    }

    /// The axes of a per-row side tensor: `[images, length]` padded, `[rows]` packed.
    fn row_axes(&self) -> Vec<usize> {
        match self.layout.packing {
            Packing::Padded { len } => vec![self.plans.len(), len as usize],
            _ => vec![self.layout.rows],
        }
    }

    /// `data` of `shape` on the batch's device.
    fn tensor(&self, data: HostData, shape: Vec<usize>) -> Result<Tensor> {
        match &self.stream {
            Some(stream) => Ok(Tensor::Device(DeviceTensor::upload(
                stream,
                &data,
                &shape,
                Layout::Nchw,
            )?)),
            None => HostTensor::new(data, &shape, Layout::Nchw)
                .map(Tensor::Host)
                .ok_or_else(|| crate::Error::Mismatch("a side tensor off its shape".into())),
        }
    }

    /// [`BatchPatches::cu_seqlens`] on the batch's device, `[n + 1]` i32 (uploaded on the
    /// pipeline's stream for a CUDA batch).
    pub fn cu_seqlens_tensor(&self) -> Result<Tensor> {
        let values = self.cu_seqlens();
        let shape = vec![values.len()];
        self.tensor(HostData::I32(values), shape)
    }

    /// [`BatchPatches::grids`] on the batch's device, `[n, 3]` i64.
    pub fn grids_tensor(&self) -> Result<Tensor> {
        let values: Vec<i64> = self.grids().into_iter().flatten().collect();
        self.tensor(HostData::I64(values), vec![self.plans.len(), 3])
    }

    /// [`BatchPatches::spatial_shapes`] on the batch's device, `[n, 2]` i64.
    pub fn spatial_shapes_tensor(&self) -> Result<Tensor> {
        let values: Vec<i64> = self.spatial_shapes().into_iter().flatten().collect();
        self.tensor(HostData::I64(values), vec![self.plans.len(), 2])
    }

    /// [`BatchPatches::mask`] on the batch's device: `[n, length]` i32 padded, `[rows]`
    /// packed.
    pub fn mask_tensor(&self) -> Result<Tensor> {
        self.tensor(HostData::I32(self.mask()), self.row_axes())
    }

    /// [`BatchPatches::coordinates`] on the batch's device: `[n, length, 2]` i64 padded,
    /// `[rows, 2]` packed.
    pub fn coordinates_tensor(&self) -> Result<Tensor> {
        let values: Vec<i64> = self.coordinates().into_iter().flatten().collect();
        let mut shape = self.row_axes();
        shape.push(2);
        self.tensor(HostData::I64(values), shape)
    }
}
