//! The output stage of a patch-sequence pipeline: a batch's staging is an arena with a place per
//! image of the preset's bound ([`Patches::max_image_pixels`]), each image resized into the
//! top-left of its place, rows packed at its own width; the stage turns the filled arena into
//! the token tensor. On a CUDA device only the bytes each image holds go up (with those the lanes
//! wrote on the device already), and `kernels/patches.cu` lays the tokens out in one launch; on
//! the CPU the same tokens come from the CPU rendition, bit for bit. Each image's plan (its
//! size and grid) follows from what its lane drew ([`Geometry::patch_plan`]), so neither lane
//! reports sizes of its own.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::output::{BatchAugment, BatchImages, DeviceStage, DeviceWrites, Finished, OutputStage};
use crate::batch::BatchPatches;
use crate::cpu::{Staging, TokenWriter};
use crate::cuda::{Gpu, PatchKernel, PlacedImage, StagingRing, TouchedSlots};
use crate::error::{Error, Result};
use crate::geometry::Geometry;
use crate::options::{DType, Layout};
use crate::patches::{BatchLayout, PatchPlan, Patches};
use crate::tensor::{DeviceTensor, HostPool, HostTensor, Tensor};

/// How a batch's images become its tokens: the preset, the arena's place per image and the
/// element type.
pub(crate) struct PatchShapes {
    geometry: Geometry,
    patches: Patches,
    /// Bytes of an image's place in the arena.
    stride: usize,
    dtype: DType,
}

/// A batch's plans and layout, and its token tensor's shape.
struct Planned {
    plans: Vec<PatchPlan>,
    layout: BatchLayout,
    shape: Vec<usize>,
    seq_len: Option<u32>,
}

impl PatchShapes {
    /// The shapes of `patches`' batches under `geometry` (the pipeline's), in `dtype`.
    pub fn new(geometry: Geometry, patches: Patches, dtype: DType) -> PatchShapes {
        PatchShapes {
            stride: geometry.image_bytes(),
            geometry,
            patches,
            dtype,
        }
    }

    /// The most elements one batch of `images` images has: every image at the preset's bound
    /// (or padded to its longest length).
    pub fn max_elements(&self, images: usize) -> u128 {
        let p = u128::from(self.patches.patch_size);
        let tokens = u128::from(self.patches.max_image_pixels()) / (p * p).max(1);
        let padded = match self.patches.packing(0, None) {
            crate::patches::Packing::Padded { len } => u128::from(len),
            _ => 0,
        };
        images as u128 * tokens.max(padded) * self.patches.patch_dim() as u128
    }

    /// The plans of a batch's images from their draws, its layout and its tokens' shape.
    fn plan(&self, images: &BatchImages<'_>) -> Result<Planned> {
        let geometry = self.geometry.for_sequence(images.seq_len);
        let plans = images
            .draws
            .iter()
            .enumerate()
            .map(|(place, draw)| {
                draw.as_ref()
                    .and_then(|draw| geometry.patch_plan(draw))
                    .ok_or_else(|| {
                        Error::Worker(format!("image {place} of a batch came without its plan"))
                    })
            })
            .collect::<Result<Vec<PatchPlan>>>()?;
        let seq_len = (images.seq_len > 0).then_some(images.seq_len);
        let grids: Vec<(u32, u32)> = plans.iter().map(|p| (p.grid_h, p.grid_w)).collect();
        let longest = plans.iter().map(|p| p.tokens() as u32).max().unwrap_or(0);
        let layout = BatchLayout::new(&grids, self.patches.packing(longest, seq_len))
            .map_err(|e| Error::Mismatch(e.to_string()))?;
        let dim = self.patches.patch_dim();
        let shape = match layout.packing {
            crate::patches::Packing::Padded { len } => vec![plans.len(), len as usize, dim],
            _ => vec![layout.rows, dim],
        };
        Ok(Planned {
            plans,
            layout,
            shape,
            seq_len,
        })
    }

    /// Where each image lies in the arena.
    fn placed(&self, plans: &[PatchPlan]) -> Vec<PlacedImage> {
        plans
            .iter()
            .enumerate()
            .map(|(place, plan)| PlacedImage {
                offset: place * self.stride,
                width: plan.width,
                height: plan.height,
            })
            .collect()
    }

    /// The description a batch carries beside its tokens.
    fn describe(&self, planned: Planned, stream: Option<Arc<CudaStream>>) -> BatchPatches {
        BatchPatches {
            preset: self.patches.preset,
            order: self.patches.token_order(),
            patch_dim: self.patches.patch_dim(),
            layout: planned.layout,
            plans: planned.plans,
            seq_len: planned.seq_len,
            stream,
        }
    }
}

/// Patch sequences on a CUDA device.
pub(crate) struct CudaPatchOutput {
    gpu: Gpu,
    ring: StagingRing,
    kernel: PatchKernel,
    shapes: PatchShapes,
}

impl CudaPatchOutput {
    /// The stage on `gpu`, with its staging slots `staging` (each a batch's arena).
    pub fn open(gpu: Gpu, staging: TouchedSlots, shapes: PatchShapes) -> Result<CudaPatchOutput> {
        let kernel = PatchKernel::new(gpu.stream())?;
        let ring = StagingRing::new(gpu.stream(), staging)?;
        Ok(CudaPatchOutput {
            gpu,
            ring,
            kernel,
            shapes,
        })
    }
}

impl DeviceStage for CudaPatchOutput {
    fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    fn ring(&self) -> &StagingRing {
        &self.ring
    }

    fn ring_mut(&mut self) -> &mut StagingRing {
        &mut self.ring
    }

    fn finish_on_device(
        &mut self,
        slot: usize,
        n: usize,
        on_device: &mut dyn DeviceWrites,
        _augment: Option<BatchAugment<'_>>,
        images: &BatchImages<'_>,
    ) -> Result<Finished> {
        let planned = self.shapes.plan(images)?;
        if planned.plans.len() != n {
            return Err(Error::Worker(format!(
                "{} plans for a batch of {n} images",
                planned.plans.len()
            )));
        }
        let placed = self.shapes.placed(&planned.plans);
        // The staged images' bytes go up; the others are written on the device into their
        // places.
        let written = on_device.places();
        let ranges: Vec<std::ops::Range<usize>> = placed
            .iter()
            .enumerate()
            .filter(|(place, _)| written.binary_search(place).is_err())
            .map(|(_, p)| p.offset..p.offset + p.width as usize * p.height as usize * 3)
            .collect();
        let staged: usize = ranges.iter().map(|r| r.len()).sum();
        let input = self.ring.upload(slot, &ranges)?;
        let uploaded = staged + on_device.write(self.gpu.stream(), input)?;
        let stream = self.gpu.stream();
        let mut tokens =
            DeviceTensor::alloc(stream, self.shapes.dtype, &planned.shape, Layout::Nchw)?;
        self.kernel.run_into(
            stream,
            input,
            &placed,
            &planned.layout,
            &self.shapes.patches,
            tokens.data_mut(),
        )?;
        Ok(Finished {
            images: Tensor::Device(tokens),
            uploaded,
            soft_labels: None,
            patches: Some(self.shapes.describe(planned, Some(stream.clone()))),
            views: None,
        })
    }
}

/// Patch sequences in host memory: the CPU rendition of the kernel over the filled arena.
pub(crate) struct HostPatchOutput {
    pixels: Vec<u8>,
    pool: Arc<HostPool>,
    threads: rayon::ThreadPool,
    writer: TokenWriter,
    shapes: PatchShapes,
}

impl HostPatchOutput {
    /// The stage with an arena of `slot_bytes`, its tokens written on `threads` threads (0: one
    /// per core).
    pub fn new(slot_bytes: usize, threads: usize, shapes: PatchShapes) -> Result<HostPatchOutput> {
        let mut pixels = Vec::new();
        pixels.try_reserve_exact(slot_bytes).map_err(|_| {
            Error::invalid(
                "batch_size",
                format!("cannot allocate {slot_bytes} bytes of staging"),
            )
        })?;
        pixels.resize(slot_bytes, 0);
        let threads = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("gpufeed-tokens-{i}"))
            .build()
            .map_err(|e| Error::invalid("threads", format!("cannot start the threads: {e}")))?;
        Ok(HostPatchOutput {
            pixels,
            pool: Arc::new(HostPool::default()),
            threads,
            writer: TokenWriter::new(&shapes.patches, shapes.dtype)?,
            shapes,
        })
    }
}

impl OutputStage for HostPatchOutput {
    fn staging(&mut self, _slot: usize) -> Result<Staging<'_>> {
        Ok(Staging {
            pixels: &mut self.pixels,
            normalized: None,
        })
    }

    fn finish(
        &mut self,
        _slot: usize,
        n: usize,
        on_device: &mut dyn DeviceWrites,
        _augment: Option<BatchAugment<'_>>,
        images: &BatchImages<'_>,
    ) -> Result<Finished> {
        if !on_device.places().is_empty() {
            return Err(Error::Mismatch(
                "images on a CUDA device for a batch on the CPU".into(),
            ));
        }
        let planned = self.shapes.plan(images)?;
        if planned.plans.len() != n {
            return Err(Error::Worker(format!(
                "{} plans for a batch of {n} images",
                planned.plans.len()
            )));
        }
        let stride = self.shapes.stride;
        let sources = planned
            .plans
            .iter()
            .enumerate()
            .map(|(place, plan)| {
                let bytes = plan.width as usize * plan.height as usize * 3;
                let start = place * stride;
                self.pixels
                    .get(start..start + bytes.min(stride))
                    .filter(|_| bytes <= stride)
                    .ok_or_else(|| {
                        Error::Mismatch(format!(
                            "image {place}: {}x{} pixels past its place in the staging",
                            plan.width, plan.height
                        ))
                    })
            })
            .collect::<Result<Vec<&[u8]>>>()?;
        let elements = planned.layout.rows * self.shapes.patches.patch_dim();
        let mut data = self.pool.take(self.shapes.dtype, elements);
        let writer = &self.writer;
        self.threads
            .install(|| writer.write(&sources, &planned.plans, &planned.layout, &mut data))?;
        let tokens = HostTensor::pooled(data, &planned.shape, Layout::Nchw, &self.pool);
        Ok(Finished {
            images: Tensor::Host(tokens),
            uploaded: 0,
            soft_labels: None,
            patches: Some(self.shapes.describe(planned, None)),
            views: None,
        })
    }
}
