//! The batch planner: pure arithmetic that turns one resize per image (where its decoded pixels
//! are, its plans, filter, pad and slot) into what `kernels/resize.cu` reads: one descriptor per
//! image ([`ResizeDescriptor`], the kernel's `GfResizeImage`), one packed buffer of integer
//! coefficients, and the layout of the intermediate the first pass writes.
//!
//! The kernels run the passes of [`crate::resample::plan_passes`], as the CPU rendition does:
//!
//! - `gpufeed_resize_first`, one launch for the batch, one thread per intermediate pixel of every
//!   image that resamples both axes: Pillow's first pass (horizontal or vertical, by the pass
//!   order) over just the rows or columns the second reads, into the 8-bit intermediate (rounded
//!   and clamped, as Pillow's `imTemp`). Its grid is the prefix sum of every image's blocks
//!   ([`ResizeDescriptor::block0`]); skipped when no image needs it.
//! - `gpufeed_resize_last`, one launch, grid `(blocks per slot, images)`, one thread per output
//!   pixel of every slot written: the pad colour outside the kept rectangle, inside it the last
//!   (or only) pass, from the intermediate or straight from the source region. An image that
//!   resamples neither axis is copied by a vertical pass of one tap of weight 1.0.

use thiserror::Error;

use crate::resample::{
    Axis, AxisPlan, Direction, Filter, Pass, PassOrder, PassPlan, PlanError, WeightRule, Window,
};

/// Threads per block of both kernels; the horizontal grid's prefix sum counts blocks of this many.
pub const THREADS_PER_BLOCK: u32 = 256;

/// The most images in one batch: the vertical pass puts the image on the grid's y dimension.
pub const MAX_IMAGES: usize = 65_535;

/// Where a decoded image's samples are in device memory (addresses in the stream's context).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourcePixels {
    /// Interleaved RGB (nvJPEG's `NVJPEG_OUTPUT_RGBI`): sample (x, y, c) at
    /// `ptr + y * pitch + 3 * x + c`.
    Interleaved {
        /// Address of the first pixel.
        ptr: u64,
        /// Bytes from one row to the next.
        pitch: u32,
    },
    /// One gray plane (`NVJPEG_OUTPUT_Y`): sample (x, y) at `ptr + y * pitch + x`; resampled as
    /// one channel, written as three equal ones.
    Gray {
        /// Address of the first sample.
        ptr: u64,
        /// Bytes from one row to the next.
        pitch: u32,
    },
}

impl SourcePixels {
    /// Channels resampled: 3, or 1 for gray.
    pub fn channels(&self) -> u32 {
        match self {
            SourcePixels::Gray { .. } => 1,
            _ => 3,
        }
    }

    /// Bytes from one pixel to the next along a row.
    fn step(&self) -> u32 {
        match self {
            SourcePixels::Interleaved { .. } => 3,
            _ => 1,
        }
    }

    /// Each channel's row pitch (gray repeats its plane's).
    fn pitches(&self) -> [u32; 3] {
        match *self {
            SourcePixels::Interleaved { pitch, .. } | SourcePixels::Gray { pitch, .. } => {
                [pitch; 3]
            }
        }
    }

    /// Each channel's first sample (gray repeats its plane's); `None` on overflow.
    fn channel_addresses(&self) -> Option<[u64; 3]> {
        match *self {
            SourcePixels::Interleaved { ptr, .. } => {
                Some([ptr, ptr.checked_add(1)?, ptr.checked_add(2)?])
            }
            SourcePixels::Gray { ptr, .. } => Some([ptr; 3]),
        }
    }
}

/// A decoded image in device memory, whole or the window of it a resize reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceImage {
    /// Where its samples are: those of `held`, its first at `held`'s top-left corner.
    pub pixels: SourcePixels,
    /// The image's pixels per row...
    pub width: u32,
    /// ...and rows.
    pub height: u32,
    /// The pixels `pixels` holds: the whole image, or a window of it holding every pixel the
    /// resize reads (a decode that rendered only those).
    pub held: Window,
}

impl SourceImage {
    /// A whole `width` x `height` image.
    pub fn whole(pixels: SourcePixels, width: u32, height: u32) -> SourceImage {
        SourceImage {
            pixels,
            width,
            height,
            held: Window::whole(width, height),
        }
    }
}

/// One image's resize: from its decoded pixels to its slot of the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResizeJob {
    /// The decoded image.
    pub source: SourceImage,
    /// The horizontal plan.
    pub x: AxisPlan,
    /// The vertical plan.
    pub y: AxisPlan,
    /// The resampling filter.
    pub filter: Filter,
    /// Which Pillow's pass order to reproduce ([`PassOrder::for_pillow`]; Pillow 13's by
    /// default).
    pub order: PassOrder,
    /// The colour (red, green, blue) of every output pixel outside the kept rectangle.
    pub pad: [u8; 3],
    /// Whether the slot is mirrored left to right after the resize (the pad areas too).
    pub flip: bool,
    /// The slot written: bytes `[slot * out_h * out_w * 3, (slot + 1) * out_h * out_w * 3)`.
    pub slot: u32,
}

/// `struct GfPass` of kernels/resize.cu: one pass of one image (see [`crate::resample::Pass`]).
///
/// Output pixel (i, j) of the pass reads, for a horizontal pass, input row `fixed_first + j`,
/// columns from the bounds of output i; for a vertical pass, input column `fixed_first + i`, rows
/// from the bounds of output j.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PassDescriptor {
    /// 0: taps along rows (horizontal); 1: along columns (vertical).
    pub vertical: u32,
    /// 1: the pass reads the intermediate; 0: the source region.
    pub from_tmp: u32,
    /// The input row (horizontal) or column (vertical) of the pass's first output row or column.
    pub fixed_first: u32,
    /// Weights per output.
    pub taps: u32,
    /// Offset of the bounds table: `(first input sample, samples)` per output, as `i32` pairs.
    pub bounds: u32,
    /// Offset of the weights: `taps` per output.
    pub weights: u32,
}

/// `struct GfResizeImage` of kernels/resize.cu, field for field: one image of a batch.
///
/// Coefficient offsets count `i32`s into the batch's coefficient buffer.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResizeDescriptor {
    /// Address of each channel's sample at the source region's top-left corner.
    pub src: [u64; 3],
    /// Byte offset of the image's intermediate in the batch's intermediate buffer.
    pub tmp: u64,
    /// Row pitch of each channel's plane, in bytes.
    pub src_pitch: [u32; 3],
    /// Bytes from one source pixel to the next along a row (3 interleaved, 1 planar or gray).
    pub src_step: u32,
    /// Channels resampled: 3, or 1 for gray (spread to RGB on output).
    pub channels: u32,
    /// The output slot.
    pub slot: u32,
    /// First block of the image in the first pass's grid.
    pub block0: u32,
    /// The intermediate's width in pixels (rows are `tmp_width * channels` bytes).
    pub tmp_width: u32,
    /// The intermediate's height; 0 when there is no first pass.
    pub tmp_height: u32,
    /// The pass into the intermediate (unused when `tmp_height` is 0).
    pub first: PassDescriptor,
    /// The pass into the slot's kept rectangle.
    pub last: PassDescriptor,
    /// Left edge of the kept rectangle in the slot.
    pub dst_x: u32,
    /// Top edge of the kept rectangle.
    pub dst_y: u32,
    /// Width of the kept rectangle.
    pub dst_w: u32,
    /// Height of the kept rectangle.
    pub dst_h: u32,
    /// The pad colour: red in the low 8 bits, then green, then blue.
    pub pad: u32,
    /// 1: the slot is written mirrored left to right (a horizontal flip after the resize).
    pub flip: u32,
    /// The image's output width: rows of `out_w * 3` bytes from the slot's first byte.
    pub out_w: u32,
    /// The image's output height.
    pub out_h: u32,
    /// First block of the image in the last pass's grid when the batch's images differ in size
    /// (the grid is then every image's blocks back to back).
    pub last_block0: u32,
}

/// `struct GfWeightJob` of kernels/resize.cu, field for field: the weights of one pass whose
/// host left them to the device ([`WeightRule`]), which `gpufeed_resize_weights` computes into
/// the batch's coefficients before the passes run.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct WeightJob {
    /// The box's first edge.
    pub in0: f64,
    /// Source samples per output.
    pub scale: f64,
    /// How far the stretched filter reaches.
    pub support: f64,
    /// One over the filter's stretch.
    pub inv_filterscale: f64,
    /// Samples of the image resized (taps are clamped to it).
    pub in_size: i32,
    /// Weights per output.
    pub taps: u32,
    /// The first output's sample of the resize.
    pub out_first: u32,
    /// Outputs.
    pub out_len: u32,
    /// Offset of the first output's weights in the coefficient buffer, in `i32`s.
    pub weights: u32,
    /// 0: bilinear; 1: bicubic.
    pub filter: u32,
}

/// What the kernels need for one batch, computed on the host. A plan made again into the same
/// value ([`plan_batch_sized_into`], [`plan_batch_placed_into`]) reuses its buffers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchPlan {
    /// One descriptor per job, in the jobs' order.
    pub descriptors: Vec<ResizeDescriptor>,
    /// Every image's bounds and weights, packed (never empty, so it can be uploaded as is),
    /// but the weights left to the device...
    pub coefficients: Vec<i32>,
    /// ...which `weight_jobs` compute into the `device_weights` values of the device's buffer
    /// after `coefficients`' (the offsets count from the buffer's start).
    pub weight_jobs: Vec<WeightJob>,
    /// Values of the weights left to the device.
    pub device_weights: u32,
    /// Bytes of the intermediate buffer (at least 1).
    pub intermediate_bytes: u64,
    /// Blocks of the first pass; 0 when no image resamples both axes (the launch is skipped).
    pub first_pass_blocks: u32,
    /// Blocks of the last pass, every image's back to back ([`ResizeDescriptor::last_block0`]).
    pub last_pass_blocks: u32,
    /// Bytes from one output slot to the next: each image is written from its slot's first
    /// byte, `out_w * out_h * 3` bytes of u8 HWC RGB.
    pub slot_len: u64,
    /// The most output pixels of an image (the last pass's blocks per slot cover them).
    pub max_pixels: u32,
    /// One past the highest slot written.
    pub slots: u32,
    /// Bytes of output the batch writes into, from the first: `slots * slot_len` for
    /// images in slots of their own; to the end of the last image placed by offset
    /// ([`plan_batch_placed_into`]).
    pub output_end: u64,
}

impl BatchPlan {
    /// Bytes of output the batch writes into, from the first.
    pub fn output_bytes(&self) -> u64 {
        self.output_end
    }

    /// The last pass's grid: blocks per slot and images when every image has the most output
    /// pixels; else every image's blocks back to back, in one row (no block is left idle by a
    /// small image beside a large one: DINOv2's local views have a sixth of a global one's).
    pub fn last_pass_grid(&self) -> (u32, u32) {
        let images = self.descriptors.len() as u32;
        let per_slot = self.max_pixels.div_ceil(THREADS_PER_BLOCK).max(1);
        match u64::from(self.last_pass_blocks) < u64::from(per_slot) * u64::from(images) {
            true => (self.last_pass_blocks.max(1), 1),
            false => (per_slot, images),
        }
    }
}

/// Why a batch cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum BatchError {
    /// One image's plans do not fit its source or the output.
    #[error("image {index}: {source}")]
    Image {
        /// The job's index.
        index: usize,
        /// What is wrong.
        #[source]
        source: PlanError,
    },
    /// A row pitch shorter than a row.
    #[error("image {index}: a row pitch of {pitch} bytes is under the {needed} bytes of a row")]
    Pitch {
        /// The job's index.
        index: usize,
        /// The pitch given.
        pitch: u32,
        /// Bytes of one row.
        needed: u64,
    },
    /// A source address past the 64-bit address space.
    #[error("image {index}: the source region's address overflows")]
    Address {
        /// The job's index.
        index: usize,
    },
    /// The resize reads pixels outside the window the source holds.
    #[error("image {index}: the resize reads pixels outside the window the source holds")]
    Window {
        /// The job's index.
        index: usize,
    },
    /// Two images write the same slot.
    #[error("slot {slot} is written by images {first} and {second}")]
    DuplicateSlot {
        /// The slot.
        slot: u32,
        /// The first job writing it.
        first: usize,
        /// The second.
        second: usize,
    },
    /// Passes given for another number of jobs.
    #[error("{passes} pass plans for {jobs} images")]
    PassCount {
        /// Jobs in the batch.
        jobs: usize,
        /// Pass plans given.
        passes: usize,
    },
    /// Two images placed by offset write overlapping bytes.
    #[error("images {first} and {second} write overlapping bytes")]
    Overlap {
        /// The job placed first.
        first: usize,
        /// The job whose bytes begin inside the first's.
        second: usize,
    },
    /// A count over the kernels' 32-bit indices (or [`MAX_IMAGES`]).
    #[error("the batch is too large for the kernels: {0}")]
    TooLarge(&'static str),
}

/// Plans the batch `jobs` into slots of `out_width` x `out_height` RGB8.
#[cfg(test)]
pub fn plan_batch(
    jobs: &[ResizeJob],
    out_width: u32,
    out_height: u32,
) -> Result<BatchPlan, BatchError> {
    use crate::resample::plan_passes;
    let passes = jobs
        .iter()
        .enumerate()
        .map(|(index, job)| {
            plan_passes(&job.x, &job.y, job.filter, job.order)
                .map_err(|source| BatchError::Image { index, source })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let passes: Vec<&PassPlan> = passes.iter().collect();
    plan_batch_with(jobs, &passes, out_width, out_height)
}

/// Plans the batch `jobs` into slots of `out_width` x `out_height` RGB8 with each job's passes
/// already computed: `passes[i]` is
/// [`plan_passes`](crate::resample::plan_passes)`(jobs[i].x, jobs[i].y, jobs[i].filter,
/// jobs[i].order)` (the costly part, which
/// depends on neither the source's address nor the slot, so it can be done ahead, elsewhere).
#[cfg(test)]
pub fn plan_batch_with(
    jobs: &[ResizeJob],
    passes: &[&PassPlan],
    out_width: u32,
    out_height: u32,
) -> Result<BatchPlan, BatchError> {
    let sizes = vec![(out_width, out_height); jobs.len()];
    let slot_len = u64::from(out_width) * u64::from(out_height) * 3;
    plan_batch_sized(jobs, passes, &sizes, slot_len)
}

/// [`plan_batch_with`] for images of sizes of their own: job `i` written at `sizes[i]` (width,
/// height) from the first byte of its slot, slots `slot_len` bytes apart (a patch sequence's
/// arena; a fixed output's slots are its images).
pub fn plan_batch_sized(
    jobs: &[ResizeJob],
    passes: &[&PassPlan],
    sizes: &[(u32, u32)],
    slot_len: u64,
) -> Result<BatchPlan, BatchError> {
    let mut plan = BatchPlan::default();
    plan_batch_sized_into(&mut plan, jobs, passes, sizes, slot_len)?;
    Ok(plan)
}

/// [`plan_batch_sized`] into `plan`, reusing its buffers (a lane's steady state allocates
/// nothing); on an error `plan` holds no batch to launch.
pub fn plan_batch_sized_into(
    plan: &mut BatchPlan,
    jobs: &[ResizeJob],
    passes: &[&PassPlan],
    sizes: &[(u32, u32)],
    slot_len: u64,
) -> Result<(), BatchError> {
    plan.descriptors.clear();
    check_counts(jobs, passes, sizes)?;
    let fits = |&(w, h): &(u32, u32)| {
        let pixels = u64::from(w) * u64::from(h);
        pixels > 0 && pixels <= u64::from(u32::MAX / 3) && pixels * 3 <= slot_len
    };
    if !sizes.iter().all(fits) {
        return Err(BatchError::TooLarge("output pixels per slot (or none)"));
    }
    check_slots(jobs)?;
    let slots = jobs.iter().map(|j| j.slot + 1).max().unwrap_or(0);
    let output_end = u64::from(slots) * slot_len;
    plan_checked(plan, jobs, passes, sizes, slot_len, output_end)
}

/// [`plan_batch_placed_into`] into a plan of its own.
#[cfg(test)]
pub fn plan_batch_placed(
    jobs: &[ResizeJob],
    passes: &[&PassPlan],
    sizes: &[(u32, u32)],
    unit: u64,
) -> Result<BatchPlan, BatchError> {
    let mut plan = BatchPlan::default();
    plan_batch_placed_into(&mut plan, jobs, passes, sizes, unit)?;
    Ok(plan)
}

/// Plans the batch `jobs` with outputs of sizes of their own placed by offset into `plan`,
/// reusing its buffers: job `i` written at `sizes[i]` (width, height) from byte
/// `jobs[i].slot * unit` (the views of an image, one after another in its record). Refuses
/// outputs that overlap; on an error `plan` holds no batch to launch.
pub fn plan_batch_placed_into(
    plan: &mut BatchPlan,
    jobs: &[ResizeJob],
    passes: &[&PassPlan],
    sizes: &[(u32, u32)],
    unit: u64,
) -> Result<(), BatchError> {
    plan.descriptors.clear();
    check_counts(jobs, passes, sizes)?;
    let mut placed = Vec::with_capacity(jobs.len());
    for (index, (job, &(w, h))) in jobs.iter().zip(sizes).enumerate() {
        let pixels = u64::from(w) * u64::from(h);
        if pixels == 0 || pixels > u64::from(u32::MAX / 3) {
            return Err(BatchError::TooLarge("output pixels per image (or none)"));
        }
        let start = u64::from(job.slot)
            .checked_mul(unit)
            .ok_or(BatchError::TooLarge("output offset"))?;
        placed.push((start, start + 3 * pixels, index));
    }
    placed.sort_unstable();
    if let Some(pair) = placed.windows(2).find(|p| p[1].0 < p[0].1) {
        return Err(BatchError::Overlap {
            first: pair[0].2,
            second: pair[1].2,
        });
    }
    let output_end = placed.last().map_or(0, |p| p.1);
    plan_checked(plan, jobs, passes, sizes, unit, output_end)
}

/// Makes `plan` the plan of jobs whose counts, sizes and output places are checked, in its own
/// buffers.
fn plan_checked(
    plan: &mut BatchPlan,
    jobs: &[ResizeJob],
    passes: &[&PassPlan],
    sizes: &[(u32, u32)],
    slot_len: u64,
    output_end: u64,
) -> Result<(), BatchError> {
    plan.descriptors.clear();
    let mut coefficients = std::mem::take(&mut plan.coefficients);
    coefficients.clear();
    let mut weight_jobs = std::mem::take(&mut plan.weight_jobs);
    weight_jobs.clear();
    let mut builder = Builder {
        coefficients,
        weight_jobs,
        device_weights: 0,
        intermediate_bytes: 0,
        blocks: 0,
        last_blocks: 0,
    };
    // A failed plan is left empty: its coefficients' buffer is kept for the next.
    let added = jobs.iter().zip(passes).zip(sizes).enumerate().try_for_each(
        |(index, ((job, passes), &(w, h)))| {
            let descriptor = builder.add(index, job, passes, w, h)?;
            plan.descriptors.push(descriptor);
            Ok(())
        },
    );
    if builder.coefficients.is_empty() {
        builder.coefficients.push(0);
    }
    // The weights left to the device go after the host's values.
    let added = added.and_then(|()| builder.place_device_weights(&mut plan.descriptors));
    plan.coefficients = builder.coefficients;
    plan.weight_jobs = builder.weight_jobs;
    plan.device_weights = builder.device_weights;
    if let Err(e) = added {
        plan.descriptors.clear();
        plan.weight_jobs.clear();
        plan.device_weights = 0;
        return Err(e);
    }
    plan.intermediate_bytes = builder.intermediate_bytes.max(1);
    plan.first_pass_blocks = builder.blocks;
    plan.last_pass_blocks = builder.last_blocks;
    plan.slot_len = slot_len;
    plan.max_pixels = sizes.iter().map(|&(w, h)| w * h).max().unwrap_or(0);
    plan.slots = jobs.iter().map(|j| j.slot + 1).max().unwrap_or(0);
    plan.output_end = output_end;
    Ok(())
}

/// Refuses more jobs than the kernels index, and pass plans or sizes for another number of jobs.
fn check_counts(
    jobs: &[ResizeJob],
    passes: &[&PassPlan],
    sizes: &[(u32, u32)],
) -> Result<(), BatchError> {
    if jobs.len() > MAX_IMAGES {
        return Err(BatchError::TooLarge("more than 65535 images"));
    }
    match [passes.len(), sizes.len()]
        .into_iter()
        .find(|&n| n != jobs.len())
    {
        Some(passes) => Err(BatchError::PassCount {
            jobs: jobs.len(),
            passes,
        }),
        None => Ok(()),
    }
}

/// Refuses two jobs writing the same slot (their threads would race) and slots past `u32`'s
/// range of `slot + 1`.
fn check_slots(jobs: &[ResizeJob]) -> Result<(), BatchError> {
    let mut by_slot: Vec<(u32, usize)> = jobs.iter().map(|j| j.slot).zip(0..).collect();
    by_slot.sort_unstable();
    for pair in by_slot.windows(2) {
        if pair[0].0 == pair[1].0 {
            return Err(BatchError::DuplicateSlot {
                slot: pair[0].0,
                first: pair[0].1.min(pair[1].1),
                second: pair[0].1.max(pair[1].1),
            });
        }
    }
    if by_slot.last().is_some_and(|&(slot, _)| slot == u32::MAX) {
        return Err(BatchError::TooLarge("slot number"));
    }
    Ok(())
}

/// While a batch is planned, the mark of a pass's weights offset counted among the values the
/// device computes rather than from the buffer's start.
const ON_DEVICE: u32 = 1 << 31;

/// The running state of a plan: coefficients packed so far, intermediate bytes and both passes'
/// blocks handed out.
struct Builder {
    coefficients: Vec<i32>,
    /// The passes whose weights the device computes, their offsets counted from the start of
    /// the values after `coefficients` until [`Builder::place_device_weights`]...
    weight_jobs: Vec<WeightJob>,
    /// ...and those values.
    device_weights: u32,
    intermediate_bytes: u64,
    blocks: u32,
    last_blocks: u32,
}

impl Builder {
    /// The descriptor of job `index` (resampled by `passes`), its coefficients appended and its
    /// intermediate placed.
    fn add(
        &mut self,
        index: usize,
        job: &ResizeJob,
        passes: &PassPlan,
        out_width: u32,
        out_height: u32,
    ) -> Result<ResizeDescriptor, BatchError> {
        let image_error = |source| BatchError::Image { index, source };
        let source = &job.source;
        job.x
            .check(Axis::X, source.width, out_width)
            .map_err(image_error)?;
        job.y
            .check(Axis::Y, source.height, out_height)
            .map_err(image_error)?;
        check_pitch(index, source)?;
        check_held(index, source, passes)?;
        let (src, src_pitch) = region_addresses(index, job)?;
        let channels = source.pixels.channels();

        let (tmp_width, tmp_height) = passes.intermediate;
        let tmp = self.place_intermediate(tmp_width, tmp_height, channels)?;
        let block0 = self.blocks;
        self.blocks = add_blocks(
            self.blocks,
            tmp_width,
            tmp_height,
            "blocks of the first pass",
        )?;
        let last_block0 = self.last_blocks;
        self.last_blocks = add_blocks(
            self.last_blocks,
            out_width,
            out_height,
            "blocks of the last pass",
        )?;
        let first = match &passes.first {
            Some(pass) => self.push_pass(pass, false)?,
            None => PassDescriptor::default(),
        };
        let last = self.push_pass(&passes.last, passes.first.is_some())?;
        Ok(ResizeDescriptor {
            src,
            tmp,
            src_pitch,
            src_step: source.pixels.step(),
            channels,
            slot: job.slot,
            block0,
            tmp_width,
            tmp_height,
            first,
            last,
            dst_x: job.x.dst_offset,
            dst_y: job.y.dst_offset,
            dst_w: job.x.out_len,
            dst_h: job.y.out_len,
            pad: u32::from_le_bytes([job.pad[0], job.pad[1], job.pad[2], 0]),
            flip: u32::from(job.flip),
            out_w: out_width,
            out_h: out_height,
            last_block0,
        })
    }

    /// Reserves `width` x `height` pixels of `channels` bytes in the intermediate, 16-byte
    /// aligned; returns their offset.
    fn place_intermediate(
        &mut self,
        width: u32,
        height: u32,
        channels: u32,
    ) -> Result<u64, BatchError> {
        let pixels = u64::from(width) * u64::from(height);
        if pixels > u64::from(u32::MAX) {
            return Err(BatchError::TooLarge("intermediate pixels of one image"));
        }
        let offset = self.intermediate_bytes.next_multiple_of(16);
        self.intermediate_bytes = offset + pixels * u64::from(channels);
        Ok(offset)
    }

    /// Appends a pass's bounds (as `i32` pairs) and weights (or the job computing them on the
    /// device); returns its descriptor.
    fn push_pass(&mut self, pass: &Pass, from_tmp: bool) -> Result<PassDescriptor, BatchError> {
        let axis = &pass.coefficients;
        let taps = u32::try_from(axis.taps).map_err(|_| BatchError::TooLarge("taps"))?;
        let bounds = self.offset()?;
        for &(start, len) in &axis.bounds {
            // Both are below MAX_SIDE, so they fit an i32.
            self.coefficients.push(start as i32);
            self.coefficients.push(len as i32);
        }
        let weights = match &axis.weights_on_device {
            Some(rule) => self.push_weight_job(rule, taps, axis.bounds.len())?,
            None => {
                let weights = self.offset()?;
                self.coefficients.extend_from_slice(&axis.weights);
                weights
            }
        };
        self.offset()?;
        Ok(PassDescriptor {
            vertical: u32::from(pass.direction == Direction::Vertical),
            from_tmp: u32::from(from_tmp),
            fixed_first: pass.fixed_first,
            taps,
            bounds,
            weights,
        })
    }

    /// Adds the job computing `outputs` rows of `taps` weights under `rule` on the device;
    /// returns their offset among the device's values, marked [`ON_DEVICE`].
    fn push_weight_job(
        &mut self,
        rule: &WeightRule,
        taps: u32,
        outputs: usize,
    ) -> Result<u32, BatchError> {
        let too_large = || BatchError::TooLarge("weights computed on the device");
        let out_len = u32::try_from(outputs).map_err(|_| too_large())?;
        let at = self.device_weights;
        self.device_weights = out_len
            .checked_mul(taps)
            .and_then(|n| at.checked_add(n))
            .filter(|&end| end < ON_DEVICE)
            .ok_or_else(too_large)?;
        self.weight_jobs.push(WeightJob {
            in0: rule.in0,
            scale: rule.scale,
            support: rule.support,
            inv_filterscale: rule.inv_filterscale,
            in_size: rule.in_size,
            taps,
            out_first: rule.out_first,
            out_len,
            weights: at,
            filter: u32::from(rule.filter == Filter::Bicubic),
        });
        Ok(at | ON_DEVICE)
    }

    /// Moves the weights left to the device after the host's values: their jobs' offsets, and
    /// those of the passes of `descriptors` that read them (marked [`ON_DEVICE`]), count from
    /// the buffer's start.
    fn place_device_weights(
        &mut self,
        descriptors: &mut [ResizeDescriptor],
    ) -> Result<(), BatchError> {
        if self.weight_jobs.is_empty() {
            return Ok(());
        }
        let base = self.offset()?;
        base.checked_add(self.device_weights)
            .ok_or(BatchError::TooLarge("coefficients of the batch"))?;
        for job in &mut self.weight_jobs {
            job.weights += base;
        }
        for descriptor in descriptors.iter_mut() {
            // A descriptor without a first pass holds a default one, unmarked.
            for pass in [&mut descriptor.first, &mut descriptor.last] {
                if pass.weights & ON_DEVICE != 0 {
                    pass.weights = (pass.weights & !ON_DEVICE) + base;
                }
            }
        }
        Ok(())
    }

    /// The next host value's offset (below [`ON_DEVICE`]).
    fn offset(&self) -> Result<u32, BatchError> {
        u32::try_from(self.coefficients.len())
            .ok()
            .filter(|&n| n < ON_DEVICE)
            .ok_or(BatchError::TooLarge("coefficients of the batch"))
    }
}

/// Refuses a pitch shorter than a row of the pixels held.
fn check_pitch(index: usize, source: &SourceImage) -> Result<(), BatchError> {
    let pitches = source.pixels.pitches();
    let needed = u64::from(source.held.width) * u64::from(source.pixels.step());
    let planes = source.pixels.channels() as usize;
    match pitches[..planes].iter().find(|&&p| u64::from(p) < needed) {
        Some(&pitch) => Err(BatchError::Pitch {
            index,
            pitch,
            needed,
        }),
        None => Ok(()),
    }
}

/// Refuses a source whose window (inside the image) lacks pixels `passes` read.
fn check_held(index: usize, source: &SourceImage, passes: &PassPlan) -> Result<(), BatchError> {
    let held = &source.held;
    let (x_end, y_end) = (
        u64::from(held.x) + u64::from(held.width),
        u64::from(held.y) + u64::from(held.height),
    );
    let inside = x_end <= u64::from(source.width)
        && y_end <= u64::from(source.height)
        && (passes.source_columns.is_empty()
            || (held.x <= passes.source_columns.start
                && u64::from(passes.source_columns.end) <= x_end))
        && (passes.source_rows.is_empty()
            || (held.y <= passes.source_rows.start && u64::from(passes.source_rows.end) <= y_end));
    match inside {
        true => Ok(()),
        false => Err(BatchError::Window { index }),
    }
}

/// `blocks` handed out so far, and then those covering a `width` x `height` image of one pass.
fn add_blocks(blocks: u32, width: u32, height: u32, what: &'static str) -> Result<u32, BatchError> {
    let pixels = u64::from(width) * u64::from(height);
    let added = pixels.div_ceil(u64::from(THREADS_PER_BLOCK));
    u32::try_from(u64::from(blocks) + added)
        .ok()
        .filter(|&b| b < i32::MAX as u32)
        .ok_or(BatchError::TooLarge(what))
}

/// Each channel's address at the source region's top-left corner (which may lie outside the
/// window held: only the pixels the passes read are), and its pitch.
fn region_addresses(index: usize, job: &ResizeJob) -> Result<([u64; 3], [u32; 3]), BatchError> {
    let address_error = || BatchError::Address { index };
    let bases = job
        .source
        .pixels
        .channel_addresses()
        .ok_or_else(address_error)?;
    let pitches = job.source.pixels.pitches();
    let step = u64::from(job.source.pixels.step());
    let mut src = [0u64; 3];
    let held = &job.source.held;
    let rows = i64::from(job.y.src_offset) - i64::from(held.y);
    let columns = i64::from(job.x.src_offset) - i64::from(held.x);
    for ((dst, &base), &pitch) in src.iter_mut().zip(&bases).zip(&pitches) {
        *dst = rows
            .checked_mul(i64::from(pitch))
            .and_then(|rows| rows.checked_add(columns.checked_mul(i64::try_from(step).ok()?)?))
            .and_then(|offset| base.checked_add_signed(offset))
            .ok_or_else(address_error)?;
    }
    Ok((src, pitches))
}

/// The passes of each of `jobs` with the host's weights, and with the bilinear and bicubic ones
/// left to the device.
#[cfg(test)]
pub(crate) fn passes_both_ways(jobs: &[ResizeJob]) -> (Vec<PassPlan>, Vec<PassPlan>) {
    use crate::resample::{plan_passes, plan_passes_weights_on_device};
    jobs.iter()
        .map(|j| {
            let host = plan_passes(&j.x, &j.y, j.filter, j.order).expect("plan");
            let device = plan_passes_weights_on_device(&j.x, &j.y, j.filter, j.order);
            (host, device.expect("plan"))
        })
        .unzip()
}

/// The weights a plan of `jobs` whose passes leave them to the device ([`WeightJob`]s in the
/// passes' order) must find computed there, in the device's values after the host's: the
/// weights of `host`, the same jobs' passes planned with the host's weights.
#[cfg(test)]
pub(crate) fn device_weights_on_host(host: &[PassPlan], jobs: &[ResizeJob]) -> Vec<i32> {
    let mut weights = Vec::new();
    for (plan, job) in host.iter().zip(jobs) {
        for pass in plan.first.iter().chain([&plan.last]) {
            let c = &pass.coefficients;
            if c.resampled && WeightRule::takes(job.filter) {
                weights.extend_from_slice(&c.weights);
            }
        }
    }
    weights
}

#[cfg(test)]
mod tests {
    use std::mem::{align_of, offset_of, size_of};

    use super::*;
    use crate::resample::torchvision_center_crop;

    #[test]
    fn descriptor_layout_matches_the_kernel_struct() {
        // kernels/resize.cu static_asserts the same numbers for GfResizeImage and GfPass.
        assert_eq!(size_of::<PassDescriptor>(), 24);
        assert_eq!(offset_of!(PassDescriptor, vertical), 0);
        assert_eq!(offset_of!(PassDescriptor, from_tmp), 4);
        assert_eq!(offset_of!(PassDescriptor, fixed_first), 8);
        assert_eq!(offset_of!(PassDescriptor, taps), 12);
        assert_eq!(offset_of!(PassDescriptor, bounds), 16);
        assert_eq!(offset_of!(PassDescriptor, weights), 20);
        assert_eq!(size_of::<ResizeDescriptor>(), 152);
        assert_eq!(align_of::<ResizeDescriptor>(), 8);
        assert_eq!(offset_of!(ResizeDescriptor, src), 0);
        assert_eq!(offset_of!(ResizeDescriptor, tmp), 24);
        assert_eq!(offset_of!(ResizeDescriptor, src_pitch), 32);
        assert_eq!(offset_of!(ResizeDescriptor, src_step), 44);
        assert_eq!(offset_of!(ResizeDescriptor, channels), 48);
        assert_eq!(offset_of!(ResizeDescriptor, slot), 52);
        assert_eq!(offset_of!(ResizeDescriptor, block0), 56);
        assert_eq!(offset_of!(ResizeDescriptor, tmp_width), 60);
        assert_eq!(offset_of!(ResizeDescriptor, tmp_height), 64);
        assert_eq!(offset_of!(ResizeDescriptor, first), 68);
        assert_eq!(offset_of!(ResizeDescriptor, last), 92);
        assert_eq!(offset_of!(ResizeDescriptor, dst_x), 116);
        assert_eq!(offset_of!(ResizeDescriptor, dst_y), 120);
        assert_eq!(offset_of!(ResizeDescriptor, dst_w), 124);
        assert_eq!(offset_of!(ResizeDescriptor, dst_h), 128);
        assert_eq!(offset_of!(ResizeDescriptor, pad), 132);
        assert_eq!(offset_of!(ResizeDescriptor, flip), 136);
        assert_eq!(offset_of!(ResizeDescriptor, out_w), 140);
        assert_eq!(offset_of!(ResizeDescriptor, out_h), 144);
        assert_eq!(offset_of!(ResizeDescriptor, last_block0), 148);
    }

    /// The fields of `struct NAME { ... };` in kernels/resize.cu with their C offsets and
    /// sizes (every field is naturally aligned, as in the Rust structs).
    fn c_layout(name: &str) -> Vec<(String, usize, usize)> {
        let source = include_str!("../../../kernels/resize.cu");
        let start = source
            .find(&format!("struct {name} {{"))
            .unwrap_or_else(|| panic!("no struct {name}"));
        let body = &source[start..];
        let body = &body[body.find('{').unwrap_or(0) + 1..body.find("};").unwrap_or(0)];
        let mut offset = 0usize;
        let mut fields = Vec::new();
        for line in body.lines() {
            let code = line.split("//").next().unwrap_or("").trim();
            let Some(decl) = code.strip_suffix(';') else {
                continue;
            };
            let (ty, field) = decl.rsplit_once(' ').expect("a `type name;` declaration");
            let (field, count) = match field.split_once('[') {
                Some((f, n)) => (
                    f,
                    n.trim_end_matches(']').parse::<usize>().expect("a count"),
                ),
                None => (field, 1),
            };
            let (size, align) = match ty {
                "unsigned long long" | "double" => (8, 8),
                "unsigned int" | "int" => (4, 4),
                "GfPass" => (24, 4),
                other => panic!("unexpected field type {other}"),
            };
            offset = offset.next_multiple_of(align);
            fields.push((field.to_string(), offset, size * count));
            offset += size * count;
        }
        fields
    }

    #[test]
    fn the_kernel_structs_have_the_rust_layout() {
        let pass: Vec<_> = [
            ("vertical", offset_of!(PassDescriptor, vertical)),
            ("from_tmp", offset_of!(PassDescriptor, from_tmp)),
            ("fixed_first", offset_of!(PassDescriptor, fixed_first)),
            ("taps", offset_of!(PassDescriptor, taps)),
            ("bounds", offset_of!(PassDescriptor, bounds)),
            ("weights", offset_of!(PassDescriptor, weights)),
        ]
        .into_iter()
        .map(|(f, o)| (f.to_string(), o))
        .collect();
        let c: Vec<_> = c_layout("GfPass")
            .into_iter()
            .map(|(f, o, _)| (f, o))
            .collect();
        assert_eq!(c, pass);
        let image: Vec<_> = [
            ("src", offset_of!(ResizeDescriptor, src)),
            ("tmp", offset_of!(ResizeDescriptor, tmp)),
            ("src_pitch", offset_of!(ResizeDescriptor, src_pitch)),
            ("src_step", offset_of!(ResizeDescriptor, src_step)),
            ("channels", offset_of!(ResizeDescriptor, channels)),
            ("slot", offset_of!(ResizeDescriptor, slot)),
            ("block0", offset_of!(ResizeDescriptor, block0)),
            ("tmp_width", offset_of!(ResizeDescriptor, tmp_width)),
            ("tmp_height", offset_of!(ResizeDescriptor, tmp_height)),
            ("first", offset_of!(ResizeDescriptor, first)),
            ("last", offset_of!(ResizeDescriptor, last)),
            ("dst_x", offset_of!(ResizeDescriptor, dst_x)),
            ("dst_y", offset_of!(ResizeDescriptor, dst_y)),
            ("dst_w", offset_of!(ResizeDescriptor, dst_w)),
            ("dst_h", offset_of!(ResizeDescriptor, dst_h)),
            ("pad", offset_of!(ResizeDescriptor, pad)),
            ("flip", offset_of!(ResizeDescriptor, flip)),
            ("out_w", offset_of!(ResizeDescriptor, out_w)),
            ("out_h", offset_of!(ResizeDescriptor, out_h)),
            ("last_block0", offset_of!(ResizeDescriptor, last_block0)),
        ]
        .into_iter()
        .map(|(f, o)| (f.to_string(), o))
        .collect();
        let c = c_layout("GfResizeImage");
        let end = c.last().map_or(0, |(_, o, s)| o + s);
        let c: Vec<_> = c.into_iter().map(|(f, o, _)| (f, o)).collect();
        assert_eq!(c, image);
        assert_eq!(end, size_of::<ResizeDescriptor>(), "no tail padding");
        let source = include_str!("../../../kernels/resize.cu");
        assert!(source.contains("sizeof(GfResizeImage) == 152"));
        assert!(source.contains("sizeof(GfPass) == 24"));
        let weights: Vec<_> = [
            ("in0", offset_of!(WeightJob, in0)),
            ("scale", offset_of!(WeightJob, scale)),
            ("support", offset_of!(WeightJob, support)),
            ("inv_filterscale", offset_of!(WeightJob, inv_filterscale)),
            ("in_size", offset_of!(WeightJob, in_size)),
            ("taps", offset_of!(WeightJob, taps)),
            ("out_first", offset_of!(WeightJob, out_first)),
            ("out_len", offset_of!(WeightJob, out_len)),
            ("weights", offset_of!(WeightJob, weights)),
            ("filter", offset_of!(WeightJob, filter)),
        ]
        .into_iter()
        .map(|(f, o)| (f.to_string(), o))
        .collect();
        let c = c_layout("GfWeightJob");
        let end = c.last().map_or(0, |(_, o, s)| o + s);
        let c: Vec<_> = c.into_iter().map(|(f, o, _)| (f, o)).collect();
        assert_eq!(c, weights);
        assert_eq!(end, size_of::<WeightJob>(), "no tail padding");
        assert!(source.contains("sizeof(GfWeightJob) == 56"));
    }

    /// The weights each pass of `plan` reads, output by output, from `coefficients` (the
    /// device's buffer): its direction, then each output's bounds and row of weights.
    fn pass_rows(plan: &BatchPlan, coefficients: &[i32]) -> Vec<(u32, Vec<i32>)> {
        let mut rows = Vec::new();
        for d in &plan.descriptors {
            let first = (d.tmp_height > 0).then_some((&d.first, d.tmp_width, d.tmp_height));
            for (pass, w, h) in first.into_iter().chain([(&d.last, d.dst_w, d.dst_h)]) {
                let outputs = if pass.vertical == 1 { h } else { w } as usize;
                let taps = pass.taps as usize;
                for o in 0..outputs {
                    let (at, weights) = (pass.bounds as usize + 2 * o, pass.weights as usize);
                    let row = &coefficients[weights + o * taps..weights + (o + 1) * taps];
                    rows.push((pass.vertical, [&coefficients[at..at + 2], row].concat()));
                }
            }
        }
        rows
    }

    #[test]
    fn weights_left_to_the_device_are_placed_after_the_hosts_and_read_as_the_hosts() {
        use crate::resample::Pass;
        let pixels = |at: u64, width: u32| SourcePixels::Interleaved {
            ptr: at << 24,
            pitch: width * 3,
        };
        // Bicubic and bilinear crops (both passes, either order, one pass alone), an axis left
        // alone, a box, and a filter whose weights stay on the host.
        let mut jobs = Vec::new();
        for (k, &(w, h, filter)) in [
            (500, 375, Filter::Bicubic),
            (375, 500, Filter::Bilinear),
            (224, 900, Filter::Bicubic),
            (224, 224, Filter::Bicubic),
            (640, 224, Filter::Bilinear),
            (333, 251, Filter::Lanczos),
            (4000, 3000, Filter::Bicubic),
        ]
        .iter()
        .enumerate()
        {
            let mut j = job(w, h, pixels(k as u64 + 1, w), k as u32);
            j.filter = filter;
            if k == 3 {
                (j.x, j.y) = (AxisPlan::stretch(224, 224), AxisPlan::stretch(224, 96));
            }
            jobs.push(j);
        }
        let (host, device) = passes_both_ways(&jobs);
        let strip = |p: &PassPlan| {
            let strip = |pass: &Pass| {
                (
                    pass.direction,
                    pass.fixed_first,
                    pass.coefficients.bounds.clone(),
                )
            };
            (
                p.first.as_ref().map(strip),
                strip(&p.last),
                p.intermediate,
                p.source_rows.clone(),
            )
        };
        for (h, d) in host.iter().zip(&device) {
            assert_eq!(strip(h), strip(d), "the same passes and bounds");
        }
        let sizes: Vec<_> = jobs
            .iter()
            .map(|j| (j.x.resized.min(224), j.y.resized.min(224)))
            .collect();
        let slot_len = 224 * 224 * 3;
        let (host_refs, device_refs): (Vec<_>, Vec<_>) = host.iter().zip(&device).unzip();
        let on_host = plan_batch_sized(&jobs, &host_refs, &sizes, slot_len).expect("plan");
        let mut on_device = BatchPlan::default();
        // Planned twice into the same plan: the second from a plan that held jobs.
        for _ in 0..2 {
            plan_batch_sized_into(&mut on_device, &jobs, &device_refs, &sizes, slot_len)
                .expect("plan");
        }
        assert!(on_device.coefficients.len() < on_host.coefficients.len() / 2);
        // Every bilinear and bicubic resampled axis is a job (five crops' two, the stretch's
        // one; not the Lanczos crop's, nor the unchanged axis), rows back to back after the
        // host's values.
        assert_eq!(on_device.weight_jobs.len(), 2 * 5 + 1);
        let mut end = on_device.coefficients.len() as u32;
        for job in &on_device.weight_jobs {
            assert_eq!(job.weights, end);
            end += job.out_len * job.taps;
        }
        assert_eq!(
            end,
            on_device.coefficients.len() as u32 + on_device.device_weights
        );
        // Each job's rows filled with the host's weights of its pass (the jobs follow the
        // passes in order): every pass reads what the host's plan gives it.
        let mut buffer = on_device.coefficients.clone();
        buffer.extend(device_weights_on_host(&host, &jobs));
        assert_eq!(buffer.len(), end as usize);
        assert_eq!(
            pass_rows(&on_device, &buffer),
            pass_rows(&on_host, &on_host.coefficients)
        );
        let descriptors = |p: &BatchPlan| {
            p.descriptors
                .iter()
                .map(|d| ResizeDescriptor {
                    first: PassDescriptor {
                        bounds: 0,
                        weights: 0,
                        ..d.first
                    },
                    last: PassDescriptor {
                        bounds: 0,
                        weights: 0,
                        ..d.last
                    },
                    ..*d
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(descriptors(&on_device), descriptors(&on_host));
    }

    fn job(width: u32, height: u32, pixels: SourcePixels, slot: u32) -> ResizeJob {
        let (x, y) = torchvision_center_crop(width, height, 256, 224, 224);
        ResizeJob {
            source: SourceImage::whole(pixels, width, height),
            x,
            y,
            filter: Filter::Bilinear,
            order: PassOrder::ShrinkVerticalFirst,
            pad: [0; 3],
            flip: false,
            slot,
        }
    }

    #[test]
    fn a_batch_packs_coefficients_blocks_and_intermediates() {
        let a = job(
            500,
            375,
            SourcePixels::Interleaved {
                ptr: 1 << 20,
                pitch: 1536,
            },
            1,
        );
        let b = job(
            256,
            400,
            SourcePixels::Gray {
                ptr: 1 << 30,
                pitch: 256,
            },
            0,
        );
        let plan = plan_batch(&[a, b], 224, 224).expect("plan");
        let [da, db] = [plan.descriptors[0], plan.descriptors[1]];

        // a: 500x375 -> 341x256, crop at (58, 16): horizontal pass over the rows the vertical
        // one reads, into a 224-wide intermediate.
        assert_eq!((da.channels, da.src_step), (3, 3));
        assert_eq!(da.src, [1 << 20, (1 << 20) + 1, (1 << 20) + 2]);
        assert_eq!((da.tmp_width, da.tmp, da.block0), (224, 0, 0));
        assert!(
            da.tmp_height > 224 && da.tmp_height < 375,
            "{}",
            da.tmp_height
        );
        assert_eq!((da.first.vertical, da.first.from_tmp), (0, 0));
        assert!(
            da.first.fixed_first > 0,
            "the rows above the crop are not resampled"
        );
        assert_eq!(
            (da.last.vertical, da.last.from_tmp, da.last.fixed_first),
            (1, 1, 0)
        );
        let a_pixels = u64::from(da.tmp_height) * 224;
        assert_eq!(
            u64::from(db.block0),
            a_pixels.div_ceil(u64::from(THREADS_PER_BLOCK))
        );
        // b: 256 wide stays 256 wide: no first pass; the vertical pass reads the source from
        // column round(32 / 2) = 16 on.
        assert_eq!(
            (db.tmp_height, db.last.vertical, db.last.from_tmp),
            (0, 1, 0)
        );
        assert_eq!(db.last.fixed_first, 16);
        assert_eq!(db.tmp, (a_pixels * 3).next_multiple_of(16));
        assert_eq!(plan.first_pass_blocks, db.block0);
        assert_eq!(plan.slots, 2);
        assert_eq!(plan.last_pass_grid(), ((224 * 224u32).div_ceil(256), 2));

        // Coefficients: a's first pass (x), a's last (y), then b's last (y).
        let (xa, ya) = (da.first.taps as usize, da.last.taps as usize);
        assert_eq!(da.first.weights as usize, 2 * 224);
        assert_eq!(da.last.bounds as usize, 2 * 224 + 224 * xa);
        assert_eq!(db.last.bounds as usize, da.last.weights as usize + 224 * ya);
        let end = db.last.weights as usize + 224 * db.last.taps as usize;
        assert_eq!(plan.coefficients.len(), end);
    }

    #[test]
    fn a_tall_image_goes_vertical_first_under_pillow_13() {
        // 300x1000 -> Resize(256) is 256x853: the height shrinks by 147 rows, more than twice the
        // width's 44 columns, so Pillow 13 runs the vertical pass first.
        let mut tall = job(
            300,
            1000,
            SourcePixels::Interleaved { ptr: 0, pitch: 900 },
            0,
        );
        let plan = plan_batch(&[tall], 224, 224).expect("plan");
        let d = plan.descriptors[0];
        assert_eq!(
            (d.first.vertical, d.last.vertical, d.last.from_tmp),
            (1, 0, 1)
        );
        assert_eq!(d.tmp_height, 224, "the kept rows");
        assert!(
            d.tmp_width > 224 && d.tmp_width < 300,
            "the columns read: {}",
            d.tmp_width
        );
        tall.order = PassOrder::HorizontalFirst;
        let d = plan_batch(&[tall], 224, 224).expect("plan").descriptors[0];
        assert_eq!((d.first.vertical, d.last.vertical), (0, 1));
    }

    #[test]
    fn inconsistent_batches_are_refused() {
        let ok = job(
            500,
            375,
            SourcePixels::Interleaved {
                ptr: 0,
                pitch: 1500,
            },
            0,
        );
        let same_slot = plan_batch(&[ok, ok], 224, 224);
        assert!(matches!(
            same_slot,
            Err(BatchError::DuplicateSlot { slot: 0, .. })
        ));
        let with_pixels = |pixels| ResizeJob {
            source: SourceImage {
                pixels,
                ..ok.source
            },
            ..ok
        };
        let short_pitch = with_pixels(SourcePixels::Interleaved {
            ptr: 0,
            pitch: 1499,
        });
        assert!(matches!(
            plan_batch(&[short_pitch], 224, 224),
            Err(BatchError::Pitch { .. })
        ));
        let far = with_pixels(SourcePixels::Interleaved {
            ptr: u64::MAX - 1,
            pitch: 1500,
        });
        assert!(matches!(
            plan_batch(&[far], 224, 224),
            Err(BatchError::Address { .. })
        ));
        let wide = ResizeJob {
            x: AxisPlan {
                src_len: 501,
                ..ok.x
            },
            ..ok
        };
        assert!(matches!(
            plan_batch(&[wide], 224, 224),
            Err(BatchError::Image { index: 0, .. })
        ));
        assert!(matches!(
            plan_batch(&[ok], 200, 224),
            Err(BatchError::Image { .. })
        ));
        assert!(plan_batch(&[ok], 0, 224).is_err());
        let last = ResizeJob {
            slot: u32::MAX,
            ..ok
        };
        assert!(plan_batch(&[last], 224, 224).is_err());
    }

    #[test]
    fn a_source_holding_a_window_is_read_at_the_window_s_place() {
        let whole = job(
            500,
            375,
            SourcePixels::Interleaved {
                ptr: 1 << 30,
                pitch: 1500,
            },
            0,
        );
        let passes = crate::resample::plan_passes(&whole.x, &whole.y, whole.filter, whole.order)
            .expect("passes");
        let (columns, rows) = (passes.source_columns.clone(), passes.source_rows.clone());
        assert!(columns.start > 0 && columns.end < 500, "{columns:?}");
        let held = Window {
            x: columns.start,
            y: rows.start,
            width: columns.len() as u32,
            height: rows.len() as u32,
        };
        let pitch = held.width * 3 + 5;
        let windowed = |held: Window| ResizeJob {
            source: SourceImage {
                pixels: SourcePixels::Interleaved {
                    ptr: 1 << 20,
                    pitch,
                },
                held,
                ..whole.source
            },
            ..whole
        };
        let plan = plan_batch(&[windowed(held)], 224, 224).expect("plan");
        // The region's corner, where the image's would be: before the window, never read.
        let corner = (1u64 << 20)
            - u64::from(held.y - whole.y.src_offset) * u64::from(pitch)
            - u64::from(held.x - whole.x.src_offset) * 3;
        assert_eq!(plan.descriptors[0].src, [corner, corner + 1, corner + 2]);
        assert_eq!(plan.descriptors[0].src_pitch, [pitch; 3]);
        // The same passes as the whole image's.
        let whole_plan = plan_batch(&[whole], 224, 224).expect("plan");
        assert_eq!(plan.coefficients, whole_plan.coefficients);
        // A window a column or a row short of what the passes read is refused.
        for short in [
            Window {
                x: held.x + 1,
                width: held.width - 1,
                ..held
            },
            Window {
                height: held.height - 1,
                ..held
            },
            Window {
                x: 400,
                width: 101,
                ..held
            },
        ] {
            assert!(
                matches!(
                    plan_batch(&[windowed(short)], 224, 224),
                    Err(BatchError::Window { index: 0 })
                ),
                "{short:?}"
            );
        }
    }

    /// An interleaved RGB image of `width` x `height` at a made-up device address: the address,
    /// the host memory standing for it (sample `i` is `i * step % 251`) and its pixels.
    fn patterned_source(width: u32, height: u32, step: u32) -> (u64, Vec<u8>, SourcePixels) {
        let base = 1u64 << 20;
        let memory = (0..width * height * 3)
            .map(|i| (i * step % 251) as u8)
            .collect();
        let pixels = SourcePixels::Interleaved {
            ptr: base,
            pitch: width * 3,
        };
        (base, memory, pixels)
    }

    #[test]
    fn images_of_other_sizes_share_a_last_pass_grid_of_their_own_blocks() {
        use crate::resample::plan_passes;
        let (width, height) = (90u32, 70u32);
        let (base, memory, pixels) = patterned_source(width, height, 13);
        // Views of 40 x 40 (7 blocks of the last pass), 8 x 8 (1) and 24 x 24 (3), placed one
        // after another in units of 256 bytes.
        let sides = [40u32, 8, 24];
        let mut unit = 0;
        let mut jobs = Vec::new();
        let mut places = Vec::new();
        for (k, &side) in sides.iter().enumerate() {
            let (x, y) = torchvision_center_crop(width, height, side + 9, side, side);
            jobs.push(ResizeJob {
                source: SourceImage::whole(pixels, width, height),
                x,
                y,
                filter: Filter::Bicubic,
                order: PassOrder::ShrinkVerticalFirst,
                pad: [0; 3],
                flip: k == 1,
                slot: unit,
            });
            places.push(unit as usize * 256);
            unit += (side * side * 3).div_ceil(256);
        }
        let passes: Vec<PassPlan> = jobs
            .iter()
            .map(|j| plan_passes(&j.x, &j.y, j.filter, j.order).expect("passes"))
            .collect();
        let refs: Vec<&PassPlan> = passes.iter().collect();
        let sizes: Vec<(u32, u32)> = sides.iter().map(|&s| (s, s)).collect();
        let plan = plan_batch_placed(&jobs, &refs, &sizes, 256).expect("plan");
        let first_blocks: Vec<u32> = plan.descriptors.iter().map(|d| d.last_block0).collect();
        assert_eq!(first_blocks, [0, 7, 8]);
        assert_eq!(plan.last_pass_blocks, 11);
        assert_eq!(plan.last_pass_grid(), (11, 1));
        let mut out = vec![0x5Au8; plan.output_bytes() as usize];
        super::super::host::run_batch(&plan, &memory, base, &mut out).expect("run");
        for ((job, &side), &at) in jobs.iter().zip(&sides).zip(&places) {
            let alone = ResizeJob { slot: 0, ..*job };
            let plan = plan_batch(&[alone], side, side).expect("plan alone");
            assert_eq!(plan.last_pass_grid().1, 1);
            let mut expected = vec![0u8; (side * side * 3) as usize];
            super::super::host::run_batch(&plan, &memory, base, &mut expected).expect("run");
            assert_eq!(
                out[at..at + expected.len()],
                expected[..],
                "the {side} view"
            );
        }
    }

    #[test]
    fn outputs_placed_by_offset_land_where_placed_and_may_not_overlap() {
        use crate::resample::plan_passes;
        let (width, height) = (64u32, 48u32);
        let (base, memory, pixels) = patterned_source(width, height, 7);
        let view = |side: u32, slot: u32, flip: bool| {
            let (x, y) = torchvision_center_crop(width, height, side, side, side);
            ResizeJob {
                source: SourceImage::whole(pixels, width, height),
                x,
                y,
                filter: Filter::Bicubic,
                order: PassOrder::ShrinkVerticalFirst,
                pad: [0; 3],
                flip,
                slot,
            }
        };
        let passes_of = |jobs: &[ResizeJob]| -> Vec<PassPlan> {
            jobs.iter()
                .map(|j| plan_passes(&j.x, &j.y, j.filter, j.order).expect("passes"))
                .collect()
        };
        // A view of 16 x 16 (768 bytes, 3 units of 256) then one of 8 x 8 right after it.
        let jobs = [view(16, 0, false), view(8, 3, true)];
        let passes = passes_of(&jobs);
        let refs: Vec<&PassPlan> = passes.iter().collect();
        let plan = plan_batch_placed(&jobs, &refs, &[(16, 16), (8, 8)], 256).expect("plan");
        assert_eq!(plan.output_bytes(), 3 * 256 + 8 * 8 * 3);
        let mut out = vec![0u8; plan.output_bytes() as usize];
        super::super::host::run_batch(&plan, &memory, base, &mut out).expect("run");
        for (job, (side, at)) in jobs.iter().zip([(16usize, 0usize), (8, 768)]) {
            let alone = ResizeJob { slot: 0, ..*job };
            let plan = plan_batch(&[alone], side as u32, side as u32).expect("plan alone");
            let mut expected = vec![0u8; side * side * 3];
            super::super::host::run_batch(&plan, &memory, base, &mut expected).expect("run");
            assert_eq!(
                out[at..at + side * side * 3],
                expected[..],
                "the {side} view"
            );
        }
        // The second view placed inside the first.
        let (ok_jobs, ok_passes) = (jobs, passes.clone());
        let ok_refs: Vec<&PassPlan> = ok_passes.iter().collect();
        let jobs = [view(16, 0, false), view(8, 2, false)];
        let passes = passes_of(&jobs);
        let refs: Vec<&PassPlan> = passes.iter().collect();
        assert!(matches!(
            plan_batch_placed(&jobs, &refs, &[(16, 16), (8, 8)], 256),
            Err(BatchError::Overlap {
                first: 0,
                second: 1
            })
        ));
        // Made again into one plan, call after call, a failed call between: the same plans as
        // made fresh, and a failed one left with nothing to launch.
        let fresh = plan_batch_placed(&ok_jobs, &ok_refs, &[(16, 16), (8, 8)], 256);
        let mut reused =
            plan_batch_sized(&ok_jobs[..1], &ok_refs[..1], &[(16, 16)], 768).expect("a first plan");
        let overlap = plan_batch_placed_into(&mut reused, &jobs, &refs, &[(16, 16), (8, 8)], 256);
        assert!(overlap.is_err() && reused.descriptors.is_empty());
        let sized = [view(16, 0, false), view(16, 1, true)];
        let sized_passes = passes_of(&sized);
        let sized_refs: Vec<&PassPlan> = sized_passes.iter().collect();
        let sizes = [(16, 16); 2];
        plan_batch_sized_into(&mut reused, &sized, &sized_refs, &sizes, 768).expect("sized");
        assert_eq!(
            reused,
            plan_batch_sized(&sized, &sized_refs, &sizes, 768).expect("fresh")
        );
        plan_batch_placed_into(&mut reused, &ok_jobs, &ok_refs, &[(16, 16), (8, 8)], 256)
            .expect("placed");
        assert_eq!(Ok(reused), fresh);
    }

    #[test]
    fn an_empty_batch_plans_to_nothing() {
        let plan = plan_batch(&[], 224, 224).expect("plan");
        assert!(plan.descriptors.is_empty());
        assert_eq!((plan.first_pass_blocks, plan.slots), (0, 0));
        assert_eq!(plan.coefficients.len(), 1);
    }
}
