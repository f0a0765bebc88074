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

use cudarc::driver::{CudaSlice, CudaStream};

use super::device::{Gpu, KernelSource};
use super::jpeg::{Checks, DecodedImage, DecoderConfig, HardwareDecoder, NvJpeg, Outcome};
use super::resize::plan::{plan_batch, ResizeJob, SourceImage, SourcePixels};
use super::resize::{BatchResizer, DevicePlan};
use crate::error::{Error, Result};
use crate::geometry::Geometry;
use crate::options::{Interpolation, ResizeMode};
use crate::pillow::{Filter, PassOrder};

/// Whether gray (one-component) JPEGs go to the hardware. Measured on the H100 machine: they
/// decode there, but to wrong pixels when they share a batch with colour images, so they stay
/// on the CPU lane.
const GRAY_ON_THE_GPU: bool = false;

/// Largest compressed file the lane stages (others go to the CPU lane).
const MAX_COMPRESSED: usize = 64 << 20;

/// The hardware decoder and the batched resize of one pipeline.
pub(crate) struct JpegLane {
    decoder: HardwareDecoder,
    resizer: BatchResizer,
    plan: Option<DevicePlan>,
    geometry: Geometry,
    filter: Filter,
    description: String,
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

/// A decoded image of the lane's last submitted batch, with where it goes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LaneImage {
    decoded: DecodedImage,
}

impl JpegLane {
    /// Opens the lane on `gpu` for batches of up to `max_batch` images of at most `max_pixels`
    /// pixels, resized as `geometry` says; `Err` says why it cannot run here.
    pub fn open(
        gpu: &Gpu,
        geometry: &Geometry,
        max_batch: usize,
        max_pixels: u64,
    ) -> std::result::Result<JpegLane, LaneUnavailable> {
        JpegLane::open_for(gpu, geometry, max_batch, max_pixels, GRAY_ON_THE_GPU)
    }

    /// [`JpegLane::open`], saying whether gray JPEGs go to the hardware.
    fn open_for(
        gpu: &Gpu,
        geometry: &Geometry,
        max_batch: usize,
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
            max_batch: max_batch.max(1),
            checks: Checks::Markers,
            gray,
            max_image_pixels: max_pixels,
            ..DecoderConfig::default()
        };
        let decoder = HardwareDecoder::new(&nvjpeg, gpu.stream(), config)
            .map_err(|e| format!("the hardware JPEG decoder is not available: {e}"))?;
        let engines = decoder.engines().map_or(String::new(), |(engines, cores)| {
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
        Ok(JpegLane {
            decoder,
            resizer,
            plan: None,
            geometry: *geometry,
            filter,
            description: format!("nvJPEG {major}.{minor}.{patch} hardware decoder{engines}"),
        })
    }

    /// The lane in words.
    pub fn describe(&self) -> &str {
        &self.description
    }

    /// Whether the hardware decodes `jpeg` (its markers read; microseconds, no GPU work).
    pub fn accepts(&mut self, jpeg: &[u8]) -> bool {
        jpeg.len() <= MAX_COMPRESSED && self.decoder.inspect(jpeg).is_ok()
    }

    /// Queues the decode of `jpegs` on `stream`; `None` for an image the hardware refuses (it
    /// goes to the CPU lane). The pixels are valid until the next call.
    pub fn decode(
        &mut self,
        stream: &Arc<CudaStream>,
        jpegs: &[&[u8]],
    ) -> Result<Vec<Option<LaneImage>>> {
        let batch = self
            .decoder
            .decode(stream, jpegs)
            .map_err(|e| Error::GpuLane(e.to_string()))?;
        Ok(batch
            .outcomes()
            .iter()
            .map(|outcome| match outcome {
                Outcome::Decoded(decoded) => Some(LaneImage { decoded: *decoded }),
                Outcome::Refused(_) => None,
            })
            .collect())
    }

    /// Queues on `stream` the resize of each decoded image into its slot of `out` (u8 RGB HWC
    /// images of the geometry's size, one after another), after whatever `stream` already runs.
    pub fn resize_into(
        &mut self,
        stream: &Arc<CudaStream>,
        images: &[(LaneImage, usize)],
        out: &mut CudaSlice<u8>,
    ) -> Result<()> {
        if images.is_empty() {
            return Ok(());
        }
        let pad = match self.geometry.mode {
            ResizeMode::Letterbox { pad, .. } => pad,
            _ => 0,
        };
        let jobs: Vec<ResizeJob> = images
            .iter()
            .map(|(image, slot)| {
                let info = image.decoded.info;
                let (x, y) = self.geometry.axis_plans(info.width, info.height);
                ResizeJob {
                    source: SourceImage {
                        pixels: SourcePixels::Interleaved {
                            ptr: image.decoded.ptr,
                            pitch: image.decoded.pitch as u32,
                        },
                        width: info.width,
                        height: info.height,
                    },
                    x,
                    y,
                    filter: self.filter,
                    order: PassOrder::default(),
                    pad,
                    slot: *slot as u32,
                }
            })
            .collect();
        let lane_error = |e: &dyn std::fmt::Display| Error::GpuLane(e.to_string());
        let plan = plan_batch(&jobs, self.geometry.width, self.geometry.height)
            .map_err(|e| lane_error(&e))?;
        let device_plan = match &mut self.plan {
            Some(device) => {
                device.update(stream, &plan).map_err(|e| lane_error(&e))?;
                device
            }
            None => self.plan.insert(
                self.resizer
                    .upload(stream, &plan)
                    .map_err(|e| lane_error(&e))?,
            ),
        };
        // SAFETY: every job's source is an image of the decoder's last batch, queued on this
        // same stream before these kernels: its arena lives in the decoder (self.decoder), which
        // neither frees nor grows it before its next `decode` call, and that call comes after
        // these kernels in the stream's order; the plan's addresses are the decoder's.
        unsafe { self.resizer.launch(stream, device_plan, out) }.map_err(|e| lane_error(&e))
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
    /// decoders' inverse DCT and chroma upsampling differ by a level here and there before the
    /// resize); gray and progressive JPEGs are refused and go to the CPU lane.
    #[test]
    fn the_lane_decodes_like_the_cpu_lane() {
        let Some(gpu) = test_gpu("the_lane_decodes_like_the_cpu_lane") else {
            return;
        };
        let resize = ResizeOptions::default();
        let geometry = Geometry::new(&resize);
        let mut lane = JpegLane::open(&gpu, &geometry, 64, 1 << 28).expect("the GPU lane");
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
        let accepted: Vec<&(String, Vec<u8>)> =
            files.iter().filter(|(_, b)| lane.accepts(b)).collect();
        for (name, bytes) in &files {
            let lower = name.to_lowercase();
            if lower.contains("gray") || lower.contains("progressive") || lower.contains("cmyk") {
                assert!(!lane.accepts(bytes), "{name} must go to the CPU lane");
            }
        }
        assert!(accepted.len() >= 20, "only {} accepted", accepted.len());
        let stream = gpu.stream();
        let jpegs: Vec<&[u8]> = accepted.iter().map(|(_, b)| b.as_slice()).collect();
        let decoded = lane.decode(stream, &jpegs).expect("decode");
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
        let mut lane = JpegLane::open_for(&gpu, &geometry, 64, 1 << 28, true).expect("lane");
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
        assert!(files.iter().all(|b| lane.accepts(b)));
        let stream = gpu.stream();
        let jpegs: Vec<&[u8]> = files.iter().map(Vec::as_slice).collect();
        let decoded = lane.decode(stream, &jpegs).expect("decode");
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
