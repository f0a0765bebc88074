//! [`PatchServer`]: a request's images to one packed patch batch, without a pipeline. Built once
//! (the preset, the device, the element type, the most images and tokens a request may bring:
//! its memory), it keeps the decode lanes (the CPU lane's threads, and on a CUDA device the GPU
//! decode lane, opened at build), the staging (page-locked on a CUDA device, two slots in turn),
//! the device input buffer and the compiled kernel, and runs each request through the same
//! stages as a pipeline's batch: each request is an epoch of the lanes ([`Lanes::for_requests`]:
//! on a CUDA device the GPU lane is offered every image and decodes the JPEGs its assisted path
//! takes into its ring, the CPU lane the others into their places in the staging), the output
//! stage uploads the bytes each image holds, gathers the GPU lane's and lays the tokens out
//! (`kernels/patches.cu`, or the CPU rendition). The tokens, bit for bit those of a pipeline
//! over the same images decoding on the CPU, come back as a [`Batch`] with the usual stream
//! rules.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::hybrid::{HybridFilled, Unstaged};
use super::lanes::Lanes;
use super::output::{BatchImages, Finished, OutputPlan, OutputStage};
use crate::batch::{Batch, DecodedBy};
use crate::cpu::{BatchRequest, Filled};
use crate::cuda::Gpu;
use crate::error::{Error, Result};
use crate::geometry::{CropDraw, Geometry};
use crate::options::{
    BatchOptions, DType, DecodeOptions, Device, OnError, Options, OutputOptions, RuntimeOptions,
};
use crate::order::EpochOrder;
use crate::patches::{Packing, Patches, Preset};
use crate::profile::Stopwatch;
use crate::source::Source;

/// One image of a request: its encoded bytes, or a file to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestImage<'a> {
    /// Encoded bytes (JPEG, PNG, WebP, ...), named `image N of the request` in errors and ids.
    Bytes(&'a [u8]),
    /// A file, named by its path.
    Path(&'a Path),
}

impl<'a> From<&'a [u8]> for RequestImage<'a> {
    fn from(bytes: &'a [u8]) -> Self {
        RequestImage::Bytes(bytes)
    }
}

impl<'a> From<&'a Vec<u8>> for RequestImage<'a> {
    fn from(bytes: &'a Vec<u8>) -> Self {
        RequestImage::Bytes(bytes)
    }
}

impl<'a> From<&'a Path> for RequestImage<'a> {
    fn from(path: &'a Path) -> Self {
        RequestImage::Path(path)
    }
}

impl<'a> From<&'a PathBuf> for RequestImage<'a> {
    fn from(path: &'a PathBuf) -> Self {
        RequestImage::Path(path)
    }
}

/// How a [`PatchServer`] is built: [`PatchServer::builder`].
#[derive(Debug, Clone, Copy)]
#[must_use]
pub struct PatchServerBuilder {
    patches: Patches,
    device: Device,
    dtype: DType,
    max_images: usize,
    max_tokens: Option<usize>,
    threads: usize,
    decode: DecodeOptions,
    on_error: OnError,
}

impl PatchServerBuilder {
    /// The device the tokens land on (default `Device::Cuda(0)`).
    pub fn device(mut self, device: Device) -> Self {
        self.device = device;
        self
    }

    /// The tokens' element type: f16 (default), bf16 or f32.
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = dtype;
        self
    }

    /// The most images one request may bring (default [`PatchServer::DEFAULT_MAX_IMAGES`]): the staging
    /// holds this many images at the preset's bound ([`Patches::max_image_pixels`]).
    pub fn max_images(mut self, images: usize) -> Self {
        self.max_images = images;
        self
    }

    /// The most tokens (padding aside) one request may bring (default: `max_images` images at
    /// the preset's bound): a request over it is refused, and the device keeps this many
    /// tokens' memory in its pool between requests.
    pub fn max_tokens(mut self, tokens: usize) -> Self {
        self.max_tokens = Some(tokens);
        self
    }

    /// CPU threads decoding and resizing (default 0: one per core).
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    /// Decode limits and choices (the pixel and file-size limits, EXIF orientation, the
    /// lanes). On a CUDA device the GPU decode lane decodes the JPEGs its assisted path takes
    /// (baseline and progressive, exactly as libjpeg-turbo does: the same bytes as the CPU
    /// threads'; never the JPEG engines, whose inverse DCT is not libjpeg-turbo's), the CPU
    /// threads the others; [`crate::Decode::Cpu`] (or an [`DecodeOptions::assisted_share`] of 0)
    /// leaves every image to the CPU threads. [`DecodeOptions::gpu_share`] and
    /// [`DecodeOptions::planned_epochs`] do not apply: the GPU lane is offered every image.
    pub fn decode(mut self, decode: DecodeOptions) -> Self {
        self.decode = decode;
        self
    }

    /// A bad image fails the whole request ([`OnError::Fail`], the default: the error names
    /// the image and why), or is left out and listed in [`Batch::skipped`] ([`OnError::Skip`]:
    /// [`Batch::indices`] then says which images of the request the rows are).
    pub fn on_error(mut self, on_error: OnError) -> Self {
        self.on_error = on_error;
        self
    }

    /// The options a pipeline with these settings would have: a batch of `max_images` images.
    fn options(&self) -> Options {
        Options::default()
            .decode(self.decode.gpu_share(None).planned_epochs(None))
            .output(OutputOptions::default().dtype(self.dtype))
            .batching(BatchOptions::default().batch_size(self.max_images))
            .runtime(
                RuntimeOptions::default()
                    .device(self.device)
                    .threads(self.threads)
                    .prefetch(1),
            )
            .patches(Some(self.patches))
    }

    /// Starts the threads, allocates the staging, opens the device and compiles the kernel; on
    /// a CUDA device opens the GPU decode lane too (its kernels and decoders, each with a
    /// call's buffers; the time it took is in [`PatchServer::decode_description`], or why it
    /// could not open).
    /// Refuses timm's training preset (its crops are drawn per batch of an epoch), a
    /// `max_images` or `max_tokens` of 0, and memory the machine does not have (naming the
    /// option to lower).
    pub fn build(self) -> Result<PatchServer> {
        if self.patches.preset == Preset::TimmNaflex {
            return Err(Error::invalid(
                "patches",
                "timm-naflex is a training preset (random crops drawn per batch): serve \
                 qwen2-vl or siglip2-naflex",
            ));
        }
        if self.max_images == 0 || self.max_tokens == Some(0) {
            return Err(Error::invalid(
                "max_images",
                "a request must be able to bring at least one image and one token",
            ));
        }
        let options = self.options();
        options.validate()?;
        let geometry = Geometry::new(&options.resize).with_patches(Some(&self.patches));
        let bound_tokens = self.bound_tokens();
        let max_tokens = self.max_tokens.unwrap_or(bound_tokens);
        let lanes_bytes = Lanes::device_bytes_for_requests(&options, &geometry, self.max_images);
        let plan = OutputPlan::new(&options, &geometry, lanes_bytes, 0, None)?;
        let gpu = match self.device {
            Device::Cuda(ordinal) => Some(Gpu::open(ordinal)?),
            Device::Cpu => None,
        };
        if let Some(gpu) = &gpu {
            plan.check_device(gpu)?;
        }
        let stopwatch = Arc::new(Stopwatch::default());
        let lanes = Lanes::for_requests(
            &options,
            geometry,
            gpu.as_ref(),
            self.max_images,
            &stopwatch,
        )?;
        let output = plan.open(&options, gpu.as_ref())?;
        if let Some(gpu) = &gpu {
            // The largest response's tokens stay in the pool between requests.
            let rows = match self.patches.packing(0, None) {
                Packing::Padded { len } if len > 0 => self.max_images.saturating_mul(len as usize),
                _ => max_tokens.min(bound_tokens),
            };
            let bytes = (rows as u64)
                .saturating_mul(self.patches.patch_dim() as u64)
                .saturating_mul(self.dtype.size_of() as u64);
            gpu.keep_pool_memory(bytes)?;
        }
        Ok(PatchServer {
            lanes,
            output,
            geometry,
            patches: self.patches,
            max_images: self.max_images,
            max_tokens,
            on_error: self.on_error,
            next_slot: 0,
            stop: AtomicBool::new(false),
        })
    }

    /// Tokens of `max_images` images at the preset's bound.
    fn bound_tokens(&self) -> usize {
        let p = u64::from(self.patches.patch_size).pow(2).max(1);
        let per_image = usize::try_from(self.patches.max_image_pixels() / p).unwrap_or(usize::MAX);
        per_image.saturating_mul(self.max_images)
    }
}

/// Serves patch sequences: each request's images (bytes or paths) to one packed batch on the
/// device, with its grids, `cu_seqlens`, masks and coordinates, as a pipeline with the same
/// preset would make them (bit for bit), but without starting a pipeline per request.
///
/// ```
/// use gpufeed::patches::Patches;
/// use gpufeed::{Device, PatchServer, RequestImage};
///
/// let mut server = PatchServer::builder(Patches::qwen2_vl())
///     .device(Device::Cpu) // Device::Cuda(0) for the GPU
///     .max_images(8)
///     .build()?;
/// let photo = std::fs::read("assets/rocket.jpg")?;
/// let batch = server.serve(&[RequestImage::Bytes(&photo)])?;
/// let tokens = batch.tokens().expect("tokens"); // [rows, 1176]
/// let grids = batch.patches().expect("patches").grids(); // image_grid_thw
/// assert_eq!(tokens.shape()[0] as i64, grids[0].iter().product::<i64>());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct PatchServer {
    lanes: Lanes,
    output: Box<dyn OutputStage>,
    geometry: Geometry,
    patches: Patches,
    max_images: usize,
    max_tokens: usize,
    on_error: OnError,
    /// The staging slot the next request fills (a CUDA device's two slots in turn: one is
    /// filled while the other's upload may still run).
    next_slot: usize,
    stop: AtomicBool,
}

impl std::fmt::Debug for PatchServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PatchServer")
            .field("preset", &self.patches.preset)
            .field("device", &self.output.describe())
            .field("decode", &self.lanes.describe())
            .field("max_images", &self.max_images)
            .field("max_tokens", &self.max_tokens)
            .finish()
    }
}

impl PatchServer {
    /// The most images a request brings unless [`PatchServerBuilder::max_images`] says
    /// otherwise.
    pub const DEFAULT_MAX_IMAGES: usize = 32;

    /// A server of `patches` (Qwen2-VL's or SigLIP2's rule with its settings), on `cuda:0` in
    /// f16 for up to [`PatchServer::DEFAULT_MAX_IMAGES`] images a request, until the builder says otherwise.
    pub fn builder(patches: Patches) -> PatchServerBuilder {
        PatchServerBuilder {
            patches,
            device: Device::Cuda(0),
            dtype: DType::F16,
            max_images: PatchServer::DEFAULT_MAX_IMAGES,
            max_tokens: None,
            threads: 0,
            decode: DecodeOptions::default(),
            on_error: OnError::Fail,
        }
    }

    /// The preset and its settings.
    pub fn patches(&self) -> &Patches {
        &self.patches
    }

    /// The most images a request may bring.
    pub fn max_images(&self) -> usize {
        self.max_images
    }

    /// The most tokens a request may bring.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// The device the tokens land on, in words.
    pub fn device_description(&self) -> String {
        self.output.describe()
    }

    /// Which lanes decode the requests' images, and why, in words: on a CUDA device the GPU
    /// decode lane (its assisted path) and the CPU threads, or the CPU threads alone and why
    /// (CPU decoding asked for, the tokens on the CPU, or the GPU lane could not open here).
    /// [`Batch::decoded_by`] says how many images of a response each lane decoded.
    pub fn decode_description(&self) -> String {
        self.lanes.describe()
    }

    /// The CUDA stream the tokens are written on (none on the CPU device): hand it, or the
    /// batch's tensors with [`crate::DeviceTensor::use_on`], to the model's stream.
    pub fn cuda_stream(&self) -> Option<Arc<CudaStream>> {
        self.output.cuda_stream()
    }

    /// One request's images as one batch: [`Batch::tokens`] (packed `[rows, patch_dim]` with
    /// `cu_seqlens`, or padded with a mask, as the preset says) and [`Batch::patches`] (grids,
    /// `cu_seqlens`, masks, spatial shapes, coordinates), on the server's device; the rows in
    /// request order. The ids are the paths, or `image N of the request` for bytes.
    ///
    /// A bad image (unreadable, not an image, refused by the preset's rule) fails the request
    /// with [`Error::Item`] naming it (`image 2 of the request: ...` or its path) and why,
    /// unless the server skips them ([`PatchServerBuilder::on_error`]); either way the server
    /// goes on serving. A request of no images, of more than `max_images`, or of more than
    /// `max_tokens` tokens is refused.
    pub fn serve(&mut self, images: &[RequestImage<'_>]) -> Result<Batch> {
        if images.is_empty() || images.len() > self.max_images {
            return Err(Error::invalid(
                "max_images",
                format!(
                    "a request of {} images: the server takes 1 to {}",
                    images.len(),
                    self.max_images
                ),
            ));
        }
        let source = Arc::new(Source::request(images.iter().enumerate().map(
            |(i, image)| match image {
                RequestImage::Bytes(bytes) => Ok((
                    format!("image {i} of the request"),
                    Arc::<[u8]>::from(*bytes),
                )),
                RequestImage::Path(path) => Err(path.to_path_buf()),
            },
        )));
        let order = Arc::new(EpochOrder::new((0..images.len()).collect()));
        // Each request is an epoch of the lanes: whatever an earlier one left is dropped. A
        // request of fewer images than the CPU lane's threads lends them the idle ones.
        self.lanes.begin(&source, &order, 0)?;
        self.lanes.lend_threads(images.len());
        let request = BatchRequest {
            order: &order,
            start: 0,
            epoch: 0,
            batch_size: images.len(),
            positions: usize::MAX,
            on_error: self.on_error,
        };
        let slot = self.next_slot % self.output.slots().max(1);
        self.next_slot = (slot + 1) % self.output.slots().max(1);
        let HybridFilled {
            filled,
            unstaged,
            decoded_by,
            ..
        } = {
            let mut staging = self.output.staging(slot)?;
            self.lanes
                .fill(&mut staging, &request, &source, &self.stop)?
                .ok_or_else(|| Error::Worker("the request was stopped".into()))?
        };
        let refused = match filled.indices.is_empty() {
            true => filled.skipped.first().cloned().map(Error::Item),
            false => None,
        };
        if let Some(refused) = refused.map_or_else(|| self.check_tokens(&filled.draws).err(), Some)
        {
            // The GPU lane's images of a request not served go back to it.
            self.lanes.discard(unstaged)?;
            return Err(refused);
        }
        self.finish(slot, filled, unstaged, decoded_by, &source)
    }

    /// The filled staging `slot` and the GPU lane's images (`unstaged`) as the request's batch.
    fn finish(
        &mut self,
        slot: usize,
        filled: Filled,
        unstaged: Unstaged,
        decoded_by: DecodedBy,
        source: &Source,
    ) -> Result<Batch> {
        let images = BatchImages {
            draws: &filled.draws,
            seq_len: 0,
            view_draws: &[],
        };
        let n = filled.indices.len();
        let mut on_device = self.lanes.device_writes(unstaged);
        let Finished {
            images,
            uploaded,
            patches,
            ..
        } = self.output.finish(slot, n, &mut on_device, None, &images)?;
        let ids = filled
            .indices
            .iter()
            .map(|&i| source.item(i).id().to_string())
            .collect();
        Ok(Batch {
            images,
            ids,
            labels: None,
            padded: vec![false; n],
            crops: filled.draws.iter().copied().collect(),
            augmentations: None,
            mix: None,
            soft_labels: None,
            skipped: filled.skipped,
            epoch: 0,
            uploaded_bytes: uploaded,
            decoded_by,
            next_position: filled.consumed,
            patches,
            indices: filled.indices,
            views: None,
            view_draws: None,
        })
    }

    /// Refuses a request whose images hold more than `max_tokens` tokens.
    fn check_tokens(&self, draws: &[Option<CropDraw>]) -> Result<()> {
        let tokens: usize = draws
            .iter()
            .filter_map(|d| d.as_ref().and_then(|d| self.geometry.patch_plan(d)))
            .map(|p| p.tokens())
            .sum();
        if tokens > self.max_tokens {
            return Err(Error::invalid(
                "max_tokens",
                format!(
                    "the request's images hold {tokens} tokens, over the server's {}",
                    self.max_tokens
                ),
            ));
        }
        Ok(())
    }
}
