//! The GPU decode lane: baseline JPEGs decoded by the GPU's hardware JPEG engines (nvJPEG's
//! hardware backend), made RGB exactly as libjpeg-turbo makes them (`kernels/ycc.cu`), then
//! resized and cropped by `kernels/resize.cu` exactly as Pillow does, into slots of the lane's
//! device ring; a batch then gathers its images from there into its u8 device buffer, where the
//! normalize kernel takes them like the CPU lane's.
//!
//! The lane works ahead of the batches, on threads of its own ([`runner`], sharing [`shared`]): the
//! epoch's order is cut into ranges of positions; a preparing thread takes the next range, reads
//! and screens ([`screen`]) the files of it the lane is offered ([`offered`](crate::schedule::ShareSchedule::offers)),
//! computes each image's draws and resize coefficients and cuts the images into calls ([`prepare`],
//! [`call`]); a submitting thread takes the next call, decodes it on its own decoders ([`nvjpeg`])
//! and stream, makes it RGB ([`ycc`]), resizes the images into their ring slots ([`crate::cuda::resize`],
//! [`decoders`]) and publishes one [`LaneResult`] per position. nvJPEG's hardware decode keeps the
//! submitting thread busy on the host, so the host work that does not need the decoders is done
//! beside it rather than between its calls. A batch asks for the results of its positions
//! ([`GpuLane::result`]), waiting only for those not ready yet, so the engines keep decoding while
//! the CPU lane and the batches' hand-off run. Which image goes to which lane, and which images
//! share an `nvjpegDecodeBatched` call, depend on the order, the share and the files alone, never
//! on timing: the output is the same on every run. The one exception is a lane opened beside a
//! pipeline already making batches (automatic decoding, whose share follows the lanes' rates
//! anyway): it starts with its assisted path's first decoder set (20-80 ms; the other sets join
//! from a thread of their own a few tenths of a second later), while its engines open on a thread
//! of their own (a second or two; not at all in a run too short to repay them, nor for an epoch of
//! large files the assisted path takes), and until they join the assisted path takes every file it
//! can parse, whatever its size.
//!
//! The lane is opened once per pipeline; when nvJPEG, the engines or a filter are missing it is
//! not opened, and the reason says why. Its memory is sized once: the ring (a batch, the
//! lookahead and one range per preparing thread), each submitting thread's decoders and buffers
//! (grown only when a larger image arrives), and the compressed bytes of the calls being
//! prepared, waiting (one per submitting thread at most) and decoded, each at most
//! [`call::MAX_CALL_BYTES`] (an engines' call of large files: [`call::EngineCalls`]).

mod assisted;
mod call;
mod coefficient_threads;
mod decoders;
mod error;
pub(crate) mod nvjpeg;
mod open;
mod prepare;

mod runner;
mod screen;
mod shared;
#[cfg(test)]
mod tests;
mod work;
pub(crate) mod ycc;

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
};

use crate::cuda::{upload_reusing, Gpu};
use crate::error::{Error, Result};
use crate::geometry::Geometry;
use crate::memory::MemoryBudget;
use crate::profile::Stopwatch;
use crate::resample::Resampling;
#[cfg(test)]
use crate::schedule::EnginesOpen;
use crate::schedule::{LaneActivity, GPU_LANE_HOST_THREADS};
use crate::views::LaneViews;
use call::{EngineCalls, ENGINE_THREADS, MAX_CALL_PIXELS};
use coefficient_threads::CoefficientThreads;
use decoders::{DecoderSet, EngineDecoders};
use nvjpeg::{DecoderConfig, NvJpeg, OutputFormat, Staging};
use open::{engine_count, engines_note, later_sets_note, opening_note, GrayDecoders, Joining};
use prepare::{small_files_assisted_share, Preparer};
use runner::Runner;
use screen::LaneScreen;
use work::wait_for_all;

pub use error::GpuLaneError;
pub use nvjpeg::{NvjpegError, NvjpegStatus, NvjpegUnavailable};
pub(crate) use work::{LaneOutput, LaneResult, LaneWork, MAX_SPAN};

/// Whether gray (one-component) JPEGs go to the hardware. They do, in calls of their own
/// (measured on the H100 machine: decoded in one call with colour images, some came out wrong).
const GRAY_ON_THE_GPU: bool = true;

/// Host threads that read, screen and plan the lane's images for the submitting threads (80-110
/// µs an image on the H200 machine, a third to a half of it the resize coefficients), so that
/// those do nothing but decode, convert and resize. With three they were 2.6-2.9 of 3 busy and set the
/// lane's pace; measured on the H200 machine (16 cores, 8,192 ImageNet-sized files, 5 epochs from
/// process start, in turn on one start, three rounds): three 33,400-36,500 images/s, five
/// 39,500-39,800, seven 33,300-36,200, nine 23,100-31,300; with Qwen2-VL's patches
/// (`max_pixels` 50,176) 30,000-30,700, 32,800-33,200, 28,600-33,700 and 22,900-26,900.
const PREPARING_THREADS: usize = 5;

/// Host threads that submit calls to the assisted path ([`assisted`]), each with its own decoder
/// and stream: each waits for its call's entropy decode before the resize, so several keep the
/// GPU busy. Measured on the H200 machine with camera photos: 1,130-1,140 images/s with one,
/// 1,560 with two, 1,740-1,910 with three, 1,800-1,910 with four; on a later build, in turn in
/// one run, four gave 2,104-2,123 against three's 1,883-1,895 (the GPU's cores 90-95% busy
/// either way). On small files beside the engines (the GPU lane alone, 8,192 ImageNet-sized
/// files, half of them on the assisted path, in turn on one start): three 32,500 images/s, four
/// 34,400-34,900, six 35,000-35,300.
/// Each holds about 1.15 GB of device memory (about 300 MB in a lane for small files,
/// [`assisted::call_pixels`]).
const ASSISTED_THREADS: usize = 4;

/// Submitting threads of the assisted path in a lane of small files (ImageNet-sized: the epoch's
/// files under 192 KB on average, [`GpuLaneConfig::large_files`]). A thread's calls follow one
/// another on its stream (it waits for a call's entropy decode, and the next call's decode
/// comes after the resize), so more of them side by side keep the GPU busier. Measured on the
/// H200 machine (16 cores, 8,192 ImageNet-sized files, 16 epochs from process start, in turn on
/// one start, two rounds): four 37,792 and 36,098 images/s with `Resize(256)` + `CenterCrop(224)`,
/// eight 43,200 and 42,898; the training crops 36,265 and 36,616 against 42,459 and 42,052;
/// Qwen2-VL's patches 33,129 and 32,377 against 37,809 and 39,976; DINOv2's views 17,089 and
/// 17,143 against 16,570 and 16,637 (0.97x). A small-file call holds 16 Mpx, so eight hold
/// less device memory than four of a lane of large files ([`GpuLane::device_bytes`] counts
/// those). The four beyond [`ASSISTED_THREADS`] wait on the GPU nearly all the time: the
/// schedule counts the lane's cores without them ([`GPU_LANE_HOST_THREADS`]).
const SMALL_FILES_ASSISTED_THREADS: usize = 8;

// The lane's host threads (the preparing threads, the assisted path's submitting threads and
// the engines') are as many as the schedule counts on when it leaves them their cores.
const _: () =
    assert!(PREPARING_THREADS + ASSISTED_THREADS + ENGINE_THREADS == GPU_LANE_HOST_THREADS);

/// Side of the square image each decoder's nvJPEG pool is made ready for at open
/// (`nvjpegDecodeBatchedPreAllocate` for a call's most images), so that typical photos
/// (ImageNet's are about 400x350, few over 1 Mpx) decode without nvJPEG allocating on the way.
const PREALLOCATE_SIDE: u32 = 1024;

/// Room for the alignment of a full call's planes in a decoder's output arena (256 bytes
/// each, three per image).
const ARENA_SLACK: usize = 1 << 20;

/// Positions the lanes work ahead of the batches: two batches, and at least [`MIN_LOOKAHEAD`]
/// (small batches of large images would otherwise leave the lanes waiting for the next one).
pub(crate) fn lookahead(batch_size: usize) -> usize {
    (2 * batch_size).max(MIN_LOOKAHEAD)
}

/// Slots of the lane's ring: one batch, the lookahead and one range per preparing thread (the
/// lane's and `extra_preparing` more); a server's lane ([`GpuLaneConfig::requests`]) holds one
/// request's images, its most.
fn ring_slots(batch_size: usize, requests: bool, extra_preparing: usize) -> usize {
    match requests {
        true => batch_size.max(1),
        false => {
            let preparing = PREPARING_THREADS + extra_preparing;
            batch_size + lookahead(batch_size) + preparing * MAX_SPAN
        }
    }
}

/// Positions the lane works past the batches' cursor: [`lookahead`], or for a server's lane
/// its request's images (a request is all the work it is given).
fn lane_lookahead(batch_size: usize, requests: bool) -> usize {
    match requests {
        true => batch_size.max(1),
        false => lookahead(batch_size),
    }
}

/// The fewest positions the lanes work ahead.
const MIN_LOOKAHEAD: usize = 256;

impl GpuLaneConfig {
    /// Bytes of one slot of the ring: an output image, or the record of an image's views.
    pub fn image_bytes(&self) -> usize {
        crate::views::lane_output_bytes(self.views.as_deref(), &self.geometry)
    }
}

/// What the lane needs to know when it opens.
#[derive(Debug, Clone)]
pub(crate) struct GpuLaneConfig {
    /// Where the lane's threads' times go.
    pub stopwatch: Arc<Stopwatch>,
    /// The output geometry.
    pub geometry: Geometry,
    /// Images claiming more pixels are left to the CPU lane.
    pub max_pixels: u64,
    /// Images per batch: the ring holds one batch besides the lookahead.
    pub batch_size: usize,
    /// Files larger than this are left to the CPU lane (which reports them).
    pub max_file_bytes: u64,
    /// Whether EXIF orientation is applied: the lane then leaves files with an Exif segment
    /// to the CPU lane, which turns them.
    pub exif_orientation: bool,
    /// Of the large baseline images, the share the assisted path takes (0: none, the engines
    /// take them all).
    pub assisted_share: f32,
    /// Whether the epoch's files are large on average (192 KB or more: camera photos): the
    /// calls of both paths are then cut for them ([`EngineCalls::for_files`],
    /// [`assisted::call_pixels`]).
    pub large_files: bool,
    /// Whether the assisted path takes its share of the files under 1 Mpx beside the engines
    /// ([`prepare::SMALL_FILES_ASSISTED_SHARE`]): unless a share below 1 is given, where the CPU
    /// lane's fixed part sets the pace and the assisted path's host work would slow it.
    pub small_files_assisted: bool,
    /// Threads that decode progressive files' coefficients for the assisted path: the CPU
    /// lane's count beside the GPU lane (the cores less those left to the lane's host threads,
    /// or the count given), as they do the work the CPU lane's threads would do otherwise.
    pub coefficient_threads: usize,
    /// The decode memory budget the coefficient threads reserve their decodes from: the CPU
    /// lane's, as they do its work.
    pub decode_memory: Arc<MemoryBudget>,
    /// Whether the lane serves requests of at most `batch_size` images, one at a time (a
    /// [`crate::PatchServer`]'s): each request is all its work, so its ring holds one
    /// request's images and it looks no further ahead.
    pub requests: bool,
    /// A pipeline of views: the lane makes each image's views, as one record a slot
    /// ([`crate::views::ViewLayout::record_bytes`]), instead of one output image.
    pub views: Option<Arc<LaneViews>>,
    /// Preparing threads beside the lane's own [`PREPARING_THREADS`] (a pipeline of views plans
    /// about ten resizes an image: the schedule's `GpuRun::extra_preparing_threads`).
    pub extra_preparing_threads: usize,
}

/// `struct GfGather` of kernels/resize.cu: one image copied from the ring into a batch.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct GatherDescriptor {
    /// Address of the image in the ring.
    src: u64,
    /// Byte offset of its place in the batch buffer.
    dst: u64,
}

// SAFETY: `GatherDescriptor` is `repr(C)` plain old data (two u64, 16 bytes, no padding) laid out
// as the kernel's `GfGather`, so its bytes can be copied to the device as they are.
unsafe impl DeviceRepr for GatherDescriptor {}

/// The hardware decoders, their threads and ring, and the gather of a batch's images.
pub(crate) struct GpuLane {
    runner: Runner,
    gather: CudaFunction,
    gather_descriptors: Option<CudaSlice<GatherDescriptor>>,
    image_bytes: usize,
    /// The JPEG engines: open with the lane, opening beside it, or off.
    engines: Joining<DecoderSet>,
    /// Their gray decoders, made beside the lane after the engines' sets (dropped after
    /// `engines`, whose opening thread hands them their orders).
    gray_decoders: GrayDecoders,
    /// The assisted path's sets after its first, opening beside the lane's first batches.
    later_sets: Joining<DecoderSet>,
    description: String,
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl std::fmt::Debug for GpuLane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuLane")
            .field("description", &self.description)
            .finish_non_exhaustive()
    }
}

/// Threads per block of the gather.
const GATHER_THREADS: u32 = 256;

impl GpuLane {
    /// Takes in what opened beside the lane since the last call, each decoder set as soon as it
    /// is ready: the assisted path's later decoders and the JPEG engines' (or takes note that
    /// they could not open: the engines' images then stay with the CPU lane, and the assisted
    /// path goes on). Whether any of the engines' sets joined, or they were found off, now.
    pub fn poll_opening(&mut self) -> bool {
        self.settle(false)
    }

    /// Waits for what is still opening beside the lane and takes it in (or takes note that it
    /// could not open), the engines' gray decoders too: from then on which path an image takes
    /// depends on the files alone.
    pub fn wait_until_open(&mut self) {
        self.settle(true);
        self.gray_decoders.wait();
    }

    /// Takes in the assisted path's later sets and the engines' that have come (with `wait`,
    /// waiting for all of them): their threads started, or off. Whether any of the engines'
    /// sets joined, or they were found off, now.
    fn settle(&mut self, wait: bool) -> bool {
        let runner = &mut self.runner;
        self.later_sets.settle(wait, |sets, arrivals, waited| {
            runner.add_sets(sets)?;
            Ok(format!(
                "the assisted path's other {} decoders at work {:.0} ms after the lane opened",
                arrivals.joined,
                ms(waited)
            ))
        });
        self.engines.settle(wait, |sets, arrivals, waited| {
            let count = engine_count(&sets).unwrap_or_else(|| "the JPEG engines".into());
            let opening = opening_note(&sets);
            runner.add_sets(sets)?;
            let first = arrivals.first.unwrap_or(waited);
            let all = match arrivals.expected {
                1 => String::new(),
                n => format!(", the last of their {n} decoder sets {:.0} ms", ms(waited)),
            };
            Ok(format!(
                "{count} joined {:.0} ms after the lane opened{all}{opening}",
                ms(first)
            ))
        })
    }

    /// How busy the lane has been since it opened: what it decoded and refused, and its
    /// threads' working time.
    pub fn activity(&self) -> LaneActivity {
        self.runner.activity()
    }

    /// Bytes of device memory a lane takes for outputs of `image_bytes` each (an image, or the
    /// record of an image's views) in batches of `batch_size` (before opening it, the epoch's
    /// files unknown; `requests`: a server's lane, [`GpuLaneConfig::requests`]; with
    /// `extra_preparing` preparing threads more than its own): its ring, and each thread's
    /// decode, colour and resize buffers, at most (those of an epoch of large files).
    pub fn device_bytes(
        image_bytes: usize,
        batch_size: usize,
        requests: bool,
        extra_preparing: usize,
    ) -> u128 {
        let slots = ring_slots(batch_size, requests, extra_preparing);
        let engines = |large_files| {
            let calls = EngineCalls::for_files(large_files);
            calls.threads as u128 * calls.device_bytes() as u128
        };
        let engines = engines(false).max(engines(true));
        slots as u128 * image_bytes as u128
            + engines
            + ASSISTED_THREADS as u128 * assisted::budget(MAX_CALL_PIXELS).device_bytes() as u128
    }

    /// Whether the JPEG engines take none of the lane's images (never opened, or off), so that
    /// its assisted path decodes every image it takes.
    pub fn engines_closed(&self) -> bool {
        matches!(self.engines, Joining::Off(_))
    }

    /// The lane in words: how it opened, what joined it later, and its calls that failed (their
    /// images decoded by the CPU lane), if any.
    pub fn describe(&self) -> String {
        [
            later_sets_note(&self.later_sets),
            engines_note(&self.engines),
            self.runner.failed_calls_note(),
        ]
        .into_iter()
        .flatten()
        .fold(self.description.clone(), |description, note| {
            format!("{description}; {note}")
        })
    }

    /// Starts `work` (a new epoch, or a measurement), dropping whatever was made for earlier
    /// work: its slots are reused once `stream` (the pipeline's) is past every use of them.
    pub fn begin(&mut self, stream: &Arc<CudaStream>, work: LaneWork) -> Result<()> {
        self.runner.begin(stream, work)
    }

    /// The positions before `position` are taken: the lane may work up to its lookahead past it.
    pub fn advance(&self, position: usize) {
        self.runner.advance(position);
    }

    /// The result of the offered position `position` of the current work, waiting for it.
    pub fn result(&self, position: usize) -> LaneResult {
        self.runner.result(position)
    }

    /// Queues on `stream` the copy of each output into its place of `out` (u8 RGB HWC images,
    /// one after another), after the work that made them.
    pub fn gather(
        &mut self,
        stream: &Arc<CudaStream>,
        outputs: &[(LaneOutput, usize)],
        out: &mut CudaSlice<u8>,
    ) -> Result<()> {
        if outputs.is_empty() {
            return Ok(());
        }
        let needed = outputs
            .iter()
            .map(|(_, place)| (place + 1) * self.image_bytes)
            .max()
            .unwrap_or(0);
        if needed > out.len() {
            return Err(Error::Mismatch(format!(
                "a batch buffer of {} bytes for images up to byte {needed}",
                out.len()
            )));
        }
        wait_for_all(stream, outputs.iter().map(|(output, _)| output))?;
        let ring = self.runner.ring_address();
        let descriptors: Vec<GatherDescriptor> = outputs
            .iter()
            .map(|(output, place)| GatherDescriptor {
                src: ring + output.slot as u64 * self.image_bytes as u64,
                dst: (place * self.image_bytes) as u64,
            })
            .collect();
        let device = upload_reusing(stream, &descriptors, &mut self.gather_descriptors)
            .map_err(|e| Error::cuda("uploading the gather's descriptors", e))?;
        let bytes = self.image_bytes as u64;
        let blocks = self
            .image_bytes
            .div_ceil(16 * GATHER_THREADS as usize)
            .clamp(1, 64) as u32;
        let config = LaunchConfig {
            grid_dim: (blocks, descriptors.len() as u32, 1),
            block_dim: (GATHER_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut builder = stream.launch_builder(&self.gather);
        builder.arg(device).arg(out).arg(&bytes);
        // SAFETY: the descriptor array holds one entry per image of the grid's y; each source is
        // a slot of the ring (alive while the lane is, not rewritten before the pipeline's
        // stream is past this gather: `release`), made by work this stream waited for above;
        // each destination lies inside `out` (checked above); the kernel copies `bytes` bytes
        // per image and nothing else.
        unsafe { builder.launch(config) }
            .map(|_| ())
            .map_err(|e| Error::cuda("launching the gather", e))
    }

    /// Gives back outputs no batch takes, once `stream` (the pipeline's) is past the work that
    /// made them.
    pub fn discard(&self, stream: &Arc<CudaStream>, outputs: Vec<LaneOutput>) -> Result<()> {
        wait_for_all(stream, outputs.iter())?;
        self.runner.release(stream, outputs)
    }

    /// Gives the slots of `outputs` back to the lane once `stream` (the pipeline's) is past
    /// every use of them queued so far.
    pub fn release(
        &self,
        stream: &Arc<CudaStream>,
        outputs: impl IntoIterator<Item = LaneOutput>,
    ) -> Result<()> {
        self.runner.release(stream, outputs)
    }
}
