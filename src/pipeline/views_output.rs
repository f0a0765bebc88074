//! The output stages of a pipeline of views ([`crate::PipelineBuilder::views`]). On a CUDA device
//! the lanes working ahead of the batches (the CPU lane, and the GPU decode lane beside it)
//! write each image's views as one record ([`ViewLayout::record_bytes`]) into its place: the
//! CPU lane's records are uploaded from the page-locked staging ring, the GPU lane's gathered
//! on the device, then the device unpacks them into the groups' blocks ([`ViewUnpack`]), runs
//! the colour calls and normalizes each group as `count * n` images. On the CPU device the CPU
//! lane writes each view straight into its group's block (`[count, batch, size, size, 3]`),
//! the blocks are packed to the batch's images and normalized by the CPU rendition. Each group
//! becomes one tensor `[count, n, 3, size, size]` (NCHW) or `[count, n, size, size, 3]` (NHWC).

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use rayon::prelude::*;

use super::output::{
    staged_ranges, BatchAugment, BatchImages, DeviceStage, DeviceWrites, Finished, OutputStage,
};
use crate::cpu::{LaneViews, NormalizeTable, Staging};
use crate::cuda::{Gpu, Normalizer, StagingRing, TouchedSlots, ViewColourKernel, ViewUnpack};
use crate::error::{Error, Result};
use crate::options::{Device, Layout, NormalizeSpec, Options};
use crate::tensor::{HostData, HostPool, HostTensor, Tensor};
use crate::views::{GroupBlock, ViewColour, ViewDraw, ViewLayout, ViewOp, Views};

/// Where the views' colour calls run on `device`: the one place that chooses. On a CUDA
/// device the lane cuts, resizes and flips, and [`CudaViewsOutput::finish`] runs the colour
/// kernel ([`ViewColourKernel`], the same bytes as the CPU's calls) on the uploaded `u8` views
/// before the normalize: the blur alone is most of a view's CPU time. The CPU device applies
/// them on the CPU lane.
fn view_colour(device: Device) -> ViewColour {
    match device {
        Device::Cuda(_) => ViewColour::Device,
        Device::Cpu => ViewColour::Cpu,
    }
}

/// The colour calls of group `group`'s views of a batch, in the group's block order: view `j`
/// of every image, for `j` in `0..count` (`calls` is cleared and filled).
fn group_calls<'a>(
    view_draws: &'a [Vec<ViewDraw>],
    group: usize,
    count: usize,
    calls: &mut Vec<&'a [ViewOp]>,
) -> Result<()> {
    calls.clear();
    for j in 0..count {
        for (i, draws) in view_draws.iter().enumerate() {
            let draw = draws
                .iter()
                .filter(|d| d.group == group)
                .nth(j)
                .ok_or_else(|| {
                    Error::Mismatch(format!(
                        "image {i} of the batch has no view {j} of group {group}"
                    ))
                })?;
            calls.push(&draw.ops);
        }
    }
    Ok(())
}

/// The views of a pipeline on `device` as its CPU lane makes them, for batches of up to
/// `batch` images.
pub(super) fn lane_views(
    views: Option<&Arc<Views>>,
    batch: usize,
    device: Device,
) -> Option<Arc<LaneViews>> {
    views.map(|views| {
        Arc::new(LaneViews {
            layout: ViewLayout::new(views, batch),
            views: views.clone(),
            colour: view_colour(device),
        })
    })
}

/// Refuses `views` that are not whole, and options for one image each beside them.
pub(super) fn check_views(views: &Views, options: &Options) -> Result<()> {
    views.validate()?;
    if options.patches.is_some() {
        return Err(Error::invalid(
            "views",
            "views and patch sequences are two outputs: choose one",
        ));
    }
    if options.augment.is_on() {
        return Err(Error::invalid(
            "views",
            "the augmentations are for one image each: the views bring their own colour calls",
        ));
    }
    Ok(())
}

/// The shape of group `g`'s tensor for a batch of `n` images.
fn group_shape(g: &GroupBlock, n: usize, layout: Layout) -> Vec<usize> {
    match layout {
        Layout::Nchw => vec![g.count, n, 3, g.size, g.size],
        Layout::Nhwc => vec![g.count, n, g.size, g.size, 3],
    }
}

/// The tensor a batch's `images` holds beside its views: empty, of the batch's layout.
fn no_images(layout: Layout) -> Tensor {
    Tensor::Host(HostTensor::from_parts(
        HostData::F32(Vec::new()),
        layout.shape(0, 0, 0),
        layout,
    ))
}

/// Refuses images a lane wrote on the device: views for the CPU come from the CPU lane alone.
fn check_cpu_only(on_device: &dyn DeviceWrites) -> Result<()> {
    match on_device.places().is_empty() {
        true => Ok(()),
        false => Err(Error::Mismatch(
            "views for the CPU are made by the CPU lane alone, yet images came from the device"
                .into(),
        )),
    }
}

/// Views on a CUDA device.
pub(super) struct CudaViewsOutput {
    gpu: Gpu,
    ring: StagingRing,
    normalizer: Normalizer,
    spec: NormalizeSpec,
    layout: ViewLayout,
    unpack: ViewUnpack,
    /// The groups' blocks the records are unpacked into.
    blocks: CudaSlice<u8>,
    /// The colour calls' kernel: on a CUDA device the lanes leave the calls to it
    /// ([`ViewColour::Device`]), on the uploaded `u8` views, before the normalize.
    colour: ViewColourKernel,
}

impl CudaViewsOutput {
    /// The stage on `gpu`, staging in the page-locked `staging` (slots of `layout.batch`
    /// records).
    pub fn open(
        gpu: Gpu,
        staging: TouchedSlots,
        layout: ViewLayout,
        spec: NormalizeSpec,
    ) -> Result<CudaViewsOutput> {
        let normalizer = Normalizer::new(gpu.stream())?;
        let colour = ViewColourKernel::new(gpu.stream())?;
        let ring = StagingRing::new(gpu.stream(), staging)?;
        let unpack = ViewUnpack::new(gpu.stream(), &layout)?;
        let blocks = gpu
            .stream()
            .alloc_zeros::<u8>(layout.slot_bytes().max(1))
            .map_err(|e| Error::cuda("allocating the views' blocks", e))?;
        Ok(CudaViewsOutput {
            gpu,
            ring,
            normalizer,
            spec,
            layout,
            unpack,
            blocks,
            colour,
        })
    }
}

impl DeviceStage for CudaViewsOutput {
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
        let layout = &self.layout;
        // The staged records go up, the others are written into their places on the device;
        // then the records are unpacked into the groups' blocks.
        let staged = staged_ranges(&on_device.places(), n, layout.record_bytes);
        let records = self.ring.upload(slot, &staged)?;
        let stream = self.gpu.stream();
        let uploaded =
            staged.iter().map(|r| r.len()).sum::<usize>() + on_device.write(stream, records)?;
        self.unpack.run(stream, records, &mut self.blocks, n)?;
        let input = &mut self.blocks;
        let ranges: Vec<_> = (0..layout.groups.len())
            .map(|g| layout.packed(g, n))
            .collect();
        if images.view_draws.len() != n {
            return Err(Error::Mismatch(format!(
                "{} images' view draws for a batch of {n}",
                images.view_draws.len()
            )));
        }
        let mut calls = Vec::new();
        for (g, (group, range)) in layout.groups.iter().zip(&ranges).enumerate() {
            group_calls(images.view_draws, g, group.count, &mut calls)?;
            let mut part = input.slice_mut(range.clone());
            self.colour
                .apply(&mut part, group.size, group.size, &calls)?;
        }
        let mut views = Vec::with_capacity(layout.groups.len());
        for (g, range) in layout.groups.iter().zip(&ranges) {
            let part = input.slice(range.clone());
            let tensor =
                self.normalizer
                    .run_view(stream, &part, g.count * n, g.size, g.size, &self.spec)?;
            let shape = group_shape(g, n, self.spec.layout);
            views.push(Tensor::Device(tensor.reshaped(shape)?));
        }
        Ok(Finished {
            images: no_images(self.spec.layout),
            uploaded,
            soft_labels: None,
            patches: None,
            views: Some(views),
        })
    }
}

/// Views in host memory.
pub(super) struct HostViewsOutput {
    pixels: Vec<u8>,
    table: NormalizeTable,
    /// One pool a group (each group's tensors are of one size).
    pools: Vec<Arc<HostPool>>,
    spec: NormalizeSpec,
    layout: ViewLayout,
    threads: rayon::ThreadPool,
}

impl HostViewsOutput {
    /// The stage for batches laid out as `layout`, normalized on `threads` threads (0: one per
    /// core).
    pub fn new(layout: ViewLayout, spec: NormalizeSpec, threads: usize) -> Result<HostViewsOutput> {
        let slot_bytes = layout.slot_bytes();
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
            .thread_name(|i| format!("gpufeed-views-{i}"))
            .build()
            .map_err(|e| Error::invalid("threads", format!("cannot start the threads: {e}")))?;
        let pools = layout
            .groups
            .iter()
            .map(|g| {
                let pool = Arc::new(HostPool::default());
                let len = g.count * layout.batch * g.view_bytes();
                pool.warm(spec.dtype, len);
                pool
            })
            .collect();
        Ok(HostViewsOutput {
            pixels,
            table: NormalizeTable::new(&spec),
            pools,
            spec,
            layout,
            threads,
        })
    }
}

impl OutputStage for HostViewsOutput {
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
        _images: &BatchImages<'_>,
    ) -> Result<Finished> {
        check_cpu_only(on_device)?;
        let layout = &self.layout;
        layout.pack(&mut self.pixels, n);
        let mut views = Vec::with_capacity(layout.groups.len());
        for (k, (g, pool)) in layout.groups.iter().zip(&self.pools).enumerate() {
            let view = g.view_bytes();
            let packed = &self.pixels[layout.packed(k, n)];
            let mut data = pool.take(self.spec.dtype, packed.len());
            let table = &self.table;
            if view > 0 {
                self.threads.install(|| {
                    data.image_slots(view)
                        .into_par_iter()
                        .zip(packed.par_chunks(view))
                        .for_each(|(slot, px)| table.write_image(px, slot));
                });
            }
            let shape = group_shape(g, n, self.spec.layout);
            let tensor = HostTensor::pooled(data, shape, self.spec.layout, pool);
            views.push(Tensor::Host(tensor));
        }
        Ok(Finished {
            images: no_images(self.spec.layout),
            uploaded: 0,
            soft_labels: None,
            patches: None,
            views: Some(views),
        })
    }
}
