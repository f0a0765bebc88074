//! One submitting thread's decoders and kernels: a prepared call's files decoded on the engines
//! (colour and gray JPEGs in calls of their own, the colour ones made RGB as libjpeg-turbo makes
//! them) or by the assisted path ([`super::assisted`]), and every image resized into its slot of
//! the ring with the coefficients the preparing thread computed, all on the set's own stream.

use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaModule, CudaSlice, CudaStream, DevicePtrMut};

use super::assisted::AssistedDecoder;
use super::call::{Call, Path, MAX_CALL_PIXELS};
use super::error::GpuLaneError;
use super::nvjpeg::{
    ChromaPlanes, DecodedImage, DecoderConfig, DecoderOpening, HardwareDecoder, HardwareHandle,
    JpegInfo, Outcome, Subsampling,
};
use super::resize::plan::{plan_batch_with, ResizeJob, SourceImage, SourcePixels};
use super::resize::{BatchResizer, DevicePlan};
use super::screen::Screened;
use super::shared::Shared;
use super::work::{LaneOutput, LaneResult};
use super::ycc::{ChromaSampling, YccConverter, YccJob};
use crate::cuda::Gpu;
use crate::error::{Error, Result};
use crate::geometry::Geometry;
use crate::options::ResizeMode;
use crate::resample::Filter;

/// Bytes of the RGB buffer: a call's colour images at most, unless one image alone is larger.
const RGB_BYTES: usize = 3 * MAX_CALL_PIXELS as usize;

/// The decoders one host thread submits to, with the kernels that follow them.
pub(super) struct DecoderSet {
    /// The set's own stream: nvJPEG waits on the stream it decodes on, which must not hold the
    /// pipeline's other work nor the other sets'.
    stream: Arc<CudaStream>,
    decoders: Decoders,
    resizer: BatchResizer,
    plan: Option<DevicePlan>,
    geometry: Geometry,
    filter: Filter,
    /// Events recorded after a range's resize; one is reused once nothing else holds it.
    events: Vec<Arc<CudaEvent>>,
}

/// What decodes a set's calls.
enum Decoders {
    Engines(Engines),
    Assisted(AssistedDecoder),
}

/// The hardware decoders and the colour conversion after them.
struct Engines {
    /// Colour JPEGs, decoded to their Y, Cb and Cr planes as stored.
    colour: HardwareDecoder,
    /// Gray JPEGs, decoded to their Y plane, in calls of their own.
    gray: Option<HardwareDecoder>,
    ycc: YccConverter,
    /// The RGB of the last range's colour images, grown when a larger range arrives.
    rgb: Option<CudaSlice<u8>>,
}

/// A new stream of `gpu`'s context for a set.
fn new_stream(gpu: &Gpu) -> Result<Arc<CudaStream>, GpuLaneError> {
    gpu.stream()
        .context()
        .new_stream()
        .map_err(GpuLaneError::cuda("creating a stream for the lane"))
}

impl DecoderSet {
    /// The assisted path's decoder and kernels on a new stream of `gpu`'s context.
    pub fn open_assisted(
        gpu: &Gpu,
        resize: &Arc<CudaModule>,
        geometry: Geometry,
        filter: Filter,
        call_pixels: u64,
    ) -> Result<DecoderSet, GpuLaneError> {
        let stream = new_stream(gpu)?;
        let assisted = AssistedDecoder::new(&stream, call_pixels)?;
        DecoderSet::with(
            stream,
            Decoders::Assisted(assisted),
            resize,
            geometry,
            filter,
        )
    }

    fn with(
        stream: Arc<CudaStream>,
        decoders: Decoders,
        resize: &Arc<CudaModule>,
        geometry: Geometry,
        filter: Filter,
    ) -> Result<DecoderSet, GpuLaneError> {
        Ok(DecoderSet {
            stream,
            decoders,
            resizer: BatchResizer::from_module(resize)?,
            plan: None,
            geometry,
            filter,
            events: Vec::new(),
        })
    }

    /// The engines' decoders (on `handle`, which the sets share) and kernels on a new stream of
    /// `gpu`'s context.
    pub fn open(
        gpu: &Gpu,
        handle: &Arc<HardwareHandle>,
        resize: &Arc<CudaModule>,
        colour: &DecoderConfig,
        gray: Option<&DecoderConfig>,
        geometry: Geometry,
        filter: Filter,
    ) -> Result<DecoderSet, GpuLaneError> {
        let stream = new_stream(gpu)?;
        let open =
            |config: &DecoderConfig| HardwareDecoder::with_handle(handle, &stream, config.clone());
        let colour = open(colour)?;
        let gray = match gray {
            Some(config) => Some(open(config)?),
            None => None,
        };
        let ycc = YccConverter::new(gpu).map_err(GpuLaneError::kernel("ycc.cu"))?;
        // The RGB of one call's colour images, sized once for the largest call.
        // SAFETY: device memory left uninitialized; the conversion writes every byte of each
        // image's RGB before the resize reads it (same stream, in that order).
        let rgb = unsafe { stream.alloc::<u8>(RGB_BYTES) }
            .map_err(GpuLaneError::cuda("allocating the RGB buffer"))?;
        let engines = Engines {
            colour,
            gray,
            ycc,
            rgb: Some(rgb),
        };
        DecoderSet::with(stream, Decoders::Engines(engines), resize, geometry, filter)
    }

    /// The engines and cores per engine, as nvJPEG reports them (none for the assisted path).
    pub fn engines(&self) -> Option<(u32, u32)> {
        match &self.decoders {
            Decoders::Engines(engines) => engines.colour.engines(),
            Decoders::Assisted(_) => None,
        }
    }

    /// How long the engines' decoders took to create, colour and gray together, step by step
    /// (none for the assisted path).
    pub fn opening(&self) -> Option<DecoderOpening> {
        match &self.decoders {
            Decoders::Engines(engines) => Some(
                engines
                    .gray
                    .as_ref()
                    .map(HardwareDecoder::opening)
                    .into_iter()
                    .fold(engines.colour.opening(), DecoderOpening::then),
            ),
            Decoders::Assisted(_) => None,
        }
    }

    /// How long the engines' shared handle took to create (none for the assisted path).
    pub fn handle_created_in(&self) -> Option<std::time::Duration> {
        match &self.decoders {
            Decoders::Engines(engines) => Some(engines.colour.handle_created_in()),
            Decoders::Assisted(_) => None,
        }
    }

    /// The path whose calls the set takes.
    pub fn path(&self) -> Path {
        match self.decoders {
            Decoders::Engines(_) => Path::Engines,
            Decoders::Assisted(_) => Path::Assisted,
        }
    }

    /// The set's stream.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Decodes, converts and resizes the images of `call` into their slots: one result per
    /// image. Nothing is written unless `ordered` (the stream waits for the slots' last readers).
    /// A call that fails leaves its images to the CPU lane, and the set's stream idle before
    /// their slots are handed out again.
    pub fn run(&mut self, call: &Call, shared: &Shared, ordered: bool) -> Vec<LaneResult> {
        let mut results = vec![LaneResult::Refused; call.images.len()];
        if !ordered {
            return results;
        }
        let decoded = match &mut self.decoders {
            Decoders::Engines(engines) => {
                let jpegs: Vec<(&[u8], Screened)> = call
                    .images
                    .iter()
                    .map(|image| (&*image.bytes, image.screened))
                    .collect();
                engines.decode(&self.stream, &jpegs)
            }
            Decoders::Assisted(assisted) => assisted.decode(&call.images),
        };
        let made = decoded.and_then(|images| self.resize(call, shared, &images));
        let written = match made {
            Ok(written) if !written.is_empty() => written,
            Ok(_) => return results,
            Err(_) => {
                // Whatever the call queued is done before its slots are free again.
                let _ = self.stream.synchronize();
                return results;
            }
        };
        match self.record() {
            Ok(event) => {
                for k in written {
                    let image = &call.images[k];
                    results[k] = LaneResult::Decoded(LaneOutput {
                        slot: image.slot,
                        ready: event.clone(),
                        draw: image.draw,
                        assisted: call.path == Path::Assisted,
                    });
                }
            }
            Err(_) => {
                let _ = self.stream.synchronize();
            }
        }
        results
    }

    /// An event recorded on the set's stream now (one of the set's, reused once nothing else
    /// holds it).
    fn record(&mut self) -> Result<Arc<CudaEvent>> {
        let event = match self.events.iter().find(|e| Arc::strong_count(e) == 1) {
            Some(event) => event.clone(),
            None => {
                let event = Arc::new(
                    self.stream
                        .record_event(None)
                        .map_err(|e| Error::cuda("creating the GPU lane's event", e))?,
                );
                self.events.push(event.clone());
                event
            }
        };
        event
            .record(&self.stream)
            .map_err(|e| Error::cuda("recording the GPU lane's resize", e))?;
        Ok(event)
    }

    /// Queues the resize of each decoded image (`images[k]` is image `k` of `call`) into its slot
    /// of the ring; returns the images written.
    fn resize(
        &mut self,
        call: &Call,
        shared: &Shared,
        images: &[Option<SourceImage>],
    ) -> Result<Vec<usize>> {
        let pad = match self.geometry.mode {
            ResizeMode::Letterbox { pad, .. } => pad,
            _ => 0,
        };
        let mut written = Vec::with_capacity(images.len());
        let mut jobs = Vec::with_capacity(images.len());
        let mut passes = Vec::with_capacity(images.len());
        for (k, (image, source)) in call.images.iter().zip(images).enumerate() {
            let Some(source) = *source else { continue };
            jobs.push(ResizeJob {
                source,
                x: image.x,
                y: image.y,
                filter: self.filter,
                order: self.geometry.pass_order,
                pad,
                flip: image.draw.is_some_and(|d| d.flipped),
                slot: image.slot,
            });
            passes.push(&image.passes);
            written.push(k);
        }
        if jobs.is_empty() {
            return Ok(written);
        }
        let stream = self.stream.clone();
        let plan = plan_batch_with(&jobs, &passes, self.geometry.width, self.geometry.height)
            .map_err(|e| GpuLaneError::Resize(e.into()))?;
        let device = match &mut self.plan {
            Some(device) => {
                device.update(&stream, &plan).map_err(GpuLaneError::from)?;
                device
            }
            None => self.plan.insert(
                self.resizer
                    .upload(&stream, &plan)
                    .map_err(GpuLaneError::from)?,
            ),
        };
        let ring_bytes = (shared.limits.slots as u64) * shared.limits.image_bytes as u64;
        // SAFETY: every job's source is an image this set just decoded on this stream (a gray
        // decoder's arena, or the RGB buffer), kept until the set's next decode, which comes
        // after these kernels on the stream; the ring is `ring_bytes` of device memory alive
        // while the lane is, and each slot written is one this range reserved, which no gather
        // reads before the event recorded after the range, and no other range writes before
        // it is released.
        unsafe {
            self.resizer
                .launch_at(&stream, device, shared.ring, ring_bytes)
                .map_err(GpuLaneError::from)?;
        }
        Ok(written)
    }
}

impl Engines {
    /// Queues the decode of `jpegs` on the set's stream (colour and gray ones in calls of their
    /// own, colour made RGB as libjpeg makes it): one image per input, `None` where the engines
    /// refused it. The pixels stay valid until the next call.
    fn decode(
        &mut self,
        stream: &Arc<CudaStream>,
        jpegs: &[(&[u8], Screened)],
    ) -> Result<Vec<Option<SourceImage>>> {
        let mut images: Vec<Option<SourceImage>> = vec![None; jpegs.len()];
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
                .map_err(GpuLaneError::from)?;
            for (&i, outcome) in gray_at.iter().zip(decoded.outcomes()) {
                if let Outcome::Decoded(d) = outcome {
                    let pixels = SourcePixels::Gray {
                        ptr: d.ptr,
                        pitch: d.pitch as u32,
                    };
                    images[i] = Some(SourceImage::whole(pixels, d.info.width, d.info.height));
                }
            }
        }
        if colour_at.is_empty() {
            return Ok(images);
        }
        let (batch, infos) = batch_of(&colour_at);
        let decoded: Vec<(usize, DecodedImage, ChromaPlanes)> = {
            let outcomes = self
                .colour
                .decode_inspected(stream, &batch, &infos)
                .map_err(GpuLaneError::from)?;
            colour_at
                .iter()
                .zip(outcomes.outcomes())
                .filter_map(|(&i, outcome)| match outcome {
                    Outcome::Decoded(d) => d.chroma.map(|chroma| (i, *d, chroma)),
                    _ => None,
                })
                .collect()
        };
        // One RGB buffer for the call's colour images, grown only for an image larger than a call.
        let total: usize = decoded
            .iter()
            .map(|(_, d, _)| d.info.width as usize * d.info.height as usize * 3)
            .sum();
        let rgb = match self.rgb.take() {
            Some(rgb) if rgb.len() >= total => rgb,
            // SAFETY: device memory left uninitialized; the conversion writes every byte of
            // each image's RGB before the resize reads it (same stream, in that order).
            _ => unsafe { stream.alloc::<u8>(total.max(1) + total / 4) }
                .map_err(|e| Error::cuda("allocating the GPU lane's RGB buffer", e))?,
        };
        let rgb = self.rgb.insert(rgb);
        let (base, guard) = rgb.device_ptr_mut(stream);
        let mut jobs = Vec::with_capacity(decoded.len());
        let mut at = 0u64;
        for &(i, d, chroma) in &decoded {
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
            let pixels = SourcePixels::Interleaved {
                ptr: base + at,
                pitch: w * 3,
            };
            images[i] = Some(SourceImage::whole(pixels, w, h));
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
