//! One submitting thread's decoders and kernels: a prepared call's files decoded on the engines
//! (colour and gray JPEGs in calls of their own, the colour ones made RGB as libjpeg-turbo makes
//! them) or by the assisted path ([`super::assisted`]), and every image resized into its slot of
//! the ring with the coefficients the preparing thread computed, all on the set's own stream.

use std::ops::Range;
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaModule, CudaSlice, CudaStream, DevicePtrMut};

use super::assisted::AssistedDecoder;
use super::call::{Call, EngineCalls, ImageOutput, Path};
use super::error::GpuLaneError;
use super::nvjpeg::{
    ChromaPlanes, DecodedImage, DecoderConfig, DecoderOpening, HardwareDecoder, HardwareHandle,
    JpegInfo, NvjpegError, Outcome, Subsampling,
};
use super::screen::Screened;
use super::shared::Shared;
use super::work::{LaneOutput, LaneResult};
use super::ycc::{ChromaSampling, YccConverter, YccJob};
use crate::cuda::resize::plan::{
    plan_batch_placed_into, plan_batch_sized_into, BatchError, BatchPlan, ResizeJob, SourceImage,
    SourcePixels,
};
use crate::cuda::resize::ResizeError;
use crate::cuda::resize::{BatchResizer, DevicePlan};
use crate::cuda::Gpu;
use crate::error::{Error, Result};
use crate::geometry::Geometry;
use crate::profile::Stage;
use crate::resample::Filter;
use crate::views::RECORD_UNIT;

/// The decoders one host thread submits to, with the kernels that follow them.
pub(super) struct DecoderSet {
    /// The set's own stream: nvJPEG waits on the stream it decodes on, which must not hold the
    /// pipeline's other work nor the other sets'.
    stream: Arc<CudaStream>,
    decoders: Decoders,
    resizing: Resizing,
    /// Events recorded after a range's resize; one is reused once nothing else holds it.
    events: Vec<Arc<CudaEvent>>,
}

/// The resize of a set's decoded images into their slots of the ring.
struct Resizing {
    resizer: BatchResizer,
    /// The call's plan on the host, made again call after call in the same buffers.
    batch: BatchPlan,
    plan: Option<DevicePlan>,
    geometry: Geometry,
    filter: Filter,
}

/// What each of the engines' sets opens: its colour decoder, its gray one (if gray files go to
/// the engines) and the calls it takes.
#[derive(Debug, Clone)]
pub(super) struct EngineDecoders {
    pub colour: DecoderConfig,
    pub gray: Option<DecoderConfig>,
    pub calls: EngineCalls,
}

/// What decodes a set's calls.
enum Decoders {
    Engines(Box<Engines>),
    Assisted(Box<AssistedDecoder>),
}

/// The hardware decoders and the colour conversion after them.
struct Engines {
    /// Colour JPEGs, decoded to their Y, Cb and Cr planes as stored.
    colour: HardwareDecoder,
    /// Gray JPEGs, decoded to their Y plane, in calls of their own.
    gray: GrayDecoder,
    ycc: YccConverter,
    /// The RGB of a part of a call's colour images ([`EngineCalls::rgb_bytes`]), grown only
    /// for an image larger alone.
    rgb: Option<CudaSlice<u8>>,
}

/// A set's gray decoder. It is made after every set's colour decoder ([`GrayOrder`]): nvJPEG
/// makes a process's decoder states one at a time (150-400 ms each alone on the H200 machine,
/// 1-1.6 s each with four processes making theirs), so the sets join with their colour
/// decoders, and gray files go to the assisted path until every set's gray decoder is made
/// (to the CPU lane where the assisted path is off, or a gray call finds its decoder missing).
enum GrayDecoder {
    /// Gray files do not go to the engines, or their decoder could not be made.
    Off,
    /// Being made: sent here once ready, or why it could not be.
    Coming(Receiver<Result<HardwareDecoder, NvjpegError>>),
    Ready(Box<HardwareDecoder>),
}

impl GrayDecoder {
    /// The decoder if it is ready now, taken in the first time it is.
    fn ready(&mut self) -> Option<&mut HardwareDecoder> {
        if let GrayDecoder::Coming(arriving) = self {
            match arriving.try_recv() {
                Ok(Ok(decoder)) => *self = GrayDecoder::Ready(Box::new(decoder)),
                // The assisted path keeps the gray files; a gray call that still comes here
                // is refused, and the CPU lane decodes it alike.
                Ok(Err(_)) | Err(TryRecvError::Disconnected) => *self = GrayDecoder::Off,
                Err(TryRecvError::Empty) => {}
            }
        }
        match self {
            GrayDecoder::Ready(decoder) => Some(decoder),
            GrayDecoder::Off | GrayDecoder::Coming(_) => None,
        }
    }
}

/// What making a set's gray decoder takes, once the colour decoders are made: on the set's
/// stream, with the handle every decoder shares.
pub(super) struct GrayOrder {
    handle: Arc<HardwareHandle>,
    stream: Arc<CudaStream>,
    config: DecoderConfig,
    deliver: Sender<Result<HardwareDecoder, NvjpegError>>,
}

impl GrayOrder {
    /// Makes the decoder and sends it to its set (dropped here if the set is gone): whether it
    /// was made.
    pub fn make(self) -> bool {
        let made = HardwareDecoder::with_handle(&self.handle, &self.stream, self.config);
        let ok = made.is_ok();
        let _ = self.deliver.send(made);
        ok
    }
}

/// An image the engines decoded: ready for the resize (a gray image's Y plane), or its Y, Cb
/// and Cr planes, which the colour conversion makes RGB first.
#[derive(Debug, Clone, Copy)]
enum Decoded {
    Ready(SourceImage),
    Planes(DecodedImage, ChromaPlanes),
}

impl Decoded {
    /// Bytes of its RGB in the conversion's buffer.
    fn rgb_bytes(&self) -> usize {
        match self {
            Decoded::Ready(_) => 0,
            Decoded::Planes(d, _) => d.info.width as usize * d.info.height as usize * 3,
        }
    }
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
            Decoders::Assisted(Box::new(assisted)),
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
            resizing: Resizing {
                resizer: BatchResizer::from_module(resize)?,
                batch: BatchPlan::default(),
                plan: None,
                geometry,
                filter,
            },
            events: Vec::new(),
        })
    }

    /// The engines' colour decoder (on `handle`, which the sets share) and kernels on a new
    /// stream of `gpu`'s context, with what its gray decoder takes if gray files go to the
    /// engines: the set takes the gray decoder in once the order is made.
    pub fn open(
        gpu: &Gpu,
        handle: &Arc<HardwareHandle>,
        resize: &Arc<CudaModule>,
        decoders: &EngineDecoders,
        geometry: Geometry,
        filter: Filter,
    ) -> Result<(DecoderSet, Option<GrayOrder>), GpuLaneError> {
        let stream = new_stream(gpu)?;
        let colour = HardwareDecoder::with_handle(handle, &stream, decoders.colour.clone())?;
        let (gray, order) = match &decoders.gray {
            Some(config) => {
                let (deliver, arriving) = mpsc::channel();
                let order = GrayOrder {
                    handle: handle.clone(),
                    stream: stream.clone(),
                    config: config.clone(),
                    deliver,
                };
                (GrayDecoder::Coming(arriving), Some(order))
            }
            None => (GrayDecoder::Off, None),
        };
        let ycc = YccConverter::new(gpu).map_err(GpuLaneError::kernel("ycc.cu"))?;
        // The RGB of a part of a call's colour images, sized once.
        // SAFETY: device memory left uninitialized; the conversion writes every byte of each
        // image's RGB before the resize reads it (same stream, in that order).
        let rgb = unsafe { stream.alloc::<u8>(decoders.calls.rgb_bytes as usize) }
            .map_err(GpuLaneError::cuda("allocating the RGB buffer"))?;
        let engines = Engines {
            colour,
            gray,
            ycc,
            rgb: Some(rgb),
        };
        let set = DecoderSet::with(
            stream,
            Decoders::Engines(Box::new(engines)),
            resize,
            geometry,
            filter,
        )?;
        Ok((set, order))
    }

    /// The engines and cores per engine, as nvJPEG reports them (none for the assisted path).
    pub fn engines(&self) -> Option<(u32, u32)> {
        match &self.decoders {
            Decoders::Engines(engines) => engines.colour.engines(),
            Decoders::Assisted(_) => None,
        }
    }

    /// How long the engines' colour decoder took to create, step by step (none for the assisted
    /// path).
    pub fn opening(&self) -> Option<DecoderOpening> {
        match &self.decoders {
            Decoders::Engines(engines) => Some(engines.colour.opening()),
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
    pub fn run(&mut self, call: &mut Call, shared: &Shared, ordered: bool) -> Vec<LaneResult> {
        let mut results = vec![LaneResult::Refused; call.images.len()];
        if !ordered {
            return results;
        }
        let stream = &self.stream;
        let resizing = &mut self.resizing;
        let watch = &shared.limits.stopwatch;
        let made = match &mut self.decoders {
            Decoders::Engines(engines) => {
                let jpegs: Vec<(&[u8], Screened)> = call
                    .images
                    .iter()
                    .map(|image| (&*image.bytes, image.screened))
                    .collect();
                let decoded = watch.time(Stage::GpuDecode, || engines.decode(stream, &jpegs));
                decoded.and_then(|decoded| {
                    watch.time(Stage::GpuResize, || {
                        // The colour images made RGB and resized a part at a time, in the RGB
                        // buffer.
                        let mut written = Vec::with_capacity(decoded.len());
                        let room = engines.rgb.as_ref().map_or(0, CudaSlice::len);
                        let sizes = decoded
                            .iter()
                            .map(|d| d.as_ref().map_or(0, Decoded::rgb_bytes));
                        for part in parts(sizes, room) {
                            let images = engines.convert(stream, &decoded, part)?;
                            written.extend(resizing.resize(stream, call, shared, &images)?);
                        }
                        Ok(written)
                    })
                })
            }
            Decoders::Assisted(assisted) => watch
                .time(Stage::GpuDecode, || assisted.decode(&call.images))
                .and_then(|images| {
                    watch.time(Stage::GpuResize, || {
                        resizing.resize(stream, call, shared, &images)
                    })
                }),
        };
        let written = match made {
            Ok(written) if !written.is_empty() => written,
            Ok(_) => return results,
            Err(error) => {
                shared.call_failed(call.images.len(), &error.to_string());
                // Whatever the call queued is done before its slots are free again.
                let _ = self.stream.synchronize();
                return results;
            }
        };
        match self.record() {
            Ok(event) => {
                let assisted = call.path == Path::Assisted;
                for k in written {
                    let image = &mut call.images[k];
                    let (draw, views) = match &mut image.output {
                        ImageOutput::Image(resize) => (resize.draw, None),
                        ImageOutput::Views { draws, .. } => (None, Some(std::mem::take(draws))),
                    };
                    results[k] = LaneResult::Decoded(LaneOutput {
                        slot: image.slot,
                        ready: event.clone(),
                        draw,
                        views,
                        assisted,
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
}

impl Resizing {
    /// Queues on `stream` the resize of each decoded image (`images[k]` is image `k` of
    /// `call`) into its slot of the ring; returns the images written.
    fn resize(
        &mut self,
        stream: &Arc<CudaStream>,
        call: &Call,
        shared: &Shared,
        images: &[Option<SourceImage>],
    ) -> Result<Vec<usize>> {
        let pad = self.geometry.pad();
        let mut written = Vec::with_capacity(images.len());
        let mut jobs = Vec::with_capacity(images.len());
        let mut passes = Vec::with_capacity(images.len());
        let mut sizes = Vec::with_capacity(images.len());
        // A pipeline of views: each image's views into its record, placed by offset.
        let record_units = (shared.limits.image_bytes / RECORD_UNIT) as u64;
        let mut views = false;
        for (k, (image, source)) in call.images.iter().zip(images).enumerate() {
            let Some(source) = *source else { continue };
            let resize = match &image.output {
                ImageOutput::Image(resize) => resize,
                ImageOutput::Views { jobs: planned, .. } => {
                    views = true;
                    let record = u64::from(image.slot) * record_units;
                    for view in planned {
                        let slot =
                            u32::try_from(record + u64::from(view.offset_units)).map_err(|_| {
                                GpuLaneError::Resize(ResizeError::Plan(BatchError::TooLarge(
                                    "a view's offset in the ring",
                                )))
                            })?;
                        jobs.push(ResizeJob {
                            source,
                            x: view.x,
                            y: view.y,
                            filter: view.filter,
                            order: view.order,
                            pad: [0; 3],
                            flip: view.flip,
                            slot,
                        });
                        passes.push(&view.passes);
                        sizes.push((view.size, view.size));
                    }
                    written.push(k);
                    continue;
                }
            };
            jobs.push(ResizeJob {
                source,
                x: resize.x,
                y: resize.y,
                filter: self.filter,
                order: self.geometry.pass_order,
                pad: [pad; 3],
                flip: resize.draw.is_some_and(|d| d.flipped),
                slot: image.slot,
            });
            passes.push(&resize.passes);
            sizes.push(self.geometry.out_size(&resize.x, &resize.y));
            written.push(k);
        }
        if jobs.is_empty() {
            return Ok(written);
        }
        let plan = &mut self.batch;
        match views {
            true => plan_batch_placed_into(plan, &jobs, &passes, &sizes, RECORD_UNIT as u64),
            false => {
                let slot_len = self.geometry.image_bytes() as u64;
                plan_batch_sized_into(plan, &jobs, &passes, &sizes, slot_len)
            }
        }
        .map_err(|e| GpuLaneError::Resize(e.into()))?;
        let device = match &mut self.plan {
            Some(device) => {
                device.update(stream, plan).map_err(GpuLaneError::from)?;
                device
            }
            None => self.plan.insert(
                self.resizer
                    .upload(stream, plan)
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
                .launch_at(stream, device, shared.ring, ring_bytes)
                .map_err(GpuLaneError::from)?;
        }
        Ok(written)
    }
}

impl Engines {
    /// Queues the decode of `jpegs` on the set's stream (colour and gray ones in calls of their
    /// own): one image per input, `None` where the engines refused it. The planes stay valid
    /// until the next call.
    fn decode(
        &mut self,
        stream: &Arc<CudaStream>,
        jpegs: &[(&[u8], Screened)],
    ) -> Result<Vec<Option<Decoded>>> {
        let mut images: Vec<Option<Decoded>> = vec![None; jpegs.len()];
        // Gray files to their own decoder, the rest to the colour one.
        let (gray_at, colour_at): (Vec<usize>, Vec<usize>) =
            (0..jpegs.len()).partition(|&i| jpegs[i].1.gray);
        let batch_of = |at: &[usize]| -> (Vec<&[u8]>, Vec<JpegInfo>) {
            at.iter().map(|&i| (jpegs[i].0, jpegs[i].1.info)).unzip()
        };
        let gray = match gray_at.is_empty() {
            true => None,
            false => self.gray.ready(),
        };
        if let Some(gray) = gray {
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
                    let image = SourceImage::whole(pixels, d.info.width, d.info.height);
                    images[i] = Some(Decoded::Ready(image));
                }
            }
        }
        if colour_at.is_empty() {
            return Ok(images);
        }
        let (batch, infos) = batch_of(&colour_at);
        let outcomes = self
            .colour
            .decode_inspected(stream, &batch, &infos)
            .map_err(GpuLaneError::from)?;
        for (&i, outcome) in colour_at.iter().zip(outcomes.outcomes()) {
            if let Outcome::Decoded(d) = outcome {
                images[i] = d.chroma.map(|chroma| Decoded::Planes(*d, chroma));
            }
        }
        Ok(images)
    }

    /// Queues the colour conversion of the images of `part` (as libjpeg-turbo makes RGB) into
    /// the RGB buffer, which it grows only for an image larger alone: the images of `part` ready
    /// for the resize, `None` elsewhere. The RGB stays valid until the next conversion.
    fn convert(
        &mut self,
        stream: &Arc<CudaStream>,
        decoded: &[Option<Decoded>],
        part: Range<usize>,
    ) -> Result<Vec<Option<SourceImage>>> {
        let mut images: Vec<Option<SourceImage>> = vec![None; decoded.len()];
        let total: usize = decoded[part.clone()]
            .iter()
            .flatten()
            .map(Decoded::rgb_bytes)
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
        let mut jobs = Vec::with_capacity(part.len());
        let mut at = 0u64;
        for k in part {
            let (d, chroma) = match decoded[k] {
                Some(Decoded::Ready(image)) => {
                    images[k] = Some(image);
                    continue;
                }
                Some(Decoded::Planes(d, chroma)) => (d, chroma),
                None => continue,
            };
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
            images[k] = Some(SourceImage::whole(pixels, w, h));
            at += u64::from(w) * u64::from(h) * 3;
        }
        if jobs.is_empty() {
            drop(guard);
            return Ok(images);
        }
        // SAFETY: the planes are the colour decoder's batch queued on this stream (its arena
        // lives in the decoder until its next `decode`, which comes after these kernels); the
        // outputs lie inside the RGB buffer (`at` stays within `total`), alive in `self.rgb`,
        // and the resize that read the previous part's RGB was queued on this stream before.
        let converted = unsafe { self.ycc.convert(stream, &jobs) };
        drop(guard);
        converted?;
        Ok(images)
    }
}

/// The parts of a call made RGB and resized one after another, given each image's RGB bytes:
/// runs of images whose RGB fits `room` together (an image larger alone).
fn parts(sizes: impl Iterator<Item = usize>, room: usize) -> Vec<Range<usize>> {
    let mut parts = Vec::new();
    let (mut start, mut bytes, mut end) = (0, 0, 0);
    for (k, needed) in sizes.enumerate() {
        if k > start && bytes + needed > room {
            parts.push(start..k);
            (start, bytes) = (k, 0);
        }
        bytes += needed;
        end = k + 1;
    }
    if start < end {
        parts.push(start..end);
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::parts;

    #[test]
    fn a_call_is_made_rgb_in_parts_that_fit_the_buffer_each_image_once() {
        let room = 100;
        assert_eq!(parts([40, 40, 40, 10].into_iter(), room), [0..2, 2..4]);
        // An image larger than the buffer alone; gray images (no RGB) ride along.
        assert_eq!(parts([150, 0, 30, 0].into_iter(), room), [0..1, 1..4]);
        assert_eq!(parts([30, 150, 30].into_iter(), room), [0..1, 1..2, 2..3]);
        assert_eq!(parts([100, 100].into_iter(), room), [0..1, 1..2]);
        assert!(parts(std::iter::empty(), room).is_empty());
        assert_eq!(parts([0, 0, 40].into_iter(), room), vec![0..3]);
    }
}
