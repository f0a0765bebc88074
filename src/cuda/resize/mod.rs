//! `kernels/resize.cu`: the batched Pillow resize, compiled through the device's module cache
//! ([`crate::cuda::Gpu::module`]) and launched over a planned batch ([`plan`]): the first pass
//! (skipped when no image resamples both axes), then the last pass that writes every byte of
//! every slot a job names.

use std::borrow::Cow;
use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DeviceRepr, DriverError, LaunchConfig, PushKernelArg,
};
use thiserror::Error;

use crate::cuda::{KernelSource, PageLockedUpload};

#[cfg(test)]
pub(crate) mod host;
pub(crate) mod plan;

use crate::resample::{AxisPlan, Filter, PassOrder, PassPlan};
use plan::{
    plan_batch_sized, BatchError, BatchPlan, ResizeDescriptor, ResizeJob, SourceImage,
    SourcePixels, WeightJob, THREADS_PER_BLOCK,
};

/// The kernel source, embedded at build time.
pub const SOURCE: &str = include_str!("../../../kernels/resize.cu");

// SAFETY: `ResizeDescriptor` is `repr(C)` plain old data (integers only, no padding: 4 u64 then
// 26 u32, two of them nested `PassDescriptor`s of 6; 136 bytes) laid out as the kernel's
// `GfResizeImage` (batch.rs's tests compare the two field by field, the kernel static_asserts the
// sizes), so its bytes can be copied to the device as they are.
unsafe impl DeviceRepr for ResizeDescriptor {}

// SAFETY: `WeightJob` is `repr(C)` plain old data (four f64 then six u32, 56 bytes, no padding)
// laid out as the kernel's `GfWeightJob` (plan.rs's tests compare the two field by field, the
// kernel static_asserts the size).
unsafe impl DeviceRepr for WeightJob {}

/// What can go wrong on the device side.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ResizeError {
    /// A CUDA driver call failed.
    #[error("CUDA failed {context}: {source}")]
    Driver {
        /// What was being done.
        context: &'static str,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// The batch could not be planned.
    #[error(transparent)]
    Plan(#[from] BatchError),
    /// The output buffer is smaller than the slots the batch writes.
    #[error("the output holds {actual} bytes, the batch writes up to byte {needed}")]
    OutputTooSmall {
        /// Bytes the batch's slots span.
        needed: u64,
        /// Bytes of the output.
        actual: u64,
    },
}

impl From<ResizeError> for crate::Error {
    fn from(e: ResizeError) -> crate::Error {
        match e {
            ResizeError::Driver { context, source } => crate::Error::cuda(context, source),
            other => crate::Error::Mismatch(format!("resizing on the device: {other}")),
        }
    }
}

impl ResizeError {
    fn driver(context: &'static str) -> impl FnOnce(DriverError) -> ResizeError {
        move |source| ResizeError::Driver { context, source }
    }
}

/// Threads per block of `gpufeed_resize_weights`.
const WEIGHTS_THREADS: u32 = 128;

/// The most blocks of a grid's y dimension.
const MAX_GRID_Y: u32 = 65_535;

/// The kernel source as the module cache compiles it.
pub(crate) fn kernel_source() -> KernelSource {
    KernelSource {
        name: "resize.cu",
        code: SOURCE,
        defines: Vec::new(),
    }
}

/// The two entry points of kernels/resize.cu, compiled for one device.
#[derive(Debug)]
pub struct BatchResizer {
    weights: CudaFunction,
    first: CudaFunction,
    last: CudaFunction,
}

/// A planned batch in device memory: descriptors, coefficients and the intermediate buffer.
/// Reusable: launching it again recomputes the same slots.
pub struct DevicePlan {
    descriptors: CudaSlice<ResizeDescriptor>,
    /// The host's coefficients, then the weights the device computes.
    coefficients: CudaSlice<i32>,
    /// The jobs computing those weights ([`BatchPlan::weight_jobs`]).
    weight_jobs: CudaSlice<WeightJob>,
    weight_job_count: u32,
    /// The most outputs of a weight job.
    weight_outputs: u32,
    intermediate: CudaSlice<u8>,
    images: u32,
    first_pass_blocks: u32,
    last_pass_grid: (u32, u32),
    slot_len: u64,
    output_bytes: u64,
    /// The page-locked memory the descriptors and coefficients are uploaded through.
    staging: PageLockedUpload,
}

impl std::fmt::Debug for DevicePlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevicePlan")
            .field("images", &self.images)
            .field("coefficients", &self.coefficients.len())
            .field("intermediate", &self.intermediate.len())
            .finish_non_exhaustive()
    }
}

impl DevicePlan {
    /// Replaces the batch with `plan`, on `stream`, reusing the device buffers where they are
    /// large enough (a pipeline's steady state allocates nothing). The upload is queued from
    /// page-locked memory: the thread does not wait for the stream's queued work.
    pub fn update(
        &mut self,
        stream: &Arc<CudaStream>,
        plan: &BatchPlan,
    ) -> Result<(), ResizeError> {
        let descriptors = descriptors_of(plan);
        let coefficients = &plan.coefficients;
        let weight_jobs = &plan.weight_jobs;
        make_room(stream, &mut self.descriptors, descriptors.len())?;
        make_room(
            stream,
            &mut self.coefficients,
            coefficients.len() + plan.device_weights as usize,
        )?;
        make_room(stream, &mut self.weight_jobs, weight_jobs.len())?;
        let bytes = std::mem::size_of_val(&*descriptors)
            + std::mem::size_of_val(&**coefficients)
            + std::mem::size_of_val(&**weight_jobs);
        self.staging
            .start(stream, bytes)
            .map_err(ResizeError::driver("waiting for the last plan's upload"))?;
        self.staging
            .queue(stream, &descriptors, &mut self.descriptors)
            .map_err(ResizeError::driver("uploading the descriptors"))?;
        self.staging
            .queue(stream, coefficients, &mut self.coefficients)
            .map_err(ResizeError::driver("uploading the coefficients"))?;
        self.staging
            .queue(stream, weight_jobs, &mut self.weight_jobs)
            .map_err(ResizeError::driver("uploading the weight jobs"))?;
        self.weight_job_count = u32::try_from(weight_jobs.len())
            .map_err(|_| ResizeError::Plan(BatchError::TooLarge("weight jobs")))?;
        self.weight_outputs = weight_jobs.iter().map(|j| j.out_len).max().unwrap_or(0);
        let intermediate = intermediate_len(plan)?;
        if self.intermediate.len() < intermediate {
            self.intermediate = stream
                .alloc_zeros::<u8>(intermediate)
                .map_err(ResizeError::driver("allocating the intermediate"))?;
        }
        self.images = plan.descriptors.len() as u32;
        self.first_pass_blocks = plan.first_pass_blocks;
        self.last_pass_grid = plan.last_pass_grid();
        self.slot_len = plan.slot_len;
        self.output_bytes = plan.output_bytes();
        Ok(())
    }
}

/// The descriptors to upload: one unused one for an empty batch, so the buffer is never empty.
fn descriptors_of(plan: &BatchPlan) -> Cow<'_, [ResizeDescriptor]> {
    if plan.descriptors.is_empty() {
        Cow::Owned(vec![ResizeDescriptor::default()])
    } else {
        Cow::Borrowed(&plan.descriptors)
    }
}

/// Bytes to allocate for the plan's intermediate (at least 1).
fn intermediate_len(plan: &BatchPlan) -> Result<usize, ResizeError> {
    usize::try_from(plan.intermediate_bytes.max(1))
        .map_err(|_| ResizeError::Plan(BatchError::TooLarge("intermediate bytes")))
}

/// Device memory for `len` values of a plan's (at least one), left uninitialized: an upload
/// fills what a launch reads before the launch.
fn plan_buffer<T: DeviceRepr>(
    stream: &Arc<CudaStream>,
    len: usize,
) -> Result<CudaSlice<T>, ResizeError> {
    // SAFETY: the plan's types are plain old data; `DevicePlan::update` queues the upload of the
    // values a launch reads before the launch, on the same stream.
    unsafe { stream.alloc::<T>(len.max(1)) }
        .map_err(ResizeError::driver("allocating a plan's buffer"))
}

/// Reallocates `slice` when it holds fewer than `len` values.
fn make_room<T: DeviceRepr>(
    stream: &Arc<CudaStream>,
    slice: &mut CudaSlice<T>,
    len: usize,
) -> Result<(), ResizeError> {
    if slice.len() < len {
        *slice = plan_buffer(stream, len)?;
    }
    Ok(())
}

/// Where a row's pixels are: packed RGB8 in the buffer of uploaded images, or decoded on the
/// device into a buffer of decoded images.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PackedPixels {
    /// Rows of `width * 3` bytes, one after another, from this byte of the uploaded images.
    Uploaded {
        /// Its first byte.
        offset: usize,
    },
    /// Rows `pitch` bytes apart from this byte of the decoded images, RGB8 or one gray plane.
    Decoded {
        /// Its first byte.
        offset: usize,
        /// Bytes from one row to the next.
        pitch: u32,
        /// One gray sample a pixel (resampled as one channel, written as three equal ones).
        gray: bool,
    },
}

impl PackedPixels {
    /// Where the samples of an image `width` pixels wide are, its buffer starting at `base`.
    fn at(self, base: u64, width: u32) -> SourcePixels {
        match self {
            PackedPixels::Uploaded { offset } => SourcePixels::Interleaved {
                ptr: base + offset as u64,
                pitch: width * 3,
            },
            PackedPixels::Decoded {
                offset,
                pitch,
                gray,
            } => {
                let ptr = base + offset as u64;
                match gray {
                    true => SourcePixels::Gray { ptr, pitch },
                    false => SourcePixels::Interleaved { ptr, pitch },
                }
            }
        }
    }

    /// The bytes an image of `width` x `height` takes from its first one (its last row only as
    /// wide as the image).
    fn extent(&self, width: u32, height: u32) -> Option<(usize, usize)> {
        let (w, h) = (width as usize, height as usize);
        match *self {
            PackedPixels::Uploaded { offset } => Some((offset, w.checked_mul(h)?.checked_mul(3)?)),
            PackedPixels::Decoded {
                offset,
                pitch,
                gray,
            } => {
                let row = w.checked_mul(if gray { 1 } else { 3 })?;
                if h == 0 || row > pitch as usize {
                    return (h == 0).then_some((offset, 0));
                }
                Some((
                    offset,
                    (pitch as usize).checked_mul(h - 1)?.checked_add(row)?,
                ))
            }
        }
    }
}

/// An RGB8 image in a device buffer of images, and its resize into a slot of a batch.
#[derive(Debug, Clone)]
pub(crate) struct PackedResize {
    /// Where its pixels are.
    pub pixels: PackedPixels,
    /// Its pixels per row...
    pub width: u32,
    /// ...and rows.
    pub height: u32,
    /// The horizontal plan.
    pub x: AxisPlan,
    /// The vertical plan.
    pub y: AxisPlan,
    /// [`plan_passes`](crate::resample::plan_passes) of the plans, `filter` and `order`.
    pub passes: PassPlan,
    /// The resampling filter.
    pub filter: Filter,
    /// Pillow's pass order.
    pub order: PassOrder,
    /// The colour outside the kept rectangle.
    pub pad: [u8; 3],
    /// Whether the slot is mirrored left to right.
    pub flip: bool,
}

impl BatchResizer {
    /// Resizes `images`, packed in `sources` (the uploaded images) or in `decoded` (the images
    /// decoded on the device), into slots of `width` x `height` RGB8 of `out` (image `i` into
    /// slot `i`; every byte of each written), on `stream`; `plan` is the device plan kept from
    /// call to call (its buffers reused). Refuses an image whose bytes are not all inside its
    /// buffer, and an `out` too small for the slots.
    pub(crate) fn resize_packed(
        &self,
        stream: &Arc<CudaStream>,
        plan: &mut Option<DevicePlan>,
        (sources, decoded): (&CudaSlice<u8>, Option<&CudaSlice<u8>>),
        images: &[PackedResize],
        (width, height): (u32, u32),
        out: &mut CudaSlice<u8>,
    ) -> Result<(), ResizeError> {
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        let uploaded = (sources.device_ptr(stream).0, sources.len());
        let decoded = decoded.map(|d| (d.device_ptr(stream).0, d.len()));
        let mut jobs = Vec::with_capacity(images.len());
        for (index, image) in images.iter().enumerate() {
            let (base, len) = match image.pixels {
                PackedPixels::Uploaded { .. } => uploaded,
                PackedPixels::Decoded { .. } => decoded.unwrap_or((0, 0)),
            };
            let inside = image
                .pixels
                .extent(image.width, image.height)
                .and_then(|(offset, bytes)| offset.checked_add(bytes))
                .is_some_and(|end| end <= len);
            if !inside {
                return Err(ResizeError::Plan(BatchError::Address { index }));
            }
            jobs.push(ResizeJob {
                source: SourceImage::whole(
                    image.pixels.at(base, image.width),
                    image.width,
                    image.height,
                ),
                x: image.x,
                y: image.y,
                filter: image.filter,
                order: image.order,
                pad: image.pad,
                flip: image.flip,
                slot: index as u32,
            });
        }
        let passes: Vec<&PassPlan> = images.iter().map(|i| &i.passes).collect();
        let sizes = vec![(width, height); images.len()];
        let slot_len = u64::from(width) * u64::from(height) * 3;
        let batch = plan_batch_sized(&jobs, &passes, &sizes, slot_len)?;
        let device_plan = match plan.take() {
            Some(mut p) => {
                p.update(stream, &batch)?;
                p
            }
            None => self.upload(stream, &batch)?,
        };
        let device_plan = plan.insert(device_plan);
        let len = out.len() as u64;
        let (address, _written) = out.device_ptr_mut(stream);
        // SAFETY: every job reads its image inside `sources` or `decoded` (its bytes checked
        // above against its buffer's length; the planner checked the plans read inside the
        // image), device memory of this stream's context borrowed for the call and ordered by
        // cudarc's events against other streams' writes; `address` is `out`'s start, `len` bytes, borrowed
        // (and its write recorded on `stream`) while the guard lives.
        unsafe { self.launch_at(stream, device_plan, address, len) }
    }

    /// The kernels of a module compiled from [`SOURCE`] (the device's module cache keeps it).
    pub fn from_module(
        module: &Arc<cudarc::driver::CudaModule>,
    ) -> Result<BatchResizer, ResizeError> {
        let load = |name: &str| {
            module
                .load_function(name)
                .map_err(ResizeError::driver("finding a kernel entry point"))
        };
        Ok(BatchResizer {
            weights: load("gpufeed_resize_weights")?,
            first: load("gpufeed_resize_first")?,
            last: load("gpufeed_resize_last")?,
        })
    }

    /// Copies `plan`'s descriptors and coefficients to the device and allocates its
    /// intermediate, on `stream`.
    pub fn upload(
        &self,
        stream: &Arc<CudaStream>,
        plan: &BatchPlan,
    ) -> Result<DevicePlan, ResizeError> {
        let mut device = DevicePlan {
            descriptors: plan_buffer(stream, plan.descriptors.len())?,
            coefficients: plan_buffer(
                stream,
                plan.coefficients.len() + plan.device_weights as usize,
            )?,
            weight_jobs: plan_buffer(stream, plan.weight_jobs.len())?,
            weight_job_count: 0,
            weight_outputs: 0,
            intermediate: stream
                .alloc_zeros::<u8>(intermediate_len(plan)?)
                .map_err(ResizeError::driver("allocating the intermediate"))?,
            images: 0,
            first_pass_blocks: 0,
            last_pass_grid: (0, 0),
            slot_len: 0,
            output_bytes: 0,
            staging: PageLockedUpload::default(),
        };
        device.update(stream, plan)?;
        Ok(device)
    }

    /// Launches both passes of `plan` on `stream` (for the tests: the lane launches at an address,
    /// [`BatchResizer::launch_at`]), writing every byte of every slot a job of the
    /// batch names in `out` (slot `s` at `s * plan.slot_len`); other slots are left
    /// as they are.
    ///
    /// # Safety
    ///
    /// The kernels read the sources at the addresses the plan was made with, which cudarc cannot
    /// check: each must be device memory of the stream's context holding at least the rows and
    /// pitches its [`SourceImage`](plan::SourceImage) describes, alive and not written until the
    /// stream has run these kernels (same stream, or an event in between).
    #[cfg(test)]
    pub unsafe fn launch(
        &self,
        stream: &Arc<CudaStream>,
        plan: &mut DevicePlan,
        out: &mut CudaSlice<u8>,
    ) -> Result<(), ResizeError> {
        use cudarc::driver::DevicePtrMut;
        let len = out.len() as u64;
        let (address, _written) = out.device_ptr_mut(stream);
        // SAFETY: `address` is `out`'s start, `len` bytes, borrowed (and its write recorded on
        // `stream`) while the guard lives; the sources are the caller's promise.
        unsafe { self.launch_at(stream, plan, address, len) }
    }

    /// Launches `gpufeed_resize_weights` for the weights `plan` leaves to the device (none:
    /// nothing), on `stream`, before the passes that read them.
    fn launch_weights(
        &self,
        stream: &Arc<CudaStream>,
        plan: &mut DevicePlan,
    ) -> Result<(), ResizeError> {
        if plan.weight_job_count == 0 {
            return Ok(());
        }
        let config = LaunchConfig {
            grid_dim: (
                plan.weight_outputs.div_ceil(WEIGHTS_THREADS).max(1),
                plan.weight_job_count.min(MAX_GRID_Y),
                1,
            ),
            block_dim: (WEIGHTS_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut builder = stream.launch_builder(&self.weights);
        builder
            .arg(&plan.weight_jobs)
            .arg(&plan.weight_job_count)
            .arg(&mut plan.coefficients);
        // SAFETY: the arguments match gpufeed_resize_weights's parameters in order (jobs, their
        // count, coefficients). The planner placed every job's `out_len * taps` weights after
        // the host's values, inside the `device_weights` values the buffer holds beyond them
        // (`update` made room), no job's rows over another's; the kernel reads only its jobs
        // (`weight_job_count` of them, uploaded before it on this stream).
        unsafe { builder.launch(config) }.map_err(ResizeError::driver("launching the weights"))?;
        Ok(())
    }

    /// Launches the weights `plan` leaves to the device, then both passes, on `stream` into
    /// `out_len` bytes of device memory at `out`, writing every byte of every slot a job of the
    /// batch names (slot `s` at `s * plan.slot_len` from `out`); other slots are left as they
    /// are.
    ///
    /// # Safety
    ///
    /// The kernels read the sources at the addresses the plan was made with, which cudarc cannot
    /// check: each must be device memory of the stream's context holding at least the rows and
    /// pitches its [`SourceImage`](plan::SourceImage) describes, alive and not written until the
    /// stream has run these kernels (same stream, or an event in between). `[out, out + out_len)`
    /// must be device memory of the stream's context that nothing else uses until then too.
    pub unsafe fn launch_at(
        &self,
        stream: &Arc<CudaStream>,
        plan: &mut DevicePlan,
        out: u64,
        out_len: u64,
    ) -> Result<(), ResizeError> {
        if out_len < plan.output_bytes {
            return Err(ResizeError::OutputTooSmall {
                needed: plan.output_bytes,
                actual: out_len,
            });
        }
        if plan.images == 0 {
            return Ok(());
        }
        self.launch_weights(stream, plan)?;
        if plan.first_pass_blocks > 0 {
            let config = LaunchConfig {
                grid_dim: (plan.first_pass_blocks, 1, 1),
                block_dim: (THREADS_PER_BLOCK, 1, 1),
                shared_mem_bytes: 0,
            };
            let mut builder = stream.launch_builder(&self.first);
            builder
                .arg(&plan.descriptors)
                .arg(&plan.images)
                .arg(&plan.coefficients)
                .arg(&mut plan.intermediate);
            // SAFETY: the arguments match gpufeed_resize_first's parameters in order
            // (descriptors, their count, coefficients, intermediate). The planner (plan_batch)
            // made every descriptor's coefficient offsets point inside `coefficients`, its
            // intermediate range inside `intermediate` (plan.intermediate_bytes), the grid the
            // prefix sum of the images' blocks with threads past an image's pixels returning
            // early, and the source rows and columns read those of its checked plans; the
            // sources themselves are the caller's promise (this function's contract).
            unsafe { builder.launch(config) }
                .map_err(ResizeError::driver("launching the first pass"))?;
        }
        let (blocks_per_slot, images) = plan.last_pass_grid;
        let config = LaunchConfig {
            grid_dim: (blocks_per_slot, images, 1),
            block_dim: (THREADS_PER_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut builder = stream.launch_builder(&self.last);
        builder
            .arg(&plan.descriptors)
            .arg(&plan.images)
            .arg(&plan.coefficients)
            .arg(&plan.intermediate)
            .arg(&out)
            .arg(&plan.slot_len);
        // SAFETY: the arguments match gpufeed_resize_last's parameters in order (descriptors,
        // their count, coefficients, intermediate, output, slot length). The grid's y is the
        // descriptor count, or its x the prefix sum of the images' blocks (plan_batch), and each
        // thread checks its pixel against its image's size, whose
        // bytes the planner checked fit a slot; every slot a descriptor names lies inside `out`
        // (checked above against plan.output_bytes);
        // coefficient offsets and intermediate ranges are in bounds by construction
        // (plan_batch), and the bounds only name intermediate pixels the first pass wrote
        // before it on this stream, or source pixels of the checked plans (the caller's promise
        // for the memory behind them).
        unsafe { builder.launch(config) }
            .map_err(ResizeError::driver("launching the last pass"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resample::{plan_passes, resample};
    use gpufeed_bench::upload::random_bytes;

    /// Images packed at odd offsets of one buffer resize into their slots as the CPU rendition
    /// places them: upscaled and downscaled, cut, put anywhere in the slot, the rest of the
    /// slot a colour, mirrored; every byte of the poisoned output written.
    #[test]
    fn packed_images_resize_into_their_slots_as_on_the_cpu() {
        let Some(gpu) =
            crate::cuda::test_gpu("packed_images_resize_into_their_slots_as_on_the_cpu")
        else {
            return;
        };
        let stream = gpu.stream();
        let module = gpu.module(&kernel_source()).expect("compile");
        let resizer = BatchResizer::from_module(&module).expect("kernels");
        let (ow, oh) = (77u32, 61u32);
        // (source w, h), resized (w, h), kept window (x0, xn, y0, yn), placed at (x, y), pad, flip
        type Case = (
            (u32, u32),
            (u32, u32),
            (u32, u32, u32, u32),
            (u32, u32),
            [u8; 3],
            bool,
        );
        let cases: [Case; 6] = [
            ((50, 37), (77, 57), (0, 77, 0, 57), (0, 0), [0; 3], false),
            ((50, 37), (77, 57), (0, 77, 0, 57), (0, 0), [0; 3], true),
            (
                (120, 90),
                (66, 50),
                (5, 40, 3, 44),
                (20, 9),
                [123, 117, 104],
                true,
            ),
            (
                (31, 29),
                (31, 29),
                (0, 31, 0, 29),
                (3, 2),
                [255, 0, 9],
                false,
            ),
            ((200, 7), (90, 3), (13, 60, 0, 3), (0, 58), [1, 2, 3], true),
            ((9, 140), (4, 70), (0, 4, 10, 60), (73, 1), [114; 3], false),
        ];
        // Even cases uploaded packed; odd ones as decoded on the device, rows `pitch` apart
        // (case 3 one gray plane, which the kernel spreads to three equal channels).
        let mut packed = Vec::new();
        let mut decoded = Vec::new();
        let mut places = Vec::new();
        let mut sources = Vec::new();
        for (i, ((w, h), ..)) in cases.iter().enumerate() {
            let (w, h) = (*w as usize, *h as usize);
            let gray = i == 3;
            let channels = if gray { 1 } else { 3 };
            let samples = random_bytes(w * h * channels, 100 + i as u64);
            let rgb: Vec<u8> = match gray {
                true => samples.iter().flat_map(|&v| [v; 3]).collect(),
                false => samples.clone(),
            };
            if i % 2 == 0 {
                packed.extend(random_bytes(i * 7 + 1, i as u64));
                places.push(PackedPixels::Uploaded {
                    offset: packed.len(),
                });
                packed.extend(&rgb);
            } else {
                decoded.extend(random_bytes(i * 5 + 3, i as u64));
                let pitch = w * channels + 2 * i + 1;
                places.push(PackedPixels::Decoded {
                    offset: decoded.len(),
                    pitch: pitch as u32,
                    gray,
                });
                for row in samples.chunks_exact(w * channels) {
                    decoded.extend(row);
                    decoded.extend(random_bytes(pitch - row.len(), 7));
                }
            }
            sources.push(rgb);
        }
        let axis = |src, resized, first, len, at| AxisPlan {
            src_len: src,
            resized,
            out_first: first,
            out_len: len,
            dst_offset: at,
            ..AxisPlan::default()
        };
        let plans: Vec<(AxisPlan, AxisPlan)> = cases
            .iter()
            .map(|&((w, h), (rw, rh), (x0, xn, y0, yn), (dx, dy), ..)| {
                (axis(w, rw, x0, xn, dx), axis(h, rh, y0, yn, dy))
            })
            .collect();
        let passes: Vec<PassPlan> = plans
            .iter()
            .map(|(x, y)| {
                plan_passes(x, y, Filter::Bilinear, PassOrder::default()).expect("passes")
            })
            .collect();
        let images: Vec<PackedResize> = cases
            .iter()
            .zip(&plans)
            .zip(passes)
            .zip(&places)
            .map(|(((c, &(x, y)), passes), &pixels)| PackedResize {
                pixels,
                width: c.0 .0,
                height: c.0 .1,
                x,
                y,
                passes,
                filter: Filter::Bilinear,
                order: PassOrder::default(),
                pad: c.4,
                flip: c.5,
            })
            .collect();
        let slot = (ow * oh * 3) as usize;
        let device_sources = stream.clone_htod(&packed).expect("upload");
        let device_decoded = stream.clone_htod(&decoded).expect("upload");
        let mut out = stream
            .clone_htod(&vec![0xA5u8; slot * cases.len() + 5])
            .expect("poisoned output");
        let mut plan = None;
        resizer
            .resize_packed(
                stream,
                &mut plan,
                (&device_sources, Some(&device_decoded)),
                &images,
                (ow, oh),
                &mut out,
            )
            .expect("resize");
        let got = stream.clone_dtoh(&out).expect("download");
        for (i, (case, (x, y))) in cases.iter().zip(&plans).enumerate() {
            let ((w, h), .., pad, flip) = *case;
            // The CPU rendition with pads 0 and 255: the bytes that differ are padding.
            let mut dark = vec![0u8; slot];
            let mut light = vec![0u8; slot];
            for (want, value) in [(&mut dark, 0u8), (&mut light, 255)] {
                resample(
                    &sources[i],
                    w,
                    h,
                    3,
                    x,
                    y,
                    Filter::Bilinear,
                    value,
                    want,
                    ow,
                    oh,
                )
                .expect("cpu rendition");
            }
            let mut want: Vec<u8> = dark
                .iter()
                .zip(&light)
                .enumerate()
                .map(|(k, (&a, &b))| if a == b { a } else { pad[k % 3] })
                .collect();
            if flip {
                for row in want.chunks_exact_mut(ow as usize * 3) {
                    let mirrored: Vec<u8> = row.chunks_exact(3).rev().flatten().copied().collect();
                    row.copy_from_slice(&mirrored);
                }
            }
            let got = &got[i * slot..(i + 1) * slot];
            let differing = got.iter().zip(&want).filter(|(a, b)| a != b).count();
            assert_eq!(differing, 0, "case {i}: {differing} bytes differ");
        }
        assert_eq!(got[slot * cases.len()..], [0xA5; 5], "past the slots");
        // An image whose bytes run past its buffer is refused, nothing launched.
        for (at, pixels) in [
            (
                4,
                PackedPixels::Uploaded {
                    offset: packed.len() - 10,
                },
            ),
            (
                5,
                PackedPixels::Decoded {
                    offset: decoded.len() - 10,
                    pitch: 9 * 3,
                    gray: false,
                },
            ),
            // A pitch shorter than a row.
            (
                3,
                PackedPixels::Decoded {
                    offset: 0,
                    pitch: 30,
                    gray: true,
                },
            ),
        ] {
            let mut short = images.clone();
            short[at].pixels = pixels;
            let refused = resizer.resize_packed(
                stream,
                &mut plan,
                (&device_sources, Some(&device_decoded)),
                &short,
                (ow, oh),
                &mut out,
            );
            assert!(
                matches!(refused, Err(ResizeError::Plan(BatchError::Address { index })) if index == at),
                "{refused:?}"
            );
        }
        // Decoded rows without a buffer of decoded images are refused.
        let refused = resizer.resize_packed(
            stream,
            &mut plan,
            (&device_sources, None),
            &images,
            (ow, oh),
            &mut out,
        );
        assert!(matches!(
            refused,
            Err(ResizeError::Plan(BatchError::Address { index: 1 }))
        ));
    }

    /// Random resizes, bilinear and bicubic (and a Lanczos one, whose weights stay on the
    /// host): crops of sources up to 3,000 samples a side shrunk up to 3,000 times or enlarged
    /// up to 600 times, planned with the weights left to the device (the plan) and with the
    /// host's; and the weights the device must compute.
    fn weight_cases(seed: u64, count: usize) -> (BatchPlan, Vec<i32>) {
        use crate::resample::Axis;
        let mut state = seed;
        let mut next = move |n: u32| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % u64::from(n.max(1))) as u32
        };
        let axis = |next: &mut dyn FnMut(u32) -> u32| {
            let longest = if next(4) == 0 { 3000 } else { 600 };
            let src = 1 + next(longest);
            let len = 1 + next(src);
            let offset = next(src - len + 1);
            let largest = if next(3) == 0 { 600 } else { 250 };
            let size = 1 + next(largest);
            (src, AxisPlan::crop_then_resize(offset, len, size))
        };
        let pixels = SourcePixels::Interleaved {
            ptr: 1 << 32,
            pitch: 3 * 3001,
        };
        let mut jobs = Vec::new();
        for slot in 0..count as u32 {
            let ((w, x), (h, y)) = (axis(&mut next), axis(&mut next));
            let filter = match next(9) {
                0 => Filter::Lanczos,
                1..=4 => Filter::Bilinear,
                _ => Filter::Bicubic,
            };
            let order =
                [PassOrder::ShrinkVerticalFirst, PassOrder::HorizontalFirst][slot as usize % 2];
            let source = SourceImage::whole(pixels, w, h);
            assert!(
                x.check(Axis::X, w, x.out_len).is_ok() && y.check(Axis::Y, h, y.out_len).is_ok()
            );
            jobs.push(ResizeJob {
                source,
                x,
                y,
                filter,
                order,
                pad: [0; 3],
                flip: false,
                slot,
            });
        }
        let (host, device) = plan::passes_both_ways(&jobs);
        let sizes: Vec<_> = jobs.iter().map(|j| (j.x.out_len, j.y.out_len)).collect();
        let slot_len = sizes
            .iter()
            .map(|&(w, h)| u64::from(w * h) * 3)
            .max()
            .unwrap_or(3);
        let refs: Vec<&PassPlan> = device.iter().collect();
        let plan = plan_batch_sized(&jobs, &refs, &sizes, slot_len).expect("plan");
        let want = plan::device_weights_on_host(&host, &jobs);
        assert_eq!(want.len(), plan.device_weights as usize);
        (plan, want)
    }

    /// Reads a case (the host's values, the device's, the jobs, the grid, the weights wanted),
    /// runs `gpufeed_resize_weights` over the grid's blocks and threads one by one into a
    /// poisoned buffer, and counts the values that differ.
    const WEIGHTS_HARNESS: &str = r#"#include <cstdio>
#include <vector>
int main(int argc, char** argv) {
  int bad = 0;
  for (int a = 1; a < argc; a++) {
    FILE* f = fopen(argv[a], "rb");
    uint64_t hdr[5]; fread(hdr, 8, 5, f);
    const size_t base = hdr[0], total = hdr[1], count = hdr[2];
    std::vector<GfWeightJob> jobs(count); fread(jobs.data(), sizeof(GfWeightJob), count, f);
    std::vector<int> want(total); fread(want.data(), 4, total, f); fclose(f);
    std::vector<int> coeffs(base + total, 0x5A5A5A5A);
    blockDim = {(unsigned)hdr[3], 1, 1};
    gridDim = {1, (unsigned)hdr[4], 1};
    for (blockIdx.y = 0; blockIdx.y < gridDim.y; blockIdx.y++)
      for (threadIdx.x = 0; threadIdx.x < blockDim.x; threadIdx.x++)
        gpufeed_resize_weights(jobs.data(), (unsigned)count, coeffs.data());
    size_t diff = 0, first = (size_t)-1;
    for (size_t i = 0; i < total; i++) if (coeffs[base + i] != want[i]) { if (!diff) first = i; diff++; }
    for (size_t i = 0; i < base; i++) if (coeffs[i] != 0x5A5A5A5A) diff++;
    printf("%s: %zu jobs, %zu weights, %zu differ", argv[a], count, total, diff);
    if (diff && first != (size_t)-1) { printf(" first %zu got %d want %d", first, coeffs[base + first], want[first]); }
    if (diff) bad = 1;
    printf("\n");
  }
  return bad;
}
"#;

    #[test]
    fn the_weights_kernel_run_on_the_cpu_gives_the_hosts_weights() {
        use crate::cuda::emulation::{emulated, emulation};
        let Some((dir, binary)) =
            emulation("resize-weights-emulation", "resize.cu", WEIGHTS_HARNESS)
        else {
            return;
        };
        let mut cases = Vec::new();
        // One block a job with a thread for every output, and few blocks striding over many
        // jobs with few threads striding over their outputs.
        for (seed, threads, blocks) in [(7, 1024, 0), (11, 32, 3)] {
            let (plan, want) = weight_cases(seed, 400);
            let base = plan.coefficients.len() as u64;
            let blocks = match blocks {
                0 => plan.weight_jobs.len() as u64,
                n => n,
            };
            let mut case = Vec::new();
            for v in [
                base,
                want.len() as u64,
                plan.weight_jobs.len() as u64,
                threads,
                blocks,
            ] {
                case.extend_from_slice(&v.to_le_bytes());
            }
            for job in &plan.weight_jobs {
                for v in [job.in0, job.scale, job.support, job.inv_filterscale] {
                    case.extend_from_slice(&v.to_le_bytes());
                }
                case.extend_from_slice(&job.in_size.to_le_bytes());
                for v in [
                    job.taps,
                    job.out_first,
                    job.out_len,
                    job.weights,
                    job.filter,
                ] {
                    case.extend_from_slice(&v.to_le_bytes());
                }
            }
            for v in &want {
                case.extend_from_slice(&v.to_le_bytes());
            }
            cases.push(case);
        }
        let report = emulated(&dir, &binary, &[], &cases);
        assert_eq!(report.matches(" 0 differ").count(), 2, "{report}");
    }

    /// The weights the device computes are the host's, value for value, and the host's values
    /// before them are left as uploaded.
    #[test]
    fn weights_computed_on_the_device_are_the_hosts() {
        let Some(gpu) = crate::cuda::test_gpu("weights_computed_on_the_device_are_the_hosts")
        else {
            return;
        };
        let stream = gpu.stream();
        let module = gpu.module(&kernel_source()).expect("compile");
        let resizer = BatchResizer::from_module(&module).expect("kernels");
        let mut device: Option<DevicePlan> = None;
        for seed in [3, 5, 9] {
            let (plan, want) = weight_cases(seed, 400);
            let device = match device.as_mut() {
                Some(d) => {
                    d.update(stream, &plan).expect("update");
                    d
                }
                None => device.insert(resizer.upload(stream, &plan).expect("upload")),
            };
            // Poisoned where the device computes its weights.
            let base = plan.coefficients.len();
            let poison = vec![0x5A5A_5A5Ai32; want.len()];
            stream
                .memcpy_htod(
                    &poison,
                    &mut device.coefficients.slice_mut(base..base + want.len()),
                )
                .expect("poison");
            resizer.launch_weights(stream, device).expect("launch");
            let got = stream
                .clone_dtoh(&device.coefficients.slice(..base + want.len()))
                .expect("download");
            assert_eq!(
                &got[..base],
                &plan.coefficients[..],
                "seed {seed}: the host's values"
            );
            let differ = got[base..]
                .iter()
                .zip(&want)
                .filter(|(g, w)| g != w)
                .count();
            assert_eq!(
                differ,
                0,
                "seed {seed}: {differ} of {} weights differ",
                want.len()
            );
        }
    }

    /// Compiles the kernels for a Hopper and an Ampere device wherever NVRTC can be loaded (no
    /// device needed), so a syntax error shows before the GPU machine.
    #[test]
    fn the_kernels_compile_with_nvrtc() {
        // SAFETY: `is_culib_present` only tries to dlopen NVRTC by its usual names and reports
        // whether that worked; it calls nothing inside it.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            use std::io::Write as _;
            // Past the test harness's capture, so the skip shows.
            let _ = writeln!(
                std::io::stderr(),
                "skipped: the_kernels_compile_with_nvrtc: NVRTC not found"
            );
            return;
        }
        for (major, minor) in [(9, 0), (8, 0)] {
            let ptx = crate::cuda::compile_ptx(&kernel_source(), major, minor)
                .unwrap_or_else(|e| panic!("compute_{major}{minor}: {e}"));
            let text = ptx.to_src();
            for kernel in [
                "gpufeed_resize_weights",
                "gpufeed_resize_first",
                "gpufeed_resize_last",
                "gpufeed_gather",
            ] {
                assert!(text.contains(kernel), "{kernel} for compute_{major}{minor}");
            }
            // The weights' double operations each rounded on their own, as the host's.
            assert!(!text.contains("fma.rn.f64"), "a fused multiply-add");
        }
    }
}
