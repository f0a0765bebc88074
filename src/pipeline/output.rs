//! The seam between the decode lanes and the batch: an [`OutputStage`] lends the staging the
//! lanes write each image into, and turns a filled staging into the batch's tensor. Two
//! siblings: [`CudaOutput`] (pinned staging, u8 upload and the normalize kernel on the
//! pipeline's stream) and [`HostOutput`] (the CPU device: each image normalized by the thread
//! that prepared it, into memory reused across batches). Neither knows who decoded an image:
//! images not in the staging reach a batch through [`DeviceWrites`]. A patch-sequence output has
//! stages of its own beside them ([`super::patch_output`]).

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use super::patch_output::{CudaPatchOutput, HostPatchOutput, PatchShapes};
use super::views_output::{CudaViewsOutput, HostViewsOutput};
use crate::augment::{augment_batch, mix_normalize, soft_labels, AugmentPlan};
use crate::batch::BatchPatches;
use crate::cpu::{LaneViews, NormalizeTable, Staging};
use crate::cuda::{DeviceAugmenter, Gpu, Normalizer, SlotsComing, StagingRing, TouchedSlots};
use crate::error::{Error, Result};
use crate::geometry::{CropDraw, Geometry};
use crate::options::{Layout, NormalizeSpec, Options};
use crate::tensor::{HostData, HostPool, HostTensor, Tensor};

/// Staging slots of a CUDA pipeline: the CPU fills one while the previous one uploads.
const STAGING_SLOTS: usize = 2;

/// What becomes of a batch once its images are staged.
pub(crate) trait OutputStage: Send {
    /// The device the batches land on, in words (by default the CPU's: host memory).
    fn describe(&self) -> String {
        "CPU".into()
    }

    /// Page-locked host memory held (by default none).
    fn pinned_bytes(&self) -> usize {
        0
    }

    /// The CUDA stream the batches are written on (by default none: the CPU device).
    fn cuda_stream(&self) -> Option<Arc<CudaStream>> {
        None
    }

    /// Staging slots in rotation (by default one).
    fn slots(&self) -> usize {
        1
    }

    /// Slot `slot` for the lanes to fill, once nothing reads it any more.
    fn staging(&mut self, slot: usize) -> Result<Staging<'_>>;

    /// The first `n` images of slot `slot` as the batch's tensor, augmented as `augment` says,
    /// and the bytes uploaded; the places `on_device` names are not uploaded but written on the
    /// device, after the upload and before the kernels. `images` says what the lanes drew for
    /// them.
    fn finish(
        &mut self,
        slot: usize,
        n: usize,
        on_device: &mut dyn DeviceWrites,
        augment: Option<BatchAugment<'_>>,
        images: &BatchImages<'_>,
    ) -> Result<Finished>;
}

/// An output stage on a CUDA device: its GPU and the page-locked staging ring the lanes fill,
/// from which every such stage answers [`OutputStage`]'s questions alike; it says only how a
/// batch is finished there.
pub(crate) trait DeviceStage: Send {
    /// The device and its stream.
    fn gpu(&self) -> &Gpu;

    /// The staging ring.
    fn ring(&self) -> &StagingRing;

    /// The staging ring, to fill or upload.
    fn ring_mut(&mut self) -> &mut StagingRing;

    /// [`OutputStage::finish`] on the device.
    fn finish_on_device(
        &mut self,
        slot: usize,
        n: usize,
        on_device: &mut dyn DeviceWrites,
        augment: Option<BatchAugment<'_>>,
        images: &BatchImages<'_>,
    ) -> Result<Finished>;
}

impl<T: DeviceStage> OutputStage for T {
    fn describe(&self) -> String {
        self.gpu().describe()
    }

    fn pinned_bytes(&self) -> usize {
        self.ring().pinned_bytes()
    }

    fn cuda_stream(&self) -> Option<Arc<CudaStream>> {
        Some(self.gpu().stream().clone())
    }

    fn slots(&self) -> usize {
        self.ring().len()
    }

    fn staging(&mut self, slot: usize) -> Result<Staging<'_>> {
        Ok(Staging {
            pixels: self.ring_mut().slot_mut(slot)?,
            normalized: None,
        })
    }

    fn finish(
        &mut self,
        slot: usize,
        n: usize,
        on_device: &mut dyn DeviceWrites,
        augment: Option<BatchAugment<'_>>,
        images: &BatchImages<'_>,
    ) -> Result<Finished> {
        self.finish_on_device(slot, n, on_device, augment, images)
    }
}

/// What the output stage learns of a batch's images besides their pixels.
pub(crate) struct BatchImages<'a> {
    /// What each image's random transforms drew (a patch sequence's box and flip, always).
    pub draws: &'a [Option<CropDraw>],
    /// The sequence length the batch is planned for (timm's patch sequences; 0 otherwise).
    pub seq_len: u32,
    /// What each image's views drew, in a pipeline of views (empty otherwise).
    pub view_draws: &'a [Vec<crate::views::ViewDraw>],
}

/// The augmentations of one batch, for the output stage to carry out on its pixels.
pub(crate) struct BatchAugment<'a> {
    /// What each row and the batch drew.
    pub plan: &'a AugmentPlan,
    /// The rows' labels and the class count, for the soft labels of a mixed batch.
    pub labels: Option<(&'a [u32], usize)>,
}

/// A finished batch's tensors.
pub(crate) struct Finished {
    /// The images.
    pub images: Tensor,
    /// Bytes uploaded.
    pub uploaded: usize,
    /// The soft labels of a mixed batch.
    pub soft_labels: Option<Tensor>,
    /// A patch sequence's description beside its tokens (`images`).
    pub patches: Option<BatchPatches>,
    /// A pipeline of views' tensors, one a group (`images` is then empty).
    pub views: Option<Vec<Tensor>>,
}

/// Images of a batch that are not in its staging (on the device already, or in page-locked
/// memory of their own): written into their places of the batch's u8 buffer on the pipeline's
/// stream, between the upload of the staged ones and the kernel.
pub(crate) trait DeviceWrites {
    /// The places written, in increasing order.
    fn places(&self) -> Vec<usize>;

    /// Queues the writes on `stream` into `input` (u8 RGB HWC images, one after another);
    /// returns the bytes they upload from the host.
    fn write(&mut self, stream: &Arc<CudaStream>, input: &mut CudaSlice<u8>) -> Result<usize>;
}

/// The output stage `options` ask for, sized, before anything is allocated: [`OutputPlan::new`]
/// refuses up front batches the host cannot hold, [`OutputPlan::check_device`] those the device
/// cannot hold beside what the lanes take there (the error names the option to lower), and
/// [`OutputPlan::open`] allocates.
pub(crate) struct OutputPlan {
    slot_bytes: usize,
    /// A patch-sequence output's shapes, in place of the images' normalize.
    patches: Option<PatchShapes>,
    /// A pipeline of views: their layout in the staging and where their colour calls run.
    views: Option<LaneViews>,
    /// A CUDA device's staging slots, their pages faulted in while the device opens (`None`
    /// where their thread could not start: they are touched when it is open).
    staging: Option<SlotsComing>,
    dims: (usize, usize),
    spec: NormalizeSpec,
    sizes: BatchSizes,
    /// What the lanes and the augmentations' scratch take on the device.
    device_bytes: u128,
}

impl OutputPlan {
    /// The plan for `options`' batches of images of `geometry` (or of `views` of each image),
    /// beside `lanes_bytes` the lanes take on the device; with MixUp or CutMix, soft labels
    /// over `classes` classes a row.
    pub fn new(
        options: &Options,
        geometry: &Geometry,
        lanes_bytes: u128,
        classes: usize,
        views: Option<&LaneViews>,
    ) -> Result<OutputPlan> {
        let image_bytes = match views {
            Some(views) => views.layout.image_bytes(),
            None => geometry.image_bytes(),
        };
        let batch_size = options.batching.batch_size;
        let (height, width) = options.resize.output_size();
        let spec = options.output.spec();
        let patches = options
            .patches
            .map(|p| PatchShapes::new(*geometry, p, spec.dtype));
        let rows = batch_size as u128;
        let on_device = options.runtime.device != crate::Device::Cpu;
        let staging = match views {
            // On a CUDA device the lanes working ahead write one record of views a place; the
            // device unpacks them into the groups' blocks (the scratch below).
            Some(views) if on_device => rows * views.layout.record_bytes as u128,
            // The groups' blocks, aligned.
            Some(views) => views.layout.slot_bytes() as u128,
            None => rows * image_bytes as u128,
        };
        let output_elements = match &patches {
            Some(shapes) => shapes.max_elements(batch_size),
            None => staging,
        };
        let sizes = BatchSizes {
            rows,
            height,
            width,
            patch_budget: options
                .patches
                .map(|p| (p.max_image_pixels(), p.budget_option())),
            views: views.map_or(0, |v| v.views.count()),
            staging,
            output: output_elements * spec.dtype.size_of() as u128,
            labels: rows * classes as u128 * 4,
            classes,
            // The prefetch thread holds two batches at any depth (see `RuntimeOptions::prefetch`).
            prefetch: options.runtime.prefetch.max(2) as u128,
        };
        let slot_bytes = usize::try_from(sizes.staging)
            .map_err(|_| sizes.too_large(sizes.staging, None, "memory"))?;
        let (host_bytes, memory) = match options.runtime.device {
            // The staging slot, and the batches ahead, the one in use and the one being filled,
            // with their soft labels.
            crate::Device::Cpu => (
                sizes.staging + (sizes.prefetch + 2) * (sizes.output + sizes.labels),
                "host memory",
            ),
            crate::Device::Cuda(_) => (STAGING_SLOTS as u128 * sizes.staging, "pinned host memory"),
        };
        sizes.fits(host_bytes, available_host_memory(), memory)?;
        let scratch = match (options.augment.is_on(), views) {
            (true, _) => DeviceAugmenter::device_bytes(slot_bytes),
            (false, Some(views)) if on_device => views.layout.slot_bytes() as u128,
            (false, _) => 0,
        };
        let staging = match options.runtime.device {
            crate::Device::Cuda(_) => TouchedSlots::touch_beside(STAGING_SLOTS, slot_bytes),
            crate::Device::Cpu => None,
        };
        Ok(OutputPlan {
            slot_bytes,
            patches,
            views: views.cloned(),
            staging,
            dims: (height as usize, width as usize),
            spec,
            sizes,
            device_bytes: lanes_bytes + scratch,
        })
    }

    /// Refuses batches `gpu` cannot hold now beside what the lanes take there: call it before the
    /// lanes allocate on the device.
    pub fn check_device(&self, gpu: &Gpu) -> Result<()> {
        // The device holds the u8 input, what the lanes take there (the GPU decode lane's ring
        // and buffers), and the batches ahead plus the one in use.
        let sizes = &self.sizes;
        let (free, _) = gpu.memory()?;
        let one = sizes.staging + sizes.output + sizes.labels + self.device_bytes;
        if one > free as u128 && sizes.labels * 2 <= free as u128 {
            return Err(Error::OutOfDeviceMemory {
                context: "sizing the batch",
                needed: Some((one.min(u64::MAX as u128) as u64, free as u64)),
            });
        }
        let all = sizes.staging
            + self.device_bytes
            + (sizes.prefetch + 1) * (sizes.output + sizes.labels);
        sizes.fits(all, Some(free as u64), "GPU memory")
    }

    /// Opens the output stage: on `gpu`, the pipeline's CUDA device (checked with
    /// [`OutputPlan::check_device`]), or on the host without one.
    pub fn open(self, options: &Options, gpu: Option<&Gpu>) -> Result<Box<dyn OutputStage>> {
        let Some(gpu) = gpu.cloned() else {
            return self.open_on_host(options);
        };
        let OutputPlan {
            slot_bytes,
            patches,
            views,
            staging,
            dims,
            spec,
            ..
        } = self;
        let touched = match staging {
            Some(mut coming) => coming.wait()?,
            None => TouchedSlots::touch(STAGING_SLOTS, slot_bytes)?,
        };
        if let Some(views) = views {
            let output = CudaViewsOutput::open(gpu, touched, views.layout, spec)?;
            return Ok(Box::new(output));
        }
        if let Some(shapes) = patches {
            return Ok(Box::new(CudaPatchOutput::open(gpu, touched, shapes)?));
        }
        let mut output = CudaOutput::open(gpu, touched, dims, spec)?;
        if options.augment.is_on() {
            output.augmenter = Some(DeviceAugmenter::new(output.gpu.stream(), slot_bytes)?);
        }
        Ok(Box::new(output))
    }

    /// The output stage on the host: batches for the CPU.
    fn open_on_host(self, options: &Options) -> Result<Box<dyn OutputStage>> {
        let OutputPlan {
            slot_bytes,
            patches,
            views,
            dims,
            spec,
            ..
        } = self;
        if let Some(views) = views {
            let runtime = &options.runtime;
            let output = HostViewsOutput::new(views.layout, spec, runtime.threads)?;
            return Ok(Box::new(output));
        }
        if let Some(shapes) = patches {
            let threads = options.runtime.threads;
            return Ok(Box::new(HostPatchOutput::new(slot_bytes, threads, shapes)?));
        }
        let mut output = HostOutput::new(slot_bytes, dims, spec)?;
        if options.augment.is_on() {
            output.augment = Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(options.runtime.threads)
                    .thread_name(|i| format!("gpufeed-augment-{i}"))
                    .build()
                    .map_err(|e| {
                        Error::invalid("threads", format!("cannot start the threads: {e}"))
                    })?,
            );
        }
        output.pool.warm(spec.dtype, slot_bytes);
        Ok(Box::new(output))
    }
}

/// Bytes of one batch at each step, and how many batches wait ahead.
struct BatchSizes {
    rows: u128,
    height: u32,
    width: u32,
    /// For patch sequences: the most pixels an image may have under the patch settings, which
    /// the batches are sized for (`height` x `width` is then not the images' size), and the
    /// preset's option that sets it.
    patch_budget: Option<(u64, &'static str)>,
    /// Views of each image (0 for one output image each).
    views: usize,
    staging: u128,
    output: u128,
    /// The soft labels of a mixed batch (0 without mixing), over `classes` classes.
    labels: u128,
    classes: usize,
    prefetch: u128,
}

impl BatchSizes {
    /// Refuses `needed` bytes where only `available` are, before anything is allocated,
    /// naming the option to lower: see [`BatchSizes::too_large`].
    fn fits(&self, needed: u128, available: Option<u64>, memory: &str) -> Result<()> {
        match available {
            Some(available) if needed > available as u128 => {
                Err(self.too_large(needed, Some(available), memory))
            }
            _ => Ok(()),
        }
    }

    /// The error for batches that need `needed` bytes of `memory` where `available` are: naming
    /// the soft labels' class count when they take most of it, the output size when a batch of
    /// one image would not fit, the prefetch depth when two batches would, else the batch size.
    fn too_large(&self, needed: u128, available: Option<u64>, memory: &str) -> Error {
        let gb = |b: u128| b as f64 / 1e9;
        let available = available.map_or(u128::MAX, u128::from);
        let rows = self.rows.max(1);
        let one_batch = self.staging + self.output + self.labels;
        let one_image = (self.staging + self.output) / rows;
        let have = match available {
            u128::MAX => "more than this machine can address".to_string(),
            a => format!("{:.2} GB is available", gb(a)),
        };
        let (option, what) = if self.labels * 2 > one_batch && self.labels * 2 > available / 4 {
            (
                "num_classes",
                format!(
                    "soft labels over {} classes take {:.2} GB a batch of {rows} (4 bytes a \
                     class a row)",
                    self.classes,
                    gb(self.labels)
                ),
            )
        } else if one_image * (self.prefetch + 2) * 16 > available {
            // Fewer than 16 such images fit: the size (or the views) is what to change.
            match (self.views, self.patch_budget) {
                (0, Some((pixels, option))) => (
                    option,
                    format!(
                        "one image of up to {pixels} pixels takes {:.2} GB",
                        gb(one_image)
                    ),
                ),
                (0, None) => (
                    "resize",
                    format!(
                        "one image of {}x{} (height x width) takes {:.2} GB",
                        self.height,
                        self.width,
                        gb(one_image)
                    ),
                ),
                (views, _) => (
                    "views",
                    format!("one image's {views} views take {:.2} GB", gb(one_image)),
                ),
            }
        } else {
            let images = match (self.views, self.patch_budget) {
                (0, Some((pixels, option))) => {
                    format!("images of up to {pixels} pixels (or lower {option})")
                }
                (0, None) => format!("images of {}x{} (height x width)", self.height, self.width),
                (views, _) => format!("images of {views} views each"),
            };
            let what = format!("a batch of {rows} {images} takes {:.2} GB", gb(one_batch));
            // Two batches fit: fewer in flight is enough; else the batch itself is too large.
            let option = if one_batch * 2 <= available {
                "prefetch"
            } else {
                "batch_size"
            };
            (option, what)
        };
        Error::invalid(
            option,
            format!(
                "{what}; the batches need {:.2} GB of {memory}, {have}",
                gb(needed)
            ),
        )
    }
}

/// Memory the system can give without swapping (`MemAvailable`), where known.
fn available_host_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb.saturating_mul(1024))
}

/// The bytes of a batch's staging to upload: the runs of places `0..n` (of `image` bytes each)
/// between the places `written` on the device (in increasing order), which are not staged.
pub(super) fn staged_ranges(written: &[usize], n: usize, image: usize) -> Vec<Range<usize>> {
    let mut ranges = Vec::with_capacity(written.len() + 1);
    let mut start = 0;
    for &place in written.iter().chain(std::iter::once(&n)) {
        if place > start {
            ranges.push(start * image..place * image);
        }
        start = place + 1;
    }
    ranges
}

/// Batches on a CUDA device.
struct CudaOutput {
    gpu: Gpu,
    ring: StagingRing,
    normalizer: Normalizer,
    spec: NormalizeSpec,
    dims: (usize, usize),
    /// The augmentation kernels, when the pipeline augments.
    augmenter: Option<DeviceAugmenter>,
}

impl CudaOutput {
    fn open(
        gpu: Gpu,
        staging: TouchedSlots,
        dims: (usize, usize),
        spec: NormalizeSpec,
    ) -> Result<CudaOutput> {
        let normalizer = Normalizer::new(gpu.stream())?;
        let ring = StagingRing::new(gpu.stream(), staging)?;
        Ok(CudaOutput {
            gpu,
            ring,
            normalizer,
            spec,
            dims,
            augmenter: None,
        })
    }
}

impl DeviceStage for CudaOutput {
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
        augment: Option<BatchAugment<'_>>,
        _images: &BatchImages<'_>,
    ) -> Result<Finished> {
        let (height, width) = self.dims;
        let ranges = staged_ranges(&on_device.places(), n, height * width * 3);
        let staged: usize = ranges.iter().map(|r| r.len()).sum();
        let input = self.ring.upload(slot, &ranges)?;
        let uploaded = staged + on_device.write(self.gpu.stream(), input)?;
        let stream = self.gpu.stream();
        let mut soft_labels = None;
        let tensor = match (augment, self.augmenter.as_mut()) {
            (Some(augment), Some(augmenter)) => {
                let plan = augment.plan;
                augmenter.augment(stream, input, n, height, width, plan)?;
                match &plan.mix {
                    Some(mix) => {
                        if let Some((labels, classes)) = augment.labels {
                            let soft = augmenter.soft_labels(stream, labels, classes, mix)?;
                            soft_labels = Some(Tensor::Device(soft));
                        }
                        augmenter.mix_normalize(
                            stream,
                            input,
                            n,
                            (height, width),
                            &self.spec,
                            mix,
                        )?
                    }
                    None => self
                        .normalizer
                        .run(stream, input, n, height, width, &self.spec)?,
                }
            }
            _ => self
                .normalizer
                .run(stream, input, n, height, width, &self.spec)?,
        };
        Ok(Finished {
            images: Tensor::Device(tensor),
            uploaded,
            soft_labels,
            patches: None,
            views: None,
        })
    }
}

/// Batches in host memory.
struct HostOutput {
    pixels: Vec<u8>,
    table: NormalizeTable,
    pool: Arc<HostPool>,
    /// The output being filled, between `staging` and `finish`.
    current: Option<HostData>,
    spec: NormalizeSpec,
    dims: (usize, usize),
    /// With augmentations, the threads that augment and normalize a whole batch once it is
    /// staged (each image's own thread cannot: MixUp and CutMix read other images).
    augment: Option<rayon::ThreadPool>,
}

impl HostOutput {
    fn new(slot_bytes: usize, dims: (usize, usize), spec: NormalizeSpec) -> Result<HostOutput> {
        let mut pixels = Vec::new();
        pixels.try_reserve_exact(slot_bytes).map_err(|_| {
            Error::invalid(
                "batch_size",
                format!("cannot allocate {slot_bytes} bytes of staging"),
            )
        })?;
        pixels.resize(slot_bytes, 0);
        Ok(HostOutput {
            pixels,
            table: NormalizeTable::new(&spec),
            pool: Arc::new(HostPool::default()),
            current: None,
            spec,
            dims,
            augment: None,
        })
    }
}

impl OutputStage for HostOutput {
    fn staging(&mut self, _slot: usize) -> Result<Staging<'_>> {
        if self.augment.is_some() {
            // Normalized in `finish`, once the batch is whole.
            return Ok(Staging {
                pixels: &mut self.pixels,
                normalized: None,
            });
        }
        let data = match self.current.take() {
            // A batch that yielded nothing (only bad images) left its output unused.
            Some(unused) => unused,
            None => self.pool.take(self.spec.dtype, self.pixels.len()),
        };
        let current = self.current.insert(data);
        Ok(Staging {
            pixels: &mut self.pixels,
            normalized: Some((current, &self.table)),
        })
    }

    fn finish(
        &mut self,
        _slot: usize,
        n: usize,
        on_device: &mut dyn DeviceWrites,
        augment: Option<BatchAugment<'_>>,
        _images: &BatchImages<'_>,
    ) -> Result<Finished> {
        if !on_device.places().is_empty() {
            return Err(Error::Mismatch(
                "images on a CUDA device for a batch on the CPU".into(),
            ));
        }
        let (height, width) = self.dims;
        if let Some(threads) = &self.augment {
            let image = height * width * 3;
            let mut data = self.pool.take(self.spec.dtype, self.pixels.len());
            let (pixels, spec, table) = (&mut self.pixels, &self.spec, &self.table);
            let mut soft = None;
            threads.install(|| {
                let plan = augment.as_ref().map(|a| a.plan);
                if let Some(plan) = plan {
                    augment_batch(pixels, height, width, plan);
                }
                match plan.and_then(|p| p.mix.as_ref()) {
                    Some(mix) => {
                        if let Some((labels, classes)) = augment.as_ref().and_then(|a| a.labels) {
                            let values = soft_labels(labels, classes, mix.lam());
                            soft = HostTensor::new(
                                HostData::F32(values),
                                [n, classes, 1, 1],
                                Layout::Nchw,
                            );
                        }
                        mix_normalize(pixels, n, height, width, spec, mix, &mut data);
                    }
                    None if image > 0 => {
                        use rayon::prelude::*;
                        data.image_slots(image)
                            .into_par_iter()
                            .zip(pixels[..n * image].par_chunks(image))
                            .for_each(|(slot, px)| table.write_image(px, slot));
                    }
                    None => {}
                }
            });
            let shape = self.spec.layout.shape(n, height, width);
            let tensor = HostTensor::pooled(data, shape, self.spec.layout, &self.pool);
            return Ok(Finished {
                images: Tensor::Host(tensor),
                uploaded: 0,
                soft_labels: soft.map(Tensor::Host),
                patches: None,
                views: None,
            });
        }
        let data = self
            .current
            .take()
            .ok_or_else(|| Error::Worker("a batch finished before it was staged".into()))?;
        let shape = self.spec.layout.shape(n, height, width);
        let tensor = HostTensor::pooled(data, shape, self.spec.layout, &self.pool);
        Ok(Finished {
            images: Tensor::Host(tensor),
            uploaded: 0,
            soft_labels: None,
            patches: None,
            views: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Qwen3-VL's default budget at batch 256: 64.42 GB of `f32` patches a batch.
    fn qwen3_batches() -> BatchSizes {
        BatchSizes {
            rows: 256,
            height: 224,
            width: 224,
            patch_budget: Some((16_777_216, "max_pixels")),
            views: 0,
            staging: 256 * 16_777_216 * 3,
            output: 256 * 16_777_216 * 3 * 4,
            labels: 0,
            classes: 0,
            prefetch: 2,
        }
    }

    fn refusal(available: u64) -> (String, String) {
        match qwen3_batches().too_large(u128::MAX, Some(available), "host memory") {
            Error::InvalidOption { option, reason } => (option.to_string(), reason),
            e => panic!("not an option's error: {e}"),
        }
    }

    #[test]
    fn batches_too_large_name_the_prefetch_depth_where_two_fit_else_the_batch_size() {
        let batch = "a batch of 256 images of up to 16777216 pixels (or lower max_pixels) takes \
                     64.42 GB";
        let (option, reason) = refusal(134_000_000_000);
        assert_eq!(option, "prefetch");
        assert!(reason.starts_with(batch), "{reason}");
        let (option, reason) = refusal(24_000_000_000);
        assert_eq!(option, "batch_size");
        assert!(reason.starts_with(batch), "{reason}");
        // Fewer than 16 images fit: the budget that sizes each image.
        let (option, reason) = refusal(1_000_000_000);
        assert_eq!(option, "max_pixels");
        assert!(
            reason.starts_with("one image of up to 16777216 pixels"),
            "{reason}"
        );
    }
}
