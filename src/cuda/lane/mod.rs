//! The GPU decode lane: baseline JPEGs decoded by the GPU's hardware JPEG engines (nvJPEG's
//! hardware backend), made RGB exactly as libjpeg-turbo makes them (`kernels/ycc.cu`), then
//! resized and cropped by `kernels/resize.cu` exactly as Pillow does, into slots of the lane's
//! device ring; a batch then gathers its images from there into its u8 device buffer, where the
//! normalize kernel takes them like the CPU lane's.
//!
//! The lane works ahead of the batches, on threads of its own ([`runner`]): the epoch's order is
//! cut into ranges of positions; a preparing thread takes the next range, reads and screens the
//! files of it the lane is offered ([`offered`]), computes each image's draws and resize
//! coefficients and cuts the images into calls ([`prepare`]); a submitting thread takes the next
//! call, decodes it on its own decoders and stream, resizes the images into their ring slots
//! ([`decoders`]) and publishes one [`LaneResult`] per position. nvJPEG's hardware decode keeps
//! the submitting thread busy on the host, so the host work that does not need the decoders is
//! done beside it rather than between its calls.
//! A batch asks for the results of its positions ([`JpegLane::result`]), waiting only for those
//! not ready yet, so the engines keep decoding while the CPU lane and the batches' hand-off run.
//! Which image goes to which lane, and which images share an `nvjpegDecodeBatched` call, depend
//! on the order, the share and the files alone, never on timing: the output is the same on every
//! run.
//!
//! The lane is opened once per pipeline; when nvJPEG, the engines or a filter are missing it is
//! not opened, and the reason says why. Its memory is sized once: the ring (a batch, the
//! lookahead and one range per preparing thread), each submitting thread's decoders and buffers
//! (grown only when a larger image arrives), and the compressed bytes of the calls being
//! prepared, waiting (one per submitting thread at most) and decoded, each at most
//! [`MAX_CALL_BYTES`].

mod decoders;
mod prepare;
mod runner;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use cudarc::driver::{
    CudaEvent, CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
};

use super::device::{upload_reusing, Gpu, KernelSource};
use super::jpeg::{inspect_markers, Checks, DecoderConfig, JpegInfo, NvJpeg, OutputFormat};
use crate::error::{Error, Result};
use crate::geometry::{CropDraw, Geometry};
use crate::options::Interpolation;
use crate::order::EpochOrder;
use crate::resample::Filter;
use crate::source::Source;

use decoders::DecoderSet;
use prepare::Preparer;
use runner::Runner;

/// Whether gray (one-component) JPEGs go to the hardware. They do, in calls of their own
/// (measured on the H100 machine: decoded in one call with colour images, some came out wrong).
const GRAY_ON_THE_GPU: bool = true;

/// Largest compressed file the lane takes (others go to the CPU lane).
const MAX_COMPRESSED: usize = 16 << 20;

/// The most compressed bytes one call takes (a larger file alone): what one call holds read.
pub(crate) const MAX_CALL_BYTES: usize = 16 << 20;

/// Host threads that submit calls to the engines, each with its own decoders and stream.
/// `nvjpegDecodeBatched` keeps its thread busy on the host for most of the call (about 45 µs an
/// image on the H100 machine) and scales poorly past two threads at once: measured there, three
/// submitting threads gave less than two.
const SUBMITTING_THREADS: usize = 2;

/// Host threads that read, screen and plan the lane's images for the submitting threads (about
/// 50 µs an image), so that those do nothing but decode, convert and resize.
const PREPARING_THREADS: usize = 3;

/// Most images per call, and about how many the lane is offered per range.
const CHUNK: usize = 32;

/// Pixels one call decodes at most (an image larger alone): what sizes each submitting thread's
/// decode buffers once.
const MAX_CALL_PIXELS: u64 = 12 << 20;

/// Side of the square image each decoder's nvJPEG pool is made ready for at open
/// (`nvjpegDecodeBatchedPreAllocate` for a call of [`CHUNK`] of them), so that typical photos
/// (ImageNet's are about 400x350, few over 1 Mpx) decode without nvJPEG allocating on the way.
const PREALLOCATE_SIDE: u32 = 1024;

/// Room for the alignment of a full call's planes in a decoder's output arena (256 bytes
/// each, three per image).
const ARENA_SLACK: usize = 1 << 20;

/// A range never spans more positions than this, however small the share.
const MAX_SPAN: usize = 4 * CHUNK;

/// Whether image `index` is offered to the GPU lane under `share` (0 to 1): a hash of the index
/// below the share, so the offered images are spread evenly and fixed by the index alone; a
/// larger share offers a superset.
pub(crate) fn offered(index: usize, share: f32) -> bool {
    let z = crate::random::Draws::new(index as u64).next();
    ((z >> 40) as f32) < share * (1u64 << 24) as f32
}

/// Positions the lanes work ahead of the batches: two batches, and at least [`MIN_LOOKAHEAD`]
/// (small batches of large images would otherwise leave the lanes waiting for the next one).
pub(crate) fn lookahead(batch_size: usize) -> usize {
    (2 * batch_size).max(MIN_LOOKAHEAD)
}

/// Slots of the lane's ring: one batch, the lookahead and one range per preparing thread.
fn ring_slots(batch_size: usize) -> usize {
    batch_size + lookahead(batch_size) + PREPARING_THREADS * MAX_SPAN
}

/// The fewest positions the lanes work ahead.
const MIN_LOOKAHEAD: usize = 256;

/// Positions per range under `share`: about [`CHUNK`] offered images each.
fn span(share: f32) -> usize {
    if share <= 0.0 {
        return MAX_SPAN;
    }
    ((CHUNK as f32 / share).floor() as usize).clamp(1, MAX_SPAN)
}

/// Why the GPU lane is off, in words (for the pipeline's device description).
pub(crate) type LaneUnavailable = String;

/// What the lane needs to know when it opens.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LaneConfig {
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
}

/// The work of one epoch: the order's positions, the files behind them and the share.
#[derive(Clone)]
pub(crate) struct LaneWork {
    pub source: Arc<Source>,
    pub order: Arc<EpochOrder>,
    pub share: f32,
    pub epoch: u64,
    /// Called from the lane's threads with each offered position the engines do not take, as
    /// soon as that is known.
    pub refused: Option<Arc<dyn Fn(usize) + Send + Sync>>,
}

/// An image the lane made: its output in a slot of the ring, and its random draws.
#[derive(Debug, Clone)]
pub(crate) struct LaneOutput {
    slot: u32,
    /// Recorded on the stream that wrote the slot, after the write.
    ready: Arc<CudaEvent>,
    /// What the random transforms drew for it.
    pub draw: Option<CropDraw>,
}

/// What became of an offered position.
#[derive(Debug, Clone)]
pub(crate) enum LaneResult {
    /// Decoded and resized into a slot of the ring.
    Decoded(LaneOutput),
    /// Not for the engines (not a baseline JPEG, too large, unreadable, refused or failed):
    /// the CPU lane takes it, and reports any problem with it.
    Refused,
}

/// Which files the GPU lane's decoders take: their marker checks, callable from any thread.
#[derive(Debug, Clone)]
pub(crate) struct LaneScreen {
    /// The decoders' checks and limits, taking colour files and (when the lane has a gray
    /// decoder) gray ones: one marker walk says which decoder a file goes to.
    checks: DecoderConfig,
    exif_orientation: bool,
}

/// A file the lane takes: its header facts and which decoder it goes to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Screened {
    info: JpegInfo,
    gray: bool,
}

impl LaneScreen {
    /// Whether the hardware decodes `jpeg` (its markers read; microseconds, no GPU work), and how.
    pub fn take(&self, jpeg: &[u8]) -> Option<Screened> {
        if jpeg.len() > MAX_COMPRESSED {
            return None;
        }
        let info = inspect_markers(&self.checks, jpeg).ok()?;
        let screened = Screened {
            info,
            gray: info.components == 1,
        };
        // An image the EXIF tag may turn is left to the CPU lane, which turns it.
        (!(self.exif_orientation && screened.info.exif)).then_some(screened)
    }
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
pub(crate) struct JpegLane {
    runner: Runner,
    gather: CudaFunction,
    gather_descriptors: Option<CudaSlice<GatherDescriptor>>,
    image_bytes: usize,
    description: String,
}

impl std::fmt::Debug for JpegLane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JpegLane")
            .field("description", &self.description)
            .finish_non_exhaustive()
    }
}

/// Threads per block of the gather.
const GATHER_THREADS: u32 = 256;

impl JpegLane {
    /// Opens the lane on `gpu` (its decoders initialized and warmed up, its threads started);
    /// `Err` says why it cannot run here.
    pub fn open(gpu: &Gpu, config: &LaneConfig) -> std::result::Result<JpegLane, LaneUnavailable> {
        JpegLane::open_for(gpu, config, GRAY_ON_THE_GPU)
    }

    /// [`JpegLane::open`], saying whether gray JPEGs go to the hardware.
    fn open_for(
        gpu: &Gpu,
        config: &LaneConfig,
        gray: bool,
    ) -> std::result::Result<JpegLane, LaneUnavailable> {
        let geometry = config.geometry;
        let filter = match geometry.interpolation {
            Interpolation::Bilinear => Filter::Bilinear,
            Interpolation::Bicubic => Filter::Bicubic,
            Interpolation::Lanczos => Filter::Lanczos,
            other => return Err(format!("the {other} filter has no GPU resize")),
        };
        let nvjpeg = NvJpeg::load().map_err(|e| format!("nvJPEG could not be loaded: {e}"))?;
        let colour = DecoderConfig {
            max_batch: CHUNK,
            checks: Checks::Markers,
            output: OutputFormat::Yuv,
            gray: false,
            max_image_pixels: config.max_pixels,
            preallocate: Some((PREALLOCATE_SIDE, PREALLOCATE_SIDE)),
            // A full call's Y, Cb and Cr planes at most (4:4:4), with the planes' alignment, so
            // the arena is sized once.
            initial_output_bytes: 3 * MAX_CALL_PIXELS as usize + ARENA_SLACK,
            ..DecoderConfig::default()
        };
        let gray_config = gray.then(|| DecoderConfig {
            output: OutputFormat::Y,
            gray: true,
            colour: false,
            initial_output_bytes: MAX_CALL_PIXELS as usize + ARENA_SLACK,
            ..colour.clone()
        });
        let screen = LaneScreen {
            checks: DecoderConfig {
                gray: gray_config.is_some(),
                ..colour.clone()
            },
            exif_orientation: config.exif_orientation,
        };
        let module = gpu
            .module(&KernelSource {
                name: "resize.cu",
                code: super::resize::SOURCE,
                defines: Vec::new(),
            })
            .map_err(|e| format!("the GPU resize kernel: {e}"))?;
        let gather = module
            .load_function("gpufeed_gather")
            .map_err(|e| format!("the gather kernel: {e}"))?;
        let mut sets = Vec::with_capacity(SUBMITTING_THREADS);
        for _ in 0..SUBMITTING_THREADS {
            sets.push(DecoderSet::open(
                gpu,
                &nvjpeg,
                &module,
                &colour,
                gray_config.as_ref(),
                geometry,
                filter,
            )?);
        }
        let engines = sets[0].engines().map_or(String::new(), |(engines, cores)| {
            format!(", {engines} JPEG engines x {cores}")
        });
        let image_bytes = geometry.image_bytes();
        let lookahead = lookahead(config.batch_size);
        let slots = ring_slots(config.batch_size);
        let preparers = (0..PREPARING_THREADS)
            .map(|_| Preparer::new(geometry, filter))
            .collect();
        let runner = Runner::start(
            gpu,
            sets,
            preparers,
            screen,
            runner::Limits {
                slots,
                image_bytes,
                lookahead,
                max_file_bytes: config.max_file_bytes,
                queued_calls: SUBMITTING_THREADS,
            },
        )?;
        let (major, minor, patch) = nvjpeg.version();
        Ok(JpegLane {
            runner,
            gather,
            gather_descriptors: None,
            image_bytes,
            description: format!("nvJPEG {major}.{minor}.{patch} hardware decoder{engines}"),
        })
    }

    /// Bytes of device memory the lane takes for `config` (before opening it): its ring, and
    /// each thread's decode, colour and resize buffers.
    pub fn device_bytes(config: &LaneConfig) -> u128 {
        let slots = ring_slots(config.batch_size);
        let per_thread = 6 * MAX_CALL_PIXELS as u128;
        slots as u128 * config.geometry.image_bytes() as u128
            + SUBMITTING_THREADS as u128 * per_thread
    }

    /// Host threads that submit the lane's images to the engines.
    pub fn submitting_threads(&self) -> usize {
        self.runner.threads()
    }

    /// The lane in words.
    pub fn describe(&self) -> &str {
        &self.description
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

/// Makes `stream` wait for the work that made each of `outputs` (each event once).
fn wait_for_all<'a>(
    stream: &Arc<CudaStream>,
    outputs: impl Iterator<Item = &'a LaneOutput>,
) -> Result<()> {
    let mut waited: Vec<*const CudaEvent> = Vec::new();
    for output in outputs {
        let event = Arc::as_ptr(&output.ready);
        if !waited.contains(&event) {
            stream
                .wait(&output.ready)
                .map_err(|e| Error::cuda("waiting for the GPU lane's images", e))?;
            waited.push(event);
        }
    }
    Ok(())
}
