//! A batch of samples with targets on a CUDA device: each row's pixels as decoded (or laid out
//! on the host when the device cannot place them), instance masks and semantic masks, laid out
//! by the pool's threads in a page-locked buffer ([`StagingPool`]: reused from batch to batch,
//! grown only when a batch is larger than any before), uploaded asynchronously on the loader's
//! stream; there the rows are resized, cropped, padded and mirrored into the padded `u8` batch
//! by the resize kernel (`src/cuda/resize`, Pillow's arithmetic, the bytes of the host's
//! layout), normalized by the normalize kernel (`src/cuda/normalize.rs`) into an NCHW tensor of
//! the chosen dtype; the masks, sent as loaded, are resized, cut, padded and mirrored into
//! their padded planes by the gather kernel (`src/cuda/gather.rs`, the host's nearest
//! lookups) and handed out as `u8` device tensors.

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream};

use crate::cuda::resize::{kernel_source, BatchResizer, DevicePlan};
use crate::cuda::{Gpu, Normalizer, PlaneGather};
use crate::error::{guarded, Error, Result};
use crate::memory::PageLocked;
use crate::options::{DType, Decode, Layout, NormalizeSpec, OutputOptions};
use crate::tensor::{DeviceData, DeviceTensor};

use super::device_decode::{DecodedImages, JpegDecoders};
use super::TargetBatch;

/// One batch on the device: the normalized images, the masks, and the rest of the batch (its
/// targets, sizes, calls and inverse maps; its host `images`, `masks` and `semantic` empty).
#[derive(Debug)]
pub struct DeviceTargetBatch {
    /// The images, `[N, 3, H, W]` in the output's dtype, normalized (padding included).
    pub images: DeviceTensor,
    /// Instance masks, `[objects, H, W]` `u8` (objects in row order, `targets.offsets`), when
    /// the source has segmentations.
    pub masks: Option<DeviceTensor>,
    /// Semantic masks, `[N, H, W]` `u8` (padding 255), for segmentation pairs.
    pub semantic: Option<DeviceTensor>,
    /// The batch's targets and bookkeeping.
    pub targets: TargetBatch,
}

/// The output of a detection recipe by default: torchvision's detection models take `[0, 1]`
/// floats and normalize inside, so the images are only scaled (mean 0, std 1, over 255), `f32`.
pub fn detection_output() -> OutputOptions {
    OutputOptions::default()
        .mean_std([0.0; 3], [1.0; 3])
        .dtype(DType::F32)
}

/// The output of a segmentation recipe by default: ImageNet's mean and std (what torchvision's
/// segmentation references normalize with), `f32`.
pub fn segmentation_output() -> OutputOptions {
    OutputOptions::default().dtype(DType::F32)
}

/// A page-locked buffer a batch made for the device is laid out in (its rows' pixels, instance
/// masks and semantic masks, one after another), uploaded from there with no copy, and handed
/// back to its [`StagingPool`] once the upload is queued.
pub(crate) struct Staged {
    memory: PageLocked,
    /// The three parts' lengths.
    lens: [usize; 3],
    /// Recorded after the last upload out of it.
    uploaded: Option<CudaEvent>,
}

impl Staged {
    /// The rows' pixels, the instance masks and the semantic masks, to write.
    pub(crate) fn parts_mut(&mut self) -> [&mut [u8]; 3] {
        let [a, b, c] = self.lens;
        let (images, rest) = self.memory.as_mut_slice().split_at_mut(a);
        let (masks, rest) = rest.split_at_mut(b);
        [images, masks, &mut rest[..c]]
    }

    /// Each part's range.
    fn ranges(&self) -> [std::ops::Range<usize>; 3] {
        let [a, b, c] = self.lens;
        [0..a, a..a + b, a + b..a + b + c]
    }

    /// Waits for the last upload out of it.
    fn wait(&self) -> Result<()> {
        match &self.uploaded {
            Some(event) => event
                .synchronize()
                .map_err(|e| Error::cuda("waiting for a target upload", e)),
            None => Ok(()),
        }
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        // The page-locked memory must outlive any copy still reading it.
        let _ = self.wait();
    }
}

/// The page-locked buffers of the batches made for the device: taken by the pool thread that
/// lays a batch out, handed back once its upload is queued (at most as many kept as batches
/// are in work and in hand, so they grow only with a batch larger than any before).
pub(crate) struct StagingPool {
    context: Arc<CudaContext>,
    free: Mutex<Vec<Staged>>,
    /// The device's JPEG decoders, unless the CPU decodes every image.
    decoders: Option<Arc<JpegDecoders>>,
}

impl std::fmt::Debug for StagingPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagingPool").finish_non_exhaustive()
    }
}

impl StagingPool {
    /// The device's JPEG decoders, unless the CPU decodes every image.
    pub(crate) fn decoders(&self) -> Option<&JpegDecoders> {
        self.decoders.as_deref()
    }

    /// Whether the rows loaded now leave their JPEGs to the device's decoders (one is open).
    pub(crate) fn decoders_taking(&self) -> bool {
        self.decoders.as_ref().is_some_and(|d| d.taking())
    }

    /// A buffer for parts of `lens` bytes: a free one large enough once its last upload has
    /// finished, else a new one.
    pub(crate) fn take(&self, lens: [usize; 3]) -> Result<Staged> {
        let bytes: usize = lens.iter().sum();
        let found = {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            free.iter()
                .position(|s| s.memory.as_slice().len() >= bytes)
                .map(|i| free.swap_remove(i))
        };
        let mut staged = match found {
            Some(staged) => {
                staged.wait()?;
                staged
            }
            None => Staged {
                memory: guarded("page-locking the targets' staging memory", || {
                    PageLocked::new(&self.context, bytes.max(1))
                })?,
                lens,
                uploaded: None,
            },
        };
        staged.lens = lens;
        Ok(staged)
    }

    /// Keeps `staged` for the next batches unless `keep` are kept already.
    pub(crate) fn give(&self, staged: Staged, keep: usize) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < keep {
            free.push(staged);
        }
    }
}

/// The loader's device stage: its stream, the resize and normalize kernels, the staging
/// buffer, the device buffers of the rows' pixels and of the padded batch, and the resize's
/// plan, all reused.
pub(crate) struct TargetUpload {
    gpu: Gpu,
    resizer: BatchResizer,
    normalizer: Normalizer,
    gather: PlaneGather,
    spec: NormalizeSpec,
    input: Option<CudaSlice<u8>>,
    /// The rows' masks as loaded.
    mask_sources: Option<CudaSlice<u8>>,
    padded: Option<CudaSlice<u8>>,
    plan: Option<DevicePlan>,
    /// The page-locked buffers the batches are laid out in.
    pool: Arc<StagingPool>,
}

impl std::fmt::Debug for TargetUpload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TargetUpload")
            .field("device", &self.gpu.describe())
            .field("spec", &self.spec)
            .finish()
    }
}

impl TargetUpload {
    /// Opens CUDA device `ordinal` with a stream of its own and compiles the kernels; the
    /// JPEG decoders open as `lanes` says ([`super::TargetLoader::decode_lanes`]).
    pub(crate) fn open(
        ordinal: usize,
        output: &OutputOptions,
        lanes: Decode,
    ) -> Result<TargetUpload> {
        let mut spec = output.spec();
        spec.layout = Layout::Nchw;
        if !spec.dtype.is_float() {
            return Err(spec.dtype.not_an_output());
        }
        let gpu = Gpu::open(ordinal)?;
        let normalizer = Normalizer::new(gpu.stream())?;
        let resizer = BatchResizer::from_module(&gpu.module(&kernel_source())?)?;
        let gather = PlaneGather::new(gpu.stream())?;
        let decoders = match lanes {
            Decode::Cpu => None,
            Decode::Hybrid => Some(JpegDecoders::open(gpu.stream(), true)),
            _ => Some(JpegDecoders::open(gpu.stream(), false)),
        };
        Ok(TargetUpload {
            resizer,
            normalizer,
            gather,
            spec,
            input: None,
            mask_sources: None,
            padded: None,
            plan: None,
            pool: Arc::new(StagingPool {
                context: gpu.stream().context().clone(),
                free: Mutex::new(Vec::new()),
                decoders,
            }),
            gpu,
        })
    }

    /// What decodes the images of the batches for this device, in words.
    pub(crate) fn decoders_description(&self) -> String {
        match &self.pool.decoders {
            Some(decoders) => decoders.describe(),
            None => "the CPU threads".into(),
        }
    }

    /// The page-locked buffers the batches for this device are laid out in.
    pub(crate) fn pool(&self) -> &Arc<StagingPool> {
        &self.pool
    }

    /// `batch` on the device (its instance masks as a tensor when `instance`, even of no
    /// plane), uploaded from `staged` when it was laid out there, else from a buffer of the pool
    /// its host buffers are copied into (those are taken and come back as the second value, for
    /// the loader to reuse), its rows decoded on the device read from `decoded`; the buffers go
    /// back to their pools (which keep at most `keep`).
    pub(crate) fn upload(
        &mut self,
        mut batch: TargetBatch,
        (staged, decoded): (Option<Staged>, Option<DecodedImages>),
        (instance, keep): (bool, usize),
    ) -> Result<(DeviceTargetBatch, [Vec<u8>; 3])> {
        // A batch made before the device opened is copied into a buffer of the pool now.
        let mut staged = match staged {
            Some(staged) => staged,
            None => {
                let parts = [&batch.images[..], &batch.masks[..], &batch.semantic[..]];
                let mut staged = self.pool.take(parts.map(<[u8]>::len))?;
                for (to, from) in staged.parts_mut().into_iter().zip(parts) {
                    to.copy_from_slice(from);
                }
                staged
            }
        };
        let stream = self.gpu.stream().clone();
        let queued = self.enqueue(&mut batch, (&staged, decoded.as_ref()), instance);
        if queued.is_err() {
            // Nothing may still read the buffers when they are dropped.
            let _ = stream.synchronize();
        }
        let (images, masks, semantic) = queued?;
        if let Some(mut decoded) = decoded {
            decoded.read_on(&stream)?;
            if let Some(decoders) = &self.pool.decoders {
                decoders.give_buffer(decoded, keep);
            }
        }
        staged.uploaded = Some(
            stream
                .record_event(None)
                .map_err(|e| Error::cuda("recording a target upload", e))?,
        );
        self.pool.give(staged, keep);
        let spent = [
            std::mem::take(&mut batch.images),
            std::mem::take(&mut batch.masks),
            std::mem::take(&mut batch.semantic),
        ];
        Ok((
            DeviceTargetBatch {
                images,
                masks,
                semantic,
                targets: batch,
            },
            spent,
        ))
    }

    /// Queues on the loader's stream the upload of `batch` out of `staged`, the resize of its
    /// rows into the padded batch, the normalize kernel and the masks' uploads; the images and
    /// the two mask tensors.
    fn enqueue(
        &mut self,
        batch: &mut TargetBatch,
        (staged, decoded): (&Staged, Option<&DecodedImages>),
        instance: bool,
    ) -> Result<(DeviceTensor, Option<DeviceTensor>, Option<DeviceTensor>)> {
        let (n, h, w) = (batch.len(), batch.height as usize, batch.width as usize);
        let (host, ranges) = (staged.memory.as_slice(), staged.ranges());
        let stream = self.gpu.stream().clone();
        let fail = |e| Error::cuda("uploading a target batch", e);
        let images_len = ranges[0].len();
        let mut input = reuse_or_grow(self.input.take(), images_len, &stream, "input")?;
        if images_len > 0 {
            let mut dst = input.slice_mut(0..images_len);
            // From page-locked memory the copy is asynchronous; the event `upload` records
            // after it guards the buffer.
            stream
                .memcpy_htod(&host[ranges[0].clone()], &mut dst)
                .map_err(fail)?;
        }
        let padded_len = n * h * w * 3;
        let mut padded = reuse_or_grow(self.padded.take(), padded_len, &stream, "padded batch")?;
        if n > 0 {
            if batch.device_rows.len() != n {
                return Err(Error::Mismatch(format!(
                    "a target batch of {n} rows with {} laid out for the device",
                    batch.device_rows.len()
                )));
            }
            if let Some(decoded) = decoded {
                decoded.wait_on(&stream)?;
            }
            self.resizer.resize_packed(
                &stream,
                &mut self.plan,
                (&input, decoded.and_then(DecodedImages::buffer)),
                &batch.device_rows,
                (w as u32, h as u32),
                &mut padded,
            )?;
        }
        batch.device_rows = Vec::new();
        let images = self.normalizer.run(&stream, &padded, n, h, w, &self.spec)?;
        self.input = Some(input);
        self.padded = Some(padded);
        // The masks as loaded, instance planes then semantic masks (adjacent in `host`).
        let mask_range = ranges[1].start..ranges[2].end;
        let mut sources = reuse_or_grow(
            self.mask_sources.take(),
            mask_range.len(),
            &stream,
            "mask sources",
        )?;
        if !mask_range.is_empty() {
            let mut dst = sources.slice_mut(0..mask_range.len());
            stream
                .memcpy_htod(&host[mask_range], &mut dst)
                .map_err(fail)?;
        }
        let masks = std::mem::take(&mut batch.device_masks);
        let planes =
            |count: usize| DeviceTensor::alloc(&stream, DType::U8, [count, h, w], Layout::Nchw);
        let mut instance_masks = instance.then(|| planes(masks.instance.len())).transpose()?;
        let mut semantic = (!masks.semantic.is_empty())
            .then(|| planes(masks.semantic.len()))
            .transpose()?;
        let mut outputs = Vec::with_capacity(2);
        for (tensor, group) in [
            (instance_masks.as_mut(), &masks.instance),
            (semantic.as_mut(), &masks.semantic),
        ] {
            if let Some(DeviceData::U8(out)) = tensor.map(DeviceTensor::data_mut) {
                outputs.push((&group[..], out));
            }
        }
        self.gather.gather(
            &stream,
            &sources,
            &masks.maps,
            (w as u32, h as u32),
            &mut outputs,
        )?;
        self.mask_sources = Some(sources);
        let masks = instance_masks;
        Ok((images, masks, semantic))
    }
}

/// `buffer` when it holds `len` bytes, else a new device buffer of `len` (at least 1): allocated
/// only when a batch is larger than any before.
fn reuse_or_grow(
    buffer: Option<CudaSlice<u8>>,
    len: usize,
    stream: &Arc<CudaStream>,
    what: &'static str,
) -> Result<CudaSlice<u8>> {
    match buffer {
        Some(d) if d.len() >= len.max(1) => Ok(d),
        _ => guarded(what, || stream.alloc_zeros::<u8>(len.max(1))),
    }
}
