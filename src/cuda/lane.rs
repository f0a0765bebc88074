//! The GPU decode lane: baseline JPEGs decoded by the GPU's hardware JPEG engines (nvJPEG's
//! hardware backend), then resized and cropped by `kernels/resize.cu` exactly as Pillow does
//! (its 8-bit fixed-point resampling, given the same decoded pixels), into their slots of the
//! batch's u8 device buffer, where the normalize kernel takes them like the CPU lane's.
//!
//! The lane is opened once per pipeline; when nvJPEG, the engines or a filter are missing it is
//! not opened, and the reason says why. Its buffers (pinned staging for the compressed bytes,
//! the decode arena, the resize plan) are sized once and grown only when a larger batch or image
//! arrives, with caps.

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DevicePtrMut};

use super::device::{Gpu, KernelSource};
use super::jpeg::{
    inspect_markers, Checks, DecodedImage, DecoderConfig, HardwareDecoder, JpegInfo, NvJpeg,
    Outcome, OutputFormat, Subsampling,
};
use super::resize::plan::{plan_batch, BatchPlan, ResizeJob, SourceImage, SourcePixels};
use super::resize::{BatchResizer, DevicePlan};
use super::ycc::{ChromaSampling, YccConverter, YccJob};
use crate::error::{Error, Result};
use crate::geometry::Geometry;
use crate::options::{Interpolation, ResizeMode};
use crate::pillow::{Filter, PassOrder};

/// Whether gray (one-component) JPEGs go to the hardware. They do, in batches of their own
/// (measured on the H100 machine: decoded in one batch with colour images, some came out wrong).
const GRAY_ON_THE_GPU: bool = true;

/// Largest compressed file the lane stages (others go to the CPU lane).
const MAX_COMPRESSED: usize = 64 << 20;

/// The hardware decoders and the batched colour conversion and resize of one pipeline.
pub(crate) struct JpegLane {
    /// Which files the decoders take.
    screen: LaneScreen,
    /// The decoders, each set fed from its own host thread.
    sets: Vec<DecoderSet>,
    resizer: BatchResizer,
    /// Recorded on the pipeline's stream after the last resize, which read the sets' buffers:
    /// the sets' streams wait for it before decoding into them again.
    resized: CudaEvent,
    plan: Option<DevicePlan>,
    geometry: Geometry,
    filter: Filter,
    description: String,
}

/// How many host threads submit a batch's images to the engines, each with its own decoders:
/// `nvjpegDecodeBatched` spends tens of microseconds of host time per image (parsing it), so one
/// thread cannot keep the engines busy.
const SUBMITTING_THREADS: usize = 2;

/// Images per `nvjpegDecodeBatched`: every call is padded to this many, so the decoders are
/// initialized once, when the lane opens.
const CHUNK: usize = 32;

/// The hardware decoders one host thread submits to, with the colour conversion of their output.
struct DecoderSet {
    /// The set's own stream: nvJPEG waits on the stream it decodes on, which must not hold the
    /// pipeline's other work nor the other set's.
    stream: Arc<CudaStream>,
    /// Recorded on `stream` after the set's last decode and colour conversion.
    decoded: CudaEvent,
    /// Colour JPEGs, decoded to their Y, Cb and Cr planes as stored.
    colour: HardwareDecoder,
    /// Gray JPEGs, decoded to their Y plane, in batches of their own.
    gray: Option<HardwareDecoder>,
    ycc: YccConverter,
    /// The RGB of the last batch's colour images.
    rgb: Option<CudaSlice<u8>>,
}

impl std::fmt::Debug for JpegLane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JpegLane")
            .field("description", &self.description)
            .finish_non_exhaustive()
    }
}

/// Why the GPU lane is off, in words (for the pipeline's device description).
pub(crate) type LaneUnavailable = String;

/// A decoded image of the lane's last submitted batch: its pixels in device memory.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LaneImage {
    source: SourceImage,
}

/// Which files the GPU lane's decoders take: their marker checks, callable from any thread.
#[derive(Debug, Clone)]
pub(crate) struct LaneScreen {
    colour: DecoderConfig,
    gray: Option<DecoderConfig>,
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
        if let Ok(info) = inspect_markers(&self.colour, jpeg) {
            return Some(Screened { info, gray: false });
        }
        let gray = self.gray.as_ref()?;
        inspect_markers(gray, jpeg)
            .ok()
            .map(|info| Screened { info, gray: true })
    }
}

impl JpegLane {
    /// Opens the lane on `gpu` for images of at most `max_pixels` pixels, resized as `geometry`
    /// says (its decoders initialized and warmed up); `Err` says why it cannot run here.
    pub fn open(
        gpu: &Gpu,
        geometry: &Geometry,
        max_pixels: u64,
    ) -> std::result::Result<JpegLane, LaneUnavailable> {
        JpegLane::open_for(gpu, geometry, max_pixels, GRAY_ON_THE_GPU)
    }

    /// [`JpegLane::open`], saying whether gray JPEGs go to the hardware.
    fn open_for(
        gpu: &Gpu,
        geometry: &Geometry,
        max_pixels: u64,
        gray: bool,
    ) -> std::result::Result<JpegLane, LaneUnavailable> {
        let filter = match geometry.interpolation {
            Interpolation::Bilinear => Filter::Bilinear,
            Interpolation::Bicubic => Filter::Bicubic,
            Interpolation::Lanczos => Filter::Lanczos,
            other => return Err(format!("the {other} filter has no GPU resize")),
        };
        let nvjpeg = NvJpeg::load().map_err(|e| format!("nvJPEG could not be loaded: {e}"))?;
        let config = DecoderConfig {
            max_batch: CHUNK,
            pad_chunks: true,
            checks: Checks::Markers,
            output: OutputFormat::Yuv,
            gray: false,
            max_image_pixels: max_pixels,
            ..DecoderConfig::default()
        };
        let unavailable =
            |e: super::jpeg::Error| format!("the hardware JPEG decoder is not available: {e}");
        let gray_config = gray.then(|| DecoderConfig {
            output: OutputFormat::Y,
            gray: true,
            colour: false,
            ..config.clone()
        });
        let mut sets = Vec::with_capacity(SUBMITTING_THREADS);
        let open = |config: &DecoderConfig| {
            let mut decoder =
                HardwareDecoder::new(&nvjpeg, gpu.stream(), config.clone()).map_err(unavailable)?;
            decoder.warm_up(gpu.stream()).map_err(unavailable)?;
            Ok::<_, LaneUnavailable>(decoder)
        };
        for _ in 0..SUBMITTING_THREADS {
            let colour = open(&config)?;
            let gray = match &gray_config {
                Some(config) => Some(open(config)?),
                None => None,
            };
            let ycc =
                YccConverter::new(gpu).map_err(|e| format!("the colour conversion kernel: {e}"))?;
            let cuda = |e: cudarc::driver::DriverError| format!("a CUDA stream for the lane: {e}");
            let stream = gpu.stream().context().new_stream().map_err(cuda)?;
            let decoded = stream.record_event(None).map_err(cuda)?;
            sets.push(DecoderSet {
                stream,
                decoded,
                colour,
                gray,
                ycc,
                rgb: None,
            });
        }
        let screen = LaneScreen {
            colour: config,
            gray: gray_config,
        };
        let engines = sets[0]
            .colour
            .engines()
            .map_or(String::new(), |(engines, cores)| {
                format!(", {engines} JPEG engines x {cores}")
            });
        let module = gpu
            .module(&KernelSource {
                name: "resize.cu",
                code: super::resize::SOURCE,
                defines: Vec::new(),
            })
            .map_err(|e| format!("the GPU resize kernel: {e}"))?;
        let resizer = BatchResizer::from_module(&module)
            .map_err(|e| format!("the GPU resize kernel: {e}"))?;
        let (major, minor, patch) = nvjpeg.version();
        let resized = gpu
            .stream()
            .record_event(None)
            .map_err(|e| format!("a CUDA event for the lane: {e}"))?;
        Ok(JpegLane {
            screen,
            sets,
            resizer,
            resized,
            plan: None,
            geometry: *geometry,
            filter,
            description: format!("nvJPEG {major}.{minor}.{patch} hardware decoder{engines}"),
        })
    }

    /// Host threads that submit the lane's images to the engines.
    pub fn submitting_threads(&self) -> usize {
        self.sets.len()
    }

    /// The lane in words.
    pub fn describe(&self) -> &str {
        &self.description
    }

    /// Which files the lane takes (shareable with the CPU lane's threads, to screen files in
    /// parallel).
    pub fn screen(&self) -> &LaneScreen {
        &self.screen
    }

    /// Queues the decode of `jpegs`, each screened by [`LaneScreen::take`], on `stream` (colour
    /// and gray ones in batches of their own, colour made RGB as libjpeg makes it), split in
    /// contiguous parts among the submitting threads; `None` for an image the hardware refuses
    /// or whose part failed (it goes to the CPU lane). The pixels are valid until the next call.
    pub fn decode(
        &mut self,
        stream: &Arc<CudaStream>,
        jpegs: &[(&[u8], Screened)],
    ) -> Vec<Option<LaneImage>> {
        let part = jpegs.len().div_ceil(self.sets.len()).max(1);
        let mut images: Vec<Option<LaneImage>> = vec![None; jpegs.len()];
        let resized = &self.resized;
        // Each part on its set's stream, after the last resize read the set's buffers; `Some` when
        // its work was queued.
        let run =
            |set: &mut DecoderSet, jpegs: &[(&[u8], Screened)], out: &mut [Option<LaneImage>]| {
                set.stream.wait(resized).ok()?;
                let decoded = set.decode(jpegs);
                set.decoded.record(&set.stream).ok()?;
                out.copy_from_slice(&decoded.ok()?);
                Some(())
            };
        let mut queued = vec![false; self.sets.len()];
        std::thread::scope(|scope| {
            let mut parts = self
                .sets
                .iter_mut()
                .zip(jpegs.chunks(part).zip(images.chunks_mut(part)))
                .zip(queued.iter_mut());
            let first = parts.next();
            let others: Vec<_> = parts
                .map(|((set, (jpegs, out)), queued)| {
                    scope.spawn(move || *queued = run(set, jpegs, out).is_some())
                })
                .collect();
            if let Some(((set, (jpegs, out)), queued)) = first {
                *queued = run(set, jpegs, out).is_some();
            }
            for other in others {
                // A panicked part leaves its images to the CPU lane.
                let _ = other.join();
            }
        });
        // The pipeline's stream (the resize) waits for the sets' decodes.
        for (set, queued) in self.sets.iter().zip(queued) {
            if queued && stream.wait(&set.decoded).is_err() {
                // Without the wait the pixels cannot be used: the CPU lane takes them all.
                return vec![None; jpegs.len()];
            }
        }
        images
    }

    /// What plans the resize of the lane's images (shareable with the CPU lane's threads).
    pub fn planner(&self) -> LanePlanner {
        LanePlanner {
            geometry: self.geometry,
            filter: self.filter,
        }
    }

    /// Queues on `stream` the resize of each decoded image into its slot of `out` (u8 RGB HWC
    /// images of the geometry's size, one after another), after whatever `stream` already runs.
    #[cfg(test)]
    pub fn resize_into(
        &mut self,
        stream: &Arc<CudaStream>,
        images: &[(LaneImage, usize)],
        out: &mut CudaSlice<u8>,
    ) -> Result<()> {
        let planned = self.planner().plan(images)?;
        self.resize_planned(stream, &planned, out)
    }

    /// Queues on `stream` the resize of each image of the lane's last batch into its slot of
    /// `out` (u8 RGB HWC images of the geometry's size, one after another), after whatever
    /// `stream` already runs, with the plan made beforehand by [`JpegLane::planner`].
    pub fn resize_planned(
        &mut self,
        stream: &Arc<CudaStream>,
        planned: &PlannedImages,
        out: &mut CudaSlice<u8>,
    ) -> Result<()> {
        let Some(plan) = &planned.plan else {
            return Ok(());
        };
        let lane_error = |e: &dyn std::fmt::Display| Error::GpuLane(e.to_string());
        let device_plan = match &mut self.plan {
            Some(device) => {
                device.update(stream, plan).map_err(|e| lane_error(&e))?;
                device
            }
            None => self.plan.insert(
                self.resizer
                    .upload(stream, plan)
                    .map_err(|e| lane_error(&e))?,
            ),
        };
        // SAFETY: every job's source is an image of the lane's last batch (this function's
        // contract), queued on this same stream before these kernels: a gray decoder's arena, or
        // the RGB buffer, which the lane keeps (neither freed nor grown) until its next `decode`
        // call, and that call comes after these kernels in the stream's order; the plan's
        // addresses are those.
        unsafe { self.resizer.launch(stream, device_plan, out) }.map_err(|e| lane_error(&e))?;
        self.resized
            .record(stream)
            .map_err(|e| Error::cuda("recording the GPU resize", e))
    }
}

impl DecoderSet {
    /// [`JpegLane::decode`] of one part, on this set's decoders.
    fn decode(&mut self, jpegs: &[(&[u8], Screened)]) -> Result<Vec<Option<LaneImage>>> {
        let stream = &self.stream.clone();
        let lane_error = |e: &dyn std::fmt::Display| Error::GpuLane(e.to_string());
        let mut images: Vec<Option<LaneImage>> = vec![None; jpegs.len()];
        // Gray files to their own decoder, the rest to the colour one.
        let (gray_at, colour_at): (Vec<usize>, Vec<usize>) =
            (0..jpegs.len()).partition(|&i| jpegs[i].1.gray);
        let batch_of = |at: &[usize]| -> (Vec<&[u8]>, Vec<JpegInfo>) {
            at.iter().map(|&i| (jpegs[i].0, jpegs[i].1.info)).unzip()
        };
        if let (Some(gray), false) = (&mut self.gray, gray_at.is_empty()) {
            let (batch, infos) = batch_of(&gray_at);
            let decoded = gray
                .decode_inspected(stream, &batch, &infos)
                .map_err(|e| lane_error(&e))?;
            for (&i, outcome) in gray_at.iter().zip(decoded.outcomes()) {
                if let Outcome::Decoded(d) = outcome {
                    images[i] = Some(LaneImage {
                        source: SourceImage {
                            pixels: SourcePixels::Gray {
                                ptr: d.ptr,
                                pitch: d.pitch as u32,
                            },
                            width: d.info.width,
                            height: d.info.height,
                        },
                    });
                }
            }
        }
        if colour_at.is_empty() {
            return Ok(images);
        }
        let (batch, infos) = batch_of(&colour_at);
        let decoded: Vec<(usize, DecodedImage)> = {
            let outcomes = self
                .colour
                .decode_inspected(stream, &batch, &infos)
                .map_err(|e| lane_error(&e))?;
            colour_at
                .iter()
                .zip(outcomes.outcomes())
                .filter_map(|(&i, outcome)| match outcome {
                    Outcome::Decoded(d) if d.chroma.is_some() => Some((i, *d)),
                    _ => None,
                })
                .collect()
        };
        // One RGB buffer for the batch's colour images, grown when a larger batch arrives.
        let total: usize = decoded
            .iter()
            .map(|(_, d)| d.info.width as usize * d.info.height as usize * 3)
            .sum();
        if self.rgb.as_ref().is_none_or(|b| b.len() < total) {
            // SAFETY: device memory left uninitialized; the conversion writes every byte of
            // each image's RGB before the resize reads it (same stream, in that order).
            let grown = unsafe { stream.alloc::<u8>(total.max(1) + total / 4) }
                .map_err(|e| Error::cuda("allocating the GPU lane's RGB buffer", e))?;
            self.rgb = Some(grown);
        }
        let Some(rgb) = self.rgb.as_mut() else {
            return Err(Error::GpuLane("no RGB buffer".into()));
        };
        let (base, guard) = rgb.device_ptr_mut(stream);
        let mut jobs = Vec::with_capacity(decoded.len());
        let mut at = 0u64;
        for &(i, d) in &decoded {
            let Some(chroma) = d.chroma else { continue };
            let sampling = match d.info.subsampling {
                Subsampling::S422 => ChromaSampling::HalfWidth,
                Subsampling::S420 => ChromaSampling::HalfBoth,
                Subsampling::S440 => ChromaSampling::HalfHeight,
                _ => ChromaSampling::Full,
            };
            let (w, h) = (d.info.width, d.info.height);
            jobs.push(YccJob {
                y: d.ptr,
                cb: d.ptr + chroma.offsets[0] as u64,
                cr: d.ptr + chroma.offsets[1] as u64,
                y_pitch: d.pitch as u32,
                c_pitch: chroma.pitch as u32,
                width: w,
                height: h,
                c_width: chroma.width as u32,
                c_height: chroma.height as u32,
                sampling,
                out: base + at,
            });
            images[i] = Some(LaneImage {
                source: SourceImage {
                    pixels: SourcePixels::Interleaved {
                        ptr: base + at,
                        pitch: w * 3,
                    },
                    width: w,
                    height: h,
                },
            });
            at += u64::from(w) * u64::from(h) * 3;
        }
        // SAFETY: the planes are the colour decoder's batch just queued on this stream (its arena
        // lives in the decoder until its next `decode`, which comes after these kernels), and the
        // outputs lie inside the RGB buffer (`at` stays within `total`), alive in `self.rgb`.
        let converted = unsafe { self.ycc.convert(stream, &jobs) };
        drop(guard);
        converted?;
        Ok(images)
    }
}

/// Plans the GPU resize of the lane's images: the geometry and filter, nothing of the GPU.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LanePlanner {
    geometry: Geometry,
    filter: Filter,
}

/// The GPU lane's images of a batch with their places, planned for the resize.
#[derive(Debug, Default)]
pub(crate) struct PlannedImages {
    /// The places of the batch the lane's images fill.
    pub places: Vec<usize>,
    plan: Option<BatchPlan>,
}

impl LanePlanner {
    /// The plan of `images` (each with its place), the filter coefficients computed on the
    /// current rayon pool.
    pub fn plan(&self, images: &[(LaneImage, usize)]) -> Result<PlannedImages> {
        let places = images.iter().map(|&(_, place)| place).collect();
        if images.is_empty() {
            return Ok(PlannedImages { places, plan: None });
        }
        let pad = match self.geometry.mode {
            ResizeMode::Letterbox { pad, .. } => pad,
            _ => 0,
        };
        let jobs: Vec<ResizeJob> = images
            .iter()
            .map(|(image, slot)| {
                let source = image.source;
                let (x, y) = self.geometry.axis_plans(source.width, source.height);
                ResizeJob {
                    source,
                    x,
                    y,
                    filter: self.filter,
                    order: PassOrder::default(),
                    pad,
                    slot: *slot as u32,
                }
            })
            .collect();
        let plan = plan_batch(&jobs, self.geometry.width, self.geometry.height)
            .map_err(|e| Error::GpuLane(e.to_string()))?;
        Ok(PlannedImages {
            places,
            plan: Some(plan),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::prepare_image;
    use crate::options::{DecodeOptions, ResizeOptions};
    use crate::pillow::{resample, AxisPlan};
    use cudarc::driver::DevicePtr;
    use std::io::Write as _;

    /// Device 0, or `None` (said past the test harness's capture) when there is none, unless
    /// `GPUFEED_REQUIRE_GPU=1`, which turns a missing GPU into a failure.
    fn test_gpu(test: &str) -> Option<Gpu> {
        match Gpu::open(0) {
            Ok(gpu) => Some(gpu),
            Err(e) => {
                assert!(
                    std::env::var("GPUFEED_REQUIRE_GPU").as_deref() != Ok("1"),
                    "GPUFEED_REQUIRE_GPU=1 but {e}"
                );
                let _ = writeln!(std::io::stderr(), "skipped: {test}: no CUDA device ({e})");
                None
            }
        }
    }

    /// Deterministic pseudo-random bytes (xorshift).
    fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 32) as u8
            })
            .collect()
    }

    /// Given the same decoded pixels, the GPU resize writes the CPU rendition's bytes exactly:
    /// random images of many sizes, every mode and GPU filter, slots out of order, outputs
    /// poisoned first so an unwritten byte fails.
    #[test]
    fn gpu_resize_equals_the_cpu_rendition() {
        let Some(gpu) = test_gpu("gpu_resize_equals_the_cpu_rendition") else {
            return;
        };
        let stream = gpu.stream();
        let module = gpu
            .module(&KernelSource {
                name: "resize.cu",
                code: super::super::resize::SOURCE,
                defines: Vec::new(),
            })
            .expect("compile");
        let resizer = BatchResizer::from_module(&module).expect("kernels");
        let modes = [
            ResizeMode::center_crop(256, 224),
            ResizeMode::center_crop(100, 111),
            ResizeMode::stretch(64, 96),
            ResizeMode::letterbox(80, 80, 114),
        ];
        let sizes = [
            (500, 375),
            (375, 500),
            (37, 23),
            (1, 1),
            (900, 13),
            (224, 224),
            (1200, 800),
        ];
        let mut compared = 0;
        for (m, mode) in modes.iter().enumerate() {
            for (f, (filter, interpolation)) in [
                (Filter::Bilinear, Interpolation::Bilinear),
                (Filter::Bicubic, Interpolation::Bicubic),
                (Filter::Lanczos, Interpolation::Lanczos),
            ]
            .into_iter()
            .enumerate()
            {
                let geometry = Geometry::new(
                    &ResizeOptions::default()
                        .mode(*mode)
                        .interpolation(interpolation),
                );
                let (ow, oh) = (geometry.width, geometry.height);
                let image = ow as usize * oh as usize * 3;
                let pad = match mode {
                    ResizeMode::Letterbox { pad, .. } => *pad,
                    _ => 0,
                };
                // Every image of the batch uploaded to the device.
                let sources: Vec<Vec<u8>> = sizes
                    .iter()
                    .enumerate()
                    .map(|(i, &(w, h))| random_bytes(w * h * 3, (m * 31 + f * 7 + i) as u64))
                    .collect();
                let device: Vec<CudaSlice<u8>> = sources
                    .iter()
                    .map(|s| stream.clone_htod(s).expect("upload"))
                    .collect();
                let slots: Vec<u32> = (0..sizes.len() as u32).rev().collect();
                let jobs: Vec<ResizeJob> = sizes
                    .iter()
                    .zip(&device)
                    .zip(&slots)
                    .map(|((&(w, h), d), &slot)| {
                        let (x, y) = geometry.axis_plans(w as u32, h as u32);
                        ResizeJob {
                            source: SourceImage {
                                pixels: SourcePixels::Interleaved {
                                    ptr: d.device_ptr(stream).0,
                                    pitch: w as u32 * 3,
                                },
                                width: w as u32,
                                height: h as u32,
                            },
                            x,
                            y,
                            filter,
                            order: PassOrder::default(),
                            pad,
                            slot,
                        }
                    })
                    .collect();
                let mut out = stream
                    .clone_htod(&vec![0xA5u8; image * sizes.len()])
                    .expect("poisoned output");
                let plan = plan_batch(&jobs, ow, oh).expect("plan");
                let mut device_plan = resizer.upload(stream, &plan).expect("upload plan");
                // SAFETY: the sources are the live device buffers above, not written again.
                unsafe { resizer.launch(stream, &mut device_plan, &mut out) }.expect("launch");
                let got = stream.clone_dtoh(&out).expect("download");
                for (i, (&(w, h), src)) in sizes.iter().zip(&sources).enumerate() {
                    let (x, y) = geometry.axis_plans(w as u32, h as u32);
                    let mut want = vec![0u8; image];
                    resample(
                        src, w as u32, h as u32, 3, &x, &y, filter, pad, &mut want, ow, oh,
                    )
                    .expect("cpu rendition");
                    let slot = slots[i] as usize;
                    let got = &got[slot * image..(slot + 1) * image];
                    let differing = got.iter().zip(&want).filter(|(a, b)| a != b).count();
                    assert_eq!(differing, 0, "{mode} {filter:?} {w}x{h}: {differing} bytes");
                    compared += 1;
                }
            }
        }
        assert_eq!(compared, modes.len() * 3 * sizes.len());
        let _ = AxisPlan::default();
    }

    /// The lane decodes real JPEGs (the bundled photos, the JPEG fixtures, random-size
    /// synthetic ones) to what the CPU lane makes of them, within the fidelity bars (the two
    /// decoders' inverse DCT differs by a level here and there before the resize), gray and
    /// colour ones in one call; progressive and CMYK JPEGs are refused and go to the CPU lane.
    #[test]
    fn the_lane_decodes_like_the_cpu_lane() {
        let Some(gpu) = test_gpu("the_lane_decodes_like_the_cpu_lane") else {
            return;
        };
        let resize = ResizeOptions::default();
        let geometry = Geometry::new(&resize);
        let mut lane = JpegLane::open(&gpu, &geometry, 1 << 28).expect("the GPU lane");
        let mut files: Vec<(String, Vec<u8>)> = Vec::new();
        for dir in ["assets", "tests/fixtures"] {
            for entry in std::fs::read_dir(dir).expect("dir").flatten() {
                let path = entry.path();
                let name = path.display().to_string();
                if name.to_lowercase().ends_with(".jpg") {
                    files.push((name, std::fs::read(&path).expect("read")));
                }
            }
        }
        let photo = image::open("assets/astronaut.png")
            .expect("photo")
            .to_rgb8();
        for i in 0..16u32 {
            let (w, h) = (120 + i * 37, 90 + (i * 53) % 400);
            let crop = image::imageops::resize(&photo, w, h, image::imageops::Triangle);
            let mut bytes = Vec::new();
            image::codecs::jpeg::JpegEncoder::new_with_quality(&mut bytes, 80 + i as u8)
                .encode_image(&crop)
                .expect("encode");
            files.push((format!("synthetic {w}x{h}"), bytes));
        }
        // Gray ones among them, up to the corpus's largest sizes.
        let camera = image::open("assets/camera.png").expect("photo").to_luma8();
        for i in 0..8u32 {
            let (w, h) = (250 + i * 79, 64 + (i * 131) % 840);
            let crop = image::imageops::resize(&camera, w, h, image::imageops::Triangle);
            let mut bytes = Vec::new();
            image::codecs::jpeg::JpegEncoder::new_with_quality(&mut bytes, 75 + i as u8)
                .encode_image(&crop)
                .expect("encode");
            if i % 2 == 1 {
                // As Pillow writes gray JPEGs asked for 4:2:0: sampling factors 2x2, which
                // change nothing in how the frame decodes (the CPU lane makes the same pixels).
                let at = crate::cuda::jpeg::header::scan(&bytes)
                    .expect("header")
                    .frame_at
                    + 7;
                let mut pillow = bytes.clone();
                pillow[at] = 0x22;
                let mut plain = vec![0u8; geometry.image_bytes()];
                let mut factored = vec![1u8; geometry.image_bytes()];
                prepare_image(&bytes, &DecodeOptions::default(), &resize, &mut plain).expect("cpu");
                prepare_image(&pillow, &DecodeOptions::default(), &resize, &mut factored)
                    .expect("cpu");
                assert!(
                    plain == factored,
                    "2x2 gray factors decode differently on the CPU"
                );
                files.push((format!("synthetic gray 2x2 factors {w}x{h}"), pillow));
            }
            files.push((format!("synthetic gray {w}x{h}"), bytes));
        }
        let screen = lane.screen().clone();
        let accepted: Vec<(&(String, Vec<u8>), Screened)> = files
            .iter()
            .filter_map(|file| screen.take(&file.1).map(|s| (file, s)))
            .collect();
        for (name, bytes) in &files {
            let lower = name.to_lowercase();
            if lower.contains("progressive") || lower.contains("cmyk") {
                assert!(
                    screen.take(bytes).is_none(),
                    "{name} must go to the CPU lane"
                );
            }
            if lower.contains("gray") {
                assert!(
                    screen.take(bytes).is_some_and(|s| s.gray),
                    "{name}: the gray decoder"
                );
            }
        }
        assert!(accepted.len() >= 20, "only {} accepted", accepted.len());
        let stream = gpu.stream();
        let jpegs: Vec<(&[u8], Screened)> = accepted
            .iter()
            .map(|((_, b), s)| (b.as_slice(), *s))
            .collect();
        let accepted: Vec<&(String, Vec<u8>)> = accepted.iter().map(|(f, _)| *f).collect();
        let decoded = lane.decode(stream, &jpegs);
        let image = geometry.image_bytes();
        let mut out = stream
            .clone_htod(&vec![0xA5u8; image * accepted.len()])
            .expect("poisoned output");
        let placed: Vec<(LaneImage, usize)> = decoded
            .iter()
            .enumerate()
            .map(|(i, d)| (d.expect("decoded"), i))
            .collect();
        lane.resize_into(stream, &placed, &mut out).expect("resize");
        let got = stream.clone_dtoh(&out).expect("download");
        let mut all = Vec::new();
        for (i, (name, bytes)) in accepted.iter().enumerate() {
            let mut want = vec![0u8; image];
            prepare_image(bytes, &DecodeOptions::default(), &resize, &mut want).expect("cpu");
            let diffs: Vec<u8> = got[i * image..(i + 1) * image]
                .iter()
                .zip(&want)
                .map(|(a, b)| a.abs_diff(*b))
                .collect();
            let mean = diffs.iter().map(|&d| d as f64).sum::<f64>() / diffs.len() as f64;
            assert!(
                mean < 1.5,
                "{name}: mean difference {mean:.3} from the CPU lane"
            );
            all.extend(diffs);
        }
        all.sort_unstable();
        let mean = all.iter().map(|&d| d as f64).sum::<f64>() / all.len() as f64;
        let p999 = all[(all.len() - 1) * 999 / 1000];
        println!(
            "GPU lane vs CPU lane, {} images: mean {mean:.3}, p99.9 {p999}",
            accepted.len()
        );
        assert!(mean <= 0.5 && p999 <= 3, "mean {mean:.3}, p99.9 {p999}");
    }

    /// Gray JPEGs decoded by the engines in a batch of their own come out as the CPU lane makes
    /// them (what decides whether the lane can take them in batches of their own).
    #[test]
    fn gray_jpegs_decode_on_the_engines_in_a_batch_of_their_own() {
        let Some(gpu) = test_gpu("gray_jpegs_decode_on_the_engines_in_a_batch_of_their_own") else {
            return;
        };
        let resize = ResizeOptions::default();
        let geometry = Geometry::new(&resize);
        let mut lane = JpegLane::open_for(&gpu, &geometry, 1 << 28, true).expect("lane");
        let photo = image::open("assets/camera.png").expect("photo").to_luma8();
        let files: Vec<Vec<u8>> = (0..12u32)
            .map(|i| {
                let (w, h) = (250 + i * 41, 200 + (i * 67) % 500);
                let crop = image::imageops::resize(&photo, w, h, image::imageops::Triangle);
                let mut bytes = Vec::new();
                image::codecs::jpeg::JpegEncoder::new_with_quality(&mut bytes, 85)
                    .encode_image(&crop)
                    .expect("encode");
                bytes
            })
            .collect();
        let screen = lane.screen().clone();
        let jpegs: Vec<(&[u8], Screened)> = files
            .iter()
            .map(|b| (b.as_slice(), screen.take(b).expect("taken")))
            .collect();
        assert!(jpegs.iter().all(|(_, s)| s.gray));
        let stream = gpu.stream();
        let decoded = lane.decode(stream, &jpegs);
        let image = geometry.image_bytes();
        let mut out = stream
            .clone_htod(&vec![0xA5u8; image * files.len()])
            .expect("poisoned output");
        let placed: Vec<(LaneImage, usize)> = decoded
            .iter()
            .enumerate()
            .map(|(i, d)| (d.expect("decoded"), i))
            .collect();
        lane.resize_into(stream, &placed, &mut out).expect("resize");
        let got = stream.clone_dtoh(&out).expect("download");
        for (i, bytes) in files.iter().enumerate() {
            let mut want = vec![0u8; image];
            prepare_image(bytes, &DecodeOptions::default(), &resize, &mut want).expect("cpu");
            let mean = got[i * image..(i + 1) * image]
                .iter()
                .zip(&want)
                .map(|(a, b)| a.abs_diff(*b) as f64)
                .sum::<f64>()
                / image as f64;
            println!("gray JPEG {i}: mean difference {mean:.3}");
            assert!(mean <= 0.5, "gray JPEG {i}: mean difference {mean:.3}");
        }
    }
}
